//! `/v1/snapshot`: the whole state as one file (`GET`, in Consul's gzipped
//! tar, `raft::snapshot_archive`), and restoring one on the running cluster
//! through Raft (`PUT`, see `state::restore`).

use crate::request::authz::Authz;
use std::path::Path;

use axum::Router;
use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::{App, meta_headers};
use crate::disk::DiskError;
use crate::error::{Error, Result};
use crate::raft::{LogId, SnapshotMeta};
use crate::raft::{snapshot_archive, snapshot_file};
use crate::request::QueryOptions;
use crate::state::restore::CHUNK_BYTES;
use crate::state::{Command, Response as Applied, snapshot};

/// The largest snapshot `PUT /v1/snapshot` takes (held in memory while it
/// is checked and proposed).
pub const MAX_SNAPSHOT: usize = snapshot_archive::MAX_STATE;

pub fn routes() -> Router<App> {
    Router::new().route("/v1/snapshot", get(save).put(restore))
}

/// A point-in-time copy of the whole state: the data dir's framed
/// snapshot, as `state.bin` of Consul's envelope. Default mode is answered by the leader (forwarded),
/// `?stale` by any server, `?consistent` after a leadership check.
/// Consul's snapshots need a management token (they hold every secret's
/// hash and every rule).
pub(super) fn management(a: &Authz) -> Result<()> {
    a.require(a.snapshot(), "acl:write", "")
}

async fn save(State(s): State<App>, a: Authz, RawQuery(q): RawQuery) -> Result<Response> {
    management(&a)?;
    let (_, opts) = QueryOptions::parse(q.as_deref(), s.datacenter())?;
    if opts.consistent {
        s.linearize().await?;
    }
    let st = s.state();
    let index = st.index;
    let meta = {
        let m = s.cluster().metrics();
        SnapshotMeta {
            // The term of the last entry applied (informational: shown by
            // `cairn snapshot inspect`), at the state's own index.
            last_log_id: m.last_applied.map(|l| LogId {
                leader_id: l.leader_id,
                index,
            }),
            last_membership: (*m.membership_config).clone(),
        }
    };
    // Encoding a large state takes a while: not on the async workers.
    let bytes = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<u8>> {
        let data = snapshot::export(&st)?;
        let framed = snapshot_file::to_bytes(&meta, &data);
        Ok(snapshot_archive::wrap(&meta, &framed)?)
    })
    .await
    .map_err(|e| Error::Internal(e.to_string()))??;
    let mut resp = bytes.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    resp.headers_mut().extend(meta_headers(&s, index));
    Ok(resp)
}

/// Why an uploaded snapshot is refused, in one line.
fn refused(e: DiskError) -> Error {
    Error::bad(match e {
        DiskError::Corrupt { offset, reason, .. } => {
            format!("Invalid snapshot: damaged at offset {offset}: {reason}")
        }
        DiskError::Version {
            found, expected, ..
        } => format!(
            "Invalid snapshot: format version {found}, this server reads version {expected}"
        ),
        DiskError::Magic { .. } => "Invalid snapshot: not a cairn snapshot file".to_string(),
        other => format!("Invalid snapshot: {other}"),
    })
}

/// Checks an uploaded snapshot whole (Consul's envelope and its checksums,
/// or a bare framed snapshot; framing, checksum, and that its state
/// decodes); returns its state's data.
fn check(body: bytes::Bytes) -> Result<bytes::Bytes> {
    let framed = match snapshot_archive::unwrap(&body, MAX_SNAPSHOT)
        .map_err(|e| Error::bad(e.to_string()))?
    {
        std::borrow::Cow::Borrowed(_) => body.clone(),
        std::borrow::Cow::Owned(state) => bytes::Bytes::from(state),
    };
    let (_, data) = snapshot_file::from_bytes(Path::new("snapshot"), &framed).map_err(refused)?;
    snapshot::decode(data).map_err(|e| Error::bad(format!("Invalid snapshot: {e:#}")))?;
    let start = framed.len() - data.len();
    Ok(framed.slice(start..))
}

