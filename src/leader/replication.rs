//! Replication from the primary datacenter, Consul's model: in a secondary,
//! the leader pulls the primary's ACL policies, roles and global tokens
//! (one duty) and its config entries of every kind, intentions included
//! (another), and applies what differs here through Raft.
//!
//! Each pull is a blocking query on the primary (`?index=` its last
//! answer's, `?stale`: any of its servers answers), sent over the WAN
//! transport (`Federation::ask_primary`), so an idle federation costs one
//! parked request per kind and no Raft write.
//! A term in office starts with a plain read and a whole comparison with
//! the replicated state here, so a new leader resumes where the state is
//! (after a leader change, a partition or a restart) and writes only what
//! changed meanwhile. A failure is kept for `/v1/acl/replication`, then
//! retried with a growing pause (`Backoff`), or at once when a datacenter
//! becomes known (the primary's first answer to this server's greeting);
//! meanwhile the secondary keeps serving from what it has (Consul's `extend-cache`: tokens resolve from replicated
//! state, never from the primary).
//!
//! The differences go as few `Command::AclReplicate`/`ConfigReplicate`
//! writes (deletes with the first), each bounded in objects and bytes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::federation::{Federation, Replicated};
use crate::server::Server;
use crate::state::{Command, Response, State};
use crate::structs::acl::{ANONYMOUS_ID, AclPolicy, AclRole, AclToken, GLOBAL_MANAGEMENT_ID};
use crate::structs::auth::{AclAuthMethod, AclBindingRule};
use crate::structs::replication::{ACL_PATH, AclReplica, CONFIG_PATH, ConfigReplica};

/// How long one pull waits on the primary for a change. Short: a pull
/// whose connection a partition or the crash of the primary's server cut
/// hears nothing (the answer, or the peer's close, is lost), and it is
/// noticed only when its time is up: this bounds the secondary's lag
/// after such a fault (the simulation's federation scenario, seed 0, found
/// a 60 s wait leaving the secondary behind for good after the heal). An
/// idle federation pays one small request per kind per wait.
const WAIT: Duration = Duration::from_secs(10);
/// Past the wait: the primary's jitter on it (a sixteenth) and the way back.
const WAIT_MARGIN: Duration = Duration::from_secs(3);
/// A plain read's time limit (the first of a term, and after a failure).
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The pause after a failure: doubled each time, up to the second.
const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(8);

/// The pause between a secondary's failed pulls from the primary (this
/// module's and `connect_ca`'s): doubled after each failure, back to the
/// least after a success, and cut short as soon as a datacenter is newly
/// known. A pull that failed for want of the primary (`No path`: not
/// greeted yet, at the start) is so tried again at once, not after a pause
/// grown meanwhile: that pause once made the first objects made in the
/// primary wait seconds. Datacenters are never forgotten, so a partition
/// does not wake it.
pub(super) struct Backoff {
    pause: Duration,
    others: tokio::sync::watch::Receiver<Vec<String>>,
}

impl Backoff {
    pub(super) fn new(fed: &Federation) -> Self {
        Backoff {
            pause: RETRY_MIN,
            others: fed.watch_others(),
        }
    }

    /// Before each pull: the datacenters known now; one learnt while the
    /// pull runs still cuts its failure's pause short.
    pub(super) fn attempt(&mut self) {
        self.others.borrow_and_update();
    }

    pub(super) fn succeeded(&mut self) {
        self.pause = RETRY_MIN;
    }

    /// Waits out the pause after a failure.
    pub(super) async fn failed(&mut self) {
        tokio::select! {
            _ = tokio::time::sleep(self.pause) => self.pause = (self.pause * 2).min(RETRY_MAX),
            Ok(()) = self.others.changed() => self.pause = RETRY_MIN,
        }
    }
}
/// One write of replicated objects: at most this many, and about this
/// many bytes of them (far under `server::MAX_COMMAND_BYTES`).
const BATCH_OBJECTS: usize = 256;
const BATCH_BYTES: usize = 1 << 20;

