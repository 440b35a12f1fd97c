//! `/v1/acl/*`: bootstrap, tokens, policies and roles (Consul's API), the
//! server's token resolver (`request::authz::Resolve` over its state), and
//! the leader's ACL init (built-ins and the initial management token).
//!
//! The handlers decode and build; the writes run on the leader through
//! `endpoint::acl`, which checks them there. Secrets never reach the Raft
//! log: a handler makes or takes the secret, the token carries its hash
//! (the leader seals the secret in for later reads), and the secret is
//! shown once in the answer.
//!
//! Two internal reads: `/v1/internal/acl/authorizer` describes a caller's
//! own token for a client agent (`agent::acl`), and
//! `POST /v1/internal/acl/authorize` answers what a token may do (Consul's
//! UI asks it).

use std::sync::Arc;

use imbl::OrdMap;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use serde::{Deserialize, Serialize};

use super::{App, Called, json_at};
use crate::acl::{Authorizer, parse_rules};
use crate::endpoint::Call;
use crate::endpoint::acl;
use crate::error::{Error, Result};
use crate::request::authz::Authz;
use crate::request::decode_json;
use crate::server::Server;
use crate::state::{Command, keys};
use crate::structs::acl::{
    ANONYMOUS_ID, ANONYMOUS_SECRET, AUTHORIZER_PATH, AclPolicy, AclRole, AclToken,
    GLOBAL_MANAGEMENT_ID, GLOBAL_MANAGEMENT_NAME, Identities, Link, TemplateVariables,
    content_hash, management_token, secret_hash,
};
use crate::structs::duration::Duration;
use crate::structs::identity;

pub fn routes() -> Router<App> {
    Router::new()
        .route("/v1/acl/bootstrap", put(bootstrap))
        .route("/v1/acl/token", put(token_create))
        .route("/v1/acl/token/self", get(token_self))
        .route(
            "/v1/acl/token/{accessor}",
            get(token_read).put(token_update).delete(token_delete),
        )
        .route("/v1/acl/token/{accessor}/clone", put(token_clone))
        .route("/v1/acl/tokens", get(token_list))
        .route(AUTHORIZER_PATH, get(authorizer))
        .route("/v1/internal/acl/authorize", post(authorize))
        .merge(named_routes::<AclPolicy>("policies"))
        .merge(named_routes::<AclRole>("roles"))
        .route("/v1/acl/templated-policies", get(templated_list))
        .route("/v1/acl/templated-policy/name/{*name}", get(templated_read))
        .route(
            "/v1/acl/templated-policy/preview/{*name}",
            post(templated_preview),
        )
}

// ---- templated policies ----

/// A built-in template as Consul's `ACLTemplatedPolicyResponse` shows it.
fn template_json(t: &identity::Template) -> serde_json::Value {
    serde_json::json!({
        "TemplateName": t.name,
        "Schema": t.schema,
        "Template": t.template,
        "Description": t.description,
    })
}

fn template_named(name: &str) -> Result<&'static identity::Template> {
    identity::template(name)
        .ok_or_else(|| Error::NotFound(format!("Invalid templated policy Name: {name:?}")))
}

/// `GET /v1/acl/templated-policies`: every built-in template by name.
async fn templated_list(State(s): State<App>, a: Authz) -> Result<Response> {
    acl_read(&s, &a)?;
    let all: serde_json::Map<String, serde_json::Value> = identity::TEMPLATES
        .iter()
        .map(|t| (t.name.to_string(), template_json(t)))
        .collect();
    Ok(axum::Json(all).into_response())
}

/// `GET /v1/acl/templated-policy/name/:name`.
async fn templated_read(
    State(s): State<App>, a: Authz, Path(name): Path<String>,
) -> Result<Response> {
    acl_read(&s, &a)?;
    Ok(axum::Json(template_json(template_named(&name)?)).into_response())
}

