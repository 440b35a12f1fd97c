//! Checker (g), on ACL seeds: no DNS answer carries an object the
//! servers' DNS token (`--acl-token`) could not read at the index the
//! answering server had applied, and names it may read are answered.
//!
//! - `setup`: what the admin writes for it: the DNS policy (`DNS_RULES`)
//!   and token, and catalog entries on two nodes (`REGISTRATIONS`), so
//!   that readable and unreadable services and nodes exist beside the
//!   workload's (`web` on `node-<client>`, one of them unreadable).
//!   `narrow`: the admin's mid-run update of the policy
//!   (`DNS_RULES_NARROWED`, `api` denied too).
//! - `client`: asks random servers for service (A, SRV) and node (A)
//!   names, readable and not, through the server's DNS resolver
//!   (`ApiRequest::Dns`), and records each answer as the objects it names
//!   (every address and SRV target mapped back to its node or service
//!   instance) with the server's applied index.
//! - `check`: each object must be readable under the token as it stood at
//!   that index (`Committed::acl_rows`, the rules written out again here
//!   by hand, not through cairn's rules code); and answers must contain
//!   readable services and nodes, and names it may not read must have
//!   answered NXDOMAIN, so that the check is not passed by silence.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn::structs::acl::AclPolicy;
use cairn::structs::{NodeService, RegisterRequest};
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::acl::{Access, Tokens, token_of};
use crate::node::{API_PORT, ApiReply, ApiRequest, Committed, call, calls, now_us};

const POLICY_ID: &str = "5e1f0000-0000-4000-8000-0000000000b2";
const POLICY_NAME: &str = "sim-dns";

/// What the servers' DNS token reads first: every service but `vault`,
/// every node but `dns-hidden*` and the workload's `node-1`.
pub const DNS_RULES: &str = r#"
service_prefix "" { policy = "read" }
service "vault" { policy = "deny" }
node_prefix "" { policy = "read" }
node_prefix "dns-hidden" { policy = "deny" }
node "node-1" { policy = "deny" }
"#;

/// And after the admin narrows it mid-run: `api` denied too.
pub const DNS_RULES_NARROWED: &str = r#"
service_prefix "" { policy = "read" }
service "vault" { policy = "deny" }
service "api" { policy = "deny" }
node_prefix "" { policy = "read" }
node_prefix "dns-hidden" { policy = "deny" }
node "node-1" { policy = "deny" }
"#;

/// Something an answer can show.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Object {
    Node(String),
    Service(String),
}

/// The rules above written out by hand: `narrowed` for
/// `DNS_RULES_NARROWED`.
fn may_read(narrowed: bool, o: &Object) -> bool {
    match o {
        Object::Service(s) => s != "vault" && !(narrowed && s == "api"),
        Object::Node(n) => !n.starts_with("dns-hidden") && n != "node-1",
    }
}

/// The checker's own catalog entries: (node, node address, service,
/// service ID, service address). Every address is distinct, so an
/// address in an answer names its node or instance.
pub const REGISTRATIONS: [(&str, &str, &str, &str, &str); 4] = [
    ("dns-seen", "10.53.0.1", "api", "api-1", ""),
    ("dns-hidden", "10.53.0.2", "api", "api-2", ""),
    ("dns-seen", "10.53.0.1", "vault", "vault-1", "10.53.1.1"),
    ("dns-seen", "10.53.0.1", "api", "api-3", "10.53.2.1"),
];

/// What the admin writes for the checker (after the other tokens).
pub fn setup(t: &Tokens) -> Vec<ApiRequest> {
    let mut writes = vec![
        calls::new_policy(policy(DNS_RULES)),
        calls::new_token(token_of(
            &t.dns_accessor,
            &t.dns,
            "dns",
            POLICY_ID,
            POLICY_NAME,
        )),
    ];
    for (node, address, service, id, svc_address) in REGISTRATIONS {
        writes.push(calls::register(RegisterRequest {
            node: node.into(),
            address: address.into(),
            service: Some(NodeService {
                id: id.into(),
                service: service.into(),
                address: svc_address.into(),
                port: 8080,
                ..Default::default()
            }),
            ..Default::default()
        }));
    }
    writes
}

/// The mid-run update of the DNS token's policy.
pub fn narrow() -> ApiRequest {
    calls::update_policy(policy(DNS_RULES_NARROWED))
}

