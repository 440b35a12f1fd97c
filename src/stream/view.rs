//! Materialized views: a service's health kept current from a stream of
//! its events, serving blocking health reads.
//!
//! A view follows one key of a health topic (`ServiceHealth` or
//! `ServiceHealthConnect`): a [`Materializer`] builds the instance set from
//! the snapshot, then applies each event. Every blocking read of that
//! service shares the view: it waits for the view's index to pass its
//! `?index` and answers from the view ([`Selection`] turns the instances into
//! the rows a health read shows), so it wakes only on events for that
//! service, and many watchers of one service cost one subscription. A view
//! lives while it is read and a while after (`IDLE`), then its
//! subscription is dropped ([`ViewSet`]).
//!
//! A server's views ([`Views`]) follow its own publisher; a client agent's
//! (`agent::health_view`) follow a server's `/v1/internal/stream`, one per
//! service and token, with the same materializer, views and sets.

use std::borrow::{Borrow, Cow};
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;
use tokio::time::Instant;

use imbl::OrdMap;
use tokio::sync::watch;

use super::{Item, Publisher, Topic};
use crate::error::Result;
use crate::request::Params;
use crate::request::list_filter::{
    RowFilter, Rows, apply_filter, node_matches, node_meta_filters, passing_flag, tags_match,
};
use crate::state::catalog::Instance;
use crate::state::{NodeKey, Store};
use crate::structs::rows::CheckServiceNode;
use crate::structs::{HEALTH_PASSING, Node};

/// How long an unread view is kept.
const IDLE: Duration = Duration::from_secs(60);
/// The most views a set keeps: past it (a client asking for many
/// distinct names), reads are answered another way (the state, or a
/// server).
const MAX_VIEWS: usize = 10_000;
/// A view whose feed ended (a refused subscription) is kept this long
/// before the next read starts a new one, so that reads a server refuses
/// do not each open a subscription.
const RETRY_CLOSED: Duration = Duration::from_secs(10);

/// One version of a view: the service's instances at `index`.
#[derive(Debug, Default)]
pub struct Answer {
    /// The last change to the service (0 until the snapshot is in).
    pub index: u64,
    pub instances: OrdMap<NodeKey, Arc<Instance>>,
}

/// A service's instances built from a stream: a snapshot, its end, then
/// each change; a new snapshot when the stream starts over. It answers
/// only between complete snapshots, so readers never see half of one.
pub struct Materializer {
    instances: OrdMap<NodeKey, Arc<Instance>>,
    index: u64,
    in_snapshot: bool,
    changed: bool,
    /// The instances of the last answer (none before the first).
    published: Option<OrdMap<NodeKey, Arc<Instance>>>,
}

impl Default for Materializer {
    fn default() -> Self {
        Materializer {
            instances: OrdMap::new(),
            index: 0,
            in_snapshot: true,
            changed: false,
            published: None,
        }
    }
}

impl Materializer {
    /// An instance registered or changed (`deregister` false), or gone,
    /// at `index`.
    pub fn event(&mut self, instance: &Arc<Instance>, deregister: bool, index: u64) {
        let k = (instance.node.node.clone(), instance.service.id.clone());
        if deregister {
            self.instances.remove(&k);
        } else {
            self.instances.insert(k, instance.clone());
        }
        if !self.in_snapshot {
            self.index = self.index.max(index);
        }
        self.changed = true;
    }

    /// The snapshot (made at `index`) is complete; `key_index` is the
    /// service's own index in it (its last change, what a health read
    /// reports). A later snapshot that holds something else than the last
    /// answer without the service having changed (the subscriber's token
    /// may read more or less now) answers at the snapshot's index, so
    /// that watchers are told.
    pub fn end_of_snapshot(&mut self, key_index: u64, index: u64) {
        self.in_snapshot = false;
        let differs = self
            .published
            .as_ref()
            .is_some_and(|last| *last != self.instances);
        let at = if differs {
            key_index.max(index)
        } else {
            key_index
        };
        self.index = self.index.max(at);
        self.changed = true;
    }

    /// Start over: readers keep the last answer until the new snapshot is
    /// complete.
    pub fn new_snapshot(&mut self) {
        self.in_snapshot = true;
        self.instances = OrdMap::new();
    }

    /// Whether a snapshot is being received (answers wait for its end).
    pub fn in_snapshot(&self) -> bool {
        self.in_snapshot
    }

    /// The answer to publish, if anything changed since the last one and
    /// no snapshot is half done.
    pub fn take_answer(&mut self) -> Option<Answer> {
        if !self.changed || self.in_snapshot {
            return None;
        }
        self.changed = false;
        self.published = Some(self.instances.clone());
        Some(Answer {
            index: self.index,
            instances: self.instances.clone(),
        })
    }
}