/// `POST /v1/acl/templated-policy/preview/:name` with the variables as the
/// body: the synthetic policy they render to, checked as a token's would be.
async fn templated_preview(
    State(s): State<App>, a: Authz, Path(name): Path<String>, body: Bytes,
) -> Result<Response> {
    acl_read(&s, &a)?;
    let tpl = template_named(&name)?;
    let vars: TemplateVariables = if body.iter().all(u8::is_ascii_whitespace) {
        TemplateVariables::default()
    } else {
        decode_json(&body)?
    };
    let given = Identities {
        templated_policies: vec![crate::structs::acl::TemplatedPolicy {
            template_name: tpl.name.to_string(),
            template_variables: Some(vars),
            datacenters: Vec::new(),
        }],
        ..Default::default()
    };
    let checked = identity::normalize(given, Some(false)).map_err(|e| Error::bad(e.to_string()))?;
    let vars = checked.templated_policies[0].template_variables.as_ref();
    Ok(axum::Json(identity::synthetic_policy(tpl, vars)).into_response())
}

/// A named object's endpoints: `/v1/acl/<kind>` (create),
/// `/v1/acl/<kind>/:id`, `/v1/acl/<kind>/name/:name` and `/v1/acl/<plural>`.
fn named_routes<T: Named>(plural: &str) -> Router<App> {
    let one = format!("/v1/acl/{}", T::KIND.to_lowercase());
    Router::new()
        .route(&one, put(create::<T>))
        .route(
            &format!("{one}/{{id}}"),
            get(read::<T, false>).put(update::<T>).delete(delete::<T>),
        )
        .route(&format!("{one}/name/{{*name}}"), get(read::<T, true>))
        .route(&format!("/v1/acl/{plural}"), get(list::<T>))
}

/// The caller's own token, as a client agent checks it locally: its
/// accessor and its policies' rules (Consul, too, lets a token resolve the
/// policies it holds without `acl:read`). An unknown secret was refused by
/// the extractor already.
async fn authorizer(State(s): State<App>, a: Authz) -> Result<Response> {
    let st = s.state();
    let resolved = s
        .acl()
        .describe(&st, a.token())
        .map_err(|e| Error::Forbidden(e.to_string()))?;
    Ok(json_at(&s, st.index, &resolved))
}

/// One question of `POST /v1/internal/acl/authorize` (Consul's UI asks
/// what the caller may do), answered with `Allow` beside it.
#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "PascalCase")]
struct Question {
    resource: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    segment: String,
    access: String,
    #[serde(default, skip_deserializing)]
    allow: bool,
}

/// Consul's cap on the questions of one request.
const MAX_QUESTIONS: usize = 64;

/// `POST /v1/internal/acl/authorize`: the caller's token asked about each
/// resource and access level, with the checks every endpoint makes (all
/// allowed with ACLs off). An unknown resource or access level is a 400,
/// and no question is answered.
async fn authorize(a: Authz, body: Bytes) -> Result<Response> {
    let mut questions: Vec<Question> = decode_json(&body)?;
    if questions.len() > MAX_QUESTIONS {
        return Err(Error::bad(format!(
            "Refusing to authorize more than {MAX_QUESTIONS} resource requests"
        )));
    }
    for q in &mut questions {
        q.allow = allowed(&a, &q.resource, &q.segment, &q.access)?;
    }
    Ok(axum::Json(questions).into_response())
}

/// Consul's `acl.Enforce`: `access` (any case) on `resource`, `segment`
/// naming the key, service, node... where the resource has names.
fn allowed(a: &Authorizer, resource: &str, segment: &str, access: &str) -> Result<bool> {
    let access_lower = access.to_ascii_lowercase();
    let bad_access = || {
        Error::bad(format!(
            "Invalid access level for {resource} resource: {access}"
        ))
    };
    if resource == "key" {
        return match access_lower.as_str() {
            "list" => Ok(a.key_list(segment)),
            "write-prefix" => Ok(a.key_write_prefix(segment)),
            "read" => Ok(a.key_read(segment)),
            "write" => Ok(a.key_write(segment)),
            _ => Err(bad_access()),
        };
    }
    let (read, write) = match resource {
        "acl" => (a.acl_read(), a.acl_write()),
        "agent" => (a.agent_read(segment), a.agent_write(segment)),
        "event" => (a.event_read(segment), a.event_write(segment)),
        "intention" => (a.intention_read(segment), a.intention_write(segment)),
        "keyring" => (a.keyring_read(), a.keyring_write()),
        "mesh" => (a.mesh_read(), a.mesh_write()),
        "node" => (a.node_read(segment), a.node_write(segment)),
        "operator" => (a.operator_read(), a.operator_write()),
        "peering" => (a.peering_read(), a.peering_write()),
        "query" => (a.query_read(segment), a.query_write(segment)),
        "service" => (a.service_read(segment), a.service_write(segment)),
        "session" => (a.session_read(segment), a.session_write(segment)),
        _ => {
            return Err(Error::bad(format!(
                "Invalid ACL resource requested: {resource:?}"
            )));
        }
    };
    match access_lower.as_str() {
        "read" => Ok(read),
        "write" => Ok(write),
        _ => Err(bad_access()),
    }
}

