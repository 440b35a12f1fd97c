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

use super::snapshot_file;
use super::{LogId, Membership, Snapshot, SnapshotMeta as Meta, StorageError, TypeConfig, io_err};
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
        &self, work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, StorageError> {
        match self {
            SnapshotStore::Dir(_) => tokio::task::spawn_blocking(work).await.map_err(sm_err),
            SnapshotStore::Memory(_) => Ok(work()),
        }
    }

    /// The saved snapshot, checked whole (read a chunk at a time).
    fn load(&self) -> Result<Option<(Meta, SnapshotData)>, StorageError> {
        match self {
            SnapshotStore::Dir(dir) => {
                Ok(snapshot_file::open(dir)?.map(|(meta, file)| (meta, SnapshotData::File(file))))
            }
            SnapshotStore::Memory(slot) => Ok(slot
                .lock()
                .clone()
                .map(|(meta, data)| (meta, SnapshotData::Bytes(data)))),
        }
    }

    /// Encodes `state` as the saved snapshot (in a data dir straight into
    /// the file, never whole in memory) and returns it.
    fn build(&self, meta: &Meta, state: &State) -> Result<SnapshotData, StorageError> {
        match self {
            SnapshotStore::Dir(dir) => {
                let file = snapshot_file::save_with(dir, meta, &mut |w| {
                    snapshot::encode_into(state, std::io::BufWriter::with_capacity(1 << 20, w))
                        .map_err(std::io::Error::other)
                })?;
                Ok(SnapshotData::File(file))
            }
            SnapshotStore::Memory(slot) => {
                let data = snapshot::encode(state).map_err(snap_err)?;
                keep_newer(slot, meta, &data);
                Ok(SnapshotData::Bytes(data))
            }
        }
    }

    /// Makes `data` the saved snapshot (durable: a restart that finds the
    /// state behind it installs it again) and decodes it.
    fn install(&self, meta: &Meta, data: SnapshotData) -> Result<State, StorageError> {
        match (self, data) {
            (SnapshotStore::Dir(dir), SnapshotData::File(mut file)) => {
                file.keep_in(dir, &meta.last_log_id)?;
                let len = file.len();
                snapshot::decode_from(
                    std::io::BufReader::with_capacity(1 << 20, file.reader()),
                    len,
                )
                .map_err(snap_err)
            }
            (SnapshotStore::Memory(slot), SnapshotData::Bytes(data)) => {
                keep_newer(slot, meta, &data);
                snapshot::decode(&data).map_err(snap_err)
            }
            // Each store only ever makes its own kind.
            _ => Err(snap_err("a snapshot of the other store's kind")),
        }
    }

    /// Where a snapshot sent by the leader is received, a chunk at a time.
    pub fn receive(&self, meta: &Meta) -> Result<SnapshotSink, StorageError> {
        match self {
            SnapshotStore::Dir(dir) => Ok(SnapshotSink::File(snapshot_file::Incoming::create(
                dir, meta,
            )?)),
            SnapshotStore::Memory(_) => Ok(SnapshotSink::Bytes(Vec::new())),
        }
    }
}

/// Makes `data` the simulation's saved snapshot unless the saved one ends
/// later (the rule `snapshot_file` follows on disk).
fn keep_newer(slot: &SnapshotSlot, meta: &Meta, data: &[u8]) {
    let mut slot = slot.lock();
    if slot
        .as_ref()
        .is_none_or(|(saved, _)| saved.last_log_id <= meta.last_log_id)
    {
        *slot = Some((meta.clone(), data.to_vec()));
    }
}

/// A snapshot's data: in a data dir the framed file, read a chunk at a
/// time (a snapshot is never whole in memory: the state is, once); in the
/// simulation, bytes.
pub enum SnapshotData {
    File(snapshot_file::SnapshotFile),
    Bytes(Vec<u8>),
}

impl SnapshotData {
    pub(crate) fn len(&self) -> u64 {
        match self {
            SnapshotData::File(f) => f.len(),
            SnapshotData::Bytes(b) => b.len() as u64,
        }
    }

