//! The bench rows that read or write many keys in one request: a prefix
//! read of every key under a prefix (cairn `?recurse`, etcd a range), and a
//! transaction of many puts (cairn `PUT /v1/txn`, etcd `/v3/kv/txn`), the
//! latter also as a fill of fresh keys for the RSS-per-entry rows.
//!
//! Kept apart from `main.rs` so the rows of other work merge cleanly.

use std::sync::Arc;

use anyhow::{Result, bail};
use bytes::Bytes;
use hyper::Method;
use serde_json::{Value, json};

use crate::{Common, Conn, Op, System, b64, find_leader, run_load, send_batches, value_of};

/// `n` keys under `prefix`, each `prefix` + a zero-padded number.
fn prefixed_key(prefix: &str, i: u64) -> String {
    format!("{prefix}{i:010}")
}

/// One transaction that puts every key of `keys` to `value`.
fn txn_op(system: System, keys: &[String], value: &[u8]) -> Op {
    let v = b64(value);
    let body = match system {
        System::Cairn => Value::Array(
            keys.iter()
                .map(|k| json!({"KV": {"Verb": "set", "Key": k, "Value": v}}))
                .collect(),
        ),
        System::Etcd => json!({
            "success": keys
                .iter()
                .map(|k| json!({"requestPut": {"key": b64(k.as_bytes()), "value": v}}))
                .collect::<Vec<_>>(),
        }),
    };
    Op {
        method: match system {
            System::Cairn => Method::PUT,
            System::Etcd => Method::POST,
        },
        path: match system {
            System::Cairn => "/v1/txn".into(),
            System::Etcd => "/v3/kv/txn".into(),
        },
        body: Bytes::from(body.to_string()),
    }
}

/// Sends `op` once and fails unless it succeeded (cairn's txn answers 409
/// with its errors when an operation fails; etcd's txn says `succeeded`).
pub(crate) async fn call_ok(conn: &mut Conn, op: Op) -> Result<Bytes> {
    let (s, _, b) = conn.call(op.method, &op.path, op.body).await?;
    if !s.is_success() {
        bail!("{s}: {}", String::from_utf8_lossy(&b));
    }
    Ok(b)
}

/// Reads every key under a prefix holding `keys` keys: cairn
/// `GET /v1/kv/<prefix>?recurse`, etcd a range over the prefix. The keys are
/// written first (in transactions of 128) and one read checks all come back.
pub async fn cmd_recurse(c: Common, prefix: String) -> Result<()> {
    let leader = find_leader(c.system, &c.addrs).await?;
    let value = value_of(c.value_size);
    let mut conn = Conn::new(&leader);
    let all: Vec<String> = (0..c.keys).map(|i| prefixed_key(&prefix, i)).collect();
    for chunk in all.chunks(128) {
        call_ok(&mut conn, txn_op(c.system, chunk, &value)).await?;
    }
    let op = recurse_op(c.system, &prefix);
    let body = call_ok(&mut conn, op).await?;
    let got = match c.system {
        System::Cairn => serde_json::from_slice::<Vec<Value>>(&body)?.len() as u64,
        // The gateway writes int64 as a string.
        System::Etcd => serde_json::from_slice::<Value>(&body)?["count"]
            .as_str()
            .unwrap_or("0")
            .parse()?,
    };
    if got != c.keys {
        bail!("a read of {prefix} returned {got} keys, not {}", c.keys);
    }
    let system = c.system;
    let next = Arc::new(move |_, _| recurse_op(system, &prefix));
    run_load(&leader, &c, next, &format!("{system:?} recurse")).await
}

/// GETs of one path (cairn only), after one that must succeed.
pub async fn cmd_get(c: Common, path: String) -> Result<()> {
    let leader = find_leader(System::Cairn, &c.addrs).await?;
    let label = format!("GET {path}");
    let op = move || Op {
        method: Method::GET,
        path: path.clone(),
        body: Bytes::new(),
    };
    call_ok(&mut Conn::new(&leader), op()).await?;
    run_load(&leader, &c, Arc::new(move |_, _| op()), &label).await
}

fn recurse_op(system: System, prefix: &str) -> Op {
    match system {
        System::Cairn => Op {
            method: Method::GET,
            path: format!("/v1/kv/{prefix}?recurse"),
            body: Bytes::new(),
        },
        System::Etcd => {
            // The range end of a prefix: its last byte plus one.
            let mut end = prefix.as_bytes().to_vec();
            if let Some(last) = end.last_mut() {
                *last += 1;
            }
            Op {
                method: Method::POST,
                path: "/v3/kv/range".into(),
                body: Bytes::from(
                    json!({"key": b64(prefix.as_bytes()), "range_end": b64(&end)}).to_string(),
                ),
            }
        }
    }
}

/// Transactions of `ops` puts over `c.keys` keys (each transaction's keys
/// distinct, as etcd requires); with `count`, instead writes `count` fresh
/// keys `fill/<n>` once each as fast as `c.clients` clients go, and prints
/// the seconds taken.
pub async fn cmd_txn(c: Common, ops: u64, count: Option<u64>, start: u64) -> Result<()> {
    if ops == 0 || (count.is_none() && ops > c.keys) {
        bail!("--ops must be between 1 and --keys");
    }
    let leader = find_leader(c.system, &c.addrs).await?;
    let value = value_of(c.value_size);
    let system = c.system;
    let Some(total) = count else {
        let keys = c.keys;
        let blocks = keys.div_ceil(ops).max(1);
        let next = Arc::new(move |client: usize, n: u64| {
            // A spread-out block of `ops` consecutive keys (no shared RNG).
            let x = (client as u64)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add(n.wrapping_mul(0xBF58_476D_1CE4_E5B9));
            let base = ((x ^ (x >> 31)) % blocks) * ops;
            let ks: Vec<String> = (0..ops)
                .map(|j| crate::bench_key((base + j) % keys))
                .collect();
            txn_op(system, &ks, &value)
        });
        return run_load(&leader, &c, next, &format!("{system:?} txn of {ops}")).await;
    };
    let batches = total.div_ceil(ops);
    let secs = send_batches(&leader, c.clients, batches, None, move |b| {
        let from = start + b * ops;
        let to = (from + ops).min(start + total);
        let ks: Vec<String> = (from..to).map(|i| format!("fill/{i:011}")).collect();
        txn_op(system, &ks, &value)
    })
    .await?;
    println!(
        "secs={secs:.2} entries={total} rate={:.0}",
        total as f64 / secs
    );
    eprintln!("{system:?} txn fill: {total} entries in txns of {ops} at {leader}: {secs:.1}s");
    Ok(())
}
