//! Consul's ACL policy language and the decisions made from it: pure
//! functions over rule text, no I/O and no state, so that every layer that
//! enforces (state filters, HTTP handlers, the agent) can use them.
//!
//! `rules` parses a policy's `Rules` (HCL or JSON) into per-resource tables;
//! `authz` merges a token's policies into an `Authorizer` that answers one
//! yes/no question per Consul permission (`key:read`, `service:write`, ...);
//! `seal` keeps a token's secret sealed beside its hash, for the servers
//! to show again. (`seal` is the one draw of randomness here: its nonces.)
//!
//! A sealed secret is `v1:` and base64 of ChaCha20-Poly1305 under the
//! servers' key, the accessor as associated data; the servers seal and
//! open through `Server::seal_secret`/`open_secret`, the key derived from
//! `--encrypt` by `raft::encrypt::EncryptKey::subkey`. The default policy
//! `allow` never grants `acl`: only an `acl` rule or management does. A
//! failed check is a `Denied`, which carries Consul's 403 text.

pub mod authz;
pub mod rules;
pub mod seal;

pub use authz::{Authorizer, DefaultPolicy, Denied};
pub use rules::{Access, Named, Rules, RulesError, parse_rules};
