//! The snapshot as one file, `snapshot.bin`, framed as
//! `disk::snapshot_frame` says, its meta bincode of openraft's
//! `SnapshotMeta` and its data `state::snapshot`'s encoding. Replaced
//! atomically: written whole under another name (a build's
//! `snapshot.tmp`, a received `incoming-*.tmp`), fsync'd, renamed over.
//! `GET /v1/snapshot` answers the same format, so a saved file and a data
//! dir's snapshot read alike.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{LogId, SnapshotMeta as Meta};
use crate::disk::DiskError;
use crate::disk::snapshot_frame::{self, HEADER, corrupt, header};

pub fn path(dir: &Path) -> PathBuf {
    dir.join("snapshot.bin")
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

/// A framed snapshot file whose data is read a chunk at a time.
pub struct SnapshotFile {
    pub(super) file: Arc<File>,
    path: PathBuf,
    /// Where its data starts, and how long it is.
    pub(super) at: u64,
    len: u64,
    /// Received and not installed: removed when dropped.
    temp: bool,
}

impl SnapshotFile {
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Its data, read from the start.
    pub fn reader(&self) -> impl Read + '_ {
        ReadAt {
            file: &self.file,
            pos: self.at,
            end: self.at + self.len,
        }
    }

    /// Makes it the saved snapshot of `dir`, durably (a received
    /// snapshot, ending at `id`); nothing if it is already, or if the
    /// saved one is newer.
    pub fn keep_in(&mut self, dir: &Path, id: &Option<LogId>) -> Result<(), DiskError> {
        if self.path == path(dir) {
            return Ok(());
        }
        if put_in_place(&self.path, dir, id)? {
            self.path = path(dir);
            self.temp = false;
        }
        Ok(())
    }
}

/// Renames `from` onto `dir`'s saved snapshot and syncs the directory,
/// unless the saved one ends past `id`: a server's own build and an
/// install from the leader may finish in either order, and the newer
/// must stay (the log may be purged up to it). Says whether it did.
fn put_in_place(from: &Path, dir: &Path, id: &Option<LogId>) -> Result<bool, DiskError> {
    static ONE_AT_A_TIME: parking_lot::Mutex<()> = parking_lot::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock();
    let to = path(dir);
    if load_meta(dir)
        .ok()
        .flatten()
        .is_some_and(|saved| saved.last_log_id > *id)
    {
        return Ok(false);
    }
    std::fs::rename(from, &to).map_err(|e| DiskError::io("rename onto", &to, e))?;
    crate::disk::sync_dir(dir)?;
    Ok(true)
}

impl Drop for SnapshotFile {
    fn drop(&mut self) {
        if self.temp {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Reads a file from `pos` to `end` (positioned reads: the file's
/// cursor is not shared).
struct ReadAt<'a> {
    file: &'a File,
    pos: u64,
    end: u64,
}

impl Read for ReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (buf.len() as u64).min(self.end - self.pos) as usize;
        if n == 0 {
            return Ok(0);
        }
        let got = self.file.read_at(&mut buf[..n], self.pos)?;
        if got == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        self.pos += got as u64;
        Ok(got)
    }
}

/// The saved snapshot, checked whole a chunk at a time; `None` if
/// there is none.
pub fn open(dir: &Path) -> Result<Option<(Meta, SnapshotFile)>, DiskError> {
    let path = path(dir);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(DiskError::io("open", &path, e)),
    };
    let size = file
        .metadata()
        .map_err(|e| DiskError::io("stat", &path, e))?
        .len();
    let mut head = [0u8; HEADER];
    file.read_exact_at(&mut head, 0)
        .map_err(|_| corrupt(&path, size, "shorter than its header"))?;
    let h = header(&path, &head)?;
    h.check_size(&path, size)?;
    let at = h.data_at();
    let mut crc = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut r = ReadAt {
        file: &file,
        pos: HEADER as u64,
        end: size,
    };
    loop {
        let n = r
            .read(&mut buf)
            .map_err(|e| DiskError::io("read", &path, e))?;
        if n == 0 {
            break;
        }
        crc.update(&buf[..n]);
    }
    if crc.finalize() != h.crc {
        return Err(corrupt(&path, HEADER as u64, "checksum mismatch"));
    }
    let mut meta = vec![0u8; h.meta_len];
    file.read_exact_at(&mut meta, HEADER as u64)
        .map_err(|e| DiskError::io("read", &path, e))?;
    let meta = decode_meta(&path, &meta)?;
    Ok(Some((
        meta,
        SnapshotFile {
            file: Arc::new(file),
            path,
            at,
            len: h.data_len,
            temp: false,
        },
    )))
}

