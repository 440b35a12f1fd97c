//! `cairn services register FILE` and `cairn services deregister ID`.
//!
//! As Consul's, these hand the definition to the agent the CLI talks to
//! (`PUT /v1/agent/service/register`, `/deregister/:id`), a client agent or
//! a server (every server is the agent of its own node): the agent runs
//! the checks and keeps the catalog in step. Registering straight into the
//! catalog on the server's node, as the CLI did before servers were
//! agents, would now be undone by that node's anti-entropy.
//!
//! Definitions are JSON (`{"service": {...}}`, `{"services": [...]}` or a
//! bare service object) or HCL (`service { name = "web" check { ... } }`,
//! where one block is one object and repeated blocks a list), with
//! Consul's snake_case keys or the API's PascalCase ones.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::Value;

use super::{CliError, CliResult, Client, enc};
use crate::definition::{read_definitions, text};

#[derive(Subcommand, Debug)]
pub enum ServicesCmd {
    /// Register the services of a definition file (JSON or HCL).
    Register(RegisterArgs),
    /// Deregister a service by ID (or the services of a definition file).
    Deregister(DeregisterArgs),
}

#[derive(Args, Debug)]
pub struct RegisterArgs {
    /// A service definition file.
    file: PathBuf,
}

#[derive(Args, Debug)]
pub struct DeregisterArgs {
    /// The service ID (or a definition file).
    target: Option<String>,
    /// The service ID, as Consul's `-id`.
    #[arg(long)]
    id: Option<String>,
}

pub fn run(c: &Client, cmd: ServicesCmd) -> CliResult {
    match cmd {
        ServicesCmd::Register(a) => register(c, a),
        ServicesCmd::Deregister(a) => deregister(c, a),
    }
}

fn register(c: &Client, a: RegisterArgs) -> CliResult {
    let defs = read_definitions(&a.file)?;
    for svc in defs {
        let name = text(svc.get("Name").or(svc.get("Service")));
        c.expect_ok(
            reqwest::Method::PUT,
            "/v1/agent/service/register",
            Some(Value::Object(svc).to_string()),
        )
        .map_err(|e| CliError(format!("Error registering service {name:?}: {}", e.0)))?;
        println!("Registered service: {name}");
    }
    Ok(())
}

fn deregister(c: &Client, a: DeregisterArgs) -> CliResult {
    let ids: Vec<String> = match (a.id, a.target) {
        (Some(id), None) => vec![id],
        (None, Some(t)) if std::path::Path::new(&t).is_file() => {
            read_definitions(&PathBuf::from(&t))?
                .into_iter()
                .map(|s| {
                    let id = text(s.get("ID"));
                    if id.is_empty() {
                        text(s.get("Name").or(s.get("Service")))
                    } else {
                        id
                    }
                })
                .collect()
        }
        (None, Some(id)) => vec![id],
        (Some(_), Some(_)) => {
            return Err(CliError("Give either a service ID or -id, not both".into()));
        }
        (None, None) => {
            return Err(CliError(
                "Usage: cairn services deregister ID (or -id=ID, or a definition FILE)".into(),
            ));
        }
    };
    for id in ids {
        c.expect_ok(
            reqwest::Method::PUT,
            &format!("/v1/agent/service/deregister/{}", enc(&id)),
            None,
        )
        .map_err(|e| CliError(format!("Error deregistering service {id:?}: {}", e.0)))?;
        println!("Deregistered service: {id}");
    }
    Ok(())
}