/// A view: the answers its feeding task publishes, read by blocking reads.
pub struct View {
    current: watch::Receiver<Arc<Answer>>,
    last_read: Mutex<Instant>,
    started: Instant,
    task: tokio::task::AbortHandle,
}

impl Drop for View {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Where a view's feeding task publishes its answers.
pub type Publish = watch::Sender<Arc<Answer>>;

impl View {
    /// A view fed by the task `feed` spawns with the sender of its
    /// answers: the task stops when the view is dropped, and the view is
    /// closed ([`View::is_closed`]) once the task returns.
    pub fn spawn<F>(feed: impl FnOnce(Publish) -> F) -> View
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let (tx, current) = watch::channel(Arc::new(Answer::default()));
        let task = tokio::spawn(feed(tx));
        View {
            current,
            last_read: Mutex::new(Instant::now()),
            started: Instant::now(),
            task: task.abort_handle(),
        }
    }

    /// A view of `key` on a health topic, fed by this server's publisher.
    fn start(store: Arc<Store>, publisher: &Publisher, topic: Topic, key: &str) -> View {
        let mut sub = publisher.subscribe(store, topic, key, 0);
        View::spawn(|tx| async move {
            let mut m = Materializer::default();
            loop {
                // No reader: the view is the server's own; each read of it
                // is checked against its caller's token.
                let Ok(items) = sub.next_batch().await else {
                    return;
                };
                for item in items {
                    match item {
                        Item::Event(e) => {
                            if let Some(inst) = &e.instance {
                                m.event(inst, e.op() == "Deregister", e.index);
                            }
                        }
                        Item::EndOfSnapshot(index) => {
                            m.end_of_snapshot(sub.snapshot_key_index(), index)
                        }
                        Item::NewSnapshotToFollow => m.new_snapshot(),
                    }
                }
                if let Some(answer) = m.take_answer() {
                    tx.send_replace(Arc::new(answer));
                }
            }
        })
    }

    /// Whether its feed has ended: it answers nothing new.
    pub fn is_closed(&self) -> bool {
        self.current.has_changed().is_err()
    }

    /// The view once its index is past `index`, or at `deadline` whatever
    /// it holds (never before its first snapshot is complete, unless its
    /// feed ends first: then an answer at index 0).
    pub async fn wait(&self, index: u64, deadline: tokio::time::Instant) -> Arc<Answer> {
        *self.last_read.lock() = Instant::now();
        let mut rx = self.current.clone();
        loop {
            let answer = rx.borrow_and_update().clone();
            let ready = answer.index > 0;
            if ready && (answer.index > index || tokio::time::Instant::now() >= deadline) {
                return answer;
            }
            let changed = rx.changed();
            let _parked = ready.then(|| crate::metrics::BLOCKING_PARKED.hold());
            let woke = if ready {
                tokio::time::timeout_at(deadline, changed).await.ok()
            } else {
                Some(changed.await)
            };
            match woke {
                Some(Ok(())) => {}
                // The view stopped (shutdown, a feed that ended) or the
                // wait ran out.
                Some(Err(_)) | None => return rx.borrow().clone(),
            }
        }
    }
}

/// Views by key, each dropped once nobody read it for `IDLE` and nobody
/// waits on it; at most `MAX_VIEWS`.
pub struct ViewSet<K> {
    views: Mutex<HashMap<K, Arc<View>>>,
}

impl<K: Hash + Eq + Clone + Send + 'static> ViewSet<K> {
    /// An empty set, swept for idle views by a task of its own (which
    /// ends with the set).
    pub fn new() -> Arc<ViewSet<K>> {
        let set = Arc::new(ViewSet {
            views: Mutex::new(HashMap::new()),
        });
        let weak = Arc::downgrade(&set);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(IDLE / 4);
            loop {
                tick.tick().await;
                let Some(set) = weak.upgrade() else { return };
                set.drop_idle();
            }
        });
        set
    }

    /// The view of `key`, started by `start` if there is none (or its
    /// feed ended over `RETRY_CLOSED` ago); none when the set is full.
    pub fn get_or_start(&self, key: K, start: impl FnOnce() -> View) -> Option<Arc<View>> {
        let mut views = self.views.lock();
        if let Some(v) = views.get(&key)
            && !(v.is_closed() && v.started.elapsed() > RETRY_CLOSED)
        {
            return Some(v.clone());
        }
        if views.len() >= MAX_VIEWS && !views.contains_key(&key) {
            return None;
        }
        let view = Arc::new(start());
        let old = views.insert(key, view.clone());
        drop(views);
        drop(old); // its feed stops here, outside the lock
        Some(view)
    }

    /// Views kept now (a gauge).
    pub fn len(&self) -> usize {
        self.views.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops views nobody read for `IDLE` and nobody is waiting on.
    fn drop_idle(&self) {
        let gone: Vec<Arc<View>> = {
            let mut views = self.views.lock();
            let idle: Vec<K> = views
                .iter()
                .filter(|(_, v)| Arc::strong_count(v) == 1 && v.last_read.lock().elapsed() > IDLE)
                .map(|(k, _)| k.clone())
                .collect();
            idle.iter().filter_map(|k| views.remove(k)).collect()
        };
        drop(gone); // their subscriptions stop here, outside the lock
    }
}

