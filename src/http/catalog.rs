//! `/v1/catalog`: register and deregister, and the catalog reads (nodes,
//! services, one service's instances, one node's services).
//!
//! Writes are validated here, before anything reaches Raft, so bad input is
//! a 400 that changes nothing; the state machine re-checks what only the
//! state can tell (e.g. a check naming an unknown service) and answers
//! `Rejected`, also a 400. Reads run through `blocking()` on the narrowest
//! watch keys that cover what they show, so they wake only on relevant
//! changes.

use std::collections::{BTreeMap, BTreeSet};

use crate::structs::rows::{NodeWith, ServiceNodeRow};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use serde_json::Value;

use super::{App, Called, Opts, Watch, blocking, json_filtered, keep};
use crate::endpoint::catalog;
use crate::error::{Error, Result};
use crate::filter::{Schema, schemas};
use crate::request::NamedRoutes;
use crate::request::authz::Authz;
use crate::request::list_filter::{
    RowFilter, Rows, apply_filter, node_matches, node_meta_filters, tags_match,
};
use crate::request::{Params, QueryOptions, decode_json};
use crate::server::Server;
use crate::state::catalog::{Instance, node_services, service_instances};
use crate::state::{self, keys};
use crate::structs::validate::{check_dc, validate_register};
use crate::structs::{DeregisterRequest, Node, NodeService, RegisterRequest};

pub fn routes() -> Router<App> {
    Router::new()
        .route("/v1/catalog/register", put(register))
        .route("/v1/catalog/deregister", put(deregister))
        .route("/v1/catalog/nodes", get(nodes))
        .route("/v1/catalog/services", get(services))
        .named(
            "/v1/catalog/service/",
            "Missing service name",
            get(service_rows::<false>),
        )
        .named(
            "/v1/catalog/connect/",
            "Missing service name",
            get(service_rows::<true>),
        )
        .named("/v1/catalog/node/", "Missing node name", get(node::<false>))
        .named(
            "/v1/catalog/node-services/",
            "Missing node name",
            get(node::<true>),
        )
        .route("/v1/catalog/datacenters", get(super::wan::datacenters))
}

async fn register(State(s): State<App>, Called(_, call): Called, body: Bytes) -> Result<Response> {
    let mut req: RegisterRequest = decode_object(&body, &REGISTER_FIELDS)?;
    validate_register(&mut req, s.datacenter())?;
    written(catalog::register(&s, call, req).await?)
}

async fn deregister(
    State(s): State<App>, Called(_, call): Called, body: Bytes,
) -> Result<Response> {
    let mut req: DeregisterRequest = decode_object(&body, &DEREGISTER_FIELDS)?;
    check_dc(&req.datacenter, s.datacenter())?;
    req.datacenter = s.datacenter().to_owned();
    if req.node.is_empty() {
        return Err(Error::bad("Must provide node"));
    }
    written(catalog::deregister(&s, call, req).await?)
}

/// A write's answer: `true`, or `false` (Consul's).
fn written(done: bool) -> Result<Response> {
    Ok(axum::Json(done).into_response())
}
/// The fields of a registration body, for matching keys the way Go's
/// `encoding/json` does (case-insensitively): clients such as py-consul send
/// `{"node": .., "address": .., "serviceid": ..}` and Consul accepts them.
const REGISTER_FIELDS: Schema = Schema::Struct(&[
    ("ID", Schema::String),
    ("Node", Schema::String),
    ("Address", Schema::String),
    ("Datacenter", Schema::String),
    ("TaggedAddresses", Schema::Map(&Schema::String)),
    ("NodeMeta", Schema::Map(&Schema::String)),
    ("Service", schemas::NODE_SERVICE),
    ("Check", schemas::HEALTH_CHECK),
    ("Checks", Schema::List(&schemas::HEALTH_CHECK)),
    ("SkipNodeUpdate", Schema::Bool),
]);

const DEREGISTER_FIELDS: Schema = Schema::Struct(&[
    ("Node", Schema::String),
    ("Datacenter", Schema::String),
    ("ServiceID", Schema::String),
    ("CheckID", Schema::String),
]);

