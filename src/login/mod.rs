//! Logging in through an auth method: the method's config checked as it
//! is written (`Method::parse`), a bearer token checked against it
//! (`Logins::identify`: a JWT's signature and claims, or Kubernetes'
//! TokenReview), and the identity bound to a token's identities, roles
//! and policies by the method's binding rules (`bind`).
//!
//! Only `identify` does I/O (fetching a JWKS, asking the TokenReview API),
//! always from the address the method's config names, never one a token
//! carries, with a bounded wait and a bounded answer.
//!
//! - `Method::parse` checks a method's `Config` on write, as Consul's: one
//!   key source, keys that parse, algorithms ring verifies.
//! - `jwt`: `exp`, `nbf` and `iat` with Consul's leeways. `kubernetes`:
//!   TokenReview at the method's `Host`.
//! - `oidc`: `auth-url` keeps a state, nonce and PKCE verifier for one use,
//!   10 minutes, at most 1,024 waiting, on the leader (both steps are
//!   forwarded to it). `callback` also adds the userinfo endpoint's claims.
//! - `bind`: `${var}` is interpolated into `BindName`, then checked as a
//!   name of its type.
//! - `Logins`, the server's: JWKS and discovery documents are fetched only
//!   from the configured URL with its CA, within 5 s and 1 MiB, cached an
//!   hour, and fetched again for an unknown `kid` at most once a second.
//!   At most 64 logins are in flight per server, a quarter of them per
//!   client IP.
//!
//! A credential is checked by `identify` before anything is proposed. The
//! token a login makes is an ordinary `Command::AclTokenSet` with its
//! `AuthMethod`, refused at apply if the method was deleted meanwhile
//! (`state::acl::links_exist`).

pub mod bind;
pub mod jwt;
pub mod kubernetes;
pub mod oidc;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration as StdDuration, Instant};

use serde::Deserialize;
use serde_json::Value;

use crate::filter::Schema;
use crate::structs::auth::{AclAuthMethod, TYPES};
use crate::structs::duration::Duration;
use bind::Identity;
use jwt::KeyEntry;

/// The longest wait for a key server or a TokenReview API.
pub const FETCH_TIMEOUT: StdDuration = StdDuration::from_secs(5);
/// The largest answer read from one.
pub const MAX_FETCHED: usize = 1024 * 1024;
/// A JWKS is fetched again for an unknown `kid` at most this often.
const REFETCH_EVERY: StdDuration = StdDuration::from_secs(1);
/// And kept this long at most.
const KEYS_TTL: StdDuration = StdDuration::from_secs(3600);

/// A `jwt` method's `Config`, with Consul's field names.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JwtConfig {
    #[serde(rename = "JWKSURL")]
    pub jwks_url: String,
    #[serde(rename = "JWKSCACert")]
    pub jwks_ca_cert: String,
    #[serde(rename = "JWTValidationPubKeys")]
    pub pub_keys: Vec<String>,
    #[serde(rename = "OIDCDiscoveryURL")]
    pub discovery_url: String,
    #[serde(rename = "OIDCDiscoveryCACert")]
    pub discovery_ca_cert: String,
    #[serde(rename = "BoundIssuer")]
    pub bound_issuer: String,
    #[serde(rename = "BoundAudiences")]
    pub bound_audiences: Vec<String>,
    #[serde(rename = "JWTSupportedAlgs")]
    pub algs: Vec<String>,
    /// Claim (a name, or a JSON pointer `/a/b`) → the field it becomes.
    #[serde(rename = "ClaimMappings")]
    pub claim_mappings: BTreeMap<String, String>,
    #[serde(rename = "ListClaimMappings")]
    pub list_claim_mappings: BTreeMap<String, String>,
    #[serde(rename = "ExpirationLeeway")]
    pub expiration_leeway: Duration,
    #[serde(rename = "NotBeforeLeeway")]
    pub not_before_leeway: Duration,
    #[serde(rename = "ClockSkewLeeway")]
    pub clock_skew_leeway: Duration,
}

/// A `kubernetes` method's `Config`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KubernetesConfig {
    #[serde(rename = "Host")]
    pub host: String,
    #[serde(rename = "CACert")]
    pub ca_cert: String,
    /// The reviewer's token; empty: the login's own token reviews itself.
    #[serde(rename = "ServiceAccountJWT")]
    pub service_account_jwt: String,
}

