//! The login rows: `POST /v1/acl/login` through a `jwt` auth method, each
//! with the same JWT (the method's keys are static, so every login is a
//! signature check, the binding rules and one token write), signed with a
//! fixed Ed25519 key whose public half `jwt-key` prints for the method.

use std::sync::Arc;

use anyhow::{Context, Result};
use base64::Engine;
use bytes::Bytes;
use hyper::Method;
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde_json::json;

use crate::rows::call_ok;
use crate::{Common, Conn, Op, System, find_leader, run_load};

fn key() -> Result<Ed25519KeyPair> {
    Ed25519KeyPair::from_seed_unchecked(&[42; 32]).map_err(|e| anyhow::anyhow!("{e}"))
}

/// The PEM of the key's public half, for `JWTValidationPubKeys`.
pub fn public_pem() -> Result<String> {
    // An Ed25519 SubjectPublicKeyInfo: a fixed prefix, then the key.
    let mut spki = vec![
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
    ];
    spki.extend_from_slice(key()?.public_key().as_ref());
    Ok(format!(
        "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----",
        base64::engine::general_purpose::STANDARD.encode(spki)
    ))
}

/// A JWT (EdDSA) issued by `bench` for an hour.
pub fn jwt() -> Result<String> {
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let claims = json!({"iss": "bench", "sub": "bench", "iat": now, "exp": now + 3600});
    let signed = format!(
        "{}.{}",
        url.encode(br#"{"alg":"EdDSA","typ":"JWT"}"#),
        url.encode(claims.to_string())
    );
    let sig = key()?.sign(signed.as_bytes());
    Ok(format!("{signed}.{}", url.encode(sig.as_ref())))
}

/// Logins through `method` from `--clients` connections at the leader,
/// after one that must succeed.
pub async fn cmd_login(c: Common, method: String) -> Result<()> {
    let leader = find_leader(System::Cairn, &c.addrs).await?;
    let body = Bytes::from(json!({"AuthMethod": method, "BearerToken": jwt()?}).to_string());
    let op = move || Op {
        method: Method::POST,
        path: "/v1/acl/login".into(),
        body: body.clone(),
    };
    call_ok(&mut Conn::new(&leader), op())
        .await
        .context("the first login")?;
    run_load(&leader, &c, Arc::new(move |_, _| op()), "login").await
}
