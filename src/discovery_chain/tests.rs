//! Unit tests of the compiler and of graph validation, beyond the shared
//! conformance cases.

use super::graph::affected_chains;
use super::*;
use crate::config_check::decode_and_validate;
use serde_json::{Value, json};
use std::cell::RefCell;
use std::collections::BTreeSet;

const TD: &str = "11111111-2222-3333-4444-555555555555.consul";

fn store(bodies: &[Value]) -> MemoryEntries {
    let mut s = MemoryEntries::new();
    for b in bodies {
        let e = decode_and_validate(b).unwrap();
        let change = EntryChange::Upsert(e);
        validate_write(&s, &change).unwrap();
        s.apply(change);
    }
    s
}

fn upsert(s: &MemoryEntries, body: Value) -> Result<(), crate::config_check::ConfigEntryError> {
    validate_write(s, &EntryChange::Upsert(decode_and_validate(&body)?))
}

fn chain(s: &MemoryEntries, service: &str) -> Value {
    serde_json::to_value(compile(&CompileRequest::new(service, "dc1", TD), s).unwrap()).unwrap()
}

#[test]
fn default_chain() {
    let c = chain(&MemoryEntries::new(), "web");
    assert_eq!(c["Default"], true);
    assert_eq!(c["Protocol"], "tcp");
    assert_eq!(c["StartNode"], "resolver:web.default.default.dc1");
    let t = &c["Targets"]["web.default.default.dc1"];
    assert_eq!(t["SNI"], format!("web.default.dc1.internal.{TD}"));
    assert_eq!(t["ConnectTimeout"], "5s");
}

