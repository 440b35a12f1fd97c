//! One DNS query to its answer, as Consul answers it: which lookup a name
//! is, which instances are healthy, their records (and the SRV targets'
//! addresses in the additional section), and the cut to the size the
//! transport allows.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME, SOA, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use rand::seq::SliceRandom;

use super::{Catalog, DnsConfig};
use crate::acl::Authorizer;
use crate::state::catalog::Instance;
use crate::structs::{HEALTH_CRITICAL, HEALTH_WARNING, Node};

/// The largest message over TCP (its length prefix is 16 bits).
pub const TCP_MAX: usize = 65_535;
/// The largest UDP answer, whatever EDNS0 size a client claims.
const UDP_MAX: usize = 65_000;
/// What we accept in a query's EDNS0 OPT (our UDP read buffer).
pub const EDNS_PAYLOAD: u16 = 4096;

/// What a name asks for, once the domain (and datacenter) are taken off.
#[derive(Debug, PartialEq)]
enum Lookup {
    /// Outside the domain: recursion, which this server refuses.
    Outside,
    /// In the domain, but nothing can answer it.
    Missing,
    /// The domain itself.
    Apex,
    Service {
        name: String,
        tag: Option<String>,
        connect: bool,
    },
    Node(String),
    /// `<name>.query.consul`: a prepared query, executed.
    Query(String),
    /// `<service>.virtual.consul`: the service's virtual IP.
    Virtual(String),
    /// `<service>.virtual.<peer>.consul`: a peer's service (Consul reads
    /// the label as a peer's name, never a datacenter's: virtual IPs are
    /// a datacenter's own); cairn has no peers, so nothing.
    VirtualOfPeer,
    /// `<hex-ip>.addr.<dc>.consul`, the name of an SRV target that is a
    /// service address.
    Addr(IpAddr),
    /// A service or node of another datacenter: asked there.
    Elsewhere(String, Box<Lookup>),
}

/// Which lookup `qname` is. Names of services, tags and nodes keep the
/// query's case; the domain and keywords match in any case.
fn parse(qname: &Name, domain: &Name, dc: &str) -> Lookup {
    if !domain.zone_of(&qname.to_lowercase()) {
        return Lookup::Outside;
    }
    let n = usize::from(qname.num_labels()) - usize::from(domain.num_labels());
    let labels: Vec<String> = qname
        .iter()
        .take(n)
        .map(|l| String::from_utf8_lossy(l).into_owned())
        .collect();
    if labels.is_empty() {
        return Lookup::Apex;
    }
    const KINDS: &[&str] = &[
        "service", "connect", "node", "addr", "virtual", "query", "ingress",
    ];
    let is_kind = |l: &str| KINDS.contains(&l.to_ascii_lowercase().as_str());
    // The label after the kind, if any: a datacenter (a peer after
    // `virtual`).
    let (kind, rest, after) = match labels.as_slice() {
        [rest @ .., k] if is_kind(k) => (k, rest, None),
        [rest @ .., k, d] if is_kind(k) => (k, rest, Some(d)),
        _ => return Lookup::Missing,
    };
    match (after, parse_kind(&kind.to_ascii_lowercase(), rest)) {
        (Some(_), Lookup::Virtual(_)) => Lookup::VirtualOfPeer,
        (Some(d), l) if d.eq_ignore_ascii_case(dc) => l,
        // Another datacenter: asked there (datacenter names are matched
        // as the federation spells them, lower case).
        (Some(d), l @ (Lookup::Service { .. } | Lookup::Node(_) | Lookup::Query(_))) => {
            Lookup::Elsewhere(d.to_ascii_lowercase(), Box::new(l))
        }
        (Some(_), l @ Lookup::Addr(_)) | (None, l) => l,
        (Some(_), _) => Lookup::Missing,
    }
}

/// The lookup of a name's labels before its kind.
fn parse_kind(kind: &str, rest: &[String]) -> Lookup {
    match (kind, rest) {
        ("service", [name]) => Lookup::Service {
            name: name.clone(),
            tag: None,
            connect: false,
        },
        ("service", [a, b]) => match (a.strip_prefix('_'), b.strip_prefix('_')) {
            // RFC 2782: `_<service>._<tag>`, where `_tcp` means any tag.
            (Some(name), Some(proto)) => Lookup::Service {
                name: name.to_string(),
                tag: (!proto.eq_ignore_ascii_case("tcp")).then(|| proto.to_string()),
                connect: false,
            },
            _ => Lookup::Service {
                name: b.clone(),
                tag: Some(a.clone()),
                connect: false,
            },
        },
        ("connect", [name]) => Lookup::Service {
            name: name.clone(),
            tag: None,
            connect: true,
        },
        ("node", [name]) => Lookup::Node(name.clone()),
        ("query", [name]) => Lookup::Query(name.clone()),
        ("addr", [hex]) => parse_hex_ip(hex).map_or(Lookup::Missing, Lookup::Addr),
        ("virtual", [name]) => Lookup::Virtual(name.clone()),
        // Ingress gateways' names: cairn does not answer them.
        _ => Lookup::Missing,
    }
}

