//! `cairn snapshot save|restore|inspect FILE`, as `consul snapshot`: save
//! the whole state of the cluster to a file, restore one, and show what a
//! file holds (offline). Reading a file's tables is the Raft and state
//! layers' business (above this one): the binary hands it in (`Inspect`).

use std::path::PathBuf;

use clap::Subcommand;

use super::{CliError, CliResult, Client, table};

#[derive(Subcommand, Debug)]
pub enum SnapshotCmd {
    /// Save a point-in-time snapshot of the whole state to FILE.
    Save {
        file: PathBuf,
        /// Let any server answer (not only the leader).
        #[arg(long)]
        stale: bool,
    },
    /// Restore the cluster's state from FILE (every server ends with it).
    Restore { file: PathBuf },
    /// Show what a snapshot FILE holds: index, term, rows per table, size.
    Inspect { file: PathBuf },
}

/// What `inspect` shows of a snapshot file.
pub struct Inspection {
    pub index: u64,
    pub term: u64,
    /// (table, rows), in the order to print.
    pub tables: Vec<(&'static str, usize)>,
}

/// Checks a snapshot file whole and reads its tables.
pub type Inspect = fn(&[u8]) -> Result<Inspection, String>;

pub fn run(c: &Client, cmd: SnapshotCmd, inspect: Inspect) -> CliResult {
    match cmd {
        SnapshotCmd::Save { file, stale } => {
            let path = if stale {
                "/v1/snapshot?stale"
            } else {
                "/v1/snapshot"
            };
            let (status, bytes) = c.send_bytes(reqwest::Method::GET, path, None)?;
            if status != 200 {
                return Err(unexpected(status, &bytes));
            }
            // Checked before it is kept: a file that would not restore is
            // no backup.
            let info = inspect(&bytes).map_err(|e| CliError(format!("Invalid snapshot: {e}")))?;
            crate::disk::write_atomic_parts(&file, &[&bytes])?;
            println!("Saved and verified snapshot to index {}", info.index);
            Ok(())
        }
        SnapshotCmd::Restore { file } => {
            let bytes = read(&file)?;
            let (status, body) = c.send_bytes(reqwest::Method::PUT, "/v1/snapshot", Some(bytes))?;
            if status != 200 {
                return Err(unexpected(status, &body));
            }
            println!("Restored snapshot");
            Ok(())
        }
        SnapshotCmd::Inspect { file } => {
            let bytes = read(&file)?;
            let info = inspect(&bytes)
                .map_err(|e| CliError(format!("Error inspecting {}: {e}", file.display())))?;
            let mut rows = vec![
                vec!["Index".to_string(), info.index.to_string()],
                vec!["Term".to_string(), info.term.to_string()],
                vec!["Size".to_string(), bytes.len().to_string()],
            ];
            print!("{}", table(&rows));
            println!();
            rows = vec![vec!["Table".to_string(), "Rows".to_string()]];
            rows.extend(
                info.tables
                    .iter()
                    .map(|(t, n)| vec![t.to_string(), n.to_string()]),
            );
            print!("{}", table(&rows));
            Ok(())
        }
    }
}

fn read(file: &std::path::Path) -> Result<Vec<u8>, CliError> {
    std::fs::read(file).map_err(|e| CliError(format!("Error reading {}: {e}", file.display())))
}

fn unexpected(status: u16, body: &[u8]) -> CliError {
    CliError(format!(
        "Unexpected response code: {status} ({})",
        String::from_utf8_lossy(body).trim()
    ))
}
