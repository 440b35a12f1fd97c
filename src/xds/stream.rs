//! What every ADS stream shares, whatever its protocol, and the one task
//! that serves a stream from its first request to its end (`open`, then
//! `serve`): the proxy's snapshot is turned into resources, and the
//! protocol's session runs between the client's requests and the
//! snapshot's rebuilds. A protocol is a `Protocol`: its messages and its
//! session, a state machine without I/O (`delta::Session`, the incremental
//! variant Consul serves; `sotw::Session`, state of the world, for xDS
//! clients that speak only it, gRPC's proxyless client among them). The
//! gRPC service (`server`) admits a stream and spawns its task.
//!
//! The stream's token is checked before any lookup, again whenever an ACL
//! changes and at the token's expiry; the shared snapshot is narrowed to
//! the endpoints that token may read (`proxycfg::hidden`), again whenever
//! an ACL changes; its resources are built on one blocking thread across
//! the server, which wakes the streams it built for a few at a time
//! (`build`). The proxy is found through a `Source` (the server's catalog
//! and its proxycfg manager): this module reads no state itself.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use envoy_types::pb::envoy::config::core::v3::Node;
use tokio::sync::{mpsc, oneshot, watch};
use tonic::{Status, Streaming};

use super::resources::{LISTENER, Resources};
use crate::proxycfg::{Hidden, ProxyKey, Proxyless, Reader, Snapshot};

/// Where streams find their proxies.
pub trait Source: Send + Sync + 'static {
    /// The proxy a stream's node names: its service ID, and its node's
    /// name when the proxy said (`None`: any node with that service ID).
    fn locate(&self, service_id: &str, node: Option<&str>) -> Option<ProxyKey>;
    /// The proxy's snapshot and its rebuilds.
    fn snapshot(&self, key: &ProxyKey) -> Option<watch::Receiver<Option<Arc<Snapshot>>>>;
    /// Who the stream's token (gRPC metadata `x-consul-token`) is, checked
    /// as the stream opens, before it takes a slot: a secret that names no
    /// token is refused (PERMISSION_DENIED).
    fn identify(&self, token: Option<&str>) -> Result<Caller, Status>;
    /// May the token receive the config of proxy `proxy_id`, whose
    /// destination is `service` (`None`: no such proxy)? Consul asks
    /// `service:write` on it: the config carries the service's leaf key.
    /// An unknown proxy is refused as a forbidden one is, so a token learns
    /// nothing of proxies it may not watch; `Ok` for it means the caller
    /// may hear NOT_FOUND.
    fn authorize(
        &self, token: Option<&str>, proxy_id: &str, service: Option<&str>,
    ) -> Result<(), Status>;
    /// Moves whenever a token, policy or role changes: a stream checks its
    /// token again then, and ends when it no longer passes.
    fn acl_changes(&self) -> watch::Receiver<u64>;
    /// When the token expires (its `ExpirationTime`; none: never), which
    /// changes no ACL: the stream checks it again then.
    fn expiry(&self, token: Option<&str>) -> Option<SystemTime>;
    /// A registered service instance that is no proxy (its key and its
    /// service's name): a proxyless gRPC client whose node id names it.
    fn locate_instance(&self, service_id: &str, node: Option<&str>) -> Option<(ProxyKey, String)>;
    /// Serves that client: its snapshot for the services it dials.
    fn proxyless(&self, instance: ProxyKey) -> crate::proxycfg::Proxyless;
    /// May the token read `service` (a proxyless client dials only those)?
    fn may_read(&self, token: Option<&str>, service: &str) -> bool;
    /// The token as the narrowing of its snapshot reads it (`None`: ACLs
    /// off, everything shown). A secret that no longer resolves reads
    /// nothing (the stream is refused on its next check anyway).
    fn reader(&self, token: Option<&str>) -> Option<Reader>;
}

/// What a stream's token is, for its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// A token that resolves (or any caller with ACLs off).
    Token,
    /// No token, or the anonymous one, with ACLs on.
    Anonymous,
}