pub use crate::endpoint::acl::{applied, enabled, now_rfc3339, rfc3339, uuid};

pub(super) fn acl_read(s: &Server, a: &Authz) -> Result<()> {
    enabled(s)?;
    a.require(a.acl_read(), "acl:read", "")
}

pub(super) fn acl_write(s: &Server, a: &Authz) -> Result<()> {
    enabled(s)?;
    a.require(a.acl_write(), "acl:write", "")
}

/// A token that does not exist (read, cloned, or named by its secret):
/// Consul's RPC refuses it (403), as py-consul's suite sees of Consul 1.20+.
fn not_found() -> Error {
    Error::Forbidden("ACL not found".into())
}

/// A policy or role read by ID or name that does not exist: 404, in
/// Consul's words since 1.17 (before, 403 `ACL not found`).
pub(super) fn missing(kind: &str) -> Error {
    Error::NotFound(format!("Requested {kind} does not exist: ACL not found"))
}

// ---- bootstrap ----

async fn bootstrap(State(s): State<App>, body: Bytes) -> Result<Response> {
    enabled(&s)?;
    // Consul takes a secret of the caller's choosing (py-consul's
    // `bootstrap(bootstrap_secret=)`).
    #[derive(Deserialize, Default)]
    #[serde(default)]
    struct Body {
        #[serde(rename = "BootstrapSecret")]
        secret: String,
    }
    let body: Body = if body.iter().all(u8::is_ascii_whitespace) {
        Body::default()
    } else {
        decode_json(&body)?
    };
    let secret = if body.secret.is_empty() {
        uuid()
    } else {
        check_uuid("BootstrapSecret", &body.secret)?;
        body.secret
    };
    let mut token = Box::new(management_token(
        "Bootstrap Token (Global Management)",
        &secret,
    ));
    s.seal_secret(&mut token, &secret);
    let accessor = token.accessor_id.clone();
    // Consul's reset procedure: the operator writes the reset index the
    // refusal reported into this file in the leader's data dir; one more
    // bootstrap is then allowed, and the file goes.
    let reset_file = s.config().data_dir.join(BOOTSTRAP_RESET_FILE);
    let reset_index = read_reset_index(&reset_file)?;
    let cmd = match reset_index {
        Some(reset_index) => Command::AclBootstrapReset { token, reset_index },
        None => Command::AclBootstrap { token },
    };
    applied(s.write(cmd).await?)?;
    if reset_index.is_some()
        && let Err(e) = std::fs::remove_file(&reset_file)
    {
        tracing::warn!(file = %reset_file.display(), error = %e, "could not remove the ACL bootstrap reset file");
    }
    shown_token(&s, &accessor, Some(&secret), true)
}

/// The file (in the data dir) whose index allows one more bootstrap.
pub const BOOTSTRAP_RESET_FILE: &str = "acl-bootstrap-reset";

