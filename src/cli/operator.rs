//! `cairn operator raft list-peers|remove-peer|transfer-leader`.

use clap::{Args, Subcommand};
use serde_json::Value;

use super::{CliError, CliResult, Client, Format, enc, print_json, table};

#[derive(Subcommand, Debug)]
pub enum OperatorCmd {
    /// Raft peers of the cluster.
    #[command(subcommand)]
    Raft(RaftCmd),
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
