//! The state-of-the-world xDS protocol of one stream (`Session`, a state
//! machine without I/O), and how the stream's task (`super::stream`)
//! drives it. gRPC's proxyless clients speak it: besides proxies, a SotW
//! stream serves a client whose node id names a registered service
//! instance that is no proxy, for each listener it asks for the service of
//! that name (`super::grpc`).
//!
//! Per type URL: every response holds the whole subscribed set (for
//! listeners and clusters a resource left out is one removed), its own
//! `version_info` and nonce. A request naming the nonce of the type's
//! latest response is its ACK (`version_info` accepted) or NACK
//! (`error_detail`: logged and counted; the client keeps its previous
//! version, and the rejected content is not sent again, while the next
//! change is); a request naming an older nonce is stale and ignored whole.
//! One response per type awaits its answer at a time; types go out in
//! Envoy's order (clusters, endpoints, listeners, routes).

use std::collections::{BTreeMap, BTreeSet};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};

use super::resources::{CLUSTER, LISTENER, ORDER, Resource, Resources, known};
use super::stream::{Heard, Protocol};

#[derive(Debug, Default)]
struct Sub {
    wildcard: bool,
    names: BTreeSet<String>,
    /// The nonce of this type's latest response (empty: none yet).
    last_nonce: String,
    /// The latest response's version (a count per type).
    version: u64,
    /// What the latest response held (name → resource version); `None`:
    /// the next response goes out whatever it holds.
    sent: Option<BTreeMap<String, String>>,
    /// The latest response awaits its ACK or NACK.
    awaiting: bool,
}

/// What a request said.
#[derive(Debug, PartialEq)]
pub enum Reply {
    /// A first request, or a subscription change.
    None,
    Ack {
        type_url: String,
        version: String,
    },
    Nack {
        type_url: String,
        error: String,
    },
    /// It names an older response's nonce: ignored.
    Stale {
        type_url: String,
    },
    /// A type this server does not serve.
    Unknown {
        type_url: String,
    },
}

#[derive(Debug, Default)]
pub struct Session {
    subs: BTreeMap<&'static str, Sub>,
    resources: Resources,
    nonce: u64,
}

impl Session {
    /// Takes in one request.
    pub fn on_request(&mut self, req: &DiscoveryRequest) -> Reply {
        let Some(ty) = known(&req.type_url) else {
            return Reply::Unknown {
                type_url: req.type_url.clone(),
            };
        };
        let first = !self.subs.contains_key(ty);
        let sub = self.subs.entry(ty).or_default();
        if !req.response_nonce.is_empty() && req.response_nonce != sub.last_nonce {
            return Reply::Stale {
                type_url: req.type_url.clone(),
            };
        }
        let mut reply = Reply::None;
        if !req.response_nonce.is_empty() && sub.awaiting {
            sub.awaiting = false;
            reply = match &req.error_detail {
                Some(e) => Reply::Nack {
                    type_url: req.type_url.clone(),
                    error: e.message.clone(),
                },
                None => Reply::Ack {
                    type_url: req.type_url.clone(),
                    version: req.version_info.clone(),
                },
            };
        }
        let star = req.resource_names.iter().any(|n| n == "*");
        let names: BTreeSet<String> = req
            .resource_names
            .iter()
            .filter(|n| *n != "*")
            .cloned()
            .collect();
        // Listeners and clusters are wildcard types: a first request
        // naming nothing asks for all of them, and so do its followers
        // while they name nothing.
        let wildcard = star
            || ((ty == CLUSTER || ty == LISTENER) && names.is_empty() && (first || sub.wildcard));
        if first || wildcard != sub.wildcard || names != sub.names {
            sub.wildcard = wildcard;
            sub.names = names;
            // A new subscription is answered even if nothing changed.
            sub.sent = None;
        }
        reply
    }
}

impl Protocol for Session {
    type Request = DiscoveryRequest;
    type Response = DiscoveryResponse;
    const LOG: &'static str = "xds (sotw)";
    const PROXYLESS: bool = true;

    fn node(req: &DiscoveryRequest) -> Option<&Node> {
        req.node.as_ref()
    }

    fn set_resources(&mut self, resources: Resources) {
        self.resources = resources;
    }

    fn hear(&mut self, req: &DiscoveryRequest) -> Heard {
        match self.on_request(req) {
            Reply::Nack { type_url, error } => Heard::Nack { type_url, error },
            Reply::Stale { type_url } => Heard::Stale { type_url },
            Reply::Unknown { type_url } => Heard::Unknown { type_url },
            Reply::Ack { .. } | Reply::None => Heard::Nothing,
        }
    }

