//! Config entries: decode, normalize, validate.
//!
//! A `PUT /v1/config` body goes through three steps, as in Consul:
//!
//! 1. [`decode_entry`]: JSON to a typed [`ConfigEntry`]. Keys may be CamelCase
//!    or snake_case; unknown keys and wrong types are refused with an error
//!    starting `Request decoding failed: `.
//! 2. [`normalize`]: fills defaults Consul fills (Kind, proxy-defaults name,
//!    lower-case protocols, upper-case methods, rounded split weights).
//! 3. [`validate`]: the per-kind rules of Consul's `Validate()`.
//!
//! [`decode_and_validate`] runs all three. The graph check (would this write
//! break a discovery chain?) is `crate::discovery_chain::validate_write`.
//! Every error here means "400 Bad Request" with the error's text as body.
//!
//! The per-kind rules are `validate`'s; two sets have files of their own:
//! `intentions` (`service-intentions`: precedence and Consul's rules) and
//! `gateways` (`mesh`, `ingress-gateway`, `terminating-gateway`,
//! `exported-services`, whose shapes are `structs::config_entry::gateway`).

mod decode;
pub mod gateways;
pub mod intentions;
mod validate;

pub use crate::structs::config_entry::{ConfigEntry, Kind};
pub use decode::decode_entry;
pub use validate::{normalize, validate};

/// Why a config entry write is refused. Every variant is a client error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigEntryError {
    /// The body is not a well-formed entry of a known kind.
    #[error("Request decoding failed: {0}")]
    Decode(String),
    /// The entry breaks one of its kind's rules.
    #[error("{0}")]
    Invalid(String),
    /// The write would break a discovery chain.
    #[error("{0}")]
    Graph(String),
}

/// Decode, normalize and validate a request body.
pub fn decode_and_validate(body: &serde_json::Value) -> Result<ConfigEntry, ConfigEntryError> {
    let mut entry = decode_entry(body)?;
    normalize(&mut entry)?;
    validate(&entry)?;
    Ok(entry)
}

/// Whether `a` may read the `kind` entry `name` (Consul's `CanRead`):
/// proxy-defaults and mesh by any token, intentions with
/// `intention:read`, exported-services with `mesh:read`, the other
/// (service-scoped, gateways included) kinds with `service:read` on the
/// name. The one rule for the config endpoints and the config topics'
/// events.
pub fn readable(a: &crate::acl::Authorizer, kind: Kind, name: &str) -> bool {
    match kind {
        Kind::ProxyDefaults | Kind::Mesh => true,
        Kind::ServiceIntentions => a.intention_read(name),
        Kind::ExportedServices => a.mesh_read(),
        _ => a.service_read(name),
    }
}

/// The permission [`readable`] asks for, for a refusal's words.
pub fn read_permission(kind: Kind) -> &'static str {
    match kind {
        Kind::ServiceIntentions => "intention:read",
        Kind::ExportedServices => "mesh:read",
        _ => "service:read",
    }
}
