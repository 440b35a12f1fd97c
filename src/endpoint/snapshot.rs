//! Snapshots of the whole state: saved as one archive (Consul's gzipped
//! tar, `raft::snapshot_archive`), and restored on the running cluster
//! through Raft (see `state::restore`): checked whole first (a bad one is
//! refused with 400 and nothing is proposed), then proposed as chunks and
//! one commit that swaps the state on every server at once. Both need a
//! management token (a snapshot holds every secret's hash and every rule).
//! The encoding and the check run on blocking threads: a large state takes
//! a while.

use std::path::Path;

use crate::disk::DiskError;
use crate::error::{Error, Result};
use crate::raft::{LogId, SnapshotMeta};
use crate::raft::{snapshot_archive, snapshot_file};
use crate::request::QueryOptions;
use crate::request::authz::Authz;
use crate::server::Server;
use crate::state::restore::CHUNK_BYTES;
use crate::state::{Command, Response as Applied, snapshot};

/// The largest snapshot a restore takes (held in memory while it is
/// checked and proposed).
pub const MAX_SNAPSHOT: usize = snapshot_archive::MAX_STATE;

/// Consul's snapshots need a management token (they hold every secret's
/// hash and every rule).
pub fn management(a: &Authz) -> Result<()> {
    a.require(a.snapshot(), "acl:write", "")
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
async fn committed(s: &Server, id: &str, staged_at: u64) -> Result<()> {
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

/// A point-in-time copy of the whole state (the data dir's framed
/// snapshot, as `state.bin` of Consul's envelope), for a caller with
/// management rights: its index and the archive's bytes.
pub async fn save(s: &Server, a: &Authz, opts: &QueryOptions) -> Result<(u64, Vec<u8>)> {
    management(a)?;
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
    Ok((index, bytes))
}

/// Restores the snapshot `body` (the caller checked management rights):
/// checked whole, then proposed as chunks and one commit.
pub async fn restore(s: &Server, body: bytes::Bytes) -> Result<()> {
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
            Err(Error::NoLeader) => committed(s, &id, staged_at).await,
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
    Ok(())
}
