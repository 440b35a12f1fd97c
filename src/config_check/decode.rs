//! Decoding a config entry from a request body as Consul's HTTP API does:
//! member names match case-insensitively and with or without underscores
//! (`ConnectTimeout`, `connect_timeout`), free-form maps keep their keys,
//! unknown members are refused, then the typed structs take over.

use super::ConfigEntryError;
use crate::structs::config_entry::shape::{self, Shape};
use crate::structs::config_entry::{ConfigEntry, Kind};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// Decodes one entry of any served kind from a `PUT /v1/config` body.
pub fn decode_entry(body: &Value) -> Result<ConfigEntry, ConfigEntryError> {
    let err = |m: String| ConfigEntryError::Decode(m);
    let Value::Object(obj) = body else {
        return Err(err("body must be a JSON object".into()));
    };
    let kind_val = obj
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("kind"))
        .map(|(_, v)| v)
        .ok_or_else(|| err("Payload does not contain a kind/Kind key at the top level".into()))?;
    let Value::String(kind_str) = kind_val else {
        return Err(err("Kind value in payload is not a string".into()));
    };
    let kind: Kind = kind_str.parse().map_err(err)?;

    let mut unknown = Vec::new();
    let mut v = canonicalize(body, shape::for_kind(kind), "", &mut unknown);
    if !unknown.is_empty() {
        let msgs: Vec<String> = unknown
            .iter()
            .map(|k| format!("invalid config key {k:?}"))
            .collect();
        return Err(err(msgs.join("; ")));
    }
    if let Value::Object(m) = &mut v {
        // The kind is canonical from here on; indexes are the store's to set.
        m.insert("Kind".into(), kind.as_str().into());
        m.remove("CreateIndex");
        m.remove("ModifyIndex");
    }

    fn typed<T: DeserializeOwned>(v: Value) -> Result<T, ConfigEntryError> {
        serde_json::from_value(v).map_err(|e| ConfigEntryError::Decode(e.to_string()))
    }
    Ok(match kind {
        Kind::ProxyDefaults => ConfigEntry::ProxyDefaults(typed(v)?),
        Kind::ServiceDefaults => ConfigEntry::ServiceDefaults(typed(v)?),
        Kind::ServiceRouter => ConfigEntry::ServiceRouter(typed(v)?),
        Kind::ServiceSplitter => ConfigEntry::ServiceSplitter(typed(v)?),
        Kind::ServiceResolver => ConfigEntry::ServiceResolver(typed(v)?),
        Kind::ServiceIntentions => ConfigEntry::ServiceIntentions(typed(v)?),
        Kind::Mesh => ConfigEntry::Mesh(typed(v)?),
        Kind::IngressGateway => ConfigEntry::IngressGateway(typed(v)?),
        Kind::TerminatingGateway => ConfigEntry::TerminatingGateway(typed(v)?),
        Kind::ExportedServices => ConfigEntry::ExportedServices(typed(v)?),
    })
}

/// How Consul matches a member name: case-insensitive, `_` ignored.
fn fold(key: &str) -> String {
    key.chars()
        .filter(|c| *c != '_')
        .flat_map(char::to_lowercase)
        .collect()
}