/// The bounds of the streams of one server.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Streams with a token open at once (ACLs off: every stream); past it
    /// RESOURCE_EXHAUSTED.
    pub max_streams: usize,
    /// Streams without one open at once, capped apart: anonymous callers
    /// cannot take the slots proxies need.
    pub max_anonymous: usize,
    /// A stream that sent no first request within this is closed
    /// (DEADLINE_EXCEEDED), so idle streams hold no slot for long.
    pub first_request: Duration,
    /// Resource names one stream may subscribe to or say it holds, over
    /// all types; past it the stream ends (RESOURCE_EXHAUSTED).
    pub max_names: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_streams: 16_384,
            max_anonymous: 256,
            first_request: Duration::from_secs(10),
            max_names: 10_000,
        }
    }
}

/// The gRPC metadata a token travels in (Consul's).
pub const TOKEN_METADATA: &str = "x-consul-token";

/// The node's metadata key consul-dataplane names the proxy's node with.
const NODE_NAME_META: &str = "node_name";

/// A string in the node's metadata (`None`: absent or empty).
pub(super) fn node_meta(node: &Node, key: &str) -> Option<String> {
    node.metadata
        .as_ref()
        .and_then(|m| m.fields.get(key))
        .and_then(|v| match &v.kind {
            Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(s)) => Some(s.clone()),
            _ => None,
        })
        .filter(|s| !s.is_empty())
}

/// A stream's protocol, as its task drives it: the messages either way,
/// and the session, which holds what the client subscribed to and what it
/// was sent, and answers each request and each rebuild.
pub trait Protocol: Default + Send + 'static {
    type Request: Send + 'static;
    type Response: Send + 'static;
    /// What the stream's log lines begin with.
    const LOG: &'static str;
    /// gRPC's proxyless clients speak it (they speak only SotW): a node id
    /// may then name a registered service instance that is no proxy, and
    /// the token may come in the node's metadata.
    const PROXYLESS: bool;

    /// A new stream's session.
    fn new() -> Self {
        Self::default()
    }
    /// The node a request names (the first request must).
    fn node(req: &Self::Request) -> Option<&Node>;
    /// The resources now (after a snapshot rebuild).
    fn set_resources(&mut self, resources: Resources);
    /// Takes in one request, saying what of it the stream logs.
    fn hear(&mut self, req: &Self::Request) -> Heard;
    /// The names the client alone makes the stream keep, over all types
    /// (what a stream's bound counts).
    fn names(&self) -> usize;
    /// The names subscribed for one type (a proxyless client's listeners
    /// are the services it dials).
    fn subscribed(&self, type_url: &str) -> BTreeSet<String>;
    /// The next response to send, if one is due.
    fn next_push(&mut self) -> Option<Self::Response>;
    /// Logs a response going out (debug).
    fn log_push(proxy: &str, push: &Self::Response);
}

/// What of a request a stream logs.
#[derive(Debug, PartialEq)]
pub enum Heard {
    /// A first request, a subscription change or an ACK.
    Nothing,
    /// The client rejected the latest response of this type: it keeps its
    /// last accepted version.
    Nack { type_url: String, error: String },
    /// It answers an older response: ignored.
    Stale { type_url: String },
    /// A type this server does not serve.
    Unknown { type_url: String },
}

/// A stream past its first request.
pub(super) struct Opened<P: Protocol> {
    pub first: P::Request,
    /// The first request's node (its id is not empty).
    pub node: Node,
    pub inbound: Streaming<P::Request>,
}

/// Reads a stream's first request, within `limits.first_request`
/// (DEADLINE_EXCEEDED after, so idle streams hold no slot for long); its
/// node must name the proxy (INVALID_ARGUMENT). `None`: the client closed
/// the stream first.
pub(super) async fn open<P: Protocol>(
    limits: &Limits, mut inbound: Streaming<P::Request>,
) -> Result<Option<Opened<P>>, Status> {
    let first = tokio::time::timeout(limits.first_request, inbound.message())
        .await
        .map_err(|_| {
            Status::deadline_exceeded(format!(
                "no first request within {} s",
                limits.first_request.as_secs_f64()
            ))
        })?;
    let Some(first) = first? else {
        return Ok(None);
    };
    let node = P::node(&first).cloned().unwrap_or_default();
    if node.id.is_empty() {
        return Err(Status::invalid_argument(if P::PROXYLESS {
            "the first request's node.id must be the proxy's service ID (or, for a proxyless \
             gRPC client, a registered service instance's ID)"
        } else {
            "the first request's node.id must be the proxy's service ID"
        }));
    }
    Ok(Some(Opened {
        first,
        node,
        inbound,
    }))
}

