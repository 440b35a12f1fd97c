//! JSON Web Tokens as a `jwt` auth method checks them: the compact form
//! decoded, the signature verified with one of the method's keys (ring;
//! only the asymmetric algorithms, so a public key can never serve as an
//! HMAC secret), then the registered claims (`exp`, `nbf`, `iat`, `iss`,
//! `aud`) against the method's bounds. Pure: where keys come from is
//! `login::keys`.

use base64::Engine;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde_json::Value;

/// The algorithms a method may accept (`JWTSupportedAlgs`).
pub const ALGORITHMS: &[&str] = &[
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA",
];

/// Consul's default when a method names none.
pub const DEFAULT_ALGORITHM: &str = "RS256";

/// The longest bearer token a login reads (a JWT with its claims is a few
/// KiB; Kubernetes' are under 2).
pub const MAX_TOKEN_LEN: usize = 16 * 1024;

/// Why a token is refused, in the words a caller sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    #[error("malformed JWT: {0}")]
    Malformed(&'static str),
    #[error("the JWT is too large ({0} bytes)")]
    TooLarge(usize),
    #[error("JWT algorithm {0:?} is not allowed by the auth method")]
    Algorithm(String),
    #[error("failed to verify the JWT's signature")]
    Signature,
    #[error("the JWT has expired")]
    Expired,
    #[error("the JWT is not valid yet")]
    NotYetValid,
    #[error("the JWT was issued in the future")]
    IssuedInFuture,
    #[error("the JWT's issuer {0:?} is not the bound issuer")]
    Issuer(String),
    #[error("the JWT's audience is not one of the bound audiences")]
    Audience,
}

/// A verification key: what a PEM public key or a JWK holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// An uncompressed point: 65 bytes on P-256, 97 on P-384.
    Ec(Vec<u8>),
    Ed25519(Vec<u8>),
}

/// A key with the `kid` a JWKS gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyEntry {
    pub kid: Option<String>,
    pub key: Key,
}

const ED25519_OID: &str = "1.3.101.112";

/// A PEM public key (`PUBLIC KEY`) or certificate (its key), as
/// `JWTValidationPubKeys` holds them.
pub fn parse_pem_key(pem: &str) -> Result<Key, String> {
    use rustls_pki_types::pem::PemObject;
    let der: Vec<u8> =
        match rustls_pki_types::SubjectPublicKeyInfoDer::from_pem_slice(pem.as_bytes()) {
            Ok(spki) => spki.as_ref().to_vec(),
            Err(_) => {
                let cert = rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
                    .map_err(|_| "not a PEM public key or certificate".to_string())?;
                let (_, c) = x509_parser::parse_x509_certificate(cert.as_ref())
                    .map_err(|e| format!("bad certificate: {e}"))?;
                c.tbs_certificate.subject_pki.raw.to_vec()
            }
        };
    spki_key(&der)
}

fn spki_key(der: &[u8]) -> Result<Key, String> {
    use x509_parser::prelude::FromDer;
    use x509_parser::public_key::PublicKey;
    let (_, spki) = x509_parser::x509::SubjectPublicKeyInfo::from_der(der)
        .map_err(|e| format!("bad public key: {e}"))?;
    if spki.algorithm.algorithm.to_id_string() == ED25519_OID {
        return Ok(Key::Ed25519(spki.subject_public_key.data.to_vec()));
    }
    match spki.parsed().map_err(|e| format!("bad public key: {e}"))? {
        PublicKey::RSA(rsa) => Ok(Key::Rsa {
            n: strip_zeros(rsa.modulus).to_vec(),
            e: strip_zeros(rsa.exponent).to_vec(),
        }),
        PublicKey::EC(point) if matches!(point.data().len(), 65 | 97) => {
            Ok(Key::Ec(point.data().to_vec()))
        }
        _ => Err("unsupported public key type (RSA, P-256, P-384 or Ed25519)".into()),
    }
}

fn strip_zeros(b: &[u8]) -> &[u8] {
    let first = b.iter().position(|x| *x != 0).unwrap_or(b.len());
    &b[first..]
}

fn b64url(s: &str) -> Result<Vec<u8>, JwtError> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s.trim_end_matches('='))
        .map_err(|_| JwtError::Malformed("bad base64url"))
}