/// Consul's `.addr.` label: the address's bytes in hex (8 or 32 digits).
fn parse_hex_ip(hex: &str) -> Option<IpAddr> {
    if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    match hex.len() {
        8 => Some(Ipv4Addr::from(u32::from_str_radix(hex, 16).ok()?).into()),
        32 => Some(Ipv6Addr::from(u128::from_str_radix(hex, 16).ok()?).into()),
        _ => None,
    }
}

fn hex_ip(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => format!("{:08x}", u32::from(v4)),
        IpAddr::V6(v6) => format!("{:032x}", u128::from(v6)),
    }
}

/// The records one instance (or node) contributes: cut together, so an
/// SRV record never loses its target's address while it stays.
#[derive(Default)]
struct Entry {
    answers: Vec<Record>,
    additionals: Vec<Record>,
}

/// Records for `address` under `name`: A or AAAA as the query asks, or a
/// CNAME when the address is a host name (as Consul answers).
fn address_records(name: &Name, address: &str, qtype: RecordType, ttl: u32) -> Vec<Record> {
    let want_a = matches!(qtype, RecordType::A | RecordType::ANY);
    let want_aaaa = matches!(qtype, RecordType::AAAA | RecordType::ANY);
    match address.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) if want_a => {
            vec![Record::from_rdata(name.clone(), ttl, RData::A(A(ip)))]
        }
        Ok(IpAddr::V6(ip)) if want_aaaa => {
            vec![Record::from_rdata(name.clone(), ttl, RData::AAAA(AAAA(ip)))]
        }
        Ok(_) => Vec::new(),
        Err(_) if want_a || want_aaaa || qtype == RecordType::CNAME => {
            match Name::from_ascii(address) {
                Ok(mut target) => {
                    target.set_fqdn(true);
                    vec![Record::from_rdata(
                        name.clone(),
                        ttl,
                        RData::CNAME(CNAME(target)),
                    )]
                }
                Err(_) => Vec::new(),
            }
        }
        Err(_) => Vec::new(),
    }
}

/// Healthy as Consul's DNS counts it: no critical check (maintenance
/// checks are critical), and with `only_passing` no warning either.
fn healthy(i: &Instance, only_passing: bool) -> bool {
    i.checks
        .iter()
        .all(|c| c.status != HEALTH_CRITICAL && !(only_passing && c.status == HEALTH_WARNING))
}

fn has_tag(i: &Instance, tag: &Option<String>) -> bool {
    tag.as_ref()
        .is_none_or(|t| i.service.tags.iter().any(|x| x.eq_ignore_ascii_case(t)))
}

/// A name under the domain (`<label>.<kind>.<dc>.<domain>`); none when the
/// label cannot be part of a DNS name.
fn name_in(cfg: &DnsConfig, label: &str, kind: &str, dc: &str) -> Option<Name> {
    let mut n = Name::from_ascii(format!("{label}.{kind}.{dc}")).ok()?;
    n.set_fqdn(false);
    n.append_domain(&cfg.domain).ok()
}

fn instance_entry(
    cfg: &DnsConfig, dc: &str, qname: &Name, qtype: RecordType, i: &Instance, ttl: u32,
) -> Option<Entry> {
    let svc_addr = i.service.address.as_str();
    let address = if svc_addr.is_empty() {
        i.node.address.as_str()
    } else {
        svc_addr
    };
    if qtype != RecordType::SRV {
        return Some(Entry {
            answers: address_records(qname, address, qtype, ttl),
            additionals: Vec::new(),
        });
    }
    // The SRV target: the node's name for the node's address, Consul's
    // `<hex>.addr.` name for a service address, the host name itself for
    // a service address that is one.
    let (target, extra) = match (svc_addr.is_empty(), address.parse::<IpAddr>()) {
        (true, _) => (name_in(cfg, &i.node.node, "node", dc)?, true),
        (false, Ok(ip)) => (name_in(cfg, &hex_ip(ip), "addr", dc)?, true),
        (false, Err(_)) => {
            let mut n = Name::from_ascii(address).ok()?;
            n.set_fqdn(true);
            (n, false)
        }
    };
    let warning = i.checks.iter().any(|c| c.status == HEALTH_WARNING);
    let weight = if warning {
        i.service.weights.warning
    } else {
        i.service.weights.passing
    };
    let srv = SRV::new(
        1,
        weight.clamp(0, i64::from(u16::MAX)) as u16,
        i.service.port.clamp(0, i64::from(u16::MAX)) as u16,
        target.clone(),
    );
    let mut additionals = Vec::new();
    if extra {
        for qt in [RecordType::A, RecordType::AAAA] {
            additionals.extend(address_records(&target, address, qt, ttl));
        }
    }
    Some(Entry {
        answers: vec![Record::from_rdata(qname.clone(), ttl, RData::SRV(srv))],
        additionals,
    })
}