/// The views of one server, by (topic, service name), fed by its
/// publisher.
pub struct Views {
    store: Arc<Store>,
    publisher: Arc<Publisher>,
    set: Arc<ViewSet<(Topic, String)>>,
}

impl Views {
    pub fn new(store: Arc<Store>, publisher: Arc<Publisher>) -> Arc<Views> {
        Arc::new(Views {
            store,
            publisher,
            set: ViewSet::new(),
        })
    }

    /// The view of `name` on a health topic, started if there is none
    /// (none when the server already keeps `MAX_VIEWS`).
    pub fn get(&self, topic: Topic, name: &str) -> Option<Arc<View>> {
        self.set.get_or_start((topic, name.to_string()), || {
            View::start(self.store.clone(), &self.publisher, topic, name)
        })
    }

    /// Views kept now (a gauge).
    pub fn len(&self) -> usize {
        self.set.len()
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

/// The nodes of `found` as health rows show them: one registered without
/// a datacenter is shown in ours (only those few rows pay for a copy).
pub fn shown_nodes<'a, I: Borrow<Instance>>(found: &'a [I], dc: &str) -> Vec<Cow<'a, Node>> {
    found
        .iter()
        .map(|i| {
            let i = i.borrow();
            if i.node.datacenter.is_empty() {
                let mut n = (*i.node).clone();
                n.datacenter = dc.to_owned();
                Cow::Owned(n)
            } else {
                Cow::Borrowed(&*i.node)
            }
        })
        .collect()
}

/// Whether every check of the instance passes (`?passing`).
pub fn all_passing(i: &Instance) -> bool {
    i.checks.iter().all(|c| c.status == HEALTH_PASSING)
}

/// What a `/v1/health/service|connect/:s` read selects, from its query
/// string: `?passing`, `?node-meta`, `?tag`, `?filter`. The server's
/// handler and a client agent's views answer through it alike.
pub struct Selection {
    passing: bool,
    meta: Vec<(String, String)>,
    tags: Vec<String>,
    /// `?peer=`: the instances imported from that peer (none: the local
    /// ones), as Consul's `PeerName` selects them.
    peer: String,
    filter: Option<RowFilter>,
}

impl Selection {
    /// The selection `p` asks for (a bad `?passing` or `?filter`: 400).
    pub fn parse(p: &Params) -> Result<Selection> {
        Ok(Selection {
            passing: passing_flag(p)?,
            meta: node_meta_filters(p),
            tags: p.all("tag").into_iter().map(String::from).collect(),
            peer: p.get("peer").unwrap_or_default().to_string(),
            filter: RowFilter::from_params(p, Rows::CheckServiceNodes)?,
        })
    }

    /// The rows of `found` this read selects, before `?filter` (see
    /// [`Selection::filter`]); `nodes` are `shown_nodes(found)`.
    pub fn select<'a, I: Borrow<Instance>>(
        &self, found: &'a [I], nodes: &'a [Cow<'a, Node>],
    ) -> Vec<CheckServiceNode<'a>> {
        let tags: Vec<&str> = self.tags.iter().map(String::as_str).collect();
        found
            .iter()
            .map(Borrow::borrow)
            .zip(nodes.iter())
            .filter(|(i, _)| {
                node_matches(&i.node, &self.meta)
                    && tags_match(&i.service, &tags)
                    && i.service.peer_name == self.peer
                    && (!self.passing || all_passing(i))
            })
            .map(|(i, n)| CheckServiceNode {
                node: n,
                service: &i.service,
                checks: &i.checks,
            })
            .collect()
    }

    /// `?filter` applied (after the token's own filtering, as Consul).
    pub fn filter(&self, rows: &mut Vec<CheckServiceNode<'_>>) {
        apply_filter(&self.filter, rows);
    }
}
