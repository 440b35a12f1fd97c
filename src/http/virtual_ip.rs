//! `PUT /v1/internal/service-virtual-ip`: a service's manual virtual IPs
//! (Consul's `Internal.AssignManualServiceVIPs`), beside the one the
//! servers assign (`state::virtual_ip`). `service:write` on the service.
//! Checked here, then proposed as `Command::VirtualIpsSet`.

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::put;
use serde::Deserialize;
use serde_json::json;

use super::App;
use crate::error::{Error, Result};
use crate::request::authz::Authz;
use crate::request::decode_json;
use crate::state::virtual_ip::MAX_MANUAL;
use crate::state::{Command, Response as Applied};

pub fn routes() -> Router<App> {
    Router::new().route("/v1/internal/service-virtual-ip", put(assign_manual))
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Request {
    #[serde(default)]
    service: String,
    #[serde(rename = "ManualVIPs", default)]
    manual_vips: Vec<String>,
}

async fn assign_manual(State(s): State<App>, a: Authz, body: Bytes) -> Result<Response> {
    let req: Request = decode_json(&body)?;
    if req.service.is_empty() {
        return Err(Error::bad("Must provide a service name"));
    }
    a.require(a.service_write(&req.service), "service:write", &req.service)?;
    if req.manual_vips.len() > MAX_MANUAL {
        return Err(Error::bad(format!(
            "cannot associate more than {MAX_MANUAL} manual virtual IPs with the same service"
        )));
    }
    let mut manual = Vec::with_capacity(req.manual_vips.len());
    for ip in &req.manual_vips {
        let parsed: std::net::Ipv4Addr = ip
            .parse()
            .map_err(|_| Error::bad(format!("{ip:?} is not a valid IPv4 address")))?;
        let ip = parsed.to_string();
        if !manual.contains(&ip) {
            manual.push(ip);
        }
    }
    let cmd = Command::VirtualIpsSet {
        service: req.service,
        manual,
    };
    match s.write(cmd).await? {
        Applied::Manual(out) => {
            let from: Vec<_> = out
                .unassigned_from
                .iter()
                .map(|name| json!({ "ServiceName": { "Name": name }, "Peer": "" }))
                .collect();
            Ok(axum::Json(json!({ "Found": out.found, "UnassignedFrom": from })).into_response())
        }
        other => Err(Error::Internal(format!("unexpected answer {other:?}"))),
    }
}