/// Serves an opened stream with `token` until it ends: `Ok` when the
/// client went away, else the status it ends with.
pub(super) async fn serve<P: Protocol>(
    source: Arc<dyn Source>, limits: &Limits, token: Option<&str>, opened: Opened<P>,
    tx: &mpsc::Sender<Result<P::Response, Status>>,
) -> Result<(), Status> {
    let Opened {
        first,
        node,
        mut inbound,
    } = opened;
    let node_name = node_meta(&node, NODE_NAME_META);
    let id = node.id;
    // Watched before the first check, so a change after it is not missed.
    let mut acl = source.acl_changes();
    acl.borrow_and_update();
    let (mut target, mut rx) =
        Target::find(&*source, P::PROXYLESS, token, &id, node_name.as_deref()).await?;
    let mut current = rx.borrow_and_update().clone();
    source.authorize(token, &id, target.destination(&current))?;
    let mut expires = source.expiry(token);
    let mut session = P::new();
    // What of the current snapshot the token may not read, as served.
    let mut hidden = Hidden::default();
    if let Some(s) = &current {
        hidden = hidden_from(&*source, token, s);
        build(&mut session, s, &hidden, target.generate()).await?;
    }
    on_request(&id, &mut session, &first, limits)?;
    target.dial(&session, &*source, token);
    loop {
        if target.ready(&current) {
            while let Some(push) = session.next_push() {
                P::log_push(&id, &push);
                if tx.send(Ok(push)).await.is_err() {
                    return Ok(()); // the client went away
                }
            }
        }
        tokio::select! {
            msg = inbound.message() => match msg {
                Ok(Some(req)) => {
                    on_request(&id, &mut session, &req, limits)?;
                    target.dial(&session, &*source, token);
                }
                Ok(None) => return Ok(()),
                Err(status) => {
                    tracing::debug!(proxy = %id, %status, "{}: stream ended", P::LOG);
                    return Ok(());
                }
            },
            changed = rx.changed() => {
                if changed.is_err() {
                    return Err(gone(&id));
                }
                let next = rx.borrow_and_update().clone();
                match &next {
                    None => return Err(gone(&id)),
                    Some(s) if current.as_ref().is_some_and(|c| c.version == s.version) => {}
                    Some(s) => {
                        // A sidecar's destination may have changed with it.
                        source.authorize(token, &id, target.destination(&next))?;
                        hidden = hidden_from(&*source, token, s);
                        build(&mut session, s, &hidden, target.generate()).await?;
                    }
                }
                current = next;
            }
            changed = acl.changed() => {
                if changed.is_err() {
                    return Err(Status::unavailable("the server is stopping"));
                }
                acl.borrow_and_update();
                // A token deleted or narrowed gets nothing more: not the
                // next leaf key either.
                source.authorize(token, &id, target.destination(&current))?;
                expires = source.expiry(token);
                // A service no longer readable is no longer dialed.
                target.dial(&session, &*source, token);
                // Endpoints follow what the token may read now, both ways.
                if let Some(s) = &current {
                    let now = if cfg!(feature = "bug-xds-acl-unchanged") {
                        hidden.clone() // the planted bug: no narrowing again
                    } else {
                        hidden_from(&*source, token, s)
                    };
                    if now != hidden {
                        hidden = now;
                        build(&mut session, s, &hidden, target.generate()).await?;
                    }
                }
            }
            () = until(expires) => {
                // Expired: refused now (else its expiry was changed).
                source.authorize(token, &id, target.destination(&current))?;
                expires = source.expiry(token);
            }
        }
    }
}

