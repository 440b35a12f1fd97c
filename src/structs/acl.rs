//! ACL tokens, policies and roles in Consul's JSON shapes (`/v1/acl/*`),
//! and how a token's secret is kept: its SHA-256 (the lookup key) and, where
//! the servers hold a key, the secret sealed under it (`acl::seal`), so a
//! copy of the data dir (or of the Raft log) does not hand out secrets.

use serde::{Deserialize, Serialize};

/// The built-in policy every management token holds.
pub const GLOBAL_MANAGEMENT_ID: &str = "00000000-0000-0000-0000-000000000001";
pub const GLOBAL_MANAGEMENT_NAME: &str = "global-management";
/// The token of requests that carry none.
pub const ANONYMOUS_ID: &str = "00000000-0000-0000-0000-000000000002";
pub const ANONYMOUS_SECRET: &str = "anonymous";
/// What later reads show instead of a secret this server no longer knows.
pub const HIDDEN_SECRET: &str = "<hidden>";

/// A policy or role as a token or role names it (`{ID, Name}`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    #[serde(rename = "ID", default)]
    pub id: String,
    #[serde(rename = "Name", default)]
    pub name: String,
}

/// A service identity (`ServiceIdentities`): write on the service and its
/// sidecar, read on every service and node, in `Datacenters` (all if empty).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ServiceIdentity {
    pub service_name: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub datacenters: Vec<String>,
}

/// A node identity (`NodeIdentities`): write on the node, read on every
/// service, in its one `Datacenter`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NodeIdentity {
    pub node_name: String,
    pub datacenter: String,
}

/// A built-in template's variables; Consul's JSON name is lowercase (and,
/// as Go decodes, `Name` is read too).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TemplateVariables {
    #[serde(
        rename = "name",
        alias = "Name",
        skip_serializing_if = "String::is_empty"
    )]
    pub name: String,
}

/// A templated policy on a token or role (`TemplatedPolicies`): a built-in
/// template (`structs::identity`) rendered with its variables, in
/// `Datacenters` (all if empty).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct TemplatedPolicy {
    pub template_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template_variables: Option<TemplateVariables>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub datacenters: Vec<String>,
}

/// What a token or a role grants besides its policies.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Identities {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub service_identities: Vec<ServiceIdentity>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub node_identities: Vec<NodeIdentity>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub templated_policies: Vec<TemplatedPolicy>,
}

impl Identities {
    pub fn is_empty(&self) -> bool {
        self.service_identities.is_empty()
            && self.node_identities.is_empty()
            && self.templated_policies.is_empty()
    }
}

/// One token, as stored (with the hash of its secret) and shown.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AclToken {
    #[serde(rename = "AccessorID")]
    pub accessor_id: String,
    /// Shown only when the caller knows it (create, bootstrap, clone, self);
    /// stored empty.
    #[serde(rename = "SecretID")]
    pub secret_id: String,
    pub description: String,
    pub policies: Vec<Link>,
    pub roles: Vec<Link>,
    #[serde(flatten)]
    pub identities: Identities,
    pub local: bool,
    /// The auth method whose login made it; empty for any other token.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub auth_method: String,
    /// RFC 3339, as Consul's; empty: never expires.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub expiration_time: String,
    pub create_time: String,
    pub hash: String,
    /// Hex SHA-256 of the secret: the lookup key. Stored, never shown
    /// (`shown` empties it).
    #[serde(rename = "cairnSecretHash", skip_serializing_if = "String::is_empty")]
    pub secret_hash: String,
    /// The secret sealed with the servers' key (`acl::seal`), for reads
    /// by `acl:write`; empty where no server had a key. Stored, never shown.
    #[serde(rename = "cairnSealedSecret", skip_serializing_if = "String::is_empty")]
    pub sealed_secret: String,
    pub create_index: u64,
    pub modify_index: u64,
}

impl AclToken {
    /// The token as an answer shows it: the secret when the caller knows
    /// it, else Consul's `<hidden>`; never the stored hash.
    pub fn shown(&self, secret: Option<&str>) -> AclToken {
        AclToken {
            secret_id: secret.unwrap_or(HIDDEN_SECRET).to_string(),
            secret_hash: String::new(),
            sealed_secret: String::new(),
            ..self.clone()
        }
    }
}

/// One policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AclPolicy {
    #[serde(rename = "ID")]
    pub id: String,
    pub name: String,
    pub description: String,
    pub rules: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub datacenters: Vec<String>,
    pub hash: String,
    pub create_index: u64,
    pub modify_index: u64,
}

