//! `cairn catalog nodes|services|datacenters`, printed as Consul's
//! CLI prints them.

use std::collections::BTreeSet;

use clap::{Args, Subcommand};
use serde_json::Value;

use super::{CliResult, Client, Format, enc, print_json, table};

#[derive(Subcommand, Debug)]
pub enum CatalogCmd {
    /// List the nodes of the catalog.
    Nodes(NodesArgs),
    /// List the services of the catalog.
    Services(ServicesArgs),
    /// List the known datacenters, nearest first.
    Datacenters,
}

#[derive(Args, Debug)]
pub struct NodesArgs {
    /// Only nodes that run this service.
    #[arg(long)]
    service: Option<String>,
    /// Only nodes with this metadata, as key=value (repeatable).
    #[arg(long = "node-meta")]
    node_meta: Vec<String>,
    /// Show tagged addresses and metadata too.
    #[arg(long)]
    detailed: bool,
    /// A bexpr filter on the nodes.
    #[arg(long)]
    filter: Option<String>,
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

#[derive(Args, Debug)]
pub struct ServicesArgs {
    /// Only the services of this node.
    #[arg(long)]
    node: Option<String>,
    /// Only services on nodes with this metadata, as key=value (repeatable).
    #[arg(long = "node-meta")]
    node_meta: Vec<String>,
    /// Show each service's tags.
    #[arg(long)]
    tags: bool,
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

pub fn run(c: &Client, cmd: CatalogCmd) -> CliResult {
    match cmd {
        CatalogCmd::Nodes(a) => nodes(c, a),
        CatalogCmd::Services(a) => services(c, a),
        CatalogCmd::Datacenters => {
            let dcs = c.get_json("/v1/catalog/datacenters")?;
            for dc in dcs.as_array().into_iter().flatten() {
                println!("{}", dc.as_str().unwrap_or(""));
            }
            Ok(())
        }
    }
}

/// `key=value` (the CLI's form) → `key:value` (the HTTP API's).
fn meta_query(pairs: &[String]) -> String {
    pairs
        .iter()
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            format!("&node-meta={}", enc(&format!("{k}:{v}")))
        })
        .collect()
}

fn str_of<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str().unwrap_or("")
}

fn kv_list(v: &Value) -> String {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

fn nodes(c: &Client, a: NodesArgs) -> CliResult {
    let mut q = format!("/v1/catalog/nodes?{}", meta_query(&a.node_meta));
    if let Some(f) = &a.filter {
        q.push_str(&format!("&filter={}", enc(f)));
    }
    let mut list = c.get_json(&q)?;
    if let Some(svc) = &a.service {
        let rows = c.get_json(&format!("/v1/catalog/service/{}", enc(svc)))?;
        let on: BTreeSet<&str> = rows
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| str_of(r, "Node"))
            .collect();
        let kept: Vec<Value> = list
            .as_array()
            .into_iter()
            .flatten()
            .filter(|n| on.contains(str_of(n, "Node")))
            .cloned()
            .collect();
        list = Value::Array(kept);
    }
    if a.format == Format::Json {
        return print_json(&list);
    }
    let nodes = list.as_array().cloned().unwrap_or_default();
    if nodes.is_empty() {
        eprintln!("No nodes match the given query - try expanding your search.");
        return Ok(());
    }
    let mut header = vec!["Node", "ID", "Address", "DC"];
    if a.detailed {
        header.extend(["TaggedAddresses", "Meta"]);
    }
    let mut rows = vec![header.into_iter().map(String::from).collect::<Vec<_>>()];
    for n in &nodes {
        let id = str_of(n, "ID");
        let mut row = vec![
            str_of(n, "Node").to_string(),
            if a.detailed {
                id.to_string()
            } else {
                id.chars().take(8).collect()
            },
            str_of(n, "Address").to_string(),
            str_of(n, "Datacenter").to_string(),
        ];
        if a.detailed {
            row.push(kv_list(&n["TaggedAddresses"]));
            row.push(kv_list(&n["Meta"]));
        }
        rows.push(row);
    }
    print!("{}", table(&rows));
    Ok(())
}

fn services(c: &Client, a: ServicesArgs) -> CliResult {
    // name → tags, from the whole catalog or from one node.
    let map: Vec<(String, Vec<String>)> = match &a.node {
        Some(node) => {
            let v = c.get_json(&format!("/v1/catalog/node/{}", enc(node)))?;
            let mut by_name: std::collections::BTreeMap<String, BTreeSet<String>> =
                Default::default();
            if let Some(svcs) = v["Services"].as_object() {
                for s in svcs.values() {
                    let tags = s["Tags"].as_array().into_iter().flatten();
                    by_name
                        .entry(str_of(s, "Service").to_string())
                        .or_default()
                        .extend(tags.filter_map(Value::as_str).map(String::from));
                }
            }
            by_name
                .into_iter()
                .map(|(k, v)| (k, v.into_iter().collect()))
                .collect()
        }
        None => {
            let v = c.get_json(&format!(
                "/v1/catalog/services?{}",
                meta_query(&a.node_meta)
            ))?;
            let mut out: Vec<(String, Vec<String>)> = v
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, tags)| {
                    let tags = tags.as_array().into_iter().flatten();
                    (
                        k.clone(),
                        tags.filter_map(Value::as_str).map(String::from).collect(),
                    )
                })
                .collect();
            out.sort();
            out
        }
    };
    if a.format == Format::Json {
        let obj: serde_json::Map<String, Value> =
            map.into_iter().map(|(k, v)| (k, Value::from(v))).collect();
        return print_json(&Value::Object(obj));
    }
    if map.is_empty() {
        eprintln!("No services match the given query - try expanding your search.");
        return Ok(());
    }
    if a.tags {
        let rows: Vec<Vec<String>> = map
            .into_iter()
            .map(|(name, tags)| vec![name, tags.join(",")])
            .collect();
        print!("{}", table(&rows));
    } else {
        for (name, _) in map {
            println!("{name}");
        }
    }
    Ok(())
}
