//! `cairn members`: the servers of the cluster, as Consul's table; with
//! `-wan`, the servers of every datacenter (WAN federation).

use clap::Args;
use serde_json::Value;

use super::{CliResult, Client, Format, print_json, table};

#[derive(Args, Debug)]
pub struct MembersArgs {
    /// Show every tag of each member.
    #[arg(long)]
    detailed: bool,
    /// The servers of every federated datacenter (`<node>.<dc>`).
    #[arg(long)]
    wan: bool,
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

fn status_name(code: i64) -> &'static str {
    match code {
        1 => "alive",
        2 => "leaving",
        3 => "left",
        4 => "failed",
        _ => "none",
    }
}

pub fn run(c: &Client, a: MembersArgs) -> CliResult {
    let list = c.get_json(if a.wan {
        "/v1/agent/members?wan=1"
    } else {
        "/v1/agent/members"
    })?;
    if a.format == Format::Json {
        return print_json(&list);
    }
    let mut members: Vec<&Value> = list.as_array().into_iter().flatten().collect();
    members.sort_by_key(|m| m["Name"].as_str().unwrap_or(""));
    let mut header = vec![
        "Node", "Address", "Status", "Type", "Build", "Protocol", "DC",
    ];
    header.extend(if a.detailed {
        vec!["Tags"]
    } else {
        vec!["Partition", "Segment"]
    });
    let mut rows = vec![header.into_iter().map(String::from).collect::<Vec<_>>()];
    for m in members {
        let tag = |k: &str| m["Tags"][k].as_str().unwrap_or("").to_string();
        let kind = if tag("role") == "consul" {
            "server"
        } else {
            "client"
        };
        let mut row = vec![
            m["Name"].as_str().unwrap_or("").to_string(),
            format!(
                "{}:{}",
                m["Addr"].as_str().unwrap_or(""),
                m["Port"].as_u64().unwrap_or(0)
            ),
            status_name(m["Status"].as_i64().unwrap_or(0)).to_string(),
            kind.to_string(),
            tag("build"),
            m["ProtocolCur"].as_u64().unwrap_or(0).to_string(),
            tag("dc"),
        ];
        if a.detailed {
            let tags = m["Tags"]
                .as_object()
                .map(|t| {
                    t.iter()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default();
            row.push(tags);
        } else {
            row.push("default".into());
            row.push("<all>".into());
        }
        rows.push(row);
    }
    print!("{}", table(&rows));
    Ok(())
}
