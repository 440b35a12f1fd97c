//! The incremental (Delta) xDS protocol of one stream, as a state machine
//! without I/O: the proxy's subscriptions per type (wildcard for clusters
//! and listeners, named for endpoints and routes), the version of every
//! resource the proxy holds, and the one response awaiting its ACK or NACK.
//!
//! One response is in flight at a time and types go out in Envoy's order
//! (clusters, endpoints, listeners, routes), so a proxy never sees a
//! listener before the clusters it names, nor a cluster's endpoints before
//! the cluster. A NACK is logged with the proxy's error and leaves the
//! proxy on what it last accepted; the versions sent are still recorded,
//! so the same rejected content is not sent again and again, while the next
//! change of a resource is pushed as usual.
//!
//! The stream's task (`super::stream`) drives it (`impl Protocol`).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource as PbResource,
};

use super::resources::{CLUSTER, LISTENER, ORDER, Resource, Resources, known};
use super::stream::{Heard, Protocol};

#[derive(Debug, Default)]
struct Sub {
    wildcard: bool,
    names: BTreeSet<String>,
    /// name → version the proxy holds (as far as this stream knows).
    sent: HashMap<String, String>,
}

/// What a request said about the response in flight.
#[derive(Debug, PartialEq)]
pub enum Reply {
    /// No nonce, or one of an earlier response: a subscription change.
    None,
    Ack {
        type_url: String,
    },
    Nack {
        type_url: String,
        error: String,
    },
    /// A type this server does not serve (secrets, runtime, ...).
    Unknown {
        type_url: String,
    },
}

#[derive(Debug, Default)]
pub struct Session {
    subs: BTreeMap<&'static str, Sub>,
    resources: Resources,
    in_flight: Option<String>,
    nonce: u64,
    /// Responses sent on this stream (for system_version_info).
    pushes: u64,
}

impl Session {
    /// Takes in one request of the proxy.
    pub fn on_request(&mut self, req: &DeltaDiscoveryRequest) -> Reply {
        let Some(ty) = known(&req.type_url) else {
            return Reply::Unknown {
                type_url: req.type_url.clone(),
            };
        };
        let first = !self.subs.contains_key(ty);
        let sub = self.subs.entry(ty).or_default();
        if first {
            // Clusters and listeners are wildcard types: a first request
            // naming nothing asks for all of them.
            sub.wildcard =
                (ty == CLUSTER || ty == LISTENER) && req.resource_names_subscribe.is_empty();
            // A reconnecting proxy says what it holds: only what differs
            // is sent again.
            sub.sent.extend(
                req.initial_resource_versions
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone())),
            );
        }
        for name in &req.resource_names_subscribe {
            if name == "*" {
                sub.wildcard = true;
            } else {
                sub.names.insert(name.clone());
                if !first {
                    // A (re)subscription is answered even if unchanged.
                    sub.sent.remove(name);
                }
            }
        }
        for name in &req.resource_names_unsubscribe {
            if name == "*" {
                sub.wildcard = false;
            } else {
                sub.names.remove(name);
                sub.sent.remove(name);
            }
        }
        if req.response_nonce.is_empty() || self.in_flight.as_deref() != Some(&*req.response_nonce)
        {
            return Reply::None;
        }
        self.in_flight = None;
        match &req.error_detail {
            Some(e) => Reply::Nack {
                type_url: req.type_url.clone(),
                error: e.message.clone(),
            },
            None => Reply::Ack {
                type_url: req.type_url.clone(),
            },
        }
    }
}

impl Protocol for Session {
    type Request = DeltaDiscoveryRequest;
    type Response = DeltaDiscoveryResponse;
    const LOG: &'static str = "xds";
    const PROXYLESS: bool = false;

    fn node(req: &DeltaDiscoveryRequest) -> Option<&Node> {
        req.node.as_ref()
    }

    fn set_resources(&mut self, resources: Resources) {
        self.resources = resources;
    }

    fn hear(&mut self, req: &DeltaDiscoveryRequest) -> Heard {
        match self.on_request(req) {
            Reply::Nack { type_url, error } => Heard::Nack { type_url, error },
            Reply::Unknown { type_url } => Heard::Unknown { type_url },
            Reply::Ack { .. } | Reply::None => Heard::Nothing,
        }
    }

    /// The names the proxy subscribed to, and those it says it holds that
    /// this server does not serve, over all types.
    fn names(&self) -> usize {
        let empty = BTreeMap::new();
        self.subs
            .iter()
            .map(|(ty, s)| {
                let all = self.resources.get(ty).unwrap_or(&empty);
                s.names.len() + s.sent.keys().filter(|n| !all.contains_key(*n)).count()
            })
            .sum()
    }

    fn subscribed(&self, type_url: &str) -> BTreeSet<String> {
        self.subs
            .get(type_url)
            .map(|s| s.names.clone())
            .unwrap_or_default()
    }

