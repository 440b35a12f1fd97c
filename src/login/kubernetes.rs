//! A `kubernetes` auth method's check: the bearer token (a service
//! account JWT) sent to the cluster's TokenReview API at the method's
//! `Host`, trusted through its `CACert`; the service account the API
//! names becomes the identity (`serviceaccount.namespace`, `.name`,
//! `.uid`), as Consul's.

use serde_json::Value;

use super::KubernetesConfig;
use super::bind::Identity;

/// The variables a bind name may use.
pub const VARS: &[&str] = &[
    "serviceaccount.namespace",
    "serviceaccount.name",
    "serviceaccount.uid",
];

/// The TokenReview API's path (authentication.k8s.io/v1).
pub const REVIEW_PATH: &str = "/apis/authentication.k8s.io/v1/tokenreviews";

/// Asks the TokenReview API who `bearer` is.
pub async fn review(c: &KubernetesConfig, bearer: &str) -> Result<Identity, String> {
    // Only a JWT is sent on: junk never reaches the API server.
    super::jwt::decode(bearer).map_err(|e| e.to_string())?;
    let reviewer = if c.service_account_jwt.is_empty() {
        bearer
    } else {
        &c.service_account_jwt
    };
    let client = super::client(&c.ca_cert)?;
    let url = format!("{}{REVIEW_PATH}", c.host.trim_end_matches('/'));
    let body = serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": bearer},
    });
    let r = client
        .post(&url)
        .bearer_auth(reviewer)
        .json(&body)
        .send()
        .await
        .map_err(|e| format!("TokenReview at {}: {e}", c.host))?;
    let status = r.status();
    let answer = super::bounded_body(r)
        .await
        .map_err(|e| format!("TokenReview at {}: {e}", c.host))?;
    if !status.is_success() {
        return Err(format!("TokenReview at {}: {status}", c.host));
    }
    let answer: Value = serde_json::from_slice(&answer)
        .map_err(|e| format!("TokenReview at {}: bad answer: {e}", c.host))?;
    identity(&answer)
}

/// The identity a TokenReview answer proves, or why it proves none.
pub fn identity(answer: &Value) -> Result<Identity, String> {
    let status = &answer["status"];
    if let Some(e) = status["error"].as_str().filter(|e| !e.is_empty()) {
        return Err(format!("lookup failed: {e}"));
    }
    if status["authenticated"].as_bool() != Some(true) {
        return Err("lookup failed: service account jwt not valid".into());
    }
    let user = &status["user"];
    let username = user["username"].as_str().unwrap_or("");
    let parts: Vec<&str> = username.split(':').collect();
    let (namespace, name) = match parts.as_slice() {
        ["system", "serviceaccount", ns, name] if !ns.is_empty() && !name.is_empty() => {
            (*ns, *name)
        }
        _ => return Err("lookup failed: service account namespace and name not found".into()),
    };
    let uid = user["uid"].as_str().unwrap_or("");
    let fields = serde_json::json!({
        "serviceaccount": {"namespace": namespace, "name": name, "uid": uid},
    });
    let vars = [
        ("serviceaccount.namespace", namespace),
        ("serviceaccount.name", name),
        ("serviceaccount.uid", uid),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    Ok(Identity { fields, vars })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_review_names_the_service_account_or_refuses() {
        let ok = serde_json::json!({"status": {"authenticated": true, "user": {
            "username": "system:serviceaccount:default:web", "uid": "u-1"}}});
        let id = identity(&ok).unwrap();
        assert_eq!(id.vars["serviceaccount.name"], "web");
        assert_eq!(id.fields["serviceaccount"]["namespace"], "default");
        for bad in [
            serde_json::json!({"status": {"authenticated": false}}),
            serde_json::json!({"status": {"error": "token expired"}}),
            serde_json::json!({"status": {"authenticated": true, "user": {"username": "admin"}}}),
            serde_json::json!("garbage"),
        ] {
            assert!(identity(&bad).is_err(), "{bad}");
        }
    }
}
