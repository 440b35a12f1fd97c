//! The agent verbs, as Consul's: `reload`, `monitor`, `join`,
//! `force-leave`, `leave`, `info` against the agent (or server) the CLI
//! talks to.

use std::io::Write;

use clap::Args;
use serde_json::Value;

use super::{CliError, CliResult, Client, enc};

#[derive(Args, Debug)]
pub struct MonitorArgs {
    /// The level of the lines to stream (trace, debug, info, warn, err).
    #[arg(long, default_value = "info")]
    log_level: String,
    /// Stream JSON lines.
    #[arg(long)]
    log_json: bool,
}

#[derive(Args, Debug)]
pub struct JoinArgs {
    /// A server's Raft address (from a server), or a server's HTTP address
    /// (from a client agent).
    address: String,
}

#[derive(Args, Debug)]
pub struct ForceLeaveArgs {
    node: String,
    /// Remove the node from the member list at once.
    #[arg(long)]
    prune: bool,
    /// A server of another datacenter (`node.dc`, as `members -wan` lists
    /// it): every server of this datacenter forgets it.
    #[arg(long)]
    wan: bool,
}

pub fn reload(c: &Client) -> CliResult {
    c.expect_ok(reqwest::Method::PUT, "/v1/agent/reload", None)?;
    println!("Configuration reload triggered");
    Ok(())
}

pub fn leave(c: &Client) -> CliResult {
    c.expect_ok(reqwest::Method::PUT, "/v1/agent/leave", None)?;
    println!("Graceful leave complete");
    Ok(())
}

pub fn join(c: &Client, a: JoinArgs) -> CliResult {
    let path = format!("/v1/agent/join/{}", enc(&a.address));
    c.expect_ok(reqwest::Method::PUT, &path, None)
        .map_err(|e| CliError(format!("Error joining address '{}': {}", a.address, e.0)))?;
    println!("Successfully joined cluster by contacting 1 nodes.");
    Ok(())
}

pub fn force_leave(c: &Client, a: ForceLeaveArgs) -> CliResult {
    let mut path = format!("/v1/agent/force-leave/{}", enc(&a.node));
    let flags: Vec<&str> = [(a.prune, "prune=1"), (a.wan, "wan=1")]
        .into_iter()
        .filter_map(|(on, q)| on.then_some(q))
        .collect();
    if !flags.is_empty() {
        path.push('?');
        path.push_str(&flags.join("&"));
    }
    c.expect_ok(reqwest::Method::PUT, &path, None)
        .map_err(|e| CliError(format!("Error force leaving: {}", e.0)))?;
    Ok(())
}

/// Streams the agent's log lines until interrupted.
pub fn monitor(c: &Client, a: MonitorArgs) -> CliResult {
    let mut path = format!("/v1/agent/monitor?loglevel={}", enc(&a.log_level));
    if a.log_json {
        path.push_str("&logjson");
    }
    let mut out = std::io::stdout();
    c.stream(&path, |chunk| {
        out.write_all(chunk).is_ok() && out.flush().is_ok()
    })
}

/// `/v1/agent/self`'s `Stats`, as `consul info` prints them: a section
/// per group, `key = value` lines, sorted.
pub fn info(c: &Client) -> CliResult {
    let me = c.get_json("/v1/agent/self")?;
    let mut stats = me["Stats"].as_object().cloned().unwrap_or_default();
    let cfg = &me["Config"];
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        v => v.to_string(),
    };
    stats.entry("agent").or_insert_with(|| {
        serde_json::json!({
            "node_name": text(&cfg["NodeName"]),
            "datacenter": text(&cfg["Datacenter"]),
            "server": text(&cfg["Server"]),
            "version": text(&cfg["Version"]),
        })
    });
    let mut sections: Vec<_> = stats.into_iter().collect();
    sections.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, section) in sections {
        println!("{name}:");
        let mut rows: Vec<(String, String)> = section
            .as_object()
            .into_iter()
            .flat_map(|m| m.iter().map(|(k, v)| (k.clone(), text(v))))
            .collect();
        rows.sort();
        for (k, v) in rows {
            println!("\t{k} = {v}");
        }
    }
    Ok(())
}
