//! What the Raft log, the snapshot file and the sled state share on disk:
//! format versions, the errors that refuse a start or stop the process,
//! atomic file replacement, and the snapshot framing (`snapshot_frame`:
//! magic, version, lengths, crc32).

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Format version of Raft log segments (their records are bincode of
/// `Entry` under it). Bump it on any change to how entries or commands
/// encode. 3: ACL commands and `Command::CaSet`.
pub const LOG_FORMAT: u32 = 3;
/// Format version of the snapshot file (also what `GET /v1/snapshot`
/// answers and `PUT /v1/snapshot` accepts). 3: the ACL tables and the
/// Connect CA.
pub const SNAPSHOT_FORMAT: u32 = 3;
/// Format version of the state rows in sled. 2: staged snapshot restores
/// among the rows. 3: keys of two names are length-prefixed
/// (`state::pair_key`), no longer joined by NUL or `/`. 4: ACL rows (an
/// older binary would ignore them and serve without its tokens), the
/// Connect CA row and `service-intentions` entries. Nothing migrates:
/// a data dir of another version refuses to start.
pub const STATE_FORMAT: u32 = 4;

/// A storage failure, always naming the file and what was being done.
///
/// At start these refuse to start the server; while running, Raft cannot
/// continue past any of them and the server stops (see `process::ServerProcess::run`).
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{} is corrupt at offset {offset}: {reason} (not a torn tail of the last log segment: nothing is cut or guessed; restore this server's data dir or replace the server)",
        path.display()
    )]
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error(
        "{} has format version {found}; this cairn reads version {expected} (written by another cairn version?)",
        path.display()
    )]
    Version {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    #[error("{} is not a cairn {what} file (bad magic)", path.display())]
    Magic { path: PathBuf, what: &'static str },
    #[error("raft log in {}: lock poisoned (a thread panicked while writing it)", dir.display())]
    Poisoned { dir: PathBuf },
}

impl DiskError {
    pub fn io(op: &'static str, path: &Path, source: io::Error) -> Self {
        DiskError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

impl From<DiskError> for io::Error {
    fn from(e: DiskError) -> io::Error {
        let kind = match &e {
            DiskError::Io { source, .. } => source.kind(),
            _ => io::ErrorKind::InvalidData,
        };
        io::Error::new(kind, e.to_string())
    }
}

/// Makes a directory's entries (created, renamed, removed files) durable.
pub fn sync_dir(dir: &Path) -> Result<(), DiskError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| DiskError::io("fsync of directory", dir, e))
}

/// Replaces `path` with the concatenation of `parts` so that a crash
/// leaves the old file or the new one, whole: written to a temp name,
/// fsync'd, renamed over, and the directory fsync'd (the rename itself is
/// durable only after that).
pub fn write_atomic_parts(path: &Path, parts: &[&[u8]]) -> Result<(), DiskError> {
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp).map_err(|e| DiskError::io("create", &tmp, e))?;
    for part in parts {
        f.write_all(part)
            .map_err(|e| DiskError::io("write", &tmp, e))?;
    }
    f.sync_all().map_err(|e| DiskError::io("fsync", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| DiskError::io("rename onto", path, e))?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// A snapshot's framing, shared by the snapshot file in a data dir and the
/// files `cairn snapshot save` writes: `CAIRNSNP`, format version u32,
/// meta length u32, data length u64, crc32 of meta and data (u32), then
/// the meta and the data. What meta and data hold is the Raft layer's.
pub mod snapshot_frame {
    use std::path::Path;

    use super::{DiskError, SNAPSHOT_FORMAT};

    const MAGIC: &[u8; 8] = b"CAIRNSNP";
    pub const HEADER: usize = 8 + 4 + 4 + 8 + 4;

    /// The header that goes before `meta` and `data`.
    pub fn head(meta: &[u8], data: &[u8]) -> Vec<u8> {
        let mut crc = crc32fast::Hasher::new();
        crc.update(meta);
        crc.update(data);
        head_of(meta.len(), data.len() as u64, crc.finalize())
    }

    /// The header of a snapshot written a part at a time: the lengths and
    /// the crc32 of meta and data, known once the data is written.
    pub fn head_of(meta_len: usize, data_len: u64, crc: u32) -> Vec<u8> {
        let mut head = Vec::with_capacity(HEADER);
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&SNAPSHOT_FORMAT.to_le_bytes());
        head.extend_from_slice(&(meta_len as u32).to_le_bytes());
        head.extend_from_slice(&data_len.to_le_bytes());
        head.extend_from_slice(&crc.to_le_bytes());
        head
    }

    /// What a header says.
    pub struct Header {
        pub meta_len: usize,
        pub data_len: u64,
        pub crc: u32,
    }

    impl Header {
        /// Where the data starts.
        pub fn data_at(&self) -> u64 {
            (HEADER as u64).saturating_add(self.meta_len as u64)
        }

        /// Refuses a file of `size` bytes that is not as long as this says.
        pub fn check_size(&self, path: &Path, size: u64) -> Result<(), DiskError> {
            let end = self.data_at().saturating_add(self.data_len);
            if size == end {
                return Ok(());
            }
            Err(corrupt(
                path,
                size,
                format!("{size} bytes where the header says {end}"),
            ))
        }
    }

    pub fn corrupt(path: &Path, offset: u64, reason: impl Into<String>) -> DiskError {
        DiskError::Corrupt {
            path: path.to_path_buf(),
            offset,
            reason: reason.into(),
        }
    }

    /// Reads a header (`path` names the file in errors).
    pub fn header(path: &Path, head: &[u8]) -> Result<Header, DiskError> {
        if head.len() < HEADER {
            return Err(corrupt(path, 0, "shorter than its header"));
        }
        if &head[..8] != MAGIC {
            return Err(DiskError::Magic {
                path: path.to_path_buf(),
                what: "snapshot",
            });
        }
        let u32_at = |at: usize| u32::from_le_bytes(head[at..at + 4].try_into().expect("4"));
        let version = u32_at(8);
        if version != SNAPSHOT_FORMAT {
            return Err(DiskError::Version {
                path: path.to_path_buf(),
                found: version,
                expected: SNAPSHOT_FORMAT,
            });
        }
        Ok(Header {
            meta_len: u32_at(12) as usize,
            data_len: u64::from_le_bytes(head[16..24].try_into().expect("8")),
            crc: u32_at(24),
        })
    }

    /// Checks a whole framed snapshot: its header, its length and its
    /// checksum; returns its meta and data.
    pub fn split<'a>(path: &Path, bytes: &'a [u8]) -> Result<(&'a [u8], &'a [u8]), DiskError> {
        let h = header(path, bytes)?;
        h.check_size(path, bytes.len() as u64)?;
        let (meta, data) = bytes[HEADER..].split_at(h.meta_len);
        let mut crc = crc32fast::Hasher::new();
        crc.update(meta);
        crc.update(data);
        if crc.finalize() != h.crc {
            return Err(corrupt(path, HEADER as u64, "checksum mismatch"));
        }
        Ok((meta, data))
    }
}
