//! Turning change sets into events, and the state into snapshot events.
//!
//! Topics and payloads follow Consul's streaming: `ServiceHealth` and
//! `ServiceHealthConnect` carry a CheckServiceNode (`{Node, Service,
//! Checks}`) keyed by service name (a connect proxy's under its destination
//! on the connect topic); each config entry kind is a topic keyed by name;
//! `KV` is keyed by key.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use serde::Serialize;
use serde_json::{Value, json};

use crate::state::catalog::node_services;
use crate::state::{ChangeSet, Row, State, Table};
use crate::structs::NodeService;
use crate::structs::config_entry::Kind;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Topic {
    ServiceHealth,
    ServiceHealthConnect,
    ProxyDefaults,
    ServiceDefaults,
    ServiceRouter,
    ServiceSplitter,
    ServiceResolver,
    #[serde(rename = "KV")]
    Kv,
}

impl Topic {
    pub fn parse(s: &str) -> Option<Topic> {
        Some(match s {
            "ServiceHealth" => Topic::ServiceHealth,
            "ServiceHealthConnect" => Topic::ServiceHealthConnect,
            "ProxyDefaults" | "proxy-defaults" => Topic::ProxyDefaults,
            "ServiceDefaults" | "service-defaults" => Topic::ServiceDefaults,
            "ServiceRouter" | "service-router" => Topic::ServiceRouter,
            "ServiceSplitter" | "service-splitter" => Topic::ServiceSplitter,
            "ServiceResolver" | "service-resolver" => Topic::ServiceResolver,
            "KV" | "kv" => Topic::Kv,
            _ => return None,
        })
    }

    pub fn of_kind(kind: Kind) -> Topic {
        match kind {
            Kind::ProxyDefaults => Topic::ProxyDefaults,
            Kind::ServiceDefaults => Topic::ServiceDefaults,
            Kind::ServiceRouter => Topic::ServiceRouter,
            Kind::ServiceSplitter => Topic::ServiceSplitter,
            Kind::ServiceResolver => Topic::ServiceResolver,
        }
    }

    fn kind(self) -> Option<Kind> {
        Some(match self {
            Topic::ProxyDefaults => Kind::ProxyDefaults,
            Topic::ServiceDefaults => Kind::ServiceDefaults,
            Topic::ServiceRouter => Kind::ServiceRouter,
            Topic::ServiceSplitter => Kind::ServiceSplitter,
            Topic::ServiceResolver => Kind::ServiceResolver,
            _ => return None,
        })
    }
}

/// One event, serialized once when it is made (its NDJSON line).
#[derive(Debug)]
pub struct Event {
    pub topic: Topic,
    pub key: String,
    pub index: u64,
    pub payload: Value,
    pub line: Bytes,
}

impl Event {
    fn new(topic: Topic, key: String, index: u64, op: &str, value: Value) -> Event {
        let payload = json!({ "Op": op, "Value": value });
        let mut line = serde_json::to_vec(&json!({
            "Topic": topic, "Key": key, "Index": index, "Payload": payload,
        }))
        .expect("events serialize");
        line.push(b'\n');
        Event {
            topic,
            key,
            index,
            payload,
            line: Bytes::from(line),
        }
    }

    /// Bytes this event holds in a buffer (for the memory cap).
    pub fn size(&self) -> usize {
        self.line.len() * 2 + self.key.len() + 64
    }

    pub fn op(&self) -> &str {
        self.payload["Op"].as_str().unwrap_or_default()
    }
}

/// `{Node, Service, Checks}` for one instance in `state`.
fn check_service_node(state: &State, node: &str, svc: &NodeService) -> Value {
    let checks: Vec<_> = crate::state::catalog::node_checks(state, node)
        .filter(|c| c.service_id.is_empty() || c.service_id == svc.id)
        .collect();
    json!({ "Node": state.nodes.get(node), "Service": svc, "Checks": checks })
}

/// Topic keys an instance is published under.
fn health_keys(svc: &NodeService) -> Vec<(Topic, String)> {
    let mut keys = vec![(Topic::ServiceHealth, svc.service.clone())];
    if svc.is_connect_proxy() && !svc.proxy.destination_service_name.is_empty() {
        keys.push((
            Topic::ServiceHealthConnect,
            svc.proxy.destination_service_name.clone(),
        ));
    } else if svc.connect.get("Native").and_then(Value::as_bool) == Some(true) {
        keys.push((Topic::ServiceHealthConnect, svc.service.clone()));
    }
    keys
}

