//! Replication from the primary datacenter: what a secondary's leader pulls
//! (cairn's own internal endpoints on the primary) and what
//! `/v1/acl/replication` answers (Consul's shape).

use serde::{Deserialize, Serialize};

use super::acl::{AclPolicy, AclRole, AclToken};

/// The primary's ACL objects a secondary replicates (policies, roles and
/// global tokens, each token with the hash of its secret), blocking on the
/// primary's `acl` index.
pub const ACL_PATH: &str = "/v1/internal/replication/acl";
/// The primary's config entries, every kind (intentions among them).
pub const CONFIG_PATH: &str = "/v1/internal/replication/config";

/// Set by the server itself on a pull it sends another datacenter over the
/// Raft port (never taken from a client's request: `http::wan` copies only
/// the caller's identity headers into what it forwards).
pub const REPLICATION_HEADER: &str = "x-cairn-replication";

/// What `ACL_PATH` answers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AclReplica {
    pub policies: Vec<AclPolicy>,
    pub roles: Vec<AclRole>,
    /// Global tokens only (`Local: false`), as stored: `cairnSecretHash`
    /// included, the secret itself never.
    pub tokens: Vec<AclToken>,
    /// Auth methods and their binding rules (absent from an older
    /// primary's answer: none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub auth_methods: Vec<crate::structs::auth::AclAuthMethod>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub binding_rules: Vec<crate::structs::auth::AclBindingRule>,
}

/// What `CONFIG_PATH` answers: every entry in Consul's JSON.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ConfigReplica {
    pub entries: Vec<serde_json::Value>,
}

/// Consul's zero time, what `LastSuccess`/`LastError` say before any.
pub const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// `GET /v1/acl/replication` (Consul's shape).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AclReplicationStatus {
    pub enabled: bool,
    pub running: bool,
    pub source_datacenter: String,
    pub replication_type: String,
    pub replicated_index: u64,
    pub replicated_role_index: u64,
    pub replicated_token_index: u64,
    pub last_success: String,
    pub last_error: String,
    pub last_error_message: String,
}

impl Default for AclReplicationStatus {
    fn default() -> Self {
        AclReplicationStatus {
            enabled: false,
            running: false,
            source_datacenter: String::new(),
            replication_type: String::new(),
            replicated_index: 0,
            replicated_role_index: 0,
            replicated_token_index: 0,
            last_success: ZERO_TIME.into(),
            last_error: ZERO_TIME.into(),
            last_error_message: String::new(),
        }
    }
}
