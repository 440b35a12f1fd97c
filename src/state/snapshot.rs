//! A whole version of the state as bytes, for Raft snapshots and for
//! `GET /v1/snapshot` (`export`: the same without a staged restore).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::acl::AclRow;
use super::session::LockDelay;
use super::{State, WatchKey};
use crate::structs::serde_util::{as_json, raw_bytes};
use crate::structs::{HealthCheck, KvEntry, Node, NodeService, Session};

/// The encoding: bincode of this, with `Kv` and `Ix` vectors when decoded
/// and borrowed views of the state's maps when encoded (the same bytes: a
/// sequence is its length and its elements), so that the largest tables are
/// written straight from the state, not copied first.
#[derive(Serialize, Deserialize)]
struct Body<Kv, Ix> {
    index: u64,
    cluster_id: String,
    kv: Kv,
    #[serde(with = "as_json")]
    nodes: Vec<Node>,
    #[serde(with = "as_json")]
    services: Vec<(String, NodeService)>,
    #[serde(with = "as_json")]
    checks: Vec<HealthCheck>,
    #[serde(with = "as_json")]
    config: Vec<serde_json::Value>,
    indexes: Ix,
    #[serde(with = "as_json")]
    sessions: Vec<Session>,
    lock_delays: Vec<(String, LockDelay)>,
    /// A restore being staged: its id and chunks.
    staged: Option<(String, Vec<Chunk>)>,
    /// ACL tokens (secret hashes, never secrets), policies, roles.
    #[serde(with = "as_json")]
    acl: Vec<AclRow>,
    #[serde(with = "as_json")]
    connect_ca: Option<super::connect::CaState>,
}

type Decoded = Body<Vec<KvEntry>, Vec<(WatchKey, u64)>>;

#[derive(Serialize, Deserialize)]
struct Chunk(#[serde(with = "raw_bytes")] Vec<u8>);

/// Serializes as a sequence of the map's entries, as `Vec<T>` does.
struct Entries<'a, K, V, T>(&'a imbl::OrdMap<K, V>, fn((&'a K, &'a V)) -> T);

impl<'a, K: Ord + Clone, V: Clone, T: Serialize> Serialize for Entries<'a, K, V, T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for kv in self.0.iter() {
            seq.serialize_element(&(self.1)(kv))?;
        }
        seq.end()
    }
}

/// How many rows each table of an encoded state holds, and its index (for
/// `cairn snapshot inspect`).
pub fn counts(bytes: &[u8]) -> anyhow::Result<(u64, Vec<(&'static str, usize)>)> {
    use bincode::Options;
    let b: Decoded = bounded(bytes.len() as u64).deserialize(bytes)?;
    Ok((
        b.index,
        vec![
            ("KV", b.kv.len()),
            ("Nodes", b.nodes.len()),
            ("Services", b.services.len()),
            ("Checks", b.checks.len()),
            ("ConfigEntries", b.config.len()),
            ("Sessions", b.sessions.len()),
            ("LockDelays", b.lock_delays.len()),
            ("ACL", b.acl.len()),
            ("Indexes", b.indexes.len()),
        ],
    ))
}

/// Each row of an encoded state as (Consul's snapshot record type, the
/// row's JSON), table by table (for `cairn snapshot decode`); its index.
pub fn decode_rows(
    bytes: &[u8], each: &mut dyn FnMut(&str, serde_json::Value),
) -> anyhow::Result<u64> {
    use bincode::Options;
    use serde_json::{json, to_value};
    let b: Decoded = bounded(bytes.len() as u64).deserialize(bytes)?;
    for n in &b.nodes {
        each("Register", to_value(n)?);
    }
    for (node, s) in &b.services {
        each("Register", json!({"Node": node, "Service": s}));
    }
    for c in &b.checks {
        each("Register", json!({"Node": c.node, "Check": c}));
    }
    for kv in &b.kv {
        each("KVS", to_value(kv)?);
    }
    for s in &b.sessions {
        each("Session", to_value(s)?);
    }
    for (key, d) in &b.lock_delays {
        each(
            "LockDelay",
            json!({"Key": key, "StartMs": d.start_ms, "DelayMs": d.delay_ms}),
        );
    }
    for e in &b.config {
        each("ConfigEntry", e.clone());
    }
    for row in &b.acl {
        let (kind, v) = match row {
            AclRow::Token(t) => ("ACLToken", to_value(&**t)?),
            AclRow::Policy(p) => ("ACLPolicy", to_value(&**p)?),
            AclRow::Role(r) => ("ACLRole", to_value(&**r)?),
            AclRow::AuthMethod(m) => ("ACLAuthMethod", to_value(&**m)?),
            AclRow::BindingRule(r) => ("ACLBindingRule", to_value(&**r)?),
            AclRow::Bootstrapped(i) => ("ACLBootstrap", json!({"ModifyIndex": i})),
        };
        each(kind, v);
    }
    if let Some(ca) = &b.connect_ca {
        each("ConnectCA", to_value(ca)?);
    }
    for (key, index) in &b.indexes {
        each("Index", json!({"Key": key.to_string(), "Value": index}));
    }
    Ok(b.index)
}

/// A reader that counts the bytes taken from it.
struct CountingRead<R> {
    inner: R,
    read: u64,
}

impl<R: std::io::Read> std::io::Read for CountingRead<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

/// The state as a user's snapshot holds it: without a staged restore.
pub fn export(st: &State) -> anyhow::Result<Vec<u8>> {
    if st.restore.is_none() {
        return encode(st);
    }
    let mut st = st.clone();
    st.restore = None;
    encode(&st)
}

pub fn encode(st: &State) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    encode_into(st, &mut out)?;
    Ok(out)
}

