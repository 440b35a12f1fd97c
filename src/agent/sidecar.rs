//! `Connect.SidecarService`: a service definition that carries its own
//! sidecar proxy, expanded into a second service registered alongside it
//! with Consul's defaults, so definitions written for Consul agents work
//! unchanged.
//!
//! The defaults (Consul's documented ones): ID `<parent-id>-sidecar-proxy`
//! (fixed: the agent finds the sidecar by it), name
//! `<parent-name>-sidecar-proxy`, kind `connect-proxy` (fixed), the
//! parent's tags and meta when the sidecar sets none, a port from
//! [`MIN_PORT`]..=[`MAX_PORT`], `Proxy.DestinationServiceName`/`ID` and
//! `LocalServicePort` from the parent, `LocalServiceAddress` 127.0.0.1, and
//! — unless the sidecar names its own checks — a TCP check on the proxy's
//! listener and an alias check mirroring the parent.
//!
//! Expansion is split in two because the port depends on the agent's state:
//! [`define`] (pure, at parse time: everything but the port, so bad input is
//! refused before anything changes) and [`finish`] (once the local state
//! picked a port with `local::sidecar_port`, under its lock).

use serde_json::{Map, Value, json};

use super::parse::{ServiceDef, SidecarDef, with_spec};
use crate::definition::check_definition_to_health_check;
use crate::error::{Error, Result};
use crate::structs::{HealthCheck, NodeService};

/// Consul's default sidecar port range (`sidecar_min_port`,
/// `sidecar_max_port`).
pub const MIN_PORT: u16 = 21000;
pub const MAX_PORT: u16 = 21255;

const KIND: &str = "connect-proxy";

/// The ID a parent's sidecar always has.
pub fn sidecar_id(parent_id: &str) -> String {
    format!("{parent_id}-sidecar-proxy")
}

fn is_unset(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        Some(Value::Object(o)) => o.is_empty(),
        Some(Value::Number(n)) => n.as_i64() == Some(0),
        Some(Value::Bool(_)) => false,
    }
}

/// Sets `key` unless the definition already sets it.
fn default(m: &mut Map<String, Value>, key: &str, v: Value) {
    if is_unset(m.get(key)) {
        m.insert(key.into(), v);
    }
}

/// Takes `Connect.SidecarService` out of a (normalized) service definition:
/// the parent is registered without it, as Consul's agent does.
pub fn take(def: &mut Map<String, Value>) -> Result<Option<Map<String, Value>>> {
    let Some(Value::Object(connect)) = def.get_mut("Connect") else {
        return Ok(None);
    };
    match connect.remove("SidecarService") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(_) => Err(Error::bad(
            "Connect.SidecarService must be a single service definition object",
        )),
    }
}

/// Applies Consul's defaults to a sidecar definition of `parent` and parses
/// it; refuses what Consul refuses on a sidecar (another ID or kind, a
/// nested sidecar, Connect-native).
pub fn define(parent: &NodeService, mut m: Map<String, Value>, node: &str) -> Result<SidecarDef> {
    if parent.is_mesh_kind() {
        return Err(Error::bad(format!(
            "Connect.SidecarService cannot be set on a {:?} service",
            parent.kind
        )));
    }
    let id = sidecar_id(&parent.id);
    let given = super::parse::text_field(&m, "ID");
    if !given.is_empty() && given != id {
        return Err(Error::bad(format!(
            "Connect.SidecarService cannot set its ID: it is always {id:?}"
        )));
    }
    let kind = super::parse::text_field(&m, "Kind");
    if !kind.is_empty() && kind != KIND {
        return Err(Error::bad(format!(
            "Connect.SidecarService cannot set Kind {kind:?}: a sidecar is a {KIND}"
        )));
    }
    if let Some(Value::Object(c)) = m.get("Connect") {
        if c.get("SidecarService").is_some_and(|v| !v.is_null()) {
            return Err(Error::bad(
                "Connect.SidecarService cannot be nested in another sidecar",
            ));
        }
        if c.get("Native") == Some(&Value::Bool(true)) {
            return Err(Error::bad(
                "Connect.SidecarService cannot be Connect-native: a sidecar is a proxy",
            ));
        }
    }
    m.insert("ID".into(), id.into());
    m.insert("Kind".into(), KIND.into());
    // A sidecar definition may name itself `Name` or `Service`.
    if is_unset(m.get("Name")) {
        default(
            &mut m,
            "Service",
            format!("{}-sidecar-proxy", parent.service).into(),
        );
    }
    default(&mut m, "Tags", json!(parent.tags));
    default(&mut m, "Meta", json!(parent.meta));
    let auto_port = is_unset(m.get("Port"));
    if auto_port {
        // Only to pass the catalog's validation (a proxy needs a port);
        // the real one is chosen at registration.
        m.insert("Port".into(), MIN_PORT.into());
    }
    let proxy = match m.remove("Proxy") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(p)) => p,
        Some(_) => {
            return Err(Error::bad("Connect.SidecarService.Proxy must be an object"));
        }
    };
    let mut proxy = proxy;
    default(
        &mut proxy,
        "DestinationServiceName",
        parent.service.clone().into(),
    );
    default(&mut proxy, "DestinationServiceID", parent.id.clone().into());
    default(&mut proxy, "LocalServiceAddress", "127.0.0.1".into());
    default(&mut proxy, "LocalServicePort", parent.port.into());
    m.insert("Proxy".into(), Value::Object(proxy));
    let own_checks = !is_unset(m.get("Check")) || !is_unset(m.get("Checks"));
    let parsed: ServiceDef = super::parse::parse_service(m, node)?;
    let mut service = parsed.service;
    if auto_port {
        service.port = 0;
    }
    Ok(SidecarDef {
        service,
        checks: own_checks.then_some(parsed.checks),
    })
}

