//! Plays the shared merge-central-config cases
//! (`../shared/conformance/merge-central-config`, see its FORMAT.md) against
//! the state store and the merge, without HTTP: entries and registrations are
//! applied as Raft commands, the query's rows are built here in Consul's row
//! shapes, and each JSON-pointer check is compared with `run.py`'s
//! normalisation. Skips quietly if the directory is absent.
//!
//! Catalog rows are the endpoint's own `ServiceNodeRow`; a health row is
//! `{Node, Service, Checks}` as the health endpoint writes it.

use serde_json::{Value, json};

use super::merge_instances;
use crate::state::catalog::{Instance, service_instances};
use crate::state::{Command, Response, State, apply_command};
use crate::structs::catalog::RegisterRequest;
use crate::structs::rows::ServiceNodeRow;
use crate::testing::{conformance_cases, first_diff, normalise};

/// Cases believed wrong, by file name, each with the reason. None so far.
const KNOWN_WRONG: &[(&str, &str)] = &[];

/// Builds the state a case describes; an error names the refused step.
fn build_state(case: &Value) -> Result<State, String> {
    let mut st = State::default();
    let mut index = 1;
    for (i, e) in case["entries"].as_array().into_iter().flatten().enumerate() {
        let cmd = Command::ConfigSet {
            entry: e.clone(),
            cas: None,
        };
        match apply_command(&mut st, index, &cmd).0 {
            Response::Bool(true) => {}
            other => return Err(format!("entries[{i}] refused: {other:?}")),
        }
        index += 1;
    }
    for (i, r) in case["register"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let req: RegisterRequest =
            serde_json::from_value(r.clone()).map_err(|e| format!("register[{i}]: {e}"))?;
        match apply_command(&mut st, index, &Command::Register(Box::new(req))).0 {
            Response::Ok => {}
            other => return Err(format!("register[{i}] refused: {other:?}")),
        }
        index += 1;
    }
    Ok(st)
}

/// `/v1/health/{service,connect}/:s` row: `{Node, Service, Checks}`.
fn health_row(i: &Instance) -> Value {
    json!({ "Node": &*i.node, "Service": &*i.service, "Checks": i.checks })
}

/// The answer `query` would give on `st`.
fn answer(st: &State, query: &str) -> Result<Value, String> {
    let (path, q) = query.split_once('?').unwrap_or((query, ""));
    let merge = q
        .split('&')
        .any(|p| p.split('=').next() == Some("merge-central-config"));
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let [_, area, what, name] = parts[..] else {
        return Err(format!("unsupported query {query}"));
    };
    let connect = match what {
        "service" => false,
        "connect" => true,
        _ => return Err(format!("unsupported query {query}")),
    };
    let mut instances = service_instances(st, name, connect);
    if merge {
        merge_instances(st, &mut instances);
    }
    let rows = instances
        .iter()
        .map(|i| match area {
            "health" => Ok(health_row(i)),
            "catalog" => Ok(json!(ServiceNodeRow::new(&i.node, &i.service, "dc1"))),
            _ => Err(format!("unsupported query {query}")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Value::Array(rows))
}

fn run(case: &Value) -> Result<(), String> {
    let st = build_state(case)?;
    let body = answer(&st, case["query"].as_str().ok_or("case has no query")?)?;
    for check in case["expect"].as_array().into_iter().flatten() {
        let pointer = check["pointer"].as_str().unwrap_or("");
        let actual = body.pointer(pointer).cloned().unwrap_or(Value::Null);
        let (e, a) = (normalise(&check["value"]), normalise(&actual));
        if first_diff(&e, &a, "").is_some() {
            return Err(format!("at {pointer}: expected {e}, got {a}"));
        }
    }
    Ok(())
}

#[test]
fn merge_central_config_conformance() {
    let all = conformance_cases("merge-central-config");
    let mut failures = Vec::new();
    let mut passed = 0;
    for (name, case) in &all {
        if case["expect_error"].is_string() {
            failures.push(format!("{name}: expect_error cases are not supported here"));
            continue;
        }
        match (run(case), KNOWN_WRONG.iter().find(|(n, _)| n == name)) {
            (Ok(()), None) => passed += 1,
            (Ok(()), Some(_)) => failures.push(format!("{name}: passes; drop it from KNOWN_WRONG")),
            (Err(_), Some(_)) => {}
            (Err(e), None) => failures.push(format!("{name}: {e}")),
        }
    }
    eprintln!("merge-central-config: {passed}/{} passed", all.len());
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    assert!(passed > 0, "no merge-central-config case was played");
}
