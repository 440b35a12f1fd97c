//! `/v1/acl/auth-method*`, `/v1/acl/binding-rule*`, `/v1/acl/login` and
//! `/v1/acl/logout` (Consul's API): auth methods and their binding rules
//! kept like the other ACL objects (`acl:read`, `acl:write`), and logins
//! that trade a bearer token the method vouches for (`login`) for a
//! Consul token. A refused login writes nothing.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};

use super::acl::{
    acl_read, acl_write, applied, check_uuid, enabled, missing, now_rfc3339, rfc3339, shown_token,
    uuid, valid_name,
};
use super::{App, Called, json_at};
use crate::error::{Error, Result};
use crate::login::oidc::FlowError;
use crate::login::{Method, bind};
use crate::request::authz::Authz;
use crate::request::decode_json;
use crate::server::Server;
use crate::state::{Command, keys};
use crate::structs::acl::{AclToken, secret_hash, token_hash};
use crate::structs::auth::{
    AclAuthMethod, AclBindingRule, LoginBody, OidcAuthUrlBody, OidcCallbackBody,
};

pub fn routes() -> Router<App> {
    Router::new()
        .route("/v1/acl/auth-method", put(method_create))
        .route(
            "/v1/acl/auth-method/{name}",
            get(method_read).put(method_update).delete(method_delete),
        )
        .route("/v1/acl/auth-methods", get(method_list))
        .route("/v1/acl/binding-rule", put(rule_create))
        .route(
            "/v1/acl/binding-rule/{id}",
            get(rule_read).put(rule_update).delete(rule_delete),
        )
        .route("/v1/acl/binding-rules", get(rule_list))
        .route("/v1/acl/login", post(login))
        .route("/v1/acl/logout", post(logout))
        .route("/v1/acl/oidc/auth-url", post(oidc_auth_url))
        .route("/v1/acl/oidc/callback", post(oidc_callback))
        .route("/v1/internal/ui/oidc-auth-methods", get(oidc_methods))
}

fn acl_index(s: &Server) -> u64 {
    s.state().index_of([&keys::ACL])
}

// ---- auth methods ----

/// Consul's bounds on `MaxTokenTTL`.
const MIN_TOKEN_TTL: i64 = 60;
const MAX_TOKEN_TTL: i64 = 24 * 3600;

/// Checks a method as Consul's `AuthMethodSet` does, config included.
fn check_method(m: &AclAuthMethod) -> Result<Method> {
    if m.name.is_empty() {
        return Err(Error::bad("Invalid Auth Method: no Name is set"));
    }
    valid_name("Auth Method", &m.name).map_err(|_| {
        Error::bad("Invalid Auth Method: invalid Name. Only alphanumeric characters, '-' and '_' are allowed")
    })?;
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
    Method::parse(m).map_err(Error::BadRequest)
}

async fn write_method(s: &Server, mut m: AclAuthMethod) -> Result<Response> {
    check_method(&m)?;
    m.create_index = 0;
    m.modify_index = 0;
    let name = m.name.clone();
    applied(
        s.write(Command::AclAuthMethodSet {
            method: Box::new(m),
        })
        .await?,
    )?;
    s.logins().forget(&name);
    let st = s.state();
    let m = st
        .acl_auth_methods
        .get(&name)
        .ok_or_else(|| missing("auth method"))?;
    Ok(json_at(s, acl_index(s), &**m))
}

async fn method_create(State(s): State<App>, a: Authz, body: Bytes) -> Result<Response> {
    acl_write(&s, &a)?;
    let m: AclAuthMethod = decode_json(&body)?;
    if s.state().acl_auth_methods.contains_key(&m.name) {
        return Err(Error::bad(format!(
            "Invalid Auth Method: An Auth Method with Name {:?} already exists",
            m.name
        )));
    }
    write_method(&s, m).await
}

async fn method_update(
    State(s): State<App>, a: Authz, Path(name): Path<String>, body: Bytes,
) -> Result<Response> {
    acl_write(&s, &a)?;
    let mut m: AclAuthMethod = decode_json(&body)?;
    if m.name.is_empty() {
        m.name = name.clone();
    } else if m.name != name {
        return Err(Error::bad(
            "Auth Method Name in the body does not match the URL",
        ));
    }
    let Some(existing) = s.state().acl_auth_methods.get(&name).cloned() else {
        return Err(Error::bad(format!("Cannot find auth method {name:?}")));
    };
    if m.kind.is_empty() {
        m.kind = existing.kind.clone();
    }
    if m.kind != existing.kind {
        return Err(Error::bad(
            "Invalid Auth Method: the Type field is immutable",
        ));
    }
    write_method(&s, m).await
}

