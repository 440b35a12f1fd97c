//! The Raft log's and the channels' encodings stay readable: one of each
//! `Command` (with every `Timeable` and `Payload` shape) and `Response`
//! variant, encoded as the log stores it (bincode), is checked in as
//! `tests/golden/wire.txt`; the bytes an older binary wrote must decode to
//! the same value with this one. A variant moved, removed or renamed
//! changes what old bytes mean and fails here; a variant added without
//! its line fails too (`CAIRN_BLESS=1 cargo test --test wire_golden`
//! appends the missing lines: check them in with the change).

use std::collections::BTreeMap;
use std::fmt::Debug;

use cairn::state::{Command, Payload, Response, Timeable};
use cairn::structs::{KvOp, KvOutcome, KvVerb};
use serde::Serialize;
use serde::de::DeserializeOwned;

const GOLDEN: &str = "tests/golden/wire.txt";

fn kv() -> KvOp {
    KvOp {
        verb: KvVerb::Set,
        key: "k".into(),
        value: b"v".to_vec(),
        flags: 0,
        index: 0,
        session: String::new(),
    }
}

fn commands() -> Vec<(&'static str, Command)> {
    vec![
        ("Command::Kv", Command::Kv(kv())),
        ("Command::Txn", Command::Txn(vec![])),
        ("Command::Register", Command::Register(Box::default())),
        (
            "Command::Deregister",
            Command::Deregister(Default::default()),
        ),
        (
            "Command::ConfigSet",
            Command::ConfigSet {
                entry: serde_json::json!({"Kind": "service-defaults", "Name": "web"}),
                cas: Some(3),
            },
        ),
        (
            "Command::ConfigDelete",
            Command::ConfigDelete {
                kind: "service-defaults".into(),
                name: "web".into(),
                cas: None,
            },
        ),
        (
            "Command::InitCluster",
            Command::InitCluster {
                cluster_id: "c".into(),
            },
        ),
        ("Command::Noop", Command::Noop),
        (
            "Command::ReapTombstones",
            Command::ReapTombstones { upto: 7 },
        ),
        (
            "Command::SessionCreate",
            Command::SessionCreate {
                session: serde_json::from_value(serde_json::json!({
                    "ID": "s", "Name": "", "Node": "n", "NodeChecks": [],
                    "ServiceChecks": [], "LockDelay": 0, "Behavior": "release",
                    "TTL": "10s", "CreateIndex": 0, "ModifyIndex": 0
                }))
                .unwrap(),
                server_node: true,
            },
        ),
        (
            "Command::SessionDestroy",
            Command::SessionDestroy { id: "s".into() },
        ),
        (
            "Command::Timed(Kv)",
            Command::Timed {
                now_ms: 1,
                cmd: Timeable::Kv(kv()),
            },
        ),
        (
            "Command::Timed(Txn)",
            Command::Timed {
                now_ms: 2,
                cmd: Timeable::Txn(vec![]),
            },
        ),
        (
            "Command::Timed(SessionDestroy)",
            Command::Timed {
                now_ms: 3,
                cmd: Timeable::SessionDestroy { id: "s".into() },
            },
        ),
        (
            "Command::RestoreChunk",
            Command::RestoreChunk {
                id: "r".into(),
                seq: 1,
                data: vec![1, 2, 3],
            },
        ),
        (
            "Command::RestoreCommit",
            Command::RestoreCommit {
                id: "r".into(),
                chunks: 1,
                len: 3,
                crc: 9,
            },
        ),
        (
            "Command::RestoreAbort",
            Command::RestoreAbort { id: "r".into() },
        ),
        (
            "Command::AclTokenSet",
            Command::AclTokenSet {
                token: Box::default(),
            },
        ),
        (
            "Command::AclTokenDelete",
            Command::AclTokenDelete {
                accessor: "a".into(),
            },
        ),
        (
            "Command::AclPolicySet",
            Command::AclPolicySet {
                policy: Box::default(),
            },
        ),
        (
            "Command::AclPolicyDelete",
            Command::AclPolicyDelete { id: "p".into() },
        ),
        (
            "Command::AclRoleSet",
            Command::AclRoleSet {
                role: Box::default(),
            },
        ),
        (
            "Command::AclRoleDelete",
            Command::AclRoleDelete { id: "r".into() },
        ),
        (
            "Command::AclBootstrap",
            Command::AclBootstrap {
                token: Box::default(),
            },
        ),
        (
            "Command::AclInit",
            Command::AclInit {
                initial_management: None,
            },
        ),
        (
            "Command::CaSet",
            Command::CaSet {
                ca: Box::default(),
                cas: None,
            },
        ),
        (
            "Command::AclBootstrapReset",
            Command::AclBootstrapReset {
                token: Box::default(),
                reset_index: 4,
            },
        ),
        (
            "Command::EventFire",
            Command::EventFire {
                event: Box::new(
                    serde_json::from_value(serde_json::json!({"ID": "e", "Name": "deploy"}))
                        .unwrap(),
                ),
            },
        ),
        (
            "Command::AutopilotSet",
            Command::AutopilotSet {
                config: Default::default(),
                cas: Some(1),
            },
        ),
        (
            "Command::CoordinateBatch",
            Command::CoordinateBatch { updates: vec![] },
        ),
        (
            "Command::FederationStateSet",
            Command::FederationStateSet {
                state: Box::default(),
            },
        ),
        (
            "Command::QuerySet",
            Command::QuerySet {
                query: Box::default(),
                update: false,
            },
        ),
        (
            "Command::QueryDelete",
            Command::QueryDelete { id: "q".into() },
        ),
        (
            "Command::AclReplicate",
            Command::AclReplicate {
                set: Box::default(),
                delete_tokens: vec!["t".into()],
                delete_roles: vec![],
                delete_policies: vec![],
            },
        ),
        (
            "Command::ConfigReplicate",
            Command::ConfigReplicate {
                set: vec![],
                delete: vec![("service-defaults".into(), "web".into())],
            },
        ),
        (
            "Command::VirtualIpsSet",
            Command::VirtualIpsSet {
                service: "web".into(),
                manual: vec!["10.0.0.1".into()],
            },
        ),
        (
            "Command::FederationStateDelete",
            Command::FederationStateDelete {
                datacenter: "dc2".into(),
            },
        ),
        (
            "Command::AclAuthMethodSet",
            Command::AclAuthMethodSet {
                method: Box::default(),
            },
        ),
        (
            "Command::AclAuthMethodDelete",
            Command::AclAuthMethodDelete { name: "m".into() },
        ),
        (
            "Command::AclBindingRuleSet",
            Command::AclBindingRuleSet {
                rule: Box::default(),
            },
        ),
        (
            "Command::AclBindingRuleDelete",
            Command::AclBindingRuleDelete { id: "b".into() },
        ),
    ]
}

