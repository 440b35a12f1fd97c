//! `cairn kv get KEY` and `cairn kv put KEY [VALUE]`.

use std::io::Read;

use clap::{Args, Subcommand};

use super::{CliError, CliResult, Client};

#[derive(Subcommand, Debug)]
pub enum KvCmd {
    /// Print the value at a key.
    Get(GetArgs),
    /// Write a value at a key (`-` reads stdin, `@FILE` reads a file).
    Put(PutArgs),
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
    }
}
