//! The Raft state machine: applies committed entries to the state store and
//! builds and installs snapshots.
//!
//! The store persists every applied batch together with the last applied
//! log id and membership, so a restart resumes from its own data dir.
//! Snapshots are files in the data dir, used to catch up far-behind servers
//! (or, in the simulation, kept in memory: see `SnapshotStore`).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

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

    fn save(&self, meta: &Meta, data: &[u8]) -> anyhow::Result<()> {
        match self {
            SnapshotStore::Dir(dir) => {
                save_snapshot(dir, meta, data).map_err(|e| anyhow::anyhow!(e.to_string()))
            }
            SnapshotStore::Memory(slot) => {
                *slot.lock().unwrap() = Some((meta.clone(), data.to_vec()));
                Ok(())
            }
        }
    }

    fn load(&self) -> anyhow::Result<Option<(Meta, Vec<u8>)>> {
        match self {
            SnapshotStore::Dir(dir) => {
                let Ok(meta_bytes) = std::fs::read(dir.join("snapshot.meta")) else {
                    return Ok(None);
                };
                let meta: Meta = bincode::deserialize(&meta_bytes)?;
                let data = std::fs::read(dir.join("snapshot.data"))?;
                Ok(Some((meta, data)))
            }
            SnapshotStore::Memory(slot) => Ok(slot.lock().unwrap().clone()),
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
        Ok(vec![
            (
                meta_key("applied"),
                Some(bincode::serialize(&self.applied).map_err(sm_err)?),
            ),
            (
                meta_key("membership"),
                Some(bincode::serialize(&self.membership).map_err(sm_err)?),
            ),
        ])
    }
}

pub struct SnapshotBuilder {
    state: Arc<State>,
    applied: Option<LogId>,
    membership: Membership,
    snapshots: SnapshotStore,
}

fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

fn save_snapshot(dir: &std::path::Path, meta: &Meta, data: &[u8]) -> Result<(), StorageError> {
    write_atomic(&dir.join("snapshot.data"), data).map_err(snap_err)?;
    let meta = bincode::serialize(meta).map_err(snap_err)?;
    write_atomic(&dir.join("snapshot.meta"), &meta).map_err(snap_err)
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let started = std::time::Instant::now();
        let state = self.state.clone();
        let data = match &self.snapshots {
            SnapshotStore::Dir(_) => tokio::task::spawn_blocking(move || snapshot::encode(&state))
                .await
                .map_err(snap_err)?
                .map_err(snap_err)?,
            SnapshotStore::Memory(_) => snapshot::encode(&state).map_err(snap_err)?,
        };
        let meta = Meta {
            last_log_id: self.applied,
            last_membership: self.membership.clone(),
        };
        self.snapshots.save(&meta, &data).map_err(snap_err)?;
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
    /// version, one atomic sled batch, one hand-over to the publisher; then
    /// answers each client write. An answer never precedes the sled batch.
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
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            let index = entry.log_id.index;
            applied += 1;
            let response = match entry.payload {
                EntryPayload::Blank => Response::Ok,
                EntryPayload::Normal(cmd) => {
                    let (resp, set) = apply_payload(&mut state, index, &cmd);
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
        self.store.commit(state, &sets, meta).map_err(sm_err)?;
        self.publisher
            .publish(sets.into_iter().zip(versions).collect());
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

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        data: SnapshotData,
    ) -> Result<(), StorageError> {
        let state = snapshot::decode(&data).map_err(snap_err)?;
        self.applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        let rows = self.meta_rows()?;
        self.store.replace(state, rows).map_err(snap_err)?;
        self.publisher
            .reset(meta.last_log_id.as_ref().map(|l| l.index).unwrap_or(0));
        self.snapshots.save(meta, &data).map_err(snap_err)?;
        tracing::info!(index = ?meta.last_log_id.as_ref().map(|l| l.index), bytes = data.len(), "installed snapshot");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        Ok(self
            .snapshots
            .load()
            .map_err(snap_err)?
            .map(|(meta, data)| Snapshot {
                meta,
                snapshot: data,
            }))
    }
}
