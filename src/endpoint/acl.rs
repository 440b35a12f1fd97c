//! The ACL objects' writes, run on the leader (`Op`): tokens, policies,
//! roles and auth methods, built from their requests by the adapter
//! (`http::acl`, `http::login`: the body's own rules), then checked here
//! against the leader's state: `acl:write`, a create's ID or name not in
//! use and an update's object there, links to policies and roles that
//! exist (named by ID or name, each filled in), hashes over what was
//! resolved, a token's secret sealed in. Reads are still the adapters';
//! logins are `endpoint::login`. Also what the ACL endpoints share:
//! Consul's refusal with ACLs off, a write's answer as an error, and the
//! times and IDs of new ACL objects.

use std::sync::Arc;

use imbl::OrdMap;
use serde::{Deserialize, Serialize};

use super::{Answer, Call, Place};
use crate::error::{Error, Result};
use crate::server::Server;
use crate::state::acl::BOOTSTRAP_DONE;
use crate::state::{Command, Response as Applied};
use crate::structs::acl::{AclPolicy, AclRole, AclToken, Link, content_hash, token_hash};
use crate::structs::auth::AclAuthMethod;
use crate::structs::serde_util::as_json;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Op {
    /// Writes `object`: a new one (`create`: its ID, or a method's name,
    /// not in use) or a replacement of one that is there.
    Set {
        #[serde(with = "as_json")]
        object: Object,
        create: bool,
    },
    Delete(Deleted),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Object {
    /// With the secret its caller gave or was given, sealed on the leader
    /// for later reads (none: the sealed one stays).
    Token {
        token: Box<AclToken>,
        secret: Option<String>,
    },
    Policy(Box<AclPolicy>),
    Role(Box<AclRole>),
    AuthMethod(Box<AclAuthMethod>),
}

/// An object deleted by its accessor, ID or (a method) name.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Deleted {
    Token(String),
    Policy(String),
    Role(String),
    AuthMethod(String),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Value {
    Done,
}

/// Writes `object` on the leader.
pub async fn set(s: &Arc<Server>, call: Call, object: Object, create: bool) -> Result<()> {
    write(s, call, Op::Set { object, create }).await
}

/// Deletes an object on the leader.
pub async fn delete(s: &Arc<Server>, call: Call, what: Deleted) -> Result<()> {
    write(s, call, Op::Delete(what)).await
}

async fn write(s: &Arc<Server>, call: Call, op: Op) -> Result<()> {
    match super::route(s, call, super::Op::Acl(op)).await?.value {
        super::Value::Acl(Value::Done) => Ok(()),
        other => Err(Error::Internal(format!("unexpected answer {other:?}"))),
    }
}

/// A create of what is there, or an update of what is not.
fn must(
    create: bool, exists: bool, taken: impl FnOnce() -> String, gone: impl FnOnce() -> String,
) -> Result<()> {
    match (create, exists) {
        (true, true) => Err(Error::BadRequest(taken())),
        (false, false) => Err(Error::BadRequest(gone())),
        _ => Ok(()),
    }
}

/// A policy's or role's write: its ID new (create) or present (update),
/// and its name no other object's of the table.
fn unique<T>(
    create: bool, table: &OrdMap<String, Arc<T>>, kind: &str, id: &str, name: &str,
    name_of: impl Fn(&T) -> &str,
) -> Result<()> {
    must(
        create,
        table.contains_key(id),
        || format!("Invalid {kind}: ID {id:?} is already in use"),
        || format!("Cannot find {} {id:?}", kind.to_lowercase()),
    )?;
    if table
        .iter()
        .any(|(other, x)| name_of(x) == name && other != id)
    {
        return Err(Error::bad(format!(
            "Invalid {kind}: A {kind} with Name {name:?} already exists"
        )));
    }
    Ok(())
}

/// Each link names an existing object of `table` (a policy or role) by ID
/// or by name: both filled in, each linked once.
fn resolve<T>(
    table: &OrdMap<String, Arc<T>>, kind: &str, name_of: impl Fn(&T) -> &str, links: &[Link],
) -> Result<Vec<Link>> {
    let mut out: Vec<Link> = Vec::new();
    for l in links {
        let found = if !l.id.is_empty() {
            table.get(&l.id).map(|x| Link {
                id: l.id.clone(),
                name: name_of(x).to_string(),
            })
        } else {
            table
                .iter()
                .find(|(_, x)| name_of(x) == l.name)
                .map(|(id, _)| Link {
                    id: id.clone(),
                    name: l.name.clone(),
                })
        };
        let link = found.ok_or_else(|| {
            Error::bad(format!(
                "cannot find {kind} {}",
                if l.id.is_empty() { &l.name } else { &l.id }
            ))
        })?;
        if !out.iter().any(|o| o.id == link.id) {
            out.push(link);
        }
    }
    Ok(out)
}

/// Consul's bounds on `MaxTokenTTL`.
const MIN_TOKEN_TTL: i64 = 60;
const MAX_TOKEN_TTL: i64 = 24 * 3600;

/// Checks a method as Consul's `AuthMethodSet` does, config included.
fn check_method(m: &AclAuthMethod) -> Result<()> {
    if m.name.is_empty() {
        return Err(Error::bad("Invalid Auth Method: no Name is set"));
    }
    if !crate::structs::acl::valid_name(&m.name) {
        return Err(Error::bad(
            "Invalid Auth Method: invalid Name. Only alphanumeric characters, '-' and '_' are allowed",
        ));
    }
    if !matches!(m.token_locality.as_str(), "" | "local" | "global") {
        return Err(Error::bad(
            "Invalid Auth Method: TokenLocality should be one of 'local' or 'global'",
        ));
    }
    if m.kind.is_empty() {
        return Err(Error::bad("Invalid Auth Method: No Type is set"));
    }
    let ttl = m.max_token_ttl.nanos();
    if ttl != 0 {
        let secs = ttl / 1_000_000_000;
        if ttl < 0 || secs < MIN_TOKEN_TTL {
            return Err(Error::bad(format!(
                "Invalid Auth Method: MaxTokenTTL {} cannot be less than 1m0s",
                m.max_token_ttl
            )));
        }
        if secs > MAX_TOKEN_TTL {
            return Err(Error::bad(format!(
                "Invalid Auth Method: MaxTokenTTL {} cannot be more than 24h0m0s",
                m.max_token_ttl
            )));
        }
    }
    crate::login::Method::parse(m)
        .map(|_| ())
        .map_err(Error::BadRequest)
}

fn policy_name(p: &AclPolicy) -> &str {
    &p.name
}

fn role_name(r: &AclRole) -> &str {
    &r.name
}

/// A role's hash: its name, its policies' IDs, what it grants.
pub fn role_hash(r: &AclRole) -> String {
    let granted = serde_json::to_string(&r.identities).unwrap_or_default();
    let mut parts = vec![r.name.as_str()];
    parts.extend(r.policies.iter().map(|p| p.id.as_str()));
    if !r.identities.is_empty() {
        parts.push(&granted);
    }
    content_hash(&parts)
}

impl Op {
    pub(super) fn place(&self) -> Place {
        Place::Leader
    }

    pub(super) async fn run(self, s: &Arc<Server>, call: &Call) -> Result<Answer<Value>> {
        enabled(s)?;
        let a = call.authz(s)?;
        a.require(a.acl_write(), "acl:write", "")?;
        let st = s.state();
        let mut forget = None;
        let cmd = match self {
            Op::Set { object, create } => match object {
                Object::Token { mut token, secret } => {
                    let accessor = token.accessor_id.clone();
                    must(
                        create,
                        st.acl_tokens.contains_key(&accessor),
                        || "Invalid Token: AccessorID is already in use".into(),
                        || format!("Cannot find token {accessor:?}"),
                    )?;
                    token.policies =
                        resolve(&st.acl_policies, "policy", policy_name, &token.policies)?;
                    token.roles = resolve(&st.acl_roles, "role", role_name, &token.roles)?;
                    token.hash = token_hash(&token);
                    if let Some(secret) = &secret {
                        s.seal_secret(&mut token, secret);
                    }
                    Command::AclTokenSet { token }
                }
                Object::Policy(policy) => {
                    unique(
                        create,
                        &st.acl_policies,
                        "Policy",
                        &policy.id,
                        &policy.name,
                        policy_name,
                    )?;
                    Command::AclPolicySet { policy }
                }
                Object::Role(mut role) => {
                    unique(
                        create,
                        &st.acl_roles,
                        "Role",
                        &role.id,
                        &role.name,
                        role_name,
                    )?;
                    role.policies =
                        resolve(&st.acl_policies, "policy", policy_name, &role.policies)?;
                    role.hash = role_hash(&role);
                    Command::AclRoleSet { role }
                }
                Object::AuthMethod(mut method) => {
                    let existing = st.acl_auth_methods.get(&method.name).cloned();
                    must(
                        create,
                        existing.is_some(),
                        || {
                            format!(
                                "Invalid Auth Method: An Auth Method with Name {:?} already exists",
                                method.name
                            )
                        },
                        || format!("Cannot find auth method {:?}", method.name),
                    )?;
                    if let Some(existing) = existing {
                        if method.kind.is_empty() {
                            method.kind = existing.kind.clone();
                        }
                        if method.kind != existing.kind {
                            return Err(Error::bad(
                                "Invalid Auth Method: the Type field is immutable",
                            ));
                        }
                    }
                    check_method(&method)?;
                    method.create_index = 0;
                    method.modify_index = 0;
                    forget = Some(method.name.clone());
                    Command::AclAuthMethodSet { method }
                }
            },
            Op::Delete(what) => match what {
                Deleted::Token(accessor) => Command::AclTokenDelete { accessor },
                Deleted::Policy(id) => Command::AclPolicyDelete { id },
                Deleted::Role(id) => Command::AclRoleDelete { id },
                Deleted::AuthMethod(name) => {
                    forget = Some(name.clone());
                    Command::AclAuthMethodDelete { name }
                }
            },
        };
        drop(st);
        applied(s.write(cmd).await?)?;
        // A method written or gone: its cached provider state goes too.
        if let Some(name) = forget {
            s.logins().forget(&name);
        }
        Ok(Answer::at(s, s.state().index, false, Value::Done))
    }
}

/// Consul answers ACL endpoints with ACLs off so.
pub fn enabled(s: &Server) -> Result<()> {
    if s.acl().enabled() {
        Ok(())
    } else {
        Err(Error::Unauthorized("ACL support disabled".into()))
    }
}

/// A write's answer as the caller's: a bootstrap done again is 403.
pub fn applied(r: Applied) -> Result<()> {
    match r {
        Applied::Ok => Ok(()),
        Applied::Rejected(reason) if reason.starts_with(BOOTSTRAP_DONE) => {
            Err(Error::Forbidden(format!("Permission denied: {reason}")))
        }
        Applied::Rejected(reason) => Err(Error::BadRequest(reason)),
        other => Err(Error::Internal(format!("unexpected answer {other:?}"))),
    }
}

/// A time as Consul's JSON writes it.
pub fn rfc3339(t: time::OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

pub fn now_rfc3339() -> String {
    rfc3339(time::OffsetDateTime::now_utc())
}

/// A new object's ID or secret.
pub fn uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}
