//! Publisher semantics: snapshot then changes in order, no gaps, resume
//! from a buffered index, a fresh snapshot after falling behind or a reset,
//! and health events for every instance a node change touches.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::state::Command;
use crate::structs::config_entry::Kind;
use crate::structs::{HealthCheck, KvOp, NodeService, RegisterRequest};
use crate::testing::World;

fn put(w: &mut World, key: &str) {
    w.apply(Command::Kv(KvOp::set(key, b"v".to_vec())));
}

fn subscribe(w: &World, topic: Topic, key: &str, index: u64) -> Subscription {
    w.publisher.subscribe(w.store.clone(), topic, key, index)
}

async fn next(sub: &mut Subscription) -> Item {
    tokio::time::timeout(Duration::from_secs(2), sub.next())
        .await
        .expect("an item within 2s")
        .expect("no reader: never refused")
}

fn event(item: Item) -> Arc<Event> {
    match item {
        Item::Event(e) => e,
        other => panic!("expected an event, got {other:?}"),
    }
}

#[tokio::test]
async fn snapshot_then_every_change_in_order() {
    let mut w = World::new();
    put(&mut w, "a/1");
    put(&mut w, "b/1");
    let mut sub = subscribe(&w, Topic::Kv, "a/", 0);
    assert_eq!(event(next(&mut sub).await).key, "a/1");
    assert!(matches!(next(&mut sub).await, Item::EndOfSnapshot(3)));
    for i in 2..6 {
        put(&mut w, &format!("a/{i}"));
        put(&mut w, "b/other");
    }
    let mut seen = Vec::new();
    for _ in 2..6 {
        let e = event(next(&mut sub).await);
        seen.push((e.key.clone(), e.index));
    }
    assert_eq!(
        seen,
        vec![
            ("a/2".into(), 4),
            ("a/3".into(), 6),
            ("a/4".into(), 8),
            ("a/5".into(), 10)
        ]
    );
}

#[tokio::test]
async fn resumes_from_a_buffered_index_without_a_snapshot() {
    let mut w = World::new();
    put(&mut w, "k/1");
    let mut sub = subscribe(&w, Topic::Kv, "k/", 0);
    next(&mut sub).await;
    next(&mut sub).await;
    put(&mut w, "k/2");
    let e = event(next(&mut sub).await);
    let resume_at = e.index;
    drop(sub);
    put(&mut w, "k/3");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut again = subscribe(&w, Topic::Kv, "k/", resume_at);
    let e = event(next(&mut again).await);
    assert_eq!((e.key.as_str(), e.op()), ("k/3", "Upsert"));
}

#[tokio::test]
async fn a_restarted_publisher_does_not_resume_from_before_its_start() {
    // A server restarted from a state at index 5 holds no events before
    // it: a subscriber resuming there from index 3 (seen on another
    // server) could miss events 4 and 5, so it gets a snapshot instead.
    let mut w = World::new();
    for i in 0..4 {
        put(&mut w, &format!("f/{i}"));
    }
    w.publisher = Arc::new(Publisher::new(w.index));
    let mut behind = subscribe(&w, Topic::Kv, "f/", w.index - 2);
    assert!(matches!(next(&mut behind).await, Item::NewSnapshotToFollow));
    let mut at = subscribe(&w, Topic::Kv, "f/", w.index);
    put(&mut w, "f/new");
    let e = event(next(&mut at).await);
    assert_eq!((e.key.as_str(), e.index), ("f/new", w.index));
}