/// Writes the encoding of `st` to `w` as it goes (buffer `w`).
pub fn encode_into(st: &State, w: impl std::io::Write) -> anyhow::Result<()> {
    let body = Body {
        index: st.index,
        cluster_id: st.cluster_id.clone(),
        kv: Entries(&st.kv, |(_, e)| &**e),
        nodes: st.nodes.values().map(|n| (**n).clone()).collect(),
        services: st
            .services
            .iter()
            .map(|((n, _), s)| (n.clone(), (**s).clone()))
            .collect(),
        checks: st.checks.values().map(|c| (**c).clone()).collect(),
        config: st
            .config
            .values()
            .map(|e| super::config::to_stored(e))
            .collect(),
        indexes: Entries(&st.indexes, |(k, v)| (k, *v)),
        sessions: st.sessions.values().map(|s| (**s).clone()).collect(),
        lock_delays: st
            .lock_delays
            .iter()
            .map(|(k, d)| (k.clone(), *d))
            .collect(),
        staged: st.restore.as_ref().map(|r| {
            let chunks = r.chunks.iter().map(|c| Chunk((**c).clone())).collect();
            (r.id.clone(), chunks)
        }),
        acl: super::acl::rows(st).into_iter().map(|(_, r)| r).collect(),
        connect_ca: st.connect_ca.as_ref().map(|c| (**c).clone()),
    };
    let mut w = w;
    bincode::serialize_into(&mut w, &body)?;
    let extra = Extra {
        autopilot: st.autopilot.as_deref().cloned(),
        coordinates: st.coordinates.values().map(|c| (**c).clone()).collect(),
        federation: st.federation.values().map(|f| (**f).clone()).collect(),
        queries: st.queries.values().map(|q| (**q).clone()).collect(),
        virtual_ips: st.virtual_ips.values().map(|v| (**v).clone()).collect(),
    };
    Ok(bincode::serialize_into(w, &serde_json::to_vec(&extra)?)?)
}

/// What follows the body: JSON, so that later additions need no new
/// format (a reader ignores keys it does not know, and a snapshot from
/// before the trailer decodes with none of them).
#[derive(Serialize, Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct Extra {
    autopilot: Option<crate::structs::operator::AutopilotConfig>,
    /// Network coordinates (`state::coordinate`); none: no key, so a
    /// state without them encodes as before.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    coordinates: Vec<crate::coordinate::Update>,
    /// WAN federation states (none before federation; left out when none,
    /// so a snapshot without them is byte for byte what it was before).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    federation: Vec<crate::structs::federation::FederationState>,
    /// Prepared queries (`state::query`), left out when none, as above.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    queries: Vec<crate::structs::query::PreparedQuery>,
    /// Services' virtual IPs (`state::virtual_ip`), left out when none.
    #[serde(rename = "VirtualIPs", skip_serializing_if = "Vec::is_empty")]
    virtual_ips: Vec<super::virtual_ip::ServiceVirtualIp>,
}

/// bincode as `bincode::serialize` writes it, reading at most `limit`
/// bytes: a length read from the data (a string's, a vector's) is never
/// allocated beyond what the data itself holds.
fn bounded(limit: u64) -> impl bincode::Options {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .allow_trailing_bytes()
        .with_limit(limit)
}