/// The domain's SOA, for the authority section of NXDOMAIN and empty
/// answers (Consul's values; a minimum TTL of 0, so nothing is cached
/// negatively).
fn soa(cfg: &DnsConfig) -> Record {
    let at = |l: &str| {
        Name::from_ascii(l)
            .and_then(|n| n.append_domain(&cfg.domain))
            .unwrap_or_else(|_| cfg.domain.clone())
    };
    let serial = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as u32);
    let rdata = SOA::new(at("ns"), at("hostmaster"), serial, 3600, 600, 86400, 0);
    Record::from_rdata(cfg.domain.clone(), 0, RData::SOA(rdata))
}

/// What a query is answered with before it is cut to size.
struct Answer {
    code: ResponseCode,
    entries: Vec<Entry>,
    /// The SOA goes in the authority section (NXDOMAIN, or a name with no
    /// records of the type asked).
    soa: bool,
}

impl Answer {
    fn code(code: ResponseCode) -> Self {
        Answer {
            code,
            entries: Vec::new(),
            soa: false,
        }
    }
    fn not_found() -> Self {
        Answer {
            code: ResponseCode::NXDomain,
            entries: Vec::new(),
            soa: true,
        }
    }
    /// Records found; none of the type asked is an empty NOERROR with the SOA.
    fn records(entries: Vec<Entry>) -> Self {
        let soa = entries.iter().all(|e| e.answers.is_empty());
        Answer {
            code: ResponseCode::NoError,
            entries,
            soa,
        }
    }
}

async fn lookup<C: Catalog>(cfg: &DnsConfig, catalog: &C, req: &Message) -> Answer {
    let q = &req.queries[0];
    let (qname, qtype) = (q.name(), q.query_type());
    let dc = catalog.datacenter();
    match parse(qname, &cfg.domain, &dc) {
        Lookup::Outside => Answer::code(ResponseCode::Refused),
        Lookup::Missing => Answer::not_found(),
        Lookup::Apex if qtype == RecordType::SOA => Answer::records(vec![Entry {
            answers: vec![soa(cfg)],
            additionals: Vec::new(),
        }]),
        Lookup::Apex => Answer::records(Vec::new()),
        Lookup::Addr(ip) => Answer::records(vec![Entry {
            answers: address_records(qname, &ip.to_string(), qtype, cfg.node_ttl),
            additionals: Vec::new(),
        }]),
        Lookup::Node(name) => {
            let found = match catalog.authorizer().await {
                Ok(authz) => any_case(
                    &name,
                    Option::is_none,
                    |n| async move { catalog.node(&n).await },
                )
                .await
                .map(|(_, n)| n.filter(|n| authz.node_read(&n.node))),
                Err(e) => Err(e),
            };
            match found {
                Err(e) => {
                    tracing::warn!(error = %e, "DNS node lookup failed");
                    Answer::code(ResponseCode::ServFail)
                }
                // Not readable is not found: nothing tells it exists.
                Ok(None) => Answer::not_found(),
                Ok(Some(node)) => Answer::records(vec![node_entry(cfg, qname, qtype, &node)]),
            }
        }
        Lookup::Service { name, tag, connect } => {
            let found = match catalog.authorizer().await {
                Ok(authz) => any_case(&name, Vec::is_empty, |n| async move {
                    catalog.instances(&n, connect).await
                })
                .await
                .map(|(name, found)| readable(&authz, &name, found)),
                Err(e) => Err(e),
            };
            match found {
                Ok(found) => service_answer(cfg, &dc, qname, qtype, found, &tag),
                Err(e) => {
                    tracing::warn!(error = %e, "DNS service lookup failed");
                    Answer::code(ResponseCode::ServFail)
                }
            }
        }
        Lookup::Query(name) => prepared_query(cfg, catalog, qname, qtype, None, &name, &dc).await,
        Lookup::Virtual(name) => virtual_ip(cfg, catalog, qname, qtype, &name).await,
        // As Consul: no virtual IP is an empty answer, not a missing name.
        Lookup::VirtualOfPeer => Answer::records(Vec::new()),
        Lookup::Elsewhere(other, l) => elsewhere(cfg, catalog, qname, qtype, &other, *l).await,
    }
}

/// `<service>.virtual.consul`: the virtual IP the servers assigned the
/// service, as an A record with the node TTL (Consul's); none (or a
/// service the DNS token may not read) is an empty answer, as Consul's.
async fn virtual_ip<C: Catalog>(
    cfg: &DnsConfig, catalog: &C, qname: &Name, qtype: RecordType, name: &str,
) -> Answer {
    let authz = match catalog.authorizer().await {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(error = %e, "DNS virtual IP lookup failed");
            return Answer::code(ResponseCode::ServFail);
        }
    };
    let found = any_case(name, Option::is_none, |n| async move {
        catalog.virtual_ip(&n).await
    })
    .await;
    match found {
        Err(e) => {
            tracing::warn!(error = %e, "DNS virtual IP lookup failed");
            Answer::code(ResponseCode::ServFail)
        }
        Ok((svc, Some(ip))) if authz.service_read(&svc) => Answer::records(vec![Entry {
            answers: address_records(qname, &ip.to_string(), qtype, cfg.node_ttl),
            additionals: Vec::new(),
        }]),
        Ok(_) => Answer::records(Vec::new()),
    }
}