/// The reset index the operator wrote, if the file is there.
fn read_reset_index(path: &std::path::Path) -> Result<Option<u64>> {
    match std::fs::read_to_string(path) {
        Ok(text) => text.trim().parse().map(Some).map_err(|_| {
            Error::BadRequest(format!(
                "Invalid reset index in {}: {:?}",
                path.display(),
                text.trim()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::Internal(format!("{}: {e}", path.display()))),
    }
}

/// A token as the state holds it now, with its secret if the caller knows it.
pub(super) fn shown_token(
    s: &Server, accessor: &str, secret: Option<&str>, writer: bool,
) -> Result<Response> {
    let st = s.state();
    let t = st.acl_tokens.get(accessor).ok_or_else(not_found)?;
    let index = st.index_of([&keys::ACL]);
    let opened = if secret.is_none() && writer {
        visible_secret(s, t)
    } else {
        None
    };
    Ok(json_at(s, index, &t.shown(secret.or(opened.as_deref()))))
}

/// The secret Consul shows a caller with `acl:write` (the caller checks
/// that): the anonymous token's well-known one, another's where this
/// server's seal opens it (`acl::seal`); else `<hidden>` stays.
fn visible_secret(s: &Server, t: &AclToken) -> Option<String> {
    if t.accessor_id == ANONYMOUS_ID {
        return Some(ANONYMOUS_SECRET.to_string());
    }
    s.open_secret(t)
}

/// The token `accessor` as the state holds it now.
fn stored_token(s: &Server, accessor: &str) -> Option<Arc<AclToken>> {
    s.state().acl_tokens.get(accessor).cloned()
}

/// Writes `token` on the leader, its `secret` (when the caller gave or was
/// given it) sealed in for later reads; answers with it as an `acl:write`
/// caller sees it.
async fn set_token(
    s: &App, call: Call, token: AclToken, secret: Option<&str>, create: bool,
) -> Result<Response> {
    let accessor = token.accessor_id.clone();
    let object = acl::Object::Token {
        token: Box::new(token),
        secret: secret.map(str::to_string),
    };
    acl::set(s, call, object, create).await?;
    shown_token(s, &accessor, secret, true)
}

// ---- tokens ----

/// A token create or update body (Consul's `ACLToken` fields a caller sets).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
struct TokenBody {
    #[serde(rename = "AccessorID")]
    accessor_id: String,
    #[serde(rename = "SecretID")]
    secret_id: String,
    description: String,
    policies: Vec<Link>,
    roles: Vec<Link>,
    #[serde(flatten)]
    identities: Identities,
    local: bool,
    expiration_time: String,
    #[serde(rename = "ExpirationTTL")]
    expiration_ttl: Option<Duration>,
}

/// The token `body` makes of `base` (its links resolved, its hash made,
/// on the leader: `endpoint::acl`).
fn build_token(body: &TokenBody, base: AclToken) -> Result<AclToken> {
    let (policies, roles) = (body.policies.clone(), body.roles.clone());
    let identities = identity::normalize(body.identities.clone(), Some(body.local))
        .map_err(|e| Error::bad(e.to_string()))?;
    let mut t = AclToken {
        description: body.description.clone(),
        policies,
        roles,
        identities,
        local: body.local,
        ..base
    };
    if let Some(ttl) = &body.expiration_ttl {
        if ttl.nanos() <= 0 {
            return Err(Error::bad("Token Expiration TTL must be positive"));
        }
        t.expiration_time =
            rfc3339(time::OffsetDateTime::now_utc() + time::Duration::nanoseconds(ttl.nanos()));
    } else if !body.expiration_time.is_empty() {
        t.expiration_time = body.expiration_time.clone();
        if crate::state::token_resolver::expiry(&t).is_none() {
            return Err(Error::bad("Invalid ExpirationTime: not RFC 3339"));
        }
    }
    Ok(t)
}

pub(super) fn check_uuid(what: &str, v: &str) -> Result<()> {
    uuid::Uuid::parse_str(v)
        .map(|_| ())
        .map_err(|_| Error::bad(format!("Invalid {what}: must be a UUID")))
}

async fn token_create(
    State(s): State<App>, Called(_, call): Called, body: Bytes,
) -> Result<Response> {
    enabled(&s)?;
    let body: TokenBody = decode_json(&body)?;
    let accessor = if body.accessor_id.is_empty() {
        uuid()
    } else {
        check_uuid("AccessorID", &body.accessor_id)?;
        body.accessor_id.clone()
    };
    let secret = if body.secret_id.is_empty() {
        uuid()
    } else {
        check_uuid("SecretID", &body.secret_id)?;
        body.secret_id.clone()
    };
    let base = AclToken {
        accessor_id: accessor,
        secret_hash: secret_hash(&secret),
        create_time: now_rfc3339(),
        ..Default::default()
    };
    let token = build_token(&body, base)?;
    set_token(&s, call, token, Some(&secret), true).await
}

async fn token_read(
    State(s): State<App>, a: Authz, Path(accessor): Path<String>,
) -> Result<Response> {
    acl_read(&s, &a)?;
    shown_token(&s, &accessor, None, a.acl_write())
}

async fn token_self(
    State(s): State<App>, a: Authz, parts: axum::http::request::Parts,
) -> Result<Response> {
    enabled(&s)?;
    // Resolving it (`Authz`) proved the token valid; the caller knows it.
    let secret = crate::request::authz::token_of(&parts.headers, parts.uri.query());
    let st = s.state();
    let t = match &secret {
        Some(sec) => crate::state::acl::token_by_secret_hash(&st, &secret_hash(sec)),
        None => st.acl_tokens.get(ANONYMOUS_ID),
    }
    .ok_or_else(not_found)?;
    debug_assert_eq!(t.accessor_id, a.accessor());
    Ok(json_at(
        &s,
        st.index_of([&keys::ACL]),
        &t.shown(secret.as_deref()),
    ))
}

async fn token_update(
    State(s): State<App>, a: Authz, Path(accessor): Path<String>, Called(_, call): Called,
    body: Bytes,
) -> Result<Response> {
    // Checked before the stored token is read: its existence is no one
    // else's to learn.
    acl_write(&s, &a)?;
    let body: TokenBody = decode_json(&body)?;
    let existing = stored_token(&s, &accessor)
        .ok_or_else(|| Error::bad(format!("Cannot find token {accessor:?}")))?;
    if !body.accessor_id.is_empty() && body.accessor_id != accessor {
        return Err(Error::bad("AccessorID in the body does not match the URL"));
    }
    if !body.secret_id.is_empty() && secret_hash(&body.secret_id) != existing.secret_hash {
        return Err(Error::bad("Changing a token's SecretID is not allowed"));
    }
    // Consul's rule: a local token stays local (a secondary's would
    // otherwise become a global token its replication deletes), a global
    // one global.
    if body.local != existing.local {
        return Err(Error::bad(format!(
            "Cannot toggle local mode of {accessor}"
        )));
    }
    let token = build_token(&body, (*existing).clone())?;
    let secret = (!body.secret_id.is_empty()).then_some(body.secret_id.as_str());
    set_token(&s, call, token, secret, false).await
}

async fn token_delete(
    State(s): State<App>, Path(accessor): Path<String>, Called(_, call): Called,
) -> Result<Response> {
    acl::delete(&s, call, acl::Deleted::Token(accessor)).await?;
    Ok(axum::Json(true).into_response())
}

async fn token_clone(
    State(s): State<App>, a: Authz, Path(accessor): Path<String>, Called(_, call): Called,
    body: Bytes,
) -> Result<Response> {
    acl_write(&s, &a)?;
    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase", default)]
    struct CloneBody {
        description: Option<String>,
    }
    let body: CloneBody = if body.is_empty() {
        CloneBody::default()
    } else {
        decode_json(&body)?
    };
    let existing = stored_token(&s, &accessor).ok_or_else(not_found)?;
    let secret = uuid();
    let token = AclToken {
        accessor_id: uuid(),
        secret_hash: secret_hash(&secret),
        // Its own secret is sealed as it is written, never the original's.
        sealed_secret: String::new(),
        create_time: now_rfc3339(),
        description: body
            .description
            .unwrap_or_else(|| existing.description.clone()),
        ..(*existing).clone()
    };
    set_token(&s, call, token, Some(&secret), true).await
}

/// `GET /v1/acl/tokens`, with Consul's filters: `?policy=ID` (tokens that
/// link the policy themselves), `?role=ID` (tokens that link the role),
/// `?authmethod=` (tokens its logins made), one at a time.
async fn token_list(State(s): State<App>, a: Authz, RawQuery(q): RawQuery) -> Result<Response> {
    acl_read(&s, &a)?;
    let p = crate::request::Params::parse(q.as_deref());
    let given = |k| p.get(k).filter(|v| !v.is_empty());
    let (policy, role, method) = (given("policy"), given("role"), given("authmethod"));
    if [policy, role, method].iter().flatten().count() > 1 {
        return Err(Error::bad(
            "Can only filter by one of policy, role, or authmethod at a time",
        ));
    }
    let links = |l: &[Link], id: &str| l.iter().any(|x| x.id == id);
    let st = s.state();
    let list: Vec<AclToken> = st
        .acl_tokens
        .values()
        .filter(|t| policy.is_none_or(|id| links(&t.policies, id)))
        .filter(|t| role.is_none_or(|id| links(&t.roles, id)))
        .filter(|t| method.is_none_or(|m| t.auth_method == m))
        .map(|t| {
            let secret = a.acl_write().then(|| visible_secret(&s, t)).flatten();
            t.shown(secret.as_deref())
        })
        .collect();
    Ok(json_at(&s, st.index_of([&keys::ACL]), &list))
}

// ---- policies ----

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
struct PolicyBody {
    #[serde(rename = "ID")]
    id: String,
    name: String,
    description: String,
    rules: String,
    datacenters: Vec<String>,
}

/// A policy's or role's name, checked (`structs::acl::valid_name`).
pub(super) fn valid_name(what: &str, name: &str) -> Result<()> {
    if crate::structs::acl::valid_name(name) {
        Ok(())
    } else {
        Err(Error::bad(format!("Invalid {what} Name: {name:?}")))
    }
}

fn build_policy(
    _: &Server, body: PolicyBody, id: String, existing: Option<&AclPolicy>,
) -> Result<AclPolicy> {
    if id == GLOBAL_MANAGEMENT_ID {
        if body.name != GLOBAL_MANAGEMENT_NAME {
            return Err(Error::bad(
                "Changing the Name of the builtin global-management policy is not permitted",
            ));
        }
        if existing.is_some_and(|e| e.rules != body.rules) {
            return Err(Error::bad(
                "Changing the Rules for the builtin global-management policy is not permitted",
            ));
        }
    }
    valid_name("Policy", &body.name)?;
    parse_rules(&body.rules).map_err(|e| Error::bad(format!("Invalid Policy: {e}")))?;
    let hash = content_hash(&[&body.name, &body.rules, &body.datacenters.join(",")]);
    Ok(AclPolicy {
        id,
        name: body.name,
        description: body.description,
        rules: body.rules,
        datacenters: body.datacenters,
        hash,
        ..Default::default()
    })
}

// ---- roles ----

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
struct RoleBody {
    #[serde(rename = "ID")]
    id: String,
    name: String,
    description: String,
    policies: Vec<Link>,
    #[serde(flatten)]
    identities: Identities,
}

fn build_role(_: &Server, body: RoleBody, id: String, _: Option<&AclRole>) -> Result<AclRole> {
    valid_name("Role", &body.name)?;
    let identities =
        identity::normalize(body.identities, None).map_err(|e| Error::bad(e.to_string()))?;
    // Its policies resolved and its hash made on the leader
    // (`endpoint::acl`).
    Ok(AclRole {
        id,
        name: body.name,
        description: body.description,
        policies: body.policies,
        identities,
        ..Default::default()
    })
}

/// Policies and roles: named ACL objects with the same endpoints, the
/// same checks and the same answers, told apart only by these.
trait Named: serde::Serialize + Sized + Send + Sync + 'static {
    /// "Policy" or "Role", as Consul's messages name it.
    const KIND: &'static str;
    type Body: serde::de::DeserializeOwned + Send;
    /// The body's `ID` and `Name`.
    fn body_keys(body: &Self::Body) -> (&str, &str);
    fn name(&self) -> &str;
    /// The state's table of these objects, by ID.
    fn table(st: &crate::state::State) -> &OrdMap<String, Arc<Self>>;
    /// The object `body` makes under `id` (`existing`: what it replaces).
    fn build(s: &Server, body: Self::Body, id: String, existing: Option<&Self>) -> Result<Self>;
    /// What the endpoint layer writes and deletes.
    fn object(self) -> acl::Object;
    fn deleted(id: String) -> acl::Deleted;

    fn get<'a>(st: &'a crate::state::State, id: &str) -> Option<&'a Arc<Self>> {
        Self::table(st).get(id)
    }
    fn by_name<'a>(st: &'a crate::state::State, name: &str) -> Option<&'a Arc<Self>> {
        Self::table(st).values().find(|x| x.name() == name)
    }
    fn all(st: &crate::state::State) -> Vec<&Self> {
        Self::table(st).values().map(|x| &**x).collect()
    }
}

