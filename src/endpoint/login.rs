//! Logins: a bearer token an auth method vouches for (`Login`), or an OIDC
//! provider's code (`OidcAuthUrl` then `OidcCallback`), traded for a Consul
//! token through the method's binding rules; `Logout` deletes a token a
//! login made. HTTP (`/v1/acl/login`, `/logout`, `/oidc/*`) and gRPC
//! (`hashicorp.consul.acl.ACLService`) call the same operations. Every one
//! runs on the leader: it writes the token, and it holds the OIDC flows'
//! waiting states. No token is needed; a refused login writes nothing.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::acl::{applied, enabled, now_rfc3339, rfc3339, uuid};
use super::{Answer, Call, Place, Value as Answered};
use crate::error::{Error, Result};
use crate::login::oidc::FlowError;
use crate::login::{Method, bind};
use crate::server::Server;
use crate::state::{Command, keys};
use crate::structs::acl::{AclToken, secret_hash, token_hash};
use crate::structs::auth::{AclAuthMethod, LoginBody, OidcAuthUrlBody, OidcCallbackBody};
use crate::structs::serde_util::as_json;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Op {
    Login(LoginBody),
    /// The caller's own token (the call's), deleted.
    Logout,
    OidcAuthUrl(OidcAuthUrlBody),
    OidcCallback(OidcCallbackBody),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Value {
    /// The new token as its maker sees it: with its secret.
    Token(#[serde(with = "as_json")] Box<AclToken>),
    LoggedOut,
    /// Where the browser logs in at the provider.
    AuthUrl(String),
}

impl Op {
    pub(super) fn place(&self) -> Place {
        Place::Leader
    }

    pub(super) async fn run(self, s: &Arc<Server>, call: &Call) -> Result<Answer<Value>> {
        enabled(s)?;
        let value = match self {
            Op::Login(body) => {
                let (accessor, secret) = login_token(s, body, call.client).await?;
                shown(s, &accessor, &secret)?
            }
            Op::Logout => {
                logout_token(s, call.token.as_deref()).await?;
                Value::LoggedOut
            }
            Op::OidcAuthUrl(body) => Value::AuthUrl(auth_url(s, call, body).await?),
            Op::OidcCallback(body) => {
                let (accessor, secret) = callback(s, call, body).await?;
                shown(s, &accessor, &secret)?
            }
        };
        let index = s.state().index_of([&keys::ACL]);
        Ok(Answer::at(s, index, false, value))
    }
}

/// Runs a login operation where it must run.
pub async fn call(s: &Arc<Server>, call: Call, op: Op) -> Result<Answer<Value>> {
    super::route(s, call, super::Op::Login(op))
        .await?
        .try_map(|v| match v {
            Answered::Login(v) => Ok(v),
            other => Err(Error::Internal(format!("unexpected answer {other:?}"))),
        })
}

/// The token just written, with its secret.
fn shown(s: &Server, accessor: &str, secret: &str) -> Result<Value> {
    let st = s.state();
    let t = st
        .acl_tokens
        .get(accessor)
        .ok_or_else(|| Error::Internal("the new token is not in the state".into()))?;
    Ok(Value::Token(Box::new(t.shown(Some(secret)))))
}

/// Consul's description of a login token, with the caller's `Meta`.
fn description(meta: &std::collections::BTreeMap<String, String>) -> String {
    const PREFIX: &str = "token created via login";
    if meta.is_empty() {
        PREFIX.to_string()
    } else {
        format!(
            "{PREFIX}: {}",
            serde_json::to_string(meta).unwrap_or_default()
        )
    }
}

/// A login: the new token's accessor and secret.
async fn login_token(
    s: &Server, body: LoginBody, client: Option<std::net::IpAddr>,
) -> Result<(String, String)> {
    if body.auth_method.is_empty() {
        return Err(Error::bad("Invalid Login: no AuthMethod is set"));
    }
    if body.bearer_token.is_empty() {
        return Err(Error::bad("Invalid Login: no BearerToken is set"));
    }
    let _place = s.logins().permit(client).map_err(Error::Busy)?;
    let (method, checked) = method_for(s, &body.auth_method)?;
    let id = s
        .logins()
        .identify(&method.name, &checked, &body.bearer_token)
        .await
        .map_err(|e| Error::Forbidden(format!("Permission denied: {e}")))?;
    issue_token(s, &method, &checked, &id, &body.meta).await
}

/// The auth method `name` and its checked config, where a login may use it.
fn method_for(s: &Server, name: &str) -> Result<(AclAuthMethod, Method)> {
    let method = s
        .state()
        .acl_auth_methods
        .get(name)
        .map(|m| (**m).clone())
        .ok_or_else(|| {
            Error::Forbidden(format!("ACL not found: auth method {name:?} not found"))
        })?;
    // HTTP forwards such a login to the primary (`http::wan`); a call
    // that reaches here in a secondary (gRPC) is refused, as Consul's:
    // replication would take a global token made here away again.
    if method.global() && s.config().datacenter != s.config().primary() {
        return Err(Error::bad(
            "creating global tokens via auth methods is only permitted in the primary datacenter",
        ));
    }
    let checked = Method::parse(&method).map_err(Error::Internal)?;
    Ok((method, checked))
}

/// The token a checked identity earns through `method`'s binding rules
/// (none matching: 403, nothing written); its accessor and secret.
async fn issue_token(
    s: &Server, method: &AclAuthMethod, checked: &Method, id: &bind::Identity,
    meta: &std::collections::BTreeMap<String, String>,
) -> Result<(String, String)> {
    // The rules as they are once the credential is checked.
    let st = s.state();
    let rules = st
        .acl_binding_rules
        .values()
        .filter(|r| r.auth_method == method.name)
        .map(|r| &**r);
    let bound = bind::bind(rules, checked.fields(), id, &s.config().datacenter)
        .map_err(|e| Error::Forbidden(format!("Permission denied: {e}")))?;
    let roles = bind::links(&bound.roles, |n| {
        st.acl_roles
            .values()
            .find(|r| r.name == n)
            .map(|r| r.id.clone())
    });
    let policies = bind::links(&bound.policies, |n| {
        st.acl_policies
            .values()
            .find(|p| p.name == n)
            .map(|p| p.id.clone())
    });
    if bound.identities.is_empty() && roles.is_empty() && policies.is_empty() {
        return Err(Error::Forbidden("Permission denied".into()));
    }
    let identities = crate::structs::identity::normalize(bound.identities, Some(!method.global()))
        .map_err(|e| Error::Forbidden(format!("Permission denied: {e}")))?;
    drop(st);
    let secret = uuid();
    let now = time::OffsetDateTime::now_utc();
    let mut token = AclToken {
        accessor_id: uuid(),
        secret_hash: secret_hash(&secret),
        description: description(meta),
        policies,
        roles,
        identities,
        local: !method.global(),
        auth_method: method.name.clone(),
        create_time: now_rfc3339(),
        ..Default::default()
    };
    if !method.max_token_ttl.is_zero() {
        token.expiration_time =
            rfc3339(now + time::Duration::nanoseconds(method.max_token_ttl.nanos()));
    }
    token.hash = token_hash(&token);
    let accessor = token.accessor_id.clone();
    s.seal_secret(&mut token, &secret);
    applied(
        s.write(Command::AclTokenSet {
            token: Box::new(token),
        })
        .await?,
    )?;
    Ok((accessor, secret))
}

/// A logout: the token `secret` deleted, if a login made it.
async fn logout_token(s: &Server, secret: Option<&str>) -> Result<()> {
    let secret = secret
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Error::Forbidden("ACL not found: no token was provided".into()))?;
    let token = crate::state::acl::token_by_secret_hash(&s.state(), &secret_hash(secret))
        .cloned()
        .ok_or_else(|| Error::Forbidden("ACL not found".into()))?;
    if token.auth_method.is_empty() {
        return Err(Error::Forbidden(
            "Permission denied: token wasn't created via login".into(),
        ));
    }
    applied(
        s.write(Command::AclTokenDelete {
            accessor: token.accessor_id.clone(),
        })
        .await?,
    )
}

fn flow_error(e: FlowError) -> Error {
    match e {
        FlowError::Bad(m) => Error::bad(m),
        FlowError::Busy(m) => Error::Busy(m),
        FlowError::Provider(_) => Error::Internal(e.to_string()),
        FlowError::Refused(r) => Error::Forbidden(format!("Permission denied: {r}")),
    }
}

/// The `oidc` method `name`, checked.
fn oidc_method(
    s: &Server, name: &str,
) -> Result<(AclAuthMethod, Method, Box<crate::login::OidcMethod>)> {
    let (method, checked) = method_for(s, name)?;
    match &checked {
        Method::Oidc(o) => {
            let o = o.clone();
            Ok((method, checked, o))
        }
        _ => Err(Error::bad(format!(
            "auth method {name:?} is not of type \"oidc\""
        ))),
    }
}

/// The provider's address for a browser to log in at, its state kept here
/// (the leader) for the callback.
async fn auth_url(s: &Server, call: &Call, body: OidcAuthUrlBody) -> Result<String> {
    if body.auth_method.is_empty() {
        return Err(Error::bad("Invalid OIDC Auth URL: no AuthMethod is set"));
    }
    if body.redirect_uri.is_empty() {
        return Err(Error::bad("Invalid OIDC Auth URL: no RedirectURI is set"));
    }
    let _place = s.logins().permit(call.client).map_err(Error::Busy)?;
    let (method, _, oidc) = oidc_method(s, &body.auth_method)?;
    s.logins()
        .oidc_auth_url(
            &method.name,
            &oidc,
            &body.redirect_uri,
            &body.client_nonce,
            body.meta,
        )
        .await
        .map_err(flow_error)
}

/// The provider's code and our state traded for a token, as a login's
/// (403 and nothing written when refused).
async fn callback(s: &Server, call: &Call, body: OidcCallbackBody) -> Result<(String, String)> {
    for (v, what) in [
        (&body.auth_method, "AuthMethod"),
        (&body.state, "State"),
        (&body.code, "Code"),
    ] {
        if v.is_empty() {
            return Err(Error::bad(format!(
                "Invalid OIDC callback: no {what} is set"
            )));
        }
    }
    let _place = s.logins().permit(call.client).map_err(Error::Busy)?;
    let (method, checked, oidc) = oidc_method(s, &body.auth_method)?;
    let (id, meta) = s
        .logins()
        .oidc_callback(
            &method.name,
            &oidc,
            &body.state,
            &body.code,
            &body.client_nonce,
        )
        .await
        .map_err(flow_error)?;
    issue_token(s, &method, &checked, &id, &meta).await
}
