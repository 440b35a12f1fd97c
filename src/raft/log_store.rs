//! The Raft log: append-only segment files with group commit; the vote in
//! sled.
//!
//! Why not sled for the log: a sled `flush` writes every buffer sealed since
//! the last one with its own synchronous `sync_file_range` (the log entry,
//! the state machine's rows, openraft's metadata: five or so per client
//! write, each a disk round trip), and it still needs an `fdatasync` after
//! it. Here an append is one `pwrite` to the end of the current segment, and
//! one `fdatasync` makes every append waiting durable.
//!
//! - `append` writes the entries at once (readable by `pread` from then on)
//!   and hands the completion callback to the flusher thread, which takes
//!   every callback waiting, `fdatasync`s once and completes them all: many
//!   appends share one fsync, and none is acknowledged before it.
//! - A segment (`log-<first index>.seg`) starts with a header record: the
//!   log id of the entry before its first, so the log's start (the last
//!   purged log id) survives a restart without a write of its own. Records
//!   are `[len u32][crc32 u32][bincode]`; opening stops at the first torn or
//!   corrupt record and cuts the segment there.
//! - `truncate_after` cuts the files and syncs them before returning;
//!   `purge` deletes whole segments the purge covers (lazily: reads hide
//!   entries at or before the purged id).
//! - The state machine lives in sled and is not fsync'd on its own: the log
//!   is the durable record. openraft recovers a state machine that is ahead
//!   of the log (it applied committed entries this log had not yet made
//!   durable) by treating the log as purged up to what was applied, and one
//!   behind a purge by installing the last snapshot (fsync'd file).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::ops::{Bound, RangeBounds};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};

use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};

use super::{Entry, LogId, StorageError, TypeConfig, Vote, io_err};

const VOTE: &[u8] = b"vote";
/// A new segment is started once the current one passes this size.
const SEGMENT_BYTES: u64 = 64 << 20;
const RECORD_HEADER: usize = 8;

fn read_err(e: impl std::fmt::Display) -> StorageError {
    io_err("reading the raft log", e)
}

fn write_err(e: impl std::fmt::Display) -> StorageError {
    io_err("writing the raft log", e)
}

/// Where an entry's record is.
#[derive(Debug, Clone, Copy)]
struct Pos {
    /// The segment's key (the index after its header's log id).
    segment: u64,
    offset: u64,
    len: u32,
}

struct Segment {
    path: PathBuf,
    file: Arc<File>,
    /// Bytes of valid records; the next record goes here.
    len: u64,
}

/// The log as the files hold it, plus an index of where each entry is.
struct Log {
    dir: PathBuf,
    /// By the index of their first entry (their header's log id + 1).
    segments: BTreeMap<u64, Segment>,
    /// Every entry after `purged`, and possibly a few before it (a purge
    /// deletes only whole segments).
    entries: BTreeMap<u64, (LogId, Pos)>,
    purged: Option<LogId>,
}

fn next_index(id: Option<&LogId>) -> u64 {
    id.map_or(0, |l| l.index + 1)
}

