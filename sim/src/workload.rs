//! Simulated clients: KV put/get/CAS/delete and catalog register/deregister,
//! concurrently, against any server, recording each operation's call and
//! return time (simulated) and its answer.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn::structs::{DeregisterRequest, NodeService, RegisterRequest};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::acl::Access;
use crate::linearizability::{Input, Output};
use crate::node::{
    API_PORT, ApiReply, ApiRequest, StreamItem, call, calls, now_us, read_msg, write_msg,
};

/// The keys every client works on: few, so that clients contend.
pub const KEYS: [&str; 4] = ["k/a", "k/b", "k/c", "k/d"];

/// Longer than a server's hold time on a write (7 s) plus forwarding.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(8);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Kind {
    Kv {
        key: String,
        input: Input,
        consistent: bool,
    },
    Register {
        node: String,
        service: String,
    },
    Deregister {
        node: String,
        service: String,
    },
}

/// One operation as the client saw it. Times are simulated microseconds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Record {
    pub client: u64,
    pub kind: Kind,
    pub call: u64,
    /// `None`: no answer (timeout or error), so the outcome is unknown.
    pub ret: Option<u64>,
    pub output: Option<Output>,
    /// Which server the client asked.
    pub server: usize,
}

pub type History = Arc<Mutex<Vec<Record>>>;

fn value_of(bytes: &[u8]) -> Option<u64> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

fn text(v: u64) -> Vec<u8> {
    v.to_string().into_bytes()
}