/// Where a `jwt` method's keys come from.
#[derive(Debug, Clone)]
pub enum KeySource {
    Static(Arc<Vec<KeyEntry>>),
    Jwks { url: String, ca: String },
    Discovery { url: String, ca: String },
}

/// A checked `jwt` method.
#[derive(Debug, Clone)]
pub struct JwtMethod {
    pub config: JwtConfig,
    pub keys: KeySource,
    pub algs: Vec<String>,
}

/// An auth method's config, checked.
#[derive(Debug, Clone)]
pub enum Method {
    Jwt(Box<JwtMethod>),
    Kubernetes(KubernetesConfig),
    Oidc(Box<OidcMethod>),
}

/// A checked `oidc` method.
#[derive(Debug, Clone)]
pub struct OidcMethod {
    pub config: oidc::OidcConfig,
    pub algs: Vec<String>,
}

fn config<T: serde::de::DeserializeOwned>(m: &AclAuthMethod) -> Result<T, String> {
    serde_json::from_value(Value::Object(m.config.clone()))
        .map_err(|e| format!("Invalid Auth Method: error decoding config: {e}"))
}

fn https_url(what: &str, url: &str) -> Result<(), String> {
    match url.split_once("://") {
        Some(("https" | "http", rest)) if !rest.is_empty() => Ok(()),
        _ => Err(format!(
            "Invalid Auth Method: {what} {url:?} is not an http(s) URL"
        )),
    }
}

impl Method {
    /// The method's config checked as Consul checks it on write.
    pub fn parse(m: &AclAuthMethod) -> Result<Method, String> {
        match m.kind.as_str() {
            "jwt" => {
                let c: JwtConfig = config(m)?;
                let set = [
                    !c.jwks_url.is_empty(),
                    !c.pub_keys.is_empty(),
                    !c.discovery_url.is_empty(),
                ];
                if set.iter().filter(|x| **x).count() != 1 {
                    return Err("Invalid Auth Method: exactly one of 'JWTValidationPubKeys', 'JWKSURL', or 'OIDCDiscoveryURL' must be set".into());
                }
                if !c.jwks_ca_cert.is_empty() && c.jwks_url.is_empty() {
                    return Err("Invalid Auth Method: 'JWKSCACert' should not be set unless 'JWKSURL' is set".into());
                }
                if !c.discovery_ca_cert.is_empty() && c.discovery_url.is_empty() {
                    return Err("Invalid Auth Method: 'OIDCDiscoveryCACert' should not be set unless 'OIDCDiscoveryURL' is set".into());
                }
                let ca_ok = |ca: &str| {
                    crate::tls::ca_client_config(Some(ca))
                        .map(|_| ())
                        .map_err(|e| format!("Invalid Auth Method: {e}"))
                };
                let keys = if !c.pub_keys.is_empty() {
                    let mut keys = Vec::new();
                    for (i, pem) in c.pub_keys.iter().enumerate() {
                        let key = jwt::parse_pem_key(pem).map_err(|e| {
                            format!("Invalid Auth Method: error parsing public key JWTValidationPubKeys[{i}]: {e}")
                        })?;
                        keys.push(KeyEntry { kid: None, key });
                    }
                    KeySource::Static(Arc::new(keys))
                } else if !c.jwks_url.is_empty() {
                    https_url("JWKSURL", &c.jwks_url)?;
                    if !c.jwks_ca_cert.is_empty() {
                        ca_ok(&c.jwks_ca_cert)?;
                    }
                    KeySource::Jwks {
                        url: c.jwks_url.clone(),
                        ca: c.jwks_ca_cert.clone(),
                    }
                } else {
                    https_url("OIDCDiscoveryURL", &c.discovery_url)?;
                    if !c.discovery_ca_cert.is_empty() {
                        ca_ok(&c.discovery_ca_cert)?;
                    }
                    KeySource::Discovery {
                        url: c.discovery_url.clone(),
                        ca: c.discovery_ca_cert.clone(),
                    }
                };
                let algs = algorithms(&c.algs)?;
                check_mappings(&c.claim_mappings, &c.list_claim_mappings)?;
                Ok(Method::Jwt(Box::new(JwtMethod {
                    config: c,
                    keys,
                    algs,
                })))
            }
            "kubernetes" => {
                let c: KubernetesConfig = config(m)?;
                if c.host.is_empty() {
                    return Err("Invalid Auth Method: Host is required".into());
                }
                https_url("Host", &c.host)?;
                if c.ca_cert.is_empty() {
                    return Err("Invalid Auth Method: CACert is required".into());
                }
                crate::tls::ca_client_config(Some(&c.ca_cert))
                    .map_err(|e| format!("Invalid Auth Method: CACert: {e}"))?;
                if !c.service_account_jwt.is_empty() {
                    jwt::decode(&c.service_account_jwt)
                        .map_err(|e| format!("Invalid Auth Method: ServiceAccountJWT: {e}"))?;
                }
                Ok(Method::Kubernetes(c))
            }
            "oidc" => {
                let c: oidc::OidcConfig = config(m)?;
                c.check()?;
                let algs = algorithms(&c.algs)?;
                check_mappings(&c.claim_mappings, &c.list_claim_mappings)?;
                Ok(Method::Oidc(Box::new(OidcMethod { config: c, algs })))
            }
            other => Err(format!(
                "Invalid Auth Method: Type should be one of: {:?}, not {other:?}",
                TYPES
            )),
        }
    }