/// `<name>.query[.<dc>].consul`: the query executed where it is asked
/// (its ACLs, failover and order are the execute's).
async fn prepared_query<C: Catalog>(
    cfg: &DnsConfig, catalog: &C, qname: &Name, qtype: RecordType, dc: Option<&str>, name: &str,
    own: &str,
) -> Answer {
    match catalog.prepared_query(dc, name).await {
        Ok(Some(found)) => query_answer(cfg, dc.unwrap_or(own), qname, qtype, found),
        Ok(None) => Answer::not_found(),
        Err(e) => {
            tracing::warn!(error = %e, query = name, "DNS prepared query lookup failed");
            Answer::code(ResponseCode::ServFail)
        }
    }
}

/// A service or node of another datacenter, as that datacenter answers
/// with the DNS token (its ACLs judge it: nothing is filtered here).
async fn elsewhere<C: Catalog>(
    cfg: &DnsConfig, catalog: &C, qname: &Name, qtype: RecordType, dc: &str, l: Lookup,
) -> Answer {
    match l {
        Lookup::Node(name) => {
            let found = any_case(
                &name,
                |f: &Option<Option<Arc<Node>>>| matches!(f, Some(None)),
                |n| async move { catalog.remote_node(dc, &n).await },
            )
            .await;
            match found.map(|(_, f)| f) {
                Err(e) => {
                    tracing::warn!(error = %e, dc, "DNS node lookup in another datacenter failed");
                    Answer::code(ResponseCode::ServFail)
                }
                Ok(Some(Some(node))) => Answer::records(vec![node_entry(cfg, qname, qtype, &node)]),
                // No such node, or no path to that datacenter.
                Ok(_) => Answer::not_found(),
            }
        }
        Lookup::Service { name, tag, connect } => {
            let found = any_case(
                &name,
                |f: &Option<Vec<Instance>>| f.as_ref().is_some_and(Vec::is_empty),
                |n| async move { catalog.remote_instances(dc, &n, connect).await },
            )
            .await;
            match found.map(|(_, f)| f) {
                Err(e) => {
                    tracing::warn!(error = %e, dc, "DNS service lookup in another datacenter failed");
                    Answer::code(ResponseCode::ServFail)
                }
                Ok(Some(found)) => service_answer(cfg, dc, qname, qtype, found, &tag),
                Ok(None) => Answer::not_found(),
            }
        }
        Lookup::Query(name) => {
            prepared_query(cfg, catalog, qname, qtype, Some(dc), &name, dc).await
        }
        _ => Answer::not_found(),
    }
}

/// The healthy instances carrying `tag` as records (names of `dc`).
fn service_answer(
    cfg: &DnsConfig, dc: &str, qname: &Name, qtype: RecordType, mut found: Vec<Instance>,
    tag: &Option<String>,
) -> Answer {
    found.retain(|i| healthy(i, cfg.only_passing) && has_tag(i, tag));
    if found.is_empty() {
        return Answer::not_found();
    }
    found.shuffle(&mut crate::random::rng());
    let entries: Vec<Entry> = found
        .iter()
        .filter_map(|i| instance_entry(cfg, dc, qname, qtype, i, cfg.service_ttl))
        .collect();
    Answer::records(unique_addresses(entries))
}

/// A prepared query's instances as records, in the order its execute
/// gave them (shuffled and sorted there), with its own TTL when it sets
/// one (names of the datacenter that answered).
fn query_answer(
    cfg: &DnsConfig, dc: &str, qname: &Name, qtype: RecordType, found: super::QueryAnswer,
) -> Answer {
    if found.nodes.is_empty() {
        return Answer::not_found();
    }
    let ttl = found.dns.ttl_secs().unwrap_or(cfg.service_ttl);
    let dc = if found.datacenter.is_empty() {
        dc
    } else {
        &found.datacenter
    };
    let entries: Vec<Entry> = found
        .nodes
        .iter()
        .filter_map(|i| instance_entry(cfg, dc, qname, qtype, i, ttl))
        .collect();
    Answer::records(unique_addresses(entries))
}

/// Several instances on one address give that address once.
fn unique_addresses(mut entries: Vec<Entry>) -> Vec<Entry> {
    let mut seen: Vec<RData> = Vec::new();
    for e in &mut entries {
        e.answers.retain(|r| {
            if r.record_type() == RecordType::SRV {
                return true;
            }
            if seen.contains(&r.data) {
                return false;
            }
            seen.push(r.data.clone());
            true
        });
    }
    entries.retain(|e| !e.answers.is_empty());
    entries
}

/// What the token may see of `service`'s instances (`name` as found):
/// nothing without `service:read` on it, and only the instances on nodes
/// it may read (Consul's filter of a health read).
fn readable(authz: &Authorizer, service: &str, mut found: Vec<Instance>) -> Vec<Instance> {
    if !authz.service_read(service) {
        return Vec::new();
    }
    found.retain(|i| authz.node_read(&i.node.node));
    found
}

