//! The Raft state machine: applies committed entries to the state store and
//! builds and installs snapshots.
//!
//! The store persists every applied batch together with the last applied
//! log id and membership, so a restart resumes from its own data dir.
//! Snapshots are files in the data dir, used to catch up far-behind servers
//! (or, in the simulation, kept in memory: see `SnapshotStore`).

use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;

use futures_util::{Stream, StreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder, StoredMembership};

use super::{
    LogId, Membership, Snapshot, SnapshotData, SnapshotMeta as Meta, StorageError, TypeConfig,
    io_err,
};
use crate::state::persist::meta_key;
use crate::state::{Response, State, Store, apply_payload, snapshot};
use crate::stream::Publisher;

/// The last snapshot, held in memory.
pub type SnapshotSlot = Arc<Mutex<Option<(Meta, Vec<u8>)>>>;

/// Where the last snapshot is kept.
#[derive(Clone)]
pub enum SnapshotStore {
    /// Files in a directory, written atomically; built on a blocking thread.
    Dir(PathBuf),
    /// In memory, built inline: for the deterministic simulation, which has
    /// no disk and must not run threads. Clones share the slot, so a
    /// simulated restart finds the snapshot a crash left behind.
    Memory(SnapshotSlot),
}

impl SnapshotStore {
    pub fn memory() -> Self {
        SnapshotStore::Memory(Arc::default())
    }

    /// Runs work that takes as long as the state is large (encoding,
    /// decoding, rewriting every row) on a blocking thread, so that the
    /// async workers keep serving heartbeats. The simulation has no threads:
    /// inline there.
    async fn off_workers<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, StorageError> {
        match self {
            SnapshotStore::Dir(_) => tokio::task::spawn_blocking(work).await.map_err(sm_err),
            SnapshotStore::Memory(_) => Ok(work()),
        }
    }

    fn save(&self, meta: &Meta, data: &[u8]) -> Result<(), StorageError> {
        match self {
            SnapshotStore::Dir(dir) => Ok(snapshot_file::save(dir, meta, data)?),
            SnapshotStore::Memory(slot) => {
                *slot.lock() = Some((meta.clone(), data.to_vec()));
                Ok(())
            }
        }
    }

    fn load(&self) -> Result<Option<(Meta, Vec<u8>)>, StorageError> {
        match self {
            SnapshotStore::Dir(dir) => Ok(snapshot_file::load(dir)?),
            SnapshotStore::Memory(slot) => Ok(slot.lock().clone()),
        }
    }

    /// The log id the saved snapshot ends at (without reading its data).
    fn saved_id(&self) -> Result<Option<Option<LogId>>, StorageError> {
        match self {
            SnapshotStore::Dir(dir) => Ok(snapshot_file::load_meta(dir)?.map(|m| m.last_log_id)),
            SnapshotStore::Memory(slot) => Ok(slot.lock().as_ref().map(|(m, _)| m.last_log_id)),
        }
    }
}

/// The snapshot as one file, `snapshot.bin`, framed as
/// `disk::snapshot_frame` says, its meta bincode of openraft's
/// `SnapshotMeta` and its data `state::snapshot`'s encoding. Replaced
/// atomically (`disk::write_atomic_parts`). `GET /v1/snapshot` answers the
/// same format, so a saved file and a data dir's snapshot read alike.
pub mod snapshot_file {
    use std::io::Read;
    use std::path::{Path, PathBuf};

    use super::Meta;
    use crate::disk::snapshot_frame::{self, HEADER, corrupt, header};
    use crate::disk::{DiskError, write_atomic_parts};

    pub fn path(dir: &Path) -> PathBuf {
        dir.join("snapshot.bin")
    }

    pub fn save(dir: &Path, meta: &Meta, data: &[u8]) -> Result<(), DiskError> {
        let meta = bincode::serialize(meta).expect("snapshot meta encodes");
        let head = snapshot_frame::head(&meta, data);
        write_atomic_parts(&path(dir), &[&head, &meta, data])
    }

    /// A whole framed snapshot in memory (what `GET /v1/snapshot` answers).
    pub fn to_bytes(meta: &Meta, data: &[u8]) -> Vec<u8> {
        let meta = bincode::serialize(meta).expect("snapshot meta encodes");
        let mut out = snapshot_frame::head(&meta, data);
        out.reserve(meta.len() + data.len());
        out.extend_from_slice(&meta);
        out.extend_from_slice(data);
        out
    }

