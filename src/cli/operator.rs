//! `cairn operator raft list-peers|remove-peer|transfer-leader`,
//! `cairn operator autopilot get-config|set-config|state` and `cairn
//! operator usage instances` (`cli::usage`).

use clap::{Args, Subcommand};
use serde_json::Value;

use super::{CliError, CliResult, Client, Format, enc, print_json, table};

#[derive(Subcommand, Debug)]
pub enum OperatorCmd {
    /// Raft peers of the cluster.
    #[command(subcommand)]
    Raft(RaftCmd),
    /// Autopilot: its configuration and the servers' health.
    #[command(subcommand)]
    Autopilot(AutopilotCmd),
    /// What the catalog holds: service instance usage.
    #[command(subcommand)]
    Usage(super::usage::UsageCmd),
}

#[derive(Subcommand, Debug)]
pub enum AutopilotCmd {
    /// Print autopilot's configuration.
    GetConfig,
    /// Change the given settings (the rest stay as they are).
    SetConfig(SetConfigArgs),
    /// Print the servers' health as autopilot sees it.
    State(StateArgs),
}

#[derive(Args, Debug)]
pub struct SetConfigArgs {
    #[arg(long)]
    cleanup_dead_servers: Option<bool>,
    /// A Go duration (e.g. 200ms).
    #[arg(long)]
    last_contact_threshold: Option<String>,
    #[arg(long)]
    max_trailing_logs: Option<u64>,
    #[arg(long)]
    min_quorum: Option<u32>,
    /// A Go duration (e.g. 10s).
    #[arg(long)]
    server_stabilization_time: Option<String>,
}

