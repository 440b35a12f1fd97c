//! What a catalog registration must satisfy before it is proposed:
//! everything that can be refused without the state is refused here, by
//! the servers' catalog endpoint and by a client agent alike.

use super::{BadStatus, HEALTH_MAINT, HealthCheck, NodeService, RegisterRequest};
use crate::error::{Error, Result};

/// Checks a registration and fills in what Consul defaults (the
/// datacenter). Everything that can be refused without the state is
/// refused here.
pub fn validate_register(req: &mut RegisterRequest, dc: &str) -> Result<()> {
    check_dc(&req.datacenter, dc)?;
    req.datacenter = dc.to_string();
    if req.node.is_empty() {
        return Err(Error::bad("Must provide node"));
    }
    if req.address.is_empty() && !req.skip_node_update {
        return Err(Error::bad("Must provide address"));
    }
    if let Some(svc) = &req.service {
        validate_service(svc)?;
    }
    for check in req.check.iter().chain(req.checks.iter()) {
        validate_check(check, &req.node)?;
    }
    Ok(())
}

pub fn check_dc(want: &str, dc: &str) -> Result<()> {
    if !want.is_empty() && want != dc {
        return Err(Error::bad(format!("No path to datacenter {want:?}")));
    }
    Ok(())
}

fn valid_port(p: i64) -> bool {
    (0..=65535).contains(&p)
}

pub fn validate_service(svc: &NodeService) -> Result<()> {
    if svc.service.is_empty() {
        return Err(Error::bad("Must provide service name (Service.Service)"));
    }
    if !valid_port(svc.port) {
        return Err(Error::bad(format!(
            "Invalid service port {}: must be between 0 and 65535",
            svc.port
        )));
    }
    if svc.weights.passing < 0 || svc.weights.warning < 0 {
        return Err(Error::bad("Service weights must not be negative"));
    }
    if svc.is_connect_proxy() {
        if svc.proxy.destination_service_name.is_empty() {
            return Err(Error::bad(
                "Proxy.DestinationServiceName must be set for a Connect proxy",
            ));
        }
        if svc.port == 0 && svc.socket_path.is_empty() {
            return Err(Error::bad(
                "Port or SocketPath must be set for a Connect proxy",
            ));
        }
    }
    // As central config's proxy-defaults and service-defaults are checked
    // (`config_check`), in the same words.
    if !matches!(svc.proxy.mode.as_str(), "" | "direct" | "transparent") {
        return Err(Error::bad(format!(
            "Invalid proxy mode: {:?}",
            svc.proxy.mode
        )));
    }
    let outbound = svc.proxy.transparent_proxy.outbound_listener_port;
    if !valid_port(outbound) {
        return Err(Error::bad(format!(
            "Invalid TransparentProxy.OutboundListenerPort {outbound}: must be between 0 and 65535"
        )));
    }
    Ok(())
}

pub fn validate_check(check: &HealthCheck, node: &str) -> Result<()> {
    if !check.node.is_empty() && check.node != node {
        return Err(Error::bad(format!(
            "Node {:?} of check {:?} does not match the registration's node {node:?}",
            check.node, check.check_id
        )));
    }
    if check.check_id.is_empty() && check.name.is_empty() {
        return Err(Error::bad("Must provide a CheckID or Name for checks"));
    }
    // Any other unknown status was refused when the body was decoded.
    if check.status == HEALTH_MAINT {
        return Err(Error::bad(BadStatus(check.status.to_string()).to_string()));
    }
    Ok(())
}
