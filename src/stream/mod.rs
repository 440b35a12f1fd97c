//! The event publisher: every applied change becomes events on topics, in
//! commit order; subscribers get a snapshot of a topic key, then each change.
//!
//! The state machine hands each applied batch (change sets with the version
//! of the state each produced) to `Publisher::publish`, which only queues it:
//! a publisher task turns it into events outside the apply path. Every topic
//! keeps a bounded buffer (count and bytes) of recent events; a subscription
//! reads the buffer at its own pace, so a slow subscriber never blocks the
//! publisher or anyone else — it falls behind the buffer and is told
//! `NewSnapshotToFollow`.
//!
//! Topics: `ServiceHealth`, `ServiceHealthConnect`, one per config kind
//! (`Topic::Config(Kind)`, `ServiceIntentions` among them), `KV` and
//! `CARoots`. Each event holds its serialized line (made once, so buffers
//! hold no JSON tree) and, on the health topics, the typed instance shared
//! with the state. Subscribers of one key share a snapshot; a subscription
//! resumes from an index still buffered. With ACLs on, a subscription's
//! `Reader` filters every event by its token (`reader::visible`). A
//! snapshot also says the key's own index (its last change), which
//! `/v1/internal/stream`'s end of snapshot carries as `KeyIndex`;
//! `cairn_stream_subscriptions` counts the open ones.
//!
//! `view`: materialized per-service health views, one subscription each,
//! shared by every blocking `/v1/health/service|connect` read of that
//! service: the `Materializer` (a snapshot, its end, each change, a new
//! snapshot), `View` (waiting on its answers, whatever feeds it), `ViewSet`
//! (by key, idle ones dropped, at most `MAX_VIEWS`) and `Selection` (a
//! health read's `?passing`, `?tag`, `?node-meta`, `?filter`, and `?peer`:
//! the instances whose `PeerName` it names, none: the local ones; the
//! catalog's service rows select the same way). The server's views of its
//! own publisher and a client agent's (`agent::health_view`) share them.

mod buffer;
mod events;
mod reader;
pub mod view;

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;
// tokio's clock, which the simulation drives: a snapshot's sharing window
// must not depend on how fast the machine runs a seed.
use tokio::time::Instant;

use tokio::sync::{mpsc, watch};

pub use buffer::Buffer;
pub use events::{Event, Topic, events_of, snapshot_events, snapshot_index};
pub use reader::{Reader, visible};

use crate::error::Result;
use crate::state::{ChangeSet, State, Store};

/// Limits of one topic's buffer.
pub const BUFFER_EVENTS: usize = 16_384;
pub const BUFFER_BYTES: usize = 32 << 20;
/// How long a snapshot is shared by subscribers of the same topic key.
const SNAPSHOT_TTL: Duration = Duration::from_millis(500);

type Batch = Vec<(ChangeSet, Arc<State>)>;

/// What the publisher task is handed, in commit order.
enum Msg {
    Batch(Batch),
    /// The state was replaced by a snapshot at this index.
    Reset(u64),
}
/// (made at, index, buffer generation, the key's own index, events).
type SharedSnapshot = (Instant, u64, u64, u64, Arc<Vec<Arc<Event>>>);

pub struct Publisher {
    queue: mpsc::UnboundedSender<Msg>,
    inner: Arc<Inner>,
    /// Called with every change set handed to `publish`, in commit order.
    pub tap: Option<Tap>,
    /// The task turning change sets into events, until a server takes it
    /// to supervise.
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// An observer of applied change sets.
pub type Tap = Arc<dyn Fn(&ChangeSet) + Send + Sync>;

struct Inner {
    topics: Mutex<HashMap<Topic, Arc<Buffer>>>,
    /// Buffers hold every event after this index and none before: the
    /// state the publisher started from (a restart's loaded state) or was
    /// reset to (a snapshot install). A subscriber resuming from below it
    /// may have missed events another server delivered, so it starts over.
    floor: Mutex<u64>,
    /// The index of the last batch turned into events (0 = reset).
    published: watch::Sender<u64>,
    /// (topic, key) → the last snapshot made of it.
    snapshots: Mutex<HashMap<(Topic, String), SharedSnapshot>>,
}

impl Inner {
    fn buffer(&self, topic: Topic) -> Arc<Buffer> {
        self.topics
            .lock()
            .entry(topic)
            .or_insert_with(|| {
                let floor = *self.floor.lock();
                Arc::new(Buffer::new(BUFFER_EVENTS, BUFFER_BYTES, floor))
            })
            .clone()
    }