/// DNS names match in any case, the catalog's names exactly: a name
/// `missing` as asked is looked up again in lower case (resolvers may send
/// names in mixed case, and DNS-friendly names are lower case). With the
/// name it was found under.
async fn any_case<T, F>(
    name: &str, missing: impl Fn(&T) -> bool, find: impl Fn(String) -> F,
) -> Result<(String, T), super::LookupError>
where
    F: std::future::Future<Output = Result<T, super::LookupError>>,
{
    let found = find(name.to_string()).await?;
    let lower = name.to_ascii_lowercase();
    if missing(&found) && lower != name {
        let found = find(lower.clone()).await?;
        return Ok((lower, found));
    }
    Ok((name.to_string(), found))
}

fn node_entry(cfg: &DnsConfig, qname: &Name, qtype: RecordType, node: &Arc<Node>) -> Entry {
    Entry {
        answers: address_records(qname, &node.address, qtype, cfg.node_ttl),
        additionals: Vec::new(),
    }
}

/// The reply header for `req`: authoritative, no recursion available,
/// the question echoed, an OPT when the query had one.
fn reply(req: &Message, code: ResponseCode) -> Message {
    let mut m = Message::response(req.metadata.id, req.metadata.op_code);
    m.metadata.response_code = code;
    m.metadata.authoritative = true;
    m.metadata.recursion_desired = req.metadata.recursion_desired;
    m.metadata.recursion_available = false;
    m.add_queries(req.queries.iter().cloned());
    if req.edns.is_some() {
        let mut edns = Edns::new();
        edns.set_max_payload(EDNS_PAYLOAD);
        m.set_edns(edns);
    }
    m
}

/// The answer to a raw query, at most `max` bytes when the transport is
/// UDP (`udp`), or none when it gets no answer at all (a response, or
/// bytes that are not a DNS header).
pub async fn answer<C: Catalog>(
    cfg: &DnsConfig, catalog: &C, raw: &[u8], udp: bool,
) -> Option<Vec<u8>> {
    let req = match Message::from_vec(raw) {
        Ok(m) => m,
        Err(_) => return formerr(raw),
    };
    if req.metadata.message_type != MessageType::Query {
        return None;
    }
    if req.metadata.op_code != OpCode::Query {
        return reply(&req, ResponseCode::NotImp).to_vec().ok();
    }
    if req.queries.len() != 1 {
        return reply(&req, ResponseCode::FormErr).to_vec().ok();
    }
    let max = if udp {
        usize::from(req.max_payload()).min(UDP_MAX)
    } else {
        TCP_MAX
    };
    let found = lookup(cfg, catalog, &req).await;
    fit(cfg, &req, found, max)
}

/// Encodes as many entries as fit in `max` bytes; fewer than found sets TC
/// (the client asks again over TCP for the whole answer).
fn fit(cfg: &DnsConfig, req: &Message, found: Answer, max: usize) -> Option<Vec<u8>> {
    let build = |n: usize| {
        let mut m = reply(req, found.code);
        for e in &found.entries[..n] {
            m.add_answers(e.answers.iter().cloned());
            for a in &e.additionals {
                if !m.additionals.contains(a) {
                    m.add_additional(a.clone());
                }
            }
        }
        if found.soa {
            m.add_authority(soa(cfg));
        }
        m.metadata.truncation = n < found.entries.len();
        m.to_vec().ok()
    };
    let all = found.entries.len();
    if let Some(v) = build(all).filter(|v| v.len() <= max) {
        return Some(v);
    }
    // The most entries that fit: at least none does (a header, the
    // question and an OPT are far below 512 bytes).
    let (mut lo, mut hi) = (0, all);
    while lo + 1 < hi {
        let mid = (lo + hi) / 2;
        match build(mid) {
            Some(v) if v.len() <= max => lo = mid,
            _ => hi = mid,
        }
    }
    build(lo)
}