fn policy(rules: &str) -> AclPolicy {
    AclPolicy {
        id: POLICY_ID.into(),
        name: POLICY_NAME.into(),
        rules: rules.into(),
        ..Default::default()
    }
}

/// What the client asks: (label, a service name rather than a node's).
const NAMES: [(&str, bool); 7] = [
    ("api", true),
    ("vault", true),
    ("web", true),
    ("dns-seen", false),
    ("dns-hidden", false),
    ("node-1", false),
    ("node-2", false),
];

/// One answer, as the client saw it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DnsUse {
    pub asked: usize,
    pub name: Object,
    pub qtype: RecordType,
    /// The server's applied index before and after it resolved the query.
    pub before: u64,
    pub after: u64,
    pub code: ResponseCode,
    /// What the answer named (sorted; the resolver shuffles instances).
    pub objects: BTreeSet<Object>,
    /// Records or addresses the checker could not map to an object.
    pub unknown: Vec<String>,
}

pub type DnsLog = Arc<Mutex<Vec<DnsUse>>>;

fn object_of_ip(ip: IpAddr) -> Vec<Object> {
    let ip = ip.to_string();
    if let Some(r) = REGISTRATIONS.iter().find(|r| r.4 == ip) {
        return vec![Object::Node(r.0.into()), Object::Service(r.2.into())];
    }
    REGISTRATIONS
        .iter()
        .find(|r| r.1 == ip)
        .map(|r| vec![Object::Node(r.0.into())])
        .unwrap_or_default()
}

/// The objects a record names: an address's node (or instance), a
/// CNAME's node (the workload's nodes' addresses are `<node>.sim`), an
/// SRV target's node or instance.
fn objects_of(data: &RData) -> Option<Vec<Object>> {
    let under = |n: &Name, suffix: &str| {
        n.to_ascii()
            .to_ascii_lowercase()
            .strip_suffix(suffix)
            .map(str::to_string)
    };
    match data {
        RData::A(a) => Some(object_of_ip(IpAddr::V4(a.0))).filter(|o| !o.is_empty()),
        RData::AAAA(a) => Some(object_of_ip(IpAddr::V6(a.0))).filter(|o| !o.is_empty()),
        RData::CNAME(c) => under(&c.0, ".sim.").map(|n| vec![Object::Node(n)]),
        RData::SRV(s) => {
            if let Some(n) = under(&s.target, ".node.dc1.consul.") {
                return Some(vec![Object::Node(n)]);
            }
            let hex = under(&s.target, ".addr.dc1.consul.")?;
            let ip = std::net::Ipv4Addr::from(u32::from_str_radix(&hex, 16).ok()?);
            Some(object_of_ip(ip.into())).filter(|o| !o.is_empty())
        }
        RData::SOA(_) => Some(Vec::new()),
        _ => None,
    }
}

/// Asks random servers until `until`, a query every few tens of ms.
pub async fn client(
    access: Access, seed: u64, servers: Vec<IpAddr>, until: Duration, log: DnsLog,
) -> turmoil::Result {
    if !access.enabled() {
        return Ok(());
    }
    access.workload().await;
    let mut rng = StdRng::seed_from_u64(seed ^ 0xD45_0D45);
    while turmoil::sim_elapsed().unwrap_or_default() < until {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(10..60))).await;
        let (label, service) = NAMES[rng.gen_range(0..NAMES.len())];
        let (kind, qtype) = match (service, rng.gen_bool(0.5)) {
            (true, true) => ("service", RecordType::SRV),
            (true, false) => ("service", RecordType::A),
            (false, _) => ("node", RecordType::A),
        };
        let Ok(qname) = Name::from_ascii(format!("{label}.{kind}.consul.")) else {
            continue;
        };
        let mut query = Message::new(rng.r#gen(), MessageType::Query, OpCode::Query);
        query.add_query(Query::query(qname, qtype));
        let Ok(bytes) = query.to_vec() else { continue };
        let asked = rng.gen_range(0..servers.len());
        let addr = SocketAddr::new(servers[asked], API_PORT);
        let req = ApiRequest::Dns { query: bytes };
        let Ok(ApiReply::Dns {
            answer: Some(answer),
            before,
            after,
        }) = call(addr, &req, None, Duration::from_secs(2)).await
        else {
            continue;
        };
        let name = if service {
            Object::Service(label.into())
        } else {
            Object::Node(label.into())
        };
        let mut u = DnsUse {
            asked,
            name: name.clone(),
            qtype,
            before,
            after,
            code: ResponseCode::ServFail,
            objects: BTreeSet::new(),
            unknown: Vec::new(),
        };
        match Message::from_vec(&answer) {
            Ok(m) => {
                u.code = m.metadata.response_code;
                if !m.answers.is_empty() {
                    u.objects.insert(name);
                }
                for r in m.answers.iter().chain(&m.additionals) {
                    match objects_of(&r.data) {
                        Some(o) => u.objects.extend(o),
                        None => u.unknown.push(format!("{r}")),
                    }
                }
            }
            Err(e) => u
                .unknown
                .push(format!("an answer that does not decode: {e}")),
        }
        if std::env::var_os("SIM_TRACE").is_some() {
            eprintln!("{} ms: dns: {u:?}", now_us() / 1000);
        }
        log.lock().unwrap().push(u);
    }
    Ok(())
}

