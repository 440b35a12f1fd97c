//! Services' virtual IPs (transparent proxy), as Consul's
//! `ServiceVirtualIP` table: the first connect-capable instance of a
//! service (a sidecar for it, or a connect-native instance) gets the
//! service an address of 240.0.0.0/4, assigned in the apply of the write
//! that registers it (so every server assigns the same one), kept while
//! any such instance exists and freed with the last; operators may add
//! manual IPs (`Command::VirtualIpsSet`). One meta row per service
//! (`vip/<service>`), in the snapshot trailer; changes touch its
//! `vip/<service>` watch key, which compiled chains (`AutoVirtualIPs`)
//! read. A service a terminating gateway's entry links by name gets one
//! too (as Consul's terminating gateways' virtual IPs), kept while any
//! entry links it or a connect-capable instance exists, and the gateway's
//! instances show it as `consul-virtual:<service>`.

use std::net::Ipv4Addr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::tx::Tx;
use super::{NodeKey, Response, Row, State, Table, keys};
use crate::structs::config_entry::{ConfigEntry, Kind, WILDCARD};
use crate::structs::{
    NodeService, ServiceAddress, ServiceKind, gateway_virtual_ip_tag, is_server_tagged_address,
};

pub use crate::structs::TAGGED_VIRTUAL_IP as TAGGED_ADDRESS;

/// The range (Consul's): 240.0.0.0/4, from 240.0.0.1.
const FIRST: u32 = u32::from_be_bytes([240, 0, 0, 1]);
const LAST: u32 = u32::from_be_bytes([255, 255, 255, 254]);

/// At most this many manual IPs per service (Consul's limit).
pub const MAX_MANUAL: usize = 8;

/// One service's virtual IPs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ServiceVirtualIp {
    pub service: String,
    /// The address the servers assigned.
    #[serde(rename = "IP")]
    pub ip: Ipv4Addr,
    /// Addresses an operator added (`PUT /v1/internal/service-virtual-ip`).
    #[serde(rename = "ManualIPs", default, skip_serializing_if = "Vec::is_empty")]
    pub manual_ips: Vec<String>,
    pub create_index: u64,
    pub modify_index: u64,
}

/// The meta row of `service`'s virtual IPs.
pub fn row_key(service: &str) -> String {
    format!("vip/{service}")
}

/// The assigned virtual IP of `service`, if it has one.
pub fn of(state: &State, service: &str) -> Option<Arc<ServiceVirtualIp>> {
    state.virtual_ips.get(service).cloned()
}

/// The lowest address of the range after the highest taken, else the first
/// gap (a range of 268 million addresses is exhausted only in tests).
fn next_free(state: &State) -> Option<Ipv4Addr> {
    let taken = &state.virtual_ip_owners;
    let next = match taken.get_max() {
        None => FIRST,
        Some((max, _)) if *max < LAST => max + 1,
        Some(_) => {
            let mut want = FIRST;
            for ip in taken.keys() {
                if *ip != want {
                    break;
                }
                want += 1;
            }
            if want > LAST {
                return None;
            }
            want
        }
    };
    Some(Ipv4Addr::from(next))
}

