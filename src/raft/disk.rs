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
/// Format version of the state rows in sled.
pub const STATE_FORMAT: u32 = 1;

/// A storage failure, always naming the file and what was being done.
///
/// At start these refuse to start the server; while running, Raft cannot
/// continue past any of them and the server stops (see `server::run`).
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

/// What a start on the data dir `dir` would find, without changing it:
/// the Raft log's segments, the snapshot file and the state's format
/// version, a line each; `false` if the start would refuse.
pub fn inspect_data_dir(dir: &Path) -> (Vec<String>, bool) {
    let (mut lines, mut ok) = super::log_store::inspect(&dir.join("raft-log"));
    let snaps = dir.join("snapshots");
    let snap = super::state_machine::snapshot_file::path(&snaps);
    lines.push(match super::state_machine::snapshot_file::load(&snaps) {
        Ok(None) => format!("{}: none", snap.display()),
        Ok(Some((meta, data))) => format!(
            "{}: ok: up to {:?}, {} bytes of state",
            snap.display(),
            meta.last_log_id.map(|l| l.index),
            data.len()
        ),
        Err(e) => {
            ok = false;
            format!("{}: REFUSED: {e}", snap.display())
        }
    });
    let db = dir.join("db");
    let state = if db.exists() {
        sled::Config::new()
            .path(&db)
            .open()
            .map_err(anyhow::Error::from)
            .and_then(|d| crate::state::SledBackend::format_in(&d, &db))
    } else {
        Ok(None)
    };
    lines.push(match state {
        Ok(None) => format!("{}: no state rows", db.display()),
        Ok(Some(STATE_FORMAT)) => format!("{}: ok: state format {STATE_FORMAT}", db.display()),
        Ok(Some(found)) => {
            ok = false;
            let e = DiskError::Version {
                path: db.clone(),
                found,
                expected: STATE_FORMAT,
            };
            format!("{}: REFUSED: {e}", db.display())
        }
        Err(e) => {
            ok = false;
            format!("{}: cannot read: {e:#}", db.display())
        }
    });
    (lines, ok)
}
