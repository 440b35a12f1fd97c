//! Service and check definitions as Consul agents accept them — API bodies
//! (`PUT /v1/agent/service/register`, `/v1/agent/check/register`) and
//! configuration files (JSON or HCL) — turned into catalog-shaped
//! `NodeService` and `HealthCheck` values with a parsed [`CheckSpec`].
//!
//! The parsing itself is `definition`'s (the same definitions `cairn
//! services register` reads), so both paths accept exactly the same input;
//! `parse` reads one service into the agent's shapes.
//! Anything the agent cannot honour is refused here, with a one-line reason,
//! before any state changes. A `Connect.SidecarService` is expanded here
//! too (`sidecar`), all but its port, which the local state picks.

use serde_json::{Map, Value};

use super::parse::{ServiceDef, decode, object, parse_service, with_spec};
use super::sidecar;
use super::spec::CheckSpec;
use crate::config_file::Sources;
use crate::definition::{check_definition_to_health_check, normalize, services_of, text};
use crate::error::{Error, Result};
use crate::structs::HealthCheck;

/// A service definition (one object, snake_case or PascalCase keys), with
/// its sidecar expanded.
pub fn service(def: Value, node: &str) -> Result<ServiceDef> {
    let mut def = object(def)?;
    let sidecar = sidecar::take(&mut def)?;
    let mut parsed = parse_service(def, node)?;
    if let Some(sc) = sidecar {
        parsed.sidecar = Some(Box::new(sidecar::define(&parsed.service, sc, node)?));
    }
    Ok(parsed)
}

/// A check definition for `PUT /v1/agent/check/register`: `Name` is
/// required, the ID defaults to it.
pub fn check(def: Value) -> Result<(HealthCheck, CheckSpec)> {
    let def = object(def)?;
    let name = text(def.get("Name"));
    if name.is_empty() {
        return Err(Error::bad("Missing check name"));
    }
    let service_id = text(def.get("ServiceID"));
    let check = check_definition_to_health_check(&def, name.clone(), name, &service_id);
    with_spec(decode(check)?)
}

/// What the configuration files hold for the agent: service definitions,
/// and node-level checks.
#[derive(Debug, Default)]
pub struct ConfigDir {
    pub services: Vec<ServiceDef>,
    pub checks: Vec<(HealthCheck, CheckSpec)>,
}

impl ConfigDir {
    /// What every check the files define is (services', sidecars', the
    /// node's).
    pub fn specs(&self) -> impl Iterator<Item = &CheckSpec> {
        let node = self.checks.iter().map(|(_, spec)| spec);
        self.services.iter().flat_map(ServiceDef::specs).chain(node)
    }
}

/// Reads the service and check definitions of every configuration file
/// (`config_file::Sources`: the files, then each directory's `.json` and
/// `.hcl` files in name order). A file that cannot be read or holds an
/// invalid definition stops the agent from starting (as it stops Consul)
/// and fails a reload; the other keys are `config_file`'s.
pub fn config_files(sources: &Sources, node: &str) -> anyhow::Result<ConfigDir> {
    let mut out = ConfigDir::default();
    for (f, top) in sources.documents().map_err(|e| anyhow::anyhow!(e.0))? {
        let what = f.display().to_string();
        let bad = |e: String| anyhow::anyhow!("{what}: {e}");
        let Value::Object(top) = normalize(Value::Object(top)) else {
            return Err(bad("not an object".into()));
        };
        if top.contains_key("Service") || top.contains_key("Services") {
            let mut svcs = Map::new();
            for k in ["Service", "Services"] {
                if let Some(v) = top.get(k) {
                    svcs.insert(k.into(), v.clone());
                }
            }
            for def in services_of(Value::Object(svcs)).map_err(|e| bad(e.0))? {
                out.services
                    .push(service(Value::Object(def), node).map_err(|e| bad(e.to_string()))?);
            }
        }
        for k in ["Check", "Checks"] {
            let defs = match top.get(k) {
                Some(Value::Array(a)) => a.clone(),
                Some(v) => vec![v.clone()],
                None => continue,
            };
            for def in defs {
                out.checks.push(check(def).map_err(|e| bad(e.to_string()))?);
            }
        }
    }
    Ok(out)
}

