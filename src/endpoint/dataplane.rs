//! What an agentless dataplane needs to start Envoy for one registered
//! proxy or gateway: Consul's `GetEnvoyBootstrapParams`, answered over
//! gRPC (`grpc::dataplane`) and HTTP
//! (`/v1/internal/dataplane/bootstrap-params/:id`, `http::dataplane`), with
//! the service's registration merged with central config exactly as
//! `?merge-central-config` reads show it.

use serde::Serialize;
use serde_json::{Map, Value, json};

use super::blocking::{Watch, blocking};
use crate::error::{Error, Result};
use crate::merge;
use crate::request::QueryOptions;
use crate::request::authz::Authz;
use crate::server::Server;
use crate::state::{self, keys};
use crate::structs::catalog::{AccessLogsConfig, Node, NodeService};
use crate::structs::health::ServiceKind;

/// Consul's `GetEnvoyBootstrapParamsResponse`, field names in PascalCase.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct BootstrapParams {
    /// The protobuf enum's name, e.g. `SERVICE_KIND_CONNECT_PROXY`.
    pub service_kind: &'static str,
    /// The catalog's own spelling of the kind (`connect-proxy`, ...; "" for
    /// a typical service): what Consul's HTTP API calls `Kind`.
    pub kind: ServiceKind,
    /// A sidecar's destination service, a gateway's own name: Envoy's local
    /// cluster name and the `service` in its metrics.
    pub service: String,
    /// The identity the proxy acts for; in the v1 catalog, the service above.
    pub identity: String,
    pub namespace: String,
    pub partition: String,
    pub datacenter: String,
    /// The merged `Proxy.Config`.
    pub config: Map<String, Value>,
    pub node_id: String,
    pub node_name: String,
    /// Envoy access loggers (protobuf JSON of `envoy.config.accesslog.v3
    /// .AccessLog`), one per logger, when proxy-defaults enables them.
    pub access_logs: Vec<String>,
}

const DEFAULT_TENANCY: &str = "default";

pub fn service_kind(kind: &ServiceKind) -> &'static str {
    match kind {
        ServiceKind::ConnectProxy => "SERVICE_KIND_CONNECT_PROXY",
        ServiceKind::MeshGateway => "SERVICE_KIND_MESH_GATEWAY",
        ServiceKind::TerminatingGateway => "SERVICE_KIND_TERMINATING_GATEWAY",
        ServiceKind::IngressGateway => "SERVICE_KIND_INGRESS_GATEWAY",
        ServiceKind::ApiGateway => "SERVICE_KIND_API_GATEWAY",
        ServiceKind::Typical => "SERVICE_KIND_TYPICAL",
        ServiceKind::Other(_) => "SERVICE_KIND_UNSPECIFIED",
    }
}

/// How the request names the node.
pub enum NodeSpec {
    Name(String),
    Id(String),
}

impl NodeSpec {
    pub fn find<'a>(&self, st: &'a state::State) -> Option<&'a Node> {
        match self {
            NodeSpec::Name(n) => st.nodes.get(n).map(|n| &**n),
            NodeSpec::Id(id) => st
                .nodes
                .values()
                .find(|n| n.id.eq_ignore_ascii_case(id))
                .map(|n| &**n),
        }
    }

    /// The key whose change could change which node (and so which
    /// service) this names: a node's own key, or every node for an ID.
    fn watch_key(&self) -> crate::state::WatchKey {
        match self {
            NodeSpec::Name(n) => keys::node(n),
            NodeSpec::Id(_) => keys::NODES,
        }
    }
}

/// The bootstrap parameters for `svc`, registered on `node`.
pub fn bootstrap_params_for(
    st: &state::State, node: &Node, svc: &NodeService, datacenter: &str,
) -> BootstrapParams {
    // Merged whatever the kind: the dataplane asks about proxies and
    // gateways, and a typical service merges to itself plus proxy-defaults,
    // as in Consul.
    let merged = merge::merge_with_central_config(st, svc);
    let service = if svc.is_connect_proxy() {
        svc.proxy.destination_service_name.clone()
    } else {
        svc.service.clone()
    };
    BootstrapParams {
        service_kind: service_kind(&svc.kind),
        kind: svc.kind.clone(),
        identity: service.clone(),
        service,
        namespace: DEFAULT_TENANCY.into(),
        partition: DEFAULT_TENANCY.into(),
        datacenter: if node.datacenter.is_empty() {
            datacenter.to_string()
        } else {
            node.datacenter.clone()
        },
        config: merged.proxy.config.as_deref().cloned().unwrap_or_default(),
        node_id: node.id.clone(),
        node_name: node.node.clone(),
        access_logs: access_logs(&merged.proxy.access_logs),
    }
}

