//! An `oidc` method: the browser's round trip through an OpenID provider
//! (the authorization code flow with PKCE). `/v1/acl/oidc/auth-url` makes
//! the provider's address with a fresh `state`, `nonce` and code
//! challenge, kept here a while (`Pending`); `/v1/acl/oidc/callback`
//! takes that state back once, trades the code at the provider's token
//! endpoint (with the client secret and the code verifier), and checks
//! the ID token: signed by a key of the provider's JWKS, issued by the
//! discovery document's issuer for this client, carrying our nonce.
//! Every address is the method's discovery document's, never one a
//! caller or a token names.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration as StdDuration, Instant};

use base64::Engine;
use serde::Deserialize;
use serde_json::Value;

use super::{Refused, client, get};
use crate::structs::duration::Duration;

/// How long a state from `auth-url` waits for its callback (Consul's).
pub const STATE_TTL: StdDuration = StdDuration::from_secs(600);
/// States waiting at once on one server; past it, 429.
pub const MAX_PENDING: usize = 1024;

/// An `oidc` method's `Config`, with Consul's field names.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OidcConfig {
    #[serde(rename = "OIDCDiscoveryURL")]
    pub discovery_url: String,
    #[serde(rename = "OIDCDiscoveryCACert")]
    pub discovery_ca_cert: String,
    #[serde(rename = "OIDCClientID")]
    pub client_id: String,
    #[serde(rename = "OIDCClientSecret")]
    pub client_secret: String,
    #[serde(rename = "AllowedRedirectURIs")]
    pub allowed_redirect_uris: Vec<String>,
    #[serde(rename = "OIDCScopes")]
    pub scopes: Vec<String>,
    #[serde(rename = "OIDCACRValues")]
    pub acr_values: Vec<String>,
    #[serde(rename = "BoundAudiences")]
    pub bound_audiences: Vec<String>,
    #[serde(rename = "JWTSupportedAlgs")]
    pub algs: Vec<String>,
    #[serde(rename = "ClaimMappings")]
    pub claim_mappings: BTreeMap<String, String>,
    #[serde(rename = "ListClaimMappings")]
    pub list_claim_mappings: BTreeMap<String, String>,
    #[serde(rename = "ClockSkewLeeway")]
    pub clock_skew_leeway: Duration,
    #[serde(rename = "VerboseOIDCLogging")]
    pub verbose_logging: bool,
}

impl OidcConfig {
    /// Consul's checks of an `oidc` method's config on write.
    pub fn check(&self) -> Result<(), String> {
        let need = |set: bool, what: &str| {
            if set {
                Ok(())
            } else {
                Err(format!(
                    "Invalid Auth Method: {what} is required for type 'oidc'"
                ))
            }
        };
        need(!self.discovery_url.is_empty(), "'OIDCDiscoveryURL'")?;
        need(!self.client_id.is_empty(), "'OIDCClientID'")?;
        need(!self.client_secret.is_empty(), "'OIDCClientSecret'")?;
        need(
            !self.allowed_redirect_uris.is_empty(),
            "'AllowedRedirectURIs'",
        )?;
        super::https_url("OIDCDiscoveryURL", &self.discovery_url)?;
        if !self.discovery_ca_cert.is_empty() {
            crate::tls::ca_client_config(Some(&self.discovery_ca_cert))
                .map_err(|e| format!("Invalid Auth Method: OIDCDiscoveryCACert: {e}"))?;
        }
        for uri in &self.allowed_redirect_uris {
            super::https_url("AllowedRedirectURIs", uri)?;
        }
        Ok(())
    }
}

/// What the provider's discovery document says (the parts used).
#[derive(Debug, Clone, Deserialize)]
pub struct Discovery {
    pub issuer: String,
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    pub jwks_uri: String,
    #[serde(default)]
    pub userinfo_endpoint: String,
}

/// The provider's discovery document, whose issuer must be the address
/// it was read from (OpenID Connect Discovery, section 4.3).
pub async fn discover(url: &str, ca: &str) -> Result<Discovery, String> {
    let base = url.trim_end_matches('/');
    let body = get(
        &client(ca)?,
        &format!("{base}/.well-known/openid-configuration"),
    )
    .await?;
    let doc: Discovery =
        serde_json::from_slice(&body).map_err(|e| format!("bad discovery document: {e}"))?;
    if doc.issuer.trim_end_matches('/') != base {
        return Err(format!(
            "the discovery document's issuer {:?} is not {url:?}",
            doc.issuer
        ));
    }
    Ok(doc)
}

/// A login begun by `auth-url`, waiting for its callback.
#[derive(Debug, Clone)]
pub struct Pending {
    pub method: String,
    pub redirect_uri: String,
    pub nonce: String,
    pub verifier: String,
    pub client_nonce: String,
    pub meta: BTreeMap<String, String>,
    made: Instant,
}

