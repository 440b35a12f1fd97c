//! Network coordinates: Consul's `/v1/coordinate` endpoints, `?near`
//! sorting for the catalog and health reads, and the servers' probes of
//! one another that give each server its own coordinate.
//!
//! - `PUT /v1/coordinate/update` (forwarded to the leader like any write)
//!   queues the node's coordinate for the leader's next batch
//!   (`leader::coordinates`), so agents cost no Raft write each.
//! - Each server times a light `GET /v1/internal/coordinate/ping?stale` to
//!   the other servers in turn, whose answer carries their coordinate; the
//!   leader also queues the coordinate each answer carries, so followers'
//!   coordinates reach the state without a write path of their own.
//!
//! The reads (`/v1/coordinate/datacenters|nodes|node/:n`) are filtered by
//! `node:read`. An update needs `node:write`, is at most 16 KiB and is
//! checked before it is queued. A probe goes out every `PROBE_EVERY`
//! (2 s). `sort_near` is the one `?near=` sort of the catalog and health
//! lists.

use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use serde::{Deserialize, Serialize};

use super::{App, Opts, Watch, blocking, json_filtered, keep};
use crate::coordinate::{Coordinate, Update};
pub use crate::endpoint::coordinate::sort_near_node;
use crate::error::{Error, Result};
use crate::request::authz::Authz;
use crate::request::{NamedRoutes, Params, decode_json};
use crate::server::Server;
use crate::state::keys;

/// The largest `PUT /v1/coordinate/update` body: a coordinate is a few
/// hundred bytes.
pub const MAX_UPDATE_BODY: usize = 16 * 1024;
/// How often a server probes one of the other servers.
pub const PROBE_EVERY: Duration = Duration::from_secs(2);
const PING: &str = "/v1/internal/coordinate/ping";

pub fn routes() -> Router<App> {
    Router::new()
        .route("/v1/coordinate/datacenters", get(datacenters))
        .route("/v1/coordinate/nodes", get(nodes))
        .named("/v1/coordinate/node/", "Missing node name", get(node))
        .route("/v1/coordinate/update", put(update))
        .route(PING, get(ping))
}

/// One row of a datacenter's server coordinates; a ping's answer.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ServerCoord {
    node: String,
    coord: Coordinate,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Datacenter {
    datacenter: String,
    #[serde(rename = "AreaID")]
    area_id: &'static str,
    coordinates: Vec<ServerCoord>,
}

/// `GET /v1/coordinate/datacenters`: the servers' coordinates, named as
/// in the catalog (Consul strips the WAN names' `.dc`), with no ACL filter,
/// as Consul. This server's own is its live estimate, there from its start
/// (as Consul's comes from serf, not the state); the others' are those
/// the state holds.
async fn datacenters(State(s): State<App>, _: Opts) -> Response {
    let st = s.state();
    let own = s.node_name();
    // Itself even before it is in a Raft configuration, as in serf's pool.
    let mut names = super::liveness::server_names(&s);
    if !names.iter().any(|n| n == own) {
        names.push(own.to_owned());
    }
    let mut coordinates: Vec<ServerCoord> = names
        .into_iter()
        .filter_map(|name| {
            let coord = if name == own {
                s.coordinate().lock().coordinate()
            } else {
                st.coordinates.get(&name)?.coord.clone()
            };
            Some(ServerCoord { node: name, coord })
        })
        .collect();
    coordinates.sort_by(|a, b| a.node.cmp(&b.node));
    axum::Json(vec![Datacenter {
        datacenter: s.datacenter().to_owned(),
        area_id: "wan",
        coordinates,
    }])
    .into_response()
}

/// The stored coordinates the token may see (node:read), blocking on any
/// coordinate change.
async fn read(
    s: &Server, a: &mut Authz, opts: &crate::request::QueryOptions, only: Option<&str>,
) -> Result<(u64, Vec<Update>, bool)> {
    let (index, mut rows) = blocking(s, opts, a, Watch::Keys(vec![keys::COORDINATES]), |st, _| {
        let rows: Vec<Update> = match only {
            Some(n) => st
                .coordinates
                .get(n)
                .map(|c| (**c).clone())
                .into_iter()
                .collect(),
            None => st.coordinates.values().map(|c| (**c).clone()).collect(),
        };
        (st.index_of([&keys::COORDINATES]), rows)
    })
    .await?;
    let filtered = keep(&mut rows, |u| a.node_read(&u.node));
    Ok((index, rows, filtered))
}