/// The keys of a JWKS document (RFC 7517); keys of other types or uses
/// are skipped, as a JWKS may hold encryption keys too.
pub fn parse_jwks(body: &[u8]) -> Result<Vec<KeyEntry>, String> {
    let doc: Value = serde_json::from_slice(body).map_err(|e| format!("bad JWKS: {e}"))?;
    let keys = doc
        .get("keys")
        .and_then(Value::as_array)
        .ok_or("bad JWKS: no \"keys\" list")?;
    let text = |k: &Value, f: &str| k.get(f).and_then(Value::as_str).map(str::to_string);
    let bytes = |k: &Value, f: &str| text(k, f).and_then(|s| b64url(&s).ok());
    let mut out = Vec::new();
    for k in keys {
        if text(k, "use").is_some_and(|u| u != "sig") {
            continue;
        }
        let key = match (text(k, "kty").as_deref(), text(k, "crv").as_deref()) {
            (Some("RSA"), _) => match (bytes(k, "n"), bytes(k, "e")) {
                (Some(n), Some(e)) => Key::Rsa {
                    n: strip_zeros(&n).to_vec(),
                    e: strip_zeros(&e).to_vec(),
                },
                _ => continue,
            },
            (Some("EC"), Some(crv @ ("P-256" | "P-384"))) => {
                let len = if crv == "P-256" { 32 } else { 48 };
                match (bytes(k, "x"), bytes(k, "y")) {
                    (Some(x), Some(y)) if x.len() == len && y.len() == len => {
                        let mut p = vec![4u8];
                        p.extend(x);
                        p.extend(y);
                        Key::Ec(p)
                    }
                    _ => continue,
                }
            }
            (Some("OKP"), Some("Ed25519")) => match bytes(k, "x") {
                Some(x) => Key::Ed25519(x),
                None => continue,
            },
            _ => continue,
        };
        out.push(KeyEntry {
            kid: text(k, "kid"),
            key,
        });
    }
    Ok(out)
}

/// A token split and decoded, its signature not yet checked.
#[derive(Debug)]
pub struct Decoded {
    pub alg: String,
    pub kid: Option<String>,
    pub claims: serde_json::Map<String, Value>,
    signing_input: String,
    signature: Vec<u8>,
}

/// Splits and decodes a compact JWS. Nothing in it is trusted yet.
pub fn decode(token: &str) -> Result<Decoded, JwtError> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(JwtError::TooLarge(token.len()));
    }
    let mut parts = token.trim().split('.');
    let (Some(h), Some(c), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(JwtError::Malformed("not three dot-separated parts"));
    };
    let header: Value =
        serde_json::from_slice(&b64url(h)?).map_err(|_| JwtError::Malformed("bad header"))?;
    let claims = match serde_json::from_slice(&b64url(c)?) {
        Ok(Value::Object(m)) => m,
        _ => return Err(JwtError::Malformed("claims are not a JSON object")),
    };
    let alg = header
        .get("alg")
        .and_then(Value::as_str)
        .ok_or(JwtError::Malformed("no alg"))?
        .to_string();
    let kid = header
        .get("kid")
        .and_then(Value::as_str)
        .map(str::to_string);
    Ok(Decoded {
        alg,
        kid,
        claims,
        signing_input: format!("{h}.{c}"),
        signature: b64url(s)?,
    })
}

impl Decoded {
    /// Verifies the signature with the first of `keys` that fits the
    /// token's algorithm and `kid`; the algorithm must be in `allowed`.
    pub fn verify(&self, keys: &[KeyEntry], allowed: &[String]) -> Result<(), JwtError> {
        if !allowed.contains(&self.alg) || !ALGORITHMS.contains(&self.alg.as_str()) {
            return Err(JwtError::Algorithm(self.alg.clone()));
        }
        let candidates = keys
            .iter()
            .filter(|k| self.kid.is_none() || k.kid.is_none() || k.kid == self.kid);
        for k in candidates {
            if verify_one(
                &self.alg,
                &k.key,
                self.signing_input.as_bytes(),
                &self.signature,
            ) {
                return Ok(());
            }
        }
        Err(JwtError::Signature)
    }

    /// The key IDs this token asks for that `keys` lacks (a JWKS to
    /// fetch again).
    pub fn unknown_kid(&self, keys: &[KeyEntry]) -> bool {
        self.kid
            .as_ref()
            .is_some_and(|kid| !keys.iter().any(|k| k.kid.as_ref() == Some(kid)))
    }
}

