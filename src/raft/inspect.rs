//! `cairn debug data-dir`: what a start on a data dir would find (the Raft
//! log's segments, the snapshot file, the state's format version), read
//! without changing anything.

use std::path::Path;

use crate::disk::{DiskError, STATE_FORMAT};

/// What a start on the data dir `dir` would find, without changing it:
/// the Raft log's segments, the snapshot file and the state's format
/// version, a line each; `false` if the start would refuse.
pub fn inspect_data_dir(dir: &Path) -> (Vec<String>, bool) {
    let (mut lines, mut ok) = super::log_store::inspect(&dir.join("raft-log"));
    let snaps = dir.join("snapshots");
    let snap = super::snapshot_file::path(&snaps);
    lines.push(match super::snapshot_file::open(&snaps) {
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
