//! `cairn intention create|delete|check|get|list|match`, worded as
//! Consul's CLI.
//! Intentions are addressed by source and destination (Consul 1.9+'s
//! exact endpoints); `check` exits 2 when the connection is denied.

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::{CliError, Client, Format, enc, print_json, table};

#[derive(Subcommand, Debug)]
pub enum IntentionCmd {
    /// Create an intention from SRC to DST (allow unless -deny).
    Create(CreateArgs),
    /// Delete the intention from SRC to DST.
    Delete(Pair),
    /// Whether a connection from SRC to DST is allowed (exit 0) or denied
    /// (exit 2).
    Check(Pair),
    /// Show the intention from SRC to DST.
    Get(Pair),
    /// List every intention.
    List(ListArgs),
    /// Show the intentions that apply to a destination (or, with
    /// -source, a source), in the order they are evaluated.
    Match(MatchArgs),
}

#[derive(Args, Debug)]
pub struct MatchArgs {
    /// Match intentions with the given source.
    #[arg(long, conflicts_with = "destination")]
    source: bool,
    /// Match intentions with the given destination (the default).
    #[arg(long)]
    destination: bool,
    name: String,
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// Allow the connection (the default).
    #[arg(long, conflicts_with = "deny")]
    allow: bool,
    #[arg(long)]
    deny: bool,
    /// Replace an intention that exists between the same pair.
    #[arg(long)]
    replace: bool,
    /// Metadata as key=value (repeatable).
    #[arg(long)]
    meta: Vec<String>,
    #[arg(long, default_value = "")]
    description: String,
    src: String,
    dst: String,
}

