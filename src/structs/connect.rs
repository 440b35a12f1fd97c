//! Connect's domain types with Consul's JSON shapes: CA roots
//! (`structs.CARoot`, `IndexedCARoots`), the CA configuration, issued leaf
//! certificates (`structs.IssuedCert`) and intentions (`structs.Intention`
//! with its L7 permissions), as `/v1/connect/*` and the agent's leaf and
//! authorize endpoints show them.
//!
//! The CA types skip no field when empty: they also travel in Raft entries
//! and snapshots (bincode), which need every field present. A CA root's
//! private key is no field here: it lives only in the state's row.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::serde_util::null_default;

/// One CA root, as `/v1/connect/ca/roots` lists it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CaRoot {
    /// The root's signing key ID (colon-separated hex), as Consul's.
    #[serde(rename = "ID")]
    pub id: String,
    pub name: String,
    pub serial_number: u64,
    /// The SHA-256 of the public key, colon-separated hex.
    #[serde(rename = "SigningKeyID")]
    pub signing_key_id: String,
    pub external_trust_domain: String,
    /// RFC 3339, as Go's `time.Time` in JSON.
    pub not_before: String,
    pub not_after: String,
    /// PEM.
    pub root_cert: String,
    /// PEM certificates that chain leaves of this root to an older root:
    /// after a rotation the old root's cross-signature of the new one.
    #[serde(deserialize_with = "null_default")]
    pub intermediate_certs: Vec<String>,
    pub active: bool,
    /// When it stopped being the active root (RFC 3339; zero time before).
    pub rotated_out_at: String,
    /// "ec" or "rsa".
    pub private_key_type: String,
    pub private_key_bits: u32,
    pub create_index: u64,
    pub modify_index: u64,
}

/// `IndexedCARoots`: the body of `/v1/connect/ca/roots`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CaRoots {
    #[serde(rename = "ActiveRootID")]
    pub active_root_id: String,
    pub trust_domain: String,
    #[serde(deserialize_with = "null_default")]
    pub roots: Vec<CaRoot>,
}

impl CaRoots {
    pub fn active(&self) -> Option<&CaRoot> {
        self.roots.iter().find(|r| r.active)
    }
}

/// `structs.CAConfiguration`: the body of `/v1/connect/ca/configuration`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CaConfiguration {
    #[serde(rename = "ClusterID")]
    pub cluster_id: String,
    pub provider: String,
    /// Provider settings (`LeafCertTTL`, `RotationPeriod`, `PrivateKeyType`,
    /// `PrivateKeyBits`, `IntermediateCertTTL`, `PrivateKey`, `RootCert`...).
    #[serde(deserialize_with = "null_default")]
    pub config: BTreeMap<String, Value>,
    pub force_without_cross_signing: bool,
    pub create_index: u64,
    pub modify_index: u64,
}

/// The primary's answer to a secondary's intermediate CSR: the
/// certificate and the root that signed it (the secondary keeps it only if
/// that root is still the active one of the roots it holds).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct SignedIntermediate {
    /// PEM.
    pub intermediate_cert: String,
    #[serde(rename = "RootID")]
    pub root_id: String,
}

/// `structs.IssuedCert`: a leaf certificate and its key, as
/// `/v1/agent/connect/ca/leaf/:service` answers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct IssuedCert {
    /// Colon-separated hex.
    pub serial_number: String,
    #[serde(rename = "CertPEM")]
    pub cert_pem: String,
    /// Made where the certificate is used; never in Raft.
    #[serde(rename = "PrivateKeyPEM")]
    pub private_key_pem: String,
    pub service: String,
    #[serde(rename = "ServiceURI")]
    pub service_uri: String,
    /// RFC 3339.
    pub valid_after: String,
    pub valid_before: String,
    pub namespace: String,
    pub partition: String,
    pub create_index: u64,
    pub modify_index: u64,
}

/// `structs.Intention` as the legacy `/v1/connect/intentions` API shows it
/// (Consul 1.9+: a view of one source of a `service-intentions` entry).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Intention {
    #[serde(rename = "ID")]
    pub id: String,
    pub description: String,
    pub source_peer: String,
    #[serde(rename = "SourceNS")]
    pub source_ns: String,
    pub source_partition: String,
    pub source_name: String,
    #[serde(rename = "DestinationNS")]
    pub destination_ns: String,
    pub destination_partition: String,
    pub destination_name: String,
    /// "consul".
    pub source_type: String,
    /// "allow" or "deny"; `None` when `Permissions` decide.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    #[serde(
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub permissions: Vec<IntentionPermission>,
    #[serde(deserialize_with = "null_default")]
    pub meta: BTreeMap<String, String>,
    /// Higher wins (Consul's `Precedence`).
    pub precedence: i32,
    /// RFC 3339.
    pub created_at: String,
    pub updated_at: String,
    pub create_index: u64,
    pub modify_index: u64,
}

/// One L7 permission of an intention source.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct IntentionPermission {
    /// "allow" or "deny".
    pub action: String,
    #[serde(rename = "HTTP", skip_serializing_if = "Option::is_none")]
    pub http: Option<IntentionHttpPermission>,
}

/// What an HTTP request must look like for a permission to apply.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct IntentionHttpPermission {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path_exact: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path_prefix: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path_regex: String,
    #[serde(
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub header: Vec<IntentionHttpHeaderPermission>,
    #[serde(
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub methods: Vec<String>,
}

/// One header match of an HTTP permission (exactly one of its match kinds).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct IntentionHttpHeaderPermission {
    pub name: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub present: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub exact: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub prefix: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub suffix: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub regex: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub invert: bool,
}