async fn method_read(State(s): State<App>, a: Authz, Path(name): Path<String>) -> Result<Response> {
    acl_read(&s, &a)?;
    let st = s.state();
    let m = st
        .acl_auth_methods
        .get(&name)
        .ok_or_else(|| missing("auth method"))?;
    Ok(json_at(&s, acl_index(&s), &**m))
}

async fn method_delete(
    State(s): State<App>, a: Authz, Path(name): Path<String>,
) -> Result<Response> {
    acl_write(&s, &a)?;
    applied(
        s.write(Command::AclAuthMethodDelete { name: name.clone() })
            .await?,
    )?;
    s.logins().forget(&name);
    Ok(axum::Json(true).into_response())
}

async fn method_list(State(s): State<App>, a: Authz) -> Result<Response> {
    acl_read(&s, &a)?;
    let st = s.state();
    let list: Vec<serde_json::Value> = st.acl_auth_methods.values().map(|m| m.stub()).collect();
    Ok(json_at(&s, acl_index(&s), &list))
}

// ---- binding rules ----

/// Checks a rule against its method (which must exist).
fn check_rule(s: &Server, r: &AclBindingRule) -> Result<()> {
    if r.auth_method.is_empty() {
        return Err(Error::bad("Invalid Binding Rule: no AuthMethod is set"));
    }
    let st = s.state();
    let m = st.acl_auth_methods.get(&r.auth_method).ok_or_else(|| {
        Error::bad(format!(
            "Invalid Binding Rule: unknown AuthMethod {:?}",
            r.auth_method
        ))
    })?;
    let method = Method::parse(m).map_err(Error::Internal)?;
    bind::validate_rule(r, method.fields(), &method.var_names()).map_err(Error::BadRequest)
}

async fn write_rule(s: &Server, mut r: AclBindingRule) -> Result<Response> {
    check_rule(s, &r)?;
    r.create_index = 0;
    r.modify_index = 0;
    let id = r.id.clone();
    applied(
        s.write(Command::AclBindingRuleSet { rule: Box::new(r) })
            .await?,
    )?;
    let st = s.state();
    let r = st
        .acl_binding_rules
        .get(&id)
        .ok_or_else(|| missing("binding rule"))?;
    Ok(json_at(s, acl_index(s), &**r))
}

async fn rule_create(State(s): State<App>, a: Authz, body: Bytes) -> Result<Response> {
    acl_write(&s, &a)?;
    let mut r: AclBindingRule = decode_json(&body)?;
    if !r.id.is_empty() {
        return Err(Error::bad("Cannot specify an ID in a binding rule create"));
    }
    r.id = uuid();
    write_rule(&s, r).await
}

async fn rule_update(
    State(s): State<App>, a: Authz, Path(id): Path<String>, body: Bytes,
) -> Result<Response> {
    acl_write(&s, &a)?;
    let mut r: AclBindingRule = decode_json(&body)?;
    if r.id.is_empty() {
        r.id = id.clone();
    } else if r.id != id {
        return Err(Error::bad(
            "Binding Rule ID in the body does not match the URL",
        ));
    }
    let Some(existing) = s.state().acl_binding_rules.get(&id).cloned() else {
        return Err(Error::bad(format!("Cannot find binding rule {id:?}")));
    };
    if r.auth_method.is_empty() {
        r.auth_method = existing.auth_method.clone();
    }
    if r.auth_method != existing.auth_method {
        return Err(Error::bad(
            "Invalid Binding Rule: the AuthMethod field is immutable",
        ));
    }
    write_rule(&s, r).await
}

async fn rule_read(State(s): State<App>, a: Authz, Path(id): Path<String>) -> Result<Response> {
    acl_read(&s, &a)?;
    check_uuid("Binding Rule ID", &id)?;
    let st = s.state();
    let r = st
        .acl_binding_rules
        .get(&id)
        .ok_or_else(|| missing("binding rule"))?;
    Ok(json_at(&s, acl_index(&s), &**r))
}

async fn rule_delete(State(s): State<App>, a: Authz, Path(id): Path<String>) -> Result<Response> {
    acl_write(&s, &a)?;
    applied(s.write(Command::AclBindingRuleDelete { id }).await?)?;
    Ok(axum::Json(true).into_response())
}