/// The trailer after the body. None at all is a snapshot from before the
/// trailer (the body ends the data); anything else must be one whole
/// trailer and nothing more: a snapshot cut short inside it is refused,
/// never restored without the tables it carries.
fn read_extra(mut r: impl std::io::Read, limit: u64) -> anyhow::Result<Extra> {
    use bincode::Options;
    use std::io::Read;
    let mut rest = Vec::new();
    (&mut r).take(limit).read_to_end(&mut rest)?;
    if rest.is_empty() {
        return Ok(Extra::default());
    }
    let json: Vec<u8> = bounded(rest.len() as u64)
        .deserialize(&rest)
        .map_err(|e| anyhow::anyhow!("its trailer is cut short or damaged: {e}"))?;
    let used = 8 + json.len();
    if used != rest.len() {
        anyhow::bail!("{} bytes after its trailer", rest.len() - used);
    }
    Ok(serde_json::from_slice(&json)?)
}

pub fn decode(bytes: &[u8]) -> anyhow::Result<State> {
    decode_from(bytes, bytes.len() as u64)
}

/// Decodes a state of `len` bytes read from `r` as it goes (buffer `r`).
pub fn decode_from(r: impl std::io::Read, len: u64) -> anyhow::Result<State> {
    use bincode::Options;
    let mut r = CountingRead { inner: r, read: 0 };
    let body: Decoded = bounded(len).deserialize_from(&mut r)?;
    let extra = read_extra(&mut r.inner, len.saturating_sub(r.read))?;
    let mut st = State {
        index: body.index,
        cluster_id: body.cluster_id,
        ..Default::default()
    };
    for e in body.kv {
        st.kv.insert(Arc::from(e.key.as_str()), Arc::new(e));
    }
    for n in body.nodes {
        st.nodes.insert(n.node.clone(), Arc::new(n));
    }
    for (node, s) in body.services {
        st.services.insert((node, s.id.clone()), Arc::new(s));
    }
    for c in body.checks {
        st.checks
            .insert((c.node.clone(), c.check_id.clone()), Arc::new(c));
    }
    for json in body.config {
        let e = super::config::from_stored(&json)?;
        st.config
            .insert((e.kind(), e.name().to_string()), Arc::new(e));
    }
    st.indexes = body.indexes.into_iter().collect();
    for s in body.sessions {
        st.sessions.insert(s.id.clone(), Arc::new(s));
    }
    st.lock_delays = body.lock_delays.into_iter().collect();
    st.connect_ca = body.connect_ca.map(Arc::new);
    st.autopilot = extra.autopilot.map(Arc::new);
    st.coordinates = extra
        .coordinates
        .into_iter()
        .map(|c| (c.node.clone(), Arc::new(c)))
        .collect();
    for f in extra.federation {
        st.federation.insert(f.datacenter.clone(), Arc::new(f));
    }
    for q in extra.queries {
        st.queries.insert(q.id.clone(), Arc::new(q));
    }
    for v in extra.virtual_ips {
        st.virtual_ips.insert(v.service.clone(), Arc::new(v));
    }
    st.restore = body.staged.map(|(id, chunks)| super::Staged {
        id,
        chunks: chunks.into_iter().map(|c| Arc::new(c.0)).collect(),
    });
    for r in body.acl {
        super::acl::load(&mut st, r);
    }
    super::derived::reindex(&mut st);
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded() -> Vec<u8> {
        let st = State {
            index: 7,
            cluster_id: "c1".into(),
            ..Default::default()
        };
        encode(&st).unwrap()
    }

    /// A length read from the data is bounded by the data: a cluster id
    /// declaring 1 TiB is refused, from a slice and from a reader (on a
    /// reader bincode allocated and zero-filled it: abort).
    #[test]
    fn a_declared_length_beyond_the_data_is_refused_not_allocated() {
        let mut bytes = encoded();
        // index (u64), then the cluster id's length (u64).
        bytes[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(decode(&bytes).is_err());
        let len = bytes.len() as u64;
        assert!(decode_from(std::io::BufReader::new(&bytes[..]), len).is_err());
        assert!(counts(&bytes).is_err());
    }

    /// A snapshot cut inside its trailer, or with bytes after it, is
    /// refused; one ending with its body (from before the trailer) decodes.
    #[test]
    fn a_trailer_cut_short_is_refused() {
        let bytes = encoded();
        assert_eq!(decode(&bytes).unwrap().index, 7);
        for cut in [1, 3, 8] {
            let Err(e) = decode(&bytes[..bytes.len() - cut]) else {
                panic!("a snapshot cut {cut} bytes short decoded");
            };
            assert!(format!("{e:#}").contains("trailer"), "{e:#}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode(&longer).is_err());
        // The body alone: the trailer is its last frame (length + JSON).
        let json_len = 8 + serde_json::to_vec(&Extra::default()).unwrap().len();
        let old = &bytes[..bytes.len() - json_len];
        assert_eq!(decode(old).unwrap().cluster_id, "c1");
    }
}
