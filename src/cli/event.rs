//! `cairn event -name N [-node R] [-service S] [-tag T] [PAYLOAD]`, as
//! `consul event`: fires a user event (`PUT /v1/event/fire/:name`) and
//! prints its ID.

use clap::Args;

use super::{CliError, CliResult, Client, enc};

#[derive(Args, Debug)]
pub struct EventArgs {
    /// The event's name.
    #[arg(long)]
    name: String,
    /// Only nodes whose name matches this regular expression.
    #[arg(long)]
    node: Option<String>,
    /// Only nodes running a service that matches this regular expression.
    #[arg(long)]
    service: Option<String>,
    /// Only nodes with a matching -service tagged with a match of this.
    #[arg(long)]
    tag: Option<String>,
    /// The payload (small: name and payload at most 512 bytes).
    payload: Option<String>,
}

pub fn run(c: &Client, a: EventArgs) -> CliResult {
    if a.name.is_empty() {
        return Err(CliError("Event name must be specified".into()));
    }
    if a.tag.is_some() && a.service.is_none() {
        return Err(CliError(
            "Cannot provide tag filter without service filter.".into(),
        ));
    }
    let mut query = Vec::new();
    for (k, v) in [("node", &a.node), ("service", &a.service), ("tag", &a.tag)] {
        if let Some(v) = v {
            query.push(format!("{k}={}", enc(v)));
        }
    }
    let mut path = format!("/v1/event/fire/{}", enc(&a.name));
    if !query.is_empty() {
        path = format!("{path}?{}", query.join("&"));
    }
    let r = c.expect_ok(reqwest::Method::PUT, &path, a.payload)?;
    let id = r.json()?["ID"].as_str().unwrap_or_default().to_string();
    println!("Event ID: {id}");
    Ok(())
}
