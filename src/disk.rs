//! What the Raft log, the snapshot file and the sled state share on disk:
//! format versions, the errors that refuse a start or stop the process,
//! and atomic file replacement.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Format version of Raft log segments (their records are bincode of
/// `Entry` under it). Bump it on any change to how entries or commands
/// encode.
pub const LOG_FORMAT: u32 = 1;
/// Format version of the snapshot file.
pub const SNAPSHOT_FORMAT: u32 = 1;
/// Format version of the state rows in sled. 2: keys of two names are
/// length-prefixed (`state::pair_key`), no longer joined by NUL or `/`.
/// Nothing migrates: a data dir of another version refuses to start.
pub const STATE_FORMAT: u32 = 2;

/// A storage failure, always naming the file and what was being done.
///
/// At start these refuse to start the server; while running, Raft cannot
/// continue past any of them and the server stops (see `http::run`).
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