fn verify_one(alg: &str, key: &Key, msg: &[u8], sig: &[u8]) -> bool {
    let rsa = |params: &'static signature::RsaParameters, n: &[u8], e: &[u8]| {
        RsaPublicKeyComponents { n, e }
            .verify(params, msg, sig)
            .is_ok()
    };
    let unparsed = |params: &'static dyn signature::VerificationAlgorithm, k: &[u8]| {
        UnparsedPublicKey::new(params, k).verify(msg, sig).is_ok()
    };
    match (alg, key) {
        ("RS256", Key::Rsa { n, e }) => rsa(&signature::RSA_PKCS1_2048_8192_SHA256, n, e),
        ("RS384", Key::Rsa { n, e }) => rsa(&signature::RSA_PKCS1_2048_8192_SHA384, n, e),
        ("RS512", Key::Rsa { n, e }) => rsa(&signature::RSA_PKCS1_2048_8192_SHA512, n, e),
        ("PS256", Key::Rsa { n, e }) => rsa(&signature::RSA_PSS_2048_8192_SHA256, n, e),
        ("PS384", Key::Rsa { n, e }) => rsa(&signature::RSA_PSS_2048_8192_SHA384, n, e),
        ("PS512", Key::Rsa { n, e }) => rsa(&signature::RSA_PSS_2048_8192_SHA512, n, e),
        ("ES256", Key::Ec(p)) if p.len() == 65 => unparsed(&signature::ECDSA_P256_SHA256_FIXED, p),
        ("ES384", Key::Ec(p)) if p.len() == 97 => unparsed(&signature::ECDSA_P384_SHA384_FIXED, p),
        ("EdDSA", Key::Ed25519(k)) => unparsed(&signature::ED25519, k),
        _ => false,
    }
}

/// What the registered claims must satisfy.
#[derive(Debug, Clone, Default)]
pub struct Bounds {
    pub issuer: String,
    pub audiences: Vec<String>,
    /// Seconds of leeway past `exp`, before `nbf`, and for clock skew
    /// (Consul's defaults, 150/150/60, are applied by the caller; -1 none).
    pub expiration_leeway: i64,
    pub not_before_leeway: i64,
    pub clock_skew_leeway: i64,
}