/// The sidecar as registered, on `port`, with Consul's default checks
/// unless it brought its own: a TCP check on the proxy's listener (its
/// address, else the local service address) every 10 s, and an alias check
/// of the parent.
pub fn finish(sd: SidecarDef, port: u16) -> Result<ServiceDef> {
    let mut service = sd.service;
    service.port = i64::from(port);
    let checks = match sd.checks {
        Some(c) => c,
        None => {
            let addr = [
                service.address.as_str(),
                service.proxy.local_service_address.as_str(),
            ]
            .into_iter()
            .find(|a| !a.is_empty())
            .unwrap_or("127.0.0.1");
            let parent = &service.proxy.destination_service_id;
            let defs = [
                json!({"Name": "Connect Sidecar Listening",
                       "TCP": format!("{addr}:{port}"), "Interval": "10s"}),
                json!({"Name": format!("Connect Sidecar Aliasing {parent}"),
                       "AliasService": parent}),
            ];
            defs.iter()
                .enumerate()
                .map(|(i, d)| {
                    let Value::Object(d) = d else {
                        unreachable!("a literal object")
                    };
                    let c = check_definition_to_health_check(
                        d,
                        format!("service:{}:{}", service.id, i + 1),
                        String::new(),
                        &service.id,
                    );
                    let c: HealthCheck = serde_json::from_value(c)
                        .map_err(|e| Error::Internal(format!("sidecar check: {e}")))?;
                    with_spec(c)
                })
                .collect::<Result<Vec<_>>>()?
        }
    };
    Ok(ServiceDef {
        service,
        checks,
        sidecar: None,
    })
}

#[cfg(test)]
mod tests {
    use super::super::define::service;
    use super::super::local::fixtures::{add, svc, tables};
    use super::super::local::sidecar_port as choose_port;
    use super::super::spec::Probe;
    use super::*;
    use std::time::Instant;

    fn expand(body: Value) -> (ServiceDef, SidecarDef) {
        let mut d = service(body, "n1").unwrap();
        let sd = *d.sidecar.take().expect("a sidecar");
        (d, sd)
    }

    #[test]
    fn minimal_sidecar_gets_consuls_defaults() {
        let (parent, sd) = expand(json!({
            "Name": "web", "ID": "web-1", "Port": 8080, "Tags": ["a"], "Meta": {"k": "v"},
            "Connect": {"SidecarService": {}}
        }));
        assert!(parent.service.connect.get("SidecarService").is_none());
        assert_eq!(parent.service.kind, "");
        let s = &sd.service;
        assert_eq!(s.id, "web-1-sidecar-proxy");
        assert_eq!(s.service, "web-sidecar-proxy");
        assert_eq!(s.kind, "connect-proxy");
        assert_eq!(s.port, 0, "assigned later");
        assert_eq!(s.tags, ["a"]);
        assert_eq!(s.meta.get("k").map(String::as_str), Some("v"));
        assert_eq!(s.proxy.destination_service_name, "web");
        assert_eq!(s.proxy.destination_service_id, "web-1");
        assert_eq!(s.proxy.local_service_address, "127.0.0.1");
        assert_eq!(s.proxy.local_service_port, 8080);
        assert!(sd.checks.is_none());

        let done = finish(sd, 21003).unwrap();
        assert_eq!(done.service.port, 21003);
        let ids: Vec<&str> = done
            .checks
            .iter()
            .map(|(c, _)| c.check_id.as_str())
            .collect();
        assert_eq!(
            ids,
            [
                "service:web-1-sidecar-proxy:1",
                "service:web-1-sidecar-proxy:2"
            ]
        );
        let (tcp, tcp_spec) = &done.checks[0];
        assert_eq!(tcp.name, "Connect Sidecar Listening");
        assert_eq!(tcp_spec.probe, Probe::Tcp("127.0.0.1:21003".into()));
        assert_eq!(tcp_spec.interval, std::time::Duration::from_secs(10));
        let (alias, alias_spec) = &done.checks[1];
        assert_eq!(alias.name, "Connect Sidecar Aliasing web-1");
        assert_eq!(alias.check_type, "alias");
        assert_eq!(alias_spec.probe, Probe::Alias("web-1".into()));
    }