/// `Named` for an ACL object whose body and object both have `id` and
/// `name`: its kind, body type, table in the state, builder and
/// commands (a macro, as the two impls differ only in these names).
macro_rules! named {
    ($t:ty, $kind:literal, $body:ty, $table:ident, $build:path, $variant:ident) => {
        impl Named for $t {
            const KIND: &'static str = $kind;
            type Body = $body;
            fn body_keys(body: &$body) -> (&str, &str) {
                (&body.id, &body.name)
            }
            fn name(&self) -> &str {
                &self.name
            }
            fn table(st: &crate::state::State) -> &OrdMap<String, Arc<Self>> {
                &st.$table
            }
            fn build(s: &Server, body: $body, id: String, existing: Option<&Self>) -> Result<Self> {
                $build(s, body, id, existing)
            }
            fn object(self) -> acl::Object {
                acl::Object::$variant(Box::new(self))
            }
            fn deleted(id: String) -> acl::Deleted {
                acl::Deleted::$variant(id)
            }
        }
    };
}

fn shown<T: Named>(s: &Server, found: Option<&Arc<T>>) -> Result<Response> {
    let found = found.ok_or_else(|| missing(&T::KIND.to_lowercase()))?;
    Ok(json_at(s, s.state().index_of([&keys::ACL]), &**found))
}