/// FORMERR for a query that does not decode, if it has a header to answer
/// (else it is dropped: nothing to address the answer to).
fn formerr(raw: &[u8]) -> Option<Vec<u8>> {
    if raw.len() < 12 || raw[2] & 0x80 != 0 {
        return None;
    }
    let id = u16::from_be_bytes([raw[0], raw[1]]);
    let mut m = Message::response(id, OpCode::Query);
    m.metadata.response_code = ResponseCode::FormErr;
    m.to_vec().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dns::LookupError;
    use crate::structs::{HealthCheck, NodeService};
    use hickory_proto::op::Query;

    struct Fake {
        instances: Vec<Instance>,
        nodes: Vec<Arc<Node>>,
    }

    impl Catalog for Fake {
        fn datacenter(&self) -> String {
            "dc1".into()
        }
        async fn instances(
            &self, service: &str, _connect: bool,
        ) -> Result<Vec<Instance>, LookupError> {
            Ok(self
                .instances
                .iter()
                .filter(|i| i.service.service == service)
                .cloned()
                .collect())
        }
        async fn node(&self, name: &str) -> Result<Option<Arc<Node>>, LookupError> {
            Ok(self.nodes.iter().find(|n| n.node == name).cloned())
        }
        async fn authorizer(&self) -> Result<Arc<Authorizer>, LookupError> {
            Ok(Arc::new(Authorizer::allow_all()))
        }
    }

    /// A `Fake` read with a token's rights.
    struct Guarded(Fake, Arc<Authorizer>);

    impl Catalog for Guarded {
        fn datacenter(&self) -> String {
            self.0.datacenter()
        }
        async fn instances(
            &self, service: &str, connect: bool,
        ) -> Result<Vec<Instance>, LookupError> {
            self.0.instances(service, connect).await
        }
        async fn node(&self, name: &str) -> Result<Option<Arc<Node>>, LookupError> {
            self.0.node(name).await
        }
        async fn authorizer(&self) -> Result<Arc<Authorizer>, LookupError> {
            Ok(self.1.clone())
        }
    }

    fn node(name: &str, addr: &str) -> Arc<Node> {
        Arc::new(Node {
            node: name.into(),
            address: addr.into(),
            ..Default::default()
        })
    }

    fn inst(
        node_name: &str, addr: &str, svc: &str, svc_addr: &str, port: i64, status: &str,
    ) -> Instance {
        let service: NodeService = serde_json::from_value(serde_json::json!({
            "ID": format!("{svc}-{node_name}-{port}"), "Service": svc, "Address": svc_addr,
            "Port": port, "Tags": ["primary"],
        }))
        .unwrap();
        let check = HealthCheck {
            node: node_name.into(),
            check_id: "c".into(),
            status: status.parse().unwrap(),
            ..Default::default()
        };
        Instance {
            node: node(node_name, addr),
            service: Arc::new(service),
            checks: vec![Arc::new(check)],
        }
    }

    /// The SRV name of the `web` service.
    const WEB_SRV: &str = "_web._tcp.service.consul.";

    fn ask<C: Catalog>(
        cfg: &DnsConfig, fake: &C, name: &str, qt: RecordType, udp: bool,
    ) -> Message {
        let mut q = Message::query();
        q.add_query(Query::query(Name::from_ascii(name).unwrap(), qt));
        let raw = q.to_vec().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let out = rt
            .block_on(answer(cfg, fake, &raw, udp))
            .expect("an answer");
        Message::from_vec(&out).unwrap()
    }

    fn cfg() -> DnsConfig {
        DnsConfig::new("127.0.0.1:0".parse().unwrap())
    }

    #[test]
    fn names_parse_as_consul_reads_them() {
        let d = crate::dns::parse_domain("consul").unwrap();
        let p = |s: &str| parse(&Name::from_ascii(s).unwrap(), &d, "dc1");
        let svc = |n: &str, t: Option<&str>, c: bool| Lookup::Service {
            name: n.into(),
            tag: t.map(Into::into),
            connect: c,
        };
        assert_eq!(p("web.service.consul."), svc("web", None, false));
        assert_eq!(p("Web.SERVICE.dc1.Consul."), svc("Web", None, false));
        assert_eq!(p("v1.web.service.consul."), svc("web", Some("v1"), false));
        assert_eq!(p("_web._tcp.service.consul."), svc("web", None, false));
        assert_eq!(
            p("_web._v1.service.dc1.consul."),
            svc("web", Some("v1"), false)
        );
        assert_eq!(p("web.connect.consul."), svc("web", None, true));
        assert_eq!(p("n1.node.consul."), Lookup::Node("n1".into()));
        assert_eq!(
            p("7f000001.addr.dc1.consul."),
            Lookup::Addr("127.0.0.1".parse().unwrap())
        );
        assert_eq!(
            p("web.service.DC2.consul."),
            Lookup::Elsewhere("dc2".into(), Box::new(svc("web", None, false)))
        );
        assert_eq!(
            p("v1.web.service.dc2.consul."),
            Lookup::Elsewhere("dc2".into(), Box::new(svc("web", Some("v1"), false)))
        );
        assert_eq!(
            p("n1.node.dc2.consul."),
            Lookup::Elsewhere("dc2".into(), Box::new(Lookup::Node("n1".into())))
        );
        assert_eq!(p("geo-db.query.consul."), Lookup::Query("geo-db".into()));
        assert_eq!(p("q.QUERY.dc1.consul."), Lookup::Query("q".into()));
        assert_eq!(
            p("q.query.dc2.consul."),
            Lookup::Elsewhere("dc2".into(), Box::new(Lookup::Query("q".into())))
        );
        assert_eq!(p("a.b.query.consul."), Lookup::Missing);
        assert_eq!(p("web.virtual.consul."), Lookup::Virtual("web".into()));
        // The label after `virtual` names a peer, even this datacenter's
        // name (as Consul reads it).
        assert_eq!(p("web.virtual.dc2.consul."), Lookup::VirtualOfPeer);
        assert_eq!(p("web.virtual.dc1.consul."), Lookup::VirtualOfPeer);
        assert_eq!(p("web.ingress.consul."), Lookup::Missing);
        assert_eq!(p("a.b.c.service.consul."), Lookup::Missing);
        assert_eq!(p("nothing.consul."), Lookup::Missing);
        assert_eq!(p("consul."), Lookup::Apex);
        assert_eq!(p("example.com."), Lookup::Outside);
        assert_eq!(p("consul.example.com."), Lookup::Outside);
    }

    #[test]
    fn srv_targets_resolve_in_the_additional_section() {
        let fake = Fake {
            instances: vec![
                inst("n1", "10.0.0.1", "web", "", 80, "passing"),
                inst("n2", "10.0.0.2", "web", "10.1.0.2", 81, "warning"),
                inst("n3", "10.0.0.3", "web", "", 82, "critical"),
            ],
            nodes: vec![],
        };
        let m = ask(&cfg(), &fake, WEB_SRV, RecordType::SRV, true);
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        let mut targets: Vec<(String, u16)> = m
            .answers
            .iter()
            .map(|r| match &r.data {
                RData::SRV(s) => (s.target.to_string(), s.port),
                other => panic!("{other:?}"),
            })
            .collect();
        targets.sort();
        assert_eq!(
            targets,
            [
                ("0a010002.addr.dc1.consul.".to_string(), 81),
                ("n1.node.dc1.consul.".to_string(), 80)
            ]
        );
        let mut extra: Vec<String> = m
            .additionals
            .iter()
            .map(|r| format!("{} {}", r.name, &r.data))
            .collect();
        extra.sort();
        assert_eq!(
            extra,
            [
                "0a010002.addr.dc1.consul. 10.1.0.2",
                "n1.node.dc1.consul. 10.0.0.1"
            ]
        );
        let mut only = cfg();
        only.only_passing = true;
        let m = ask(&only, &fake, "web.service.consul.", RecordType::A, true);
        assert_eq!(m.answers.len(), 1);
        assert_eq!(m.answers[0].data.to_string(), "10.0.0.1");
    }

    #[test]
    fn many_instances_are_cut_over_udp_and_whole_over_tcp() {
        let fake = Fake {
            instances: (0..100)
                .map(|i| {
                    inst(
                        &format!("node-{i}"),
                        &format!("10.0.{}.{}", i / 250, i % 250),
                        "web",
                        "",
                        80,
                        "passing",
                    )
                })
                .collect(),
            nodes: vec![],
        };
        let m = ask(&cfg(), &fake, "web.service.consul.", RecordType::A, true);
        assert!(m.metadata.truncation);
        assert!(!m.answers.is_empty() && m.answers.len() < 100);
        assert!(m.to_vec().unwrap().len() <= 512);
        let m = ask(&cfg(), &fake, WEB_SRV, RecordType::SRV, true);
        assert!(m.metadata.truncation);
        // Each SRV kept keeps its target's address.
        assert_eq!(m.answers.len(), m.additionals.len());
        let m = ask(&cfg(), &fake, "web.service.consul.", RecordType::A, false);
        assert!(!m.metadata.truncation);
        assert_eq!(m.answers.len(), 100);
    }

    #[test]
    fn what_the_token_may_not_read_is_not_found() {
        let rules = crate::acl::parse_rules(
            "service \"web\" { policy = \"read\" }\nnode \"n1\" { policy = \"read\" }",
        )
        .unwrap();
        let authz = Authorizer::new("t", &[&rules], crate::acl::DefaultPolicy::Deny);
        let fake = Guarded(
            Fake {
                instances: vec![
                    inst("n1", "10.0.0.1", "web", "", 80, "passing"),
                    inst("n2", "10.0.0.2", "web", "", 80, "passing"),
                    inst("n1", "10.0.0.1", "db", "", 81, "passing"),
                ],
                nodes: vec![node("n1", "10.0.0.1"), node("n2", "10.0.0.2")],
            },
            Arc::new(authz),
        );
        // web: only the instance on the node it may read.
        let m = ask(&cfg(), &fake, "web.service.consul.", RecordType::A, true);
        let got: Vec<String> = m.answers.iter().map(|r| r.data.to_string()).collect();
        assert_eq!(got, ["10.0.0.1"]);
        // db and n2 exist, but answer exactly as names that do not.
        for name in ["db.service.consul.", "n2.node.consul.", "nope.node.consul."] {
            let m = ask(&cfg(), &fake, name, RecordType::A, true);
            assert_eq!(m.metadata.response_code, ResponseCode::NXDomain, "{name}");
            assert_eq!(m.authorities.len(), 1, "{name}");
        }
        let m = ask(&cfg(), &fake, "n1.node.consul.", RecordType::A, true);
        assert_eq!(m.answers[0].data.to_string(), "10.0.0.1");
    }

    #[test]
    fn unknown_names_get_nxdomain_with_the_soa_and_outside_names_refused() {
        let fake = Fake {
            instances: vec![inst("n1", "10.0.0.1", "web", "", 80, "critical")],
            nodes: vec![node("n1", "10.0.0.1")],
        };
        for name in [
            "nope.service.consul.",
            "web.service.consul.",
            "x.node.consul.",
            "web.ingress.consul.",
        ] {
            let m = ask(&cfg(), &fake, name, RecordType::A, true);
            assert_eq!(m.metadata.response_code, ResponseCode::NXDomain, "{name}");
            assert_eq!(m.authorities.len(), 1, "{name}");
            assert_eq!(m.authorities[0].record_type(), RecordType::SOA);
        }
        let m = ask(&cfg(), &fake, "n1.node.consul.", RecordType::A, true);
        assert_eq!(m.answers[0].data.to_string(), "10.0.0.1");
        assert!(m.metadata.authoritative && !m.metadata.recursion_available);
        let m = ask(&cfg(), &fake, "n1.node.consul.", RecordType::AAAA, true);
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert!(m.answers.is_empty() && m.authorities.len() == 1);
        let m = ask(&cfg(), &fake, "example.com.", RecordType::A, true);
        assert_eq!(m.metadata.response_code, ResponseCode::Refused);
    }

    /// A catalog with virtual IPs, read with a token's rights.
    struct Vips(Vec<(&'static str, Ipv4Addr)>, Arc<Authorizer>);

    impl Catalog for Vips {
        fn datacenter(&self) -> String {
            "dc1".into()
        }
        async fn instances(&self, _: &str, _: bool) -> Result<Vec<Instance>, LookupError> {
            Ok(Vec::new())
        }
        async fn node(&self, _: &str) -> Result<Option<Arc<Node>>, LookupError> {
            Ok(None)
        }
        async fn authorizer(&self) -> Result<Arc<Authorizer>, LookupError> {
            Ok(self.1.clone())
        }
        async fn virtual_ip(&self, service: &str) -> Result<Option<Ipv4Addr>, LookupError> {
            Ok(self
                .0
                .iter()
                .find(|(s, _)| *s == service)
                .map(|(_, ip)| *ip))
        }
    }

    /// `<service>.virtual.consul` is the service's virtual IP (an A record
    /// with the node TTL, the name tried in lower case too); no IP, a
    /// peer's name, another type or a service the token may not read is
    /// an empty NOERROR, as Consul answers.
    #[test]
    fn virtual_names_answer_the_services_virtual_ip() {
        let vips = vec![
            ("billing", Ipv4Addr::new(240, 0, 0, 1)),
            ("secret", Ipv4Addr::new(240, 0, 0, 2)),
        ];
        let rules = crate::acl::parse_rules("service \"billing\" { policy = \"read\" }").unwrap();
        let authz = Authorizer::new("t", &[&rules], crate::acl::DefaultPolicy::Deny);
        let catalog = Vips(vips, Arc::new(authz));
        let mut c = cfg();
        c.node_ttl = 7;
        for name in ["billing.virtual.consul.", "Billing.virtual.consul."] {
            let m = ask(&c, &catalog, name, RecordType::A, true);
            assert_eq!(m.metadata.response_code, ResponseCode::NoError, "{name}");
            let got: Vec<_> = m
                .answers
                .iter()
                .map(|r| (r.data.to_string(), r.ttl))
                .collect();
            assert_eq!(got, [("240.0.0.1".to_string(), 7)], "{name}");
        }
        for (name, qtype) in [
            ("nope.virtual.consul.", RecordType::A),
            ("secret.virtual.consul.", RecordType::A),
            ("billing.virtual.dc1.consul.", RecordType::A),
            ("billing.virtual.peer1.consul.", RecordType::A),
            ("billing.virtual.consul.", RecordType::AAAA),
        ] {
            let m = ask(&c, &catalog, name, qtype, true);
            assert_eq!(m.metadata.response_code, ResponseCode::NoError, "{name}");
            assert!(m.answers.is_empty(), "{name}: {:?}", m.answers);
            assert_eq!(m.authorities.len(), 1, "{name}");
        }
        // The anonymous token under default deny is told no IP at all.
        let anonymous = Authorizer::new("anonymous", &[], crate::acl::DefaultPolicy::Deny);
        let catalog = Vips(catalog.0, Arc::new(anonymous));
        for name in ["billing.virtual.consul.", "secret.virtual.consul."] {
            let m = ask(&c, &catalog, name, RecordType::A, true);
            assert_eq!(m.metadata.response_code, ResponseCode::NoError, "{name}");
            assert!(m.answers.is_empty(), "{name}: {:?}", m.answers);
        }
    }

    #[test]
    fn garbage_is_dropped_or_formerr_never_a_panic() {
        let fake = Fake {
            instances: vec![],
            nodes: vec![],
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let c = cfg();
        assert!(rt.block_on(answer(&c, &fake, b"", true)).is_none());
        assert!(rt.block_on(answer(&c, &fake, &[0xff; 5], true)).is_none());
        let mut junk = vec![0x12, 0x34, 0x01, 0x00, 0x00, 0x05, 0, 0, 0, 0, 0, 0];
        junk.extend_from_slice(&[0x3f; 40]);
        let out = rt
            .block_on(answer(&c, &fake, &junk, true))
            .expect("FORMERR");
        let m = Message::from_vec(&out).unwrap();
        assert_eq!(m.metadata.id, 0x1234);
        assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
        // Random bytes of every length: answered or dropped, never a panic.
        let mut x: u32 = 7;
        for len in 0..600 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                    (x >> 16) as u8
                })
                .collect();
            let _ = rt.block_on(answer(&c, &fake, &bytes, true));
        }
    }
}