    /// The fields a binding rule's selector may name.
    pub fn fields(&self) -> &'static Schema {
        match self {
            Method::Jwt(_) | Method::Oidc(_) => &bind::JWT_FIELDS,
            Method::Kubernetes(_) => &bind::KUBERNETES_FIELDS,
        }
    }

    /// The variables a bind name may interpolate.
    pub fn var_names(&self) -> Vec<String> {
        match self {
            Method::Jwt(j) => mapped_vars(&j.config.claim_mappings),
            Method::Oidc(o) => mapped_vars(&o.config.claim_mappings),
            Method::Kubernetes(_) => kubernetes::VARS.iter().map(|v| v.to_string()).collect(),
        }
    }
}

fn mapped_vars(m: &BTreeMap<String, String>) -> Vec<String> {
    m.values().map(|v| format!("value.{v}")).collect()
}

/// A method's signing algorithms (RS256 when none is given), each one
/// cairn can check.
fn algorithms(given: &[String]) -> Result<Vec<String>, String> {
    let algs = if given.is_empty() {
        vec![jwt::DEFAULT_ALGORITHM.to_string()]
    } else {
        given.to_vec()
    };
    if let Some(a) = algs.iter().find(|a| !jwt::ALGORITHMS.contains(&a.as_str())) {
        return Err(format!(
            "Invalid Auth Method: unsupported signing algorithm {a:?} (one of {})",
            jwt::ALGORITHMS.join(", ")
        ));
    }
    Ok(algs)
}

/// Claim mappings' targets: names, each used once.
fn check_mappings(
    claims: &BTreeMap<String, String>, lists: &BTreeMap<String, String>,
) -> Result<(), String> {
    let mut targets = std::collections::BTreeSet::new();
    for name in claims.values().chain(lists.values()) {
        if name.is_empty()
            || !name
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-')
        {
            return Err(format!(
                "Invalid Auth Method: invalid claim mapping target {name:?}"
            ));
        }
        if !targets.insert(name.clone()) {
            return Err(format!(
                "Invalid Auth Method: claim mapping target {name:?} used more than once"
            ));
        }
    }
    Ok(())
}

/// Consul's default leeways (seconds): a zero takes the default, a
/// negative disables it.
fn leeway(d: Duration, default: i64) -> i64 {
    match d.nanos() {
        0 => default,
        n if n < 0 => 0,
        n => n / 1_000_000_000,
    }
}

/// The claim a mapping names: a top-level name, or a JSON pointer.
fn claim<'a>(claims: &'a serde_json::Map<String, Value>, key: &str) -> Option<&'a Value> {
    let Some(path) = key.strip_prefix('/') else {
        return claims.get(key);
    };
    let mut parts = path
        .split('/')
        .map(|p| p.replace("~1", "/").replace("~0", "~"));
    let mut cur = claims.get(&parts.next()?)?;
    for p in parts {
        cur = cur.get(&p)?;
    }
    Some(cur)
}

fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A verified JWT's claims as the method maps them. As Consul's: every
/// mapped name is a variable (blank when the claim is absent), but only
/// the claims present are selectable, so `"x" in value` tells them apart.
fn jwt_identity(
    mappings: &BTreeMap<String, String>, list_mappings: &BTreeMap<String, String>,
    claims: &serde_json::Map<String, Value>,
) -> Result<Identity, String> {
    let mut value = serde_json::Map::new();
    let mut vars = BTreeMap::new();
    for (key, name) in mappings {
        vars.insert(format!("value.{name}"), String::new());
        if let Some(v) = claim(claims, key) {
            let v = scalar(v).ok_or_else(|| format!("claim {key:?} is not a string"))?;
            vars.insert(format!("value.{name}"), v.clone());
            value.insert(name.clone(), Value::String(v));
        }
    }
    let mut list = serde_json::Map::new();
    for (key, name) in list_mappings {
        let not_list = || format!("claim {key:?} is not a list of strings");
        let items: Vec<Value> = match claim(claims, key) {
            None => continue,
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| scalar(x).map(Value::String))
                .collect::<Option<_>>()
                .ok_or_else(not_list)?,
            Some(v) => vec![Value::String(scalar(v).ok_or_else(not_list)?)],
        };
        list.insert(name.clone(), Value::Array(items));
    }
    Ok(Identity {
        fields: serde_json::json!({"value": value, "list": list}),
        vars,
    })
}

struct CachedKeys {
    source: String,
    keys: Arc<Vec<KeyEntry>>,
    fetched: Instant,
}

/// Logins being checked at once on one server; past it, 429.
pub const MAX_LOGINS_IN_FLIGHT: usize = 64;
/// Of them, from one client IP (a quarter), so one caller cannot take them all.
pub const MAX_LOGINS_PER_CLIENT: usize = MAX_LOGINS_IN_FLIGHT / 4;

/// A login's place: one of the server's, and one of its client's.
pub struct LoginPlace {
    _place: tokio::sync::OwnedSemaphorePermit,
    _share: Option<crate::shares::Share<std::net::IpAddr>>,
}

/// The servers' login checker: a cache of fetched key sets per method,
/// and the bound on logins checked at once (each may wait on a key
/// server or a TokenReview API).
pub struct Logins {
    keys: parking_lot::Mutex<HashMap<String, CachedKeys>>,
    in_flight: Arc<tokio::sync::Semaphore>,
    per_client: Arc<crate::shares::Shares<std::net::IpAddr>>,
    pending: oidc::PendingLogins,
}

impl Default for Logins {
    fn default() -> Self {
        Logins {
            keys: Default::default(),
            in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_LOGINS_IN_FLIGHT)),
            per_client: Arc::default(),
            pending: Default::default(),
        }
    }
}

/// Why a credential is refused (the caller sees a 403 with it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

impl Logins {
    /// A place for one login from `client` (none known: only the
    /// server's bound), or why there is none.
    pub fn permit(&self, client: Option<std::net::IpAddr>) -> Result<LoginPlace, String> {
        let share = match client {
            Some(ip) => Some(self.per_client.take(ip, MAX_LOGINS_PER_CLIENT).ok_or_else(|| {
                format!("too many logins in flight from {ip} (at most {MAX_LOGINS_PER_CLIENT}); retry")
            })?),
            None => None,
        };
        let place = self.in_flight.clone().try_acquire_owned().map_err(|_| {
            format!("too many logins in flight (at most {MAX_LOGINS_IN_FLIGHT}); retry")
        })?;
        Ok(LoginPlace {
            _place: place,
            _share: share,
        })
    }

    /// Checks `bearer` against `method`, answering who it proves the
    /// caller is.
    pub async fn identify(
        &self, name: &str, method: &Method, bearer: &str,
    ) -> Result<Identity, Refused> {
        if bearer.len() > jwt::MAX_TOKEN_LEN {
            return Err(Refused(jwt::JwtError::TooLarge(bearer.len()).to_string()));
        }
        match method {
            Method::Jwt(j) => self.identify_jwt(name, j, bearer).await,
            Method::Kubernetes(k) => kubernetes::review(k, bearer).await.map_err(Refused),
            Method::Oidc(_) => Err(Refused(
                "an oidc auth method logs in through /v1/acl/oidc/auth-url and /v1/acl/oidc/callback, not with a bearer token".into(),
            )),
        }
    }