    #[test]
    fn the_sidecars_own_fields_win() {
        let (_, sd) = expand(json!({
            "name": "web", "port": 8080, "tags": ["a"], "meta": {"k": "v"},
            "connect": {"sidecar_service": {
                "name": "edge", "port": 9999, "tags": ["b"], "meta": {"m": "n"},
                "address": "10.0.0.5",
                "proxy": {
                    "local_service_port": 8081,
                    "upstreams": {"destination_name": "db", "local_bind_port": 9191},
                    "config": {"handshake_timeout_ms": 1000}
                },
                "checks": [{"ttl": "30s"}]
            }}
        }));
        let s = &sd.service;
        assert_eq!(s.service, "edge");
        assert_eq!(s.port, 9999);
        assert_eq!(s.tags, ["b"]);
        assert!(!s.meta.contains_key("k"));
        assert_eq!(s.proxy.local_service_port, 8081);
        assert_eq!(s.proxy.destination_service_name, "web");
        assert_eq!(s.proxy.upstreams.len(), 1, "one HCL block is one upstream");
        assert_eq!(s.proxy.upstreams[0].destination_name, "db");
        assert_eq!(
            s.proxy.config.as_ref().unwrap()["handshake_timeout_ms"],
            1000
        );
        let checks = sd.checks.as_ref().expect("its own checks");
        assert_eq!(checks.len(), 1);
        assert_eq!(checks[0].0.check_id, "service:web-sidecar-proxy");
        let done = finish(sd, 9999).unwrap();
        assert_eq!(done.checks.len(), 1);
    }

    #[test]
    fn default_tcp_check_targets_the_sidecar_address() {
        let (_, sd) = expand(json!({
            "Name": "web", "Connect": {"SidecarService": {"Address": "10.1.1.1"}}
        }));
        let done = finish(sd, 21000).unwrap();
        assert_eq!(done.checks[0].1.probe, Probe::Tcp("10.1.1.1:21000".into()));
    }

    #[test]
    fn what_a_sidecar_cannot_be_is_refused() {
        for (sc, want) in [
            (json!({"ID": "mine"}), "cannot set its ID"),
            (json!({"Kind": "mesh-gateway"}), "cannot set Kind"),
            (
                json!({"Connect": {"SidecarService": {}}}),
                "cannot be nested",
            ),
            (json!({"Connect": {"Native": true}}), "Connect-native"),
            (json!({"Proxy": 3}), "Proxy must be an object"),
            (json!([{}]), "single service definition"),
            (json!({"Port": 70000}), "Invalid service port"),
        ] {
            let body = json!({"Name": "web", "Connect": {"SidecarService": sc.clone()}});
            let err = service(body, "n").unwrap_err().to_string();
            assert!(err.contains(want), "{sc}: {err}");
        }
        // The default ID may be spelled out; a proxy cannot have a sidecar.
        assert!(
            service(
                json!({"Name": "web", "Connect": {"SidecarService": {"ID": "web-sidecar-proxy"}}}),
                "n"
            )
            .is_ok()
        );
        let err = service(
            json!({"Name": "p", "Kind": "connect-proxy", "Port": 1,
                   "Proxy": {"DestinationServiceName": "x"},
                   "Connect": {"SidecarService": {}}}),
            "n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("cannot be set on"), "{err}");
    }

    #[test]
    fn ports_are_the_first_free_kept_on_reregistration_and_hinted() {
        let mut t = tables();
        let now = Instant::now();
        assert_eq!(
            choose_port(&t, "a-sidecar-proxy", "a", 80, None),
            Some(MIN_PORT)
        );
        let mut other = svc("other", &[]);
        other.port = i64::from(MIN_PORT);
        add(&mut t, other, vec![], now);
        assert_eq!(
            choose_port(&t, "a-sidecar-proxy", "a", 80, None),
            Some(MIN_PORT + 1)
        );
        // The parent's own new port counts as taken.
        assert_eq!(
            choose_port(&t, "a-sidecar-proxy", "a", i64::from(MIN_PORT + 1), None),
            Some(MIN_PORT + 2)
        );
        let mut sc = svc("a-sidecar-proxy", &[]);
        sc.port = i64::from(MIN_PORT + 7);
        add(&mut t, sc, vec![], now);
        assert_eq!(
            choose_port(&t, "a-sidecar-proxy", "a", 80, None),
            Some(MIN_PORT + 7),
            "kept"
        );
        assert_eq!(
            choose_port(&t, "b-sidecar-proxy", "b", 80, Some(MIN_PORT + 9)),
            Some(MIN_PORT + 9),
            "hint"
        );
        assert_eq!(
            choose_port(&t, "b-sidecar-proxy", "b", 80, Some(MIN_PORT + 7)),
            Some(MIN_PORT + 1),
            "a hint someone else holds is ignored"
        );
        assert_eq!(
            choose_port(&t, "b-sidecar-proxy", "b", 80, Some(80)),
            Some(MIN_PORT + 1),
            "a hint out of range is ignored"
        );
        for p in MIN_PORT..=MAX_PORT {
            let mut s = svc(&format!("s{p}"), &[]);
            s.port = i64::from(p);
            add(&mut t, s, vec![], now);
        }
        assert_eq!(choose_port(&t, "c-sidecar-proxy", "c", 80, None), None);
    }
}