/// Takes in one request; a stream subscribed to too many names ends.
fn on_request<P: Protocol>(
    id: &str, session: &mut P, req: &P::Request, limits: &Limits,
) -> Result<(), Status> {
    match session.hear(req) {
        Heard::Nack { type_url, error } => {
            crate::metrics::XDS_NACKS.inc();
            tracing::warn!(proxy = %id, %type_url, %error, "{}: the client rejected a push (NACK); it keeps its last accepted version", P::LOG);
        }
        Heard::Stale { type_url } => {
            tracing::debug!(proxy = %id, %type_url, "{}: a request for an older response, ignored", P::LOG);
        }
        Heard::Unknown { type_url } => {
            tracing::debug!(proxy = %id, %type_url, "{}: a type this server does not serve", P::LOG);
        }
        Heard::Nothing => {}
    }
    let names = session.names();
    if names > limits.max_names {
        return Err(Status::resource_exhausted(format!(
            "{names} resource names subscribed on one stream: at most {} are served",
            limits.max_names
        )));
    }
    Ok(())
}

/// What a stream serves: a proxy's snapshot (a sidecar's or a gateway's),
/// or a proxyless gRPC client's, with the service the client is (for its
/// authorization) and the services it dials: the listeners it asked for
/// that its token may read.
enum Target {
    Proxy,
    Proxyless {
        handle: Proxyless,
        service: String,
        dialed: BTreeSet<String>,
    },
}

type Snapshots = watch::Receiver<Option<Arc<Snapshot>>>;

impl Target {
    /// What the node id names, and its snapshots: a registered service
    /// instance that is no proxy (with `proxyless`), else a proxy, waited
    /// for a little. An unknown one is refused as a forbidden one would
    /// be, unless the token may know (NOT_FOUND).
    async fn find(
        source: &dyn Source, proxyless: bool, token: Option<&str>, id: &str, node: Option<&str>,
    ) -> Result<(Target, Snapshots), Status> {
        if proxyless && let Some((key, service)) = source.locate_instance(id, node) {
            source.authorize(token, id, Some(&service))?;
            let handle = source.proxyless(key);
            let rx = handle.snapshot();
            let target = Target::Proxyless {
                handle,
                service,
                dialed: BTreeSet::new(),
            };
            return Ok((target, rx));
        }
        if let Some(rx) = first_snapshot(source, id, node).await {
            return Ok((Target::Proxy, rx));
        }
        source.authorize(token, id, None)?;
        let what = if proxyless {
            "connect proxy or service instance with ID"
        } else {
            "connect proxy with service ID"
        };
        Err(Status::not_found(format!(
            "no {what} {id:?}{} is registered",
            node.map(|n| format!(" on node {n:?}")).unwrap_or_default()
        )))
    }

    /// The service the stream's config is for, which its token must
    /// `service:write`: a sidecar's destination (its leaf's), a gateway's
    /// own name, the service a proxyless client is.
    fn destination<'a>(&'a self, snap: &'a Option<Arc<Snapshot>>) -> Option<&'a str> {
        match self {
            Target::Proxy => snap.as_ref().map(|s| {
                if s.gateway.is_some() {
                    s.service.service.as_str()
                } else {
                    s.service.proxy.destination_service_name.as_str()
                }
            }),
            Target::Proxyless { service, .. } => Some(service),
        }
    }

    /// How its snapshot becomes resources.
    fn generate(&self) -> fn(&Snapshot) -> Resources {
        match self {
            Target::Proxy => super::generate::generate,
            Target::Proxyless { .. } => super::grpc::generate,
        }
    }

    /// A proxyless client dials the listeners it asked for that its token
    /// may read (again after each request and each ACL change).
    fn dial<P: Protocol>(&mut self, session: &P, source: &dyn Source, token: Option<&str>) {
        if let Target::Proxyless { handle, dialed, .. } = self {
            let want: BTreeSet<String> = session
                .subscribed(LISTENER)
                .into_iter()
                .filter(|name| source.may_read(token, name))
                .collect();
            if want != *dialed {
                handle.dial(want.clone());
                *dialed = want;
            }
        }
    }

    /// Whether the snapshot answers what the client asked for: a
    /// proxyless client's, once it was rebuilt for the services it dials
    /// (before, a listener it asked for would be missing from the
    /// response, which says it does not exist).
    fn ready(&self, current: &Option<Arc<Snapshot>>) -> bool {
        match self {
            Target::Proxy => true,
            Target::Proxyless { dialed, .. } => current
                .as_ref()
                .is_some_and(|s| s.upstreams.keys().eq(dialed.iter())),
        }
    }
}