/// The states waiting for their callbacks, each taken at most once.
#[derive(Default)]
pub struct PendingLogins {
    states: parking_lot::Mutex<HashMap<String, Pending>>,
}

/// 32 random bytes, URL-safe base64 (a state, a nonce, a PKCE verifier).
fn random_token() -> Result<String, String> {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .map_err(|_| "no randomness".to_string())?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b))
}

/// PKCE's S256 challenge of `verifier` (RFC 7636, 4.2).
pub fn challenge(verifier: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, verifier.as_bytes());
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(d.as_ref())
}

/// Why a step of the flow is refused: the caller's mistake (400), the
/// server's bound (429), the provider (500), or the credential (403).
#[derive(Debug, thiserror::Error)]
pub enum FlowError {
    #[error("{0}")]
    Bad(String),
    #[error("{0}")]
    Busy(String),
    /// The provider could not be asked (its discovery document).
    #[error("OIDC provider: {0}")]
    Provider(String),
    #[error(transparent)]
    Refused(#[from] Refused),
}

impl PendingLogins {
    /// Keeps a new login's state; the provider's address for it.
    pub fn begin(
        &self, method: &str, c: &OidcConfig, doc: &Discovery, redirect_uri: &str,
        client_nonce: &str, meta: BTreeMap<String, String>,
    ) -> Result<String, FlowError> {
        if !c.allowed_redirect_uris.iter().any(|u| u == redirect_uri) {
            return Err(FlowError::Bad(format!(
                "Redirect URI {redirect_uri:?} is not in the auth method's AllowedRedirectURIs"
            )));
        }
        let (state, nonce, verifier) = (
            random_token().map_err(FlowError::Bad)?,
            random_token().map_err(FlowError::Bad)?,
            random_token().map_err(FlowError::Bad)?,
        );
        let mut scope = vec!["openid".to_string()];
        scope.extend(c.scopes.iter().filter(|s| *s != "openid").cloned());
        let mut q = form_urlencoded::Serializer::new(String::new());
        q.append_pair("client_id", &c.client_id)
            .append_pair("response_type", "code")
            .append_pair("redirect_uri", redirect_uri)
            .append_pair("scope", &scope.join(" "))
            .append_pair("state", &state)
            .append_pair("nonce", &nonce)
            .append_pair("code_challenge", &challenge(&verifier))
            .append_pair("code_challenge_method", "S256");
        if !c.acr_values.is_empty() {
            q.append_pair("acr_values", &c.acr_values.join(" "));
        }
        let sep = if doc.authorization_endpoint.contains('?') {
            '&'
        } else {
            '?'
        };
        let url = format!("{}{sep}{}", doc.authorization_endpoint, q.finish());
        let mut states = self.states.lock();
        states.retain(|_, p| p.made.elapsed() < STATE_TTL);
        if states.len() >= MAX_PENDING {
            return Err(FlowError::Busy(format!(
                "too many OIDC logins waiting for their callback (at most {MAX_PENDING}); retry"
            )));
        }
        states.insert(
            state,
            Pending {
                method: method.to_string(),
                redirect_uri: redirect_uri.to_string(),
                nonce,
                verifier,
                client_nonce: client_nonce.to_string(),
                meta,
                made: Instant::now(),
            },
        );
        Ok(url)
    }