    /// Checks a framed snapshot whole (`path` names it in errors); returns
    /// its meta and data.
    pub fn from_bytes<'a>(path: &Path, bytes: &'a [u8]) -> Result<(Meta, &'a [u8]), DiskError> {
        let (meta, data) = snapshot_frame::split(path, bytes)?;
        Ok((decode_meta(path, meta)?, data))
    }

    fn decode_meta(path: &Path, bytes: &[u8]) -> Result<Meta, DiskError> {
        bincode::deserialize(bytes)
            .map_err(|e| corrupt(path, HEADER as u64, format!("meta does not decode: {e}")))
    }

    /// The saved snapshot, checked whole; `None` if there is none.
    pub fn load(dir: &Path) -> Result<Option<(Meta, Vec<u8>)>, DiskError> {
        let path = path(dir);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(DiskError::io("read", &path, e)),
        };
        let (meta, data) = from_bytes(&path, &bytes)?;
        Ok(Some((meta, data.to_vec())))
    }

    /// Only the meta of the saved snapshot (not checksummed on its own:
    /// used to skip rewriting the same snapshot).
    pub fn load_meta(dir: &Path) -> Result<Option<Meta>, DiskError> {
        let path = path(dir);
        let mut f = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(DiskError::io("open", &path, e)),
        };
        let mut head = [0u8; HEADER];
        f.read_exact(&mut head)
            .map_err(|e| DiskError::io("read", &path, e))?;
        let h = header(&path, &head)?;
        let mut meta = vec![0u8; h.meta_len];
        f.read_exact(&mut meta)
            .map_err(|e| DiskError::io("read", &path, e))?;
        Ok(Some(decode_meta(&path, &meta)?))
    }
}

/// Checks a framed snapshot whole (`cairn snapshot inspect`, and `save`
/// before it keeps a file): its index, term and rows per table.
pub fn inspect(bytes: &[u8]) -> Result<crate::cli::snapshot::Inspection, String> {
    let (meta, data) = snapshot_file::from_bytes(std::path::Path::new("snapshot"), bytes).map_err(
        |e| match e {
            crate::disk::DiskError::Corrupt { offset, reason, .. } => {
                format!("damaged at offset {offset}: {reason}")
            }
            other => other.to_string(),
        },
    )?;
    let (index, tables) = snapshot::counts(data).map_err(|e| format!("{e:#}"))?;
    let term = meta.last_log_id.map(|l| l.leader_id.term).unwrap_or(0);
    Ok(crate::cli::snapshot::Inspection {
        index,
        term,
        tables,
    })
}

pub struct StateMachine {
    store: Arc<Store>,
    publisher: Arc<Publisher>,
    snapshots: SnapshotStore,
    applied: Option<LogId>,
    membership: Membership,
}

fn sm_err(e: impl std::fmt::Display) -> StorageError {
    io_err("writing the state machine", e)
}

fn snap_err(e: impl std::fmt::Display) -> StorageError {
    io_err("writing a snapshot", e)
}

impl StateMachine {
    /// A state machine whose snapshots are files in `dir`.
    pub fn new(store: Arc<Store>, publisher: Arc<Publisher>, dir: PathBuf) -> anyhow::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        Self::with_snapshots(store, publisher, SnapshotStore::Dir(dir))
    }

    pub fn with_snapshots(
        store: Arc<Store>,
        publisher: Arc<Publisher>,
        snapshots: SnapshotStore,
    ) -> anyhow::Result<Self> {
        let p = store.persist();
        let applied = match p.get(&meta_key("applied"))? {
            Some(v) => bincode::deserialize(&v)?,
            None => None,
        };
        let membership = match p.get(&meta_key("membership"))? {
            Some(v) => bincode::deserialize(&v)?,
            None => Membership::default(),
        };
        Ok(StateMachine {
            store,
            publisher,
            snapshots,
            applied,
            membership,
        })
    }

    fn meta_rows(&self) -> Result<crate::state::Ops, StorageError> {
        meta_rows(&self.applied, &self.membership)
    }
}

