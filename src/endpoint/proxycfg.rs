//! Who may have a proxy's config (`may_watch`), what of its endpoints the
//! token sees (`reader`), and the server as the xDS streams see it
//! (`Mesh`): decided here for the xDS streams (`grpc`) and the HTTP
//! snapshot read (`http::proxycfg`) alike.

use std::sync::Arc;

use tokio::sync::watch;
use tonic::Status;

use crate::acl::Authorizer;
use crate::proxycfg::{ProxyKey, Reader, Snapshot};
use crate::server::Server;
use crate::structs::acl::{ANONYMOUS_SECRET, secret_hash};

/// Why a caller does not get a proxy's config.
pub enum Refused {
    /// Consul's `Permission denied: …` text.
    Denied(String),
    /// No such proxy, and the caller may hear so.
    Unknown,
}

/// May `a` have the config of proxy `id`, whose destination is `service`
/// (`None`: no such proxy)? Consul asks `service:write` on the destination:
/// the config carries its leaf key. An unknown proxy is refused as a
/// forbidden one is, in the same words (naming the proxy's ID either way),
/// so a token learns nothing of proxies it may not watch; only a token that
/// may do anything (management, or ACLs off) hears that it is unknown.
pub fn may_watch(
    a: &Authorizer, id: &str, service: Option<&str>,
) -> std::result::Result<(), Refused> {
    match service {
        Some(svc) if a.service_write(svc) => Ok(()),
        None if a.acl_write() => Err(Refused::Unknown),
        _ => Err(Refused::Denied(a.deny("service:write", id).to_string())),
    }
}

/// The token as a proxy's config is narrowed for it (`proxycfg::visible`;
/// `None`: ACLs off, nothing hidden): its authorizer, and whether other
/// datacenters know it (not `Local`). A secret that no longer resolves
/// reads nothing (its stream or read is refused at its next check anyway).
pub fn reader(s: &Server, token: Option<&str>) -> Option<Reader> {
    let acl = s.acl();
    if !acl.enabled() {
        return None;
    }
    let st = s.state();
    let datacenter = s.datacenter().to_string();
    let Ok(authz) = acl.resolve(&st, token) else {
        let none = Authorizer::new("", &[], crate::acl::DefaultPolicy::Deny);
        return Some(Reader {
            authz: Arc::new(none),
            datacenter,
            global: false,
        });
    };
    // The anonymous token (no secret) is known everywhere.
    let secret = token.filter(|t| !t.is_empty()).unwrap_or(ANONYMOUS_SECRET);
    let global =
        crate::state::acl::token_by_secret_hash(&st, &secret_hash(secret)).is_none_or(|t| !t.local);
    Some(Reader {
        authz,
        datacenter,
        global,
    })
}

/// The server's catalog and proxycfg manager, as the xDS streams see them
/// (`grpc` serves them).
pub struct Mesh(pub Arc<Server>);

impl crate::xds::Source for Mesh {
    fn locate(&self, service_id: &str, node: Option<&str>) -> Option<ProxyKey> {
        let st = self.0.state();
        match node {
            Some(n) => {
                let key = (n.to_string(), service_id.to_string());
                st.services.contains_key(&key).then_some(key)
            }
            // A proxy's service ID is unique in practice (the dataplane's
            // node ID is it); the first node holding it is taken.
            None => st
                .services
                .iter()
                .find(|((_, id), svc)| id == service_id && svc.is_xds_proxy())
                .map(|(k, _)| k.clone()),
        }
    }

    fn snapshot(&self, key: &ProxyKey) -> Option<watch::Receiver<Option<Arc<Snapshot>>>> {
        self.0.proxycfg().snapshot(key)
    }

    fn identify(&self, token: Option<&str>) -> Result<crate::xds::Caller, Status> {
        use crate::xds::Caller;
        if !self.0.acl().enabled() {
            return Ok(Caller::Token);
        }
        let authz = self
            .0
            .acl()
            .resolve(&self.0.state(), token)
            .map_err(|e| Status::permission_denied(e.to_string()))?;
        Ok(if authz.accessor() == crate::structs::acl::ANONYMOUS_ID {
            Caller::Anonymous
        } else {
            Caller::Token
        })
    }

    fn authorize(
        &self, token: Option<&str>, proxy_id: &str, service: Option<&str>,
    ) -> Result<(), Status> {
        let authz = self
            .0
            .acl()
            .resolve(&self.0.state(), token)
            .map_err(|e| Status::permission_denied(e.to_string()))?;
        match may_watch(&authz, proxy_id, service) {
            // An unknown proxy the caller may hear of: the stream says so.
            Ok(()) | Err(Refused::Unknown) => Ok(()),
            Err(Refused::Denied(why)) => Err(Status::permission_denied(why)),
        }
    }

    fn acl_changes(&self) -> watch::Receiver<u64> {
        self.0.watches().subscribe(&crate::state::keys::ACL)
    }

    fn locate_instance(&self, service_id: &str, node: Option<&str>) -> Option<(ProxyKey, String)> {
        let st = self.0.state();
        // Any registration but a proxy's (which takes the sidecar's path)
        // or a gateway's.
        let plain =
            |svc: &crate::structs::NodeService| svc.kind == crate::structs::ServiceKind::Typical;
        match node {
            Some(n) => {
                let key = (n.to_string(), service_id.to_string());
                let svc = st.services.get(&key).filter(|s| plain(s))?;
                Some((key, svc.service.clone()))
            }
            None => st
                .services
                .iter()
                .find(|((_, id), svc)| id == service_id && plain(svc))
                .map(|(k, svc)| (k.clone(), svc.service.clone())),
        }
    }

    fn proxyless(&self, instance: ProxyKey) -> crate::proxycfg::Proxyless {
        self.0.proxycfg().proxyless(instance)
    }

    fn may_read(&self, token: Option<&str>, service: &str) -> bool {
        self.0
            .acl()
            .resolve(&self.0.state(), token)
            .is_ok_and(|a| a.service_read(service))
    }

    fn reader(&self, token: Option<&str>) -> Option<crate::proxycfg::Reader> {
        reader(&self.0, token)
    }

    fn expiry(&self, token: Option<&str>) -> Option<std::time::SystemTime> {
        super::blocking::token_expiry(&self.0, token)
    }
}