    /// The next response to send, if none is awaiting its ACK and some
    /// subscribed resource changed (types in Envoy's order).
    fn next_push(&mut self) -> Option<DeltaDiscoveryResponse> {
        if self.in_flight.is_some() {
            return None;
        }
        let empty = BTreeMap::new();
        for ty in ORDER {
            let Some(sub) = self.subs.get_mut(ty) else {
                continue;
            };
            let all = self.resources.get(ty).unwrap_or(&empty);
            let mut resources = Vec::new();
            let wanted: Box<dyn Iterator<Item = (&String, &Resource)>> = if sub.wildcard {
                Box::new(all.iter())
            } else {
                Box::new(sub.names.iter().filter_map(|n| all.get_key_value(n)))
            };
            for (name, r) in wanted {
                if sub.sent.get(name) != Some(&r.version) {
                    resources.push(PbResource {
                        name: name.clone(),
                        version: r.version.clone(),
                        resource: Some((*r.any).clone()),
                        ..Default::default()
                    });
                }
            }
            let removed: Vec<String> = sub
                .sent
                .keys()
                .filter(|n| !all.contains_key(*n))
                .cloned()
                .collect();
            if resources.is_empty() && removed.is_empty() {
                continue;
            }
            for r in &resources {
                sub.sent.insert(r.name.clone(), r.version.clone());
            }
            for n in &removed {
                sub.sent.remove(n);
            }
            self.nonce += 1;
            self.pushes += 1;
            let nonce = format!("{:x}", self.nonce);
            self.in_flight = Some(nonce.clone());
            return Some(DeltaDiscoveryResponse {
                system_version_info: self.pushes.to_string(),
                resources,
                type_url: ty.to_string(),
                removed_resources: removed,
                nonce,
                ..Default::default()
            });
        }
        None
    }

    fn log_push(proxy: &str, push: &DeltaDiscoveryResponse) {
        tracing::debug!(proxy = %proxy, type_url = %push.type_url, resources = push.resources.len(), removed = push.removed_resources.len(), "xds: push");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::resources::{ENDPOINT, Resource};
    use envoy_types::pb::google::protobuf::Any;
    use envoy_types::pb::google::rpc::Status;

    fn res(entries: &[(&'static str, &str, &str)]) -> Resources {
        let mut out = Resources::new();
        for (ty, name, version) in entries {
            out.entry(*ty).or_default().insert(
                name.to_string(),
                Resource {
                    version: version.to_string(),
                    any: std::sync::Arc::new(Any::default()),
                },
            );
        }
        out
    }

    fn req(ty: &str, subscribe: &[&str], nonce: &str) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: ty.into(),
            resource_names_subscribe: subscribe.iter().map(|s| s.to_string()).collect(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    #[test]
    fn one_in_flight_in_order_and_only_changes_after() {
        let mut s = Session::new();
        s.set_resources(res(&[(CLUSTER, "a", "1"), (ENDPOINT, "a", "1")]));
        assert_eq!(s.on_request(&req(LISTENER, &[], "")), Reply::None);
        assert_eq!(s.on_request(&req(CLUSTER, &[], "")), Reply::None);
        let cds = s.next_push().expect("clusters first");
        assert_eq!(cds.type_url, CLUSTER);
        assert!(s.next_push().is_none(), "waits for the ACK");
        s.on_request(&req(ENDPOINT, &["a"], ""));
        assert_eq!(
            s.on_request(&req(CLUSTER, &[], &cds.nonce)),
            Reply::Ack {
                type_url: CLUSTER.into()
            }
        );
        let eds = s.next_push().expect("then endpoints");
        assert_eq!(eds.type_url, ENDPOINT);
        s.on_request(&req(ENDPOINT, &[], &eds.nonce));
        assert!(s.next_push().is_none(), "nothing changed");
        // A new version of one endpoint set and a cluster removed.
        s.set_resources(res(&[(ENDPOINT, "a", "2")]));
        let cds = s.next_push().unwrap();
        assert_eq!(cds.removed_resources, vec!["a".to_string()]);
        assert!(cds.resources.is_empty());
        s.on_request(&req(CLUSTER, &[], &cds.nonce));
        let eds = s.next_push().unwrap();
        assert_eq!(eds.resources[0].version, "2");
    }

    #[test]
    fn a_nack_is_reported_and_later_changes_still_pushed() {
        let mut s = Session::new();
        s.set_resources(res(&[(CLUSTER, "a", "1")]));
        s.on_request(&req(CLUSTER, &[], ""));
        let r = s.next_push().unwrap();
        let mut nack = req(CLUSTER, &[], &r.nonce);
        nack.error_detail = Some(Status {
            code: 3,
            message: "bad cluster".into(),
            details: vec![],
        });
        assert_eq!(
            s.on_request(&nack),
            Reply::Nack {
                type_url: CLUSTER.into(),
                error: "bad cluster".into()
            }
        );
        assert!(
            s.next_push().is_none(),
            "the rejected content is not resent"
        );
        s.set_resources(res(&[(CLUSTER, "a", "2")]));
        assert_eq!(s.next_push().unwrap().resources[0].version, "2");
    }

    #[test]
    fn a_reconnecting_proxy_gets_only_what_it_lacks() {
        let mut s = Session::new();
        s.set_resources(res(&[(CLUSTER, "a", "1"), (CLUSTER, "b", "2")]));
        let mut r = req(CLUSTER, &[], "");
        r.initial_resource_versions.insert("a".into(), "1".into());
        r.initial_resource_versions
            .insert("gone".into(), "1".into());
        s.on_request(&r);
        let push = s.next_push().unwrap();
        let names: Vec<_> = push.resources.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["b"]);
        assert_eq!(push.removed_resources, ["gone"]);
    }
}