/// `GET /v1/acl/binding-rules[?authmethod=]`.
async fn rule_list(State(s): State<App>, a: Authz, RawQuery(q): RawQuery) -> Result<Response> {
    acl_read(&s, &a)?;
    let p = crate::request::Params::parse(q.as_deref());
    let method = p.get("authmethod").filter(|m| !m.is_empty());
    let st = s.state();
    let list: Vec<&AclBindingRule> = st
        .acl_binding_rules
        .values()
        .filter(|r| method.is_none_or(|m| r.auth_method == m))
        .map(|r| &**r)
        .collect();
    Ok(json_at(&s, acl_index(&s), &list))
}

// ---- login and logout ----

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

/// `POST /v1/acl/login`: no token needed; the bearer token is the
/// credential. A refusal (unknown method, bad credential, no rule
/// matched) is a 403 and proposes nothing.
async fn login(State(s): State<App>, Called(_, call): Called, body: Bytes) -> Result<Response> {
    let body: LoginBody = decode_json(&body)?;
    let (accessor, secret) = login_token(&s, body, call.client).await?;
    shown_token(&s, &accessor, Some(&secret), true)
}

/// A login, over HTTP or gRPC (`hashicorp.consul.acl.ACLService/Login`):
/// the new token's accessor and secret.
pub async fn login_token(
    s: &Server, body: LoginBody, client: Option<std::net::IpAddr>,
) -> Result<(String, String)> {
    enabled(s)?;
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

/// `POST /v1/acl/logout`: deletes the caller's own token, which must be
/// one a login made.
async fn logout(State(s): State<App>, parts: axum::http::request::Parts) -> Result<Response> {
    let secret = crate::request::authz::token_of(&parts.headers, parts.uri.query());
    logout_token(&s, secret.as_deref()).await?;
    Ok(axum::Json(true).into_response())
}

/// A logout, over HTTP or gRPC: the token `secret` deleted, if a login
/// made it.
pub async fn logout_token(s: &Server, secret: Option<&str>) -> Result<()> {
    enabled(s)?;
    let secret =
        secret.ok_or_else(|| Error::Forbidden("ACL not found: no token was provided".into()))?;
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

// ---- OIDC ----

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

/// `POST /v1/acl/oidc/auth-url`: the provider's address for a browser to
/// log in at, its state kept here (this is the leader: writes and this are
/// forwarded to it) for the callback. No token needed.
async fn oidc_auth_url(
    State(s): State<App>, Called(_, call): Called, body: Bytes,
) -> Result<Response> {
    enabled(&s)?;
    let body: OidcAuthUrlBody = decode_json(&body)?;
    if body.auth_method.is_empty() {
        return Err(Error::bad("Invalid OIDC Auth URL: no AuthMethod is set"));
    }
    if body.redirect_uri.is_empty() {
        return Err(Error::bad("Invalid OIDC Auth URL: no RedirectURI is set"));
    }
    let _place = s.logins().permit(call.client).map_err(Error::Busy)?;
    let (method, _, oidc) = oidc_method(&s, &body.auth_method)?;
    let url = s
        .logins()
        .oidc_auth_url(
            &method.name,
            &oidc,
            &body.redirect_uri,
            &body.client_nonce,
            body.meta,
        )
        .await
        .map_err(flow_error)?;
    Ok(axum::Json(serde_json::json!({ "AuthURL": url })).into_response())
}

/// `POST /v1/acl/oidc/callback`: the provider's code and our state traded
/// for a token, as a login's (403 and nothing written when refused).
async fn oidc_callback(
    State(s): State<App>, Called(_, call): Called, body: Bytes,
) -> Result<Response> {
    enabled(&s)?;
    let body: OidcCallbackBody = decode_json(&body)?;
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
    let (method, checked, oidc) = oidc_method(&s, &body.auth_method)?;
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
    let (accessor, secret) = issue_token(&s, &method, &checked, &id, &meta).await?;
    shown_token(&s, &accessor, Some(&secret), true)
}

/// `GET /v1/internal/ui/oidc-auth-methods`: the `oidc` methods a log-in
/// page offers (name, type, display name only), to anyone, as Consul's.
async fn oidc_methods(State(s): State<App>) -> Result<Response> {
    let st = s.state();
    let list: Vec<serde_json::Value> = st
        .acl_auth_methods
        .values()
        .filter(|m| m.kind == "oidc")
        .map(|m| {
            serde_json::json!({
                "Name": m.name,
                "Type": m.kind,
                "DisplayName": m.display_name,
            })
        })
        .collect();
    Ok(axum::Json(list).into_response())
}