#[derive(Args, Debug)]
pub struct Pair {
    src: String,
    /// Absent: SRC was a legacy intention ID, which cairn does not serve.
    dst: Option<String>,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

/// Runs one command; the exit code (`check`: 0 allowed, 2 denied).
pub fn run(c: &Client, cmd: IntentionCmd) -> Result<i32, CliError> {
    match cmd {
        IntentionCmd::Create(a) => create(c, a).map(|_| 0),
        IntentionCmd::Delete(p) => {
            let (src, dst) = pair(&p)?;
            c.expect_ok(reqwest::Method::DELETE, &exact(src, dst), None)
                .map_err(|e| CliError(format!("Error deleting intention: {}", e.0)))?;
            println!("Intention deleted.");
            Ok(0)
        }
        IntentionCmd::Check(p) => {
            let (src, dst) = pair(&p)?;
            let path = format!(
                "/v1/connect/intentions/check?source={}&destination={}",
                enc(src),
                enc(dst)
            );
            let v = c
                .get_json(&path)
                .map_err(|e| CliError(format!("Error checking the connection: {}", e.0)))?;
            if v["Allowed"].as_bool() == Some(true) {
                println!("Allowed");
                Ok(0)
            } else {
                println!("Denied");
                Ok(2)
            }
        }
        IntentionCmd::Get(p) => {
            let (src, dst) = pair(&p)?;
            let ixn = read(c, src, dst)?
                .ok_or_else(|| CliError(format!("Intention not found: {src} => {dst}")))?;
            print_intention(&ixn);
            Ok(0)
        }
        IntentionCmd::Match(a) => {
            let by = if a.source { "source" } else { "destination" };
            let path = format!("/v1/connect/intentions/match?by={by}&name={}", enc(&a.name));
            let v = c
                .get_json(&path)
                .map_err(|e| CliError(format!("Error matching the connection: {}", e.0)))?;
            for i in v[&a.name].as_array().into_iter().flatten() {
                println!("{}", one_line(i));
            }
            Ok(0)
        }
        IntentionCmd::List(a) => {
            let v = c
                .get_json("/v1/connect/intentions")
                .map_err(|e| CliError(format!("Error listing intentions: {}", e.0)))?;
            if a.format == Format::Json {
                print_json(&v)?;
                return Ok(0);
            }
            let items = v.as_array().cloned().unwrap_or_default();
            if items.is_empty() {
                println!("There are no intentions.");
                return Ok(0);
            }
            let mut rows = vec![
                ["ID", "Source", "Action", "Destination", "Precedence"]
                    .map(String::from)
                    .to_vec(),
            ];
            for i in &items {
                rows.push(vec![
                    s(&i["ID"]).to_string(),
                    s(&i["SourceName"]).to_string(),
                    action(i),
                    s(&i["DestinationName"]).to_string(),
                    i["Precedence"].as_i64().unwrap_or(0).to_string(),
                ]);
            }
            print!("{}", table(&rows));
            Ok(0)
        }
    }
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

/// "allow"/"deny", or "<permissions>" when L7 permissions decide.
fn action(i: &Value) -> String {
    match i["Action"].as_str() {
        Some(a) if !a.is_empty() => a.to_string(),
        _ => "<permissions>".into(),
    }
}

/// `SRC => DST (action)`, or the permissions' count when they decide, as
/// Consul's `Intention.String`.
fn one_line(i: &Value) -> String {
    let detail = match i["Permissions"].as_array().map_or(0, Vec::len) {
        0 => s(&i["Action"]).to_string(),
        1 => "1 permission".to_string(),
        n => format!("{n} permissions"),
    };
    let peer = |p: &Value, name: &str| match p.as_str() {
        Some(p) if !p.is_empty() => format!("peer({p})/{name}"),
        _ => name.to_string(),
    };
    format!(
        "{} => {} ({detail})",
        peer(&i["SourcePeer"], s(&i["SourceName"])),
        s(&i["DestinationName"])
    )
}

fn pair(p: &Pair) -> Result<(&str, &str), CliError> {
    match &p.dst {
        Some(dst) => Ok((&p.src, dst)),
        None => Err(CliError(
            "Intentions are addressed as SRC DST (legacy intention IDs are not served)".into(),
        )),
    }
}

fn exact(src: &str, dst: &str) -> String {
    format!(
        "/v1/connect/intentions/exact?source={}&destination={}",
        enc(src),
        enc(dst)
    )
}

/// The intention from `src` to `dst`, if one exists.
fn read(c: &Client, src: &str, dst: &str) -> Result<Option<Value>, CliError> {
    let r = c.send(reqwest::Method::GET, &exact(src, dst), None)?;
    match r.status {
        200 => Ok(Some(r.json()?)),
        404 => Ok(None),
        st => Err(CliError(format!(
            "Error reading the intention: Unexpected response code: {st} ({})",
            r.body.trim()
        ))),
    }
}

/// A new intention is created as Consul's CLI creates it (`POST`, which
/// keeps `-meta`); `-replace` of an existing one upserts by name, which
/// (as Consul's) keeps no metadata.
fn create(c: &Client, a: CreateArgs) -> Result<(), CliError> {
    let exists = read(c, &a.src, &a.dst)?.is_some();
    if exists && !a.replace {
        return Err(CliError(format!(
            "Intention with source {:?} and destination {:?} already exists",
            a.src, a.dst
        )));
    }
    let mut meta = serde_json::Map::new();
    for kv in &a.meta {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| CliError(format!("Invalid -meta {kv:?}: want key=value")))?;
        meta.insert(k.to_string(), json!(v));
    }
    let verb = if a.deny { "deny" } else { "allow" };
    let mut body = json!({
        "SourceName": a.src,
        "DestinationName": a.dst,
        "SourceType": "consul",
        "Action": verb,
        "Description": a.description,
        "Meta": meta,
    });
    let (method, path) = if exists {
        if !a.meta.is_empty() {
            eprintln!(
                "Note: a replaced intention keeps no -meta (edit the service-intentions entry)"
            );
        }
        body.as_object_mut().map(|o| o.remove("Meta"));
        (reqwest::Method::PUT, exact(&a.src, &a.dst))
    } else {
        (reqwest::Method::POST, "/v1/connect/intentions".to_string())
    };
    c.expect_ok(method, &path, Some(body.to_string()))
        .map_err(|e| CliError(format!("Error creating intention: {}", e.0)))?;
    println!("Created: {} => {} ({verb})", a.src, a.dst);
    Ok(())
}

fn print_intention(i: &Value) {
    let mut rows = vec![
        vec!["Source:".into(), s(&i["SourceName"]).to_string()],
        vec!["Destination:".into(), s(&i["DestinationName"]).to_string()],
    ];
    if !s(&i["ID"]).is_empty() {
        rows.push(vec!["ID:".into(), s(&i["ID"]).to_string()]);
    }
    rows.push(vec!["Action:".into(), action(i)]);
    if !s(&i["Description"]).is_empty() {
        rows.push(vec![
            "Description:".into(),
            s(&i["Description"]).to_string(),
        ]);
    }
    for (k, v) in i["Meta"].as_object().into_iter().flatten() {
        rows.push(vec![format!("Meta[{k}]:"), s(v).to_string()]);
    }
    rows.push(vec![
        "Precedence:".into(),
        i["Precedence"].as_i64().unwrap_or(0).to_string(),
    ]);
    if !s(&i["CreatedAt"]).is_empty() {
        rows.push(vec!["Created At:".into(), s(&i["CreatedAt"]).to_string()]);
    }
    print!("{}", table(&rows));
}