/// The events one applied command produced, from its changes and the
/// state it left behind.
pub fn events_of(set: &ChangeSet, state: &State) -> Vec<Event> {
    let mut out = Vec::new();
    // Instances whose health view changed: (node, service id) → the row
    // before (for a deregistration).
    let mut instances: BTreeMap<(String, String), Option<Arc<NodeService>>> = BTreeMap::new();
    for c in &set.changes {
        match (c.table, &c.before, &c.after) {
            (Table::Kv, before, after) => {
                let (op, row) = match (after, before) {
                    (Some(Row::Kv(e)), _) => ("Upsert", e),
                    (None, Some(Row::Kv(e))) => ("Delete", e),
                    _ => continue,
                };
                out.push(Event::new(
                    Topic::Kv,
                    row.key.clone(),
                    set.index,
                    op,
                    json!(row),
                ));
            }
            (Table::Config, before, after) => {
                let (op, e) = match (after, before) {
                    (Some(Row::Config(e)), _) => ("Upsert", e),
                    (None, Some(Row::Config(e))) => ("Delete", e),
                    _ => continue,
                };
                let topic = Topic::of_kind(e.kind());
                out.push(Event::new(
                    topic,
                    e.name().to_string(),
                    set.index,
                    op,
                    e.to_json(),
                ));
            }
            (Table::Services, before, after) => {
                let (node, id) = c.key.split_once('\0').unwrap_or_default();
                let before = match before {
                    Some(Row::Service(s)) => Some(s.clone()),
                    _ => None,
                };
                if after.is_none() {
                    instances.insert((node.into(), id.into()), before);
                } else {
                    instances.entry((node.into(), id.into())).or_insert(None);
                }
            }
            (Table::Checks, before, after) => {
                let check = match (after, before) {
                    (Some(Row::Check(c)), _) | (None, Some(Row::Check(c))) => c,
                    _ => continue,
                };
                if check.service_id.is_empty() {
                    for s in node_services(state, &check.node) {
                        instances
                            .entry((check.node.clone(), s.id.clone()))
                            .or_insert(None);
                    }
                } else {
                    instances
                        .entry((check.node.clone(), check.service_id.clone()))
                        .or_insert(None);
                }
            }
            (Table::Nodes, _, _) => {
                for s in node_services(state, &c.key) {
                    instances
                        .entry((c.key.clone(), s.id.clone()))
                        .or_insert(None);
                }
            }
            _ => {}
        }
    }
    for ((node, id), removed) in instances {
        let current = state.services.get(&(node.clone(), id.clone()));
        match (current, removed) {
            (Some(svc), _) => {
                let value = check_service_node(state, &node, svc);
                for (topic, key) in health_keys(svc) {
                    out.push(Event::new(topic, key, set.index, "Register", value.clone()));
                }
            }
            (None, Some(old)) => {
                let value = json!({ "Node": { "Node": node }, "Service": old, "Checks": [] });
                for (topic, key) in health_keys(&old) {
                    out.push(Event::new(
                        topic,
                        key,
                        set.index,
                        "Deregister",
                        value.clone(),
                    ));
                }
            }
            (None, None) => {}
        }
    }
    out
}

/// Events describing everything `key` of `topic` holds now ("" = all).
pub fn snapshot_events(state: &State, topic: Topic, key: &str) -> Vec<Event> {
    let index = state.index;
    match topic {
        Topic::Kv => crate::state::kv::prefix_iter(state, key)
            .map(|e| Event::new(Topic::Kv, e.key.clone(), index, "Upsert", json!(e)))
            .collect(),
        Topic::ServiceHealth | Topic::ServiceHealthConnect => {
            let connect = topic == Topic::ServiceHealthConnect;
            let names: Vec<String> = if key.is_empty() {
                let index = if connect {
                    &state.connect_names
                } else {
                    &state.service_names
                };
                index.keys().cloned().collect()
            } else {
                vec![key.to_string()]
            };
            let mut out = Vec::new();
            for name in names {
                for inst in crate::state::catalog::service_instances(state, &name, connect) {
                    let value = check_service_node(state, &inst.service_node_name(), &inst.service);
                    out.push(Event::new(topic, name.clone(), index, "Register", value));
                }
            }
            out
        }
        _ => {
            let kind = topic.kind().expect("config topics have a kind");
            state
                .config
                .range((kind, String::new())..)
                .take_while(|((k, _), _)| *k == kind)
                .filter(|((_, n), _)| key.is_empty() || n == key)
                .map(|((_, n), e)| Event::new(topic, n.clone(), index, "Upsert", e.to_json()))
                .collect()
        }
    }
}