    fn reset(&self, index: u64) {
        *self.floor.lock() = index;
        for buf in self.topics.lock().values() {
            buf.reset(index);
        }
        self.snapshots.lock().clear();
        self.published.send_modify(|_| {});
    }
}

impl Default for Publisher {
    fn default() -> Self {
        Publisher::new(0)
    }
}

impl Publisher {
    /// A publisher for a state at index `floor`: it publishes what is
    /// applied after it.
    pub fn new(floor: u64) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Msg>();
        let inner = Arc::new(Inner {
            topics: Mutex::new(HashMap::new()),
            floor: Mutex::new(floor),
            published: watch::channel(0).0,
            snapshots: Mutex::new(HashMap::new()),
        });
        let worker = inner.clone();
        let run = async move {
            while let Some(msg) = rx.recv().await {
                let batch = match msg {
                    Msg::Batch(batch) => batch,
                    Msg::Reset(index) => {
                        worker.reset(index);
                        continue;
                    }
                };
                let mut last = 0;
                for (set, state) in batch {
                    let mut by_topic: HashMap<Topic, Vec<Arc<Event>>> = HashMap::new();
                    for e in events_of(&set, &state) {
                        by_topic.entry(e.topic).or_default().push(Arc::new(e));
                    }
                    for (topic, events) in by_topic {
                        worker.buffer(topic).append(set.index, events);
                    }
                    last = set.index;
                }
                if last > 0 {
                    worker.published.send_replace(last);
                }
            }
        };
        // Outside a runtime (unit tests of the store) nothing subscribes.
        let task = tokio::runtime::Handle::try_current()
            .ok()
            .map(|handle| handle.spawn(crate::tasks::fault("event publisher", run)));
        Publisher {
            queue: tx,
            inner,
            tap: None,
            task: Mutex::new(task),
        }
    }

    /// The publishing task, for a server to supervise (once): it runs
    /// until the publisher is dropped.
    pub fn take_task(&self) -> Option<tokio::task::JoinHandle<()>> {
        self.task.lock().take()
    }
}

/// What a subscriber receives, in order.
#[derive(Debug, Clone)]
pub enum Item {
    Event(Arc<Event>),
    /// The snapshot is complete up to this index.
    EndOfSnapshot(u64),
    /// The subscriber fell behind (or the state was replaced): a fresh
    /// snapshot follows.
    NewSnapshotToFollow,
}

impl Publisher {
    /// Queues an applied batch; called by the state machine after commit.
    pub fn publish(&self, batch: Vec<(ChangeSet, Arc<State>)>) {
        if let Some(tap) = &self.tap {
            for (set, _) in &batch {
                tap(set);
            }
        }
        if !batch.is_empty() {
            let _ = self.queue.send(Msg::Batch(batch));
        }
    }

    /// The index of the last applied batch turned into events.
    pub fn published_index(&self) -> u64 {
        *self.inner.published.borrow()
    }

    /// The whole state was replaced by a snapshot at `index`: every buffer
    /// is dropped (in order with the batches queued before) so subscribers
    /// start over with a snapshot.
    pub fn reset(&self, index: u64) {
        // The tap sees it as a set that replaced the whole state, so an
        // observer (the simulation's ground truth) knows everything up to
        // `index` was applied here now.
        if let Some(tap) = &self.tap {
            tap(&ChangeSet {
                index,
                replaced: true,
                ..Default::default()
            });
        }
        let _ = self.queue.send(Msg::Reset(index));
    }