    /// Names subscribed, over all types.
    fn names(&self) -> usize {
        self.subs.values().map(|s| s.names.len()).sum()
    }

    fn subscribed(&self, type_url: &str) -> BTreeSet<String> {
        self.subs
            .get(type_url)
            .map(|s| s.names.clone())
            .unwrap_or_default()
    }

    /// The next response to send: of the first type (in Envoy's order)
    /// whose subscribed set changed and whose latest response was answered.
    fn next_push(&mut self) -> Option<DiscoveryResponse> {
        let empty = BTreeMap::new();
        for ty in ORDER {
            let Some(sub) = self.subs.get_mut(ty) else {
                continue;
            };
            if sub.awaiting {
                continue;
            }
            let all = self.resources.get(ty).unwrap_or(&empty);
            let wanted: Vec<(&String, &Resource)> = if sub.wildcard {
                all.iter().collect()
            } else {
                sub.names
                    .iter()
                    .filter_map(|n| all.get_key_value(n))
                    .collect()
            };
            let held: BTreeMap<String, String> = wanted
                .iter()
                .map(|(n, r)| ((*n).clone(), r.version.clone()))
                .collect();
            if sub.sent.as_ref() == Some(&held) {
                continue;
            }
            self.nonce += 1;
            sub.version += 1;
            let nonce = format!("{:x}", self.nonce);
            let resources = wanted.iter().map(|(_, r)| (*r.any).clone()).collect();
            sub.sent = Some(held);
            sub.awaiting = true;
            sub.last_nonce = nonce.clone();
            return Some(DiscoveryResponse {
                version_info: sub.version.to_string(),
                resources,
                type_url: ty.to_string(),
                nonce,
                ..Default::default()
            });
        }
        None
    }