/// Writes the saved snapshot atomically, its data written by `fill` as
/// it goes (never whole in memory); returns it.
pub fn save_with(
    dir: &Path, meta: &Meta, fill: &mut dyn FnMut(&mut dyn Write) -> std::io::Result<()>,
) -> Result<SnapshotFile, DiskError> {
    let path = path(dir);
    let tmp = path.with_extension("tmp");
    let meta_id = meta.last_log_id;
    let meta = bincode::serialize(meta).expect("snapshot meta encodes");
    let file = create_rw(&tmp)?;
    let mut w = Framing {
        file: &file,
        pos: 0,
        crc: crc32fast::Hasher::new(),
    };
    w.write_all(&[0u8; HEADER])
        .and_then(|()| {
            w.crc = crc32fast::Hasher::new();
            w.write_all(&meta)
        })
        .and_then(|()| fill(&mut w))
        .map_err(|e| DiskError::io("write", &tmp, e))?;
    let at = (HEADER + meta.len()) as u64;
    let len = w.pos - at;
    let head = snapshot_frame::head_of(meta.len(), len, w.crc.finalize());
    file.write_all_at(&head, 0)
        .map_err(|e| DiskError::io("write", &tmp, e))?;
    file.sync_all()
        .map_err(|e| DiskError::io("fsync", &tmp, e))?;
    let placed = put_in_place(&tmp, dir, &meta_id)?;
    Ok(SnapshotFile {
        file: Arc::new(file),
        path: if placed { path } else { tmp },
        at,
        len,
        temp: !placed,
    })
}

/// A new, empty file, to write and then read (a built or received
/// snapshot is sent or installed from the same handle).
fn create_rw(path: &Path) -> Result<File, DiskError> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(|e| DiskError::io("create", path, e))
}

/// Writes at the end of a file, summing what it writes.
struct Framing<'a> {
    file: &'a File,
    pos: u64,
    crc: crc32fast::Hasher,
}

impl Write for Framing<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write_at(buf, self.pos)?;
        self.crc.update(&buf[..n]);
        self.pos += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Received snapshots, not yet installed: one file each.
static RECEIVED: AtomicU64 = AtomicU64::new(0);

/// Removes received snapshots a stopped server left behind.
pub fn clear_incoming(dir: &Path) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_name().to_string_lossy().starts_with("incoming-") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// A snapshot being received into a file of the snapshot dir, framed
/// as the saved one so that installing it is a rename.
pub struct Incoming {
    file: Arc<File>,
    path: PathBuf,
    meta_len: usize,
    crc: crc32fast::Hasher,
    len: u64,
    done: bool,
}

impl Incoming {
    pub fn create(dir: &Path, meta: &Meta) -> Result<Self, DiskError> {
        let n = RECEIVED.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("incoming-{}-{n}.tmp", std::process::id()));
        let meta = bincode::serialize(meta).expect("snapshot meta encodes");
        let file = create_rw(&path)?;
        let mut start = vec![0u8; HEADER];
        start.extend_from_slice(&meta);
        file.write_all_at(&start, 0)
            .map_err(|e| DiskError::io("write", &path, e))?;
        let mut crc = crc32fast::Hasher::new();
        crc.update(&meta);
        Ok(Incoming {
            file: Arc::new(file),
            path,
            meta_len: meta.len(),
            crc,
            len: 0,
            done: false,
        })
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Counts `data` in and says where to write it.
    pub fn next_write(&mut self, data: &[u8]) -> (Arc<File>, u64) {
        let at = (HEADER + self.meta_len) as u64 + self.len;
        self.crc.update(data);
        self.len += data.len() as u64;
        (self.file.clone(), at)
    }