#[tokio::test]
async fn a_subscriber_behind_the_buffer_gets_a_fresh_snapshot() {
    let mut w = World::new();
    put(&mut w, "x/0");
    let mut slow = subscribe(&w, Topic::Kv, "x/", 0);
    next(&mut slow).await;
    next(&mut slow).await;
    // More events than the buffer holds, while the subscriber sleeps.
    for i in 0..(BUFFER_EVENTS + 10) {
        w.apply(Command::Txn(vec![crate::structs::TxnOp::Kv(KvOp::set(
            format!("x/{}", i % 50),
            vec![],
        ))]));
    }
    while w.publisher.published_index() < w.index {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(matches!(next(&mut slow).await, Item::NewSnapshotToFollow));
    let mut keys = 0;
    loop {
        match next(&mut slow).await {
            Item::Event(_) => keys += 1,
            Item::EndOfSnapshot(i) => {
                assert_eq!(i, w.index);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(keys, 50);
    // And a fast subscriber was never held back meanwhile.
    let mut fast = subscribe(&w, Topic::Kv, "x/", 0);
    assert!(matches!(next(&mut fast).await, Item::Event(_)));
}

#[tokio::test]
async fn a_reset_makes_subscribers_start_over() {
    let mut w = World::new();
    put(&mut w, "r/1");
    let mut sub = subscribe(&w, Topic::Kv, "r/", 0);
    next(&mut sub).await;
    next(&mut sub).await;
    w.publisher.reset(w.store.state().index);
    put(&mut w, "r/2");
    assert!(matches!(next(&mut sub).await, Item::NewSnapshotToFollow));
    let mut n = 0;
    while let Item::Event(_) = next(&mut sub).await {
        n += 1;
    }
    assert_eq!(n, 2);
}

fn register(node: &str, svc: Option<NodeService>, checks: Vec<HealthCheck>) -> Command {
    Command::Register(Box::new(RegisterRequest {
        node: node.into(),
        address: "10.0.0.1".into(),
        service: svc,
        checks,
        ..Default::default()
    }))
}

fn service(id: &str, name: &str) -> NodeService {
    NodeService {
        id: id.into(),
        service: name.into(),
        port: 80,
        ..Default::default()
    }
}

#[tokio::test]
async fn health_events_cover_node_checks_and_connect_proxies() {
    let mut w = World::new();
    w.apply(register("n1", Some(service("web1", "web")), vec![]));
    w.apply(register("n1", Some(service("db1", "db")), vec![]));
    let mut proxy = service("web1-proxy", "web-proxy");
    proxy.kind = "connect-proxy".into();
    proxy.proxy.destination_service_name = "web".into();
    w.apply(register("n1", Some(proxy), vec![]));

    let mut web = subscribe(&w, Topic::ServiceHealth, "web", 0);
    let mut connect = subscribe(&w, Topic::ServiceHealthConnect, "web", 0);
    assert_eq!(
        event(next(&mut web).await).payload()["Value"]["Service"]["ID"],
        "web1"
    );
    assert!(matches!(next(&mut web).await, Item::EndOfSnapshot(_)));
    assert_eq!(
        event(next(&mut connect).await).payload()["Value"]["Service"]["ID"],
        "web1-proxy"
    );
    assert!(matches!(next(&mut connect).await, Item::EndOfSnapshot(_)));

    // A node-level check touches every instance on the node.
    let check = HealthCheck {
        check_id: "serfHealth".into(),
        name: "Serf".into(),
        status: crate::structs::HEALTH_CRITICAL,
        ..Default::default()
    };
    w.apply(register("n1", None, vec![check]));
    let e = event(next(&mut web).await);
    assert_eq!(e.op(), "Register");
    assert_eq!(e.payload()["Value"]["Checks"][0]["Status"], "critical");
    let e = event(next(&mut connect).await);
    assert_eq!(e.payload()["Value"]["Service"]["ID"], "web1-proxy");

    // Deregistering the node deregisters its instances.
    w.apply(Command::Deregister(crate::structs::DeregisterRequest {
        node: "n1".into(),
        ..Default::default()
    }));
    let e = event(next(&mut web).await);
    assert_eq!(
        (e.op(), e.payload()["Value"]["Service"]["ID"].as_str()),
        ("Deregister", Some("web1"))
    );
}

#[tokio::test]
async fn config_entries_are_topics_keyed_by_name() {
    let mut w = World::new();
    let mut sub = subscribe(&w, Topic::Config(Kind::ServiceDefaults), "web", 0);
    assert!(matches!(next(&mut sub).await, Item::EndOfSnapshot(_)));
    w.apply(Command::ConfigSet {
        entry: serde_json::json!({"Kind": "service-defaults", "Name": "db", "Protocol": "http"}),
        cas: None,
    });
    w.apply(Command::ConfigSet {
        entry: serde_json::json!({"Kind": "service-defaults", "Name": "web", "Protocol": "http"}),
        cas: None,
    });
    let e = event(next(&mut sub).await);
    assert_eq!(
        (e.key.as_str(), e.payload()["Value"]["Protocol"].as_str()),
        ("web", Some("http"))
    );
}

#[tokio::test]
async fn a_snapshot_never_takes_a_subscriber_back_in_time() {
    // The subscriber saw index N on a server further ahead and moved here;
    // this server is behind N and its state is then replaced: the fresh
    // snapshot waits until this server has caught up with N.
    let mut w = World::new();
    put(&mut w, "t/0");
    let ahead = w.index + 2;
    let mut sub = subscribe(&w, Topic::Kv, "t/", ahead);
    w.publisher.reset(w.index);
    assert!(matches!(next(&mut sub).await, Item::NewSnapshotToFollow));
    let early = tokio::time::timeout(Duration::from_millis(200), sub.next()).await;
    assert!(early.is_err(), "a snapshot behind {ahead}: {early:?}");
    put(&mut w, "t/1");
    put(&mut w, "t/2");
    let mut keys = Vec::new();
    let end = loop {
        match next(&mut sub).await {
            Item::Event(e) => keys.push(e.key.clone()),
            Item::EndOfSnapshot(i) => break i,
            other => panic!("unexpected {other:?}"),
        }
    };
    assert!(end >= ahead, "snapshot at {end}, subscriber held {ahead}");
    assert_eq!(keys, vec!["t/0", "t/1", "t/2"]);
}

#[tokio::test]
async fn renaming_an_instance_deregisters_it_under_its_old_name() {
    let mut w = World::new();
    w.apply(register("n1", Some(service("s1", "old")), vec![]));
    let mut old = subscribe(&w, Topic::ServiceHealth, "old", 0);
    assert_eq!(event(next(&mut old).await).op(), "Register");
    assert!(matches!(next(&mut old).await, Item::EndOfSnapshot(_)));
    let mut new = subscribe(&w, Topic::ServiceHealth, "new", 0);
    assert!(matches!(next(&mut new).await, Item::EndOfSnapshot(_)));
    w.apply(register("n1", Some(service("s1", "new")), vec![]));
    let e = event(next(&mut old).await);
    assert_eq!((e.op(), e.key.as_str()), ("Deregister", "old"));
    let e = event(next(&mut new).await);
    assert_eq!((e.op(), e.key.as_str()), ("Register", "new"));
    assert_eq!(e.instance.as_ref().unwrap().service.id, "s1");
}

mod views {
    //! Materialized health views: built from the snapshot, kept current by
    //! events of their service only.

    use super::*;
    use crate::stream::view::Views;

    fn deadline(ms: u64) -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_millis(ms)
    }

    fn ids(answer: &crate::stream::view::Answer) -> Vec<String> {
        answer
            .instances
            .values()
            .map(|i| i.service.id.clone())
            .collect()
    }

    #[tokio::test]
    async fn a_view_answers_at_the_services_own_index_and_wakes_only_for_it() {
        let mut w = World::new();
        w.apply(register("n1", Some(service("web1", "web")), vec![]));
        let web_index = w.index;
        w.apply(register("n2", Some(service("db1", "db")), vec![]));
        let views = Views::new(w.store.clone(), w.publisher.clone());
        let view = views.get(Topic::ServiceHealth, "web").unwrap();

        // Not blocking: the snapshot, at the index of web's last change
        // (db's later registration is not web's).
        let first = view.wait(0, deadline(2000)).await;
        assert_eq!((first.index, ids(&first)), (web_index, vec!["web1".into()]));

        // A write to another service does not wake a watcher of web.
        let watcher = {
            let view = view.clone();
            tokio::spawn(async move { view.wait(web_index, deadline(5000)).await })
        };
        w.apply(register("n2", Some(service("db2", "db")), vec![]));
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(!watcher.is_finished(), "woken by a write to db");

        // A new web instance does, at its own index.
        w.apply(register("n2", Some(service("web2", "web")), vec![]));
        let woke = tokio::time::timeout(Duration::from_secs(2), watcher)
            .await
            .expect("woken within 2s")
            .unwrap();
        assert_eq!(woke.index, w.index);
        assert_eq!(ids(&woke), vec!["web1", "web2"]);

        // A failing node check changes web1's health in the view.
        let check = HealthCheck {
            check_id: "serfHealth".into(),
            status: crate::structs::HEALTH_CRITICAL,
            ..Default::default()
        };
        w.apply(register("n1", None, vec![check]));
        let after = view.wait(woke.index, deadline(2000)).await;
        let web1 = after.instances.values().find(|i| i.service.id == "web1");
        assert_eq!(web1.unwrap().checks[0].status, "critical");

        // Deregistering removes it.
        w.apply(Command::Deregister(crate::structs::DeregisterRequest {
            node: "n2".into(),
            service_id: "web2".into(),
            ..Default::default()
        }));
        let after = view.wait(after.index, deadline(2000)).await;
        assert_eq!(ids(&after), vec!["web1"]);
        assert_eq!(views.len(), 1, "one view per service, shared");
    }

    fn instance(node: &str, id: &str) -> Arc<crate::state::catalog::Instance> {
        Arc::new(crate::state::catalog::Instance {
            node: Arc::new(crate::structs::Node {
                node: node.into(),
                ..Default::default()
            }),
            service: Arc::new(service(id, "web")),
            checks: Vec::new(),
        })
    }

    /// The materializer the server's and the agents' views share: no
    /// answer inside a snapshot, the service's own index after it, later
    /// indexes from events, and a snapshot that starts over keeping the
    /// last answer until it is whole.
    #[test]
    fn a_materializer_answers_whole_snapshots_at_the_services_index() {
        use crate::stream::view::Materializer;
        let answer = |m: &mut Materializer| m.take_answer().map(|a| (a.index, ids(&a)));
        let mut m = Materializer::default();
        m.event(&instance("n1", "web1"), false, 40);
        assert_eq!(answer(&mut m), None, "half a snapshot");
        m.end_of_snapshot(12, 40);
        assert_eq!(answer(&mut m), Some((12, vec!["web1".into()])));
        assert_eq!(answer(&mut m), None, "nothing new");
        m.event(&instance("n2", "web2"), false, 41);
        assert_eq!(
            answer(&mut m),
            Some((41, vec!["web1".into(), "web2".into()]))
        );
        m.event(&instance("n1", "web1"), true, 42);
        assert_eq!(answer(&mut m), Some((42, vec!["web2".into()])));

        // Started over with the same instances: no later index, nobody
        // is woken for nothing.
        m.new_snapshot();
        m.event(&instance("n2", "web2"), false, 50);
        assert_eq!(answer(&mut m), None);
        m.end_of_snapshot(42, 50);
        assert_eq!(answer(&mut m), Some((42, vec!["web2".into()])));
        // Started over with others (rights changed, not the service): at
        // the snapshot's index, so that watchers are told.
        m.new_snapshot();
        m.end_of_snapshot(42, 55);
        assert_eq!(answer(&mut m), Some((55, vec![])));
        // The index never goes back.
        m.new_snapshot();
        m.end_of_snapshot(30, 31);
        assert_eq!(m.take_answer().unwrap().index, 55);
    }

    #[tokio::test]
    async fn a_watcher_returns_at_its_deadline_with_the_current_answer() {
        let mut w = World::new();
        w.apply(register("n1", Some(service("web1", "web")), vec![]));
        let views = Views::new(w.store.clone(), w.publisher.clone());
        let view = views.get(Topic::ServiceHealth, "web").unwrap();
        let started = tokio::time::Instant::now();
        let answer = view.wait(w.index, deadline(200)).await;
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert_eq!((answer.index, ids(&answer)), (w.index, vec!["web1".into()]));
    }

    #[tokio::test]
    async fn a_connect_view_holds_the_proxies_of_a_destination() {
        let mut w = World::new();
        let views = Views::new(w.store.clone(), w.publisher.clone());
        let view = views.get(Topic::ServiceHealthConnect, "web").unwrap();
        let empty = view.wait(0, deadline(2000)).await;
        assert!(empty.instances.is_empty());
        let mut proxy = service("web1-proxy", "web-proxy");
        proxy.kind = "connect-proxy".into();
        proxy.proxy.destination_service_name = "web".into();
        w.apply(register("n1", Some(proxy), vec![]));
        let answer = view.wait(empty.index, deadline(2000)).await;
        assert_eq!(ids(&answer), vec!["web1-proxy"]);
    }
}

/// Topic names are Consul's, in `?topic=` and in each event's `Topic`;
/// config topics are also asked for by their kind's name.
#[test]
fn topics_go_by_consuls_names() {
    for kind in Kind::ALL {
        let t = Topic::Config(kind);
        assert_eq!(Topic::parse(t.name()), Some(t));
        assert_eq!(Topic::parse(kind.as_str()), Some(t));
        assert_eq!(serde_json::to_value(t).unwrap(), t.name());
    }
    let names = [
        (Topic::ServiceHealth, "ServiceHealth"),
        (Topic::ServiceHealthConnect, "ServiceHealthConnect"),
        (Topic::Config(Kind::ProxyDefaults), "ProxyDefaults"),
        (Topic::Config(Kind::ServiceIntentions), "ServiceIntentions"),
        (Topic::Kv, "KV"),
        (Topic::CaRoots, "CARoots"),
    ];
    for (t, name) in names {
        assert_eq!(serde_json::to_value(t).unwrap(), name);
        assert_eq!(Topic::parse(name), Some(t));
    }
    assert_eq!(Topic::parse("kv"), Some(Topic::Kv));
    for unknown in ["Service-Defaults", "serviceHealth", "nope", ""] {
        assert_eq!(Topic::parse(unknown), None, "{unknown}");
    }
}

/// `visible` per topic, as Consul's `HasReadPermission`: KV by key, health
/// by service and node, config entries by their kind's read.
#[test]
fn an_event_is_visible_to_a_token_that_may_read_its_object() {
    let mut w = World::new();
    put(&mut w, "app/x");
    put(&mut w, "secret/x");
    w.apply(register("n1", Some(service("web1", "web")), vec![]));
    w.apply(register("n2", Some(service("web2", "web")), vec![]));
    for (kind, name) in [
        ("service-defaults", "web"),
        ("service-defaults", "db"),
        ("proxy-defaults", "global"),
    ] {
        w.apply(Command::ConfigSet {
            entry: serde_json::json!({"Kind": kind, "Name": name}),
            cas: None,
        });
    }
    let rules = crate::acl::parse_rules(
        r#"key_prefix "app/" { policy = "read" }
service "web" { policy = "read" }
node "n2" { policy = "read" }"#,
    )
    .unwrap();
    let a = crate::acl::Authorizer::new("t", &[&rules], crate::acl::DefaultPolicy::Deny);
    let st = w.store.state();
    let seen = |topic: Topic| -> Vec<String> {
        snapshot_events(&st, topic, "")
            .iter()
            .filter(|e| visible(&a, e))
            .map(|e| match &e.instance {
                Some(i) => format!("{}/{}", i.node.node, e.key),
                None => e.key.clone(),
            })
            .collect()
    };
    assert_eq!(seen(Topic::Kv), ["app/x"]);
    assert_eq!(seen(Topic::ServiceHealth), ["n2/web"]);
    assert_eq!(seen(Topic::Config(Kind::ServiceDefaults)), ["web"]);
    assert_eq!(seen(Topic::Config(Kind::ProxyDefaults)), ["global"]);
    let all = crate::acl::Authorizer::allow_all();
    let every = snapshot_events(&st, Topic::ServiceHealth, "");
    assert!(every.iter().all(|e| visible(&all, e)) && every.len() == 2);
}
