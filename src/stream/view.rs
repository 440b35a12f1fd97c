//! Materialized views: a service's health kept current from the publisher,
//! serving blocking health reads.
//!
//! A view subscribes to one key of a health topic (`ServiceHealth` or
//! `ServiceHealthConnect`), builds the instance set from the snapshot, then
//! applies each event. Every blocking read of that service shares the view:
//! it waits for the view's index to pass its `?index` and answers from the
//! view, so it wakes only on events for that service, and many watchers of
//! one service cost one subscription. A view lives while it is read and a
//! while after (`IDLE`), then its subscription is dropped.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use imbl::OrdMap;
use tokio::sync::watch;

use super::{Item, Publisher, Topic};
use crate::state::catalog::Instance;
use crate::state::{NodeKey, Store};

/// How long an unread view is kept.
const IDLE: Duration = Duration::from_secs(60);
/// The most views a server keeps: past it (a client asking for many
/// distinct names), reads are answered from the state instead.
const MAX_VIEWS: usize = 10_000;

/// One version of a view: the service's instances at `index`.
#[derive(Debug, Default)]
pub struct Answer {
    /// The last change to the service (0 until the snapshot is in).
    pub index: u64,
    pub instances: OrdMap<NodeKey, Arc<Instance>>,
}

pub struct View {
    current: watch::Receiver<Arc<Answer>>,
    last_read: Mutex<Instant>,
    task: tokio::task::AbortHandle,
}

impl Drop for View {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl View {
    fn start(store: Arc<Store>, publisher: &Publisher, topic: Topic, key: &str) -> View {
        let (tx, current) = watch::channel(Arc::new(Answer::default()));
        let mut sub = publisher.subscribe(store, topic, key, 0);
        let task = tokio::spawn(async move {
            let mut instances: OrdMap<NodeKey, Arc<Instance>> = OrdMap::new();
            let mut index = 0;
            let mut in_snapshot = true;
            loop {
                let mut changed = false;
                // No reader: the view is the server's own; each read of it
                // is checked against its caller's token.
                let Ok(items) = sub.next_batch().await else {
                    return;
                };
                for item in items {
                    match item {
                        Item::Event(e) => {
                            let Some(inst) = &e.instance else { continue };
                            let k = (inst.node.node.clone(), inst.service.id.clone());
                            if e.op() == "Deregister" {
                                instances.remove(&k);
                            } else {
                                instances.insert(k, inst.clone());
                            }
                            if !in_snapshot {
                                index = index.max(e.index);
                            }
                            changed = true;
                        }
                        Item::EndOfSnapshot(_) => {
                            in_snapshot = false;
                            index = index.max(sub.snapshot_key_index());
                            changed = true;
                        }
                        // Start over; readers keep the last answer until
                        // the new snapshot is complete.
                        Item::NewSnapshotToFollow => {
                            in_snapshot = true;
                            instances = OrdMap::new();
                        }
                    }
                }
                if changed && !in_snapshot {
                    let answer = Answer {
                        index,
                        instances: instances.clone(),
                    };
                    tx.send_replace(Arc::new(answer));
                }
            }
        });
        View {
            current,
            last_read: Mutex::new(Instant::now()),
            task: task.abort_handle(),
        }
    }

    /// The view once its index is past `index`, or at `deadline` whatever
    /// it holds (never before its first snapshot is complete).
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
                // The view stopped (shutdown) or the wait ran out.
                Some(Err(_)) | None => return rx.borrow().clone(),
            }
        }
    }
}

/// The views of one server, by (topic, service name).
pub struct Views {
    store: Arc<Store>,
    publisher: Arc<Publisher>,
    views: Mutex<HashMap<(Topic, String), Arc<View>>>,
}

impl Views {
    pub fn new(store: Arc<Store>, publisher: Arc<Publisher>) -> Arc<Views> {
        let views = Arc::new(Views {
            store,
            publisher,
            views: Mutex::new(HashMap::new()),
        });
        let weak = Arc::downgrade(&views);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(IDLE / 4);
            loop {
                tick.tick().await;
                let Some(views) = weak.upgrade() else { return };
                views.drop_idle();
            }
        });
        views
    }

    /// The view of `name` on a health topic, started if there is none
    /// (none when the server already keeps `MAX_VIEWS`).
    pub fn get(&self, topic: Topic, name: &str) -> Option<Arc<View>> {
        let mut views = self.views.lock();
        let key = (topic, name.to_string());
        if let Some(v) = views.get(&key) {
            return Some(v.clone());
        }
        if views.len() >= MAX_VIEWS {
            return None;
        }
        let view = Arc::new(View::start(
            self.store.clone(),
            &self.publisher,
            topic,
            name,
        ));
        views.insert(key, view.clone());
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
            let idle: Vec<(Topic, String)> = views
                .iter()
                .filter(|(_, v)| Arc::strong_count(v) == 1 && v.last_read.lock().elapsed() > IDLE)
                .map(|(k, _)| k.clone())
                .collect();
            idle.iter().filter_map(|k| views.remove(k)).collect()
        };
        drop(gone); // their subscriptions stop here, outside the lock
    }
}
