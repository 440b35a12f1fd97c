//! The Raft log and vote in sled, with group commit.
//!
//! `append` writes entries into sled at once (so they are readable) and
//! hands the completion callback to a flusher thread. The flusher takes every
//! callback waiting, flushes the database once, then completes them all: many
//! appends share one flush, and no append is acknowledged before it.
//!
//! sled's `flush` writes its buffers with `sync_file_range`, which neither
//! empties the disk's write cache nor records the file's new length; so the
//! flusher follows it with an `fdatasync` of sled's file.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::mpsc;

use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};

use super::{Entry, LogId, StorageError, TypeConfig, Vote, io_err};

const VOTE: &[u8] = b"vote";
const PURGED: &[u8] = b"last_purged";
const COMMITTED: &[u8] = b"committed";

#[derive(Clone)]
pub struct LogStore {
    db: sled::Db,
    log: sled::Tree,
    meta: sled::Tree,
    flusher: mpsc::Sender<IOFlushed<TypeConfig>>,
    /// sled's file, for `fdatasync` after its flush.
    file: std::sync::Arc<std::fs::File>,
}

fn key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn read_err(e: impl std::fmt::Display) -> StorageError {
    io_err("reading the raft log", e)
}

fn write_err(e: impl std::fmt::Display) -> StorageError {
    io_err("writing the raft log", e)
}

impl LogStore {
    /// `db_dir` is the directory sled was opened in (its file is synced).
    pub fn new(db: &sled::Db, db_dir: &std::path::Path) -> anyhow::Result<Self> {
        let (tx, rx) = mpsc::channel::<IOFlushed<TypeConfig>>();
        let flush_db = db.clone();
        let file = std::sync::Arc::new(
            std::fs::OpenOptions::new()
                .write(true)
                .open(db_dir.join("db"))?,
        );
        let sled_file = file.clone();
        std::thread::Builder::new()
            .name("raft-log-flush".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    let mut waiting = vec![first];
                    waiting.extend(rx.try_iter());
                    let result = flush_db
                        .flush()
                        .map_err(std::io::Error::other)
                        .and_then(|_| sled_file.sync_data());
                    crate::metrics::LOG_FSYNCS.inc();
                    crate::metrics::LOG_FSYNC_BATCH.add(waiting.len() as u64);
                    for cb in waiting {
                        let r = match &result {
                            Ok(()) => Ok(()),
                            Err(e) => Err(std::io::Error::other(e.to_string())),
                        };
                        cb.io_completed(r);
                    }
                }
            })?;
        Ok(LogStore {
            db: db.clone(),
            log: db.open_tree("raft_log")?,
            meta: db.open_tree("raft_meta")?,
            flusher: tx,
            file,
        })
    }

    fn get_meta<T: serde::de::DeserializeOwned>(
        &self,
        k: &[u8],
    ) -> Result<Option<T>, StorageError> {
        match self.meta.get(k).map_err(read_err)? {
            Some(v) => Ok(Some(bincode::deserialize(&v).map_err(read_err)?)),
            None => Ok(None),
        }
    }

    fn put_meta<T: serde::Serialize>(&self, k: &[u8], v: &T) -> Result<(), StorageError> {
        let bytes = bincode::serialize(v).map_err(write_err)?;
        self.meta.insert(k, bytes).map_err(write_err)?;
        Ok(())
    }

    /// Makes everything written so far durable, off the async threads.
    async fn sync(&self) -> std::io::Result<()> {
        self.db.flush_async().await.map_err(std::io::Error::other)?;
        let file = self.file.clone();
        tokio::task::spawn_blocking(move || file.sync_data())
            .await
            .map_err(std::io::Error::other)?
    }

    /// Whether this store has ever held Raft state (a restart, not a new server).
    pub fn is_used(&self) -> bool {
        !self.log.is_empty() || self.meta.contains_key(VOTE).unwrap_or(false)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(i) => *i,
            Bound::Excluded(i) => i + 1,
            Bound::Unbounded => 0,
        };
        let iter = match range.end_bound() {
            Bound::Included(i) => self.log.range(key(start)..=key(*i)),
            Bound::Excluded(i) => self.log.range(key(start)..key(*i)),
            Bound::Unbounded => self.log.range(key(start)..),
        };
        let mut out = Vec::new();
        for item in iter {
            let (_, v) = item.map_err(read_err)?;
            out.push(bincode::deserialize(&v).map_err(read_err)?);
        }
        Ok(out)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        self.get_meta(VOTE)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged: Option<LogId> = self.get_meta(PURGED)?;
        let last = match self.log.last().map_err(read_err)? {
            Some((_, v)) => {
                let e: Entry = bincode::deserialize(&v).map_err(read_err)?;
                Some(e.log_id)
            }
            None => last_purged,
        };
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        self.put_meta(VOTE, vote)?;
        self.sync()
            .await
            .map_err(|e| io_err("saving the vote", e))?;
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.put_meta(COMMITTED, &committed)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.get_meta::<Option<LogId>>(COMMITTED)?.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = sled::Batch::default();
        for e in entries {
            let bytes = bincode::serialize(&e).map_err(write_err)?;
            batch.insert(&key(e.log_id.index), bytes);
        }
        self.log.apply_batch(batch).map_err(write_err)?;
        self.flusher
            .send(callback)
            .map_err(|_| write_err("log flusher stopped"))?;
        Ok(())
    }

    async fn truncate_after(&mut self, last: Option<LogId>) -> Result<(), StorageError> {
        let from = last.map_or(0, |l| l.index + 1);
        let mut batch = sled::Batch::default();
        for item in self.log.range(key(from)..) {
            let (k, _) = item.map_err(write_err)?;
            batch.remove(k);
        }
        self.log.apply_batch(batch).map_err(write_err)?;
        self.sync().await.map_err(write_err)?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.put_meta(PURGED, &log_id)?;
        let mut batch = sled::Batch::default();
        for item in self.log.range(..=key(log_id.index)) {
            let (k, _) = item.map_err(write_err)?;
            batch.remove(k);
        }
        self.log.apply_batch(batch).map_err(write_err)?;
        Ok(())
    }
}
