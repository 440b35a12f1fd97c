//! Config entries and the discovery chain over HTTP on a real dev server:
//! round trips, CAS, graph validation on write and delete, and hostile
//! bodies refused with a 400 that changes nothing.

mod common;

use common::Server;
use common::asynch::*;
use serde_json::{Value, json};

/// A dev server (with a leader) and an async client.
fn dev() -> (Server, reqwest::Client) {
    (Server::builder().dev().node("dev").start(), client())
}

async fn put_entry(c: &reqwest::Client, p: &Server, body: &Value) -> (u16, String) {
    let r = c.put(p.at("/v1/config")).json(body).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test]
async fn entries_round_trip_with_cas_and_snake_case() {
    let (p, c) = dev();
    let (s, b) = put_entry(
        &c,
        &p,
        &json!({"kind": "service-defaults", "name": "web", "protocol": "http"}),
    )
    .await;
    assert_eq!((s, b.as_str()), (200, "true"));
    let e: Value = get_json(&c, p.at("/v1/config/service-defaults/web")).await;
    assert_eq!(e["Protocol"], "http");
    let modify = e["ModifyIndex"].as_u64().unwrap();
    assert!(e["CreateIndex"].as_u64().unwrap() > 0);

    let resolver = json!({"Kind": "service-resolver", "Name": "web", "ConnectTimeout": "15s",
        "Subsets": {"v1": {"Filter": "Service.Meta.version == v1"}}});
    assert_eq!(put_entry(&c, &p, &resolver).await.0, 200);
    let e: Value = get_json(&c, p.at("/v1/config/service-resolver/web")).await;
    assert_eq!(e["ConnectTimeout"], "15s");

    // CAS on write and delete.
    let stale = c
        .put(p.at("/v1/config?cas=1"))
        .json(&json!({"Kind": "service-defaults", "Name": "web", "Protocol": "grpc"}))
        .send()
        .await
        .unwrap();
    assert_eq!(stale.text().await.unwrap(), "false");
    let ok = c.put(p.at(&format!("/v1/config?cas={modify}"))).json(&json!({"Kind": "service-defaults", "Name": "web", "Protocol": "http", "Meta": {"x": "y"}})).send().await.unwrap();
    assert_eq!(ok.text().await.unwrap(), "true");
    let list: Vec<Value> = get_json(&c, p.at("/v1/config/service-defaults")).await;
    assert_eq!(list.len(), 1);

    let chain: Value = get_json(&c, p.at("/v1/discovery-chain/web")).await;
    assert_eq!(chain["Chain"]["Protocol"], "http");
    assert_eq!(chain["Chain"]["ServiceName"], "web");
    let roots: Value = get_json(&c, p.at("/v1/connect/ca/roots")).await;
    let td = roots["TrustDomain"].as_str().unwrap();
    let sni = chain["Chain"]["Targets"]["web.default.default.dc1"]["SNI"]
        .as_str()
        .unwrap();
    assert!(
        sni.ends_with(td),
        "{sni} should end with the trust domain {td}"
    );

    let overridden: Value = c
        .post(p.at("/v1/discovery-chain/web"))
        .json(&json!({"OverrideConnectTimeout": "2s"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        !overridden["Chain"]["CustomizationHash"]
            .as_str()
            .unwrap_or("")
            .is_empty()
    );

    assert_eq!(
        c.delete(p.at("/v1/config/service-resolver/web"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        c.get(p.at("/v1/config/service-resolver/web"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
}

#[tokio::test]
async fn writes_that_would_break_a_chain_are_refused() {
    let (p, c) = dev();
    put_entry(
        &c,
        &p,
        &json!({"Kind": "service-defaults", "Name": "web", "Protocol": "http"}),
    )
    .await;
    let router = json!({"Kind": "service-router", "Name": "web", "Routes": [{"Match": {"HTTP": {"PathPrefix": "/admin"}}, "Destination": {"Service": "admin"}}]});
    put_entry(
        &c,
        &p,
        &json!({"Kind": "service-defaults", "Name": "admin", "Protocol": "http"}),
    )
    .await;
    assert_eq!(put_entry(&c, &p, &router).await.0, 200);

    // Protocol changes under an existing router.
    let (s, b) = put_entry(
        &c,
        &p,
        &json!({"Kind": "service-defaults", "Name": "web", "Protocol": "tcp"}),
    )
    .await;
    assert_eq!(s, 400, "{b}");
    let e: Value = get_json(&c, p.at("/v1/config/service-defaults/web")).await;
    assert_eq!(e["Protocol"], "http", "the refused write changed nothing");
    // Deleting what the router needs.
    let r = c
        .delete(p.at("/v1/config/service-defaults/web"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(
        c.get(p.at("/v1/config/service-defaults/web"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test]
async fn hostile_bodies_are_400_and_store_nothing() {
    let (p, c) = dev();
    let deep = "[".repeat(10_000) + &"]".repeat(10_000);
    let cases: Vec<(String, &str)> = vec![
        ("{not json".into(), "decod"),
        ("[]".into(), ""),
        ("null".into(), ""),
        (r#"{"Kind": "no-such-kind", "Name": "x"}"#.into(), "kind"),
        (r#"{"Kind": "service-defaults", "Name": "x", "Protocol": 5}"#.into(), ""),
        (r#"{"Kind": "service-defaults", "Name": "x", "Bogus": true}"#.into(), "Bogus"),
        (r#"{"Kind": "service-resolver", "Name": "x", "ConnectTimeout": "forever"}"#.into(), ""),
        (r#"{"Kind": "service-splitter", "Name": "x", "Splits": [{"Weight": 90}]}"#.into(), "100"),
        (r#"{"Kind": "service-router", "Name": "x"}"#.into(), "protocol"),
        (r#"{"Kind": "proxy-defaults", "Name": "not-global"}"#.into(), "global"),
        (r#"{"Kind": "service-resolver", "Name": "x", "Subsets": {"v1": {"Filter": "Service.Meta.version =="}}}"#.into(), "filter"),
        (format!(r#"{{"Kind": "service-defaults", "Name": "x", "Meta": {deep}}}"#), ""),
    ];
    for (body, needle) in cases {
        let r = c
            .put(p.at("/v1/config"))
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let status = r.status();
        let text = r.text().await.unwrap();
        assert_eq!(status, 400, "body {:.80}: {text}", body);
        assert!(
            text.to_lowercase().contains(&needle.to_lowercase()),
            "{needle:?} not in {text:?}"
        );
    }
    for kind in [
        "service-defaults",
        "service-resolver",
        "service-splitter",
        "service-router",
        "proxy-defaults",
    ] {
        let list: Vec<Value> = get_json(&c, p.at(&format!("/v1/config/{kind}"))).await;
        assert!(list.is_empty(), "{kind} stored something: {list:?}");
    }
    assert_eq!(
        c.get(p.at("/v1/config/bogus-kind"))
            .send()
            .await
            .unwrap()
            .status(),
        400
    );
    assert_eq!(
        c.get(p.at("/v1/config/service-defaults/missing"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    assert!(leader_of(&c, &p).await.is_some(), "the server survived");
}