#[derive(Args, Debug)]
pub struct StateArgs {
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

#[derive(Subcommand, Debug)]
pub enum RaftCmd {
    /// List the Raft peers (servers) and their roles.
    ListPeers(ListPeersArgs),
    /// Remove a server from the Raft configuration.
    RemovePeer(RemovePeerArgs),
    /// Hand leadership to another voter (-id, or any).
    TransferLeader(TransferArgs),
}

#[derive(Args, Debug)]
pub struct TransferArgs {
    /// The voter to lead next (its node name); any other voter if absent.
    #[arg(long)]
    id: Option<String>,
}

#[derive(Args, Debug)]
pub struct ListPeersArgs {
    /// Let any server answer (no leader needed).
    #[arg(long)]
    stale: bool,
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

#[derive(Args, Debug)]
pub struct RemovePeerArgs {
    /// The server's ID (its node name).
    #[arg(long)]
    id: Option<String>,
    /// The server's Raft address (IP:port), instead of -id.
    #[arg(long)]
    address: Option<String>,
}

pub fn run(c: &Client, cmd: OperatorCmd) -> CliResult {
    match cmd {
        OperatorCmd::Autopilot(a) => autopilot(c, a),
        OperatorCmd::Usage(u) => super::usage::run(c, u),
        OperatorCmd::Raft(RaftCmd::ListPeers(a)) => list_peers(c, a),
        OperatorCmd::Raft(RaftCmd::RemovePeer(a)) => remove_peer(c, a),
        OperatorCmd::Raft(RaftCmd::TransferLeader(a)) => {
            let path = match &a.id {
                Some(id) => format!("/v1/operator/raft/transfer-leader?id={}", enc(id)),
                None => "/v1/operator/raft/transfer-leader".into(),
            };
            c.expect_ok(reqwest::Method::POST, &path, None)
                .map_err(|e| CliError(format!("Error transferring leadership: {}", e.0)))?;
            println!("Success! Leadership transferred.");
            Ok(())
        }
    }
}

fn list_peers(c: &Client, a: ListPeersArgs) -> CliResult {
    let path = if a.stale {
        "/v1/operator/raft/configuration?stale"
    } else {
        "/v1/operator/raft/configuration"
    };
    let conf = c
        .get_json(path)
        .map_err(|e| CliError(format!("Failed to retrieve raft configuration: {}", e.0)))?;
    if a.format == Format::Json {
        return print_json(&conf);
    }
    let mut rows = vec![
        ["Node", "ID", "Address", "State", "Voter", "RaftProtocol"]
            .map(String::from)
            .to_vec(),
    ];
    for s in conf["Servers"].as_array().into_iter().flatten() {
        let text = |k: &str| match &s[k] {
            Value::String(v) => v.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        };
        let state = if s["Leader"].as_bool() == Some(true) {
            "leader"
        } else {
            "follower"
        };
        rows.push(vec![
            text("Node"),
            text("ID"),
            text("Address"),
            state.to_string(),
            (s["Voter"].as_bool() == Some(true)).to_string(),
            match text("ProtocolVersion") {
                v if v.is_empty() => "<=1".into(),
                v => v,
            },
        ]);
    }
    print!("{}", table(&rows));
    Ok(())
}

fn remove_peer(c: &Client, a: RemovePeerArgs) -> CliResult {
    let (param, who) = match (&a.id, &a.address) {
        (Some(id), None) => ("id", id),
        (None, Some(addr)) => ("address", addr),
        _ => {
            return Err(CliError(
                "Exactly one of -id or -address must be given".into(),
            ));
        }
    };
    c.expect_ok(
        reqwest::Method::DELETE,
        &format!("/v1/operator/raft/peer?{param}={}", enc(who)),
        None,
    )
    .map_err(|e| CliError(format!("Error removing peer: {}", e.0)))?;
    println!("Removed peer with {param} \"{who}\"");
    Ok(())
}

const AUTOPILOT: &str = "/v1/operator/autopilot/configuration";

fn autopilot(c: &Client, cmd: AutopilotCmd) -> CliResult {
    match cmd {
        AutopilotCmd::GetConfig => {
            let v = c.get_json(AUTOPILOT).map_err(|e| {
                CliError(format!("Error querying Autopilot configuration: {}", e.0))
            })?;
            for key in [
                "CleanupDeadServers",
                "LastContactThreshold",
                "MaxTrailingLogs",
                "MinQuorum",
                "ServerStabilizationTime",
                "RedundancyZoneTag",
                "DisableUpgradeMigration",
                "UpgradeVersionTag",
            ] {
                let value = match &v[key] {
                    Value::String(s) if key.ends_with("Tag") => format!("{s:?}"),
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                println!("{key} = {value}");
            }
            Ok(())
        }
        AutopilotCmd::SetConfig(a) => {
            let mut v = c.get_json(AUTOPILOT).map_err(|e| {
                CliError(format!("Error querying Autopilot configuration: {}", e.0))
            })?;
            let index = v["ModifyIndex"].as_u64().unwrap_or(0);
            let set = |v: &mut Value, k: &str, x: Value| v[k] = x;
            if let Some(b) = a.cleanup_dead_servers {
                set(&mut v, "CleanupDeadServers", Value::Bool(b));
            }
            if let Some(d) = a.last_contact_threshold {
                set(&mut v, "LastContactThreshold", Value::String(d));
            }
            if let Some(n) = a.max_trailing_logs {
                set(&mut v, "MaxTrailingLogs", n.into());
            }
            if let Some(n) = a.min_quorum {
                set(&mut v, "MinQuorum", n.into());
            }
            if let Some(d) = a.server_stabilization_time {
                set(&mut v, "ServerStabilizationTime", Value::String(d));
            }
            let r = c
                .expect_ok(
                    reqwest::Method::PUT,
                    &format!("{AUTOPILOT}?cas={index}"),
                    Some(v.to_string()),
                )
                .map_err(|e| CliError(format!("Error setting Autopilot configuration: {}", e.0)))?;
            if r.body.trim() == "true" {
                println!("Configuration updated!");
                Ok(())
            } else {
                Err(CliError(
                    "Configuration could not be atomically updated, please try again".into(),
                ))
            }
        }
        AutopilotCmd::State(a) => {
            let v = c
                .get_json("/v1/operator/autopilot/state")
                .map_err(|e| CliError(format!("Error querying Autopilot state: {}", e.0)))?;
            if a.format == Format::Json {
                return print_json(&v);
            }
            println!("Healthy:                      {}", v["Healthy"]);
            println!("Failure Tolerance:            {}", v["FailureTolerance"]);
            println!(
                "Optimistic Failure Tolerance: {}",
                v["OptimisticFailureTolerance"]
            );
            println!(
                "Leader:                       {}",
                v["Leader"].as_str().unwrap_or("")
            );
            let mut rows = vec![
                [
                    "ID",
                    "Address",
                    "Status",
                    "Healthy",
                    "Last Contact",
                    "Last Index",
                ]
                .map(String::from)
                .to_vec(),
            ];
            for s in v["Servers"]
                .as_object()
                .into_iter()
                .flat_map(|m| m.values())
            {
                let text = |k: &str| match &s[k] {
                    Value::String(v) => v.clone(),
                    other => other.to_string(),
                };
                rows.push(vec![
                    text("ID"),
                    text("Address"),
                    text("Status"),
                    text("Healthy"),
                    text("LastContact"),
                    text("LastIndex"),
                ]);
            }
            print!("{}", table(&rows));
            Ok(())
        }
    }
}
