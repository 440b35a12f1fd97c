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
//! - `append` encodes the entries, keeps them decoded in the tail (readable
//!   from then on) and hands them to the writer thread, and returns: no
//!   file I/O and no wait for a thread on the async workers. The writer
//!   takes every job waiting, writes each append with one `pwrite`,
//!   `fdatasync`s once and only then completes their callbacks: many
//!   appends share one fsync, and none is acknowledged before it.
//! - Reads of the newest entries (replication) come from the tail; older
//!   ones (a follower far behind, a restart) from the files, on a blocking
//!   thread. Truncate, purge and the log's state go through the writer, in
//!   order after the appends sent before them.
//! - A segment (`log-<first index>.seg`) starts with `CAIRNLOG` and its
//!   format version (`disk::LOG_FORMAT`), then a header record: the log id
//!   of the entry before its first, so the log's start (the last purged log
//!   id) survives a restart without a write of its own. Records are
//!   `[len u32][crc32 u32][bincode]`.
//! - Recovery never guesses: every segment but the last is synced before
//!   the next one starts, so only the last can have a torn tail, and only a
//!   tail that looks torn (cut short with no later entry after it, or
//!   sectors of zeros) is cut. Any other
//!   damage, a bad header or an unknown version refuses to open, naming the
//!   file and offset.
//! - Any I/O error is returned to openraft, which stops; after a failed
//!   fsync nothing more is reported durable (the kernel may have dropped
//!   the pages it could not write). The server then exits (`process::run_server`).
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
use std::sync::{Arc, Mutex, MutexGuard, mpsc};

use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};

use super::{Entries, Entry, LogId, StorageError, TypeConfig, Vote, io_err};
use crate::disk::{DiskError, LOG_FORMAT, sync_dir};

const VOTE: &[u8] = b"vote";
/// By default a new segment is started once the current one passes this
/// size (`LogStore::open` takes another, for tests).
pub const SEGMENT_BYTES: u64 = 64 << 20;
const RECORD_HEADER: usize = 8;
/// Every segment starts with this, then its format version (u32 LE).
const MAGIC: &[u8; 8] = b"CAIRNLOG";
const PREAMBLE: usize = MAGIC.len() + 4;
/// The unit a disk writes whole or not at all: a torn write leaves whole
/// sectors of zeros where its data never landed.
const SECTOR: usize = 512;

/// A segment file, with its path for error messages.
struct SegFile {
    path: PathBuf,
    file: File,
}

impl SegFile {
    fn err(&self, op: &'static str, e: io::Error) -> DiskError {
        DiskError::io(op, &self.path, e)
    }
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
    file: Arc<SegFile>,
    /// Bytes of valid records; the next record goes here.
    len: u64,
}

