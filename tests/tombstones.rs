//! Tombstone reaping against a real server: churn of unique keys leaves
//! tombstones that the leader reaps after `--tombstone-ttl`, and no index
//! reported to a (blocking) query goes backwards across the reap.

mod common;

use std::time::Duration;

use common::Server;

fn tombstones(s: &Server) -> u64 {
    s.metric("cairn_state_tombstones") as u64
}

/// Sets (or deletes) `keys` in transactions of 64.
fn txn_all(s: &Server, keys: &[String], verb: &str) {
    for chunk in keys.chunks(64) {
        let ops: Vec<serde_json::Value> = chunk
            .iter()
            .map(|k| serde_json::json!({"KV": {"Verb": verb, "Key": k, "Value": "dg=="}}))
            .collect();
        let r = s.put("/v1/txn", &serde_json::to_string(&ops).unwrap());
        assert_eq!(r.status, 200, "{}", r.body);
    }
}

/// The size of a snapshot file begun after now (writes enough entries to
/// cause them). The first new file may be one begun before now: the second
/// began after it was written.
fn snapshot_after(s: &Server, dir: &std::path::Path) -> u64 {
    let file = dir.join("snapshots/snapshot.bin");
    let modified = || std::fs::metadata(&file).and_then(|m| m.modified()).ok();
    for _ in 0..2 {
        let before = modified();
        for i in 0..40 {
            let r = s.put("/v1/kv/filler", &i.to_string());
            assert_eq!(r.status, 200);
        }
        common::eventually(Duration::from_secs(20), "a new snapshot", || {
            (modified() != before).then_some(())
        });
    }
    std::fs::metadata(&file).unwrap().len()
}

#[test]
fn churned_keys_are_reaped_and_indexes_never_go_backwards() {
    let dir = tempfile::tempdir().unwrap();
    let builder = Server::durable("s1", dir.path())
        .arg("--tombstone-ttl")
        .arg("4s")
        // A snapshot every 32 entries, to see tombstones leave it.
        .arg("--raft-snapshot-threshold")
        .arg("32");
    let mut s = builder.clone().start();
    let r = s.put("/v1/kv/live", "x");
    assert_eq!(r.status, 200);
    let live = s.get("/v1/kv/live").index();
    let keys: Vec<String> = (0..3000).map(|i| format!("churn/{i:05}")).collect();
    txn_all(&s, &keys, "set");
    txn_all(&s, &keys, "delete");
    assert!(tombstones(&s) >= 3000, "{}", tombstones(&s));
    // Snapshots taken now hold every tombstone.
    let with_tombstones = snapshot_after(&s, dir.path());
    assert!(with_tombstones > 3000 * 10, "{with_tombstones} bytes");

    // What queries on the deleted keys report before the reap.
    let one = s.get("/v1/kv/churn/00007");
    assert_eq!(one.status, 404);
    let list = s.get("/v1/kv/churn/?recurse");
    assert_eq!(list.status, 404);
    let keys_list = s.get("/v1/kv/?keys");
    let before = (one.index(), list.index(), keys_list.index());
    assert!(before.0 > 1 && before.1 > 1, "{before:?}");

    // A blocking query across the reap: it answers at the end of its wait
    // (or earlier if woken), never with an index below the one it had.
    let addr = s.http_addr;
    let at = before.1;
    let blocked = std::thread::spawn(move || {
        common::request(
            addr,
            "GET",
            &format!("/v1/kv/churn/?recurse&index={at}&wait=4s"),
            None,
        )
    });

    common::eventually(Duration::from_secs(60), "the tombstones reaped", || {
        (tombstones(&s) <= 10).then_some(())
    });
    let r = blocked.join().unwrap();
    assert!(
        r.index() >= at,
        "blocking query went back: {} < {at}",
        r.index()
    );

    let after = (
        s.get("/v1/kv/churn/00007").index(),
        s.get("/v1/kv/churn/?recurse").index(),
        s.get("/v1/kv/?keys").index(),
    );
    assert!(
        after.0 >= before.0 && after.1 >= before.1 && after.2 >= before.2,
        "an index went backwards across the reap: {before:?} -> {after:?}"
    );
    // Snapshots taken from now on are back to their size before the churn.
    let without = snapshot_after(&s, dir.path());
    assert!(
        without < with_tombstones / 4,
        "snapshot {with_tombstones} -> {without} bytes"
    );
    // A live key's index is its own.
    assert_eq!(s.get("/v1/kv/live").index(), live);

    // Reaped tombstones and the floors are persisted: a restart finds
    // neither the tombstones nor lower indexes.
    s.stop(Duration::from_secs(10));
    let s = builder.start();
    assert!(tombstones(&s) <= 10);
    let restarted = (
        s.get("/v1/kv/churn/00007").index(),
        s.get("/v1/kv/churn/?recurse").index(),
        s.get("/v1/kv/?keys").index(),
    );
    assert!(
        restarted.0 >= after.0 && restarted.1 >= after.1 && restarted.2 >= after.2,
        "{after:?} -> {restarted:?} after a restart"
    );
}
