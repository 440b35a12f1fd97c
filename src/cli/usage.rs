//! `cairn operator usage instances`, as Consul's: the billable service
//! instances per datacenter and in total, then the billable services and
//! the Connect instances by kind, in tables laid out as Go's tabwriter
//! lays out Consul's (cells padded by six to the widest in the column).

use std::collections::BTreeMap;

use clap::{Args, Subcommand};
use serde_json::Value;

use super::{CliError, CliResult, Client};

#[derive(Subcommand, Debug)]
pub enum UsageCmd {
    /// Service instance usage: billable and Connect instances.
    Instances(InstancesArgs),
}

#[derive(Args, Debug)]
pub struct InstancesArgs {
    /// Only the billable services.
    #[arg(long, conflicts_with = "connect")]
    billable: bool,
    /// Only the Connect instances.
    #[arg(long)]
    connect: bool,
    /// Every known datacenter's counts, with a total.
    #[arg(long)]
    all_datacenters: bool,
}

pub fn run(c: &Client, cmd: UsageCmd) -> CliResult {
    let UsageCmd::Instances(a) = cmd;
    let path = if a.all_datacenters {
        "/v1/operator/usage?global"
    } else {
        "/v1/operator/usage"
    };
    let v = c
        .get_json(path)
        .map_err(|e| CliError(format!("Error fetching usage information: {}", e.0)))?;
    let usage: BTreeMap<String, Value> = v["Usage"]
        .as_object()
        .map(|m| m.clone().into_iter().collect())
        .unwrap_or_default();
    if !a.connect {
        let count = |u: &Value| u["BillableServiceInstances"].as_u64().unwrap_or(0);
        println!(
            "Billable Service Instances Total: {}",
            usage.values().map(count).sum::<u64>()
        );
        for (dc, u) in &usage {
            println!("{dc} Billable Service Instances: {}", count(u));
        }
        println!("\nBillable Services");
        println!("{}\n", counts(&usage, true, a.all_datacenters));
    }
    if !a.billable {
        println!("Connect Services");
        println!("{}", counts(&usage, false, a.all_datacenters));
    }
    Ok(())
}

/// The billable services' (or Connect instances') table, a row per
/// datacenter (and kind), with a total when datacenters are shown.
fn counts(usage: &BTreeMap<String, Value>, billable: bool, by_dc: bool) -> String {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut header = Vec::new();
    if by_dc {
        header.push("Datacenter".to_string());
    }
    header.push(if billable { "Services" } else { "Type" }.to_string());
    header.push("Service instances".to_string());
    rows.push(header);
    let (mut services, mut instances) = (0, 0);
    for (dc, u) in usage {
        let lines: Vec<(String, u64, u64)> = if billable {
            vec![(
                n(&u["Services"]).to_string(),
                n(&u["Services"]),
                n(&u["BillableServiceInstances"]),
            )]
        } else {
            let mut kinds: Vec<(String, u64, u64)> = u["ConnectServiceInstances"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(kind, count)| (kind.clone(), 0, n(count)))
                .collect();
            kinds.sort();
            kinds
        };
        for (label, s, i) in lines {
            services += s;
            instances += i;
            let mut row = Vec::new();
            if by_dc {
                row.push(dc.clone());
            }
            row.extend([label, i.to_string()]);
            rows.push(row);
        }
    }
    if by_dc {
        rows.push(vec![String::new(); 3]);
        let total = if billable {
            services.to_string()
        } else {
            String::new()
        };
        rows.push(vec!["Total".into(), total, instances.to_string()]);
    }
    tabwrite(&rows).trim().to_string()
}

/// Go's tabwriter (minwidth 0, padding 6, spaces): every cell but a row's
/// last padded to its column's widest cell plus six.
fn tabwrite(rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = Vec::new();
    for r in rows {
        for (i, cell) in r.iter().enumerate().take(r.len().saturating_sub(1)) {
            if widths.len() <= i {
                widths.push(0);
            }
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        for (i, cell) in r.iter().enumerate() {
            if i + 1 < r.len() {
                out.push_str(&format!("{cell:<w$}", w = widths[i] + 6));
            } else {
                out.push_str(cell);
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Consul's own table (command/operator/usage/instances,
    /// usage_instances_ce_test.go, TestUsageInstances_formatServiceCounts).
    #[test]
    fn tables_as_consul_lays_them_out() {
        let dc1 = json!({"Services": 10, "ServiceInstances": 35, "BillableServiceInstances": 20,
            "ConnectServiceInstances": {"connect-native": 1, "connect-proxy": 3,
                "ingress-gateway": 4, "mesh-gateway": 2, "terminating-gateway": 5}});
        let dc2 = json!({"Services": 23, "ServiceInstances": 11, "BillableServiceInstances": 33,
            "ConnectServiceInstances": {"connect-native": 9, "connect-proxy": 8,
                "ingress-gateway": 7, "mesh-gateway": 6, "terminating-gateway": 0}});
        let basic = BTreeMap::from([("dc1".to_string(), dc1.clone())]);
        assert_eq!(
            counts(&basic, true, false),
            "Services      Service instances\n10            20"
        );
        assert_eq!(
            counts(&basic, false, false),
            "Type                     Service instances\n\
             connect-native           1\n\
             connect-proxy            3\n\
             ingress-gateway          4\n\
             mesh-gateway             2\n\
             terminating-gateway      5"
        );
        let multi = BTreeMap::from([("dc1".to_string(), dc1), ("dc2".to_string(), dc2)]);
        assert_eq!(
            counts(&multi, true, true),
            "Datacenter      Services      Service instances\n\
             dc1             10            20\n\
             dc2             23            33\n\
             \x20                             \n\
             Total           33            53"
        );
        assert_eq!(
            counts(&multi, false, true),
            "Datacenter      Type                     Service instances\n\
             dc1             connect-native           1\n\
             dc1             connect-proxy            3\n\
             dc1             ingress-gateway          4\n\
             dc1             mesh-gateway             2\n\
             dc1             terminating-gateway      5\n\
             dc2             connect-native           9\n\
             dc2             connect-proxy            8\n\
             dc2             ingress-gateway          7\n\
             dc2             mesh-gateway             6\n\
             dc2             terminating-gateway      0\n\
             \x20                                        \n\
             Total                                    45"
        );
    }
}