    /// Writes the header and makes the file durable.
    pub fn finish(mut self) -> Result<SnapshotFile, DiskError> {
        let head = snapshot_frame::head_of(self.meta_len, self.len, self.crc.clone().finalize());
        self.file
            .write_all_at(&head, 0)
            .map_err(|e| DiskError::io("write", &self.path, e))?;
        self.file
            .sync_all()
            .map_err(|e| DiskError::io("fsync", &self.path, e))?;
        self.done = true;
        Ok(SnapshotFile {
            file: self.file.clone(),
            path: self.path.clone(),
            at: (HEADER + self.meta_len) as u64,
            len: self.len,
            temp: true,
        })
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.path);
        }
    }
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

/// What a snapshot file holds: the index and term it was taken at, and
/// its rows per table (in the order to print).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contents {
    pub index: u64,
    pub term: u64,
    pub tables: Vec<(&'static str, usize)>,
}

/// Checks a framed snapshot whole (`cairn snapshot inspect`, and `save`
/// before it keeps a file): its index, term and rows per table.
pub fn inspect(bytes: &[u8]) -> Result<Contents, String> {
    let (meta, data) =
        from_bytes(std::path::Path::new("snapshot"), bytes).map_err(|e| match e {
            crate::disk::DiskError::Corrupt { offset, reason, .. } => {
                format!("damaged at offset {offset}: {reason}")
            }
            other => other.to_string(),
        })?;
    let (index, tables) = crate::state::snapshot::counts(data).map_err(|e| format!("{e:#}"))?;
    let term = meta.last_log_id.map(|l| l.leader_id.term).unwrap_or(0);
    Ok(Contents {
        index,
        term,
        tables,
    })
}

/// A framed snapshot as `consul snapshot decode` prints one: its header
/// (index, term, size), then each row as (record type, JSON).
pub fn decode(bytes: &[u8], each: &mut dyn FnMut(&str, serde_json::Value)) -> Result<(), String> {
    let (meta, data) =
        from_bytes(std::path::Path::new("snapshot"), bytes).map_err(|e| e.to_string())?;
    let (index, _) = crate::state::snapshot::counts(data).map_err(|e| format!("{e:#}"))?;
    let term = meta.last_log_id.map(|l| l.leader_id.term).unwrap_or(0);
    each(
        "SnapshotHeader",
        serde_json::json!({"Index": index, "Term": term, "Size": data.len()}),
    );
    crate::state::snapshot::decode_rows(data, each).map_err(|e| format!("{e:#}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;

    fn save(dir: &std::path::Path, meta: &Meta, data: &[u8]) {
        save_with(dir, meta, &mut |w| w.write_all(data)).unwrap();
    }

    /// The saved snapshot's meta and data, checked whole.
    fn load(dir: &std::path::Path) -> Result<(Meta, Vec<u8>), DiskError> {
        let (meta, file) = open(dir)?.expect("a saved snapshot");
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut file.reader(), &mut data).unwrap();
        Ok((meta, data))
    }

    #[test]
    fn a_snapshot_file_is_checked_whole() {
        let dir = tempfile::tempdir().unwrap();
        let meta = Meta::default();
        let data = vec![7u8; 10_000];
        save(dir.path(), &meta, &data);
        let (m, d) = load(dir.path()).unwrap();
        assert_eq!((m, d), (meta.clone(), data.clone()));
        assert!(!dir.path().join("snapshot.tmp").exists());

        let path = path(dir.path());
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[8], 5_000).unwrap();
        let e = load(dir.path()).unwrap_err();
        assert!(
            matches!(&e, DiskError::Corrupt { path: p, .. } if *p == path),
            "{e}"
        );

        // Saved again (a new file, renamed over), then cut short.
        save(dir.path(), &meta, &data);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(9_000)
            .unwrap();
        assert!(matches!(load(dir.path()), Err(DiskError::Corrupt { .. })));
    }
}
