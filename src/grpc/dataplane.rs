//! `hashicorp.consul.dataplane.DataplaneService`: the features cairn
//! supports, and `GetEnvoyBootstrapParams` (`endpoint::dataplane`'s
//! parameters, with Consul's gRPC checks and codes).

use axum::http;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value as PbValue, value::Kind};
use serde_json::Value;
use tonic::Status;
use tonic::body::Body;

use super::{App, BoxFut, Methods, token_of, unary, unimplemented};

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetSupportedDataplaneFeaturesRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DataplaneFeatureSupport {
    #[prost(int32, tag = "1")]
    pub feature_name: i32,
    #[prost(bool, tag = "2")]
    pub supported: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetSupportedDataplaneFeaturesResponse {
    #[prost(message, repeated, tag = "1")]
    pub supported_dataplane_features: Vec<DataplaneFeatureSupport>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetEnvoyBootstrapParamsRequest {
    #[prost(string, tag = "1")]
    pub node_id: String,
    #[prost(string, tag = "2")]
    pub node_name: String,
    #[prost(string, tag = "3")]
    pub service_id: String,
    #[prost(string, tag = "4")]
    pub partition: String,
    #[prost(string, tag = "5")]
    pub namespace: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetEnvoyBootstrapParamsResponse {
    #[prost(int32, tag = "1")]
    pub service_kind: i32,
    #[prost(string, tag = "2")]
    pub service: String,
    #[prost(string, tag = "3")]
    pub namespace: String,
    #[prost(string, tag = "4")]
    pub partition: String,
    #[prost(string, tag = "5")]
    pub datacenter: String,
    #[prost(message, optional, tag = "6")]
    pub config: Option<Struct>,
    #[prost(string, tag = "7")]
    pub node_id: String,
    #[prost(string, tag = "8")]
    pub node_name: String,
    #[prost(string, repeated, tag = "9")]
    pub access_logs: Vec<String>,
    #[prost(string, tag = "10")]
    pub identity: String,
}

/// `DataplaneFeatures`: watch servers, edge certificate management,
/// Envoy bootstrap configuration.
const FEATURES: [i32; 3] = [1, 2, 3];

fn service_kind_number(name: &str) -> i32 {
    match name {
        "SERVICE_KIND_TYPICAL" => 1,
        "SERVICE_KIND_CONNECT_PROXY" => 2,
        "SERVICE_KIND_MESH_GATEWAY" => 3,
        "SERVICE_KIND_TERMINATING_GATEWAY" => 4,
        "SERVICE_KIND_INGRESS_GATEWAY" => 5,
        "SERVICE_KIND_API_GATEWAY" => 6,
        _ => 0,
    }
}

fn to_pb(v: &Value) -> PbValue {
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(a) => Kind::ListValue(ListValue {
            values: a.iter().map(to_pb).collect(),
        }),
        Value::Object(o) => Kind::StructValue(to_struct(o)),
    };
    PbValue { kind: Some(kind) }
}

fn to_struct(m: &serde_json::Map<String, Value>) -> Struct {
    Struct {
        fields: m.iter().map(|(k, v)| (k.clone(), to_pb(v))).collect(),
    }
}

fn bootstrap(
    s: &App, token: Option<&str>, req: GetEnvoyBootstrapParamsRequest,
) -> Result<GetEnvoyBootstrapParamsResponse, Status> {
    if req.service_id.is_empty() {
        return Err(Status::invalid_argument("service_id is required"));
    }
    for (what, v) in [("partition", &req.partition), ("namespace", &req.namespace)] {
        if !v.is_empty() && v != "default" {
            return Err(Status::invalid_argument(format!(
                "{what} {v:?}: only the default {what} exists (Consul open source)"
            )));
        }
    }
    let st = s.state();
    // Consul's order: the token first (a secret that names no token is
    // UNAUTHENTICATED), before any lookup, so it learns nothing of what is
    // registered; then NOT_FOUND; then whether it may read the service.
    let authz = s
        .acl()
        .resolve(&st, token)
        .map_err(|e| Status::unauthenticated(e.to_string()))?;
    let node = if !req.node_name.is_empty() {
        st.nodes.get(&req.node_name).map(|n| &**n)
    } else if !req.node_id.is_empty() {
        st.nodes
            .values()
            .find(|n| n.id.eq_ignore_ascii_case(&req.node_id))
            .map(|n| &**n)
    } else {
        return Err(Status::invalid_argument("node_id or node_name is required"));
    }
    .ok_or_else(|| Status::not_found("node not found"))?;
    let svc = st
        .services
        .get(&(node.node.clone(), req.service_id.clone()))
        .ok_or_else(|| {
            Status::not_found(format!(
                "service {:?} not found on node {:?}",
                req.service_id, node.node
            ))
        })?;
    // Consul's: the caller may read the service it asks about.
    if !authz.service_read(&svc.service) {
        return Err(Status::permission_denied(
            authz.deny("service:read", &svc.service).to_string(),
        ));
    }
    let p = crate::endpoint::dataplane::bootstrap_params_for(&st, node, svc, s.datacenter());
    Ok(GetEnvoyBootstrapParamsResponse {
        service_kind: service_kind_number(p.service_kind),
        service: p.service,
        namespace: p.namespace,
        partition: p.partition,
        datacenter: p.datacenter,
        config: Some(to_struct(&p.config)),
        node_id: p.node_id,
        node_name: p.node_name,
        access_logs: p.access_logs,
        identity: p.identity,
    })
}

#[derive(Clone)]
pub(super) struct Dataplane;

impl Methods for Dataplane {
    const NAME: &'static str = "hashicorp.consul.dataplane.DataplaneService";

    fn call(s: &App, method: &str, req: http::Request<Body>) -> BoxFut {
        let s = s.clone();
        match method {
            "GetSupportedDataplaneFeatures" => {
                unary(req, |_: GetSupportedDataplaneFeaturesRequest| {
                    Ok(GetSupportedDataplaneFeaturesResponse {
                        supported_dataplane_features: FEATURES
                            .iter()
                            .map(|f| DataplaneFeatureSupport {
                                feature_name: *f,
                                supported: true,
                            })
                            .collect(),
                    })
                })
            }
            "GetEnvoyBootstrapParams" => {
                let token = token_of(&req);
                unary(req, move |r: GetEnvoyBootstrapParamsRequest| {
                    bootstrap(&s, token.as_deref(), r)
                })
            }
            _ => unimplemented(),
        }
    }
}