#[test]
fn nested_splitters_flatten_with_header_merge() {
    let s = store(&[
        json!({"Kind": "proxy-defaults", "Name": "global", "Config": {"protocol": "http"}}),
        json!({"Kind": "service-resolver", "Name": "b", "Subsets": {"v1": {}, "v2": {}}}),
        json!({"Kind": "service-splitter", "Name": "b", "Splits": [
            {"Weight": 50, "ServiceSubset": "v1", "RequestHeaders": {"Set": {"x-inner": "1"}}},
            {"Weight": 50, "ServiceSubset": "v2"}]}),
        json!({"Kind": "service-splitter", "Name": "a", "Splits": [
            {"Weight": 20, "Service": "b", "RequestHeaders": {"Set": {"x-outer": "1", "x-inner": "0"}}},
            {"Weight": 80, "Service": "c"}]}),
    ]);
    let c = chain(&s, "a");
    let splits = c["Nodes"]["splitter:a.default.default"]["Splits"]
        .as_array()
        .unwrap()
        .clone();
    let got: Vec<(f64, &str)> = splits
        .iter()
        .map(|s| {
            (
                s["Weight"].as_f64().unwrap(),
                s["NextNode"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (10.0, "resolver:v1.b.default.default.dc1"),
            (10.0, "resolver:v2.b.default.default.dc1"),
            (80.0, "resolver:c.default.default.dc1"),
        ]
    );
    // The inner split's own header edit wins over the parent's.
    assert_eq!(
        splits[0]["Definition"]["RequestHeaders"]["Set"],
        json!({"x-inner": "1", "x-outer": "1"})
    );
    assert_eq!(
        splits[1]["Definition"]["RequestHeaders"]["Set"],
        json!({"x-outer": "1", "x-inner": "0"})
    );
    // The inner splitter node is gone once flattened.
    assert!(c["Nodes"].get("splitter:b.default.default").is_none());
}

#[test]
fn overrides_customize_and_hash() {
    let s = store(&[
        json!({"Kind": "service-defaults", "Name": "web", "MeshGateway": {"Mode": "local"}}),
    ]);
    let o = CompileOverrides::from_json(&json!({
        "OverrideConnectTimeout": "7s", "OverrideMeshGateway": {"Mode": "remote"}
    }))
    .unwrap();
    let req = CompileRequest::new("web", "dc1", TD).with_overrides(o);
    let c = compile(&req, &s).unwrap();
    assert!(!c.customization_hash.is_empty());
    let t = &c.targets["web.default.default.dc1"];
    assert_eq!(
        t.connect_timeout,
        crate::structs::config_entry::Duration::from_secs(7)
    );
    assert_eq!(t.mesh_gateway.mode, "remote");
    // Overrides equal to what the entries say change nothing.
    let o =
        CompileOverrides::from_json(&json!({"OverrideMeshGateway": {"Mode": "local"}})).unwrap();
    let c = compile(&CompileRequest::new("web", "dc1", TD).with_overrides(o), &s).unwrap();
    assert!(c.customization_hash.is_empty());
}

#[test]
fn an_unknown_override_mode_is_refused_in_consuls_words() {
    let err = CompileOverrides::from_json(&json!({"OverrideMeshGateway": {"Mode": "nearby"}}))
        .unwrap_err();
    assert_eq!(
        err,
        ChainError::InvalidRequest("Invalid OverrideMeshGateway.Mode parameter".into())
    );
    for mode in ["", "none", "local", "remote"] {
        let o = CompileOverrides::from_json(&json!({"OverrideMeshGateway": {"Mode": mode}}));
        assert_eq!(o.unwrap().override_mesh_gateway.mode, mode);
    }
}

#[test]
fn external_sni_and_durations_in_output() {
    let s = store(&[
        json!({"Kind": "service-defaults", "Name": "ext", "ExternalSNI": "ext.example.com", "MeshGateway": {"Mode": "local"}}),
        json!({"Kind": "service-resolver", "Name": "ext", "RequestTimeout": "2s",
               "LoadBalancer": {"Policy": "ring_hash", "HashPolicies": [{"Field": "cookie", "FieldValue": "c", "CookieConfig": {"TTL": "1m"}}]}}),
    ]);
    let c = chain(&s, "ext");
    let t = &c["Targets"]["ext.default.default.dc1"];
    assert_eq!(t["SNI"], "ext.example.com");
    assert_eq!(t["External"], true);
    assert_eq!(t["MeshGateway"]["Mode"], "");
    assert_eq!(t["Name"], format!("ext.default.dc1.internal.{TD}"));
    let node = &c["Nodes"]["resolver:ext.default.default.dc1"];
    assert_eq!(node["Resolver"]["RequestTimeout"], 2_000_000_000i64);
    assert_eq!(
        node["LoadBalancer"]["HashPolicies"][0]["CookieConfig"]["TTL"],
        60_000_000_000i64
    );
}

#[test]
fn subset_failover_and_partition_sni() {
    assert_eq!(
        service_sni("web", "v1", "default", "part1", "dc2", TD),
        format!("v1.web.default.part1.dc2.internal-v1.{TD}")
    );
    let s = store(&[json!({"Kind": "service-resolver", "Name": "web",
        "Subsets": {"v1": {"Filter": "Service.Meta.v == 1"}, "v2": {"OnlyPassing": true}},
        "DefaultSubset": "v1",
        "Failover": {"v1": {"Targets": [{"ServiceSubset": "v2"}, {"Datacenter": "dc3"}]}}})]);
    let c = chain(&s, "web");
    assert_eq!(c["StartNode"], "resolver:v1.web.default.default.dc1");
    let f = &c["Nodes"]["resolver:v1.web.default.default.dc1"]["Resolver"]["Failover"]["Targets"];
    assert_eq!(
        f,
        &json!(["v2.web.default.default.dc1", "v1.web.default.default.dc3"])
    );
    assert_eq!(
        c["Targets"]["v2.web.default.default.dc1"]["Subset"]["OnlyPassing"],
        true
    );
}

#[test]
fn deletes_are_graph_checked() {
    let s = store(&[
        json!({"Kind": "service-defaults", "Name": "web", "Protocol": "http"}),
        json!({"Kind": "service-router", "Name": "web"}),
    ]);
    let del = EntryChange::Delete {
        kind: Kind::ServiceDefaults,
        name: "web".into(),
    };
    let e = validate_write(&s, &del).unwrap_err();
    assert!(
        e.to_string().contains("does not permit advanced routing"),
        "{e}"
    );
    let del = EntryChange::Delete {
        kind: Kind::ServiceRouter,
        name: "web".into(),
    };
    validate_write(&s, &del).unwrap();
}

#[test]
fn breakage_two_hops_away_is_caught() {
    // x routes to a; a splits to b. Making b tcp breaks x's chain even
    // though no entry of x names b (a's chain breaks too, and is checked
    // first).
    let s = store(&[
        json!({"Kind": "proxy-defaults", "Name": "global", "Config": {"protocol": "http"}}),
        json!({"Kind": "service-splitter", "Name": "a", "Splits": [{"Weight": 100, "Service": "b"}]}),
        json!({"Kind": "service-router", "Name": "x", "Routes": [{"Match": {"HTTP": {"PathPrefix": "/a"}}, "Destination": {"Service": "a"}}]}),
    ]);
    assert_eq!(
        affected_chains(&s, Kind::ServiceDefaults, "b"),
        BTreeSet::from(["a".to_string(), "b".into(), "x".into()])
    );
    let e = upsert(
        &s,
        json!({"Kind": "service-defaults", "Name": "b", "Protocol": "tcp"}),
    )
    .unwrap_err();
    assert!(e.to_string().contains("\"tcp\""), "{e}");
    upsert(
        &s,
        json!({"Kind": "service-defaults", "Name": "b", "Protocol": "http2"}),
    )
    .unwrap_err();
    upsert(
        &s,
        json!({"Kind": "service-defaults", "Name": "b", "Protocol": "http"}),
    )
    .unwrap();
}

/// Counts which services' entries a validation reads.
struct Counting<'a> {
    inner: &'a MemoryEntries,
    read: RefCell<BTreeSet<String>>,
}

impl EntryLookup for Counting<'_> {
    fn get(&self, kind: Kind, name: &str) -> Option<&ConfigEntry> {
        self.read.borrow_mut().insert(name.to_string());
        self.inner.get(kind, name)
    }
    fn list(&self, kind: Kind) -> Vec<&ConfigEntry> {
        // The ingress gateways (one entry per gateway, few) are read to
        // check their listeners' protocols against the services' new one.
        if kind == Kind::IngressGateway {
            return self.inner.list(kind);
        }
        panic!("listed {kind}: scans must not be needed for this write")
    }
    fn referrers(&self, service: &str) -> Vec<String> {
        self.inner.referrers(service)
    }
}