impl Tx<'_> {
    fn write_virtual_ip(&mut self, before: Option<Arc<ServiceVirtualIp>>, after: ServiceVirtualIp) {
        let after = Arc::new(after);
        if let Some(b) = &before {
            self.state.virtual_ip_owners.remove(&u32::from(b.ip));
        }
        self.state
            .virtual_ip_owners
            .insert(u32::from(after.ip), after.service.clone());
        self.state
            .virtual_ips
            .insert(after.service.clone(), after.clone());
        self.touch(keys::virtual_ip(&after.service));
        self.record(
            Table::Meta,
            row_key(&after.service),
            before.map(Row::VirtualIp),
            Some(Row::VirtualIp(after)),
        );
    }

    /// The virtual IP of `service`, assigned now if it has none.
    pub(super) fn ensure_virtual_ip(&mut self, service: &str) -> Option<Ipv4Addr> {
        if let Some(v) = self.state.virtual_ips.get(service) {
            return Some(v.ip);
        }
        let ip = next_free(self.state)?;
        self.write_virtual_ip(
            None,
            ServiceVirtualIp {
                service: service.to_string(),
                ip,
                manual_ips: Vec::new(),
                create_index: self.index,
                modify_index: self.index,
            },
        );
        Some(ip)
    }

    /// Frees `service`'s virtual IPs once no connect-capable instance of
    /// it is left and no terminating gateway links it.
    pub(super) fn release_virtual_ip(&mut self, service: &str) {
        if self.state.connect_names.contains_key(service)
            || linked_by_terminating_gateway(self.state, service)
        {
            return;
        }
        if let Some(before) = self.state.virtual_ips.remove(service) {
            self.state.virtual_ip_owners.remove(&u32::from(before.ip));
            self.touch(keys::virtual_ip(service));
            self.record(
                Table::Meta,
                row_key(service),
                Some(Row::VirtualIp(before)),
                None,
            );
        }
    }
}

impl Tx<'_> {
    /// A terminating gateway's entry written (`after`) or deleted: the
    /// services it now links by name get virtual IPs, those it no longer
    /// links lose theirs unless something else keeps them. A `*` link
    /// follows the catalog and gets none (Consul assigns them per named
    /// service of the entry).
    pub(super) fn terminating_links_changed(
        &mut self, before: Option<&ConfigEntry>, after: Option<&ConfigEntry>,
    ) {
        let now = named_links(after);
        for svc in &now {
            self.ensure_virtual_ip(svc);
        }
        // The gateway's instances show the new set before any address of
        // the old one is freed (and perhaps handed to another service).
        if let Some(gateway) = after.or(before).map(|e| e.name().to_string()) {
            self.retag_gateway_instances(&gateway);
        }
        for svc in named_links(before) {
            if !now.contains(&svc) {
                self.release_virtual_ip(&svc);
            }
        }
    }

    /// Sets a terminating gateway instance's `consul-virtual:<service>`
    /// tagged addresses (no port, as Consul's) to the virtual IPs of the
    /// services its entry links by name, dropping any other: written with
    /// every write of the instance and of its entry.
    pub(super) fn gateway_virtual_ips(&mut self, svc: &mut NodeService) {
        svc.tagged_addresses
            .retain(|k, _| k == TAGGED_ADDRESS || !is_server_tagged_address(k));
        let entry = self
            .state
            .config
            .get(&(Kind::TerminatingGateway, svc.service.clone()))
            .cloned();
        for name in named_links(entry.as_deref()) {
            if let Some(ip) = self.ensure_virtual_ip(&name) {
                svc.tagged_addresses.insert(
                    gateway_virtual_ip_tag(&name),
                    ServiceAddress {
                        address: ip.to_string(),
                        port: 0,
                    },
                );
            }
        }
    }

    /// Rewrites the instances of terminating gateway `gateway` whose
    /// virtual IP tags its entry's links changed.
    fn retag_gateway_instances(&mut self, gateway: &str) {
        let instances: Vec<NodeKey> = self
            .state
            .service_names
            .get(gateway)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        for key in instances {
            let Some(old) = self.state.services.get(&key).cloned() else {
                continue;
            };
            if old.kind != ServiceKind::TerminatingGateway {
                continue;
            }
            let mut svc = (*old).clone();
            self.gateway_virtual_ips(&mut svc);
            if svc != *old {
                svc.modify_index = self.index;
                self.put_service(&key.0, svc);
            }
        }
    }
}

/// The services a terminating gateway's entry links by name (not `*`).
fn named_links(entry: Option<&ConfigEntry>) -> Vec<String> {
    match entry {
        Some(ConfigEntry::TerminatingGateway(t)) => t
            .services
            .iter()
            .filter(|s| s.name != WILDCARD)
            .map(|s| s.name.clone())
            .collect(),
        _ => Vec::new(),
    }
}