/// The dotted path of member `key` under `path`, for error messages.
fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Rewrites member names of structured objects to their canonical spelling
/// and drops nulls (Go leaves the zero value); unknown members are collected
/// by their path. Values of the wrong JSON type are passed through for serde
/// to refuse with a precise message.
fn canonicalize(v: &Value, shape: &Shape, path: &str, unknown: &mut Vec<String>) -> Value {
    match (v, shape) {
        (Value::Object(m), Shape::Obj(fields)) => {
            let mut out = Map::new();
            for (k, x) in m {
                if x.is_null() {
                    continue;
                }
                let folded = fold(k);
                match fields.iter().find(|(name, _)| fold(name) == folded) {
                    Some((name, s)) => {
                        let sub = join(path, name);
                        out.insert((*name).to_string(), canonicalize(x, s, &sub, unknown));
                    }
                    // The kind selects the struct; it is not one of its members.
                    None if path.is_empty() && folded == "kind" => {}
                    None => unknown.push(join(path, k)),
                }
            }
            Value::Object(out)
        }
        (Value::Object(m), Shape::Map(s)) => Value::Object(
            m.iter()
                .map(|(k, x)| {
                    let sub = format!("{path}[{k}]");
                    (k.clone(), canonicalize(x, s, &sub, unknown))
                })
                .collect(),
        ),
        (Value::Array(a), Shape::List(s)) => Value::Array(
            a.iter()
                .enumerate()
                .map(|(i, x)| canonicalize(x, s, &format!("{path}[{i}]"), unknown))
                .collect(),
        ),
        (v, _) => v.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structs::config_entry::Duration;
    use serde_json::json;

    #[test]
    fn a_chain_entry_relates_the_services_it_sends_traffic_to() {
        let related = |v| decode_entry(&v).unwrap().related_services().join(",");
        let router = json!({"Kind": "service-router", "Name": "web", "Routes": [
            {"Destination": {"Service": "b"}}, {"Destination": {"Service": "a"}},
            {"Destination": {"Service": "web"}}, {"Destination": {"Service": "a"}}]});
        assert_eq!(related(router), "a,b");
        let splitter = json!({"Kind": "service-splitter", "Name": "web", "Splits": [
            {"Weight": 50}, {"Weight": 50, "Service": "c"}]});
        assert_eq!(related(splitter), "c");
        let resolver = json!({"Kind": "service-resolver", "Name": "web",
            "Redirect": {"Service": "r"},
            "Failover": {"*": {"Service": "f", "Targets": [{"Service": "t"}, {"Peer": "p"}]}}});
        assert_eq!(related(resolver), "f,r,t");
        let defaults = json!({"Kind": "service-defaults", "Name": "web"});
        assert_eq!(related(defaults), "");
    }

    #[test]
    fn accepts_snake_case_and_durations() {
        let e = decode_entry(&json!({
            "kind": "service-resolver",
            "name": "web",
            "connect_timeout": "1m30s",
            "default_subset": "v1",
            "subsets": {"v1": {"filter": "Service.Meta.version == v1", "only_passing": true}},
            "load_balancer": {"policy": "ring_hash", "ring_hash_config": {"maximum_ring_size": 5}}
        }))
        .unwrap();
        let r = e.as_resolver().unwrap();
        assert_eq!(r.connect_timeout, Duration::from_secs(90));
        assert_eq!(r.default_subset, "v1");
        assert!(r.subsets["v1"].only_passing);
        let out = e.to_json();
        assert_eq!(out["ConnectTimeout"], "1m30s");
        assert_eq!(out["Kind"], "service-resolver");
        assert_eq!(out["CreateIndex"], 0);
    }

    #[test]
    fn keeps_free_form_keys() {
        let e = decode_entry(&json!({
            "Kind": "proxy-defaults", "Name": "global",
            "Config": {"protocol": "http", "local_connect_timeout_ms": 1000, "Foo_Bar": false},
            "Meta": {"Some_Key": "v"}
        }))
        .unwrap();
        let out = e.to_json();
        assert_eq!(out["Config"]["Foo_Bar"], false);
        assert_eq!(out["Config"]["local_connect_timeout_ms"], 1000);
        assert_eq!(out["Meta"]["Some_Key"], "v");
    }

    #[test]
    fn router_snake_case_paths() {
        let e = decode_entry(&json!({
            "kind": "service-router", "name": "web",
            "routes": [{"match": {"http": {"path_prefix": "/api", "query_param": [{"name": "x", "present": true}]}},
                        "destination": {"service": "api", "prefix_rewrite": "/", "request_timeout": "5s",
                                        "request_headers": {"set": {"X-Foo_Bar": "1"}}}}]
        }))
        .unwrap();
        let r = e.as_router().unwrap();
        let http = r.routes[0].match_.as_ref().unwrap().http.as_ref().unwrap();
        assert_eq!(http.path_prefix, "/api");
        let d = r.routes[0].destination.as_ref().unwrap();
        assert_eq!(d.request_timeout, Duration::from_secs(5));
        assert_eq!(d.request_headers.as_ref().unwrap().set["X-Foo_Bar"], "1");
    }

    #[test]
    fn refuses_unknown_keys() {
        let e =
            decode_entry(&json!({"Kind": "proxy-defaults", "Name": "global", "NotAField": true}))
                .unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"Request decoding failed: invalid config key "NotAField""#
        );
        let e = decode_entry(&json!({"Kind": "service-router", "Name": "x",
            "Routes": [{"Destination": {"Bogus": 1}}]}))
        .unwrap_err();
        assert!(
            e.to_string().contains(r#""Routes[0].Destination.Bogus""#),
            "{e}"
        );
    }

    #[test]
    fn refuses_wrong_types_and_kinds() {
        for body in [
            json!({"Kind": "service-defaults", "Name": "web", "Protocol": 5}),
            json!({"Kind": "service-resolver", "Name": "web", "ConnectTimeout": "soon"}),
            json!({"Kind": "service-splitter", "Name": "web", "Splits": {"Weight": 100}}),
            json!({"Kind": "bogus", "Name": "web"}),
            json!({"Name": "web"}),
            json!({"Kind": 3}),
            json!([1, 2]),
        ] {
            let e = decode_entry(&body).unwrap_err();
            assert!(
                e.to_string().starts_with("Request decoding failed: "),
                "{e}"
            );
        }
    }

    #[test]
    fn kind_is_case_insensitive() {
        let e = decode_entry(&json!({"Kind": "Service-Defaults", "Name": "web"})).unwrap();
        assert_eq!(e.kind(), Kind::ServiceDefaults);
        assert_eq!(e.to_json()["Kind"], "service-defaults");
    }
}