    fn log_push(proxy: &str, push: &DiscoveryResponse) {
        tracing::debug!(proxy = %proxy, type_url = %push.type_url, version = %push.version_info, resources = push.resources.len(), "xds (sotw): push");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::resources::{ENDPOINT, ROUTE, Resource};
    use envoy_types::pb::google::protobuf::Any;

    fn res(entries: &[(&'static str, &str, &str)]) -> Resources {
        let mut out = Resources::new();
        for (ty, name, version) in entries {
            out.entry(*ty).or_default().insert(
                name.to_string(),
                Resource {
                    version: version.to_string(),
                    // The name in the payload, so a response's content shows.
                    any: std::sync::Arc::new(Any {
                        type_url: ty.to_string(),
                        value: format!("{name}@{version}").into_bytes(),
                    }),
                },
            );
        }
        out
    }

    fn req(ty: &str, names: &[&str], version: &str, nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: ty.into(),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            version_info: version.into(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    fn held(r: &DiscoveryResponse) -> Vec<String> {
        r.resources
            .iter()
            .map(|a| String::from_utf8(a.value.clone()).unwrap())
            .collect()
    }

    fn nack(ty: &str, version: &str, nonce: &str) -> DiscoveryRequest {
        let mut r = req(ty, &[], version, nonce);
        r.error_detail = Some(envoy_types::pb::google::rpc::Status {
            code: 3,
            message: "bad".into(),
            details: vec![],
        });
        r
    }

    #[test]
    fn wildcard_types_send_all_and_named_types_what_was_asked() {
        let mut s = Session::new();
        s.set_resources(res(&[
            (CLUSTER, "a", "1"),
            (CLUSTER, "b", "1"),
            (ENDPOINT, "a", "1"),
            (ENDPOINT, "b", "1"),
        ]));
        assert_eq!(s.on_request(&req(ENDPOINT, &["b"], "", "")), Reply::None);
        assert_eq!(s.on_request(&req(CLUSTER, &[], "", "")), Reply::None);
        let cds = s.next_push().expect("clusters first");
        assert_eq!(cds.type_url, CLUSTER);
        assert_eq!(held(&cds), ["a@1", "b@1"]);
        assert_eq!(cds.version_info, "1");
        // One response per type awaits its answer; other types go on.
        let eds = s.next_push().expect("then endpoints");
        assert_eq!(held(&eds), ["b@1"]);
        assert!(s.next_push().is_none());
        assert_ne!(cds.nonce, eds.nonce);
    }

    #[test]
    fn an_ack_records_the_version_and_only_changed_types_are_resent() {
        let mut s = Session::new();
        s.set_resources(res(&[(CLUSTER, "a", "1"), (ENDPOINT, "a", "1")]));
        s.on_request(&req(CLUSTER, &[], "", ""));
        s.on_request(&req(ENDPOINT, &["a"], "", ""));
        let cds = s.next_push().unwrap();
        let eds = s.next_push().unwrap();
        assert_eq!(
            s.on_request(&req(CLUSTER, &[], &cds.version_info, &cds.nonce)),
            Reply::Ack {
                type_url: CLUSTER.into(),
                version: "1".into()
            }
        );
        s.on_request(&req(ENDPOINT, &["a"], &eds.version_info, &eds.nonce));
        assert!(s.next_push().is_none(), "nothing changed");
        // A rebuild that changes the endpoints only.
        s.set_resources(res(&[(CLUSTER, "a", "1"), (ENDPOINT, "a", "2")]));
        let next = s.next_push().expect("the endpoints again");
        assert_eq!(next.type_url, ENDPOINT);
        assert_eq!(next.version_info, "2");
        assert_eq!(held(&next), ["a@2"]);
        assert!(s.next_push().is_none(), "clusters unchanged");
    }

    #[test]
    fn a_removed_listener_is_left_out_of_the_next_whole_set() {
        let mut s = Session::new();
        s.set_resources(res(&[(LISTENER, "l1", "1"), (LISTENER, "l2", "1")]));
        s.on_request(&req(LISTENER, &[], "", ""));
        let first = s.next_push().unwrap();
        s.on_request(&req(LISTENER, &[], "1", &first.nonce));
        s.set_resources(res(&[(LISTENER, "l2", "1")]));
        let next = s.next_push().expect("a removal is a change");
        assert_eq!(held(&next), ["l2@1"]);
    }

    #[test]
    fn a_stale_nonce_is_ignored_whole() {
        let mut s = Session::new();
        s.set_resources(res(&[(ROUTE, "r1", "1"), (ROUTE, "r2", "1")]));
        s.on_request(&req(ROUTE, &["r1"], "", ""));
        let first = s.next_push().unwrap();
        s.on_request(&req(ROUTE, &["r1"], "1", &first.nonce));
        s.set_resources(res(&[(ROUTE, "r1", "2"), (ROUTE, "r2", "1")]));
        let second = s.next_push().unwrap();
        // An answer to the first response arrives late, naming r2 too: it
        // neither acknowledges the second response nor subscribes.
        assert_eq!(
            s.on_request(&req(ROUTE, &["r1", "r2"], "1", &first.nonce)),
            Reply::Stale {
                type_url: ROUTE.into()
            }
        );
        assert!(
            s.next_push().is_none(),
            "the second still awaits its answer"
        );
        assert_eq!(s.subscribed(ROUTE), BTreeSet::from(["r1".to_string()]));
        // The answer to the second, with the new name: both are sent.
        assert!(matches!(
            s.on_request(&req(ROUTE, &["r1", "r2"], "2", &second.nonce)),
            Reply::Ack { .. }
        ));
        let third = s.next_push().expect("the new subscription is answered");
        assert_eq!(held(&third), ["r1@2", "r2@1"]);
    }

    #[test]
    fn a_nack_keeps_the_previous_version_and_the_next_change_is_pushed() {
        let mut s = Session::new();
        s.set_resources(res(&[(CLUSTER, "a", "1")]));
        s.on_request(&req(CLUSTER, &[], "", ""));
        let first = s.next_push().unwrap();
        s.on_request(&req(CLUSTER, &[], "1", &first.nonce));
        s.set_resources(res(&[(CLUSTER, "a", "bad")]));
        let rejected = s.next_push().unwrap();
        assert_eq!(
            s.on_request(&nack(CLUSTER, "1", &rejected.nonce)),
            Reply::Nack {
                type_url: CLUSTER.into(),
                error: "bad".into()
            }
        );
        assert!(
            s.next_push().is_none(),
            "the rejected content is not sent again"
        );
        s.set_resources(res(&[(CLUSTER, "a", "3")]));
        let next = s.next_push().expect("the next change");
        assert_eq!(held(&next), ["a@3"]);
        assert_eq!(next.version_info, "3");
    }

    #[test]
    fn a_new_subscription_is_answered_even_if_nothing_changed() {
        let mut s = Session::new();
        s.set_resources(res(&[(ENDPOINT, "a", "1")]));
        s.on_request(&req(ENDPOINT, &["a"], "", ""));
        let first = s.next_push().unwrap();
        s.on_request(&req(ENDPOINT, &["a", "missing"], "1", &first.nonce));
        let next = s.next_push().expect("answered");
        assert_eq!(held(&next), ["a@1"]);
        assert_eq!(s.names(), 2);
        // An unknown type is said so and changes nothing.
        assert!(matches!(
            s.on_request(&req("type.googleapis.com/x.Y", &[], "", "")),
            Reply::Unknown { .. }
        ));
    }
}
