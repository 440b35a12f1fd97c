//! Serde helpers shared by the domain types.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `#[serde(with = "as_json")]`: carry a value as a JSON string.
///
/// Raft entries and snapshots are bincode, which cannot hold free-form JSON
/// (`serde_json::Value`) nor structs that skip empty fields the way Consul's
/// JSON does. Wrapping such payloads in a JSON string keeps bincode exact
/// while the types stay Consul-shaped.
pub mod as_json {
    use super::*;

    pub fn serialize<T: Serialize, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        let text = serde_json::to_string(v).map_err(serde::ser::Error::custom)?;
        s.serialize_str(&text)
    }

    pub fn deserialize<'de, T: DeserializeOwned, D: Deserializer<'de>>(
        d: D,
    ) -> Result<T, D::Error> {
        let text = String::deserialize(d)?;
        serde_json::from_str(&text).map_err(serde::de::Error::custom)
    }
}

/// Treat JSON `null` as the type's default (Go's nil slices and maps).
pub fn null_default<'de, T: Default + Deserialize<'de>, D: Deserializer<'de>>(
    d: D,
) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

pub fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}