/// Replicates `what` for the term (returns at once in a primary, or for
/// ACLs with ACLs off).
pub async fn run(s: Arc<Server>, federation: Option<Arc<Federation>>, what: Replicated) {
    let Some(fed) = federation else {
        return;
    };
    if !fed.is_secondary() || (what == Replicated::Acl && !s.acl().enabled()) {
        return;
    }
    let _running = Running::start(fed.clone(), what);
    // None: ask at once (a plain read); Some(i): block until past i.
    let mut after: Option<u64> = None;
    // The primary's index of what this term applied: an answer older than
    // it is never applied (it would undo newer changes).
    let mut applied = 0;
    let mut backoff = Backoff::new(&fed);
    loop {
        backoff.attempt();
        // Read for each pull: `PUT /v1/agent/token/replication` on this
        // server changes it (as Consul's), else `--acl-replication-token`.
        let token = s
            .agent()
            .and_then(|a| a.replication_token())
            .or_else(|| s.config().acl_replication_token.clone());
        match pull(&s, &fed, what, after, applied, token.as_deref()).await {
            Ok(index) => {
                applied = index;
                fed.replication().update(what, |r| {
                    r.index = index;
                    r.last_success = Some(SystemTime::now());
                });
                after = Some(index);
                backoff.succeeded();
            }
            Err(e) => {
                tracing::warn!(what = what.name(), error = %e, "replication from the primary failed");
                fed.replication().update(what, |r| {
                    r.last_error = Some(SystemTime::now());
                    r.last_error_message = e;
                });
                after = None;
                backoff.failed().await;
            }
        }
    }
}

/// Marks the replication running while its duty lives (aborted with the
/// term: dropped).
pub(super) struct Running(Arc<Federation>, Replicated);

impl Running {
    pub(super) fn start(fed: Arc<Federation>, what: Replicated) -> Running {
        fed.replication().update(what, |r| r.running = true);
        Running(fed, what)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.replication().update(self.1, |r| r.running = false);
    }
}