fn responses() -> Vec<(&'static str, Response)> {
    vec![
        ("Response::Ok", Response::Ok),
        ("Response::Kv", Response::Kv(KvOutcome::Done(true))),
        ("Response::Txn", Response::Txn(Ok(vec![]))),
        ("Response::Bool", Response::Bool(false)),
        ("Response::Rejected", Response::Rejected("no".into())),
        ("Response::Batch", Response::Batch(vec![Response::Ok])),
        ("Response::Manual", Response::Manual(Default::default())),
    ]
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Checks each value against its golden bytes; returns the lines missing.
fn check<T>(golden: &BTreeMap<String, String>, cases: Vec<(&str, T)>) -> Vec<String>
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let mut missing = Vec::new();
    for (name, value) in cases {
        match golden.get(name) {
            Some(bytes) => {
                let old: T = bincode::deserialize(&unhex(bytes)).unwrap_or_else(|e| {
                    panic!("{name}: the checked-in bytes no longer decode: {e}")
                });
                assert_eq!(
                    old, value,
                    "{name}: the checked-in bytes decode to another value"
                );
            }
            None => missing.push(format!(
                "{name} {}",
                hex(&bincode::serialize(&value).unwrap())
            )),
        }
    }
    missing
}

#[test]
fn every_command_and_response_decodes_from_the_bytes_checked_in() {
    let text = std::fs::read_to_string(GOLDEN).unwrap_or_default();
    let golden: BTreeMap<String, String> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(n, h)| (n.to_string(), h.to_string()))
        .collect();
    // Every variant is here (a match with no wildcard: a new variant
    // does not compile until it has a case above).
    for (_, c) in commands() {
        match c {
            Command::Kv(_)
            | Command::Txn(_)
            | Command::Register(_)
            | Command::Deregister(_)
            | Command::ConfigSet { .. }
            | Command::ConfigDelete { .. }
            | Command::InitCluster { .. }
            | Command::Noop
            | Command::ReapTombstones { .. }
            | Command::SessionCreate { .. }
            | Command::SessionDestroy { .. }
            | Command::Timed { .. }
            | Command::RestoreChunk { .. }
            | Command::RestoreCommit { .. }
            | Command::RestoreAbort { .. }
            | Command::AclTokenSet { .. }
            | Command::AclTokenDelete { .. }
            | Command::AclPolicySet { .. }
            | Command::AclPolicyDelete { .. }
            | Command::AclRoleSet { .. }
            | Command::AclRoleDelete { .. }
            | Command::AclBootstrap { .. }
            | Command::AclInit { .. }
            | Command::CaSet { .. }
            | Command::AclBootstrapReset { .. }
            | Command::EventFire { .. }
            | Command::AutopilotSet { .. }
            | Command::CoordinateBatch { .. }
            | Command::FederationStateSet { .. }
            | Command::QuerySet { .. }
            | Command::QueryDelete { .. }
            | Command::AclReplicate { .. }
            | Command::ConfigReplicate { .. }
            | Command::VirtualIpsSet { .. }
            | Command::FederationStateDelete { .. }
            | Command::AclAuthMethodSet { .. }
            | Command::AclAuthMethodDelete { .. }
            | Command::AclBindingRuleSet { .. }
            | Command::AclBindingRuleDelete { .. } => {}
        }
    }
    let payloads = vec![
        ("Payload::One", Payload::One(Command::Noop)),
        ("Payload::Batch", Payload::Batch(vec![Command::Kv(kv())])),
    ];
    let mut missing = check(&golden, commands());
    missing.extend(check(&golden, payloads));
    missing.extend(check(&golden, responses()));
    if missing.is_empty() {
        return;
    }
    if std::env::var_os("CAIRN_BLESS").is_some() {
        let mut text = text;
        if text.is_empty() {
            text.push_str("# One line per variant: its name and its bincode bytes in hex, as a\n# build wrote them (tests/wire_golden.rs). Lines are only ever added.\n");
        }
        for l in &missing {
            text.push_str(l);
            text.push('\n');
        }
        std::fs::write(GOLDEN, text).unwrap();
        return;
    }
    panic!(
        "variants without checked-in bytes (CAIRN_BLESS=1 adds them to {GOLDEN}):\n{}",
        missing.join("\n")
    );
}