/// The bootstrap parameters of proxy `id` on the node `spec` names, for
/// a caller with `service:write` on it (checked again on each version: the
/// token may lose it), as a blocking read: its index and the parameters.
pub async fn read(
    s: &Server, a: &mut Authz, opts: &QueryOptions, id: &str, spec: &NodeSpec,
) -> Result<(u64, BootstrapParams)> {
    // The merge's config keys come from the registration as it is now; if
    // it changes, the node key wakes the read and the answer carries the
    // new index, so the client asks again with the new set.
    let mut watch = vec![spec.watch_key()];
    {
        let st = s.state();
        if let Some(node) = spec.find(&st)
            && let Some(svc) = st.services.get(&(node.node.clone(), id.to_string()))
        {
            // The dataplane's token holds `service:write` on its proxy.
            a.require(a.service_write(&svc.service), "service:write", &svc.service)?;
            watch.extend(merge::merge_watch_keys(&st, svc));
        }
    }
    let dc = s.datacenter().to_owned();
    let (index, found) = blocking(s, opts, a, Watch::Keys(watch.clone()), |st, a| {
        let index = st.index_of(watch.iter());
        let Some(node) = spec.find(st) else {
            return (index, Err(Error::NotFound("Node not found".into())));
        };
        let Some(svc) = st.services.get(&(node.node.clone(), id.to_string())) else {
            return (
                index,
                Err(Error::NotFound(format!(
                    "Service not found: no service {id:?} on node {:?}",
                    node.node
                ))),
            );
        };
        if let Err(e) = a.require(a.service_write(&svc.service), "service:write", &svc.service) {
            return (index, Err(e));
        }
        (index, Ok(bootstrap_params_for(st, node, svc, &dc)))
    })
    .await?;
    Ok((index, found?))
}

/// Envoy's access log configuration for the proxy's `AccessLogs`, as the
/// dataplane passes it to Envoy: one JSON `AccessLog` per logger (cairn, like
/// Consul, makes one). Disabled logs, or a sink or format Envoy would refuse,
/// give none: access logs are not worth failing a bootstrap over.
pub fn access_logs(logs: &AccessLogsConfig) -> Vec<String> {
    if !logs.enabled {
        return Vec::new();
    }
    let format = if !logs.json_format.is_empty() {
        match serde_json::from_str::<Map<String, Value>>(&logs.json_format) {
            Ok(m) => json!({ "jsonFormat": m }),
            Err(e) => {
                tracing::warn!("access logs: JSONFormat is not a JSON object: {e}");
                return Vec::new();
            }
        }
    } else if !logs.text_format.is_empty() {
        let mut text = logs.text_format.clone();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        json!({ "textFormatSource": { "inlineString": text } })
    } else {
        json!({ "jsonFormat": default_json_format() })
    };
    let typed = match logs.log_type.as_str() {
        "" | "stdout" => json!({
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog",
            "logFormat": format,
        }),
        "stderr" => json!({
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StderrAccessLog",
            "logFormat": format,
        }),
        "file" => json!({
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": logs.path,
            "logFormat": format,
        }),
        other => {
            tracing::warn!("access logs: unsupported sink type {other:?}");
            return Vec::new();
        }
    };
    let log = json!({ "name": "Consul Listener Filter Log", "typedConfig": typed });
    vec![log.to_string()]
}