/// The definitions of one directory (what `--config-dir` was).
#[cfg(test)]
fn config_dir(dir: &std::path::Path, node: &str) -> anyhow::Result<ConfigDir> {
    config_files(
        &Sources {
            files: Vec::new(),
            dirs: vec![dir.to_path_buf()],
        },
        node,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structs::agent::SERF_CHECK_ID;
    use serde_json::json;

    #[test]
    fn api_service_with_checks() {
        let d = service(
            json!({"Name": "web", "Port": 80, "Tags": ["a"], "EnableTagOverride": true,
                   "Check": {"TTL": "10s", "Status": "passing"}}),
            "n1",
        )
        .unwrap();
        assert_eq!(d.service.id, "web");
        assert_eq!(d.service.service, "web");
        assert!(d.service.enable_tag_override);
        assert_eq!(d.checks.len(), 1);
        assert_eq!(d.checks[0].0.check_id, "service:web");
        assert_eq!(d.checks[0].0.status, "passing");
        let d = service(
            json!({"name": "db", "id": "db1", "checks": [
                {"id": "db-tcp", "tcp": "127.0.0.1:5432", "interval": "5s"},
                {"ttl": "30s"}]}),
            "n1",
        )
        .unwrap();
        assert_eq!(d.service.id, "db1");
        let ids: Vec<&str> = d.checks.iter().map(|(c, _)| c.check_id.as_str()).collect();
        assert_eq!(ids, ["db-tcp", "service:db1:2"]);
        assert_eq!(d.checks[1].0.status, "critical");
    }

    #[test]
    fn bad_services_are_refused_with_a_reason() {
        for (body, want) in [
            (json!([1]), "JSON object"),
            (json!({"Port": 80}), "missing a name"),
            (json!({"Name": "w", "Port": "x"}), "Request decode failed"),
            (json!({"Name": "w", "Port": 70000}), "Invalid service port"),
            (
                json!({"Name": "w", "Check": {"Interval": "1s"}}),
                "not supported",
            ),
            (
                json!({"Name": "w", "Check": {"TTL": "1s", "Status": "up"}}),
                "Invalid check status",
            ),
            (
                json!({"Name": "w", "Kind": "connect-proxy", "Port": 1}),
                "DestinationServiceName",
            ),
            (
                json!({"Name": "w", "Checks": [{"ID": "x", "TTL": "1s"}, {"ID": "x", "TTL": "2s"}]}),
                "unique",
            ),
        ] {
            let err = service(body.clone(), "n").unwrap_err().to_string();
            assert!(err.contains(want), "{body}: {err}");
        }
    }

    #[test]
    fn api_checks() {
        let (c, spec) = check(json!({"Name": "mem", "TTL": "5s", "ServiceID": "web"})).unwrap();
        assert_eq!(c.check_id, "mem");
        assert_eq!(c.service_id, "web");
        assert!(spec.is_ttl());
        let (c, _) =
            check(json!({"ID": "m2", "Name": "mem", "TCP": "x:1", "Interval": "1s"})).unwrap();
        assert_eq!(c.check_id, "m2");
        assert!(
            check(json!({"TTL": "5s"}))
                .unwrap_err()
                .to_string()
                .contains("Missing check name")
        );
        assert!(check(json!({"Name": SERF_CHECK_ID, "TTL": "5s"})).is_err());
    }

    #[test]
    fn config_dir_reads_json_and_hcl() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a.json"),
            r#"{"service": {"name": "api", "port": 9000, "check": {"ttl": "30s"}}}"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join("b.hcl"),
            "service {\n name = \"cache\"\n port = 6379\n}\nservice {\n name = \"queue\"\n}\n\
             check {\n id = \"disk\"\n name = \"disk\"\n ttl = \"1m\"\n}\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("agent.hcl"), "datacenter = \"dc1\"\n").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "ignored").unwrap();
        let c = config_dir(dir.path(), "n").unwrap();
        let names: Vec<&str> = c
            .services
            .iter()
            .map(|s| s.service.service.as_str())
            .collect();
        assert_eq!(names, ["api", "cache", "queue"]);
        assert_eq!(c.checks.len(), 1);
        assert_eq!(c.checks[0].0.check_id, "disk");
        // Consul's HCL for a sidecar: nested blocks, one upstream block.
        std::fs::write(
            dir.path().join("d.hcl"),
            include_str!("../../tests/fixtures/pay-sidecar.hcl"),
        )
        .unwrap();
        let c = config_dir(dir.path(), "n").unwrap();
        let pay = c.services.iter().find(|s| s.service.id == "pay").unwrap();
        let sc = &pay.sidecar.as_ref().expect("a sidecar").service;
        assert_eq!(sc.id, "pay-sidecar-proxy");
        assert_eq!(sc.proxy.local_service_port, 7000);
        assert_eq!(sc.proxy.upstreams[0].destination_name, "db");
        assert_eq!(sc.proxy.upstreams[0].local_bind_port, 9191);
        assert_eq!(
            sc.proxy.config.as_ref().unwrap()["handshake_timeout_ms"],
            1000
        );
        std::fs::write(dir.path().join("c.json"), r#"{"service": {"port": 1}}"#).unwrap();
        let err = config_dir(dir.path(), "n").unwrap_err().to_string();
        assert!(err.contains("c.json"), "{err}");
    }
}