fn applied(r: Applied) -> Result<()> {
    match r {
        Applied::Ok => Ok(()),
        Applied::Rejected(reason) => Err(Error::BadRequest(reason)),
        other => Err(Error::Internal(format!("unexpected answer {other:?}"))),
    }
}

/// The longest a restore waits for its commit to apply on this server.
const COMMIT_HOLD: std::time::Duration = std::time::Duration::from_secs(600);

/// Waits until restore `id`, staged at `staged_at`, leaves staging on this
/// server (the leader that proposed it): swapped in, or discarded by a
/// failed commit or a new leader.
async fn committed(s: &App, id: &str, staged_at: u64) -> Result<()> {
    use crate::state::keys::RESTORED;
    let deadline = tokio::time::Instant::now() + COMMIT_HOLD;
    let mut swapped = s.watches().subscribe(&RESTORED);
    loop {
        let st = s.state();
        if st.restore.as_ref().is_none_or(|r| r.id != id) {
            return match st.indexes.get(&RESTORED) {
                Some(at) if *at > staged_at => Ok(()),
                _ => Err(Error::Internal(format!(
                    "snapshot restore {id} was discarded before its commit applied"
                ))),
            };
        }
        if tokio::time::Instant::now() >= deadline || !s.cluster().is_leader() {
            return Err(Error::NoLeader);
        }
        // A discard changes no watched key: look again every second.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), swapped.changed()).await;
    }
}

/// `PUT /v1/snapshot`: an upload whose token is checked before its body
/// is read, here and on a follower that passes it on (`forward_upload`).
pub(super) fn is_upload(parts: &axum::http::request::Parts) -> bool {
    parts.method == axum::http::Method::PUT && parts.uri.path() == "/v1/snapshot"
}

/// Restores a snapshot: checked whole here (a bad one is refused with 400
/// and nothing is proposed), then proposed as chunks and one commit that
/// swaps the state on every server at once. The body is read only once
/// the token is known to hold management rights.
async fn restore(
    State(s): State<App>, a: Authz, RawQuery(q): RawQuery, body: Body,
) -> Result<Response> {
    management(&a)?;
    QueryOptions::parse(q.as_deref(), s.datacenter())?;
    let body = axum::body::to_bytes(body, MAX_SNAPSHOT)
        .await
        .map_err(|e| Error::TooLarge(format!("Request body too large or unreadable: {e}")))?;
    let data = tokio::task::spawn_blocking(move || check(body))
        .await
        .map_err(|e| Error::Internal(e.to_string()))??;
    let id = uuid::Uuid::new_v4().to_string();
    let staged = async {
        let mut chunks = 0u32;
        for (seq, c) in data.chunks(CHUNK_BYTES).enumerate() {
            let cmd = Command::RestoreChunk {
                id: id.clone(),
                seq: seq as u32,
                data: c.to_vec(),
            };
            applied(s.write(cmd).await?)?;
            chunks += 1;
        }
        let commit = Command::RestoreCommit {
            id: id.clone(),
            chunks,
            len: data.len() as u64,
            crc: crc32fast::hash(&data),
        };
        let staged_at = s.state().index;
        match s.write(commit).await {
            // Turning a large snapshot into tables can outlast the wait of
            // a write; the commit is in the log and will apply: wait for it.
            Err(Error::NoLeader) => committed(&s, &id, staged_at).await,
            r => applied(r?),
        }
    };
    if let Err(e) = staged.await {
        // Best effort: a new leader, or the next restore, drops it anyway.
        let _ = s.write(Command::RestoreAbort { id: id.clone() }).await;
        return Err(e);
    }
    // The sessions are the snapshot's now: their TTL timers start afresh.
    s.sessions().step_down();
    tracing::info!(bytes = data.len(), restore = %id, "restored a snapshot");
    Ok(().into_response())
}