/// What checker (g) saw in one run.
#[derive(Debug, Clone, Default)]
pub struct DnsStats {
    /// Answers checked (any response code).
    pub answers: usize,
    /// Answers that named a readable service, a readable node.
    pub services_answered: usize,
    pub nodes_answered: usize,
    /// Queries for a name the token could not read answered NXDOMAIN.
    pub denied_nxdomain: usize,
    /// Answers from a server that had applied the narrowed policy.
    pub after_narrowing: usize,
    pub failures: Vec<String>,
}

/// The DNS token's rules at `index`: none while the token or its policy
/// does not exist (it then reads nothing), else whether they are the
/// narrowed ones.
fn rules_at(truth: &Committed, token_key: &str, index: u64) -> Option<bool> {
    let at = |key: &str| {
        truth
            .acl_rows
            .get(key)
            .and_then(|m| m.range(..=index).next_back())
            .and_then(|(_, v)| v.clone())
    };
    at(token_key)?;
    let rules = at(&cairn::state::acl::policy_key(POLICY_ID))?;
    Some(rules == DNS_RULES_NARROWED)
}

/// Checker (g) on a finished run.
pub fn check(tokens: &Tokens, log: &[DnsUse], truth: &Committed) -> DnsStats {
    let mut stats = DnsStats::default();
    let token_key = format!("t/{}", tokens.dns_accessor);
    for u in log {
        stats.answers += 1;
        for x in &u.unknown {
            stats.failures.push(format!(
                "dns: a record the checker cannot place: {x} in {u:?}"
            ));
        }
        // Readable at the index the server read at (the two are one in
        // practice: nothing applies while a query resolves).
        let at = [u.before, u.after].map(|i| rules_at(truth, &token_key, i));
        let readable = |o: &Object| at.iter().any(|r| r.is_some_and(|n| may_read(n, o)));
        for o in &u.objects {
            if !readable(o) {
                stats.failures.push(format!(
                    "dns: s{} answered with {o:?}, which its DNS token could not read at applied index {} (rules there: {:?}): {u:?}",
                    u.asked + 1,
                    u.before,
                    at[0]
                ));
            }
        }
        if at[0] == Some(true) {
            stats.after_narrowing += 1;
        }
        let readable_answer = |o: &Object| u.objects.contains(o) && readable(o);
        if matches!(u.name, Object::Service(_)) && readable_answer(&u.name) {
            stats.services_answered += 1;
        }
        if matches!(u.name, Object::Node(_)) && readable_answer(&u.name) {
            stats.nodes_answered += 1;
        }
        if !readable(&u.name) && u.code == ResponseCode::NXDomain {
            stats.denied_nxdomain += 1;
        }
    }
    // Not passed by silence: it answered what it may read, and refused
    // what it may not.
    let counts = [
        (stats.services_answered, "a readable service"),
        (stats.nodes_answered, "a readable node"),
        (stats.denied_nxdomain, "NXDOMAIN for an unreadable name"),
    ];
    for (n, what) in counts {
        if n == 0 {
            stats.failures.push(format!(
                "dns: no progress: no answer with {what} in {} answers",
                stats.answers
            ));
        }
    }
    stats
}