/// Checks `exp`, `nbf`, `iat`, `iss` and `aud` at `now` (Unix seconds).
pub fn check_claims(
    claims: &serde_json::Map<String, Value>, b: &Bounds, now: i64,
) -> Result<(), JwtError> {
    let time = |k: &str| claims.get(k).and_then(Value::as_f64).map(|f| f as i64);
    let skew = b.clock_skew_leeway.max(0);
    if let Some(exp) = time("exp")
        && now > exp + b.expiration_leeway.max(0) + skew
    {
        return Err(JwtError::Expired);
    }
    if let Some(nbf) = time("nbf")
        && now < nbf - b.not_before_leeway.max(0) - skew
    {
        return Err(JwtError::NotYetValid);
    }
    if let Some(iat) = time("iat")
        && now < iat - skew
    {
        return Err(JwtError::IssuedInFuture);
    }
    if !b.issuer.is_empty() {
        let iss = claims.get("iss").and_then(Value::as_str).unwrap_or("");
        if iss != b.issuer {
            return Err(JwtError::Issuer(iss.to_string()));
        }
    }
    if !b.audiences.is_empty() {
        let aud: Vec<&str> = match claims.get("aud") {
            Some(Value::String(s)) => vec![s.as_str()],
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if !aud.iter().any(|a| b.audiences.iter().any(|x| x == a)) {
            return Err(JwtError::Audience);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::rand::SystemRandom;
    use ring::signature::{EcdsaKeyPair, KeyPair};

    fn enc(v: &[u8]) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v)
    }

    /// An ES256 key pair and a token it signs.
    fn es256() -> (EcdsaKeyPair, Key) {
        let rng = SystemRandom::new();
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
        let key = Key::Ec(pair.public_key().as_ref().to_vec());
        (pair, key)
    }

    fn sign(pair: &EcdsaKeyPair, header: &Value, claims: &Value) -> String {
        let input = format!(
            "{}.{}",
            enc(header.to_string().as_bytes()),
            enc(claims.to_string().as_bytes())
        );
        let sig = pair.sign(&SystemRandom::new(), input.as_bytes()).unwrap();
        format!("{input}.{}", enc(sig.as_ref()))
    }

    fn entry(key: Key) -> Vec<KeyEntry> {
        vec![KeyEntry { kid: None, key }]
    }

    #[test]
    fn a_token_verifies_with_its_key_only_and_only_for_an_allowed_algorithm() {
        let (pair, key) = es256();
        let (_, other) = es256();
        let t = sign(
            &pair,
            &serde_json::json!({"alg": "ES256"}),
            &serde_json::json!({"sub": "x"}),
        );
        let d = decode(&t).unwrap();
        let es = vec!["ES256".to_string()];
        assert_eq!(d.verify(&entry(key.clone()), &es), Ok(()));
        assert_eq!(d.verify(&entry(other), &es), Err(JwtError::Signature));
        assert_eq!(
            d.verify(&entry(key.clone()), &["RS256".to_string()]),
            Err(JwtError::Algorithm("ES256".into()))
        );
        // A changed claim breaks the signature.
        let mut parts: Vec<&str> = t.split('.').collect();
        let forged = enc(br#"{"sub":"root"}"#);
        parts[1] = &forged;
        let d = decode(&parts.join(".")).unwrap();
        assert_eq!(d.verify(&entry(key), &es), Err(JwtError::Signature));
    }

    #[test]
    fn alg_none_and_hmac_are_refused_whatever_the_method_allows() {
        let (_, key) = es256();
        let claims = enc(br#"{"sub":"x"}"#);
        for alg in ["none", "HS256"] {
            let t = format!(
                "{}.{claims}.",
                enc(format!(r#"{{"alg":"{alg}"}}"#).as_bytes())
            );
            let d = decode(&t).unwrap();
            assert_eq!(
                d.verify(&entry(key.clone()), &[alg.to_string()]),
                Err(JwtError::Algorithm(alg.into()))
            );
        }
    }

    #[test]
    fn registered_claims_are_bounded() {
        let now = 1_000_000;
        let b = Bounds {
            issuer: "https://iss".into(),
            audiences: vec!["a".into()],
            expiration_leeway: 150,
            not_before_leeway: 150,
            clock_skew_leeway: 60,
        };
        let c = |v: Value| v.as_object().unwrap().clone();
        let ok = serde_json::json!({"iss": "https://iss", "aud": ["b", "a"], "exp": now + 10});
        assert_eq!(check_claims(&c(ok), &b, now), Ok(()));
        let cases = [
            (
                serde_json::json!({"iss": "https://iss", "aud": "a", "exp": now - 211}),
                JwtError::Expired,
            ),
            (
                serde_json::json!({"iss": "https://iss", "aud": "a", "nbf": now + 211}),
                JwtError::NotYetValid,
            ),
            (
                serde_json::json!({"iss": "https://iss", "aud": "a", "iat": now + 61}),
                JwtError::IssuedInFuture,
            ),
            (
                serde_json::json!({"iss": "https://other", "aud": "a"}),
                JwtError::Issuer("https://other".into()),
            ),
            (
                serde_json::json!({"iss": "https://iss", "aud": "b"}),
                JwtError::Audience,
            ),
            (
                serde_json::json!({"iss": "https://iss"}),
                JwtError::Audience,
            ),
        ];
        for (claims, want) in cases {
            assert_eq!(
                check_claims(&c(claims.clone()), &b, now),
                Err(want),
                "{claims}"
            );
        }
        // Within the leeway an expired token still passes, as Consul's.
        let late = serde_json::json!({"iss": "https://iss", "aud": "a", "exp": now - 200});
        assert_eq!(check_claims(&c(late), &b, now), Ok(()));
    }

    #[test]
    fn jwks_keys_are_read_and_a_kid_selects_one() {
        let (pair, key) = es256();
        let Key::Ec(p) = &key else { unreachable!() };
        let jwks = serde_json::json!({"keys": [
            {"kty": "EC", "crv": "P-256", "kid": "k1", "x": enc(&p[1..33]), "y": enc(&p[33..])},
            {"kty": "RSA", "use": "enc", "n": "AQAB", "e": "AQAB"},
            {"kty": "oct", "k": "c2VjcmV0"},
        ]});
        let keys = parse_jwks(jwks.to_string().as_bytes()).unwrap();
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].key, key);
        let es = vec!["ES256".to_string()];
        let t = sign(
            &pair,
            &serde_json::json!({"alg": "ES256", "kid": "k1"}),
            &serde_json::json!({}),
        );
        assert_eq!(decode(&t).unwrap().verify(&keys, &es), Ok(()));
        let t = sign(
            &pair,
            &serde_json::json!({"alg": "ES256", "kid": "k2"}),
            &serde_json::json!({}),
        );
        let d = decode(&t).unwrap();
        assert!(d.unknown_kid(&keys));
        assert_eq!(d.verify(&keys, &es), Err(JwtError::Signature));
    }

    #[test]
    fn malformed_and_huge_tokens_are_refused_before_any_work() {
        assert!(matches!(decode("a.b"), Err(JwtError::Malformed(_))));
        assert!(matches!(decode("a.b.c.d"), Err(JwtError::Malformed(_))));
        assert!(matches!(decode("!!.b.c"), Err(JwtError::Malformed(_))));
        let huge = "a".repeat(MAX_TOKEN_LEN + 1);
        assert_eq!(
            decode(&huge).unwrap_err(),
            JwtError::TooLarge(MAX_TOKEN_LEN + 1)
        );
    }

    #[test]
    fn a_pem_public_key_is_read() {
        let key = rcgen::KeyPair::generate().unwrap();
        let pem = key.public_key_pem();
        assert!(matches!(parse_pem_key(&pem), Ok(Key::Ec(p)) if p.len() == 65));
        assert!(
            parse_pem_key("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n").is_err()
        );
        assert!(parse_pem_key("junk").is_err());
    }
}
