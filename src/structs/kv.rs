//! The KV store's entry and transaction types.

use base64::Engine;
use serde::{Deserialize, Serialize, Serializer};

/// One KV entry, as stored and as `GET /v1/kv/:key` shows it.
///
/// Entries travel through bincode in snapshots, so serialization writes
/// every field there and only skips the empty `Session` in JSON.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct KvEntry {
    pub lock_index: u64,
    pub key: String,
    pub flags: u64,
    #[serde(deserialize_with = "value_from_b64")]
    pub value: Vec<u8>,
    #[serde(default)]
    pub session: String,
    pub create_index: u64,
    pub modify_index: u64,
}

impl Serialize for KvEntry {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        struct Value<'a>(&'a [u8]);
        impl Serialize for Value<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                value_b64(self.0, s)
            }
        }
        let json = s.is_human_readable();
        let mut st = s.serialize_struct("KvEntry", 7)?;
        st.serialize_field("LockIndex", &self.lock_index)?;
        st.serialize_field("Key", &self.key)?;
        st.serialize_field("Flags", &self.flags)?;
        st.serialize_field("Value", &Value(&self.value))?;
        if !json || !self.session.is_empty() {
            st.serialize_field("Session", &self.session)?;
        }
        st.serialize_field("CreateIndex", &self.create_index)?;
        st.serialize_field("ModifyIndex", &self.modify_index)?;
        st.end()
    }
}

fn value_b64<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
    if !s.is_human_readable() {
        return s.serialize_bytes(v);
    }
    if v.is_empty() {
        s.serialize_none()
    } else {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }
}

fn value_from_b64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    if !d.is_human_readable() {
        return super::serde_util::raw_bytes::deserialize(d);
    }
    let s: Option<String> = Option::deserialize(d)?;
    match s {
        None => Ok(Vec::new()),
        Some(s) => base64::engine::general_purpose::STANDARD
            .decode(s.as_bytes())
            .map_err(serde::de::Error::custom),
    }
}

/// The verbs of a KV write, as Consul's `api.KVOp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvVerb {
    Set,
    Cas,
    Delete,
    DeleteCas,
    DeleteTree,
    Get,
    GetTree,
    CheckIndex,
    CheckNotExists,
    /// `?acquire=` / txn `lock`.
    Lock,
    /// `?release=` / txn `unlock`.
    Unlock,
    CheckSession,
}

impl KvVerb {
    /// Consul's wire names in `PUT /v1/txn`.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "set" => Self::Set,
            "cas" => Self::Cas,
            "delete" => Self::Delete,
            "delete-cas" => Self::DeleteCas,
            "delete-tree" => Self::DeleteTree,
            "get" => Self::Get,
            "get-tree" => Self::GetTree,
            "check-index" => Self::CheckIndex,
            "check-not-exists" => Self::CheckNotExists,
            "lock" => Self::Lock,
            "unlock" => Self::Unlock,
            "check-session" => Self::CheckSession,
            _ => return None,
        })
    }

    pub fn is_read(self) -> bool {
        matches!(
            self,
            Self::Get
                | Self::GetTree
                | Self::CheckIndex
                | Self::CheckNotExists
                | Self::CheckSession
        )
    }
}

/// One KV operation: a whole `PUT/DELETE /v1/kv` or one element of a txn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvOp {
    pub verb: KvVerb,
    pub key: String,
    /// As bytes, not a sequence of u8: the same bincode, written and read
    /// in one copy instead of one call per byte (a 500 KiB value took tens
    /// of milliseconds per pass in a debug build).
    #[serde(serialize_with = "value_b64", deserialize_with = "value_from_b64")]
    pub value: Vec<u8>,
    pub flags: u64,
    /// The index compared by cas / delete-cas / check-index (and, when not
    /// 0, by lock / unlock: `?cas` with `?acquire` or `?release`).
    pub index: u64,
    /// The session of lock / unlock / check-session; empty otherwise.
    pub session: String,
}

impl KvOp {
    /// A plain set of `key` to `value`: no flags, no CAS index, no session.
    pub fn set(key: impl Into<String>, value: impl Into<Vec<u8>>) -> KvOp {
        KvOp {
            verb: KvVerb::Set,
            key: key.into(),
            value: value.into(),
            flags: 0,
            index: 0,
            session: String::new(),
        }
    }
}

/// What a KV operation returns from the state machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvOutcome {
    /// A write whose precondition held (or had none): `true` in the HTTP body.
    Done(bool),
    /// Entries read or written inside a transaction.
    Entries(Vec<KvEntry>),
}

/// An error of one transaction operation, as `PUT /v1/txn` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct TxnError {
    pub op_index: usize,
    pub what: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(value: &[u8], session: &str) -> KvEntry {
        KvEntry {
            lock_index: 0,
            key: "a/b".into(),
            flags: 42,
            value: value.to_vec(),
            session: session.into(),
            create_index: 3,
            modify_index: 9,
        }
    }

    #[test]
    fn json_is_consul_shaped() {
        let v = serde_json::to_value(entry(b"hello", "")).unwrap();
        assert_eq!(v["Value"], "aGVsbG8=");
        assert!(v.get("Session").is_none());
        assert_eq!(
            serde_json::to_value(entry(b"", "")).unwrap()["Value"],
            serde_json::Value::Null
        );
    }

    #[test]
    fn bincode_round_trips_with_and_without_session() {
        for e in [entry(b"x", ""), entry(&[0, 255, 7], "s1")] {
            let bytes = bincode::serialize(&e).unwrap();
            assert_eq!(bincode::deserialize::<KvEntry>(&bytes).unwrap(), e);
        }
    }
}