/// Resource builds waiting, and whether the builder runs. A change every
/// proxy sees (a `proxy-defaults` write) makes thousands of streams
/// rebuild together; on the async workers they would queue every HTTP
/// request behind them (KV writes' p99 rose past 300 ms with 10,000
/// streams). One builder on a blocking thread takes them in turn, as many
/// as are waiting each time it wakes (one thread hand-off per batch, not
/// per stream), and leaves the rest of the server the other cores.
///
/// Its results are paced: each wakes a stream task, which then diffs the
/// resources and encodes its pushes on the async workers. Handed out as
/// fast as they are built, thousands of woken streams would queue ahead of
/// every HTTP request and Raft step (KV writes' p99 went from 20 ms to
/// 72–184 ms with 10,000 streams), so at most `WOKEN` results are out
/// whose stream has not yet taken them in (`Delivered`); the builder waits
/// for the async side to catch up before handing out more.
struct Builds {
    waiting: Vec<Build>,
    running: bool,
    /// Results handed to streams and not yet taken in (or dropped).
    woken: usize,
}

/// What of `snap` the stream's token may not read.
fn hidden_from(source: &dyn Source, token: Option<&str>, snap: &Snapshot) -> Hidden {
    crate::proxycfg::hidden(snap, source.reader(token).as_ref())
}

type Build = (
    Arc<Snapshot>,
    Hidden,
    fn(&Snapshot) -> Resources,
    oneshot::Sender<(Resources, Delivered)>,
);

static BUILDS: parking_lot::Mutex<Builds> = parking_lot::const_mutex(Builds {
    waiting: Vec::new(),
    running: false,
    woken: 0,
});

/// Signalled when a stream takes in its result (`woken` went down).
static TAKEN: parking_lot::Condvar = parking_lot::Condvar::new();

/// Results out at once whose streams have not run yet. Small: each is a
/// stream's diff and pushes queued on the async workers ahead of whatever
/// else they serve; large enough that the builder rarely waits idle.
const WOKEN: usize = 32;

/// One result out: counted in `woken` until the stream has taken it in,
/// or until it is dropped unread (a stream that ended meanwhile).
struct Delivered(());

impl Delivered {
    /// Waits until fewer than `WOKEN` are out, then counts one more.
    fn next() -> Delivered {
        let mut builds = BUILDS.lock();
        while builds.woken >= WOKEN {
            TAKEN.wait(&mut builds);
        }
        builds.woken += 1;
        Delivered(())
    }
}

impl Drop for Delivered {
    fn drop(&mut self) {
        BUILDS.lock().woken -= 1;
        TAKEN.notify_one();
    }
}

/// A snapshot's resources by `generate`, less what `hidden` names, built
/// off the async workers (the narrowed copy too: only a stream whose token
/// is short of something pays for one), and taken in by `session` (within
/// the builder's pacing). A build that panics (a bug on some input) ends
/// its stream only.
async fn build<P: Protocol>(
    session: &mut P, snapshot: &Arc<Snapshot>, hidden: &Hidden,
    generate: fn(&Snapshot) -> Resources,
) -> Result<(), Status> {
    if tokio::runtime::Handle::current().runtime_flavor()
        == tokio::runtime::RuntimeFlavor::CurrentThread
    {
        // A runtime of one thread (the simulation's hosts): built in place,
        // as `tasks::off_workers` runs such work there, so that a seed
        // replays the same; the builder's pacing has no workers to pace.
        let (snapshot, hidden) = (snapshot.clone(), hidden.clone());
        let resources = crate::tasks::off_workers(move || generated(&snapshot, &hidden, generate))
            .await
            .map_err(|_| Status::internal("building this proxy's resources failed"))?;
        session.set_resources(resources);
        return Ok(());
    }
    let (tx, rx) = oneshot::channel();
    let start = {
        let mut builds = BUILDS.lock();
        builds
            .waiting
            .push((snapshot.clone(), hidden.clone(), generate, tx));
        !std::mem::replace(&mut builds.running, true)
    };
    if start {
        tokio::task::spawn_blocking(run_builds);
    }
    let (resources, delivered) = rx
        .await
        .map_err(|_| Status::internal("building this proxy's resources failed"))?;
    session.set_resources(resources);
    drop(delivered);
    Ok(())
}