/// Runs one client until `until` (simulated time since the start).
///
/// A writer mixes every operation and sticks to one server until an error
/// (as a client library does). A reader only reads, each time from a server
/// picked at random: the reads that meet a deposed leader which does not
/// know it yet, and so show what each read mode guarantees.
pub async fn client(
    id: u64, seed: u64, servers: Vec<IpAddr>, until: Duration, history: History, reader: bool,
    access: Access,
) -> turmoil::Result {
    let token = access.workload().await;
    let mut rng = StdRng::seed_from_u64(seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut target = rng.gen_range(0..servers.len());
    // The last entry this client read per key: (value, ModifyIndex).
    let mut seen: BTreeMap<&str, (Option<u64>, u64)> = BTreeMap::new();
    let mut registered: BTreeMap<String, bool> = BTreeMap::new();
    let node = format!("node-{id}");
    let mut seq = 0u64;
    while turmoil::sim_elapsed().unwrap_or_default() < until {
        seq += 1;
        let fresh = (id << 40) | seq;
        let key = KEYS[rng.gen_range(0..KEYS.len())];
        let dice = if reader {
            target = rng.gen_range(0..servers.len());
            rng.gen_range(25..65)
        } else {
            rng.gen_range(0..100)
        };
        let (kind, req) = if dice < 25 {
            (
                Kind::Kv {
                    key: key.into(),
                    input: Input::Put(fresh),
                    consistent: false,
                },
                calls::put(key, text(fresh), None),
            )
        } else if dice < 65 {
            let consistent = dice >= 45;
            (
                Kind::Kv {
                    key: key.into(),
                    input: Input::Get,
                    consistent,
                },
                ApiRequest::Get {
                    key: key.into(),
                    consistent,
                },
            )
        } else if dice < 80 {
            let (expected, index) = match seen.get(key) {
                Some(&(Some(v), m)) => (Some(v), m),
                _ => (None, 0),
            };
            (
                Kind::Kv {
                    key: key.into(),
                    input: Input::Cas {
                        expected,
                        new: fresh,
                    },
                    consistent: false,
                },
                calls::put(key, text(fresh), Some(index)),
            )
        } else if dice < 87 {
            (
                Kind::Kv {
                    key: key.into(),
                    input: Input::Delete,
                    consistent: false,
                },
                calls::delete(key),
            )
        } else {
            let service = format!("svc-{id}-{}", rng.gen_range(0..3));
            let up = registered.get(&service).copied().unwrap_or(false);
            if !up || rng.gen_bool(0.3) {
                let req = RegisterRequest {
                    node: node.clone(),
                    address: format!("{node}.sim"),
                    service: Some(NodeService {
                        id: service.clone(),
                        service: "web".into(),
                        port: 8080,
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                (
                    Kind::Register {
                        node: node.clone(),
                        service: service.clone(),
                    },
                    calls::register(req),
                )
            } else {
                let req = DeregisterRequest {
                    node: node.clone(),
                    service_id: service.clone(),
                    ..Default::default()
                };
                (
                    Kind::Deregister {
                        node: node.clone(),
                        service: service.clone(),
                    },
                    calls::deregister(req),
                )
            }
        };

        let asked = target;
        let addr = SocketAddr::new(servers[target], API_PORT);
        let started = now_us();
        let reply = call(addr, &req, token.as_deref(), CLIENT_TIMEOUT).await;
        let ended = now_us();
        let written = calls::done(&reply);
        let output = match (&kind, reply) {
            (Kind::Kv { input, .. }, _) if written.is_some() => match (input, written) {
                (Input::Cas { .. }, Some(ok)) => Some(Output::Cas(ok)),
                (_, Some(true)) => Some(Output::Done),
                _ => None,
            },
            (Kind::Kv { .. }, Ok(ApiReply::Get(Ok(entry)))) => {
                let v = entry.as_ref().and_then(|e| value_of(&e.value));
                seen.insert(key, (v, entry.map_or(0, |e| e.modify_index)));
                Some(Output::Value(v))
            }
            (Kind::Register { service, .. }, _) if written == Some(true) => {
                registered.insert(service.clone(), true);
                Some(Output::Done)
            }
            (Kind::Deregister { service, .. }, _) if written == Some(true) => {
                registered.insert(service.clone(), false);
                Some(Output::Done)
            }
            _ => None,
        };
        if output.is_none() {
            // Try another server next time, as a client library would.
            target = rng.gen_range(0..servers.len());
        }
        history.lock().unwrap().push(Record {
            client: id,
            kind,
            call: started,
            ret: output.map(|_| ended),
            output,
            server: asked,
        });
        let pause = rng.gen_range(0..40);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    Ok(())
}

/// After the faults heal: one `?consistent` read of every key, retried
/// until it is answered, recorded like any other read.
pub async fn final_reads(
    servers: Vec<IpAddr>, history: History, access: Access,
) -> turmoil::Result {
    let token = access.workload().await;
    for (i, key) in KEYS.iter().enumerate() {
        let mut target = i % servers.len();
        loop {
            let req = ApiRequest::Get {
                key: key.to_string(),
                consistent: true,
            };
            let started = now_us();
            let reply = call(
                SocketAddr::new(servers[target], API_PORT),
                &req,
                token.as_deref(),
                CLIENT_TIMEOUT,
            )
            .await;
            let ended = now_us();
            if let Ok(ApiReply::Get(Ok(entry))) = reply {
                let v = entry.and_then(|e| value_of(&e.value));
                history.lock().unwrap().push(Record {
                    client: u64::MAX,
                    kind: Kind::Kv {
                        key: key.to_string(),
                        input: Input::Get,
                        consistent: true,
                    },
                    call: started,
                    ret: Some(ended),
                    output: Some(Output::Value(v)),
                    server: target,
                });
                break;
            }
            target = (target + 1) % servers.len();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// What the stream subscriber saw, in order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StreamRecord {
    /// Subscribed at `server` from `index` (0: with a snapshot).
    Connect { server: usize, index: u64 },
    /// One batch as it arrived (whole indexes).
    Batch(Vec<StreamItem>),
}

pub type StreamLog = Arc<Mutex<Vec<StreamRecord>>>;

/// Follows the KV topic's event stream until `until`, moving to another
/// server every so often (and on any error), resuming from the last index
/// it holds, as a streaming client does. Records every batch.
pub async fn subscriber(
    seed: u64, servers: Vec<IpAddr>, until: Duration, stay_ms: std::ops::Range<u64>,
    log: StreamLog, access: Access,
) -> turmoil::Result {
    // With ACLs on, a token that may not read every key.
    let token = access.subscriber().await;
    let mut rng = StdRng::seed_from_u64(seed ^ 0x005E_ED0F_5EED ^ stay_ms.start);
    // The index the subscriber's view is complete up to.
    let mut cursor = 0u64;
    while turmoil::sim_elapsed().unwrap_or_default() < until {
        let server = rng.gen_range(0..servers.len());
        let stay = Duration::from_millis(rng.gen_range(stay_ms.clone()));
        let leave_at = turmoil::sim_elapsed().unwrap_or_default() + stay;
        let addr = SocketAddr::new(servers[server], API_PORT);
        let connected = tokio::time::timeout(Duration::from_secs(1), async {
            let mut s = turmoil::net::TcpStream::connect(addr).await?;
            let env = crate::node::Envelope {
                req: ApiRequest::Subscribe { index: cursor },
                token: token.clone(),
                forwarded: false,
            };
            write_msg(&mut s, &env).await?;
            Ok::<_, std::io::Error>(s)
        })
        .await;
        let Ok(Ok(mut stream)) = connected else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        log.lock().unwrap().push(StreamRecord::Connect {
            server,
            index: cursor,
        });
        loop {
            let now = turmoil::sim_elapsed().unwrap_or_default();
            let left = leave_at.min(until).saturating_sub(now);
            if left.is_zero() {
                break;
            }
            let Ok(Ok(ApiReply::Stream(items))) =
                tokio::time::timeout(left, read_msg::<ApiReply>(&mut stream)).await
            else {
                break;
            };
            for item in &items {
                match item {
                    StreamItem::EndOfSnapshot(i) => cursor = *i,
                    StreamItem::Event { index, .. } if !is_snapshot(&items) => cursor = *index,
                    _ => {}
                }
            }
            log.lock().unwrap().push(StreamRecord::Batch(items));
        }
    }
    Ok(())
}

/// A snapshot arrives as one batch ending in `EndOfSnapshot`.
pub fn is_snapshot(items: &[StreamItem]) -> bool {
    matches!(items.last(), Some(StreamItem::EndOfSnapshot(_)))
}

/// One large write of a burst, as its client saw it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BurstRecord {
    pub key: String,
    pub len: usize,
    /// Every byte of the value.
    pub fill: u8,
    pub call: u64,
    /// `Some` when acknowledged.
    pub ret: Option<u64>,
}

pub type BurstLog = Arc<Mutex<Vec<BurstRecord>>>;

/// Bytes of a burst's writes: hundreds of KiB, each alone in its Raft entry
/// and many times a small write's.
pub const BURST_BYTES: std::ops::Range<usize> = (128 << 10)..(448 << 10);

/// One client of a burst of large writes: at `at`, one write of
/// `BURST_BYTES` to its own key (`big/<id>`) through a random server, at
/// the same moment as the burst's other clients.
pub async fn burst(
    id: u64, seed: u64, servers: Vec<IpAddr>, at: Duration, log: BurstLog, access: Access,
) -> turmoil::Result {
    let token = access.workload().await;
    let mut rng = StdRng::seed_from_u64(seed ^ 0xB175_7000 ^ id);
    tokio::time::sleep(at).await;
    let len = rng.gen_range(BURST_BYTES);
    let fill = rng.r#gen::<u8>();
    let key = format!("big/{id}");
    let req = calls::put(&key, vec![fill; len], None);
    let addr = SocketAddr::new(servers[rng.gen_range(0..servers.len())], API_PORT);
    let call_at = now_us();
    let reply = call(addr, &req, token.as_deref(), CLIENT_TIMEOUT).await;
    let acked = calls::done(&reply) == Some(true);
    log.lock().unwrap().push(BurstRecord {
        key,
        len,
        fill,
        call: call_at,
        ret: acked.then(now_us),
    });
    Ok(())
}
