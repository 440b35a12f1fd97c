//! `hashicorp.consul.acl.ACLService`: consul-dataplane's
//! `-credential-type=login`, the endpoint layer's logins
//! (`endpoint::login`) as HTTP's `/v1/acl/login` and `/logout` are.

use axum::http;
use tonic::Status;
use tonic::body::Body;

use super::{App, BoxFut, Methods, unary_async, unimplemented};
use crate::endpoint::Call;
use crate::endpoint::login::{self, Op, Value};

/// consul-dataplane's `-credential-type=login`: `Login` with the
/// workload's bearer token, `Logout` of the token it got, the same checks
/// and answers as `/v1/acl/login` and `/logout`.
#[derive(Clone)]
pub(super) struct AclService;

#[derive(Clone, PartialEq, prost::Message)]
pub struct LoginRequest {
    #[prost(string, tag = "1")]
    pub auth_method: String,
    #[prost(string, tag = "2")]
    pub bearer_token: String,
    #[prost(btree_map = "string, string", tag = "3")]
    pub meta: std::collections::BTreeMap<String, String>,
    #[prost(string, tag = "4")]
    pub namespace: String,
    #[prost(string, tag = "5")]
    pub partition: String,
    #[prost(string, tag = "6")]
    pub datacenter: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LoginToken {
    #[prost(string, tag = "1")]
    pub accessor_id: String,
    #[prost(string, tag = "2")]
    pub secret_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LoginResponse {
    #[prost(message, optional, tag = "1")]
    pub token: Option<LoginToken>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LogoutRequest {
    #[prost(string, tag = "1")]
    pub token: String,
    #[prost(string, tag = "2")]
    pub datacenter: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LogoutResponse {}

/// Only this datacenter (and Consul open source's one tenancy) answers.
fn local_only(s: &App, dc: &str, tenancy: &[&str]) -> Result<(), Status> {
    if !dc.is_empty() && dc != s.datacenter() {
        return Err(Status::invalid_argument(format!(
            "datacenter {dc:?}: log in through that datacenter's servers"
        )));
    }
    if tenancy.iter().any(|t| !t.is_empty() && *t != "default") {
        return Err(Status::invalid_argument(
            "only the default namespace and partition exist (Consul open source)",
        ));
    }
    Ok(())
}

impl Methods for AclService {
    const NAME: &'static str = "hashicorp.consul.acl.ACLService";

    fn call(s: &App, method: &str, req: http::Request<Body>) -> BoxFut {
        let s = s.clone();
        // Held to the login bound of one client IP, as HTTP's callers.
        let client = req
            .extensions()
            .get::<tonic::transport::server::TcpConnectInfo>()
            .and_then(|c| c.remote_addr())
            .map(|a| a.ip());
        match method {
            "Login" => unary_async(req, move |r: LoginRequest| {
                let s = s.clone();
                async move {
                    local_only(&s, &r.datacenter, &[&r.namespace, &r.partition])?;
                    let body = crate::structs::auth::LoginBody {
                        auth_method: r.auth_method,
                        bearer_token: r.bearer_token,
                        meta: r.meta,
                    };
                    let mut call = Call::new(None, Default::default());
                    call.client = client;
                    let answer = login::call(&s, call, Op::Login(body))
                        .await
                        .map_err(|e| Status::from(&e))?;
                    let Value::Token(t) = answer.value else {
                        return Err(Status::internal("unexpected answer"));
                    };
                    Ok(LoginResponse {
                        token: Some(LoginToken {
                            accessor_id: t.accessor_id,
                            secret_id: t.secret_id,
                        }),
                    })
                }
            }),
            "Logout" => unary_async(req, move |r: LogoutRequest| {
                let s = s.clone();
                async move {
                    local_only(&s, &r.datacenter, &[])?;
                    let token = Some(r.token).filter(|t| !t.is_empty());
                    let mut call = Call::new(token, Default::default());
                    call.client = client;
                    login::call(&s, call, Op::Logout)
                        .await
                        .map_err(|e| Status::from(&e))?;
                    Ok(LogoutResponse {})
                }
            }),
            _ => unimplemented(),
        }
    }
}