/// A restore's step, if `cmd` is one: `Some(true)` for its commit (the
/// whole staged snapshot turned into tables), `Some(false)` for a chunk
/// (half a MiB to write to the store).
fn restore_step(cmd: &crate::state::Payload) -> Option<bool> {
    use crate::state::{Command, Payload};
    match cmd {
        Payload::One(Command::RestoreCommit { .. }) => Some(true),
        Payload::One(Command::RestoreChunk { .. }) => Some(false),
        _ => None,
    }
}

/// The rows that say where the state is: the applied log id and membership.
fn meta_rows(
    applied: &Option<LogId>,
    membership: &Membership,
) -> Result<crate::state::Ops, StorageError> {
    Ok(vec![
        (
            meta_key("applied"),
            Some(bincode::serialize(applied).map_err(sm_err)?),
        ),
        (
            meta_key("membership"),
            Some(bincode::serialize(membership).map_err(sm_err)?),
        ),
    ])
}

pub struct SnapshotBuilder {
    state: Arc<State>,
    applied: Option<LogId>,
    membership: Membership,
    snapshots: SnapshotStore,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let started = std::time::Instant::now();
        let state = self.state.clone();
        let meta = Meta {
            last_log_id: self.applied,
            last_membership: self.membership.clone(),
        };
        let build = {
            let (meta, snapshots) = (meta.clone(), self.snapshots.clone());
            move || -> Result<Vec<u8>, StorageError> {
                let data = snapshot::encode(&state).map_err(snap_err)?;
                snapshots.save(&meta, &data)?;
                Ok(data)
            }
        };
        // Encoding and writing a large state takes a while.
        let data = self.snapshots.off_workers(build).await??;
        tracing::info!(
            bytes = data.len(),
            index = ?self.applied.map(|l| l.index),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "built snapshot"
        );
        Ok(Snapshot {
            meta,
            snapshot: data,
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, Membership), StorageError> {
        Ok((self.applied, self.membership.clone()))
    }

    /// Applies every entry the stream holds as one batch: one new state
    /// version, one atomic batch of rows handed to the store (written
    /// behind: `state::write_behind`), one hand-over to the publisher; then
    /// answers each client write.
    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), StorageError>
    where
        Strm:
            Stream<Item = Result<EntryResponder<TypeConfig>, StorageError>> + Unpin + OptionalSend,
    {
        let mut state = (*self.store.state()).clone();
        let mut answers = Vec::new();
        let mut sets = Vec::new();
        let mut versions = Vec::new();
        let mut applied = 0u64;
        // A batch that writes restore chunks or swaps the whole state is
        // written to the store off the async workers.
        let mut heavy = false;
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            let index = entry.log_id.index;
            applied += 1;
            let response = match entry.payload {
                EntryPayload::Blank => Response::Ok,
                EntryPayload::Normal(cmd) => {
                    let step = restore_step(&cmd);
                    heavy |= step.is_some();
                    let (resp, set) = if step == Some(true) {
                        // Decoding a restored snapshot into tables takes as
                        // long as an install: not on the async workers.
                        let staged = std::mem::take(&mut state);
                        let (next, resp, set) = self
                            .snapshots
                            .off_workers(move || {
                                let mut next = staged;
                                let (resp, set) = apply_payload(&mut next, index, &cmd);
                                (next, resp, set)
                            })
                            .await?;
                        state = next;
                        (resp, set)
                    } else {
                        apply_payload(&mut state, index, &cmd)
                    };
                    // Each event is built from the version its command made
                    // (cheap: the maps are shared, not copied).
                    versions.push(Arc::new(state.clone()));
                    sets.push(set);
                    resp
                }
                EntryPayload::Membership(m) => {
                    self.membership = StoredMembership::new(Some(entry.log_id), m);
                    Response::Ok
                }
            };
            self.applied = Some(entry.log_id);
            state.index = state.index.max(index);
            if let Some(r) = responder {
                answers.push((r, response));
            }
        }
        if applied == 0 {
            return Ok(());
        }
        let meta = self.meta_rows()?;
        let (replaced, index) = (sets.iter().any(|s| s.replaced), state.index);
        let sets = if replaced || heavy {
            // A restore rewrites every row, and its chunks are large:
            // written off the async workers, as an install is.
            let store = self.store.clone();
            self.snapshots
                .off_workers(move || store.commit(state, &sets, meta).map(|()| sets))
                .await?
        } else {
            self.store.commit(state, &sets, meta).map(|()| sets)
        }
        .map_err(|e| sm_err(format!("{e:#}")))?;
        if replaced {
            // Subscribers start over from the new state, as after a
            // snapshot install (its sets list no rows).
            self.publisher.reset(index);
        } else {
            self.publisher
                .publish(sets.into_iter().zip(versions).collect());
        }
        crate::metrics::APPLIED.add(applied);
        for (r, response) in answers {
            r.send(response);
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            state: self.store.state(),
            applied: self.applied,
            membership: self.membership.clone(),
            snapshots: self.snapshots.clone(),
        }
    }

    /// Installs a snapshot so that a crash at any point leaves the old state
    /// or the new one: the snapshot file is made durable first (a restart
    /// that finds the state behind it installs it again), then the rows and
    /// the applied id are replaced in one atomic swap (`Persist::replace`).
    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        data: SnapshotData,
    ) -> Result<(), StorageError> {
        let started = std::time::Instant::now();
        let bytes = data.len();
        let rows = meta_rows(&meta.last_log_id, &meta.last_membership)?;
        let (store, snapshots, meta2) = (self.store.clone(), self.snapshots.clone(), meta.clone());
        // Each phase's milliseconds, for the log: save, decode, rows.
        let install = move || -> Result<[u64; 3], StorageError> {
            let mut phases = [0; 3];
            let mut lap = std::time::Instant::now();
            let mut end = |phase: usize| {
                phases[phase] = lap.elapsed().as_millis() as u64;
                lap = std::time::Instant::now();
            };
            // A restart re-installing the saved snapshot need not rewrite
            // it; an unreadable one is simply replaced.
            if snapshots.saved_id().unwrap_or(None) != Some(meta2.last_log_id) {
                snapshots.save(&meta2, &data)?;
            }
            end(0);
            let state = snapshot::decode(&data).map_err(snap_err)?;
            end(1);
            // The rows are written behind (`state::write_behind`).
            store
                .replace(state, rows)
                .map_err(|e| snap_err(format!("{e:#}")))?;
            end(2);
            Ok(phases)
        };
        let [save_ms, decode_ms, rows_ms] = self.snapshots.off_workers(install).await??;
        self.applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        self.publisher
            .reset(meta.last_log_id.as_ref().map(|l| l.index).unwrap_or(0));
        tracing::info!(
            index = ?meta.last_log_id.as_ref().map(|l| l.index),
            bytes,
            save_ms,
            decode_ms,
            rows_ms,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "installed snapshot"
        );
        Ok(())
    }

    /// The saved snapshot, to send to a follower: reading and checking a
    /// large file takes a while (and a follower that cannot take it asks
    /// again), so not on the async workers.
    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let snapshots = self.snapshots.clone();
        let saved = self
            .snapshots
            .off_workers(move || snapshots.load())
            .await??;
        Ok(saved.map(|(meta, data)| Snapshot {
            meta,
            snapshot: data,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::snapshot_file;
    use super::*;
    use crate::disk::DiskError;
    use std::os::unix::fs::FileExt;

    #[test]
    fn a_snapshot_file_is_checked_whole() {
        let dir = tempfile::tempdir().unwrap();
        let meta = Meta::default();
        let data = vec![7u8; 10_000];
        snapshot_file::save(dir.path(), &meta, &data).unwrap();
        let (m, d) = snapshot_file::load(dir.path()).unwrap().unwrap();
        assert_eq!((m, d), (meta.clone(), data.clone()));
        assert!(!dir.path().join("snapshot.tmp").exists());

        let path = snapshot_file::path(dir.path());
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[8], 5_000).unwrap();
        let e = snapshot_file::load(dir.path()).unwrap_err();
        assert!(
            matches!(&e, DiskError::Corrupt { path: p, .. } if *p == path),
            "{e}"
        );

        // Saved again (a new file, renamed over), then cut short.
        snapshot_file::save(dir.path(), &meta, &data).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(9_000)
            .unwrap();
        assert!(matches!(
            snapshot_file::load(dir.path()),
            Err(DiskError::Corrupt { .. })
        ));
    }
}