fn encode_record(payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// The record at `at`, if whole and intact: (payload, bytes it takes).
fn decode_record(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let head = buf.get(at..at + RECORD_HEADER)?;
    let len = u32::from_le_bytes(head[..4].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(head[4..].try_into().ok()?);
    let payload = buf.get(at + RECORD_HEADER..at + RECORD_HEADER + len)?;
    (crc32fast::hash(payload) == crc).then_some((payload, RECORD_HEADER + len))
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Log {
    fn open(dir: &Path) -> io::Result<Log> {
        fs::create_dir_all(dir)?;
        let mut names: Vec<(u64, PathBuf)> = Vec::new();
        for item in fs::read_dir(dir)? {
            let path = item?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if let Some(first) = name
                .strip_prefix("log-")
                .and_then(|n| n.strip_suffix(".seg"))
                .and_then(|n| n.parse::<u64>().ok())
            {
                names.push((first, path));
            }
        }
        names.sort();
        let mut log = Log {
            dir: dir.to_path_buf(),
            segments: BTreeMap::new(),
            entries: BTreeMap::new(),
            purged: None,
        };
        let mut torn = false;
        for (first, path) in names {
            if torn {
                // Nothing after a torn record was ever acknowledged.
                fs::remove_file(&path)?;
                continue;
            }
            let buf = fs::read(&path)?;
            let Some((header, mut at)) = decode_record(&buf, 0) else {
                // A segment whose header never reached the disk is empty.
                fs::remove_file(&path)?;
                torn = true;
                continue;
            };
            let prev: Option<LogId> = bincode::deserialize(header).map_err(io::Error::other)?;
            if prev != log.last() {
                // Not contiguous with what precedes it (a purge past the end
                // deleted the earlier entries' successors): it starts the log.
                log.entries.clear();
                log.segments.clear();
                log.purged = prev;
            } else if log.segments.is_empty() {
                log.purged = prev;
            }
            while let Some((payload, n)) = decode_record(&buf, at) {
                let e: Entry = bincode::deserialize(payload).map_err(io::Error::other)?;
                let pos = Pos {
                    segment: first,
                    offset: at as u64,
                    len: n as u32,
                };
                log.entries.insert(e.log_id.index, (e.log_id, pos));
                at += n;
            }
            let file = OpenOptions::new().read(true).write(true).open(&path)?;
            if at < buf.len() {
                tracing::warn!(segment = %path.display(), valid = at, bytes = buf.len(), "raft log: cutting a torn tail");
                file.set_len(at as u64)?;
                file.sync_all()?;
                torn = true;
            }
            log.segments.insert(
                first,
                Segment {
                    path,
                    file: Arc::new(file),
                    len: at as u64,
                },
            );
        }
        if log.segments.is_empty() {
            let prev = log.purged;
            log.start_segment(prev)?;
        }
        Ok(log)
    }

    fn last(&self) -> Option<LogId> {
        self.entries
            .values()
            .next_back()
            .map(|(id, _)| *id)
            .or(self.purged)
    }

    /// Starts a new segment after `prev`, durable (file and its name) before
    /// anything is written to it.
    fn start_segment(&mut self, prev: Option<LogId>) -> io::Result<()> {
        let first = next_index(prev.as_ref());
        let path = self.dir.join(format!("log-{first:020}.seg"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        let mut rec = Vec::new();
        encode_record(
            &bincode::serialize(&prev).map_err(io::Error::other)?,
            &mut rec,
        );
        file.write_all_at(&rec, 0)?;
        file.sync_all()?;
        sync_dir(&self.dir)?;
        self.segments.insert(
            first,
            Segment {
                path,
                file: Arc::new(file),
                len: rec.len() as u64,
            },
        );
        Ok(())
    }

    fn current(&mut self) -> (&u64, &mut Segment) {
        self.segments
            .iter_mut()
            .next_back()
            .expect("the log always has a segment")
    }

    /// Writes the entries at the end of the current segment; returns the
    /// file to sync for them.
    #[cfg(test)]
    fn append(&mut self, entries: Vec<Entry>) -> io::Result<Arc<File>> {
        self.write(Records::encode(entries)?)
    }

    /// Writes encoded records at the end of the current segment; returns
    /// the file to sync for them.
    fn write(&mut self, records: Records) -> io::Result<Arc<File>> {
        if self.current().1.len >= SEGMENT_BYTES {
            // The full segment is synced before the next one starts, so the
            // flusher only ever needs to sync the current segment.
            self.current().1.file.sync_data()?;
            let prev = self.last();
            self.start_segment(prev)?;
        }
        let Records { buf, placed } = records;
        let (&key, seg) = self.current();
        seg.file.write_all_at(&buf, seg.len)?;
        let base = seg.len;
        seg.len += buf.len() as u64;
        let file = seg.file.clone();
        for (id, start, len) in placed {
            let pos = Pos {
                segment: key,
                offset: base + start as u64,
                len: len as u32,
            };
            self.entries.insert(id.index, (id, pos));
        }
        Ok(file)
    }

    fn read(&self, range: (Bound<u64>, Bound<u64>)) -> io::Result<Vec<Entry>> {
        self.read_upto(range, usize::MAX)
    }

    /// The entries in `range`, stopping before the one that would take the
    /// records read past `budget` bytes (the first is always read).
    fn read_upto(&self, range: (Bound<u64>, Bound<u64>), budget: usize) -> io::Result<Vec<Entry>> {
        let from = next_index(self.purged.as_ref());
        let mut out = Vec::new();
        let mut buf = Vec::new();
        let mut total = 0usize;
        for (_, (_, pos)) in self.entries.range(range).filter(|(i, _)| **i >= from) {
            total = total.saturating_add(pos.len as usize);
            if total > budget && !out.is_empty() {
                break;
            }
            let seg = &self.segments[&pos.segment];
            buf.resize(pos.len as usize, 0);
            seg.file.read_exact_at(&mut buf, pos.offset)?;
            let (payload, _) = decode_record(&buf, 0)
                .ok_or_else(|| io::Error::other("raft log record corrupt on read"))?;
            out.push(bincode::deserialize(payload).map_err(io::Error::other)?);
        }
        Ok(out)
    }

    /// Removes every entry after `last`, durably.
    fn truncate_after(&mut self, last: Option<LogId>) -> io::Result<()> {
        let from = next_index(last.as_ref());
        let Some((_, pos)) = self.entries.range(from..).next().map(|(i, p)| (*i, p.1)) else {
            return Ok(());
        };
        self.entries.split_off(&from);
        let later: Vec<u64> = self
            .segments
            .range(pos.segment + 1..)
            .map(|(k, _)| *k)
            .collect();
        for k in later {
            let seg = self.segments.remove(&k).expect("listed above");
            fs::remove_file(&seg.path)?;
        }
        let seg = self
            .segments
            .get_mut(&pos.segment)
            .expect("entry's segment");
        seg.file.set_len(pos.offset)?;
        seg.file.sync_all()?;
        seg.len = pos.offset;
        sync_dir(&self.dir)
    }

    /// Forgets entries up to `upto`; deletes segments holding nothing after
    /// it. A purge past the end starts a new segment after `upto`.
    fn purge(&mut self, upto: LogId) -> io::Result<()> {
        if self.purged.is_some_and(|p| p.index >= upto.index) {
            return Ok(());
        }
        if self.last().is_none_or(|l| l.index <= upto.index) {
            self.start_segment(Some(upto))?;
        }
        self.purged = Some(upto);
        // A segment is covered when the next one starts at or before the
        // entry after `upto`.
        let keys: Vec<u64> = self.segments.keys().copied().collect();
        for pair in keys.windows(2) {
            if pair[1] <= upto.index + 1 {
                let seg = self.segments.remove(&pair[0]).expect("listed above");
                fs::remove_file(&seg.path)?;
            }
        }
        self.entries = self.entries.split_off(&(upto.index + 1));
        Ok(())
    }
}

/// Entries encoded as log records, before the log is locked to write them
/// (encoding does not hold up readers such as replication).
struct Records {
    buf: Vec<u8>,
    /// Each entry's id, and where its record starts in `buf` and how long.
    placed: Vec<(LogId, usize, usize)>,
}

impl Records {
    fn encode(entries: impl IntoIterator<Item = Entry>) -> io::Result<Records> {
        let mut buf = Vec::new();
        let mut placed = Vec::new();
        for e in entries {
            let start = buf.len();
            encode_record(&bincode::serialize(&e).map_err(io::Error::other)?, &mut buf);
            placed.push((e.log_id, start, buf.len() - start));
        }
        Ok(Records { buf, placed })
    }
}

/// A callback and the file whose sync completes it.
type Waiting = (Arc<File>, IOFlushed<TypeConfig>);

#[derive(Clone)]
pub struct LogStore {
    log: Arc<Mutex<Log>>,
    db: sled::Db,
    meta: sled::Tree,
    flusher: mpsc::Sender<Waiting>,
    /// sled's file, for `fdatasync` after its flush (vote saves).
    sled_file: Arc<File>,
}

impl LogStore {
    /// The log in `log_dir`; the vote in sled (`db`, opened in `db_dir`).
    pub fn open(db: &sled::Db, db_dir: &Path, log_dir: &Path) -> anyhow::Result<Self> {
        let log = Log::open(log_dir)?;
        let (tx, rx) = mpsc::channel::<Waiting>();
        std::thread::Builder::new()
            .name("raft-log-flush".into())
            .spawn(move || flush_loop(rx))?;
        let sled_file = Arc::new(OpenOptions::new().write(true).open(db_dir.join("db"))?);
        Ok(LogStore {
            log: Arc::new(Mutex::new(log)),
            db: db.clone(),
            meta: db.open_tree("raft_meta")?,
            flusher: tx,
            sled_file,
        })
    }

    /// Makes the vote durable, off the async threads.
    async fn sync_sled(&self) -> io::Result<()> {
        self.db.flush_async().await.map_err(io::Error::other)?;
        let file = self.sled_file.clone();
        tokio::task::spawn_blocking(move || file.sync_data())
            .await
            .map_err(io::Error::other)?
    }
}

/// Group commit: every callback waiting shares one `fdatasync` per file.
fn flush_loop(rx: mpsc::Receiver<Waiting>) {
    while let Ok(first) = rx.recv() {
        let mut waiting = vec![first];
        waiting.extend(rx.try_iter());
        let mut files: Vec<Arc<File>> = Vec::new();
        for (f, _) in &waiting {
            if !files.iter().any(|g| Arc::ptr_eq(f, g)) {
                files.push(f.clone());
            }
        }
        let result = files.iter().try_for_each(|f| f.sync_data());
        crate::metrics::LOG_FSYNCS.inc();
        crate::metrics::LOG_FSYNC_BATCH.add(waiting.len() as u64);
        for (_, cb) in waiting {
            let r = match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
            };
            cb.io_completed(r);
        }
    }
}

fn bounds<RB: RangeBounds<u64>>(range: &RB) -> (Bound<u64>, Bound<u64>) {
    (range.start_bound().cloned(), range.end_bound().cloned())
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        self.log
            .lock()
            .unwrap()
            .read(bounds(&range))
            .map_err(read_err)
    }

    /// What replication sends in one AppendEntries: bounded by bytes as
    /// well as by openraft's entry count, so a run of large entries goes
    /// in several requests instead of one frame no follower would take.
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, StorageError> {
        self.log
            .lock()
            .unwrap()
            .read_upto(
                (Bound::Included(start), Bound::Excluded(end)),
                super::network::APPEND_BYTES,
            )
            .map_err(read_err)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        match self.meta.get(VOTE).map_err(read_err)? {
            Some(v) => Ok(Some(bincode::deserialize(&v).map_err(read_err)?)),
            None => Ok(None),
        }
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let log = self.log.lock().unwrap();
        Ok(LogState {
            last_purged_log_id: log.purged,
            last_log_id: log.last(),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let bytes = bincode::serialize(vote).map_err(write_err)?;
        self.meta.insert(VOTE, bytes).map_err(write_err)?;
        self.sync_sled()
            .await
            .map_err(|e| io_err("saving the vote", e))
    }

    // `save_committed` is left out (openraft's default keeps nothing): the
    // state machine's applied id, persisted with its rows, tells a restart
    // where to resume, and a committed id persisted apart from the log could
    // point past what the log made durable.

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let records = Records::encode(entries).map_err(write_err)?;
        let file = self.log.lock().unwrap().write(records).map_err(write_err)?;
        self.flusher
            .send((file, callback))
            .map_err(|_| write_err("log flusher stopped"))
    }

    async fn truncate_after(&mut self, last: Option<LogId>) -> Result<(), StorageError> {
        self.log
            .lock()
            .unwrap()
            .truncate_after(last)
            .map_err(write_err)
    }

    async fn purge(&mut self, upto: LogId) -> Result<(), StorageError> {
        self.log.lock().unwrap().purge(upto).map_err(write_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::EntryPayload;
    use openraft::impls::leader_id_adv::LeaderId;

    fn id(term: u64, index: u64) -> LogId {
        LogId {
            leader_id: LeaderId { term, node_id: 1 },
            index,
        }
    }

    fn entry(term: u64, index: u64) -> Entry {
        Entry {
            log_id: id(term, index),
            payload: EntryPayload::Blank,
        }
    }

    fn indexes(log: &Log) -> Vec<u64> {
        log.read((Bound::Unbounded, Bound::Unbounded))
            .unwrap()
            .iter()
            .map(|e| e.log_id.index)
            .collect()
    }

    #[test]
    fn reopens_with_what_was_written_and_cuts_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path()).unwrap();
        log.append((1..=3).map(|i| entry(1, i)).collect()).unwrap();
        let seg = log.current().1.path.clone();
        drop(log);
        // Half a record at the end, as a crash mid-write leaves it.
        let mut f = OpenOptions::new().append(true).open(&seg).unwrap();
        std::io::Write::write_all(&mut f, &[9, 0, 0, 0, 1, 2]).unwrap();
        let mut log = Log::open(dir.path()).unwrap();
        assert_eq!(indexes(&log), vec![1, 2, 3]);
        assert_eq!(log.last(), Some(id(1, 3)));
        log.append(vec![entry(2, 4)]).unwrap();
        drop(log);
        let log = Log::open(dir.path()).unwrap();
        assert_eq!(indexes(&log), vec![1, 2, 3, 4]);
    }

    #[test]
    fn truncate_and_purge_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path()).unwrap();
        log.append((1..=5).map(|i| entry(1, i)).collect()).unwrap();
        log.truncate_after(Some(id(1, 3))).unwrap();
        log.append(vec![entry(2, 4)]).unwrap();
        log.purge(id(1, 2)).unwrap();
        assert_eq!(indexes(&log), vec![3, 4]);
        drop(log);
        let log = Log::open(dir.path()).unwrap();
        // The purge deleted no segment: the entries it hid are back, which
        // a purge allows (it is lazy).
        assert_eq!(log.last(), Some(id(2, 4)));
        assert_eq!(indexes(&log), vec![1, 2, 3, 4]);
    }

    #[test]
    fn a_purge_past_the_end_starts_the_log_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path()).unwrap();
        log.append((1..=3).map(|i| entry(1, i)).collect()).unwrap();
        log.purge(id(3, 10)).unwrap();
        assert_eq!(log.last(), Some(id(3, 10)));
        log.append(vec![entry(3, 11)]).unwrap();
        drop(log);
        let log = Log::open(dir.path()).unwrap();
        assert_eq!(log.purged, Some(id(3, 10)));
        assert_eq!(indexes(&log), vec![11]);
        assert_eq!(log.segments.len(), 1);
    }
}