async fn create<T: Named>(
    State(s): State<App>, Called(_, call): Called, body: Bytes,
) -> Result<Response> {
    enabled(&s)?;
    let body: T::Body = decode_json(&body)?;
    let (body_id, _) = T::body_keys(&body);
    if !body_id.is_empty() {
        return Err(Error::bad(format!(
            "Cannot specify an ID in a {} create",
            T::KIND.to_lowercase()
        )));
    }
    let id = uuid();
    let object = T::build(&s, body, id.clone(), None)?.object();
    acl::set(&s, call, object, true).await?;
    shown(&s, T::get(&s.state(), &id))
}

/// One object by ID, or with `BY_NAME` by name.
async fn read<T: Named, const BY_NAME: bool>(
    State(s): State<App>, a: Authz, Path(key): Path<String>,
) -> Result<Response> {
    acl_read(&s, &a)?;
    let st = s.state();
    let found = if BY_NAME {
        T::by_name(&st, &key)
    } else {
        // Consul's lookup by ID takes only a UUID (anything else is its
        // index's error, not "no such policy").
        check_uuid(&format!("{} ID", T::KIND), &key)?;
        T::get(&st, &key)
    };
    shown(&s, found)
}

async fn update<T: Named>(
    State(s): State<App>, a: Authz, Path(id): Path<String>, Called(_, call): Called, body: Bytes,
) -> Result<Response> {
    acl_write(&s, &a)?;
    let body: T::Body = decode_json(&body)?;
    let (body_id, _) = T::body_keys(&body);
    if !body_id.is_empty() && body_id != id {
        return Err(Error::bad(format!(
            "{} ID in the body does not match the URL",
            T::KIND
        )));
    }
    let object = {
        let st = s.state();
        let existing = T::get(&st, &id)
            .ok_or_else(|| Error::bad(format!("Cannot find {} {id:?}", T::KIND.to_lowercase())))?;
        T::build(&s, body, id.clone(), Some(existing))?.object()
    };
    acl::set(&s, call, object, false).await?;
    shown(&s, T::get(&s.state(), &id))
}

async fn delete<T: Named>(
    State(s): State<App>, Path(id): Path<String>, Called(_, call): Called,
) -> Result<Response> {
    acl::delete(&s, call, T::deleted(id)).await?;
    Ok(axum::Json(true).into_response())
}

async fn list<T: Named>(State(s): State<App>, a: Authz) -> Result<Response> {
    acl_read(&s, &a)?;
    let st = s.state();
    Ok(json_at(&s, st.index_of([&keys::ACL]), &T::all(&st)))
}

named!(
    AclPolicy,
    "Policy",
    PolicyBody,
    acl_policies,
    build_policy,
    Policy
);
named!(AclRole, "Role", RoleBody, acl_roles, build_role, Role);