    /// Begins an OIDC login: the provider's address to send the browser to.
    pub async fn oidc_auth_url(
        &self, name: &str, m: &OidcMethod, redirect_uri: &str, client_nonce: &str,
        meta: BTreeMap<String, String>,
    ) -> Result<String, oidc::FlowError> {
        let c = &m.config;
        let doc = oidc::discover(&c.discovery_url, &c.discovery_ca_cert)
            .await
            .map_err(oidc::FlowError::Provider)?;
        self.pending
            .begin(name, c, &doc, redirect_uri, client_nonce, meta)
    }

    /// Ends an OIDC login: the state taken back, the code traded, the ID
    /// token checked; who it proves the caller is, and the `Meta` its
    /// `auth-url` was given.
    pub async fn oidc_callback(
        &self, name: &str, m: &OidcMethod, state: &str, code: &str, client_nonce: &str,
    ) -> Result<(Identity, BTreeMap<String, String>), oidc::FlowError> {
        let c = &m.config;
        let pending = self.pending.take(name, state, client_nonce)?;
        let doc = oidc::discover(&c.discovery_url, &c.discovery_ca_cert)
            .await
            .map_err(oidc::FlowError::Provider)?;
        let (id_token, access_token) = oidc::exchange(c, &doc, &pending, code).await?;
        let refused = |e: jwt::JwtError| Refused(format!("OIDC ID token: {e}"));
        let token = jwt::decode(&id_token).map_err(refused)?;
        if !m.algs.contains(&token.alg) {
            return Err(refused(jwt::JwtError::Algorithm(token.alg.clone())).into());
        }
        let src = KeySource::Jwks {
            url: doc.jwks_uri.clone(),
            ca: c.discovery_ca_cert.clone(),
        };
        let mut keys = self.keys_for(name, &src, false).await?;
        if token.unknown_kid(&keys) {
            keys = self.keys_for(name, &src, true).await?;
        }
        token.verify(&keys, &m.algs).map_err(refused)?;
        let audiences = if c.bound_audiences.is_empty() {
            vec![c.client_id.clone()]
        } else {
            c.bound_audiences.clone()
        };
        let bounds = jwt::Bounds {
            issuer: doc.issuer.clone(),
            audiences,
            expiration_leeway: 0,
            not_before_leeway: 0,
            clock_skew_leeway: leeway(c.clock_skew_leeway, 60),
        };
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        jwt::check_claims(&token.claims, &bounds, now).map_err(refused)?;
        if token.claims.get("nonce").and_then(Value::as_str) != Some(pending.nonce.as_str()) {
            return Err(Refused("OIDC ID token: invalid nonce".into()).into());
        }
        let mut claims = token.claims.clone();
        if !doc.userinfo_endpoint.is_empty() && !access_token.is_empty() {
            let sub = claims.get("sub").and_then(Value::as_str).unwrap_or("");
            // The ID token's own claims stand; userinfo adds the others.
            for (k, v) in oidc::userinfo(c, &doc, &access_token, sub).await? {
                claims.entry(k).or_insert(v);
            }
        }
        let id =
            jwt_identity(&c.claim_mappings, &c.list_claim_mappings, &claims).map_err(Refused)?;
        Ok((id, pending.meta))
    }

    async fn identify_jwt(
        &self, name: &str, j: &JwtMethod, bearer: &str,
    ) -> Result<Identity, Refused> {
        let refused = |e: jwt::JwtError| Refused(e.to_string());
        let token = jwt::decode(bearer).map_err(refused)?;
        // The algorithm is checked before any key is fetched.
        if !j.algs.contains(&token.alg) {
            return Err(refused(jwt::JwtError::Algorithm(token.alg.clone())));
        }
        let keys = match &j.keys {
            KeySource::Static(k) => k.clone(),
            KeySource::Jwks { .. } | KeySource::Discovery { .. } => {
                let mut keys = self.keys_for(name, &j.keys, false).await?;
                if token.unknown_kid(&keys) {
                    keys = self.keys_for(name, &j.keys, true).await?;
                }
                keys
            }
        };
        token.verify(&keys, &j.algs).map_err(refused)?;
        let c = &j.config;
        let bounds = jwt::Bounds {
            issuer: c.bound_issuer.clone(),
            audiences: c.bound_audiences.clone(),
            expiration_leeway: leeway(c.expiration_leeway, 150),
            not_before_leeway: leeway(c.not_before_leeway, 150),
            clock_skew_leeway: leeway(c.clock_skew_leeway, 60),
        };
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        jwt::check_claims(&token.claims, &bounds, now).map_err(refused)?;
        jwt_identity(&c.claim_mappings, &c.list_claim_mappings, &token.claims).map_err(Refused)
    }

