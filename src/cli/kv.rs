//! `cairn kv get|put|delete|export|import`, worded as Consul's CLI.

use std::io::Read;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};

use super::{CliError, CliResult, Client};

#[derive(Subcommand, Debug)]
pub enum KvCmd {
    /// Print the value at a key.
    Get(GetArgs),
    /// Write a value at a key (`-` reads stdin, `@FILE` reads a file).
    Put(PutArgs),
    /// Delete a key, or every key under a prefix with -recurse.
    Delete(DeleteArgs),
    /// Print every key under a prefix as JSON (`kv import` reads it back).
    Export(ExportArgs),
    /// Write the keys of an export (`@FILE`, `-` for stdin, or the JSON).
    Import(ImportArgs),
}

#[derive(Args, Debug)]
pub struct DeleteArgs {
    /// Delete every key under KEY (all keys when KEY is empty).
    #[arg(long)]
    recurse: bool,
    /// Delete only if the key's modify index is still -modify-index.
    #[arg(long)]
    cas: bool,
    #[arg(long)]
    modify_index: Option<u64>,
    key: Option<String>,
}

#[derive(Args, Debug)]
pub struct ExportArgs {
    prefix: Option<String>,
}

#[derive(Args, Debug)]
pub struct ImportArgs {
    /// Prepended to every imported key.
    #[arg(long, default_value = "")]
    prefix: String,
    data: Option<String>,
}

/// One key of `consul kv export`'s format (lower-case names, the value in
/// base64).
#[derive(Serialize, Deserialize, Debug)]
struct Exported {
    key: String,
    #[serde(default)]
    flags: u64,
    #[serde(default)]
    value: String,
}

#[derive(Args, Debug)]
pub struct GetArgs {
    key: String,
}

#[derive(Args, Debug)]
pub struct PutArgs {
    key: String,
    value: Option<String>,
}

/// Keys keep their slashes in the path; everything else is escaped.
fn key_path(key: &str) -> String {
    key.split('/').map(super::enc).collect::<Vec<_>>().join("/")
}

pub fn run(c: &Client, cmd: KvCmd) -> CliResult {
    match cmd {
        KvCmd::Get(a) => {
            let r = c.send(
                reqwest::Method::GET,
                &format!("/v1/kv/{}?raw", key_path(&a.key)),
                None,
            )?;
            match r.status {
                200 => {
                    println!("{}", r.body);
                    Ok(())
                }
                404 => Err(CliError(format!("Error! No key exists at: {}", a.key))),
                s => Err(CliError(format!(
                    "Error querying key {:?}: Unexpected response code: {s} ({})",
                    a.key,
                    r.body.trim()
                ))),
            }
        }
        KvCmd::Put(a) => {
            let value = match a.value.as_deref() {
                None => String::new(),
                Some("-") => {
                    let mut s = String::new();
                    std::io::stdin().read_to_string(&mut s)?;
                    s
                }
                Some(v) if v.starts_with('@') => std::fs::read_to_string(&v[1..])
                    .map_err(|e| CliError(format!("Error reading {}: {e}", &v[1..])))?,
                Some(v) => v.to_string(),
            };
            let r = c
                .expect_ok(
                    reqwest::Method::PUT,
                    &format!("/v1/kv/{}", key_path(&a.key)),
                    Some(value),
                )
                .map_err(|e| CliError(format!("Error! Failed writing data: {}", e.0)))?;
            if r.body.trim() != "true" {
                return Err(CliError(format!(
                    "Error! Did not write to {}: the server refused",
                    a.key
                )));
            }
            println!("Success! Data written to: {}", a.key);
            Ok(())
        }
        KvCmd::Delete(a) => delete(c, a),
        KvCmd::Export(a) => export(c, a),
        KvCmd::Import(a) => import(c, a),
    }
}

fn delete(c: &Client, a: DeleteArgs) -> CliResult {
    let key = a.key.unwrap_or_default();
    if key.is_empty() && !a.recurse {
        return Err(CliError("Error! Missing KEY argument".into()));
    }
    if a.cas && a.recurse {
        return Err(CliError("Cannot specify both -cas and -recurse!".into()));
    }
    let query = match (a.recurse, a.cas, a.modify_index) {
        (true, _, _) => "?recurse".to_string(),
        (false, true, Some(i)) => format!("?cas={i}"),
        (false, true, None) => {
            return Err(CliError("Must specify -modify-index with -cas!".into()));
        }
        (false, false, _) => String::new(),
    };
    let r = c
        .expect_ok(
            reqwest::Method::DELETE,
            &format!("/v1/kv/{}{query}", key_path(&key)),
            None,
        )
        .map_err(|e| CliError(format!("Error! Did not delete key {key}: {}", e.0)))?;
    if a.cas && r.body.trim() != "true" {
        return Err(CliError(format!("Error! Did not delete key {key}")));
    }
    if a.recurse {
        println!("Success! Deleted keys with prefix: {key}");
    } else {
        println!("Success! Deleted key: {key}");
    }
    Ok(())
}

fn export(c: &Client, a: ExportArgs) -> CliResult {
    let prefix = a.prefix.unwrap_or_default();
    let r = c.send(
        reqwest::Method::GET,
        &format!("/v1/kv/{}?recurse", key_path(&prefix)),
        None,
    )?;
    let rows: Vec<serde_json::Value> = match r.status {
        200 => serde_json::from_str(&r.body)?,
        404 => Vec::new(),
        s => {
            return Err(CliError(format!(
                "Error querying keys under {prefix:?}: Unexpected response code: {s} ({})",
                r.body.trim()
            )));
        }
    };
    let out: Vec<Exported> = rows
        .iter()
        .map(|row| Exported {
            key: row["Key"].as_str().unwrap_or("").to_string(),
            flags: row["Flags"].as_u64().unwrap_or(0),
            value: row["Value"].as_str().unwrap_or("").to_string(),
        })
        .collect();
    // Consul indents its export with tabs.
    let mut buf = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(b"\t");
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
    out.serialize(&mut ser)?;
    println!("{}", String::from_utf8_lossy(&buf));
    Ok(())
}

fn import(c: &Client, a: ImportArgs) -> CliResult {
    let data = match a.data.as_deref() {
        None | Some("-") => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s)?;
            s
        }
        Some(v) if v.starts_with('@') => std::fs::read_to_string(&v[1..])
            .map_err(|e| CliError(format!("Error! Failed to read file {}: {e}", &v[1..])))?,
        Some(v) => v.to_string(),
    };
    let entries: Vec<Exported> =
        serde_json::from_str(&data).map_err(|e| CliError(format!("Cannot unmarshal data: {e}")))?;
    for e in entries {
        let value = B64.decode(e.value.as_bytes()).map_err(|err| {
            CliError(format!(
                "Error base 64 decoding value for key {}: {err}",
                e.key
            ))
        })?;
        let key = format!("{}{}", a.prefix, e.key);
        let path = format!("/v1/kv/{}?flags={}", key_path(&key), e.flags);
        let (status, body) = c.send_bytes(reqwest::Method::PUT, &path, Some(value))?;
        if status != 200 || String::from_utf8_lossy(&body).trim() != "true" {
            return Err(CliError(format!(
                "Error! Failed writing data for key {key}: {status} ({})",
                String::from_utf8_lossy(&body).trim()
            )));
        }
        println!("Imported: {key}");
    }
    Ok(())
}