/// One pull and what it brought applied: the primary's index of it.
async fn pull(
    s: &Server, fed: &Federation, what: Replicated, after: Option<u64>, applied: u64,
    token: Option<&str>,
) -> Result<u64, String> {
    let path = match what {
        Replicated::Acl => ACL_PATH,
        Replicated::Config => CONFIG_PATH,
        // Roots and an intermediate, not objects to copy: its own duty.
        Replicated::Ca => return Err("the Connect CA is leader::connect_ca's".into()),
    };
    // `?stale`: whichever server of the primary receives it answers from
    // its own state (a server's pull is trusted only where it arrives: it
    // is never passed on to that datacenter's leader); `applied` keeps a
    // server behind the others from undoing what a newer answer brought.
    let (path, timeout) = match after {
        Some(i) => (
            format!("{path}?stale&index={i}&wait={}s", WAIT.as_secs()),
            WAIT + WAIT / 16 + WAIT_MARGIN,
        ),
        None => (format!("{path}?stale"), READ_TIMEOUT),
    };
    let r = fed
        .ask_primary(path, token, timeout)
        .await
        .map_err(|e| format!("asking datacenter {}: {e}", fed.primary()))?;
    let body = String::from_utf8_lossy(&r.body);
    if r.status != 200 {
        return Err(format!(
            "datacenter {} answered {}: {}",
            fed.primary(),
            r.status,
            body.trim()
        ));
    }
    let header = |name: &str| {
        r.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    let index: u64 = header("x-consul-index")
        .and_then(|v| v.parse().ok())
        .ok_or("the primary's answer has no X-Consul-Index")?;
    // Older than what this term applied (a server of the primary behind
    // the one that answered before): not applied, asked again.
    if index < applied {
        return Ok(applied);
    }
    let cmds = match what {
        Replicated::Acl => {
            let remote: AclReplica =
                serde_json::from_slice(&r.body).map_err(|e| format!("bad ACL answer: {e}"))?;
            acl_ready(&remote)?;
            acl_changes(&s.state(), &remote)
        }
        Replicated::Config => {
            // Deleting here what the token could not see there would be
            // wrong: nothing is applied until it sees everything.
            if header(crate::request::authz::FILTERED_HEADER) == Some("true") {
                return Err(
                    "the replication token may not read every config entry of the \
                            primary (service:read and intention:read on all): nothing applied"
                        .into(),
                );
            }
            let remote: ConfigReplica =
                serde_json::from_slice(&r.body).map_err(|e| format!("bad config answer: {e}"))?;
            config_changes(&s.state(), &remote)
        }
        Replicated::Ca => Vec::new(),
    };
    for cmd in cmds {
        match s.write(cmd).await {
            Ok(Response::Ok) => {}
            Ok(other) => return Err(format!("replicated write refused: {other:?}")),
            Err(e) => return Err(format!("replicated write failed: {e}")),
        }
    }
    Ok(index)
}

/// An object's size as it is written (JSON inside the Raft entry).
fn json_len<T: serde::Serialize>(v: &T) -> usize {
    serde_json::to_vec(v).map_or(0, |b| b.len())
}

fn same_policy(a: &AclPolicy, b: &AclPolicy) -> bool {
    let bare = |p: &AclPolicy| AclPolicy {
        create_index: 0,
        modify_index: 0,
        ..p.clone()
    };
    bare(a) == bare(b)
}

fn same_role(a: &AclRole, b: &AclRole) -> bool {
    let bare = |r: &AclRole| AclRole {
        create_index: 0,
        modify_index: 0,
        ..r.clone()
    };
    bare(a) == bare(b)
}

fn same_token(a: &AclToken, b: &AclToken) -> bool {
    let bare = |t: &AclToken| AclToken {
        create_index: 0,
        modify_index: 0,
        secret_id: String::new(),
        ..t.clone()
    };
    bare(a) == bare(b)
}

/// A primary whose ACLs are off (or not yet initialised) has no anonymous
/// token: replicating its nothing would delete every global token here,
/// the management token with them.
fn acl_ready(remote: &AclReplica) -> Result<(), String> {
    if remote.tokens.iter().any(|t| t.accessor_id == ANONYMOUS_ID) {
        Ok(())
    } else {
        Err(
            "the primary has no ACL state (ACLs off there, or not initialised yet): \
             nothing applied"
                .into(),
        )
    }
}

/// The writes that make this datacenter's auth methods and binding rules
/// the primary's, one object each, in an order every write applies in:
/// methods before their rules, rules gone before methods gone.
fn login_changes(st: &State, remote: &AclReplica) -> Vec<Command> {
    let bare_m = |m: &AclAuthMethod| AclAuthMethod {
        create_index: 0,
        modify_index: 0,
        ..m.clone()
    };
    let bare_r = |r: &AclBindingRule| AclBindingRule {
        create_index: 0,
        modify_index: 0,
        ..r.clone()
    };
    let methods: BTreeSet<&str> = remote
        .auth_methods
        .iter()
        .map(|m| m.name.as_str())
        .collect();
    let rules: BTreeSet<&str> = remote.binding_rules.iter().map(|r| r.id.as_str()).collect();
    let mut out = Vec::new();
    // A method whose type changed there was deleted and made again.
    for m in &remote.auth_methods {
        match st.acl_auth_methods.get(&m.name) {
            Some(l) if bare_m(l) == bare_m(m) => {}
            Some(l) if l.kind != m.kind => {
                out.push(Command::AclAuthMethodDelete {
                    name: m.name.clone(),
                });
                out.push(Command::AclAuthMethodSet {
                    method: Box::new(m.clone()),
                });
            }
            _ => out.push(Command::AclAuthMethodSet {
                method: Box::new(m.clone()),
            }),
        }
    }
    for r in &remote.binding_rules {
        if st
            .acl_binding_rules
            .get(&r.id)
            .is_none_or(|l| bare_r(l) != bare_r(r))
        {
            out.push(Command::AclBindingRuleSet {
                rule: Box::new(r.clone()),
            });
        }
    }
    for id in st.acl_binding_rules.keys() {
        if !rules.contains(id.as_str()) {
            out.push(Command::AclBindingRuleDelete { id: id.clone() });
        }
    }
    for name in st.acl_auth_methods.keys() {
        if !methods.contains(name.as_str()) {
            out.push(Command::AclAuthMethodDelete { name: name.clone() });
        }
    }
    out
}

/// The writes that make this datacenter's ACL objects the primary's:
/// policies and roles all, tokens the global ones (local tokens are this
/// datacenter's own, never deleted), auth methods and binding rules.
fn acl_changes(st: &State, remote: &AclReplica) -> Vec<Command> {
    let mut out = policy_changes(st, remote);
    out.extend(login_changes(st, remote));
    out
}

fn policy_changes(st: &State, remote: &AclReplica) -> Vec<Command> {
    let policies: BTreeSet<&str> = remote.policies.iter().map(|p| p.id.as_str()).collect();
    let roles: BTreeSet<&str> = remote.roles.iter().map(|r| r.id.as_str()).collect();
    let tokens: BTreeSet<&str> = remote
        .tokens
        .iter()
        .filter(|t| !t.local)
        .map(|t| t.accessor_id.as_str())
        .collect();
    let delete_policies: Vec<String> = st
        .acl_policies
        .keys()
        .filter(|id| !policies.contains(id.as_str()) && *id != GLOBAL_MANAGEMENT_ID)
        .cloned()
        .collect();
    let delete_roles: Vec<String> = st
        .acl_roles
        .keys()
        .filter(|id| !roles.contains(id.as_str()))
        .cloned()
        .collect();
    let delete_tokens: Vec<String> = st
        .acl_tokens
        .values()
        .filter(|t| !t.local && t.accessor_id != ANONYMOUS_ID)
        .filter(|t| !tokens.contains(t.accessor_id.as_str()))
        .map(|t| t.accessor_id.clone())
        .collect();
    let mut set = AclReplica {
        policies: remote
            .policies
            .iter()
            .filter(|p| {
                st.acl_policies
                    .get(&p.id)
                    .is_none_or(|l| !same_policy(l, p))
            })
            .cloned()
            .collect(),
        roles: remote
            .roles
            .iter()
            .filter(|r| st.acl_roles.get(&r.id).is_none_or(|l| !same_role(l, r)))
            .cloned()
            .collect(),
        tokens: remote
            .tokens
            .iter()
            .filter(|t| !t.local)
            .filter(|t| {
                st.acl_tokens
                    .get(&t.accessor_id)
                    .is_none_or(|l| !l.local && !same_token(l, t))
            })
            .cloned()
            .collect(),
        ..Default::default()
    };
    let nothing = delete_policies.is_empty()
        && delete_roles.is_empty()
        && delete_tokens.is_empty()
        && set.policies.is_empty()
        && set.roles.is_empty()
        && set.tokens.is_empty();
    if nothing {
        return Vec::new();
    }
    // Bounded writes: policies, then roles, then tokens; deletes with the
    // first.
    let mut chunks: Vec<AclReplica> = Vec::new();
    let mut cur = AclReplica::default();
    let mut bytes = 0;
    let mut count = 0;
    let mut room = |cur: &mut AclReplica, size: usize, bytes: &mut usize, count: &mut usize| {
        if *count > 0 && (*count >= BATCH_OBJECTS || *bytes + size > BATCH_BYTES) {
            chunks.push(std::mem::take(cur));
            *bytes = 0;
            *count = 0;
        }
        *bytes += size;
        *count += 1;
    };
    for p in std::mem::take(&mut set.policies) {
        room(&mut cur, json_len(&p), &mut bytes, &mut count);
        cur.policies.push(p);
    }
    for r in std::mem::take(&mut set.roles) {
        room(&mut cur, json_len(&r), &mut bytes, &mut count);
        cur.roles.push(r);
    }
    for t in std::mem::take(&mut set.tokens) {
        room(&mut cur, json_len(&t), &mut bytes, &mut count);
        cur.tokens.push(t);
    }
    chunks.push(cur);
    let mut out = Vec::with_capacity(chunks.len());
    let mut deletes = Some((delete_tokens, delete_roles, delete_policies));
    for c in chunks {
        let (delete_tokens, delete_roles, delete_policies) = deletes.take().unwrap_or_default();
        out.push(Command::AclReplicate {
            set: Box::new(c),
            delete_tokens,
            delete_roles,
            delete_policies,
        });
    }
    out
}

/// The writes that make this datacenter's config entries the primary's.
fn config_changes(st: &State, remote: &ConfigReplica) -> Vec<Command> {
    let key_of = |v: &Value| -> Option<(String, String)> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        Some((s("Kind")?.to_ascii_lowercase(), s("Name")?))
    };
    let there: BTreeMap<(String, String), &Value> = remote
        .entries
        .iter()
        .filter_map(|v| Some((key_of(v)?, v)))
        .collect();
    let delete: Vec<(String, String)> = st
        .config
        .keys()
        .map(|(k, n)| (k.as_str().to_string(), n.clone()))
        .filter(|key| !there.contains_key(key))
        .collect();
    let mut set: Vec<Value> = Vec::new();
    for v in there.values() {
        // An entry this server cannot read (a kind it does not serve) is
        // left to a server that can.
        let Ok(mut entry) = crate::state::config::from_stored(v) else {
            continue;
        };
        entry.set_indexes(0, 0);
        let same = st
            .config
            .get(&(entry.kind(), entry.name().to_string()))
            .is_some_and(|l| {
                let mut l = (**l).clone();
                l.set_indexes(0, 0);
                l == entry
            });
        if !same {
            set.push((*v).clone());
        }
    }
    if delete.is_empty() && set.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut cur: Vec<Value> = Vec::new();
    let mut bytes = 0;
    for v in set {
        let size = v.to_string().len();
        if !cur.is_empty() && (cur.len() >= BATCH_OBJECTS || bytes + size > BATCH_BYTES) {
            out.push(std::mem::take(&mut cur));
            bytes = 0;
        }
        bytes += size;
        cur.push(v);
    }
    out.push(cur);
    let mut delete = Some(delete);
    out.into_iter()
        .map(|set| Command::ConfigReplicate {
            set,
            delete: delete.take().unwrap_or_default(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::apply_command;
    use crate::structs::acl::{Link, secret_hash};

    fn token(accessor: &str, secret: &str, local: bool) -> AclToken {
        AclToken {
            accessor_id: accessor.into(),
            secret_hash: secret_hash(secret),
            local,
            policies: vec![Link {
                id: "p1".into(),
                name: "one".into(),
            }],
            ..Default::default()
        }
    }

    fn policy(id: &str, rules: &str) -> AclPolicy {
        AclPolicy {
            id: id.into(),
            name: format!("name-{id}"),
            rules: rules.into(),
            ..Default::default()
        }
    }

    fn apply_all(st: &mut State, index: u64, cmds: Vec<Command>) {
        for c in cmds {
            assert_eq!(apply_command(st, index, &c).0, Response::Ok);
        }
    }

    /// The primary's objects arrive whole, the secondary's local token
    /// stays, and once they match nothing more is written (an idle
    /// federation makes no Raft write).
    #[test]
    fn acl_changes_make_the_primarys_objects_and_then_nothing() {
        let mut st = State::default();
        // The secondary's own: a local token, and a global one the primary
        // does not have (its initial management token, say).
        let own = Command::AclTokenSet {
            token: Box::new(token("local", "s-local", true)),
        };
        apply_command(
            &mut st,
            1,
            &Command::AclPolicySet {
                policy: Box::new(policy("p1", "")),
            },
        );
        apply_command(&mut st, 2, &own);
        apply_command(
            &mut st,
            3,
            &Command::AclTokenSet {
                token: Box::new(token("stray", "s-stray", false)),
            },
        );
        let remote = AclReplica {
            policies: vec![policy("p1", r#"key "a" { policy = "read" }"#)],
            roles: Vec::new(),
            // A global token of the primary with the stray one's secret:
            // it takes its place.
            tokens: vec![token("g1", "s-stray", false), token("g2", "s2", false)],
            ..Default::default()
        };
        let cmds = acl_changes(&st, &remote);
        assert_eq!(cmds.len(), 1);
        apply_all(&mut st, 10, cmds);
        assert!(st.acl_tokens.contains_key("local"));
        assert!(!st.acl_tokens.contains_key("stray"));
        assert_eq!(
            crate::state::acl::token_by_secret_hash(&st, &secret_hash("s-stray"))
                .unwrap()
                .accessor_id,
            "g1"
        );
        assert_eq!(st.acl_policies["p1"].rules, remote.policies[0].rules);
        assert!(acl_changes(&st, &remote).is_empty());

        // The primary deletes g2: deleted here, the local token kept.
        let remote = AclReplica {
            tokens: vec![token("g1", "s-stray", false)],
            ..remote
        };
        let cmds = acl_changes(&st, &remote);
        apply_all(&mut st, 11, cmds);
        assert!(!st.acl_tokens.contains_key("g2"));
        assert!(st.acl_tokens.contains_key("local"));
        assert!(acl_changes(&st, &remote).is_empty());
    }

    /// Replication never deletes or overwrites a local token, nor lets a
    /// global token take a local one's secret, whatever a command says.
    #[test]
    fn a_replicated_write_leaves_local_tokens_alone() {
        let mut st = State::default();
        let local = AclToken {
            policies: Vec::new(),
            ..token("local", "s-local", true)
        };
        let set = Command::AclTokenSet {
            token: Box::new(local),
        };
        assert_eq!(apply_command(&mut st, 1, &set).0, Response::Ok);
        let cmd = Command::AclReplicate {
            set: Box::new(AclReplica {
                tokens: vec![
                    token("other", "s-local", false),
                    AclToken {
                        local: false,
                        ..token("local", "s-x", false)
                    },
                ],
                ..Default::default()
            }),
            delete_tokens: vec!["local".into(), ANONYMOUS_ID.into()],
            delete_roles: Vec::new(),
            delete_policies: vec![GLOBAL_MANAGEMENT_ID.into()],
        };
        apply_command(&mut st, 2, &cmd);
        let kept = &st.acl_tokens["local"];
        assert!(kept.local);
        assert_eq!(kept.secret_hash, secret_hash("s-local"));
        assert!(!st.acl_tokens.contains_key("other"));
    }

    /// A primary without ACLs would wipe this datacenter's tokens: refused.
    #[test]
    fn a_primary_without_acl_state_is_not_replicated() {
        assert!(acl_ready(&AclReplica::default()).is_err());
        let ready = AclReplica {
            tokens: vec![crate::structs::acl::anonymous()],
            ..Default::default()
        };
        assert!(acl_ready(&ready).is_ok());
    }

    /// Many objects go as several bounded writes, deletes with the first.
    #[test]
    fn large_changes_are_split_into_bounded_writes() {
        let st = State::default();
        let remote = AclReplica {
            policies: (0..600).map(|i| policy(&format!("p{i}"), "")).collect(),
            ..Default::default()
        };
        let cmds = acl_changes(&st, &remote);
        assert_eq!(cmds.len(), 3);
        for c in &cmds {
            let Command::AclReplicate { set, .. } = c else {
                panic!("{c:?}")
            };
            assert!(set.policies.len() <= BATCH_OBJECTS);
        }
    }

    #[test]
    fn config_changes_make_the_primarys_entries_and_then_nothing() {
        let mut st = State::default();
        let mine = serde_json::json!({"Kind": "service-defaults", "Name": "gone"});
        apply_command(
            &mut st,
            1,
            &Command::ConfigSet {
                entry: mine,
                cas: None,
            },
        );
        let remote = ConfigReplica {
            entries: vec![serde_json::json!({
                "Kind": "service-defaults", "Name": "web", "Protocol": "http",
                "CreateIndex": 40, "ModifyIndex": 41,
            })],
        };
        let cmds = config_changes(&st, &remote);
        assert_eq!(cmds.len(), 1);
        apply_all(&mut st, 5, cmds);
        let web = &st.config[&(
            crate::structs::config_entry::Kind::ServiceDefaults,
            "web".into(),
        )];
        assert_eq!(web.modify_index(), 5);
        assert_eq!(st.config.len(), 1);
        assert!(config_changes(&st, &remote).is_empty());
    }

    #[test]
    fn auth_methods_and_binding_rules_follow_the_primary() {
        let mut st = State::default();
        let method = |kind: &str| AclAuthMethod {
            name: "k8s".into(),
            kind: kind.into(),
            ..Default::default()
        };
        let rule = AclBindingRule {
            id: "r1".into(),
            auth_method: "k8s".into(),
            bind_type: "service".into(),
            bind_name: "web".into(),
            ..Default::default()
        };
        let mut remote = AclReplica {
            auth_methods: vec![method("kubernetes")],
            binding_rules: vec![rule.clone()],
            ..Default::default()
        };
        let cmds = acl_changes(&st, &remote);
        apply_all(&mut st, 2, cmds);
        assert_eq!(st.acl_binding_rules["r1"].bind_name, "web");
        assert!(acl_changes(&st, &remote).is_empty());
        // Made again with another type there: here too, its rules gone.
        remote.auth_methods = vec![method("jwt")];
        remote.binding_rules.clear();
        let cmds = acl_changes(&st, &remote);
        apply_all(&mut st, 3, cmds);
        assert_eq!(st.acl_auth_methods["k8s"].kind, "jwt");
        assert!(st.acl_binding_rules.is_empty());
        remote.auth_methods.clear();
        let cmds = acl_changes(&st, &remote);
        apply_all(&mut st, 4, cmds);
        assert!(st.acl_auth_methods.is_empty());
        assert!(acl_changes(&st, &remote).is_empty());
    }
}
