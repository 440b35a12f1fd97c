//! `cairn rtt [-wan] NODE1 [NODE2]`: the estimated round-trip time
//! between two nodes from their network coordinates, as `consul rtt`
//! prints it (computed here, from the coordinates the servers hold).

use clap::Args;
use serde_json::Value;

use super::{CliError, CliResult, Client};
use crate::coordinate::{Coordinate, distance};

#[derive(Args, Debug)]
pub struct RttArgs {
    /// Use the servers' WAN coordinates (names as `node.dc`).
    #[arg(long)]
    wan: bool,
    /// One or two node names; the second defaults to the agent's node.
    #[arg(num_args = 1..=2, required = true)]
    nodes: Vec<String>,
}

/// The coordinate of `name` among `rows` (`[{"Node", "Coord"}]`).
fn find(rows: &[Value], name: &str) -> Option<Coordinate> {
    let row = rows.iter().find(|r| r["Node"].as_str() == Some(name))?;
    serde_json::from_value(row["Coord"].clone()).ok()
}

pub fn run(c: &Client, a: RttArgs) -> CliResult {
    let (first, second) = match a.nodes.as_slice() {
        [one] if a.wan => {
            let dc = c.get_json("/v1/agent/self")?["Config"]["Datacenter"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            (one.clone(), format!("{}.{dc}", c.agent_node_name()?))
        }
        [one] => (one.clone(), c.agent_node_name()?),
        [one, two] => (one.clone(), two.clone()),
        _ => return Err(CliError("One or two node names must be specified".into())),
    };
    let (rows, what, kind) = if a.wan {
        // A WAN name is `node.dc`: each datacenter's rows name its servers
        // as the catalog does, so the row is `node` under `dc`.
        let dcs = c.get_json("/v1/coordinate/datacenters")?;
        let rows: Vec<Value> = dcs
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|dc| {
                let name = dc["Datacenter"].as_str().unwrap_or_default().to_owned();
                let list = dc["Coordinates"].as_array().cloned().unwrap_or_default();
                list.into_iter().map(move |mut row| {
                    let node = row["Node"].as_str().unwrap_or_default();
                    row["Node"] = Value::String(format!("{node}.{name}"));
                    row
                })
            })
            .collect();
        (rows, "server", "WAN")
    } else {
        let rows = c.get_json("/v1/coordinate/nodes")?;
        (rows.as_array().cloned().unwrap_or_default(), "node", "LAN")
    };
    let coord = |n: &str| {
        find(&rows, n)
            .ok_or_else(|| CliError(format!("Could not find a coordinate for {what} {n:?}")))
    };
    let (c1, c2) = (coord(&first)?, coord(&second)?);
    let d = distance(&c1, &c2)
        .ok_or_else(|| CliError("Could not compute the distance: bad coordinate".into()))?;
    println!(
        "Estimated {first} <-> {second} rtt: {:.3} ms (using {kind} coordinates)",
        d.as_secs_f64() * 1000.0
    );
    Ok(())
}