/// `GET /v1/coordinate/nodes`.
async fn nodes(State(s): State<App>, mut a: Authz, Opts(_, opts): Opts) -> Result<Response> {
    let (index, rows, filtered) = read(&s, &mut a, &opts, None).await?;
    Ok(json_filtered(&s, index, &rows, filtered))
}

/// `GET /v1/coordinate/node/:node`: a list of one, or 404.
async fn node(
    State(s): State<App>, mut a: Authz, Path(name): Path<String>, Opts(_, opts): Opts,
) -> Result<Response> {
    let (index, rows, filtered) = read(&s, &mut a, &opts, Some(&name)).await?;
    if rows.is_empty() {
        let mut resp = Error::NotFound(String::new()).into_response();
        resp.headers_mut().extend(super::meta_headers(&s, index));
        return Ok(resp);
    }
    Ok(json_filtered(&s, index, &rows, filtered))
}

/// `PUT /v1/coordinate/update`: checked and queued for the leader's next
/// batch (answered by the leader: the middleware forwards it).
async fn update(State(s): State<App>, a: Authz, _: Opts, body: Bytes) -> Result<Response> {
    if body.len() > MAX_UPDATE_BODY {
        return Err(Error::TooLarge(format!(
            "Request body too large, max size: {MAX_UPDATE_BODY} bytes"
        )));
    }
    let u: Update = decode_json(&body)?;
    if u.node.is_empty() {
        return Err(Error::bad("Must provide node"));
    }
    if u.node.chars().any(char::is_control) || u.segment.chars().any(char::is_control) {
        return Err(Error::bad(format!("Invalid node name {:?}", u.node)));
    }
    a.require(a.node_write(&u.node), "node:write", &u.node)?;
    u.coord
        .check()
        .map_err(|e| Error::bad(format!("rejected bad coordinate: {e}")))?;
    if !s.coordinate_updates().push(u) {
        return Err(Error::Busy(
            "Coordinate update rate limit exceeded, increase SyncCoordinateRateTarget".into(),
        ));
    }
    Ok(().into_response())
}

/// `GET /v1/internal/coordinate/ping`: this server's node and live
/// coordinate, for the other servers' probes (Consul shows servers'
/// coordinates to anyone: `/v1/coordinate/datacenters`).
async fn ping(State(s): State<App>) -> Response {
    axum::Json(ServerCoord {
        node: s.node_name().to_owned(),
        coord: s.coordinate().lock().coordinate(),
    })
    .into_response()
}

/// `?near=NODE` (`_agent`: this server's node) on a list of rows: sorted
/// by the estimated RTT from that node, nodes without a coordinate last,
/// the order otherwise kept. A near node without a coordinate sorts
/// nothing, as Consul.
pub fn sort_near<T>(s: &Server, p: &Params, rows: &mut [T], node_of: impl Fn(&T) -> &str) {
    let near = match p.get("near") {
        None | Some("") => return,
        Some("_agent") => s.node_name(),
        Some(n) => n,
    };
    sort_near_node(s, near, rows, node_of)
}

/// Every server's probes, for as long as it runs: one other server every
/// [`PROBE_EVERY`], in turn. Bounded: one request in flight, a timeout of
/// the period.
pub async fn probe_servers(s: App) {
    let mut tick = tokio::time::interval(PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut turn = 0usize;
    loop {
        tick.tick().await;
        let peers: Vec<String> = s
            .cluster()
            .members()
            .into_iter()
            .filter(|(_, n, _)| n.name != s.node_name())
            .map(|(_, n, _)| n.http_addr)
            .collect();
        if peers.is_empty() {
            continue;
        }
        turn = turn.wrapping_add(1);
        let addr = &peers[turn % peers.len()];
        if let Err(e) = probe(&s, addr).await {
            tracing::debug!(peer = %addr, error = %e, "coordinate probe failed");
        }
    }
}

async fn probe(s: &Server, addr: &str) -> anyhow::Result<()> {
    let base = if addr.starts_with("https://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    let started = Instant::now();
    let resp = s
        .http_client()
        .get(format!("{base}{PING}?stale"))
        .timeout(PROBE_EVERY)
        .send()
        .await?
        .error_for_status()?;
    let body = resp.bytes().await?;
    let rtt = started.elapsed();
    if body.len() > MAX_UPDATE_BODY {
        anyhow::bail!("ping answer too large");
    }
    let peer: ServerCoord = serde_json::from_slice(&body)?;
    s.coordinate().lock().update(&peer.node, &peer.coord, rtt)?;
    if s.cluster().is_leader() {
        s.coordinate_updates().push(Update {
            node: peer.node,
            segment: String::new(),
            coord: peer.coord,
        });
    }
    Ok(())
}