    /// Up to `n` bytes of the data from `offset` (read off the async
    /// workers from a file).
    pub async fn chunk(&self, offset: u64, n: usize) -> std::io::Result<Vec<u8>> {
        let end = offset.saturating_add(n as u64).min(self.len());
        let offset = offset.min(end);
        match self {
            SnapshotData::File(f) => {
                let (file, at) = (f.file.clone(), f.at + offset);
                let mut buf = vec![0u8; (end - offset) as usize];
                tokio::task::spawn_blocking(move || {
                    use std::os::unix::fs::FileExt;
                    file.read_exact_at(&mut buf, at).map(|()| buf)
                })
                .await
                .map_err(std::io::Error::other)?
            }
            SnapshotData::Bytes(b) => Ok(b[offset as usize..end as usize].to_vec()),
        }
    }
}

/// A snapshot being received: into a file beside the saved one (data dir)
/// or into memory (simulation).
pub enum SnapshotSink {
    File(snapshot_file::Incoming),
    Bytes(Vec<u8>),
}

impl SnapshotSink {
    /// The data bytes received so far.
    pub(crate) fn len(&self) -> u64 {
        match self {
            SnapshotSink::File(f) => f.len(),
            SnapshotSink::Bytes(b) => b.len() as u64,
        }
    }