/// Some terminating gateway's entry links `service` by name.
fn linked_by_terminating_gateway(state: &State, service: &str) -> bool {
    state
        .config
        .range((Kind::TerminatingGateway, String::new())..)
        .take_while(|((k, _), _)| *k == Kind::TerminatingGateway)
        .any(|(_, e)| match &**e {
            ConfigEntry::TerminatingGateway(t) => t.services.iter().any(|s| s.name == service),
            _ => false,
        })
}

/// What `Command::VirtualIpsSet` answers (Consul's
/// `AssignServiceManualVIPsResponse`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ManualOutcome {
    /// The service has virtual IPs (a connect-capable instance); if not,
    /// nothing was written.
    pub found: bool,
    /// Other services that held one of the addresses and lost it.
    pub unassigned_from: Vec<String>,
}

/// Sets `service`'s manual IPs (checked by the caller: IPv4, at most
/// `MAX_MANUAL`), taking each one away from any other service that held
/// it, as Consul does.
pub fn set_manual(tx: &mut Tx, service: &str, manual: &[String]) -> Response {
    let Some(current) = tx.state.virtual_ips.get(service).cloned() else {
        return Response::Manual(ManualOutcome::default());
    };
    let mut outcome = ManualOutcome {
        found: true,
        unassigned_from: Vec::new(),
    };
    let holders: Vec<Arc<ServiceVirtualIp>> = tx
        .state
        .virtual_ips
        .values()
        .filter(|v| v.service != service && v.manual_ips.iter().any(|ip| manual.contains(ip)))
        .cloned()
        .collect();
    for other in holders {
        let mut next = (*other).clone();
        next.manual_ips.retain(|ip| !manual.contains(ip));
        next.modify_index = tx.index;
        outcome.unassigned_from.push(next.service.clone());
        tx.write_virtual_ip(Some(other), next);
    }
    if current.manual_ips != manual {
        let mut next = (*current).clone();
        next.manual_ips = manual.to_vec();
        next.modify_index = tx.index;
        tx.write_virtual_ip(Some(current), next);
    }
    Response::Manual(outcome)
}

/// Rebuilds the address → service index (after a load or a snapshot).
pub(super) fn reindex(state: &mut State) {
    state.virtual_ip_owners = state
        .virtual_ips
        .values()
        .map(|v| (u32::from(v.ip), v.service.clone()))
        .collect();
}

