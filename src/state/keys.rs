//! Watch keys: the unit of waking for blocking queries and of indexes
//! (`kv/<key>`, `service/<name>`, `config/<kind>/<name>`, ...).
//!
//! One type, built only here, so that a reader and the writer that must wake
//! it cannot spell a key differently. It is a string underneath (persisted
//! rows, snapshots and prefix ranges rely on its text and ordering).

use std::borrow::{Borrow, Cow};
use std::fmt;
use std::ops::Deref;

use serde::{Deserialize, Serialize};

#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WatchKey(Cow<'static, str>);

impl WatchKey {
    const fn fixed(s: &'static str) -> WatchKey {
        WatchKey(Cow::Borrowed(s))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A key read back from storage (persisted index rows, snapshots).
    pub fn stored(s: impl Into<String>) -> WatchKey {
        WatchKey(Cow::Owned(s.into()))
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
pub const CLUSTER: WatchKey = WatchKey::fixed("cluster");
pub const SESSIONS: WatchKey = WatchKey::fixed("sessions");
/// The Connect CA: its configuration and roots.
pub const CONNECT_CA: WatchKey = WatchKey::fixed("connect-ca");
/// The floor a snapshot restore leaves (`state::restore`): it counts for
/// every key without a row; nobody watches it.
pub const RESTORED: WatchKey = WatchKey::fixed("restored");

impl Deref for WatchKey {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

/// Maps keyed by `WatchKey` can be searched with a `&str` (the derived
/// `Ord`/`Hash` are the string's, as `Borrow` requires).
impl Borrow<str> for WatchKey {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for WatchKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for WatchKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<&str> for WatchKey {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
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