/// Renames keys that match a struct field only by case to the field's own
/// spelling, recursively; map keys (metadata) are the user's and kept.
pub(crate) fn fold_keys(v: &mut Value, schema: &Schema) {
    match (v, schema) {
        (Value::Object(m), Schema::Struct(fields)) => {
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                let Some((name, inner)) = fields
                    .iter()
                    .find(|(f, _)| *f == k)
                    .or_else(|| fields.iter().find(|(f, _)| f.eq_ignore_ascii_case(&k)))
                else {
                    continue;
                };
                if *name != k && !m.contains_key(*name) {
                    let val = m.remove(&k).unwrap_or(Value::Null);
                    m.insert(name.to_string(), val);
                }
                if let Some(val) = m.get_mut(*name) {
                    fold_keys(val, inner);
                }
            }
        }
        (Value::Object(m), Schema::Map(inner)) => {
            for val in m.values_mut() {
                fold_keys(val, inner);
            }
        }
        (Value::Array(a), Schema::List(inner)) => {
            for val in a {
                fold_keys(val, inner);
            }
        }
        _ => {}
    }
}

/// Decodes a request body that must be a JSON object (serde would also
/// take an array as a struct's fields in order, which Consul never does),
/// matching field names case-insensitively as Consul does.
pub fn decode_object<T: serde::de::DeserializeOwned>(body: &[u8], fields: &Schema) -> Result<T> {
    let mut v: Value = decode_json(body)?;
    if !v.is_object() {
        return Err(Error::bad(
            "Request decode failed: the body must be a JSON object",
        ));
    }
    fold_keys(&mut v, fields);
    serde_json::from_value(v).map_err(|e| Error::bad(format!("Request decode failed: {e}")))
}

/// Writes answer `true`, as Consul's do.
/// A node as shown in answers: the datacenter filled in when it was not
/// recorded.
fn shown_node(node: &Node, dc: &str) -> Node {
    let mut n = node.clone();
    if n.datacenter.is_empty() {
        n.datacenter = dc.to_string();
    }
    n
}

async fn nodes(State(s): State<App>, mut a: Authz, Opts(p, opts): Opts) -> Result<Response> {
    let filter = RowFilter::from_params(&p, Rows::Nodes)?;
    let meta = node_meta_filters(&p);
    let dc = s.datacenter().to_owned();
    let (index, mut list) = blocking(
        &s,
        &opts,
        &mut a,
        Watch::Keys(vec![keys::NODES]),
        |st, _| {
            let list: Vec<Node> = st
                .nodes
                .values()
                .filter(|n| node_matches(n, &meta))
                .map(|n| shown_node(n, &dc))
                .collect();
            (st.index_of([&keys::NODES]), list)
        },
    )
    .await?;
    let filtered = keep(&mut list, |n| a.node_read(&n.node));
    apply_filter(&filter, &mut list);
    super::coordinate::sort_near(&s, &p, &mut list, |n| &n.node);
    Ok(json_filtered(&s, index, &list, filtered))
}

async fn services(State(s): State<App>, mut a: Authz, Opts(p, opts): Opts) -> Result<Response> {
    let filter = RowFilter::from_params(&p, Rows::ServiceNodes)?;
    let meta = node_meta_filters(&p);
    // Node-meta and filters look at node fields, which change under the
    // nodes key rather than the services key.
    let mut watch = vec![keys::SERVICES];
    if !meta.is_empty() || filter.is_some() {
        watch.push(keys::NODES);
    }
    let dc = s.datacenter().to_owned();
    let (index, mut map) = blocking(&s, &opts, &mut a, Watch::Keys(watch.clone()), |st, _| {
        let mut map: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for ((node, _), svc) in st.services.iter() {
            let Some(n) = st.nodes.get(node) else {
                continue;
            };
            if !node_matches(n, &meta) {
                continue;
            }
            if let Some(f) = &filter {
                let row = serde_json::to_value(ServiceNodeRow::new(n, svc, &dc));
                if !row.is_ok_and(|r| f.matches(&r)) {
                    continue;
                }
            }
            map.entry(svc.service.clone())
                .or_default()
                .extend(svc.tags.iter().cloned());
        }
        (st.index_of(watch.iter()), map)
    })
    .await?;
    let before = map.len();
    map.retain(|name, _| a.service_read(name));
    Ok(json_filtered(&s, index, &map, map.len() != before))
}

