//! The KV API of a real dev server, as Consul clients use it.

mod common;

use std::time::{Duration, Instant};

use common::Server;
use common::asynch::*;
use serde_json::{Value, json};

/// A dev server (with a leader) and an async client.
fn dev() -> (Server, reqwest::Client) {
    (Server::builder().dev().node("dev").start(), client())
}

#[tokio::test]
async fn put_get_cas_flags_raw_keys_and_delete() {
    let (p, c) = dev();
    let put = |path: &str, body: &'static str| send_text(c.put(p.at(path)).body(body));
    assert_eq!(put("/v1/kv/app/config?flags=42", "v1").await, "true");
    let r = c.get(p.at("/v1/kv/app/config")).send().await.unwrap();
    let index = consul_index(&r);
    assert_eq!(r.headers()["x-consul-knownleader"], "true");
    let body: Vec<Value> = r.json().await.unwrap();
    assert_eq!(body[0]["Key"], "app/config");
    assert_eq!(body[0]["Flags"], 42);
    assert_eq!(body[0]["Value"], "djE=");
    assert_eq!(body[0]["ModifyIndex"].as_u64(), Some(index));

    // cas with a stale index fails, with the current one succeeds
    assert_eq!(put("/v1/kv/app/config?cas=1", "v2").await, "false");
    let ok = c
        .put(p.at(&format!("/v1/kv/app/config?cas={index}")))
        .body("v2")
        .send()
        .await
        .unwrap();
    assert_eq!(ok.text().await.unwrap(), "true");
    let raw = c.get(p.at("/v1/kv/app/config?raw")).send().await.unwrap();
    // A writer's bytes on the UI's origin: never sniffed, never scripted.
    assert_eq!(raw.headers()["x-content-type-options"], "nosniff");
    assert_eq!(raw.headers()["content-security-policy"], "sandbox");
    assert_eq!(raw.text().await.unwrap(), "v2");
    let json = c.get(p.at("/v1/kv/app/config")).send().await.unwrap();
    assert_eq!(json.headers()["x-content-type-options"], "nosniff");

    put("/v1/kv/app/other/x", "1").await;
    let keys: Vec<String> = get_json(&c, p.at("/v1/kv/app/?keys&separator=/")).await;
    assert_eq!(keys, vec!["app/config", "app/other/"]);
    let all: Vec<Value> = get_json(&c, p.at("/v1/kv/app?recurse")).await;
    assert_eq!(all.len(), 2);

    assert_eq!(
        send_text(c.delete(p.at("/v1/kv/app?recurse"))).await,
        "true"
    );
    let gone = c.get(p.at("/v1/kv/app/config")).send().await.unwrap();
    assert_eq!(gone.status(), 404);
    assert!(gone.headers().contains_key("x-consul-index"));
}

#[tokio::test]
async fn blocking_get_wakes_on_its_key_only() {
    let (p, c) = dev();
    c.put(p.at("/v1/kv/watched"))
        .body("a")
        .send()
        .await
        .unwrap();
    let r = c.get(p.at("/v1/kv/watched")).send().await.unwrap();
    let index = consul_index(&r);

    let url = p.at(&format!("/v1/kv/watched?index={index}&wait=3s"));
    let (c2, started) = (c.clone(), Instant::now());
    let waiter = tokio::spawn(async move {
        let r = c2.get(url).send().await.unwrap();
        (consul_index(&r), started.elapsed())
    });
    wait_parked(&c, &p, 1).await;
    // An unrelated write must not wake it...
    c.put(p.at("/v1/kv/unrelated"))
        .body("x")
        .send()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "an unrelated write woke the blocking query"
    );
    // ...a write to its key does, promptly.
    c.put(p.at("/v1/kv/watched"))
        .body("b")
        .send()
        .await
        .unwrap();
    let (new_index, took) = waiter.await.unwrap();
    assert!(new_index > index);
    assert!(took < Duration::from_secs(2), "woke after {took:?}");

    // With nothing changing it returns after the wait, same index.
    let started = Instant::now();
    let r = c
        .get(p.at(&format!("/v1/kv/watched?index={new_index}&wait=500ms")))
        .send()
        .await
        .unwrap();
    assert_eq!(consul_index(&r), new_index);
    assert!(started.elapsed() >= Duration::from_millis(450));
}

