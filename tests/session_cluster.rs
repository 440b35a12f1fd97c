//! Sessions in a 3-server cluster: a session created through a follower is
//! on that follower's node, and TTLs are enforced across a leader change
//! (the new leader arms every session afresh: an unrenewed one expires, a
//! renewed one lives on).

mod common;

use std::time::Duration;

use common::asynch::*;
use common::{Server, by_raft, cluster};
use serde_json::{Value, json};

async fn put_json(c: &reqwest::Client, p: &Server, path: &str, body: &str) -> (u16, String) {
    let r = c
        .put(p.at(path))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn session_ids(c: &reqwest::Client, p: &Server) -> Option<Vec<String>> {
    let r = c.get(p.at("/v1/session/list?stale")).send().await.ok()?;
    let list: Vec<Value> = r.json().await.ok()?;
    Some(
        list.iter()
            .map(|s| s["ID"].as_str().unwrap().to_string())
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ttls_hold_across_a_leader_change_and_sessions_default_to_the_receiving_node() {
    let mut procs = cluster(3, &[]);
    let c = client();
    let leader = cluster_leader(&c, &procs).await;
    let li = by_raft(&procs, &leader);
    let fi = (li + 1) % 3;

    let body = json!({"TTL": "10s", "LockDelay": "0s"}).to_string();
    let (status, text) = put_json(&c, &procs[fi], "/v1/session/create", &body).await;
    assert_eq!(status, 200, "{text}");
    let lapsed: String = serde_json::from_str::<Value>(&text).unwrap()["ID"]
        .as_str()
        .unwrap()
        .into();
    let (_, text) = put_json(&c, &procs[fi], "/v1/session/create", &body).await;
    let renewed: String = serde_json::from_str::<Value>(&text).unwrap()["ID"]
        .as_str()
        .unwrap()
        .into();
    let info: Value = get_json(&c, procs[fi].at(&format!("/v1/session/info/{lapsed}"))).await;
    assert_eq!(
        info[0]["Node"],
        procs[fi].name(),
        "the receiving server's node"
    );
    let (_, held) = put_json(
        &c,
        &procs[fi],
        &format!("/v1/kv/elect?acquire={lapsed}"),
        "x",
    )
    .await;
    assert_eq!(held, "true");

    procs[li].kill();
    let survivors: Vec<&Server> = all_but(&procs, li);
    eventually(Duration::from_secs(20), "a new leader", || async {
        let l = agreed_leader(&c, &survivors).await;
        (l != leader).then_some(())
    })
    .await;

    // Renew one session through the leader change; let the other lapse.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (status, _) = put_json(
            &c,
            survivors[0],
            &format!("/v1/session/renew/{renewed}"),
            "",
        )
        .await;
        assert!(status == 200 || status == 500, "renew answered {status}");
        let views = views_of(&c, &survivors).await;
        let gone_everywhere = views
            .iter()
            .all(|ids| ids.as_ref().is_some_and(|ids| !ids.contains(&lapsed)));
        if gone_everywhere {
            for ids in &views {
                assert!(
                    ids.as_ref().unwrap().contains(&renewed),
                    "a renewed session expired across the leader change"
                );
            }
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the unrenewed session never expired after the leader change"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let r: Value = get_json(&c, survivors[0].at("/v1/kv/elect?stale")).await;
    assert_eq!(
        r[0].get("Session"),
        None,
        "the expired session's lock is released"
    );
}

async fn views_of(c: &reqwest::Client, procs: &[&Server]) -> Vec<Option<Vec<String>>> {
    let mut out = Vec::new();
    for p in procs {
        out.push(session_ids(c, p).await);
    }
    out
}

/// A TTL session made just before a leader change, its holder then
/// silent: the next leader must arm its timer and destroy it. Its duties
/// start only once it has applied every entry before its own term (the
/// barrier Consul's leader waits on before `establishLeadership`); a
/// leader that armed its timers from a state without the create would
/// keep the session, and the lock it holds, for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_created_just_before_a_leader_change_still_expires() {
    let procs = cluster(3, &[]);
    let c = client();
    let leader = cluster_leader(&c, &procs).await;
    let li = by_raft(&procs, &leader);
    // Large writes just before: the followers have much to apply when the
    // create commits, so the next leader may hold it in its log, not yet
    // in its state, when it takes office.
    let value = "v".repeat(256 * 1024);
    let writes = (0..48).map(|i| {
        let (c, p, v) = (c.clone(), &procs[li], value.clone());
        async move { put_json(&c, p, &format!("/v1/kv/bulk/{i}"), &v).await }
    });
    let body = json!({"TTL": "10s", "LockDelay": "0s"}).to_string();
    let (written, (status, text)) = tokio::join!(
        futures_util::future::join_all(writes),
        put_json(&c, &procs[li], "/v1/session/create", &body)
    );
    assert!(written.iter().all(|(s, _)| *s == 200));
    assert_eq!(status, 200, "{text}");
    let id: String = serde_json::from_str::<Value>(&text).unwrap()["ID"]
        .as_str()
        .unwrap()
        .into();
    // At once: the next leader takes office while the create may still be
    // on its way into its state.
    let (status, text) = put_json(&c, &procs[li], "/v1/operator/raft/transfer-leader", "").await;
    assert_eq!(status, 200, "{text}");
    let all: Vec<&Server> = procs.iter().collect();
    eventually(Duration::from_secs(20), "a new leader", || async {
        let l = agreed_leader(&c, &all).await;
        (l != leader).then_some(())
    })
    .await;
    // Never renewed: gone from every server within twice its TTL of the
    // change, with room for a slow machine.
    eventually(
        Duration::from_secs(45),
        "the silent session expired under the new leader",
        || async {
            let views = views_of(&c, &all).await;
            views
                .iter()
                .all(|ids| ids.as_ref().is_some_and(|ids| !ids.contains(&id)))
                .then_some(())
        },
    )
    .await;
}
