//! `/v1/acl/auth-method*`, `/v1/acl/binding-rule*`, `/v1/acl/login` and
//! `/v1/acl/logout` (Consul's API): auth methods and their binding rules
//! kept like the other ACL objects (`acl:read`, `acl:write`), and logins
//! that trade a bearer token the method vouches for (`login`) for a
//! Consul token. A refused login writes nothing: methods and rules are
//! checked by `login` before they are proposed, a login's credential by
//! `login::Logins` before anything is.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};

use super::acl::{acl_read, acl_write, applied, check_uuid, enabled, missing, uuid};
use super::{App, Called, json_at};
use crate::endpoint::acl;
use crate::endpoint::login::{self, Op, Value};
use crate::error::{Error, Result};
use crate::login::{Method, bind};
use crate::request::authz::Authz;
use crate::request::decode_json;
use crate::server::Server;
use crate::state::{Command, keys};
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

/// A method as its request has it, written on the leader, then shown.
async fn write_method(
    s: &App, call: crate::endpoint::Call, m: AclAuthMethod, create: bool,
) -> Result<Response> {
    let name = m.name.clone();
    let object = acl::Object::AuthMethod(Box::new(m));
    acl::set(s, call, object, create).await?;
    let st = s.state();
    let m = st
        .acl_auth_methods
        .get(&name)
        .ok_or_else(|| missing("auth method"))?;
    Ok(json_at(s, acl_index(s), &**m))
}

async fn method_create(
    State(s): State<App>, Called(_, call): Called, body: Bytes,
) -> Result<Response> {
    enabled(&s)?;
    let m: AclAuthMethod = decode_json(&body)?;
    write_method(&s, call, m, true).await
}

async fn method_update(
    State(s): State<App>, Path(name): Path<String>, Called(_, call): Called, body: Bytes,
) -> Result<Response> {
    enabled(&s)?;
    let mut m: AclAuthMethod = decode_json(&body)?;
    if m.name.is_empty() {
        m.name = name.clone();
    } else if m.name != name {
        return Err(Error::bad(
            "Auth Method Name in the body does not match the URL",
        ));
    }
    write_method(&s, call, m, false).await
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
    State(s): State<App>, Path(name): Path<String>, Called(_, call): Called,
) -> Result<Response> {
    acl::delete(&s, call, acl::Deleted::AuthMethod(name)).await?;
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

/// `POST /v1/acl/login`: no token needed; the bearer token is the
/// credential. A refusal (unknown method, bad credential, no rule
/// matched) is a 403 and proposes nothing.
async fn login(State(s): State<App>, Called(_, call): Called, body: Bytes) -> Result<Response> {
    enabled(&s)?;
    let body: LoginBody = decode_json(&body)?;
    token_answer(login::call(&s, call, Op::Login(body)).await?)
}

/// `POST /v1/acl/logout`: deletes the caller's own token, which must be
/// one a login made.
async fn logout(State(s): State<App>, Called(_, call): Called) -> Result<Response> {
    login::call(&s, call, Op::Logout).await?;
    Ok(axum::Json(true).into_response())
}

/// `POST /v1/acl/oidc/auth-url`: the provider's address for a browser to
/// log in at. No token needed.
async fn oidc_auth_url(
    State(s): State<App>, Called(_, call): Called, body: Bytes,
) -> Result<Response> {
    enabled(&s)?;
    let body: OidcAuthUrlBody = decode_json(&body)?;
    match login::call(&s, call, Op::OidcAuthUrl(body)).await?.value {
        Value::AuthUrl(url) => {
            Ok(axum::Json(serde_json::json!({ "AuthURL": url })).into_response())
        }
        other => Err(Error::Internal(format!("unexpected answer {other:?}"))),
    }
}

/// `POST /v1/acl/oidc/callback`: the provider's code and our state traded
/// for a token, as a login's (403 and nothing written when refused).
async fn oidc_callback(
    State(s): State<App>, Called(_, call): Called, body: Bytes,
) -> Result<Response> {
    enabled(&s)?;
    let body: OidcCallbackBody = decode_json(&body)?;
    token_answer(login::call(&s, call, Op::OidcCallback(body)).await?)
}

/// A login's answer: the new token with its secret.
fn token_answer(a: crate::endpoint::Answer<Value>) -> Result<Response> {
    let a = a.try_map(|v| match v {
        Value::Token(t) => Ok(t),
        other => Err(Error::Internal(format!("unexpected answer {other:?}"))),
    })?;
    Ok(super::answer_json(&a))
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