    /// Subscribes to `topic` events for `key` ("" or "*" for every key; a
    /// prefix for KV). With `index` still covered by the buffer the
    /// subscription resumes after it without a snapshot.
    pub fn subscribe(
        &self, store: Arc<Store>, topic: Topic, key: &str, index: u64,
    ) -> Subscription {
        let key = if key == "*" {
            String::new()
        } else {
            key.to_string()
        };
        Subscription {
            inner: self.inner.clone(),
            buffer: self.inner.buffer(topic),
            published: self.inner.published.subscribe(),
            store,
            topic,
            key,
            cursor: index,
            pending: Vec::new().into_iter(),
            need_snapshot: index == 0,
            generation: None,
            key_index: 0,
            reader: None,
        }
    }
}

pub struct Subscription {
    inner: Arc<Inner>,
    buffer: Arc<Buffer>,
    published: watch::Receiver<u64>,
    store: Arc<Store>,
    topic: Topic,
    key: String,
    /// The index of the last event (or snapshot) delivered.
    cursor: u64,
    pending: std::vec::IntoIter<Item>,
    need_snapshot: bool,
    generation: Option<u64>,
    /// The last snapshot's index of the key itself (`snapshot_index`).
    key_index: u64,
    /// With ACLs on, the subscriber's token: events it may not read are
    /// not delivered. None: everything is (internal subscribers, ACLs off).
    reader: Option<Reader>,
}

impl Subscription {
    /// Delivers only what `reader`'s token may read (`visible`), checked
    /// again whenever the ACL generation moves; a deleted token ends the
    /// subscription (`next` returns the error).
    pub fn read_as(mut self, reader: Reader) -> Self {
        self.reader = Some(reader);
        self
    }

    /// The reader's authorizer at the newest version, and whether what it
    /// allows changed (see `Reader::check`); `Ok(None)` without a reader.
    fn reader_check(&mut self) -> Result<Option<(&crate::acl::Authorizer, bool)>> {
        match &mut self.reader {
            Some(r) => r.check(&self.store.state()).map(Some),
            None => Ok(None),
        }
    }

    /// The token's rights changed: what the subscriber holds was filtered
    /// by the old ones (objects it may no longer read, whose later changes
    /// it will not be told), so it starts over with a snapshot filtered
    /// by the new ones (Consul closes such a subscription, and its client
    /// subscribes again).
    fn rights_changed(&mut self) -> Item {
        self.need_snapshot = true;
        self.pending = Vec::new().into_iter();
        Item::NewSnapshotToFollow
    }

    fn wants(&self, e: &Event) -> bool {
        self.key.is_empty()
            || match self.topic {
                Topic::Kv => e.key.starts_with(&self.key),
                _ => e.key == self.key,
            }
    }

    /// A snapshot at the current state, shared with other subscribers of
    /// the same key for a moment to absorb thundering herds.
    fn snapshot(&mut self) -> Vec<Item> {
        let cache_key = (self.topic, self.key.clone());
        // A shared snapshot serves only while the buffer still holds every
        // event after it: the subscriber catches up from there.
        let generation = self.buffer.generation();
        let cached = {
            let cache = self.inner.snapshots.lock();
            cache
                .get(&cache_key)
                .filter(|(at, i, g, _, _)| {
                    at.elapsed() < SNAPSHOT_TTL
                        && *g == generation
                        && (*i >= self.cursor || cfg!(feature = "bug-stream-back-in-time"))
                        && self.buffer.covers(*i)
                })
                .map(|(_, i, _, k, e)| (*i, *k, e.clone()))
        };
        let (index, key_index, events) = cached.unwrap_or_else(|| {
            let state = self.store.state();
            let events: Arc<Vec<Arc<Event>>> = Arc::new(
                snapshot_events(&state, self.topic, &self.key)
                    .into_iter()
                    .map(Arc::new)
                    .collect(),
            );
            let key_index = snapshot_index(&state, self.topic, &self.key);
            let mut cache = self.inner.snapshots.lock();
            if cache.len() > 4096 {
                cache.retain(|_, (at, _, _, _, _)| at.elapsed() < SNAPSHOT_TTL);
            }
            cache.insert(
                cache_key,
                (
                    Instant::now(),
                    state.index,
                    generation,
                    key_index,
                    events.clone(),
                ),
            );
            (state.index, key_index, events)
        });
        self.cursor = index;
        self.key_index = key_index;
        self.generation = Some(generation);
        let mut items: Vec<Item> = events.iter().cloned().map(Item::Event).collect();
        items.push(Item::EndOfSnapshot(index));
        items
    }

