//! Plays the shared conformance cases (`../shared/conformance`, see its
//! FORMAT.md) against decode → validate → validate_write → compile, with the
//! same comparison `run.py` uses. Fails if the directory is absent or empty.

use super::*;
use crate::config_check::{ConfigEntryError, decode_and_validate};
use crate::testing::{conformance_cases, first_diff, normalise};
use serde_json::Value;

const TRUST_DOMAIN: &str = "11111111-2222-3333-4444-555555555555.consul";

/// Cases believed wrong, by file name, each with the reason. None so far.
const KNOWN_WRONG: &[(&str, &str)] = &[];

/// Feature tags not served (cluster peering needs peers).
const SKIPPED_FEATURES: &[&str] = &[];

fn write(store: &mut MemoryEntries, body: &Value) -> Result<(), ConfigEntryError> {
    let entry = decode_and_validate(body)?;
    let change = EntryChange::Upsert(entry);
    validate_write(store, &change)?;
    store.apply(change);
    Ok(())
}

/// Ok(()) on pass, Err(reason) on failure.
fn run_chain_case(case: &Value) -> Result<(), String> {
    let expect_error = case["expect_error"].as_str();
    let mut store = MemoryEntries::new();
    for (i, body) in case["entries"].as_array().into_iter().flatten().enumerate() {
        if let Err(e) = write(&mut store, body) {
            return match expect_error {
                Some(want) if e.to_string().contains(want) => Ok(()),
                _ => Err(format!("write of entries[{i}] refused: {e}")),
            };
        }
    }
    let r = &case["request"];
    let mut req = CompileRequest::new(
        r["service"].as_str().unwrap_or_default(),
        r["compile_dc"].as_str().unwrap_or("dc1"),
        TRUST_DOMAIN,
    );
    req.server_datacenter = r["server_dc"].as_str().unwrap_or("dc1").into();
    if !r["overrides"].is_null() {
        let o = CompileOverrides::from_json(&r["overrides"]).map_err(|e| e.to_string())?;
        req = req.with_overrides(o);
    }
    let result = compile(&req, &store);
    match (result, expect_error) {
        (Err(e), Some(want)) if e.to_string().contains(want) => Ok(()),
        (Err(e), _) => Err(format!("compile failed: {e}")),
        (Ok(_), Some(want)) => Err(format!("compile succeeded; expected error {want:?}")),
        (Ok(chain), None) => {
            let actual = serde_json::to_value(&chain).expect("chain serializes");
            // CustomizationHash too: it is Consul's own value (its
            // clusters are named by it).
            let expected = case["expect"].clone();
            match first_diff(&normalise(&expected), &normalise(&actual), "") {
                None => Ok(()),
                Some(d) => Err(d),
            }
        }
    }
}

fn run_validation_case(case: &Value) -> Result<(), String> {
    let mut store = MemoryEntries::new();
    for (i, body) in case["entries"].as_array().into_iter().flatten().enumerate() {
        write(&mut store, body).map_err(|e| format!("write of entries[{i}] refused: {e}"))?;
    }
    let before: Vec<ConfigEntry> = Kind::ALL
        .into_iter()
        .flat_map(|k| store.list(k))
        .cloned()
        .collect();
    let want = case["expect_error"].as_str().unwrap_or_default();
    match write(&mut store, &case["bad"]) {
        Ok(()) => Err(format!("bad entry was accepted; expected {want:?}")),
        Err(e) if !e.to_string().contains(want) => {
            Err(format!("refused with {e:?}; expected {want:?}"))
        }
        Err(_) => {
            let after: Vec<ConfigEntry> = Kind::ALL
                .into_iter()
                .flat_map(|k| store.list(k))
                .cloned()
                .collect();
            (before == after)
                .then_some(())
                .ok_or_else(|| "store changed".to_string())
        }
    }
}

fn run_dir(dir: &str, run: fn(&Value) -> Result<(), String>) -> (usize, Vec<String>, usize) {
    let (mut passed, mut failed, mut skipped) = (0, Vec::new(), 0);
    for (name, case) in conformance_cases(dir) {
        let features: Vec<&str> = case["features"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if features.iter().any(|f| SKIPPED_FEATURES.contains(f))
            || KNOWN_WRONG.iter().any(|(n, _)| *n == name)
        {
            skipped += 1;
            continue;
        }
        match run(&case) {
            Ok(()) => passed += 1,
            Err(reason) => failed.push(format!("{dir}/{name}: {reason}")),
        }
    }
    println!(
        "{dir}: {passed} passed, {} failed, {skipped} skipped",
        failed.len()
    );
    (passed, failed, skipped)
}

#[test]
fn conformance_discovery_chain() {
    let (passed, failed, _) = run_dir("discovery-chain", run_chain_case);
    assert!(failed.is_empty(), "failures:\n{}", failed.join("\n"));
    assert!(passed > 0, "no discovery-chain case was played");
}

#[test]
fn conformance_config_validation() {
    let (passed, failed, _) = run_dir("config-validation", run_validation_case);
    assert!(failed.is_empty(), "failures:\n{}", failed.join("\n"));
    assert!(passed > 0, "no config-validation case was played");
}

#[test]
fn comparison_is_not_vacuous() {
    let e = serde_json::json!({"A": {"B": [1, {"C": "x"}]}, "Z": false});
    assert_eq!(first_diff(&normalise(&e), &normalise(&e), ""), None);
    let a = serde_json::json!({"A": {"B": [1, {"C": "y"}]}});
    assert!(first_diff(&normalise(&e), &normalise(&a), "").is_some());
    let a = serde_json::json!({"A": {"B": [1.001, {"C": "x"}]}, "Extra": 1});
    assert!(
        first_diff(&normalise(&e), &normalise(&a), "")
            .unwrap()
            .contains("Extra")
    );
}
