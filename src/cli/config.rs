//! `cairn config write|read|list|delete` and `cairn discovery-chain`.
//!
//! `config write` reads an entry as JSON or HCL (as `consul config write`
//! does; `-` reads standard input) and `PUT`s it to `/v1/config` as JSON:
//! the server takes Consul's CamelCase and snake_case keys alike, so the
//! CLI only converts HCL's syntax, never the keys. A refused entry prints
//! the server's reason and exits 1.

use std::io::Read;

use clap::{Args, Subcommand};
use serde_json::Value;

use super::{CliError, CliResult, Client, enc, print_json};
use crate::definition::parse_json_or_hcl;

#[derive(Subcommand, Debug)]
pub enum ConfigCmd {
    /// Create or update a config entry from a file (JSON or HCL; `-` for stdin).
    Write(WriteArgs),
    /// Print one config entry as JSON.
    Read(KindName),
    /// List the names of the config entries of a kind.
    List(KindOnly),
    /// Delete a config entry.
    Delete(KindName),
}

#[derive(Args, Debug)]
pub struct WriteArgs {
    /// The entry's file, or `-` for standard input.
    file: String,
    /// Write only if the entry's ModifyIndex is still -modify-index.
    #[arg(long)]
    cas: bool,
    #[arg(long, requires = "cas")]
    modify_index: Option<u64>,
}

#[derive(Args, Debug)]
pub struct KindName {
    /// The entry's kind (service-defaults, proxy-defaults, ...).
    #[arg(long)]
    kind: String,
    /// The entry's name.
    #[arg(long)]
    name: String,
}

#[derive(Args, Debug)]
pub struct KindOnly {
    /// The kind to list.
    #[arg(long)]
    kind: String,
}

#[derive(Args, Debug)]
pub struct ChainArgs {
    /// The service whose chain to compile.
    service: String,
}

pub fn run(c: &Client, cmd: ConfigCmd) -> CliResult {
    match cmd {
        ConfigCmd::Write(a) => write(c, a),
        ConfigCmd::Read(a) => read(c, a),
        ConfigCmd::List(a) => list(c, a),
        ConfigCmd::Delete(a) => delete(c, a),
    }
}

/// The text of a file, or of standard input for `-`.
pub fn read_input(file: &str) -> Result<String, CliError> {
    if file == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| CliError(format!("Error reading standard input: {e}")))?;
        return Ok(s);
    }
    std::fs::read_to_string(file).map_err(|e| CliError(format!("Error reading {file}: {e}")))
}

fn field<'a>(v: &'a Value, names: &[&str]) -> &'a str {
    names
        .iter()
        .find_map(|n| v.get(*n).and_then(Value::as_str))
        .unwrap_or("")
}

fn write(c: &Client, a: WriteArgs) -> CliResult {
    let what = if a.file == "-" {
        "standard input"
    } else {
        &a.file
    };
    let entry = parse_json_or_hcl(&read_input(&a.file)?, what)?;
    if !entry.is_object() {
        return Err(CliError(format!(
            "Error parsing {what}: a config entry must be an object"
        )));
    }
    let kind = field(&entry, &["Kind", "kind"]).to_string();
    let name = field(&entry, &["Name", "name"]).to_string();
    let path = match (a.cas, a.modify_index) {
        (true, Some(i)) => format!("/v1/config?cas={i}"),
        (true, None) => return Err(CliError("-cas requires -modify-index".into())),
        _ => "/v1/config".to_string(),
    };
    let r = c.send(reqwest::Method::PUT, &path, Some(entry.to_string()))?;
    if !(200..300).contains(&r.status) {
        return Err(CliError(format!(
            "Error writing config entry {kind}/{name}: Unexpected response code: {} ({})",
            r.status,
            r.body.trim()
        )));
    }
    if r.json()? != Value::Bool(true) {
        return Err(CliError(format!(
            "Config entry not updated: {kind}/{name} (the modify index did not match)"
        )));
    }
    println!("Config entry written: {kind}/{name}");
    Ok(())
}

fn read(c: &Client, a: KindName) -> CliResult {
    let r = c.send(
        reqwest::Method::GET,
        &format!("/v1/config/{}/{}", enc(&a.kind), enc(&a.name)),
        None,
    )?;
    if r.status == 404 {
        return Err(CliError(format!(
            "Error reading config entry {}/{}: {}",
            a.kind,
            a.name,
            r.body.trim()
        )));
    }
    if !(200..300).contains(&r.status) {
        return Err(CliError(format!(
            "Error reading config entry {}/{}: Unexpected response code: {} ({})",
            a.kind,
            a.name,
            r.status,
            r.body.trim()
        )));
    }
    print_json(&r.json()?)
}

fn list(c: &Client, a: KindOnly) -> CliResult {
    let entries = c
        .get_json(&format!("/v1/config/{}", enc(&a.kind)))
        .map_err(|e| {
            CliError(format!(
                "Error listing config entries for kind {:?}: {}",
                a.kind, e.0
            ))
        })?;
    for e in entries.as_array().into_iter().flatten() {
        println!("{}", field(e, &["Name"]));
    }
    Ok(())
}

fn delete(c: &Client, a: KindName) -> CliResult {
    c.expect_ok(
        reqwest::Method::DELETE,
        &format!("/v1/config/{}/{}", enc(&a.kind), enc(&a.name)),
        None,
    )
    .map_err(|e| {
        CliError(format!(
            "Error deleting config entry {}/{}: {}",
            a.kind, a.name, e.0
        ))
    })?;
    println!("Config entry deleted: {}/{}", a.kind, a.name);
    Ok(())
}

pub fn discovery_chain(c: &Client, a: ChainArgs) -> CliResult {
    let v = c
        .get_json(&format!("/v1/discovery-chain/{}", enc(&a.service)))
        .map_err(|e| {
            CliError(format!(
                "Error compiling the discovery chain of {:?}: {}",
                a.service, e.0
            ))
        })?;
    print_json(&v)
}