    /// The method's fetched keys: cached; `refresh` fetches again unless
    /// the last fetch was moments ago (an unknown `kid` cannot make the
    /// servers hammer the key server).
    async fn keys_for(
        &self, name: &str, src: &KeySource, refresh: bool,
    ) -> Result<Arc<Vec<KeyEntry>>, Refused> {
        let id = format!("{src:?}");
        if let Some(c) = self.keys.lock().get(name)
            && c.source == id
            && c.fetched.elapsed() < KEYS_TTL
            && (!refresh || c.fetched.elapsed() < REFETCH_EVERY)
        {
            return Ok(c.keys.clone());
        }
        let keys = Arc::new(fetch_keys(src).await.map_err(Refused)?);
        self.keys.lock().insert(
            name.to_string(),
            CachedKeys {
                source: id,
                keys: keys.clone(),
                fetched: Instant::now(),
            },
        );
        Ok(keys)
    }

    /// Forgets a method's keys (it changed or went).
    pub fn forget(&self, name: &str) {
        self.keys.lock().remove(name);
    }
}

/// A client trusting `ca` (the system's roots if empty), bounded in time.
pub(crate) fn client(ca: &str) -> Result<reqwest::Client, String> {
    let tls = crate::tls::ca_client_config(Some(ca).filter(|c| !c.is_empty()))
        .map_err(|e| e.to_string())?;
    crate::tls::http_client()
        .tls_backend_preconfigured(tls)
        .timeout(FETCH_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| e.to_string())
}

