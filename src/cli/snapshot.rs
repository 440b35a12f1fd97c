//! `cairn snapshot save|restore|inspect|decode FILE`, as `consul
//! snapshot`: save the whole state of the cluster to a file, restore one,
//! and show what a file holds, or print its every row (offline). Reading
//! a file's tables is the Raft and state layers' business (above this
//! one): the binary hands it in (`Readers`).

use std::io::Write;
use std::path::PathBuf;

use clap::Subcommand;

use super::{CliError, CliResult, Client, table, unexpected};

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
    /// Print a snapshot FILE as JSON lines: `{"Type": "SnapshotHeader",
    /// "Data": ...}`, then a `{"Type", "Data"}` line per row.
    Decode { file: PathBuf },
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

/// Hands each record of a snapshot file (type, JSON) to the callback.
pub type Decode = fn(&[u8], &mut dyn FnMut(&str, serde_json::Value)) -> Result<(), String>;

/// How the binary reads snapshot files for this layer.
#[derive(Clone, Copy)]
pub struct Readers {
    pub inspect: Inspect,
    pub decode: Decode,
}

pub fn run(c: &Client, cmd: SnapshotCmd, readers: Readers) -> CliResult {
    let inspect = readers.inspect;
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
        SnapshotCmd::Decode { file } => {
            let bytes = read(&file)?;
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            let mut failed = None;
            (readers.decode)(&bytes, &mut |kind, data| {
                let line = serde_json::json!({"Type": kind, "Data": data});
                if failed.is_none()
                    && let Err(e) = writeln!(out, "{line}")
                {
                    failed = Some(e);
                }
            })
            .map_err(|e| CliError(format!("Error extracting snapshot data: {e}")))?;
            if let Some(e) = failed {
                return Err(CliError(format!("Error writing the records: {e}")));
            }
            out.flush()?;
            Ok(())
        }
    }
}

fn read(file: &std::path::Path) -> Result<Vec<u8>, CliError> {
    std::fs::read(file).map_err(|e| CliError(format!("Error reading {}: {e}", file.display())))
}