/// The builder: every waiting build, until none is left.
fn run_builds() {
    loop {
        let batch = {
            let mut builds = BUILDS.lock();
            if builds.waiting.is_empty() {
                builds.running = false;
                return;
            }
            std::mem::take(&mut builds.waiting)
        };
        for (snapshot, hidden, generate, tx) in batch {
            if tx.is_closed() {
                continue; // the stream ended: nobody to build for
            }
            let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                generated(&snapshot, &hidden, generate)
            }));
            match built {
                Ok(r) => {
                    // The stream may have ended meanwhile: then its
                    // `Delivered` is dropped here, unread.
                    let _ = tx.send((r, Delivered::next()));
                }
                Err(_) => tracing::error!(
                    proxy = %snapshot.service.id,
                    "xds: building this proxy's resources panicked; its stream ends"
                ),
            }
        }
    }
}

/// The snapshot's resources, less what `hidden` names.
fn generated(
    snapshot: &Snapshot, hidden: &Hidden, generate: fn(&Snapshot) -> Resources,
) -> Resources {
    if hidden.is_empty() {
        generate(snapshot)
    } else {
        generate(&snapshot.without(hidden))
    }
}

/// How long a stream waits for its proxy's first snapshot (a proxy
/// registered a moment ago) before ending with NOT_FOUND.
const FIRST_SNAPSHOT: Duration = Duration::from_secs(2);

/// The proxy's snapshot, waiting a little for one registered a moment ago
/// (`None`: no such proxy).
async fn first_snapshot(
    source: &dyn Source, service_id: &str, node: Option<&str>,
) -> Option<Snapshots> {
    let until = tokio::time::Instant::now() + FIRST_SNAPSHOT;
    loop {
        if let Some(key) = source.locate(service_id, node)
            && let Some(rx) = source.snapshot(&key)
            && rx.borrow().is_some()
        {
            return Some(rx);
        }
        if tokio::time::Instant::now() >= until {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Returns at `at` (a moment after, so the token is past it), never for
/// `None`.
async fn until(at: Option<SystemTime>) {
    match at {
        Some(at) => {
            let left = at
                .duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO);
            tokio::time::sleep(left + Duration::from_millis(10)).await;
        }
        None => std::future::pending().await,
    }
}

fn gone(proxy: &str) -> Status {
    Status::not_found(format!("proxy {proxy:?} was deregistered"))
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::xds::resources::every_type;

    fn snapshot() -> Arc<Snapshot> {
        Arc::new(Snapshot {
            version: 1,
            ..Snapshot::bare(
                serde_json::Value::Null,
                1,
                crate::structs::NodeService::default(),
                Default::default(),
            )
        })
    }

    /// While the async workers are busy (here: the only one, blocked), the
    /// builder hands out at most `WOKEN` results to streams that have not
    /// taken them in, however many builds wait; once the workers run again
    /// every stream gets its resources. (Handed out unpaced, all 8 × WOKEN
    /// were out at once.)
    #[test]
    fn finished_builds_wake_no_more_streams_than_the_workers_take_in() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let n = 8 * WOKEN;
        let streams: Vec<_> = (0..n)
            .map(|_| {
                rt.spawn(async {
                    let mut session = super::super::delta::Session::default();
                    build(&mut session, &snapshot(), &Hidden::default(), |_| {
                        every_type()
                    })
                    .await
                })
            })
            .collect();
        // Spawned after the streams (one queue, in order): it runs once
        // each has asked for its build, and holds the only worker.
        let most_out = rt.block_on(rt.spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(1);
            let mut most = 0;
            while Instant::now() < deadline && most < n {
                most = most.max(BUILDS.lock().woken);
                std::thread::sleep(Duration::from_millis(1));
            }
            most
        }));
        let most_out = most_out.unwrap();
        assert!(most_out > 0, "the builder ran");
        assert!(most_out <= WOKEN, "{most_out} results out at once");
        for s in streams {
            rt.block_on(s)
                .unwrap()
                .expect("every stream gets its resources");
        }
    }
}