/// The body of an answer, refused past `MAX_FETCHED`.
pub(crate) async fn bounded_body(mut r: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    while let Some(chunk) = r.chunk().await.map_err(|e| e.to_string())? {
        if out.len() + chunk.len() > MAX_FETCHED {
            return Err(format!("answer larger than {MAX_FETCHED} bytes"));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

async fn get(client: &reqwest::Client, url: &str) -> Result<Vec<u8>, String> {
    let r = client
        .get(url)
        .send()
        .await
        .map_err(|e| format!("fetching {url}: {e}"))?;
    if !r.status().is_success() {
        return Err(format!("fetching {url}: {}", r.status()));
    }
    bounded_body(r)
        .await
        .map_err(|e| format!("fetching {url}: {e}"))
}

async fn fetch_keys(src: &KeySource) -> Result<Vec<KeyEntry>, String> {
    let (url, ca) = match src {
        KeySource::Static(k) => return Ok((**k).clone()),
        KeySource::Jwks { url, ca } => (url.clone(), ca),
        KeySource::Discovery { url, ca } => {
            let c = client(ca)?;
            let doc = get(
                &c,
                &format!(
                    "{}/.well-known/openid-configuration",
                    url.trim_end_matches('/')
                ),
            )
            .await?;
            let doc: Value =
                serde_json::from_slice(&doc).map_err(|e| format!("bad discovery document: {e}"))?;
            let jwks = doc
                .get("jwks_uri")
                .and_then(Value::as_str)
                .ok_or("discovery document has no jwks_uri")?;
            (jwks.to_string(), ca)
        }
    };
    let body = get(&client(ca)?, &url).await?;
    jwt::parse_jwks(&body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn method(kind: &str, config: Value) -> AclAuthMethod {
        AclAuthMethod {
            name: "m".into(),
            kind: kind.into(),
            config: config.as_object().unwrap().clone(),
            ..Default::default()
        }
    }

    #[test]
    fn a_jwt_method_needs_exactly_one_key_source_and_sound_keys() {
        let pem = rcgen::KeyPair::generate().unwrap().public_key_pem();
        assert!(
            Method::parse(&method(
                "jwt",
                serde_json::json!({"JWTValidationPubKeys": [pem]})
            ))
            .is_ok()
        );
        let none = Method::parse(&method("jwt", serde_json::json!({}))).unwrap_err();
        assert!(none.contains("exactly one of"), "{none}");
        let two = serde_json::json!({"JWTValidationPubKeys": [pem], "JWKSURL": "https://x/keys"});
        assert!(Method::parse(&method("jwt", two)).is_err());
        let bad = Method::parse(&method(
            "jwt",
            serde_json::json!({"JWTValidationPubKeys": ["nope"]}),
        ))
        .unwrap_err();
        assert!(bad.contains("JWTValidationPubKeys[0]"), "{bad}");
        let alg = serde_json::json!({"JWTValidationPubKeys": [pem], "JWTSupportedAlgs": ["HS256"]});
        assert!(
            Method::parse(&method("jwt", alg))
                .unwrap_err()
                .contains("unsupported signing algorithm")
        );
        let typo = serde_json::json!({"JWTValidationPubKeys": [pem], "BoundIssur": "x"});
        assert!(
            Method::parse(&method("jwt", typo))
                .unwrap_err()
                .contains("error decoding config")
        );
        assert!(Method::parse(&method("ldap", serde_json::json!({}))).is_err());
    }

    #[test]
    fn a_kubernetes_method_needs_its_host_and_ca() {
        let ca = rcgen::CertificateParams::new(vec!["k8s".to_string()])
            .unwrap()
            .self_signed(&rcgen::KeyPair::generate().unwrap())
            .unwrap()
            .pem();
        let ok = serde_json::json!({"Host": "https://k8s:6443", "CACert": ca});
        assert!(Method::parse(&method("kubernetes", ok)).is_ok());
        assert!(Method::parse(&method("kubernetes", serde_json::json!({"CACert": ca}))).is_err());
        let no_ca = serde_json::json!({"Host": "https://k8s:6443"});
        assert!(
            Method::parse(&method("kubernetes", no_ca))
                .unwrap_err()
                .contains("CACert")
        );
    }

    #[test]
    fn one_client_takes_at_most_a_quarter_of_the_login_places() {
        let logins = Logins::default();
        let a: std::net::IpAddr = "10.0.0.1".parse().unwrap();
        let b: std::net::IpAddr = "10.0.0.2".parse().unwrap();
        let held: Vec<_> = (0..MAX_LOGINS_PER_CLIENT)
            .map(|_| logins.permit(Some(a)).unwrap())
            .collect();
        let refused = logins.permit(Some(a)).err().unwrap();
        assert!(refused.contains("10.0.0.1"), "{refused}");
        assert!(
            logins.permit(Some(b)).is_ok(),
            "another client still logs in"
        );
        drop(held);
        assert!(logins.permit(Some(a)).is_ok(), "places come back");
        // Unknown clients share only the server's bound.
        let all: Vec<_> = (0..MAX_LOGINS_IN_FLIGHT)
            .map(|_| logins.permit(None).unwrap())
            .collect();
        assert!(logins.permit(None).is_err());
        drop(all);
    }

    #[test]
    fn claims_map_to_fields_and_variables() {
        let c = JwtConfig {
            claim_mappings: [
                ("nomad_job_id".to_string(), "job".to_string()),
                ("/nested/ns".to_string(), "ns".to_string()),
            ]
            .into(),
            list_claim_mappings: [("groups".to_string(), "groups".to_string())].into(),
            ..Default::default()
        };
        let claims = serde_json::json!({"nomad_job_id": "web", "nested": {"ns": "prod"}, "groups": ["a", 7]});
        let id = jwt_identity(
            &c.claim_mappings,
            &c.list_claim_mappings,
            claims.as_object().unwrap(),
        )
        .unwrap();
        assert_eq!(id.vars["value.job"], "web");
        assert_eq!(id.vars["value.ns"], "prod");
        assert_eq!(id.fields["list"]["groups"], serde_json::json!(["a", "7"]));
        let missing = jwt_identity(
            &c.claim_mappings,
            &c.list_claim_mappings,
            serde_json::json!({}).as_object().unwrap(),
        )
        .unwrap();
        assert_eq!(missing.vars["value.job"], "");
        assert_eq!(missing.fields["value"], serde_json::json!({}));
    }
}