/// The fields Consul logs when no format is given: Envoy command operators
/// for the usual request and connection facts.
fn default_json_format() -> Map<String, Value> {
    [
        ("start_time", "%START_TIME%"),
        ("route_name", "%ROUTE_NAME%"),
        ("method", "%REQ(:METHOD)%"),
        ("path", "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%"),
        ("protocol", "%PROTOCOL%"),
        ("response_code", "%RESPONSE_CODE%"),
        ("response_flags", "%RESPONSE_FLAGS%"),
        ("response_code_details", "%RESPONSE_CODE_DETAILS%"),
        (
            "connection_termination_details",
            "%CONNECTION_TERMINATION_DETAILS%",
        ),
        ("bytes_received", "%BYTES_RECEIVED%"),
        ("bytes_sent", "%BYTES_SENT%"),
        ("duration", "%DURATION%"),
        (
            "upstream_service_time",
            "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%",
        ),
        ("x_forwarded_for", "%REQ(X-FORWARDED-FOR)%"),
        ("user_agent", "%REQ(USER-AGENT)%"),
        ("request_id", "%REQ(X-REQUEST-ID)%"),
        ("authority", "%REQ(:AUTHORITY)%"),
        ("upstream_host", "%UPSTREAM_HOST%"),
        ("upstream_cluster", "%UPSTREAM_CLUSTER%"),
        ("upstream_local_address", "%UPSTREAM_LOCAL_ADDRESS%"),
        ("downstream_local_address", "%DOWNSTREAM_LOCAL_ADDRESS%"),
        ("downstream_remote_address", "%DOWNSTREAM_REMOTE_ADDRESS%"),
        ("requested_server_name", "%REQUESTED_SERVER_NAME%"),
        (
            "upstream_transport_failure_reason",
            "%UPSTREAM_TRANSPORT_FAILURE_REASON%",
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logs(v: Value) -> AccessLogsConfig {
        serde_json::from_value(v).unwrap()
    }

    fn parsed(v: Value) -> Vec<Value> {
        access_logs(&logs(v))
            .iter()
            .map(|s| serde_json::from_str(s).unwrap())
            .collect()
    }

    #[test]
    fn disabled_access_logs_give_none() {
        assert!(parsed(json!({ "Type": "file", "Path": "/x" })).is_empty());
    }

    #[test]
    fn default_sink_is_stdout_with_the_default_json_format() {
        let l = parsed(json!({ "Enabled": true }));
        assert_eq!(l.len(), 1);
        let t = &l[0]["typedConfig"];
        assert!(t["@type"].as_str().unwrap().ends_with("StdoutAccessLog"));
        assert_eq!(
            t["logFormat"]["jsonFormat"]["response_code"],
            "%RESPONSE_CODE%"
        );
        assert_eq!(l[0]["name"], "Consul Listener Filter Log");
    }

    #[test]
    fn file_sink_with_text_format_gets_a_trailing_newline() {
        let l = parsed(
            json!({ "Enabled": true, "Type": "file", "Path": "/var/log/envoy",
                               "TextFormat": "%START_TIME%" }),
        );
        let t = &l[0]["typedConfig"];
        assert!(t["@type"].as_str().unwrap().ends_with("FileAccessLog"));
        assert_eq!(t["path"], "/var/log/envoy");
        assert_eq!(
            t["logFormat"]["textFormatSource"]["inlineString"],
            "%START_TIME%\n"
        );
    }

    #[test]
    fn custom_json_format_and_bad_ones() {
        let l = parsed(
            json!({ "Enabled": true, "Type": "stderr", "JSONFormat": "{\"a\":\"%PROTOCOL%\"}" }),
        );
        assert_eq!(
            l[0]["typedConfig"]["logFormat"]["jsonFormat"],
            json!({ "a": "%PROTOCOL%" })
        );
        assert!(parsed(json!({ "Enabled": true, "JSONFormat": "nope" })).is_empty());
        assert!(parsed(json!({ "Enabled": true, "Type": "syslog" })).is_empty());
    }

    #[test]
    fn kinds_map_to_the_protobuf_enum() {
        let kind = |s: &str| service_kind(&ServiceKind::from(s));
        assert_eq!(kind("connect-proxy"), "SERVICE_KIND_CONNECT_PROXY");
        assert_eq!(kind("mesh-gateway"), "SERVICE_KIND_MESH_GATEWAY");
        assert_eq!(kind(""), "SERVICE_KIND_TYPICAL");
        assert_eq!(kind("something-new"), "SERVICE_KIND_UNSPECIFIED");
    }
}