/// Puts `service`'s virtual IPs into a chain's compile request (Consul's
/// `AutoVirtualIPs`, `ManualVirtualIPs`): those of this datacenter only.
pub fn fill(state: &State, req: &mut crate::discovery_chain::CompileRequest) {
    if req.evaluate_in_datacenter != req.server_datacenter {
        return;
    }
    if let Some(v) = state.virtual_ips.get(&req.service_name) {
        req.auto_virtual_ips = vec![v.ip.to_string()];
        req.manual_virtual_ips = v.manual_ips.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, MemoryBackend, Store, apply_command, snapshot};
    use crate::structs::{DeregisterRequest, RegisterRequest};

    fn register(node: &str, id: &str, service: &str, dest: Option<&str>) -> Command {
        let mut svc = serde_json::json!({ "ID": id, "Service": service, "Port": 21000 });
        if let Some(dest) = dest {
            svc["Kind"] = "connect-proxy".into();
            svc["Proxy"] = serde_json::json!({ "DestinationServiceName": dest });
        }
        let req: RegisterRequest = serde_json::from_value(serde_json::json!({
            "Node": node, "Address": "10.0.0.1", "Service": svc,
        }))
        .unwrap();
        Command::Register(Box::new(req))
    }

    fn deregister(node: &str, id: &str) -> Command {
        Command::Deregister(DeregisterRequest {
            node: node.into(),
            service_id: id.into(),
            ..Default::default()
        })
    }

    fn ip(st: &State, service: &str) -> Option<String> {
        of(st, service).map(|v| v.ip.to_string())
    }

    /// The first connect-capable instance gets its service the next
    /// address from 240.0.0.1; more instances keep it; the instance row
    /// shows it as `consul-virtual`; a plain instance gets none; the last
    /// connect instance's removal frees it, and a later service is given
    /// the freed top address again.
    #[test]
    fn assigned_with_the_first_instance_and_freed_with_the_last() {
        let mut st = State::default();
        apply_command(&mut st, 2, &register("n1", "web", "web", None));
        assert_eq!(ip(&st, "web"), None, "a plain instance gets no VIP");
        apply_command(
            &mut st,
            3,
            &register("n1", "web-proxy", "web-sidecar-proxy", Some("web")),
        );
        apply_command(
            &mut st,
            4,
            &register("n1", "api-proxy", "api-sidecar-proxy", Some("api")),
        );
        apply_command(
            &mut st,
            5,
            &register("n2", "web-proxy", "web-sidecar-proxy", Some("web")),
        );
        assert_eq!(ip(&st, "web").as_deref(), Some("240.0.0.1"));
        assert_eq!(ip(&st, "api").as_deref(), Some("240.0.0.2"));
        let row = &st.services[&("n2".to_string(), "web-proxy".to_string())];
        assert_eq!(row.tagged_addresses[TAGGED_ADDRESS].address, "240.0.0.1");
        assert_eq!(row.tagged_addresses[TAGGED_ADDRESS].port, 21000);

        apply_command(&mut st, 6, &deregister("n1", "web-proxy"));
        assert_eq!(
            ip(&st, "web").as_deref(),
            Some("240.0.0.1"),
            "one instance left"
        );
        apply_command(&mut st, 7, &deregister("n1", "api-proxy"));
        assert_eq!(ip(&st, "api"), None);
        assert_eq!(st.index_of([&keys::virtual_ip("api")]), 7);
        apply_command(
            &mut st,
            8,
            &register("n1", "db-proxy", "db-sidecar-proxy", Some("db")),
        );
        assert_eq!(ip(&st, "db").as_deref(), Some("240.0.0.2"));
        assert_eq!(ip(&st, "web").as_deref(), Some("240.0.0.1"), "stable");
    }

    /// A terminating gateway's entry gives the services it names virtual
    /// IPs in the apply that writes it (not `*`); a service it stops
    /// linking loses its IP unless a connect instance or another
    /// gateway's entry keeps it; deleting the entry frees the rest.
    #[test]
    fn services_linked_to_a_terminating_gateway_get_virtual_ips() {
        let tg = |name: &str, services: &[&str]| Command::ConfigSet {
            entry: serde_json::json!({"Kind": "terminating-gateway", "Name": name,
                "Services": services.iter().map(|s| serde_json::json!({"Name": s}))
                    .collect::<Vec<_>>()}),
            cas: None,
        };
        let mut st = State::default();
        apply_command(&mut st, 2, &tg("tg", &["billing", "ledger", "*"]));
        assert_eq!(ip(&st, "billing").as_deref(), Some("240.0.0.1"));
        assert_eq!(ip(&st, "ledger").as_deref(), Some("240.0.0.2"));
        assert_eq!(ip(&st, "*"), None, "a wildcard link is no service");
        assert_eq!(st.index_of([&keys::virtual_ip("billing")]), 2);
        apply_command(&mut st, 3, &tg("tg2", &["ledger"]));
        apply_command(
            &mut st,
            4,
            &register(
                "n1",
                "billing-proxy",
                "billing-sidecar-proxy",
                Some("billing"),
            ),
        );
        apply_command(&mut st, 5, &tg("tg", &["audit"]));
        assert_eq!(ip(&st, "audit").as_deref(), Some("240.0.0.3"));
        assert_eq!(
            ip(&st, "billing").as_deref(),
            Some("240.0.0.1"),
            "kept by its connect instance"
        );
        assert_eq!(
            ip(&st, "ledger").as_deref(),
            Some("240.0.0.2"),
            "kept by tg2's entry"
        );
        apply_command(
            &mut st,
            6,
            &Command::ConfigDelete {
                kind: "terminating-gateway".into(),
                name: "tg2".into(),
                cas: None,
            },
        );
        assert_eq!(ip(&st, "ledger"), None);
        assert_eq!(ip(&st, "audit").as_deref(), Some("240.0.0.3"));
        // The last connect instance gone, billing is linked by nothing.
        apply_command(&mut st, 7, &deregister("n1", "billing-proxy"));
        assert_eq!(ip(&st, "billing"), None);
    }

    /// A terminating gateway's instances show each linked service's
    /// virtual IP as `consul-virtual:<service>` (no port): whether the
    /// instance or the entry is written first, following the entry's
    /// links as they change (a new modify index), none for `*`, and none
    /// left once the entry is deleted; tags of that form sent with the
    /// registration are the servers' to set.
    #[test]
    fn a_terminating_gateway_shows_its_services_virtual_ips() {
        let tg = |services: &[&str]| Command::ConfigSet {
            entry: serde_json::json!({"Kind": "terminating-gateway", "Name": "tg",
                "Services": services.iter().map(|s| serde_json::json!({"Name": s}))
                    .collect::<Vec<_>>()}),
            cas: None,
        };
        let gateway = |node: &str| {
            let req: RegisterRequest = serde_json::from_value(serde_json::json!({
                "Node": node, "Address": "10.0.0.9",
                "Service": {"ID": "tg", "Service": "tg", "Kind": "terminating-gateway",
                    "Port": 8443, "TaggedAddresses": {
                        "consul-virtual:forged": {"Address": "1.2.3.4", "Port": 1},
                        "lan": {"Address": "10.0.0.9", "Port": 8443}}},
            }))
            .unwrap();
            Command::Register(Box::new(req))
        };
        let tags = |st: &State, node: &str| -> Vec<(String, String, u16)> {
            let row = &st.services[&(node.to_string(), "tg".to_string())];
            row.tagged_addresses
                .iter()
                .map(|(k, a)| (k.clone(), a.address.clone(), a.port))
                .collect()
        };
        let vip = |svc: &str, ip: &str| (format!("consul-virtual:{svc}"), ip.to_string(), 0);
        let lan = ("lan".to_string(), "10.0.0.9".to_string(), 8443);

        let mut st = State::default();
        apply_command(&mut st, 2, &gateway("n1"));
        assert_eq!(tags(&st, "n1"), vec![lan.clone()], "no entry: no VIP tags");
        apply_command(&mut st, 3, &tg(&["billing", "*"]));
        assert_eq!(
            tags(&st, "n1"),
            vec![vip("billing", "240.0.0.1"), lan.clone()]
        );
        let row = &st.services[&("n1".to_string(), "tg".to_string())];
        assert_eq!((row.create_index, row.modify_index), (2, 3));
        apply_command(&mut st, 4, &gateway("n2"));
        assert_eq!(
            tags(&st, "n2"),
            vec![vip("billing", "240.0.0.1"), lan.clone()]
        );
        apply_command(&mut st, 5, &tg(&["ledger"]));
        for node in ["n1", "n2"] {
            assert_eq!(
                tags(&st, node),
                vec![vip("ledger", "240.0.0.2"), lan.clone()]
            );
        }
        apply_command(
            &mut st,
            6,
            &Command::ConfigDelete {
                kind: "terminating-gateway".into(),
                name: "tg".into(),
                cas: None,
            },
        );
        assert_eq!(tags(&st, "n1"), vec![lan.clone()]);
        assert_eq!(ip(&st, "ledger"), None);
    }

    /// The same registration again, without the tags the servers add to
    /// its row, changes nothing: not the row's modify index, not the
    /// service's watch key (Consul compares the row as it would store it).
    #[test]
    fn the_same_registration_again_is_no_change() {
        let mut st = State::default();
        let sidecar = register("n1", "web-proxy", "web-sidecar-proxy", Some("web"));
        apply_command(&mut st, 2, &sidecar);
        let tg = Command::ConfigSet {
            entry: serde_json::json!({"Kind": "terminating-gateway", "Name": "tg",
                "Services": [{"Name": "billing"}]}),
            cas: None,
        };
        apply_command(&mut st, 3, &tg);
        let gateway: RegisterRequest = serde_json::from_value(serde_json::json!({
            "Node": "n1", "Address": "10.0.0.1",
            "Service": {"ID": "tg", "Service": "tg", "Kind": "terminating-gateway", "Port": 8443},
        }))
        .unwrap();
        let gateway = Command::Register(Box::new(gateway));
        apply_command(&mut st, 4, &gateway);
        apply_command(&mut st, 5, &sidecar);
        apply_command(&mut st, 6, &gateway);
        let row = |id: &str| st.services[&("n1".to_string(), id.to_string())].clone();
        assert_eq!(row("web-proxy").modify_index, 2);
        assert_eq!(row("tg").modify_index, 4);
        assert_eq!(st.index_of([&keys::service("web-sidecar-proxy")]), 2);
        assert_eq!(st.index_of([&keys::service("tg")]), 4);
        assert!(
            row("tg")
                .tagged_addresses
                .contains_key("consul-virtual:billing")
        );
    }

    /// Manual IPs: refused for a service without VIPs (nothing written),
    /// moved from another service that held one.
    #[test]
    fn manual_ips_move_between_services() {
        let mut st = State::default();
        apply_command(
            &mut st,
            2,
            &register("n1", "a-proxy", "a-sidecar-proxy", Some("a")),
        );
        apply_command(
            &mut st,
            3,
            &register("n1", "b-proxy", "b-sidecar-proxy", Some("b")),
        );
        let set = |service: &str, ips: &[&str]| Command::VirtualIpsSet {
            service: service.into(),
            manual: ips.iter().map(|s| s.to_string()).collect(),
        };
        let (r, _) = apply_command(&mut st, 4, &set("nope", &["10.1.1.1"]));
        assert_eq!(r, Response::Manual(ManualOutcome::default()));
        assert!(of(&st, "nope").is_none());
        apply_command(&mut st, 5, &set("a", &["10.1.1.1", "10.1.1.2"]));
        let (r, _) = apply_command(&mut st, 6, &set("b", &["10.1.1.2"]));
        assert_eq!(
            r,
            Response::Manual(ManualOutcome {
                found: true,
                unassigned_from: vec!["a".into()],
            })
        );
        assert_eq!(of(&st, "a").unwrap().manual_ips, vec!["10.1.1.1"]);
        assert_eq!(of(&st, "b").unwrap().manual_ips, vec!["10.1.1.2"]);
    }

    /// Kept by the rows on disk and by snapshots, the address index with
    /// them (the next service does not reuse a loaded address).
    #[test]
    fn virtual_ips_survive_rows_and_snapshots() {
        let disk = MemoryBackend::default();
        let store = Store::open(Box::new(disk.clone())).unwrap();
        let mut st = State::default();
        let (_, a) = apply_command(
            &mut st,
            2,
            &register("n1", "a-proxy", "a-sidecar-proxy", Some("a")),
        );
        let (_, b) = apply_command(
            &mut st,
            3,
            &register("n1", "b-proxy", "b-sidecar-proxy", Some("b")),
        );
        let mut decoded = snapshot::decode(&snapshot::encode(&st).unwrap()).unwrap();
        assert_eq!(decoded.virtual_ips, st.virtual_ips);
        apply_command(
            &mut decoded,
            4,
            &register("n1", "c-proxy", "c-sidecar-proxy", Some("c")),
        );
        assert_eq!(ip(&decoded, "c").as_deref(), Some("240.0.0.3"));

        store.commit(st.clone(), &[a, b], vec![]).unwrap();
        drop(store);
        let again = Store::open(Box::new(disk)).unwrap();
        assert_eq!(again.state().virtual_ips, st.virtual_ips);
        assert_eq!(again.state().virtual_ip_owners.len(), 2);
    }
}