    /// Takes the state back, once: for this method, within its time, with
    /// the client nonce its `auth-url` was given.
    pub fn take(&self, method: &str, state: &str, client_nonce: &str) -> Result<Pending, Refused> {
        let p = self
            .states
            .lock()
            .remove(state)
            .filter(|p| p.made.elapsed() < STATE_TTL)
            .ok_or_else(|| Refused("OIDC state not found or expired".into()))?;
        if p.method != method {
            return Err(Refused(
                "OIDC state was made for another auth method".into(),
            ));
        }
        if p.client_nonce != client_nonce {
            return Err(Refused("invalid OIDC client nonce".into()));
        }
        Ok(p)
    }
}

/// The provider's answer at its token endpoint (the parts used).
#[derive(Debug, Deserialize)]
struct Tokens {
    id_token: String,
    #[serde(default)]
    access_token: String,
}

/// Trades `code` for the provider's tokens: the ID token and, when the
/// provider has a userinfo endpoint, the access token for it.
pub async fn exchange(
    c: &OidcConfig, doc: &Discovery, p: &Pending, code: &str,
) -> Result<(String, String), Refused> {
    let http = client(&c.discovery_ca_cert).map_err(Refused)?;
    let form = form_urlencoded::Serializer::new(String::new())
        .append_pair("grant_type", "authorization_code")
        .append_pair("code", code)
        .append_pair("redirect_uri", &p.redirect_uri)
        .append_pair("code_verifier", &p.verifier)
        .finish();
    // client_secret_basic: the client's id and secret form-encoded first
    // (RFC 6749, 2.3.1).
    let enc = |v: &str| form_urlencoded::byte_serialize(v.as_bytes()).collect::<String>();
    let r = http
        .post(&doc.token_endpoint)
        .basic_auth(enc(&c.client_id), Some(enc(&c.client_secret)))
        .header(
            reqwest::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        )
        .body(form)
        .send()
        .await
        .map_err(|e| Refused(format!("OIDC token exchange: {e}")))?;
    let status = r.status();
    let body = super::bounded_body(r)
        .await
        .map_err(|e| Refused(format!("OIDC token exchange: {e}")))?;
    if !status.is_success() {
        return Err(Refused(format!(
            "OIDC token exchange: the provider answered {status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(512)])
        )));
    }
    let t: Tokens = serde_json::from_slice(&body)
        .map_err(|e| Refused(format!("OIDC token exchange: bad answer: {e}")))?;
    Ok((t.id_token, t.access_token))
}

/// The userinfo endpoint's claims for `access_token`, which must be about
/// the ID token's subject (OpenID Connect Core, 5.3.2).
pub async fn userinfo(
    c: &OidcConfig, doc: &Discovery, access_token: &str, sub: &str,
) -> Result<serde_json::Map<String, Value>, Refused> {
    let http = client(&c.discovery_ca_cert).map_err(Refused)?;
    let r = http
        .get(&doc.userinfo_endpoint)
        .bearer_auth(access_token)
        .send()
        .await
        .map_err(|e| Refused(format!("OIDC userinfo: {e}")))?;
    if !r.status().is_success() {
        return Err(Refused(format!("OIDC userinfo: {}", r.status())));
    }
    let body = super::bounded_body(r)
        .await
        .map_err(|e| Refused(format!("OIDC userinfo: {e}")))?;
    let claims: serde_json::Map<String, Value> = serde_json::from_slice(&body)
        .map_err(|e| Refused(format!("OIDC userinfo: bad answer: {e}")))?;
    if claims.get("sub").and_then(Value::as_str) != Some(sub) {
        return Err(Refused("OIDC userinfo is about another subject".into()));
    }
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> OidcConfig {
        OidcConfig {
            discovery_url: "https://idp.test".into(),
            client_id: "cairn".into(),
            client_secret: "s".into(),
            allowed_redirect_uris: vec!["http://127.0.0.1:8500/ui/".into()],
            scopes: vec!["email".into()],
            ..Default::default()
        }
    }

    fn doc() -> Discovery {
        Discovery {
            issuer: "https://idp.test".into(),
            authorization_endpoint: "https://idp.test/auth".into(),
            token_endpoint: "https://idp.test/token".into(),
            jwks_uri: "https://idp.test/jwks".into(),
            userinfo_endpoint: String::new(),
        }
    }

    #[test]
    fn pkce_challenge_is_rfc_7636s_example() {
        assert_eq!(
            challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
    }

    /// A begun login's query to the provider.
    fn begun(p: &PendingLogins) -> HashMap<String, String> {
        let url = p
            .begin(
                "m",
                &config(),
                &doc(),
                "http://127.0.0.1:8500/ui/",
                "cn",
                BTreeMap::new(),
            )
            .unwrap();
        form_urlencoded::parse(url.split_once('?').unwrap().1.as_bytes())
            .into_owned()
            .collect()
    }

    #[test]
    fn a_state_is_taken_once_for_its_method_and_client_nonce() {
        let p = PendingLogins::default();
        let q = begun(&p);
        assert_eq!(q["scope"], "openid email");
        assert_eq!(q["code_challenge_method"], "S256");
        // Refused once (another method), gone: a state is never tried twice.
        assert!(p.take("other", &q["state"], "cn").is_err());
        assert!(p.take("m", &q["state"], "cn").is_err());
        let q = begun(&p);
        assert!(p.take("m", &q["state"], "wrong").is_err());
        let q = begun(&p);
        let taken = p.take("m", &q["state"], "cn").unwrap();
        assert_eq!(challenge(&taken.verifier), q["code_challenge"]);
        assert!(p.take("m", &q["state"], "cn").is_err());
    }

    #[test]
    fn a_redirect_uri_outside_the_allowed_list_is_refused() {
        let p = PendingLogins::default();
        let e = p
            .begin(
                "m",
                &config(),
                &doc(),
                "https://evil.test/",
                "",
                BTreeMap::new(),
            )
            .unwrap_err();
        assert!(matches!(e, FlowError::Bad(m) if m.contains("AllowedRedirectURIs")));
    }

    #[test]
    fn an_oidc_config_needs_its_client_and_redirects() {
        assert!(config().check().is_ok());
        let mut c = config();
        c.client_secret.clear();
        assert!(c.check().unwrap_err().contains("OIDCClientSecret"));
        let mut c = config();
        c.allowed_redirect_uris.clear();
        assert!(c.check().unwrap_err().contains("AllowedRedirectURIs"));
    }
}
