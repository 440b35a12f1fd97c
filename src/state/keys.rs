//! Watch keys: the unit of waking for blocking queries and of indexes
//! (`kv/<key>`, `service/<name>`, `config/<kind>/<name>`, ...).
//!
//! One type, built only here, so that a reader and the writer that must wake
//! it cannot spell a key differently. It is a string underneath (persisted
//! rows, snapshots and prefix ranges rely on its text and ordering).

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A watch key's text. Cloned whenever a map of the state that holds it is
/// written (persistent maps copy the node they change, keys included), so a
/// stored key is shared, not copied: a clone is a reference count.
#[derive(Clone)]
pub struct WatchKey(Repr);

#[derive(Clone)]
enum Repr {
    Fixed(&'static str),
    Stored(Arc<str>),
}

impl WatchKey {
    const fn fixed(s: &'static str) -> WatchKey {
        WatchKey(Repr::Fixed(s))
    }

    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Fixed(s) => s,
            Repr::Stored(s) => s,
        }
    }

    pub fn stored(s: impl Into<String>) -> WatchKey {
        WatchKey(Repr::Stored(Arc::from(s.into())))
    }
}

impl PartialEq for WatchKey {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for WatchKey {}

impl PartialOrd for WatchKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for WatchKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl std::hash::Hash for WatchKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}

/// Encoded as its text alone (as the `String` it once was: snapshots and
/// the rows keep their format).
impl Serialize for WatchKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for WatchKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(WatchKey::stored)
    }
}

pub fn kv(key: &str) -> WatchKey {
    WatchKey::stored(format!("kv/{key}"))
}
pub fn node(name: &str) -> WatchKey {
    WatchKey::stored(format!("node/{name}"))
}
pub fn service(name: &str) -> WatchKey {
    WatchKey::stored(format!("service/{name}"))
}
pub fn connect(name: &str) -> WatchKey {
    WatchKey::stored(format!("connect/{name}"))
}
/// Not a key of this state: what proxycfg watches of another datacenter's
/// connect-capable instances of `service` (with a subset `filter`), so
/// that an update from there marks the proxies that read it. No write here
/// ever touches it.
pub fn remote_connect(dc: &str, service: &str, filter: &str) -> WatchKey {
    WatchKey::stored(format!("{REMOTE_PREFIX}{dc}/connect/{service}?{filter}"))
}
/// Not a key of this state either: another datacenter's mesh gateways, as
/// proxycfg follows them there.
pub fn remote_mesh_gateways(dc: &str) -> WatchKey {
    WatchKey::stored(format!("{REMOTE_PREFIX}{dc}/mesh-gateways"))
}
/// Not a key of this state: the other datacenters the federation knows
/// (a mesh gateway routes to each).
pub const REMOTE_DATACENTERS: WatchKey = WatchKey::fixed("remote/datacenters");
/// The prefix of every key of another datacenter's (`remote_*`).
pub const REMOTE_PREFIX: &str = "remote/";
/// A service's virtual IPs (`state::virtual_ip`).
pub fn virtual_ip(service: &str) -> WatchKey {
    WatchKey::stored(format!("vip/{service}"))
}
pub fn config(kind: &str, name: &str) -> WatchKey {
    WatchKey::stored(format!("config/{kind}/{name}"))
}
pub fn config_kind(kind: &str) -> WatchKey {
    WatchKey::stored(format!("config/{kind}"))
}
pub fn session(id: &str) -> WatchKey {
    WatchKey::stored(format!("session/{id}"))
}
pub fn node_sessions(node: &str) -> WatchKey {
    WatchKey::stored(format!("session-node/{node}"))
}
/// Where a family's tombstone floor is kept among the indexes
/// (`reaped/kv`, ...); nobody watches it.
pub fn floor(family: &str) -> WatchKey {
    WatchKey::stored(format!("reaped/{family}"))
}
pub const NODES: WatchKey = WatchKey::fixed("nodes");
pub const SERVICES: WatchKey = WatchKey::fixed("services");
pub const CHECKS: WatchKey = WatchKey::fixed("checks");
/// Any mesh gateway instance, its node or its health: what a datacenter's
/// gateway list (`/v1/internal/mesh-gateways`, proxycfg's mode `local`)
/// reads, so that the catalog's other changes wake none of them.
pub const MESH_GATEWAYS: WatchKey = WatchKey::fixed("mesh-gateways");
pub const CLUSTER: WatchKey = WatchKey::fixed("cluster");
pub const SESSIONS: WatchKey = WatchKey::fixed("sessions");
/// Any ACL token, policy or role: its index is the generation token
/// resolution caches are checked against.
pub const ACL: WatchKey = WatchKey::fixed("acl");
/// The Connect CA: its configuration and roots.
/// Any user event fired (`state::events`).
pub const EVENTS: WatchKey = WatchKey::fixed("events");
pub const CONNECT_CA: WatchKey = WatchKey::fixed("connect-ca");
pub const AUTOPILOT: WatchKey = WatchKey::fixed("autopilot");
/// Any node's network coordinate (`state::coordinate`).
pub const COORDINATES: WatchKey = WatchKey::fixed("coordinates");
/// WAN federation states (every datacenter's).
pub const FEDERATION: WatchKey = WatchKey::fixed("federation");
/// Any prepared query (`state::query`).
pub const QUERIES: WatchKey = WatchKey::fixed("queries");
/// The floor a snapshot restore leaves (`state::restore`): it counts for
/// every key without a row; nobody watches it.
pub const RESTORED: WatchKey = WatchKey::fixed("restored");

impl Deref for WatchKey {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

/// Maps keyed by `WatchKey` can be searched with a `&str` (the derived
/// `Ord`/`Hash` are the string's, as `Borrow` requires).
impl Borrow<str> for WatchKey {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Debug for WatchKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for WatchKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for WatchKey {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_their_text_and_order() {
        assert_eq!(kv("a/b"), "kv/a/b");
        assert_eq!(
            config("service-defaults", "web"),
            "config/service-defaults/web"
        );
        assert_eq!(
            NODES,
            WatchKey::stored("nodes"),
            "fixed and built compare alike"
        );
        assert!(kv("a") < kv("b"));
        let bytes = bincode::serialize(&service("web")).unwrap();
        assert_eq!(bytes, bincode::serialize("service/web").unwrap());
    }
}
