//! Auth methods and binding rules in Consul's JSON shapes
//! (`/v1/acl/auth-method*`, `/v1/acl/binding-rule*`), and the body of a
//! login (`/v1/acl/login`). How a method checks a credential and how its
//! rules bind it to a token's identities is `login`'s job.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::duration::Duration;

/// The auth method types cairn serves.
pub const TYPES: &[&str] = &["jwt", "kubernetes", "oidc"];

/// One auth method: how a bearer token is checked (`Type`, `Config`) and
/// what the tokens its logins make look like.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AclAuthMethod {
    pub name: String,
    #[serde(rename = "Type")]
    pub kind: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub display_name: String,
    pub description: String,
    /// The longest a login token lives; zero: Consul's default is no
    /// expiry.
    #[serde(rename = "MaxTokenTTL", skip_serializing_if = "Duration::is_zero_ref")]
    pub max_token_ttl: Duration,
    /// `local` (or empty) or `global`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub token_locality: String,
    /// The login tokens' description template (Consul's; kept, shown).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub token_name_format: String,
    /// The type's own settings, as the caller gave them.
    pub config: serde_json::Map<String, serde_json::Value>,
    pub create_index: u64,
    pub modify_index: u64,
}

impl AclAuthMethod {
    /// Logins through this method make global tokens.
    pub fn global(&self) -> bool {
        self.token_locality == "global"
    }

    /// The list entry Consul shows (`ACLAuthMethodListStub`): no `Config`.
    pub fn stub(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.remove("Config");
        }
        v
    }
}

/// What a binding rule makes of a matching login.
pub const BIND_TYPES: &[&str] = &["service", "node", "role", "policy", "templated-policy"];

/// A templated policy rule's variables (`BindVars`), interpolated like
/// `BindName`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BindVars {
    #[serde(
        rename = "Name",
        alias = "name",
        skip_serializing_if = "String::is_empty"
    )]
    pub name: String,
}

/// One binding rule: logins through `AuthMethod` whose identity matches
/// `Selector` get what `BindType`/`BindName` name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AclBindingRule {
    #[serde(rename = "ID")]
    pub id: String,
    pub description: String,
    pub auth_method: String,
    pub selector: String,
    pub bind_type: String,
    pub bind_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bind_vars: Option<BindVars>,
    pub create_index: u64,
    pub modify_index: u64,
}

/// `POST /v1/acl/oidc/auth-url`'s body.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct OidcAuthUrlBody {
    pub auth_method: String,
    #[serde(rename = "RedirectURI")]
    pub redirect_uri: String,
    pub client_nonce: String,
    pub meta: BTreeMap<String, String>,
}

/// `POST /v1/acl/oidc/callback`'s body.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct OidcCallbackBody {
    pub auth_method: String,
    pub state: String,
    pub code: String,
    pub client_nonce: String,
}

/// `POST /v1/acl/login`'s body.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct LoginBody {
    pub auth_method: String,
    pub bearer_token: String,
    pub meta: BTreeMap<String, String>,
}