#[test]
fn unrelated_services_are_not_touched() {
    let mut bodies =
        vec![json!({"Kind": "proxy-defaults", "Name": "global", "Config": {"protocol": "http"}})];
    for i in 0..200 {
        bodies.push(
            json!({"Kind": "service-splitter", "Name": format!("svc{i}"),
            "Splits": [{"Weight": 100, "Service": format!("dst{i}")}]}),
        );
    }
    let s = store(&bodies);
    let counting = Counting {
        inner: &s,
        read: RefCell::new(BTreeSet::new()),
    };
    let e = decode_and_validate(
        &json!({"Kind": "service-resolver", "Name": "dst7", "ConnectTimeout": "3s"}),
    )
    .unwrap();
    validate_write(&counting, &EntryChange::Upsert(e)).unwrap();
    let read = counting.read.into_inner();
    assert!(
        read.iter()
            .all(|n| ["svc7", "dst7", "global"].contains(&n.as_str())),
        "{read:?}"
    );
}

#[test]
fn reverse_index_tracks_updates() {
    let mut s =
        store(&[json!({"Kind": "service-resolver", "Name": "a", "Redirect": {"Service": "b"}})]);
    assert_eq!(s.referrers("b"), vec!["a"]);
    s.upsert(
        decode_and_validate(
            &json!({"Kind": "service-resolver", "Name": "a", "Redirect": {"Service": "c"}}),
        )
        .unwrap(),
    );
    assert!(s.referrers("b").is_empty());
    assert_eq!(s.referrers("c"), vec!["a"]);
    s.delete(Kind::ServiceResolver, "a");
    assert!(s.referrers("c").is_empty());
}

/// A small deterministic generator (xorshift) for arbitrary entry graphs.
struct Rng(u64);
impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
    fn svc(&mut self) -> String {
        format!("s{}", self.next(5))
    }
}

fn arbitrary_entry(r: &mut Rng) -> ConfigEntry {
    let name = r.svc();
    let subset = |r: &mut Rng| (["", "v1", "v2"][r.next(3) as usize]).to_string();
    let body = match r.next(5) {
        0 => json!({"Kind": "service-defaults", "Name": name,
                    "Protocol": (["", "http", "tcp", "grpc"][r.next(4) as usize]),
                    "ExternalSNI": if r.next(6) == 0 { "x.example" } else { "" }}),
        1 => {
            json!({"Kind": "proxy-defaults", "Config": {"protocol": (["http", "tcp"][r.next(2) as usize])}})
        }
        2 => json!({"Kind": "service-router", "Name": name, "Routes": [
                    {"Match": {"HTTP": {"PathPrefix": "/a"}}, "Destination": {"Service": r.svc(), "ServiceSubset": subset(r)}},
                    {"Destination": {"Service": r.svc()}}]}),
        3 => json!({"Kind": "service-splitter", "Name": name, "Splits": [
                    {"Weight": 50, "Service": r.svc(), "ServiceSubset": subset(r)},
                    {"Weight": 50, "Service": r.svc()}]}),
        _ => {
            let mut b = json!({"Kind": "service-resolver", "Name": name, "Subsets": {"v1": {}, "v2": {}},
                               "DefaultSubset": subset(r)});
            if r.next(2) == 0 {
                b["Redirect"] = json!({"Service": r.svc(), "ServiceSubset": subset(r), "Datacenter": (["", "dc2"][r.next(2) as usize])});
            } else {
                b["Failover"] = json!({"*": {"Service": r.svc(), "ServiceSubset": subset(r)}, "v1": {"Datacenters": ["dc2", "dc1"]}});
            }
            b
        }
    };
    let mut e = crate::config_check::decode_entry(&body).unwrap();
    crate::config_check::normalize(&mut e).unwrap();
    e
}

