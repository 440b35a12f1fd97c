//! An in-memory Raft log store whose "disk" survives a simulated crash.
//!
//! Sled runs threads of its own and fsyncs on a real disk: neither belongs
//! in a deterministic simulation. This store keeps two copies of the log:
//! the page cache (`mem`, what the running server reads) and the disk
//! (`LogDisk`, shared with the server's next life). Writes land in the page
//! cache at once and reach the disk only when flushed, as with cairn's
//! segment files:
//!
//! - `append` hands its callback to a flush that runs a moment later (a
//!   simulated group commit); the callback completes only after the flush,
//!   so openraft never counts an entry as stored before it is durable;
//! - `save_vote` and `truncate` flush before returning (as the real store
//!   syncs there);
//! - `purge` is flushed with the next flush, and may be lost by a crash,
//!   which openraft tolerates;
//! - like the real store, it keeps no committed id (openraft's default):
//!   a restart resumes from the state machine's applied id.
//!
//! A flush writes every pending operation in order, like one fsync. A crash
//! (turmoil drops the host's runtime) loses whatever was not flushed:
//! `MemLogStore::open` on restart starts from the disk. A torn crash
//! (`LogDisk::tear`) first lets part of what was not flushed reach the
//! disk: a prefix of the pending operations, the last append possibly cut
//! short, which is what the real log keeps after cutting a torn tail.
//!
//! A failed fsync (`LogDisk::fail_next_flush`) lets a prefix of the
//! pending operations reach the disk, drops the rest (the kernel may drop
//! pages it could not write) and fails the callbacks; every later flush of
//! that life fails too, as the real log's latch does (vote saves excepted:
//! the real store keeps the vote in sled, another file). Raft stops, and the
//! runner, playing the supervisor, restarts the server from its disk.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn::raft::{Entries, Entry, LogId, StorageError, TypeConfig, Vote};
use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};

/// How long a group commit takes: long enough for a crash to land between
/// an append and its flush.
const FLUSH_DELAY: Duration = Duration::from_millis(2);

#[derive(Clone, Default)]
struct LogData {
    vote: Option<Vote>,
    purged: Option<LogId>,
    log: BTreeMap<u64, Entry>,
}

/// One write, as it will reach the disk.
#[derive(Clone)]
enum Op {
    Append(Vec<Entry>),
    /// Remove entries from this index on.
    Truncate(u64),
    Purge(LogId),
    Vote(Vote),
}

impl LogData {
    fn apply(&mut self, op: Op) {
        match op {
            Op::Append(entries) => {
                for e in entries {
                    self.log.insert(e.log_id.index, e);
                }
            }
            Op::Truncate(from) => {
                self.log.split_off(&from);
            }
            Op::Purge(upto) => {
                self.purged = Some(upto);
                self.log = self.log.split_off(&(upto.index + 1));
            }
            Op::Vote(v) => self.vote = Some(v),
        }
    }
}

/// What the disk holds, and what was written but not yet flushed to it.
#[derive(Default)]
struct DiskData {
    data: LogData,
    pending: Vec<Op>,
    /// The next flush fails, after this many pending operations reached
    /// the disk.
    fail_next: Option<usize>,
    /// A flush of this life failed: nothing is durable from then on.
    failed: bool,
}

/// A server's durable log: create one per simulated server and hand a clone
/// to each of its lives.
#[derive(Clone, Default)]
pub struct LogDisk(Arc<Mutex<DiskData>>);

impl LogDisk {
    /// Entries on disk (for reports).
    pub fn len(&self) -> usize {
        self.0.lock().unwrap().data.log.len()
    }

    /// Pending (unflushed) operations.
    pub fn pending(&self) -> usize {
        self.0.lock().unwrap().pending.len()
    }

    /// At a crash: the first `ops` pending operations reach the disk whole,
    /// and of the next one, if an append, its first `entries` entries.
    /// Nothing of it was acknowledged (callbacks wait for a flush).
    pub fn tear(&self, ops: usize, entries: usize) {
        let mut d = self.0.lock().unwrap();
        let mut pending = std::mem::take(&mut d.pending).into_iter();
        for op in pending.by_ref().take(ops) {
            d.data.apply(op);
        }
        if let Some(Op::Append(mut es)) = pending.next() {
            es.truncate(entries);
            d.data.apply(Op::Append(es));
        }
    }

    /// The next flush fails (EIO from fsync): its first `keep` pending
    /// operations reach the disk, the rest are lost.
    pub fn fail_next_flush(&self, keep: usize) {
        self.0.lock().unwrap().fail_next = Some(keep);
    }