    /// The next item, waiting for one if there is none yet. `Err` only
    /// with a reader whose token no longer resolves: the end.
    pub async fn next(&mut self) -> Result<Item> {
        loop {
            if let Some(item) = self.pending.next() {
                return Ok(item);
            }
            if self.need_snapshot {
                // A server behind what the subscriber already holds (it
                // moved here from a server further ahead) waits to catch
                // up: a snapshot never takes the subscriber back in time.
                if !cfg!(feature = "bug-stream-back-in-time")
                    && self.store.state().index < self.cursor
                {
                    self.published.borrow_and_update();
                    if self.store.state().index < self.cursor
                        && self.published.changed().await.is_err()
                    {
                        std::future::pending::<()>().await;
                    }
                    continue;
                }
                self.need_snapshot = false;
                let mut items = self.snapshot();
                // Checked at a version at least as new as the snapshot's.
                if let Some((a, _)) = self.reader_check()? {
                    items.retain(|i| !matches!(i, Item::Event(e) if !visible(a, e)));
                }
                self.pending = items.into_iter();
                continue;
            }
            self.published.borrow_and_update();
            let generation = self.buffer.generation();
            if self.generation.is_some_and(|g| g != generation) {
                // The state was replaced under us.
                self.need_snapshot = true;
                return Ok(Item::NewSnapshotToFollow);
            }
            self.generation = Some(generation);
            match self.buffer.after(self.cursor) {
                None => {
                    self.need_snapshot = true;
                    return Ok(Item::NewSnapshotToFollow);
                }
                Some(events) if !events.is_empty() => {
                    self.cursor = events.last().map(|e| e.index).unwrap_or(self.cursor);
                    let mut wanted: Vec<Item> = events
                        .into_iter()
                        .filter(|e| self.wants(e))
                        .map(Item::Event)
                        .collect();
                    // Checked at a version at least as new as the events'.
                    if !wanted.is_empty()
                        && let Some((a, changed)) = self.reader_check()?
                    {
                        if changed {
                            return Ok(self.rights_changed());
                        }
                        wanted.retain(|i| !matches!(i, Item::Event(e) if !visible(a, e)));
                    }
                    self.pending = wanted.into_iter();
                }
                Some(_) => {
                    // A wake with nothing to deliver (an ACL change among
                    // them) checks the token too: a deleted one ends the
                    // stream without waiting for an event of its topic,
                    // and changed rights start it over at once.
                    if let Some((_, true)) = self.reader_check()? {
                        return Ok(self.rights_changed());
                    }
                    if self.published.changed().await.is_err() {
                        // The publisher is gone (shutdown): nothing more.
                        std::future::pending::<()>().await;
                    }
                }
            }
        }
    }

    /// Every item ready now (at least one, waiting for it): whole indexes
    /// only, so that a consumer that writes each batch at once never leaves
    /// a reader with half of an index.
    pub async fn next_batch(&mut self) -> Result<Vec<Item>> {
        let mut items = vec![self.next().await?];
        items.extend(self.pending.by_ref());
        Ok(items)
    }

    /// The index of the last event or snapshot delivered.
    pub fn index(&self) -> u64 {
        self.cursor
    }

    /// The index of the key itself in the last snapshot delivered: for one
    /// service's health, its last change (what a blocking health read
    /// reports), which can be older than the snapshot's index.
    pub fn snapshot_key_index(&self) -> u64 {
        self.key_index
    }
}

#[cfg(test)]
mod tests;