#[tokio::test]
async fn txn_applies_all_or_nothing() {
    let (p, c) = dev();
    let ok = c
        .put(p.at("/v1/txn"))
        .json(&json!([
            {"KV": {"Verb": "set", "Key": "t/a", "Value": "YQ=="}},
            {"KV": {"Verb": "set", "Key": "t/b", "Value": "Yg==", "Flags": 7}},
            {"KV": {"Verb": "get", "Key": "t/a"}}
        ]))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let body: Value = ok.json().await.unwrap();
    assert_eq!(body["Results"].as_array().unwrap().len(), 3);
    assert_eq!(body["Results"][2]["KV"]["Value"], "YQ==");

    let bad = c
        .put(p.at("/v1/txn"))
        .json(&json!([
            {"KV": {"Verb": "set", "Key": "t/c", "Value": "Yw=="}},
            {"KV": {"Verb": "check-not-exists", "Key": "t/a"}}
        ]))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 409);
    let body: Value = bad.json().await.unwrap();
    assert_eq!(body["Errors"][0]["OpIndex"], 1);
    assert_eq!(
        c.get(p.at("/v1/kv/t/c")).send().await.unwrap().status(),
        404
    );
}

#[tokio::test]
async fn bad_input_is_400_and_changes_nothing() {
    let (p, c) = dev();
    let big = vec![b'x'; 512 * 1024 + 1];
    let huge = vec![b'x'; 5 << 20];
    let cases: Vec<(reqwest::RequestBuilder, &str)> = vec![
        (c.put(p.at("/v1/kv/k?flags=abc")).body("v"), "flags"),
        (c.put(p.at("/v1/kv/k?cas=-1")).body("v"), "cas"),
        (c.put(p.at("/v1/kv/")).body("v"), "Missing key"),
        (c.get(p.at("/v1/kv/")), "Missing key"),
        (c.get(p.at("/v1/kv/k?stale&consistent")), "conflicting"),
        (c.get(p.at("/v1/kv/k?index=1&wait=forever")), "wait"),
        (c.put(p.at("/v1/txn")).body("{not json"), "decode"),
        (
            c.put(p.at("/v1/txn"))
                .body(r#"[{"KV":{"Verb":"explode","Key":"k"}}]"#),
            "verb",
        ),
        (
            c.put(p.at("/v1/txn"))
                .body(r#"[{"KV":{"Verb":"set","Key":"k","Value":"!!"}}]"#),
            "base64",
        ),
        (
            c.put(p.at("/v1/txn"))
                .body(r#"[{"KV":{"Verb":"set","Key":"k","Bogus":1}}]"#),
            "Bogus",
        ),
    ];
    for (req, reason) in cases {
        let r = req.send().await.unwrap();
        let status = r.status();
        let text = r.text().await.unwrap();
        assert_eq!(status, 400, "{reason}: {text}");
        assert!(
            text.to_lowercase().contains(&reason.to_lowercase()),
            "{reason} not in {text:?}"
        );
        assert!(
            !text.contains('\n') || text.trim_end().lines().count() == 1,
            "one-line reason: {text:?}"
        );
    }
    // A datacenter with no path to it: Consul's 500, nothing written.
    let r = c
        .put(p.at("/v1/kv/k?dc=elsewhere"))
        .body("v")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 500);
    assert_eq!(r.text().await.unwrap(), "No path to datacenter");
    // Over a size limit: 413, as Consul answers it, and nothing changes.
    let big_b64 = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(&big)
    };
    let big_txn = json!([{"KV": {"Verb": "set", "Key": "k", "Value": big_b64}}]);
    let cases: Vec<(reqwest::RequestBuilder, &str)> = vec![
        (c.put(p.at("/v1/kv/k")).body(big.clone()), "too large"),
        (c.put(p.at("/v1/txn")).json(&big_txn), "too large"),
        (
            c.put(p.at("/v1/txn"))
                .json(&vec![json!({"KV":{"Verb":"set","Key":"k"}}); 129]),
            "too many",
        ),
    ];
    for (req, reason) in cases {
        let r = req.send().await.unwrap();
        let status = r.status();
        let text = r.text().await.unwrap();
        assert_eq!(status, 413, "{reason}: {text}");
        assert!(text.contains(reason), "{reason} not in {text:?}");
    }
    // A body past the 4 MiB cap is refused before it is read (the server
    // then closes that connection, so it goes last, on its own client).
    let r = client()
        .put(p.at("/v1/kv/k"))
        .body(huge)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    assert_eq!(c.get(p.at("/v1/kv/k")).send().await.unwrap().status(), 404);
    // The server is still healthy.
    assert!(leader_of(&c, &p).await.is_some());
}

#[tokio::test]
async fn metrics_and_agent_self() {
    let (p, c) = dev();
    c.put(p.at("/v1/kv/m")).body("1").send().await.unwrap();
    let text = c
        .get(p.at("/v1/agent/metrics?format=prometheus"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("# TYPE cairn_raft_applied counter\ncairn_raft_applied_total "));
    assert!(text.contains("cairn_raft_is_leader 1"));
    let me: Value = get_json(&c, p.at("/v1/agent/self")).await;
    assert_eq!(me["Config"]["Datacenter"], "dc1");
    assert_eq!(me["Config"]["NodeName"], "dev");
}