/// The log as the files hold it, plus an index of where each entry is.
struct Log {
    dir: PathBuf,
    segment_bytes: u64,
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
/// No record cairn writes is empty, so a zero length is never intact.
fn decode_record(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let head = buf.get(at..at.checked_add(RECORD_HEADER)?)?;
    let len = u32::from_le_bytes(head[..4].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(head[4..].try_into().ok()?);
    let payload = buf.get(at + RECORD_HEADER..(at + RECORD_HEADER).checked_add(len)?)?;
    (len > 0 && crc32fast::hash(payload) == crc).then_some((payload, RECORD_HEADER + len))
}

/// Whether the bad record at `at` (the first one of the last segment) is
/// what a crash during an unsynced write leaves, rather than damage. A
/// crash stops a write short of the end of the file, or leaves sectors
/// that never reached the disk reading as zeros; a record that is whole in
/// length and has no zero sector was written, and has changed since.
///
/// A record whose length runs past the end of the file was cut short,
/// unless the entry that follows it (`following`) is found whole after it:
/// then its length field is what changed. (A damaged length in the very
/// last record looks like a write cut short; nothing tells the two apart.)
fn torn_at(buf: &[u8], at: usize, following: u64) -> bool {
    let Some(head) = buf.get(at..at + RECORD_HEADER) else {
        return true;
    };
    let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
    let end = at + RECORD_HEADER + len;
    if end > buf.len() {
        return !entry_after(buf, at + RECORD_HEADER, following);
    }
    // A zeroed header: the rest of its sector is zero too if it was never
    // written (a record's header never is: its length is not 0).
    let sector_end = ((at / SECTOR) + 1) * SECTOR;
    if len == 0 && buf[at..sector_end.min(buf.len())].iter().all(|b| *b == 0) {
        return true;
    }
    let first = at.div_ceil(SECTOR) * SECTOR;
    (first..end)
        .step_by(SECTOR)
        .filter(|s| s + SECTOR <= end)
        .any(|s| buf[s..s + SECTOR].iter().all(|b| *b == 0))
}

/// Whether the record of entry `index` starts somewhere in `buf` from
/// `from` on. An entry's bincode starts with its log id: term, node id,
/// index (u64 LE each), so most offsets are ruled out by 8 bytes.
fn entry_after(buf: &[u8], from: usize, index: u64) -> bool {
    let want = index.to_le_bytes();
    let at_index = RECORD_HEADER + 16;
    (from..buf.len().saturating_sub(at_index + 8)).any(|c| {
        buf[c + at_index..c + at_index + 8] == want
            && decode_record(buf, c)
                .and_then(|(p, _)| bincode::deserialize::<Entry>(p).ok())
                .is_some_and(|e| e.log_id.index == index)
    })
}

/// One segment file read from disk.
struct Scanned {
    prev: Option<LogId>,
    entries: Vec<(LogId, Pos)>,
    /// Bytes of whole, intact records.
    valid: u64,
    /// Bytes in the file.
    len: u64,
}

/// Reads a segment. Damage is an error, except for a torn tail when the
/// segment is the last (`last`): then the scan stops before it (and a
/// segment whose header is torn has `prev` of `None` and no `valid` bytes).
fn scan_segment(path: &Path, key: u64, last: bool) -> Result<Option<Scanned>, DiskError> {
    let buf = fs::read(path).map_err(|e| DiskError::io("read", path, e))?;
    let corrupt = |offset: usize, reason: String| DiskError::Corrupt {
        path: path.to_path_buf(),
        offset: offset as u64,
        reason,
    };
    // A segment is created and its preamble and header synced before any
    // entry is written to it: only the last can lack them, after a crash.
    let unwritten = buf.len() < PREAMBLE || buf.iter().all(|b| *b == 0);
    if unwritten && last {
        return Ok(None);
    }
    if buf.len() < PREAMBLE || &buf[..MAGIC.len()] != MAGIC {
        return Err(DiskError::Magic {
            path: path.to_path_buf(),
            what: "raft log segment",
        });
    }
    let version = u32::from_le_bytes(buf[MAGIC.len()..PREAMBLE].try_into().expect("4 bytes"));
    if version != LOG_FORMAT {
        return Err(DiskError::Version {
            path: path.to_path_buf(),
            found: version,
            expected: LOG_FORMAT,
        });
    }
    let Some((header, n)) = decode_record(&buf, PREAMBLE) else {
        if last && torn_at(&buf, PREAMBLE, key) {
            return Ok(None);
        }
        return Err(corrupt(
            PREAMBLE,
            "segment header record fails its checksum".into(),
        ));
    };
    let prev: Option<LogId> = bincode::deserialize(header)
        .map_err(|e| corrupt(PREAMBLE, format!("segment header does not decode: {e}")))?;
    if next_index(prev.as_ref()) != key {
        return Err(corrupt(
            PREAMBLE,
            format!(
                "header says the segment starts at index {}, its name {key}",
                next_index(prev.as_ref())
            ),
        ));
    }
    let mut at = PREAMBLE + n;
    let mut entries = Vec::new();
    let mut expect = key;
    while at < buf.len() {
        let Some((payload, n)) = decode_record(&buf, at) else {
            if last && torn_at(&buf, at, expect + 1) {
                break;
            }
            return Err(corrupt(at, "record fails its checksum".into()));
        };
        let e: Entry = bincode::deserialize(payload)
            .map_err(|e| corrupt(at, format!("entry does not decode: {e}")))?;
        // Entries follow one another; the first may start past the
        // header's log id (a log that never held the entries before it).
        if e.log_id.index != expect && !(entries.is_empty() && e.log_id.index > expect) {
            return Err(corrupt(
                at,
                format!("entry {} where entry {expect} belongs", e.log_id.index),
            ));
        }
        expect = e.log_id.index + 1;
        entries.push((
            e.log_id,
            Pos {
                segment: key,
                offset: at as u64,
                len: n as u32,
            },
        ));
        at += n;
    }
    Ok(Some(Scanned {
        prev,
        entries,
        valid: at as u64,
        len: buf.len() as u64,
    }))
}

impl Log {
    /// Opens the log in `dir`. Only a torn tail of the last segment is cut
    /// (logged with file and offset); any other damage, a bad header or an
    /// unknown format version refuses to open, naming the file.
    fn open(dir: &Path, segment_bytes: u64) -> Result<Log, DiskError> {
        fs::create_dir_all(dir).map_err(|e| DiskError::io("create directory", dir, e))?;
        let mut names: Vec<(u64, PathBuf)> = Vec::new();
        let listing = fs::read_dir(dir).map_err(|e| DiskError::io("list", dir, e))?;
        for item in listing {
            let path = item.map_err(|e| DiskError::io("list", dir, e))?.path();
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
            segment_bytes,
            segments: BTreeMap::new(),
            entries: BTreeMap::new(),
            purged: None,
        };
        let count = names.len();
        for (i, (key, path)) in names.into_iter().enumerate() {
            let last = i + 1 == count;
            let Some(seg) = scan_segment(&path, key, last)? else {
                tracing::warn!(segment = %path.display(), "raft log: removing a last segment whose header never reached the disk (torn at creation)");
                fs::remove_file(&path).map_err(|e| DiskError::io("remove", &path, e))?;
                sync_dir(dir)?;
                continue;
            };
            let prev_last = log.last();
            if seg.prev != prev_last {
                if seg.prev.map(|p| p.index) > prev_last.map(|p| p.index) {
                    // A purge past the end started this segment; the
                    // earlier ones (not yet deleted) hold only purged
                    // entries.
                    log.entries.clear();
                    log.segments.clear();
                    log.purged = seg.prev;
                } else {
                    return Err(DiskError::Corrupt {
                        path,
                        offset: PREAMBLE as u64,
                        reason: format!(
                            "segment follows log id {:?}, the segments before it end at {prev_last:?}",
                            seg.prev
                        ),
                    });
                }
            } else if log.segments.is_empty() {
                log.purged = seg.prev;
            }
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| DiskError::io("open", &path, e))?;
            let file = SegFile { path, file };
            if seg.valid < seg.len {
                // Only the last segment gets here (scan_segment refuses
                // damage elsewhere): what follows its last intact record
                // was never synced, so never acknowledged.
                tracing::warn!(
                    segment = %file.path.display(),
                    offset = seg.valid,
                    bytes = seg.len,
                    "raft log: cutting a torn tail of the last segment"
                );
                file.file
                    .set_len(seg.valid)
                    .map_err(|e| file.err("truncate", e))?;
                file.file.sync_all().map_err(|e| file.err("fsync", e))?;
            }
            for (id, pos) in seg.entries {
                log.entries.insert(id.index, (id, pos));
            }
            log.segments.insert(
                key,
                Segment {
                    file: Arc::new(file),
                    len: seg.valid,
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
    /// anything is written to it. The current segment is synced first, so
    /// every segment but the last is whole on disk: only the last can have
    /// a torn tail.
    fn start_segment(&mut self, prev: Option<LogId>) -> Result<(), DiskError> {
        if let Some((_, seg)) = self.segments.iter().next_back() {
            seg.file
                .file
                .sync_data()
                .map_err(|e| seg.file.err("fsync", e))?;
        }
        let first = next_index(prev.as_ref());
        let path = self.dir.join(format!("log-{first:020}.seg"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| DiskError::io("create", &path, e))?;
        let file = SegFile { path, file };
        let mut rec = Vec::with_capacity(64);
        rec.extend_from_slice(MAGIC);
        rec.extend_from_slice(&LOG_FORMAT.to_le_bytes());
        encode_record(
            &bincode::serialize(&prev).expect("a log id encodes"),
            &mut rec,
        );
        file.file
            .write_all_at(&rec, 0)
            .map_err(|e| file.err("write", e))?;
        file.file.sync_all().map_err(|e| file.err("fsync", e))?;
        sync_dir(&self.dir)?;
        self.segments.insert(
            first,
            Segment {
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
    fn append(&mut self, entries: Vec<Entry>) -> Result<Arc<SegFile>, DiskError> {
        self.write(Records::encode(&entries))
    }

    /// Writes encoded records at the end of the current segment; returns
    /// the file to sync for them.
    fn write(&mut self, records: Records) -> Result<Arc<SegFile>, DiskError> {
        if self.current().1.len >= self.segment_bytes {
            let prev = self.last();
            self.start_segment(prev)?;
        }
        let Records { buf, placed } = records;
        let (&key, seg) = self.current();
        seg.file
            .file
            .write_all_at(&buf, seg.len)
            .map_err(|e| seg.file.err("write", e))?;
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

    #[cfg(test)]
    fn read(&self, range: (Bound<u64>, Bound<u64>)) -> Result<Vec<Entry>, DiskError> {
        self.read_upto(range, usize::MAX, true).map(|(out, ..)| out)
    }

    /// The entries in `range`, stopping before the one that would take the
    /// records read past `budget` bytes (the first whatever its size if
    /// `first_free`); with the bytes their records take, and whether the
    /// budget cut it short.
    fn read_upto(
        &self, range: (Bound<u64>, Bound<u64>), budget: usize, first_free: bool,
    ) -> Result<(Vec<Entry>, usize, bool), DiskError> {
        let from = next_index(self.purged.as_ref());
        let mut out = Vec::new();
        let mut buf = Vec::new();
        let mut total = 0usize;
        for (_, (_, pos)) in self.entries.range(range).filter(|(i, _)| **i >= from) {
            if total.saturating_add(pos.len as usize) > budget && !(first_free && out.is_empty()) {
                return Ok((out, total, true));
            }
            total = total.saturating_add(pos.len as usize);
            let seg = &self.segments[&pos.segment].file;
            buf.resize(pos.len as usize, 0);
            seg.file
                .read_exact_at(&mut buf, pos.offset)
                .map_err(|e| seg.err("read", e))?;
            let corrupt = |reason: String| DiskError::Corrupt {
                path: seg.path.clone(),
                offset: pos.offset,
                reason,
            };
            let (payload, _) = decode_record(&buf, 0)
                .ok_or_else(|| corrupt("record fails its checksum on read".into()))?;
            out.push(
                bincode::deserialize(payload)
                    .map_err(|e| corrupt(format!("entry does not decode: {e}")))?,
            );
        }
        Ok((out, total, false))
    }

    /// Removes every entry after `last`, durably.
    fn truncate_after(&mut self, last: Option<LogId>) -> Result<(), DiskError> {
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
            fs::remove_file(&seg.file.path).map_err(|e| seg.file.err("remove", e))?;
        }
        let seg = self
            .segments
            .get_mut(&pos.segment)
            .expect("entry's segment");
        seg.file
            .file
            .set_len(pos.offset)
            .map_err(|e| seg.file.err("truncate", e))?;
        seg.file
            .file
            .sync_all()
            .map_err(|e| seg.file.err("fsync", e))?;
        seg.len = pos.offset;
        sync_dir(&self.dir)
    }

    /// Forgets entries up to `upto`; deletes segments holding nothing after
    /// it. A purge past the end starts a new segment after `upto`.
    fn purge(&mut self, upto: LogId) -> Result<(), DiskError> {
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
                fs::remove_file(&seg.file.path).map_err(|e| seg.file.err("remove", e))?;
            }
        }
        self.entries = self.entries.split_off(&(upto.index + 1));
        Ok(())
    }
}

/// What a start would find in the log in `dir`, without changing anything:
/// one line per segment; `false` if the start would refuse.
pub fn inspect(dir: &Path) -> (Vec<String>, bool) {
    let mut names: Vec<(u64, PathBuf)> = match fs::read_dir(dir) {
        Ok(listing) => listing
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter_map(|p| {
                let name = p.file_name()?.to_str()?;
                let first = name.strip_prefix("log-")?.strip_suffix(".seg")?;
                Some((first.parse().ok()?, p))
            })
            .collect(),
        Err(e) => return (vec![format!("{}: {e}", dir.display())], false),
    };
    names.sort();
    let mut lines = Vec::new();
    let mut ok = true;
    let count = names.len();
    for (i, (key, path)) in names.into_iter().enumerate() {
        let line = match scan_segment(&path, key, i + 1 == count) {
            Ok(None) => "header torn at creation (would be removed)".to_string(),
            Ok(Some(seg)) => {
                let range = match (seg.entries.first(), seg.entries.last()) {
                    (Some(a), Some(b)) => format!("entries {}..={}", a.0.index, b.0.index),
                    _ => "no entries".into(),
                };
                let tail = if seg.valid < seg.len {
                    format!(", torn tail at offset {} (would be cut)", seg.valid)
                } else {
                    String::new()
                };
                format!(
                    "ok: after {:?}, {range}, {} bytes{tail}",
                    seg.prev.map(|l| l.index),
                    seg.len
                )
            }
            Err(e) => {
                ok = false;
                format!("REFUSED: {e}")
            }
        };
        lines.push(format!("{}: {line}", path.display()));
    }
    (lines, ok)
}

/// Entries encoded as log records, before the log is locked to write them
/// (encoding does not hold up readers such as replication).
struct Records {
    buf: Vec<u8>,
    /// Each entry's id, and where its record starts in `buf` and how long.
    placed: Vec<(LogId, usize, usize)>,
}

impl Records {
    fn encode<'a>(entries: impl IntoIterator<Item = &'a Entry>) -> Records {
        let mut buf = Vec::new();
        let mut placed = Vec::new();
        for e in entries {
            let start = buf.len();
            // bincode of an entry fails only on types it cannot encode.
            encode_record(&bincode::serialize(e).expect("an entry encodes"), &mut buf);
            placed.push((e.log_id, start, buf.len() - start));
        }
        Records { buf, placed }
    }
}

/// A callback and the file whose sync completes it.
type Waiting = (Arc<SegFile>, IOFlushed<TypeConfig>);

/// The first failed write or fsync, shared by the writer thread and the
/// store: after a failed fsync the kernel may have dropped the dirty pages
/// it failed to write, so nothing written before or after can be reported
/// durable again.
type Failed = Arc<std::sync::OnceLock<String>>;

/// The newest entries are kept decoded, up to this many bytes of records
/// (written ones; entries not yet written are always kept): replication
/// reads them from here, and only a follower further behind than this
/// costs a file read on a blocking thread. One AppendEntries' worth.
const TAIL_BYTES: usize = super::network::APPEND_BYTES;

/// One entry of the tail.
struct Cached {
    entry: Entry,
    /// Bytes of its record in the files.
    size: usize,
    /// In the files (and their index) yet: only then may it leave the tail.
    written: bool,
}

/// The newest entries appended, consecutive, oldest first. `append` puts
/// entries here and returns (openraft asks only that they be readable when
/// it returns); the writer thread writes them to the files in order, marks
/// them written, and drops the oldest written ones past `TAIL_BYTES`. So
/// every entry not purged is in the tail or in the files (one leaves the
/// tail only once the files' index has it), and neither an append nor a
/// read of the newest entries waits for a thread.
#[derive(Default)]
struct Tail {
    entries: std::collections::VecDeque<Cached>,
    /// Record bytes of the written entries held.
    written_bytes: usize,
}

impl Tail {
    fn first_index(&self) -> Option<u64> {
        self.entries.front().map(|c| c.entry.log_id.index)
    }

    fn last_id(&self) -> Option<LogId> {
        self.entries.back().map(|c| c.entry.log_id)
    }

    fn push(&mut self, entries: Vec<Entry>, sizes: impl Iterator<Item = usize>) {
        let Some(first) = entries.first().map(|e| e.log_id.index) else {
            return;
        };
        // openraft appends right after the last entry (a truncate comes
        // first when it overwrites); anything else starts the tail afresh
        // (the files hold or will hold every entry dropped here).
        if self.last_id().is_some_and(|l| l.index + 1 != first) {
            self.truncate_from(first);
            if self.last_id().is_some_and(|l| l.index + 1 != first) {
                self.entries.clear();
                self.written_bytes = 0;
            }
        }
        for (entry, size) in entries.into_iter().zip(sizes) {
            self.entries.push_back(Cached {
                entry,
                size,
                written: false,
            });
        }
    }

    /// Drops every entry at `from` and after.
    fn truncate_from(&mut self, from: u64) {
        while let Some(c) = self.entries.back() {
            if c.entry.log_id.index < from {
                break;
            }
            if c.written {
                self.written_bytes -= c.size;
            }
            self.entries.pop_back();
        }
    }

    /// Drops every entry at or before `upto` (a purge: openraft never reads
    /// them again; one committed by the followers before this server wrote
    /// it is still written by the writer, before the purge reaches the
    /// files).
    fn purge(&mut self, upto: u64) {
        while let Some(c) = self.entries.front() {
            if c.entry.log_id.index > upto {
                break;
            }
            if c.written {
                self.written_bytes -= c.size;
            }
            self.entries.pop_front();
        }
    }

    /// The writer wrote these entries and the files' index has them.
    fn written(&mut self, ids: impl Iterator<Item = LogId>) {
        for id in ids {
            let Some(first) = self.first_index() else {
                return;
            };
            let Some(at) = id.index.checked_sub(first) else {
                continue;
            };
            // The same log id: not an entry a truncate replaced since.
            if let Some(c) = self.entries.get_mut(at as usize)
                && c.entry.log_id == id
                && !c.written
            {
                c.written = true;
                self.written_bytes += c.size;
            }
        }
        while self.written_bytes > TAIL_BYTES {
            match self.entries.front() {
                Some(c) if c.written => {
                    self.written_bytes -= c.size;
                    self.entries.pop_front();
                }
                _ => break,
            }
        }
    }

    /// The entries from `start` before `end` within `budget` bytes (the
    /// first whatever its size if `first_free`), if the tail holds `start`
    /// or starts before it; `None` if the tail is empty or starts after
    /// `start` (the files have those).
    fn read(
        &self, start: u64, end: Bound<u64>, budget: usize, first_free: bool,
    ) -> Option<Vec<Entry>> {
        let first = self.first_index().filter(|f| *f <= start)?;
        let mut out = Vec::new();
        let mut total = 0usize;
        for c in self
            .entries
            .range((start - first).min(self.entries.len() as u64) as usize..)
        {
            if !before(end, c.entry.log_id.index)
                || (total.saturating_add(c.size) > budget && !(first_free && out.is_empty()))
            {
                break;
            }
            total = total.saturating_add(c.size);
            out.push(c.entry.clone());
        }
        Some(out)
    }
}

/// Whether `index` comes before `end`.
fn before(end: Bound<u64>, index: u64) -> bool {
    match end {
        Bound::Included(e) => index <= e,
        Bound::Excluded(e) => index < e,
        Bound::Unbounded => true,
    }
}

/// Work for the writer thread, done in the order sent.
enum Job {
    /// Records to write at the end of the log, then make durable.
    Append {
        records: Records,
        done: IOFlushed<TypeConfig>,
    },
    /// Anything else that changes the files (truncate, purge) or must see
    /// every append before it (the log's state): run on the locked log.
    Run(LogFn),
}

/// Work on the locked log (or why it cannot be locked).
type LogFn = Box<dyn FnOnce(Result<&mut Log, StorageError>) + Send>;

#[derive(Clone)]
pub struct LogStore {
    log: Arc<Mutex<Log>>,
    tail: Arc<parking_lot::Mutex<Tail>>,
    dir: PathBuf,
    db: sled::Db,
    meta: sled::Tree,
    writer: mpsc::Sender<Job>,
    failed: Failed,
    /// sled's file, for `fdatasync` after its flush (vote saves).
    sled_file: Arc<SegFile>,
}

impl LogStore {
    /// The log in `log_dir`, in segments of about `segment_bytes`; the vote
    /// in sled (`db`, opened in `db_dir`).
    pub fn open(
        db: &sled::Db, db_dir: &Path, log_dir: &Path, segment_bytes: u64,
    ) -> anyhow::Result<Self> {
        let log = Arc::new(Mutex::new(Log::open(log_dir, segment_bytes)?));
        let tail = Arc::new(parking_lot::Mutex::new(Tail::default()));
        let (tx, rx) = mpsc::channel::<Job>();
        let failed = Failed::default();
        let writer = Writer {
            log: log.clone(),
            tail: tail.clone(),
            dir: log_dir.to_path_buf(),
            failed: failed.clone(),
        };
        std::thread::Builder::new()
            .name("raft-log-write".into())
            .spawn(move || writer.run(rx))?;
        let sled_path = db_dir.join("db");
        let sled_file = OpenOptions::new()
            .write(true)
            .open(&sled_path)
            .map_err(|e| DiskError::io("open", &sled_path, e))?;
        Ok(LogStore {
            log,
            tail,
            dir: log_dir.to_path_buf(),
            db: db.clone(),
            meta: db.open_tree("raft_meta")?,
            writer: tx,
            failed,
            sled_file: Arc::new(SegFile {
                path: sled_path,
                file: sled_file,
            }),
        })
    }

    /// Reads the locked log on a blocking thread, never on an async worker:
    /// the lock may wait behind a segment roll's fsyncs, and a read of 4 MiB
    /// is file I/O. On 2 cores, a worker stuck there is half the runtime,
    /// and heartbeats starve into elections.
    async fn with_log<T, F>(&self, f: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Log) -> Result<T, DiskError> + Send + 'static,
    {
        let (log, dir, failed) = (self.log.clone(), self.dir.clone(), self.failed.clone());
        tokio::task::spawn_blocking(move || {
            let mut guard = lock_log(&log, &dir, &failed)?;
            Ok(f(&mut guard)?)
        })
        .await
        // A panic in `f` poisoned the lock: later calls report it.
        .map_err(|e| io_err(&format!("raft log in {}", self.dir.display()), e))?
    }

    /// Runs `f` on the locked log on the writer thread, after every append
    /// sent before it.
    async fn in_order<T, F>(&self, f: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Log) -> Result<T, DiskError> + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job = Job::Run(Box::new(move |log| {
            let _ = tx.send(log.and_then(|log| Ok(f(log)?)));
        }));
        self.writer.send(job).map_err(|_| writer_gone())?;
        rx.await.map_err(|_| writer_gone())?
    }

    /// The entries from `start` before `end` within `budget` bytes (the
    /// first always): the newest from the tail, older ones from the files.
    async fn read(
        &self, start: u64, end: Bound<u64>, budget: usize,
    ) -> Result<Vec<Entry>, StorageError> {
        if let Some(why) = self.failed.get() {
            return Err(io::Error::other(why.clone()));
        }
        let mut out: Vec<Entry> = Vec::new();
        let mut used = 0usize;
        let mut next = start;
        loop {
            let left = budget.saturating_sub(used);
            let tail_from = {
                let tail = self.tail.lock();
                if let Some(more) = tail.read(next, end, left, out.is_empty()) {
                    out.extend(more);
                    return Ok(out);
                }
                tail.first_index()
            };
            // Before the tail: the files, up to where the tail starts.
            let upto = match (tail_from, end) {
                (Some(f), Bound::Included(e)) if e < f => end,
                (Some(f), Bound::Excluded(e)) if e <= f => end,
                (Some(f), _) => Bound::Excluded(f),
                (None, _) => end,
            };
            let first_free = out.is_empty();
            let (more, n, full) = self
                .with_log(move |log| log.read_upto((Bound::Included(next), upto), left, first_free))
                .await?;
            used += n;
            out.extend(more);
            // Done unless the files gave everything before the tail: then
            // the tail (or, had it moved on meanwhile, the files again).
            match tail_from {
                Some(f) if !full && before(end, f) => next = next.max(f),
                _ => return Ok(out),
            }
        }
    }

    /// Makes the vote durable, off the async threads.
    async fn sync_sled(&self) -> Result<(), DiskError> {
        let db_dir = self.sled_file.path.parent().unwrap_or(Path::new("."));
        self.db
            .flush_async()
            .await
            .map_err(|e| DiskError::io("flush of sled in", db_dir, e.into()))?;
        let file = self.sled_file.clone();
        tokio::task::spawn_blocking(move || file.file.sync_data().map_err(|e| file.err("fsync", e)))
            .await
            .map_err(|e| DiskError::io("fsync", &self.sled_file.path, io::Error::other(e)))?
    }
}

fn writer_gone() -> StorageError {
    io_err("raft log", "the writer thread stopped")
}

/// The thread that writes the log: jobs in the order sent, every append
/// written with one `pwrite`, then (group commit) one `fdatasync` per file
/// for every append the batch of jobs held, and only then their callbacks.
struct Writer {
    log: Arc<Mutex<Log>>,
    tail: Arc<parking_lot::Mutex<Tail>>,
    dir: PathBuf,
    failed: Failed,
}

impl Writer {
    fn run(self, rx: mpsc::Receiver<Job>) {
        while let Ok(first) = rx.recv() {
            let mut waiting: Vec<Waiting> = Vec::new();
            for job in std::iter::once(first).chain(rx.try_iter()) {
                match job {
                    Job::Append { records, done } => {
                        let ids: Vec<LogId> = records.placed.iter().map(|p| p.0).collect();
                        let written = lock_log(&self.log, &self.dir, &self.failed)
                            .and_then(|mut log| Ok(log.write(records)?));
                        match written {
                            Ok(file) => {
                                self.tail.lock().written(ids.into_iter());
                                waiting.push((file, done));
                            }
                            Err(e) => {
                                // The files may now disagree with the index.
                                let _ = self.failed.set(e.to_string());
                                done.io_completed(Err(e));
                            }
                        }
                    }
                    Job::Run(f) => match lock_log(&self.log, &self.dir, &self.failed) {
                        Ok(mut log) => f(Ok(&mut log)),
                        Err(e) => f(Err(e)),
                    },
                }
            }
            if !waiting.is_empty() {
                sync_and_complete(waiting, &self.failed);
            }
        }
    }
}

/// The log, unless a failed fsync or a panic while it was held (its index
/// may disagree with the files) made it unusable.
fn lock_log<'a>(
    log: &'a Mutex<Log>, dir: &Path, failed: &Failed,
) -> Result<MutexGuard<'a, Log>, StorageError> {
    if let Some(why) = failed.get() {
        return Err(io::Error::other(why.clone()));
    }
    log.lock().map_err(|_| {
        DiskError::Poisoned {
            dir: dir.to_path_buf(),
        }
        .into()
    })
}

/// Group commit: every callback waiting shares one `fdatasync` per file.
fn sync_and_complete(waiting: Vec<Waiting>, failed: &Failed) {
    let mut files: Vec<Arc<SegFile>> = Vec::new();
    for (f, _) in &waiting {
        if !files.iter().any(|g| Arc::ptr_eq(f, g)) {
            files.push(f.clone());
        }
    }
    let result = match failed.get() {
        Some(why) => Err(why.clone()),
        None => files.iter().try_for_each(|f| {
            f.file.sync_data().map_err(|e| {
                let why = f.err("fsync", e).to_string();
                let _ = failed.set(why.clone());
                why
            })
        }),
    };
    crate::metrics::LOG_FSYNCS.inc();
    crate::metrics::LOG_FSYNC_BATCH.add(waiting.len() as u64);
    for (_, cb) in waiting {
        cb.io_completed(result.clone().map_err(io::Error::other));
    }
}

fn bounds<RB: RangeBounds<u64>>(range: &RB) -> (Bound<u64>, Bound<u64>) {
    (range.start_bound().cloned(), range.end_bound().cloned())
}

fn start_of(start: Bound<u64>) -> u64 {
    match start {
        Bound::Included(s) => s,
        Bound::Excluded(s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self, range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let (start, end) = bounds(&range);
        self.read(start_of(start), end, usize::MAX).await
    }

    /// What replication sends in one AppendEntries: bounded by bytes as
    /// well as by openraft's entry count, so a run of large entries goes
    /// in several requests instead of one frame no follower would take.
    async fn limited_get_log_entries(
        &mut self, start: u64, end: u64,
    ) -> Result<Vec<Entry>, StorageError> {
        self.read(start, Bound::Excluded(end), super::network::APPEND_BYTES)
            .await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        match self
            .meta
            .get(VOTE)
            .map_err(|e| io_err("reading the vote", e))?
        {
            Some(v) => Ok(Some(
                bincode::deserialize(&v).map_err(|e| io_err("decoding the vote", e))?,
            )),
            None => Ok(None),
        }
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        // On the writer thread, after every append sent before it.
        self.in_order(|log| {
            Ok(LogState {
                last_purged_log_id: log.purged,
                last_log_id: log.last(),
            })
        })
        .await
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let bytes = bincode::serialize(vote).expect("a vote encodes");
        self.meta
            .insert(VOTE, bytes)
            .map_err(|e| io_err("saving the vote", e))?;
        Ok(self.sync_sled().await?)
    }

    // `save_committed` is left out (openraft's default keeps nothing): the
    // state machine's applied id, persisted with its rows, tells a restart
    // where to resume, and a committed id persisted apart from the log could
    // point past what the log made durable.

    /// Encodes the entries, puts them in the tail (readable from now on)
    /// and hands them to the writer thread: no file I/O and no wait for a
    /// thread here. The writer writes them (a segment roll with its fsyncs
    /// included) and reports them durable after its `fdatasync`.
    async fn append<I: Entries>(
        &mut self, entries: I, callback: IOFlushed<TypeConfig>,
    ) -> Result<(), StorageError> {
        if let Some(why) = self.failed.get() {
            return Err(io::Error::other(why.clone()));
        }
        let entries: Vec<Entry> = entries.into_iter().collect();
        let records = Records::encode(&entries);
        let sizes: Vec<usize> = records.placed.iter().map(|p| p.2).collect();
        self.tail.lock().push(entries, sizes.into_iter());
        self.writer
            .send(Job::Append {
                records,
                done: callback,
            })
            .map_err(|_| writer_gone())
    }

    async fn truncate_after(&mut self, last: Option<LogId>) -> Result<(), StorageError> {
        self.tail.lock().truncate_from(next_index(last.as_ref()));
        self.in_order(move |log| log.truncate_after(last)).await
    }

    async fn purge(&mut self, upto: LogId) -> Result<(), StorageError> {
        self.tail.lock().purge(upto.index);
        self.in_order(move |log| log.purge(upto)).await
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

    fn big(term: u64, index: u64) -> Entry {
        Entry {
            log_id: id(term, index),
            payload: EntryPayload::Normal(
                crate::state::Command::Kv(crate::structs::KvOp {
                    verb: crate::structs::KvVerb::Set,
                    key: format!("k{index}"),
                    value: vec![b'v'; 2000],
                    flags: 0,
                    index: 0,
                    session: String::new(),
                })
                .into(),
            ),
        }
    }

    fn segment_paths(dir: &Path) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        v.sort();
        v
    }

    /// XORs one byte of a file.
    fn flip(path: &Path, at: u64) {
        let mut bytes = fs::read(path).unwrap();
        bytes[at as usize] ^= 0x5a;
        fs::write(path, bytes).unwrap();
    }

    #[test]
    fn reopens_with_what_was_written_and_cuts_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), SEGMENT_BYTES).unwrap();
        log.append((1..=3).map(|i| entry(1, i)).collect()).unwrap();
        let seg = log.current().1.file.path.clone();
        drop(log);
        // Half a record at the end, as a crash mid-write leaves it.
        let mut f = OpenOptions::new().append(true).open(&seg).unwrap();
        std::io::Write::write_all(&mut f, &[9, 0, 0, 0, 1, 2]).unwrap();
        let mut log = Log::open(dir.path(), SEGMENT_BYTES).unwrap();
        assert_eq!(indexes(&log), vec![1, 2, 3]);
        assert_eq!(log.last(), Some(id(1, 3)));
        log.append(vec![entry(2, 4)]).unwrap();
        drop(log);
        let log = Log::open(dir.path(), SEGMENT_BYTES).unwrap();
        assert_eq!(indexes(&log), vec![1, 2, 3, 4]);
    }

    #[test]
    fn sectors_of_zeros_in_the_last_record_are_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), SEGMENT_BYTES).unwrap();
        log.append((1..=3).map(|i| big(1, i)).collect()).unwrap();
        let (seg, pos) = (log.current().1.file.path.clone(), log.entries[&3].1);
        drop(log);
        // The crash left the record's length on disk, not all its sectors.
        let f = OpenOptions::new().write(true).open(&seg).unwrap();
        let sector = pos.offset.div_ceil(SECTOR as u64) * SECTOR as u64;
        f.write_all_at(&[0; SECTOR], sector).unwrap();
        let log = Log::open(dir.path(), SEGMENT_BYTES).unwrap();
        assert_eq!(indexes(&log), vec![1, 2]);
        assert_eq!(fs::metadata(&seg).unwrap().len(), pos.offset);
    }

    #[test]
    fn a_changed_byte_in_the_last_segment_is_not_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), SEGMENT_BYTES).unwrap();
        log.append((1..=3).map(|i| big(1, i)).collect()).unwrap();
        let (seg, pos) = (log.current().1.file.path.clone(), log.entries[&2].1);
        drop(log);
        flip(&seg, pos.offset + 100);
        let bytes = fs::metadata(&seg).unwrap().len();
        match Log::open(dir.path(), SEGMENT_BYTES) {
            Err(DiskError::Corrupt { path, offset, .. }) => {
                assert_eq!((path, offset), (seg.clone(), pos.offset));
            }
            other => panic!("opened: {:?}", other.map(|l| indexes(&l))),
        }
        // Nothing was cut.
        assert_eq!(fs::metadata(&seg).unwrap().len(), bytes);
    }

    #[test]
    fn a_changed_length_in_the_last_segment_is_not_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), SEGMENT_BYTES).unwrap();
        log.append((1..=4).map(|i| big(1, i)).collect()).unwrap();
        let (seg, pos) = (log.current().1.file.path.clone(), log.entries[&2].1);
        drop(log);
        // Entry 2's length now runs past the end of the file, as a write
        // cut short would; entries 3 and 4 after it say otherwise.
        flip(&seg, pos.offset + 2);
        match Log::open(dir.path(), SEGMENT_BYTES) {
            Err(DiskError::Corrupt { offset, .. }) => assert_eq!(offset, pos.offset),
            other => panic!("opened: {:?}", other.map(|l| indexes(&l))),
        }
    }

    #[test]
    fn damage_in_an_earlier_segment_refuses_to_open_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), 5000).unwrap();
        for i in 1..=12 {
            log.append(vec![big(1, i)]).unwrap();
        }
        drop(log);
        let segs = segment_paths(dir.path());
        assert!(segs.len() >= 3, "{segs:?}");
        let sizes: Vec<u64> = segs
            .iter()
            .map(|p| fs::metadata(p).unwrap().len())
            .collect();
        flip(&segs[0], sizes[0] / 2);
        let err = Log::open(dir.path(), 5000).err().expect("refused");
        assert!(
            matches!(&err, DiskError::Corrupt { path, .. } if *path == segs[0]),
            "{err}"
        );
        assert!(err.to_string().contains(&segs[0].display().to_string()));
        assert_eq!(segment_paths(dir.path()), segs);
        let after: Vec<u64> = segs
            .iter()
            .map(|p| fs::metadata(p).unwrap().len())
            .collect();
        assert_eq!(after, sizes);

        // A tail cut short is damage too when a segment follows it.
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), 5000).unwrap();
        for i in 1..=6 {
            log.append(vec![big(1, i)]).unwrap();
        }
        drop(log);
        let segs = segment_paths(dir.path());
        let len = fs::metadata(&segs[0]).unwrap().len();
        OpenOptions::new()
            .write(true)
            .open(&segs[0])
            .unwrap()
            .set_len(len - 10)
            .unwrap();
        assert!(matches!(
            Log::open(dir.path(), 5000),
            Err(DiskError::Corrupt { .. })
        ));
    }

    #[test]
    fn an_unknown_format_version_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), SEGMENT_BYTES).unwrap();
        log.append(vec![entry(1, 1)]).unwrap();
        let seg = log.current().1.file.path.clone();
        drop(log);
        let f = OpenOptions::new().write(true).open(&seg).unwrap();
        f.write_all_at(&7u32.to_le_bytes(), MAGIC.len() as u64)
            .unwrap();
        let err = Log::open(dir.path(), SEGMENT_BYTES).err().expect("refused");
        assert!(
            matches!(&err, DiskError::Version { path, found: 7, expected: LOG_FORMAT } if *path == seg),
            "{err}"
        );
        f.write_all_at(b"NOTALOG!", 0).unwrap();
        assert!(matches!(
            Log::open(dir.path(), SEGMENT_BYTES),
            Err(DiskError::Magic { .. })
        ));
    }

    #[test]
    fn a_last_segment_torn_at_creation_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), SEGMENT_BYTES).unwrap();
        log.append((1..=2).map(|i| entry(1, i)).collect()).unwrap();
        drop(log);
        let torn = dir.path().join(format!("log-{:020}.seg", 3));
        fs::write(&torn, &MAGIC[..5]).unwrap();
        let log = Log::open(dir.path(), SEGMENT_BYTES).unwrap();
        assert_eq!(indexes(&log), vec![1, 2]);
        assert!(!torn.exists());
    }

    /// A log store with its vote db in `dir/db` and its segments in
    /// `dir/log`.
    fn store_in(dir: &Path) -> LogStore {
        let db = sled::open(dir.join("db")).unwrap();
        LogStore::open(&db, &dir.join("db"), &dir.join("log"), SEGMENT_BYTES).unwrap()
    }

    #[tokio::test]
    async fn a_poisoned_log_is_an_error_naming_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = store_in(dir.path());
        let log = store.log.clone();
        let _ = std::thread::spawn(move || {
            let _held = log.lock().unwrap();
            panic!("a writer panics holding the log");
        })
        .join();
        let e = store.try_get_log_entries(0..1).await.unwrap_err();
        let want = dir.path().join("log").display().to_string();
        assert!(
            e.to_string().contains("poisoned") && e.to_string().contains(&want),
            "{e}"
        );
        assert!(store.get_log_state().await.is_err());
    }

    #[tokio::test]
    async fn a_failed_fsync_fails_every_append_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = store_in(dir.path());
        // fsync of a pipe fails (EINVAL): a disk that refuses a sync.
        let (r, _w) = std::io::pipe().unwrap();
        let bad = Arc::new(SegFile {
            path: PathBuf::from("/pipe"),
            file: File::from(std::os::fd::OwnedFd::from(r)),
        });
        sync_and_complete(vec![(bad, IOFlushed::noop())], &store.failed);
        let why = store.failed.get().expect("recorded");
        assert!(why.starts_with("fsync /pipe:"), "{why}");
        // The store's own writer thread had no part in the sync above: the
        // latch is what every later append checks.
        let e = store
            .append(vec![entry(1, 1)], IOFlushed::noop())
            .await
            .unwrap_err();
        assert!(e.to_string().starts_with("fsync /pipe:"), "{e}");
    }

    #[test]
    fn truncate_and_purge_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), SEGMENT_BYTES).unwrap();
        log.append((1..=5).map(|i| entry(1, i)).collect()).unwrap();
        log.truncate_after(Some(id(1, 3))).unwrap();
        log.append(vec![entry(2, 4)]).unwrap();
        log.purge(id(1, 2)).unwrap();
        assert_eq!(indexes(&log), vec![3, 4]);
        drop(log);
        let log = Log::open(dir.path(), SEGMENT_BYTES).unwrap();
        // The purge deleted no segment: the entries it hid are back, which
        // a purge allows (it is lazy).
        assert_eq!(log.last(), Some(id(2, 4)));
        assert_eq!(indexes(&log), vec![1, 2, 3, 4]);
    }

    #[test]
    fn a_purge_past_the_end_starts_the_log_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), SEGMENT_BYTES).unwrap();
        log.append((1..=3).map(|i| entry(1, i)).collect()).unwrap();
        log.purge(id(3, 10)).unwrap();
        assert_eq!(log.last(), Some(id(3, 10)));
        log.append(vec![entry(3, 11)]).unwrap();
        drop(log);
        let log = Log::open(dir.path(), SEGMENT_BYTES).unwrap();
        assert_eq!(log.purged, Some(id(3, 10)));
        assert_eq!(indexes(&log), vec![11]);
        assert_eq!(log.segments.len(), 1);
    }

    /// Appends `entries` and waits until the writer reports them durable.
    async fn append_durably(store: &mut LogStore, entries: Vec<Entry>) {
        use openraft::type_config::async_runtime::oneshot::Oneshot;
        type Rt = <TypeConfig as openraft::RaftTypeConfig>::AsyncRuntime;
        let (tx, rx) = <Rt as openraft::AsyncRuntime>::Oneshot::channel();
        store.append(entries, IOFlushed::signal(tx)).await.unwrap();
        rx.await.unwrap().unwrap();
    }

    fn ids(entries: &[Entry]) -> Vec<u64> {
        entries.iter().map(|e| e.log_id.index).collect()
    }

    #[tokio::test]
    async fn reads_span_the_files_and_the_tail_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = store_in(dir.path());
        // ~2 KiB records: 4,000 of them are twice the tail's budget, so
        // the oldest are read back from the files.
        let n = 2 * TAIL_BYTES as u64 / 2000;
        append_durably(&mut store, (1..=n).map(|i| big(1, i)).collect()).await;
        let first_cached = store.tail.lock().first_index().unwrap();
        assert!(first_cached > 1 && first_cached < n, "{first_cached}");
        let all = store.try_get_log_entries(1..=n).await.unwrap();
        assert_eq!(ids(&all), (1..=n).collect::<Vec<_>>());
        let across = store
            .try_get_log_entries(first_cached - 2..first_cached + 2)
            .await
            .unwrap();
        assert_eq!(
            ids(&across),
            (first_cached - 2..first_cached + 2).collect::<Vec<_>>()
        );
        // Past the end: nothing.
        assert!(
            store
                .try_get_log_entries(n + 1..n + 5)
                .await
                .unwrap()
                .is_empty()
        );
        // The byte budget of one AppendEntries holds across the two.
        let limited = store
            .limited_get_log_entries(first_cached - 10, n + 1)
            .await
            .unwrap();
        let bytes: u64 = limited
            .iter()
            .map(|e| bincode::serialized_size(e).unwrap() + RECORD_HEADER as u64)
            .sum();
        assert!(
            bytes <= super::super::network::APPEND_BYTES as u64,
            "{bytes}"
        );
        assert_eq!(limited[0].log_id.index, first_cached - 10);
        assert!(limited.len() > 10, "{}", limited.len());
        assert_eq!(
            ids(&limited),
            (first_cached - 10..first_cached - 10 + limited.len() as u64).collect::<Vec<_>>()
        );
    }

    #[tokio::test]
    async fn an_append_is_readable_when_it_returns_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = store_in(dir.path());
        append_durably(&mut store, (1..=3).map(|i| entry(1, i)).collect()).await;
        // Not waited for: readable at once all the same.
        store
            .append((4..=6).map(|i| entry(1, i)), IOFlushed::noop())
            .await
            .unwrap();
        assert_eq!(
            ids(&store.try_get_log_entries(1..7).await.unwrap()),
            vec![1, 2, 3, 4, 5, 6]
        );
        // Overwritten after a truncate: the new term's entries, not the old.
        store.truncate_after(Some(id(1, 4))).await.unwrap();
        append_durably(&mut store, vec![entry(2, 5)]).await;
        let got = store.try_get_log_entries(1..10).await.unwrap();
        assert_eq!(
            got.iter().map(|e| e.log_id).collect::<Vec<_>>(),
            vec![id(1, 1), id(1, 2), id(1, 3), id(1, 4), id(2, 5)]
        );
        assert_eq!(
            store.get_log_state().await.unwrap().last_log_id,
            Some(id(2, 5))
        );
        store.purge(id(1, 2)).await.unwrap();
        assert_eq!(
            ids(&store.try_get_log_entries(..).await.unwrap()),
            vec![3, 4, 5]
        );
        drop(store);
        let log = Log::open(&dir.path().join("log"), SEGMENT_BYTES).unwrap();
        assert_eq!(log.last(), Some(id(2, 5)));
    }

    #[test]
    fn the_tail_keeps_every_entry_not_yet_written() {
        let mut tail = Tail::default();
        let n = 2 * TAIL_BYTES as u64 / 1000;
        tail.push(
            (1..=n).map(|i| entry(1, i)).collect(),
            std::iter::repeat(1000),
        );
        // Nothing written: nothing may leave, whatever the budget.
        tail.written(std::iter::empty());
        assert_eq!(tail.first_index(), Some(1));
        // Written: the oldest leave down to the budget.
        tail.written((1..=n).map(|i| id(1, i)));
        assert_eq!(tail.entries.len() as u64, TAIL_BYTES as u64 / 1000);
        assert_eq!(tail.last_id(), Some(id(1, n)));
        assert!(tail.read(1, Bound::Unbounded, usize::MAX, true).is_none());
    }
}