    /// Whether a flush failed in the current life (the server has stopped
    /// its Raft and, as a real one, exits to be restarted).
    pub fn failed(&self) -> bool {
        self.0.lock().unwrap().failed
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

struct Cache {
    mem: LogData,
    /// Append callbacks waiting for the flush in progress.
    waiting: Vec<IOFlushed<TypeConfig>>,
    flush_scheduled: bool,
}

/// The log store of one life of a simulated server.
#[derive(Clone)]
pub struct MemLogStore {
    disk: LogDisk,
    cache: Arc<Mutex<Cache>>,
}

impl MemLogStore {
    /// Opens the disk as a restarted server finds it: what the last life
    /// did not flush is lost.
    pub fn open(disk: LogDisk) -> Self {
        let mem = {
            let mut d = disk.0.lock().unwrap();
            d.pending.clear();
            d.fail_next = None;
            d.failed = false;
            d.data.clone()
        };
        MemLogStore {
            disk,
            cache: Arc::new(Mutex::new(Cache {
                mem,
                waiting: Vec::new(),
                flush_scheduled: false,
            })),
        }
    }

    fn write(&self, op_mem: Op, op_disk: Op) {
        let mut c = self.cache.lock().unwrap();
        c.mem.apply(op_mem);
        self.disk.0.lock().unwrap().pending.push(op_disk);
    }

    /// Writes every pending operation to the disk; returns the callbacks
    /// that waited for it, and whether it failed.
    fn flush(&self) -> (Vec<IOFlushed<TypeConfig>>, Result<(), String>) {
        let mut c = self.cache.lock().unwrap();
        let mut disk = self.disk.0.lock().unwrap();
        let DiskData {
            data,
            pending,
            fail_next,
            failed,
        } = &mut *disk;
        let keep = match fail_next.take() {
            Some(keep) => {
                *failed = true;
                keep
            }
            None if *failed => 0,
            None => usize::MAX,
        };
        for (i, op) in pending.drain(..).enumerate() {
            // Past `keep`, lost with the failed fsync; the vote lives in
            // another file (sled, in the real store) and is not.
            if i < keep || matches!(op, Op::Vote(_)) {
                data.apply(op);
            }
        }
        c.flush_scheduled = false;
        let result = if *failed {
            Err("fsync of the simulated log: I/O error".to_string())
        } else {
            Ok(())
        };
        (std::mem::take(&mut c.waiting), result)
    }

    /// Flushes before returning (vote saves, truncation); the callbacks
    /// that waited wait on for their own flush.
    fn flush_now(&self) -> Result<(), StorageError> {
        let (cbs, result) = self.flush();
        self.cache.lock().unwrap().waiting.extend(cbs);
        self.schedule_flush();
        result.map_err(std::io::Error::other)
    }
}

impl RaftLogReader<TypeConfig> for MemLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self, range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let c = self.cache.lock().unwrap();
        let start = match range.start_bound() {
            Bound::Included(i) => Bound::Included(*i),
            Bound::Excluded(i) => Bound::Excluded(*i),
            Bound::Unbounded => Bound::Unbounded,
        };
        let end = match range.end_bound() {
            Bound::Included(i) => Bound::Included(*i),
            Bound::Excluded(i) => Bound::Excluded(*i),
            Bound::Unbounded => Bound::Unbounded,
        };
        Ok(c.mem
            .log
            .range((start, end))
            .map(|(_, e)| e.clone())
            .collect())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.cache.lock().unwrap().mem.vote)
    }
}

impl RaftLogStorage<TypeConfig> for MemLogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let c = self.cache.lock().unwrap();
        let last = c
            .mem
            .log
            .last_key_value()
            .map(|(_, e)| e.log_id)
            .or(c.mem.purged);
        Ok(LogState {
            last_purged_log_id: c.mem.purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        self.write(Op::Vote(*vote), Op::Vote(*vote));
        // Durable before returning; callbacks still wait for their own
        // flush. A failed log fsync does not fail it: the real store keeps
        // the vote in sled, another file.
        let _ = self.flush_now();
        Ok(())
    }

    async fn append<I: Entries>(
        &mut self, entries: I, callback: IOFlushed<TypeConfig>,
    ) -> Result<(), StorageError> {
        let entries: Vec<_> = entries.into_iter().collect();
        self.write(Op::Append(entries.clone()), Op::Append(entries));
        self.cache.lock().unwrap().waiting.push(callback);
        self.schedule_flush();
        Ok(())
    }

    async fn truncate_after(&mut self, last: Option<LogId>) -> Result<(), StorageError> {
        let from = last.map_or(0, |l| l.index + 1);
        self.write(Op::Truncate(from), Op::Truncate(from));
        self.flush_now()
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.write(Op::Purge(log_id), Op::Purge(log_id));
        Ok(())
    }
}

impl MemLogStore {
    /// Starts the group commit if callbacks wait and none is under way.
    fn schedule_flush(&self) {
        {
            let mut c = self.cache.lock().unwrap();
            if c.flush_scheduled || c.waiting.is_empty() {
                return;
            }
            c.flush_scheduled = true;
        }
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(FLUSH_DELAY).await;
            let (cbs, result) = me.flush();
            for cb in cbs {
                cb.io_completed(result.clone().map_err(std::io::Error::other));
            }
        });
    }
}