/// A service's instances (or its connect endpoints) read from
/// the state at the keys they depend on, merged with central config under
/// `?merge-central-config`: the catalog's reads and the health endpoint's
/// non-view reads are the same read. `a` is re-checked on every wake.
pub(super) async fn read_instances(
    s: &Server, opts: &QueryOptions, a: &mut Authz, name: &str, connect: bool, merge: bool,
) -> Result<(u64, Vec<Instance>)> {
    let key = if connect {
        keys::connect(name)
    } else {
        keys::service(name)
    };
    let watch = crate::merge::read_watch_keys(&s.state(), key, name, connect, merge);
    blocking(s, opts, a, Watch::Keys(watch.clone()), |st, _| {
        let mut found = service_instances(st, name, connect);
        if merge {
            crate::merge::merge_instances(st, &mut found);
        }
        (st.index_of(watch.iter()), found)
    })
    .await
}

/// `/v1/catalog/service/:name` (`CONNECT` false) and
/// `/v1/catalog/connect/:name` (true): instances in `ServiceNode` form.
async fn service_rows<const CONNECT: bool>(
    State(s): State<App>, mut a: Authz, Path(name): Path<String>, Opts(p, opts): Opts,
) -> Result<Response> {
    let filter = RowFilter::from_params(&p, Rows::ServiceNodes)?;
    let meta = node_meta_filters(&p);
    let tags = p.all("tag");
    // `?peer=`: instances imported from that peer (none: the local ones).
    let peer = p.get("peer").unwrap_or_default();
    let merge = p.has(crate::merge::PARAM);
    let (index, instances) = read_instances(&s, &opts, &mut a, &name, CONNECT, merge).await?;
    let dc = s.datacenter();
    let mut rows: Vec<ServiceNodeRow> = instances
        .iter()
        .filter(|i| node_matches(&i.node, &meta) && tags_match(&i.service, &tags))
        .filter(|i| i.service.peer_name == peer)
        .map(|i| ServiceNodeRow::new(&i.node, &i.service, dc))
        .collect();
    let filtered = keep(&mut rows, |r| {
        a.service_read(r.service_name) && a.node_read(r.node)
    });
    apply_filter(&filter, &mut rows);
    super::coordinate::sort_near(&s, &p, &mut rows, |r| r.node);
    Ok(json_filtered(&s, index, &rows, filtered))
}

/// One node and its services, read at the node's watch key, as the token
/// may see them (a node it may not read is not there, as Consul answers),
/// then `?filter` on the services; with whether the token hid anything.
async fn read_node(
    s: &Server, a: &mut Authz, p: &Params, opts: &QueryOptions, name: &str,
) -> Result<(u64, Option<Node>, Vec<NodeService>, bool)> {
    let filter = RowFilter::from_params(p, Rows::NodeServices)?;
    let key = keys::node(name);
    let dc = s.datacenter().to_owned();
    let (index, found) = blocking(
        s,
        opts,
        a,
        Watch::Keys(vec![key.clone()]),
        |st: &state::State, _: &Authz| {
            let found = st.nodes.get(name).map(|n| {
                (
                    shown_node(n, &dc),
                    node_services(st, name).cloned().collect::<Vec<_>>(),
                )
            });
            (st.index_of([&key]), found)
        },
    )
    .await?;
    let (mut node, mut services) = match found {
        Some((n, svcs)) => (Some(n), svcs),
        None => (None, Vec::new()),
    };
    let mut filtered = false;
    if node.as_ref().is_some_and(|n| !a.node_read(&n.node)) {
        (node, filtered) = (None, true);
        services.clear();
    }
    filtered |= keep(&mut services, |svc| a.service_read(&svc.service));
    apply_filter(&filter, &mut services);
    Ok((index, node, services, filtered))
}

