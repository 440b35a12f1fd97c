//! Turning change sets into events, and the state into snapshot events.
//!
//! Topics and payloads follow Consul's streaming: `ServiceHealth` and
//! `ServiceHealthConnect` carry a CheckServiceNode (`{Node, Service,
//! Checks}`) keyed by service name (a connect proxy's under its destination
//! on the connect topic); each config entry kind is a topic keyed by name;
//! `KV` is keyed by key.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use serde::Serialize;
use serde_json::Value;

use crate::state::catalog::{Instance, instance_of, node_services};
use crate::state::{ChangeSet, Row, State, Table, keys};
use crate::structs::config_entry::Kind;
use crate::structs::{Node, NodeService};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Topic {
    ServiceHealth,
    ServiceHealthConnect,
    /// One topic per config entry kind.
    Config(Kind),
    Kv,
    /// The Connect CA's roots (one key, empty).
    CaRoots,
}

impl Topic {
    /// Consul's name of the topic: what `?topic=` takes and an event's
    /// `Topic` says.
    pub fn name(self) -> &'static str {
        match self {
            Topic::ServiceHealth => "ServiceHealth",
            Topic::ServiceHealthConnect => "ServiceHealthConnect",
            Topic::Config(kind) => match kind {
                Kind::ProxyDefaults => "ProxyDefaults",
                Kind::ServiceDefaults => "ServiceDefaults",
                Kind::ServiceRouter => "ServiceRouter",
                Kind::ServiceSplitter => "ServiceSplitter",
                Kind::ServiceResolver => "ServiceResolver",
                Kind::ServiceIntentions => "ServiceIntentions",
                Kind::Mesh => "MeshConfig",
                Kind::IngressGateway => "IngressGateway",
                Kind::TerminatingGateway => "TerminatingGateway",
                Kind::ExportedServices => "ExportedServices",
            },
            Topic::Kv => "KV",
            Topic::CaRoots => "CARoots",
        }
    }

    /// A topic by its name; a config topic also by its kind's name
    /// (`proxy-defaults`), and the KV topic as `kv`.
    pub fn parse(s: &str) -> Option<Topic> {
        Some(match s {
            "ServiceHealth" => Topic::ServiceHealth,
            "ServiceHealthConnect" => Topic::ServiceHealthConnect,
            "KV" | "kv" => Topic::Kv,
            "CARoots" => Topic::CaRoots,
            _ => Topic::Config(
                Kind::ALL
                    .into_iter()
                    .find(|&k| Topic::Config(k).name() == s || k.as_str() == s)?,
            ),
        })
    }
}

impl Serialize for Topic {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// One event, serialized once when it is made (its NDJSON line): buffers
/// hold the line, not a JSON tree.
#[derive(Debug)]
pub struct Event {
    pub topic: Topic,
    pub key: String,
    pub index: u64,
    op: &'static str,
    pub line: Bytes,
    /// On the health topics, the instance itself (shared with the state
    /// version), so consumers need not decode the line.
    pub instance: Option<Arc<Instance>>,
}

/// An event's line: `{"Topic","Key","Index","Payload":{"Op","Value"}}`.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Line<'a, T: Serialize> {
    topic: Topic,
    key: &'a str,
    index: u64,
    payload: Payload<'a, T>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Payload<'a, T: Serialize> {
    op: &'a str,
    value: &'a T,
}

impl Event {
    fn new<T: Serialize>(
        topic: Topic, key: String, index: u64, op: &'static str, value: &T,
    ) -> Event {
        let mut line = serde_json::to_vec(&Line {
            topic,
            key: &key,
            index,
            payload: Payload { op, value },
        })
        .expect("events serialize");
        line.push(b'\n');
        Event {
            topic,
            key,
            index,
            op,
            line: Bytes::from(line),
            instance: None,
        }
    }

    /// A health event carrying `instance`.
    fn health(
        topic: Topic, key: String, index: u64, op: &'static str, instance: &Arc<Instance>,
    ) -> Event {
        Event {
            instance: Some(instance.clone()),
            ..Event::new(topic, key, index, op, &**instance)
        }
    }

    /// Bytes this event holds in a buffer (for the memory cap).
    pub fn size(&self) -> usize {
        self.line.len() + self.key.len() + 96
    }

    /// `Register`, `Deregister`, `Upsert` or `Delete`.
    pub fn op(&self) -> &'static str {
        self.op
    }