#[test]
fn arbitrary_graphs_never_panic_and_are_deterministic() {
    let mut r = Rng(0x9e3779b97f4a7c15);
    for _ in 0..300 {
        // Stored without graph validation: compile must cope with anything.
        let mut s = MemoryEntries::new();
        for _ in 0..r.next(12) {
            s.upsert(arbitrary_entry(&mut r));
        }
        for svc in ["s0", "s1", "s2", "s3", "s4"] {
            let mut req = CompileRequest::new(svc, "dc1", TD);
            req.override_protocol = (["", "tcp", "http"][r.next(3) as usize]).into();
            let a = compile(&req, &s).map(|c| serde_json::to_string(&c).unwrap());
            let b = compile(&req, &s).map(|c| serde_json::to_string(&c).unwrap());
            assert_eq!(a, b);
        }
        let change = EntryChange::Upsert(arbitrary_entry(&mut r));
        let _ = validate_write(&s, &change);
    }
}

/// Times a chain with 10 routes, a 3-way split and 5 resolvers with failover.
#[test]
#[ignore]
fn bench_compile() {
    let mut bodies =
        vec![json!({"Kind": "proxy-defaults", "Name": "global", "Config": {"protocol": "http"}})];
    for i in 0..5 {
        bodies.push(
            json!({"Kind": "service-resolver", "Name": format!("r{i}"), "ConnectTimeout": "2s",
            "Failover": {"*": {"Datacenters": ["dc2", "dc3"]}}}),
        );
    }
    bodies.push(json!({"Kind": "service-splitter", "Name": "split", "Splits": [
        {"Weight": 50, "Service": "r0"}, {"Weight": 30, "Service": "r1"}, {"Weight": 20, "Service": "r2"}]}));
    let routes: Vec<Value> = (0..10)
        .map(|i| {
            json!({"Match": {"HTTP": {"PathPrefix": format!("/p{i}")}},
                        "Destination": {"Service": (["split", "r3", "r4"][i % 3])}})
        })
        .collect();
    bodies.push(json!({"Kind": "service-router", "Name": "main", "Routes": routes}));
    let s = store(&bodies);
    let req = CompileRequest::new("main", "dc1", TD);
    let n = 2000;
    let start = std::time::Instant::now();
    for _ in 0..n {
        std::hint::black_box(compile(&req, &s).unwrap());
    }
    println!(
        "compile: {:.1} µs per chain",
        start.elapsed().as_secs_f64() * 1e6 / f64::from(n)
    );
}

fn raw_store(bodies: impl IntoIterator<Item = Value>) -> MemoryEntries {
    let mut s = MemoryEntries::new();
    for b in bodies {
        let mut e = crate::config_check::decode_entry(&b).unwrap();
        crate::config_check::normalize(&mut e).unwrap();
        s.upsert(e);
    }
    s
}

#[test]
fn deep_and_wide_splitters_are_refused_not_crashed() {
    let pd = json!({"Kind": "proxy-defaults", "Name": "global", "Config": {"protocol": "http"}});
    let deep = raw_store(std::iter::once(pd.clone()).chain((0..500).map(|i| {
        json!({"Kind": "service-splitter", "Name": format!("s{i}"),
               "Splits": [{"Weight": 100, "Service": format!("s{}", i + 1)}]})
    })));
    let e = compile(&CompileRequest::new("s0", "dc1", TD), &deep).unwrap_err();
    assert!(e.to_string().contains("nests splitters"), "{e}");

    // Every level doubles the legs: 2^20 once flattened.
    let wide = raw_store(std::iter::once(pd).chain((0..20).map(|i| {
        json!({"Kind": "service-splitter", "Name": format!("w{i}"), "Splits": [
            {"Weight": 50, "Service": format!("w{}", i + 1)},
            {"Weight": 50, "Service": format!("w{}", i + 1), "RequestHeaders": {"Set": {"x": "1"}}}]})
    })));
    let e = compile(&CompileRequest::new("w0", "dc1", TD), &wide).unwrap_err();
    assert!(e.to_string().contains("more than 1000 ways"), "{e}");
}

#[test]
fn absurd_weights_are_refused() {
    let e = decode_and_validate(&json!({"Kind": "service-splitter", "Name": "s",
        "Splits": [{"Weight": 3.0e38, "Service": "a"}, {"Weight": 3.0e38, "Service": "b"}]}))
    .unwrap_err();
    assert!(e.to_string().contains("must be 100"), "{e}");
}