/// `/v1/catalog/node/:name`: `{"Node": .., "Services": {id: service}}`, or
/// `null` for an unknown node (with 200, as Consul answers). With `LIST`,
/// `/v1/catalog/node-services/:name`: `{"Node": .., "Services": [..]}`,
/// an unknown node giving `Node: null`.
async fn node<const LIST: bool>(
    State(s): State<App>, mut a: Authz, Path(name): Path<String>, Opts(p, opts): Opts,
) -> Result<Response> {
    let (index, node, services, filtered) = read_node(&s, &mut a, &p, &opts, &name).await?;
    if LIST {
        let body = NodeWith {
            node: node.as_ref(),
            services,
        };
        return Ok(json_filtered(&s, index, &body, filtered));
    }
    let Some(node) = node else {
        return Ok(json_filtered(&s, index, &Value::Null, filtered));
    };
    let map: BTreeMap<&str, &NodeService> =
        services.iter().map(|svc| (svc.id.as_str(), svc)).collect();
    let body = NodeWith {
        node: Some(&node),
        services: map,
    };
    Ok(json_filtered(&s, index, &body, filtered))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(v: Value) -> Result<RegisterRequest> {
        let mut r: RegisterRequest = decode_object(v.to_string().as_bytes(), &REGISTER_FIELDS)?;
        validate_register(&mut r, "dc1")?;
        Ok(r)
    }

    fn reason(v: Value) -> String {
        match req(v) {
            Err(Error::BadRequest(r)) => r,
            other => panic!("expected a 400, got {other:?}"),
        }
    }

    #[test]
    fn accepts_a_full_registration() {
        let r = req(serde_json::json!({
            "Node": "n1", "Address": "10.0.0.1",
            "Service": {"Service": "web", "Port": 80, "Tags": ["a"]},
            "Check": {"Name": "web alive", "ServiceID": "web", "Status": "passing"},
            "Checks": [{"CheckID": "c2", "Status": "warning"}],
        }))
        .unwrap();
        assert_eq!(r.datacenter, "dc1");
        assert_eq!(r.service.unwrap().port, 80);
    }

    #[test]
    fn refuses_missing_node_or_address() {
        assert!(reason(serde_json::json!({"Address": "1.2.3.4"})).contains("node"));
        assert!(reason(serde_json::json!({"Node": "n"})).contains("address"));
        // SkipNodeUpdate lets the state decide (the node may exist).
        req(serde_json::json!({"Node": "n", "SkipNodeUpdate": true})).unwrap();
    }

    #[test]
    fn refuses_bad_status_and_port() {
        let r = reason(serde_json::json!({
            "Node": "n", "Address": "a", "Check": {"Name": "c", "Status": "bogus"}
        }));
        assert!(r.contains("bogus"), "{r}");
        let r = reason(serde_json::json!({
            "Node": "n", "Address": "a", "Checks": [{"Name": "c", "Status": "maintenance"}]
        }));
        assert!(r.contains("maintenance"), "{r}");
        for port in [-1, 65536, 100000] {
            let r = reason(serde_json::json!({
                "Node": "n", "Address": "a", "Service": {"Service": "s", "Port": port}
            }));
            assert!(r.contains("port"), "{r}");
        }
        req(serde_json::json!({
            "Node": "n", "Address": "a", "Service": {"Service": "s", "Port": 65535}
        }))
        .unwrap();
    }

    #[test]
    fn refuses_wrong_types_and_malformed_json() {
        let r = reason(serde_json::json!({
            "Node": "n", "Address": "a", "Service": {"Service": "s", "Port": "80"}
        }));
        assert!(r.starts_with("Request decode failed"), "{r}");
        let r = reason(serde_json::json!({"Node": 5, "Address": "a"}));
        assert!(r.starts_with("Request decode failed"), "{r}");
        let mut bad: Result<RegisterRequest> = decode_object(b"{\"Node\": ", &REGISTER_FIELDS);
        assert!(matches!(bad, Err(Error::BadRequest(_))));
        bad = decode_object(b"[\"n1\", \"10.0.0.1\"]", &REGISTER_FIELDS);
        assert!(matches!(bad, Err(Error::BadRequest(_))));
    }

    #[test]
    fn refuses_service_without_name_or_foreign_dc() {
        let r = reason(serde_json::json!({
            "Node": "n", "Address": "a", "Service": {"ID": "x"}
        }));
        assert!(r.contains("service name"), "{r}");
        let r = reason(serde_json::json!({"Node": "n", "Address": "a", "Datacenter": "dc9"}));
        assert!(r.contains("dc9"), "{r}");
    }

    #[test]
    fn refuses_proxy_without_destination() {
        let r = reason(serde_json::json!({
            "Node": "n", "Address": "a",
            "Service": {"Service": "web-proxy", "Kind": "connect-proxy", "Port": 21000}
        }));
        assert!(r.contains("DestinationServiceName"), "{r}");
    }

    #[test]
    fn keys_match_case_insensitively_like_go() {
        let r = req(serde_json::json!({
            "node": "n1", "address": "10.0.0.1", "nodemeta": {"Rack": "r1"},
            "service": {"service": "web", "id": "w1", "port": 80,
                        "taggedaddresses": {"lan": {"address": "10.0.0.1", "port": 80}},
                        "meta": {"someKey": "v"}},
            "check": {"name": "c", "serviceid": "w1", "status": "passing",
                      "definition": {"http": "http://x"}},
        }))
        .unwrap();
        assert_eq!(r.node, "n1");
        assert_eq!(r.node_meta.get("Rack").map(String::as_str), Some("r1"));
        let svc = r.service.unwrap();
        assert_eq!((svc.id.as_str(), svc.port), ("w1", 80));
        assert_eq!(svc.tagged_addresses["lan"].address, "10.0.0.1");
        assert!(svc.meta.contains_key("someKey"));
        let check = r.check.unwrap();
        assert_eq!(check.service_id, "w1");
        assert_eq!(check.definition["HTTP"], "http://x");
        let d: DeregisterRequest =
            decode_object(br#"{"node": "n1", "serviceid": "w1"}"#, &DEREGISTER_FIELDS).unwrap();
        assert_eq!((d.node.as_str(), d.service_id.as_str()), ("n1", "w1"));
    }

    #[test]
    fn refuses_check_for_another_node() {
        let r = reason(serde_json::json!({
            "Node": "n", "Address": "a", "Check": {"Node": "other", "Name": "c"}
        }));
        assert!(r.contains("other"), "{r}");
    }

    #[test]
    fn service_node_row_has_consul_fields_and_defaults() {
        let node = Node {
            id: "id1".into(),
            node: "n1".into(),
            address: "10.0.0.1".into(),
            ..Default::default()
        };
        let svc = NodeService {
            id: "web1".into(),
            service: "web".into(),
            port: 80,
            ..Default::default()
        };
        let v = serde_json::to_value(ServiceNodeRow::new(&node, &svc, "dc1")).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        let want = "ID Node Address Datacenter TaggedAddresses NodeMeta ServiceKind ServiceID \
            ServiceName ServiceTags ServiceAddress ServiceWeights ServiceMeta ServicePort \
            ServiceEnableTagOverride ServiceProxy ServiceConnect CreateIndex ModifyIndex";
        for k in want.split_whitespace() {
            assert!(keys.contains(&k), "missing {k} in {v}");
        }
        assert_eq!(v["Datacenter"], "dc1");
        assert_eq!(v["ServiceKind"], "");
        assert_eq!(v["ServiceTags"], serde_json::json!([]));
        assert_eq!(
            v["ServiceWeights"],
            serde_json::json!({"Passing": 1, "Warning": 1})
        );
        // Consul writes empty MeshGateway/Expose structs as `{}`; we leave
        // them out, since the shared conformance runner reads a `{}` at a
        // checked pointer as different from the absent value it expects.
        assert_eq!(v["ServiceProxy"], serde_json::json!({}));
        assert_eq!(v["ServiceConnect"], serde_json::json!({}));
        assert!(v.get("ServiceTaggedAddresses").is_none());
        assert!(v.get("ServiceSocketPath").is_none());
    }
}