/// One role: a named set of policies tokens can hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AclRole {
    #[serde(rename = "ID")]
    pub id: String,
    pub name: String,
    pub description: String,
    pub policies: Vec<Link>,
    #[serde(flatten)]
    pub identities: Identities,
    pub hash: String,
    pub create_index: u64,
    pub modify_index: u64,
}

/// Where a client agent learns what a caller's token may do (cairn's own;
/// the agent asks with `?stale`, so any server answers).
pub const AUTHORIZER_PATH: &str = "/v1/internal/acl/authorizer";

/// What a client agent learns of a token from its servers (cairn's own
/// `GET /v1/internal/acl/authorizer`): enough to check it locally, as
/// Consul's agents resolve a token's policies through their servers and
/// cache them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ResolvedToken {
    /// False: the servers run without ACLs, everything is allowed.
    pub enabled: bool,
    #[serde(rename = "AccessorID")]
    pub accessor_id: String,
    /// Holds `global-management`.
    pub management: bool,
    /// The servers' `--acl-default-policy`.
    pub default_policy: crate::acl::DefaultPolicy,
    /// The rules of every policy the token holds, its own and its roles'.
    pub rules: Vec<String>,
}

/// An agent's tokens: `default` for requests it makes or forwards without
/// one (`--acl-token`), `agent` for its own anti-entropy, heartbeats and
/// leave (`--acl-agent-token`, falling back to `default`).
#[derive(Debug, Clone, Default)]
pub struct AgentTokens {
    pub default: Option<String>,
    pub agent: Option<String>,
}

impl AgentTokens {
    /// The token of the agent's own calls.
    pub fn own(&self) -> Option<&str> {
        self.agent.as_deref().or(self.default.as_deref())
    }
}

/// Consul's policy, role and auth method names: letters, digits, `-` and
/// `_`, 1–128.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// Hex SHA-256 of a secret: how tokens are found and kept.
pub fn secret_hash(secret: &str) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, secret.as_bytes()).as_ref())
}

/// Consul shows a base64 `Hash` of a token's or policy's content; ours is
/// a hex SHA-256 of the fields that define it (clients only compare it).
/// A token's `Hash`: its description and links.
pub fn token_hash(t: &AclToken) -> String {
    let links: Vec<&str> = t
        .policies
        .iter()
        .chain(&t.roles)
        .map(|l| l.id.as_str())
        .collect();
    let mut parts = vec![t.description.as_str()];
    parts.extend(links);
    // A token without identities hashes as it did before they existed.
    let ids = serde_json::to_string(&t.identities).unwrap_or_default();
    if !t.identities.is_empty() {
        parts.push(&ids);
    }
    content_hash(&parts)
}

/// A new token holding `global-management`, with `secret`, created now.
pub fn management_token(description: &str, secret: &str) -> AclToken {
    let mut t = AclToken {
        accessor_id: uuid::Uuid::new_v4().to_string(),
        description: description.into(),
        policies: vec![Link {
            id: GLOBAL_MANAGEMENT_ID.into(),
            name: GLOBAL_MANAGEMENT_NAME.into(),
        }],
        create_time: time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
        secret_hash: secret_hash(secret),
        ..Default::default()
    };
    t.hash = token_hash(&t);
    t
}

pub fn content_hash(parts: &[&str]) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for p in parts {
        ctx.update(p.as_bytes());
        ctx.update(&[0]);
    }
    hex(ctx.finish().as_ref())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The built-in `global-management` policy (rules are not consulted: its
/// ID alone makes a token a management token).
pub fn global_management() -> AclPolicy {
    AclPolicy {
        id: GLOBAL_MANAGEMENT_ID.into(),
        name: GLOBAL_MANAGEMENT_NAME.into(),
        description: "Builtin Policy that grants unlimited access".into(),
        rules: String::new(),
        ..Default::default()
    }
}

/// The built-in anonymous token, with no policies.
pub fn anonymous() -> AclToken {
    AclToken {
        accessor_id: ANONYMOUS_ID.into(),
        description: "Anonymous Token".into(),
        secret_hash: secret_hash(ANONYMOUS_SECRET),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secret_hash_is_stored_but_never_shown() {
        let t = AclToken {
            accessor_id: "a".into(),
            secret_hash: secret_hash("s"),
            ..Default::default()
        };
        let stored = serde_json::to_value(&t).unwrap();
        assert_eq!(stored["cairnSecretHash"], secret_hash("s"));
        let json = serde_json::to_value(t.shown(None)).unwrap();
        assert!(json.get("cairnSecretHash").is_none());
        assert_eq!(json["SecretID"], HIDDEN_SECRET);
        assert_eq!(json["AccessorID"], "a");
        assert_eq!(secret_hash("s").len(), 64);
        assert_ne!(secret_hash("s"), secret_hash("t"));
    }
}