    /// Adds the next chunk (written off the async workers to a file).
    pub async fn write(&mut self, data: Vec<u8>) -> Result<(), String> {
        match self {
            SnapshotSink::File(f) => {
                let (file, at) = f.next_write(&data);
                tokio::task::spawn_blocking(move || {
                    use std::os::unix::fs::FileExt;
                    file.write_all_at(&data, at)
                })
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("writing a received snapshot: {e}"))
            }
            SnapshotSink::Bytes(b) => {
                b.extend_from_slice(&data);
                Ok(())
            }
        }
    }

    /// The whole snapshot, its file framed and fsync'd.
    pub async fn finish(self) -> Result<SnapshotData, String> {
        match self {
            SnapshotSink::File(f) => tokio::task::spawn_blocking(move || f.finish())
                .await
                .map_err(|e| e.to_string())?
                .map(SnapshotData::File)
                .map_err(|e| e.to_string()),
            SnapshotSink::Bytes(b) => Ok(SnapshotData::Bytes(b)),
        }
    }
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
        store: Arc<Store>, publisher: Arc<Publisher>, snapshots: SnapshotStore,
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
    applied: &Option<LogId>, membership: &Membership,
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
            move || snapshots.build(&meta, &state)
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
                .off_workers(move || store.install(state, &sets, meta).map(|()| sets))
                .await?
        } else {
            self.store.install(state, &sets, meta).map(|()| sets)
        }
        .map_err(|e| sm_err(format!("{e:#}")))?;
        // The writers first: the new version is readable, and their
        // answers would otherwise queue behind every query it wakes.
        crate::metrics::APPLIED.add(applied);
        for (r, response) in answers {
            r.send(response);
        }
        self.store.wake(&sets);
        if replaced {
            // Subscribers start over from the new state, as after a
            // snapshot install (its sets list no rows).
            self.publisher.reset(index);
        } else {
            self.publisher
                .publish(sets.into_iter().zip(versions).collect());
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
        &mut self, meta: &Meta, data: SnapshotData,
    ) -> Result<(), StorageError> {
        let started = std::time::Instant::now();
        let bytes = data.len();
        let rows = meta_rows(&meta.last_log_id, &meta.last_membership)?;
        let (store, snapshots, meta2) = (self.store.clone(), self.snapshots.clone(), meta.clone());
        // Each phase's milliseconds, for the log: keeping the file and
        // decoding it (one pass), then handing the rows over.
        let install = move || -> Result<[u64; 2], StorageError> {
            let lap = std::time::Instant::now();
            let state = snapshots.install(&meta2, data)?;
            let decoded = lap.elapsed();
            // The rows are written behind (`state::write_behind`).
            store
                .replace(state, rows)
                .map_err(|e| snap_err(format!("{e:#}")))?;
            Ok([decoded, lap.elapsed() - decoded].map(|d| d.as_millis() as u64))
        };
        let [decode_ms, rows_ms] = self.snapshots.off_workers(install).await??;
        self.applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        self.publisher
            .reset(meta.last_log_id.as_ref().map(|l| l.index).unwrap_or(0));
        tracing::info!(
            index = ?meta.last_log_id.as_ref().map(|l| l.index),
            bytes,
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
    use super::*;

    /// A state of `n` KV entries.
    fn state_of(n: usize) -> State {
        let mut st = State::default();
        for i in 0..n {
            let key = format!("k/{i:05}");
            st.kv.insert(
                Arc::from(key.as_str()),
                Arc::new(crate::structs::KvEntry {
                    key,
                    value: vec![b'v'; 100],
                    create_index: i as u64 + 1,
                    modify_index: i as u64 + 1,
                    lock_index: 0,
                    flags: 0,
                    session: String::new(),
                }),
            );
        }
        st.index = n as u64;
        st
    }

    #[tokio::test]
    async fn a_snapshot_streams_from_the_built_file_into_a_received_one_and_installs() {
        let (from, to) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (leader, follower) = (
            SnapshotStore::Dir(from.path().into()),
            SnapshotStore::Dir(to.path().into()),
        );
        let st = state_of(5_000);
        let meta = Meta::default();
        let built = leader.build(&meta, &st).unwrap();
        // What is sent is what is saved, read a chunk at a time.
        let (m, saved) = leader.load().unwrap().unwrap();
        assert_eq!((m, saved.len()), (meta.clone(), built.len()));
        let mut sink = follower.receive(&meta).unwrap();
        let mut offset = 0;
        while offset < built.len() {
            let chunk = built.chunk(offset, 64 << 10).await.unwrap();
            offset += chunk.len() as u64;
            sink.write(chunk).await.unwrap();
        }
        let received = sink.finish().await.unwrap();
        let incoming = || {
            std::fs::read_dir(to.path())
                .unwrap()
                .filter(|e| {
                    let name = e.as_ref().unwrap().file_name();
                    name.to_string_lossy().starts_with("incoming-")
                })
                .count()
        };
        assert_eq!(incoming(), 1, "received into a file of the snapshot dir");
        let installed = follower.install(&meta, received).unwrap();
        assert_eq!(installed.kv, st.kv);
        assert_eq!(incoming(), 0, "the received file became the saved one");
        // ...checked whole on its next read, as one the server built.
        let (_, again) = follower.load().unwrap().unwrap();
        assert_eq!(again.len(), built.len());
        assert_eq!(
            snapshot::encode(&st).unwrap(),
            std::fs::read(snapshot_file::path(to.path())).unwrap()[std::fs::metadata(
                snapshot_file::path(to.path())
            )
            .unwrap()
            .len() as usize
                - built.len() as usize..]
                .to_vec(),
            "the file's data is the state's encoding"
        );
        // A transfer cut short leaves no file behind.
        drop(follower.receive(&meta).unwrap());
        assert_eq!(incoming(), 0);
    }

    #[tokio::test]
    async fn an_older_snapshot_never_replaces_a_newer_saved_one() {
        use openraft::impls::leader_id_adv::LeaderId;
        let dir = tempfile::tempdir().unwrap();
        let store = SnapshotStore::Dir(dir.path().into());
        let at = |index| Meta {
            last_log_id: Some(LogId {
                leader_id: LeaderId {
                    term: 1,
                    node_id: 1,
                },
                index,
            }),
            ..Meta::default()
        };
        let (newer, older) = (state_of(20), state_of(10));
        store.build(&at(20), &newer).unwrap();
        // A build or an install that finishes after a newer one was
        // saved (the log may be purged up to the newer) leaves it saved.
        let late = store.build(&at(10), &older).unwrap();
        let saved_id = || store.load().unwrap().unwrap().0.last_log_id;
        assert_eq!(saved_id(), at(20).last_log_id);
        let mut sink = store.receive(&at(10)).unwrap();
        sink.write(snapshot::encode(&older).unwrap()).await.unwrap();
        let received = sink.finish().await.unwrap();
        assert_eq!(store.install(&at(10), received).unwrap().kv, older.kv);
        assert_eq!(saved_id(), at(20).last_log_id);
        let (_, saved) = store.load().unwrap().unwrap();
        assert_eq!(saved.len(), snapshot::encode(&newer).unwrap().len() as u64);
        // The late build's own file is dropped with it.
        drop(late);
        let files: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(files, ["snapshot.bin"]);
    }
}
