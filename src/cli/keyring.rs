//! `cairn keyring -list|-install|-use|-remove KEY`, as `consul keyring`:
//! the servers' keyrings (the Raft transport's `--encrypt` key) listed per
//! ring, and the rotation steps sent as Consul sends them (the servers
//! say whether they do them).

use clap::Args;
use serde_json::json;

use super::{CliError, CliResult, Client};

#[derive(Args, Debug)]
pub struct KeyringArgs {
    /// List every key in use, per ring.
    #[arg(long)]
    list: bool,
    /// Install a new key on every server.
    #[arg(long)]
    install: Option<String>,
    /// Make an installed key the primary one.
    #[arg(long = "use")]
    use_key: Option<String>,
    /// Remove a key that is not the primary one.
    #[arg(long)]
    remove: Option<String>,
}

pub fn run(c: &Client, a: KeyringArgs) -> CliResult {
    let actions = [
        a.list.then_some((reqwest::Method::GET, None)),
        a.install.map(|k| (reqwest::Method::POST, Some(k))),
        a.use_key.map(|k| (reqwest::Method::PUT, Some(k))),
        a.remove.map(|k| (reqwest::Method::DELETE, Some(k))),
    ];
    let mut chosen = actions.into_iter().flatten();
    let Some((method, key)) = chosen.next() else {
        return Err(CliError(
            "Usage: cairn keyring [-list | -install KEY | -use KEY | -remove KEY]".into(),
        ));
    };
    if chosen.next().is_some() {
        return Err(CliError("Only a single action is allowed".into()));
    }
    let error = |e: CliError| CliError(format!("error: {}", e.0));
    let Some(key) = key else {
        println!("==> Gathering installed encryption keys...");
        let rings = c.get_json("/v1/operator/keyring").map_err(error)?;
        for ring in rings.as_array().into_iter().flatten() {
            let pool = if ring["WAN"] == true {
                "WAN".to_string()
            } else {
                format!("{} (LAN)", ring["Datacenter"].as_str().unwrap_or(""))
            };
            println!("\n{pool}:");
            let mut keys: Vec<_> = ring["Keys"].as_object().into_iter().flatten().collect();
            keys.sort_by(|a, b| a.0.cmp(b.0));
            for (key, n) in keys {
                println!("  {key} [{n}/{}]", ring["NumNodes"]);
            }
        }
        return Ok(());
    };
    println!(
        "==> {}",
        match method {
            reqwest::Method::POST => "Installing new gossip encryption key...",
            reqwest::Method::PUT => "Changing primary gossip encryption key...",
            _ => "Removing gossip encryption key...",
        }
    );
    c.expect_ok(
        method,
        "/v1/operator/keyring",
        Some(json!({ "Key": key }).to_string()),
    )
    .map_err(error)?;
    Ok(())
}
