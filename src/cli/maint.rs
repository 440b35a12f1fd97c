//! `cairn maint`: maintenance mode of the node (or of one of its services)
//! of the agent or server the CLI talks to, as `consul maint`. Without
//! `-enable` or `-disable` it lists what is in maintenance there.

use clap::Args;

use super::{CliError, CliResult, Client, enc};
use crate::structs::agent::{NODE_MAINTENANCE_CHECK_ID, SERVICE_MAINTENANCE_CHECK_PREFIX};

#[derive(Args, Debug)]
pub struct MaintArgs {
    /// Enable maintenance mode (of the node, or of -service).
    #[arg(long)]
    enable: bool,
    /// Disable maintenance mode (of the node, or of -service).
    #[arg(long)]
    disable: bool,
    /// A service ID: its own maintenance mode instead of the node's.
    #[arg(long)]
    service: Option<String>,
    /// Why (shown in the check's Notes); only with -enable.
    #[arg(long)]
    reason: Option<String>,
}

pub fn run(c: &Client, a: MaintArgs) -> CliResult {
    if a.enable && a.disable {
        return Err(CliError(
            "Only one of -enable or -disable may be provided".into(),
        ));
    }
    if !a.enable && a.reason.is_some() {
        return Err(CliError("Reason may only be provided with -enable".into()));
    }
    if !a.enable && !a.disable {
        if a.service.is_some() {
            return Err(CliError(
                "Service requires either -enable or -disable".into(),
            ));
        }
        return list(c);
    }
    let mut query = format!("?enable={}", a.enable);
    if let Some(r) = &a.reason {
        query.push_str(&format!("&reason={}", enc(r)));
    }
    match &a.service {
        Some(id) => {
            let path = format!("/v1/agent/service/maintenance/{}{query}", enc(id));
            c.expect_ok(reqwest::Method::PUT, &path, None)?;
            let state = if a.enable { "enabled" } else { "disabled" };
            println!("Service maintenance is now {state} for {id:?}");
        }
        None => {
            c.expect_ok(
                reqwest::Method::PUT,
                &format!("/v1/agent/maintenance{query}"),
                None,
            )?;
            let state = if a.enable { "enabled" } else { "disabled" };
            println!("Node maintenance is now {state}");
        }
    }
    Ok(())
}

/// What is in maintenance on the agent, as `consul maint` lists it.
fn list(c: &Client) -> CliResult {
    let node = c.agent_node_name()?;
    let checks = c.get_json("/v1/agent/checks")?;
    let mut all: Vec<&serde_json::Value> = checks
        .as_object()
        .into_iter()
        .flat_map(|m| m.values())
        .collect();
    all.sort_by_key(|c| c["CheckID"].as_str().unwrap_or(""));
    for check in all {
        let id = check["CheckID"].as_str().unwrap_or("");
        let reason = check["Notes"].as_str().unwrap_or("");
        if id == NODE_MAINTENANCE_CHECK_ID {
            println!("Node:\n  Name:   {node}\n  Reason: {reason}");
        } else if id.starts_with(SERVICE_MAINTENANCE_CHECK_PREFIX) {
            let service = check["ServiceID"].as_str().unwrap_or("");
            println!("Service:\n  ID:     {service}\n  Reason: {reason}");
        }
    }
    Ok(())
}