    /// `{"Op", "Value"}`, decoded from the line: for tests and tools
    /// (consumers that care for speed read `instance` or pass the line on).
    pub fn payload(&self) -> Value {
        let mut line: Value = serde_json::from_slice(&self.line).expect("events are JSON");
        line["Payload"].take()
    }
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
    // Instances whose health view changed, and the registration each had
    // before the command (its old topic keys may need a deregistration).
    let mut touched: BTreeSet<(String, String)> = BTreeSet::new();
    let mut before_cmd: BTreeMap<(String, String), Arc<NodeService>> = BTreeMap::new();
    for c in &set.changes {
        match (c.table, &c.before, &c.after) {
            (Table::Kv, before, after) => {
                let (op, row) = match (after, before) {
                    (Some(Row::Kv(e)), _) => ("Upsert", e),
                    (None, Some(Row::Kv(e))) => ("Delete", e),
                    _ => continue,
                };
                out.push(Event::new(Topic::Kv, row.key.clone(), set.index, op, row));
            }
            (Table::Config, before, after) => {
                let (op, e) = match (after, before) {
                    (Some(Row::Config(e)), _) => ("Upsert", e),
                    (None, Some(Row::Config(e))) => ("Delete", e),
                    _ => continue,
                };
                let topic = Topic::Config(e.kind());
                out.push(Event::new(
                    topic,
                    e.name().to_string(),
                    set.index,
                    op,
                    &e.to_json(),
                ));
            }
            (Table::ConnectCa, _, Some(Row::ConnectCa(_))) => {
                if let Some(roots) = crate::state::connect::roots(state) {
                    out.push(Event::new(
                        Topic::CaRoots,
                        String::new(),
                        set.index,
                        "Upsert",
                        &roots,
                    ));
                }
            }
            (Table::Services, before, _) => {
                let (node, id) = crate::state::split_pair_key(&c.key).unwrap_or_default();
                let k = (node.to_string(), id.to_string());
                if let Some(Row::Service(s)) = before {
                    before_cmd.entry(k.clone()).or_insert_with(|| s.clone());
                }
                touched.insert(k);
            }
            (Table::Checks, before, after) => {
                let check = match (after, before) {
                    (Some(Row::Check(c)), _) | (None, Some(Row::Check(c))) => c,
                    _ => continue,
                };
                if check.service_id.is_empty() {
                    for s in node_services(state, &check.node) {
                        touched.insert((check.node.clone(), s.id.clone()));
                    }
                } else {
                    touched.insert((check.node.clone(), check.service_id.clone()));
                }
            }
            (Table::Nodes, _, _) => {
                for s in node_services(state, &c.key) {
                    touched.insert((c.key.clone(), s.id.clone()));
                }
            }
            // A service's manual virtual IPs changed: its connect view is
            // published again, so that what reads its chain (proxycfg's
            // transparent proxies) is told.
            (Table::Meta, before, after) => {
                if let Some(Row::VirtualIp(v)) = after.as_ref().or(before.as_ref())
                    && let Some(set) = state.connect_names.get(&v.service)
                {
                    touched.extend(set.iter().cloned());
                }
            }
            _ => {}
        }
    }
    for k in touched {
        let current = state.services.get(&k);
        let now_keys = current.map(|s| health_keys(s)).unwrap_or_default();
        // Gone from a topic key: deregistered, renamed, or a proxy moved to
        // another destination.
        if let Some(old) = before_cmd.get(&k) {
            let gone: Vec<_> = health_keys(old)
                .into_iter()
                .filter(|x| !now_keys.contains(x))
                .collect();
            if !gone.is_empty() {
                let node = state.nodes.get(&k.0).cloned().unwrap_or_else(|| {
                    Arc::new(Node {
                        node: k.0.clone(),
                        ..Node::default()
                    })
                });
                let inst = Arc::new(Instance {
                    node,
                    service: old.clone(),
                    checks: Vec::new(),
                });
                for (topic, key) in gone {
                    out.push(Event::health(topic, key, set.index, "Deregister", &inst));
                }
            }
        }
        if let Some(inst) = current.and_then(|svc| instance_of(state, &k.0, svc)) {
            let inst = Arc::new(inst);
            for (topic, key) in now_keys {
                out.push(Event::health(topic, key, set.index, "Register", &inst));
            }
        }
    }
    out
}

/// The index a snapshot of `key` reports: for one service's health, the
/// last change to it (as the health endpoints report); otherwise the
/// state's index.
pub fn snapshot_index(state: &State, topic: Topic, key: &str) -> u64 {
    match topic {
        _ if key.is_empty() => state.index,
        Topic::ServiceHealth => state.index_of([&keys::service(key)]),
        Topic::ServiceHealthConnect => state.index_of([&keys::connect(key)]),
        _ => state.index,
    }
}

/// Events describing everything `key` of `topic` holds now ("" = all).
pub fn snapshot_events(state: &State, topic: Topic, key: &str) -> Vec<Event> {
    let index = state.index;
    match topic {
        Topic::Kv => crate::state::kv::prefix_iter(state, key)
            .map(|e| Event::new(Topic::Kv, e.key.clone(), index, "Upsert", e))
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
                    let inst = Arc::new(inst);
                    out.push(Event::health(topic, name.clone(), index, "Register", &inst));
                }
            }
            out
        }
        Topic::CaRoots => crate::state::connect::roots(state)
            .map(|r| Event::new(topic, String::new(), index, "Upsert", &r))
            .into_iter()
            .collect(),
        Topic::Config(kind) => state
            .config
            .range((kind, String::new())..)
            .take_while(|((k, _), _)| *k == kind)
            .filter(|((_, n), _)| key.is_empty() || n == key)
            .map(|((_, n), e)| Event::new(topic, n.clone(), index, "Upsert", &e.to_json()))
            .collect(),
    }
}
