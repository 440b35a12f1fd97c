//! The agent: `cairn agent` (the agentful path), and the agent every
//! server runs for its own node ([`embedded`]).
//!
//! An agent owns one node of the catalog. Its services and checks are
//! registered with it (HTTP API or `--config-dir`), kept in its data dir,
//! run by it, and pushed to the servers by anti-entropy; the agent's view
//! wins over the catalog's. Other `/v1/` requests are forwarded to a server,
//! so Consul clients can talk to the agent as they would to Consul's.
//!
//! Modules:
//!
//! | file | job |
//! | --- | --- |
//! | `local.rs` | the local state and what of it is in sync (pure) |
//! | `define.rs` | service and check definitions (API bodies, config files) |
//! | `parse.rs` | one service or check definition read into `ServiceDef` / `SidecarDef`, validated |
//! | `sidecar.rs` | `Connect.SidecarService` expanded into a second service |
//! | `spec.rs` | what a check is (probe, interval, timeout, thresholds), read from its definition |
//! | `checks.rs` | the runners of TTL, HTTP, TCP and script checks |
//! | `sync.rs` | anti-entropy: reconcile with the catalog, push, periodic full sync |
//! | `central.rs` | central config watched on the servers and merged into proxies |
//! | `liveness.rs` | heartbeats, and the servers' side: leases and the reaper |
//! | `servers.rs` | the HTTP client to the servers (failover, errors, counters) |
//! | `persist.rs` | the data dir |
//! | `maintenance.rs` | maintenance mode (critical checks nothing runs) |
//! | `api.rs` | the agent's HTTP API, and forwarding the rest |
//! | `dns.rs` | a client agent's DNS answers, read from a server |
//! | `events.rs` | user events: the servers' ring followed, this agent's own ring, `/v1/event/list` |
//! | `health_view.rs` | the streaming backend: blocking health reads from views fed by the servers' event stream |
//! | `acl.rs` | a client agent's token checks, answers kept 30 s |
//! | `ops.rs` | `/v1/agent/host`, `reload`, `monitor`, `token/:kind`, `join` |
//! | `host.rs` | the host facts, from `/proc` and `statvfs` |
//! | `connect.rs` | a client agent's leaves, signed by a server |
//!
//! Inside the room the files import downward too: `spec` ← `parse` ←
//! `sidecar` ← `define`, and `local` ← `checks`.
//!
//! What the files do beyond their own docs:
//!
//! - `local` picks sidecar ports and knows who is due for
//!   `DeregisterCriticalServiceAfter`.
//! - `spec`'s `ScriptChecks` says where script checks may come from: the
//!   API only with `enable_script_checks`, the files with either key. It
//!   is checked on every registration, at start and reload, and for checks
//!   restored from the data dir. `checks` runs a script with no shell,
//!   stdin closed, stdout and stderr read to their end and kept to 4 KiB,
//!   killed past its timeout (30 s by default).
//! - `liveness`: a client agent times each heartbeat and moves its
//!   coordinate by the RTT to the server whose coordinate the reply
//!   carries, sending it with `PUT /v1/coordinate/update` at most every
//!   10 s. `api` names the agent's node for `?near=_agent` before
//!   forwarding.
//! - `servers`: forwards are bounded as the servers' are
//!   (`request::forward_timeout`).
//! - `ops`: the tokens of `token/:kind` are kept in memory;
//!   `agent_recovery` answers this agent's own endpoints with no server to
//!   ask.
//! - `events`: the ring is followed with `?after=` the newest time the
//!   agent has, so a fire sends it only what is new. The follower and a
//!   non-blocking list's own read of the ring keep each event once, by
//!   `LTime`. A list blocks while Consul's index (from the last event's
//!   ID) equals `?index`.
//! - `connect`: leaves are signed through `connect::SIGN_PATH`, blocking on
//!   the servers' roots.

mod acl;
pub mod api;
mod central;
pub mod checks;
mod connect;
mod define;
mod dns;
pub mod events;
mod health_view;
mod host;
pub mod liveness;
pub mod local;
mod maintenance;
mod ops;
mod parse;
mod persist;
mod servers;
mod sidecar;
pub mod spec;
pub mod sync;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use tracing::Instrument;

pub use define::config_files;
pub use maintenance::MaintenanceError;
pub use servers::ServerError;

use crate::error::{Error, Result};
use local::{Local, NodeInfo, Source, Tables};
use parse::ServiceDef;
use servers::Servers;

/// How `cairn agent` was started.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub node: String,
    pub data_dir: PathBuf,
    pub http_addr: SocketAddr,
    /// Its catalog address (`--advertise`); none: the HTTP address's.
    pub advertise: Option<std::net::IpAddr>,
    /// Server base URLs (`http://host:port` or `https://host:port`).
    pub servers: Vec<String>,
    /// Its configuration files: their service and check definitions are
    /// registered at start and on `PUT /v1/agent/reload`.
    pub config_sources: crate::config_file::Sources,
    /// The full-sync period before scaling by cluster size.
    pub sync_interval: Duration,
    /// The datacenter until the servers say otherwise.
    pub datacenter: String,
    /// The primary datacenter until the servers say otherwise (empty: the
    /// agent's own).
    pub primary_datacenter: String,
    /// Runs inside a server, for the server's own node: `servers` is that
    /// server's own HTTP address.
    pub in_server: bool,
    /// The ports this node serves besides HTTP, for `/v1/agent/self`
    /// (bound before the agent starts).
    pub ports: Ports,
    /// HTTPS to servers and on its own listener (none: plain HTTP).
    pub tls: Option<Arc<AgentTls>>,
    /// Its ACL tokens (`--acl-token`, `--acl-agent-token`).
    pub tokens: crate::structs::acl::AgentTokens,
    /// The cap its hash-blocking reads wait within (a server's own agent
    /// shares the server's).
    pub blocking: crate::request::serve::Blocking,
    /// The web UI it serves (`--ui`, `--ui-dir`; a server's own agent
    /// serves none: the server does).
    pub ui: crate::request::ui::UiConfig,
    /// Blocking health reads answered from views fed by the servers' event
    /// stream (`use_streaming_backend`), not forwarded one by one.
    pub streaming_backend: bool,
    /// Where script checks may come from (`enable_script_checks`,
    /// `enable_local_script_checks`).
    pub script_checks: spec::ScriptChecks,
}

/// Ports a node serves besides plain HTTP, as `/v1/agent/self`'s
/// `DebugConfig` reports them (none: -1, Consul's "disabled"). Clients read
/// them to find a service: `consul connect envoy` and Nomad the gRPC port
/// of xDS (a server's; a client agent serves none).
#[derive(Debug, Clone, Copy, Default)]
pub struct Ports {
    pub dns: Option<u16>,
    pub https: Option<u16>,
    /// Plain gRPC.
    pub grpc: Option<u16>,
    /// gRPC over TLS (a server given the TLS files serves only this).
    pub grpc_tls: Option<u16>,
}

/// An agent's TLS.
#[derive(Debug)]
pub struct AgentTls {
    /// For `https://` servers: trusts the CA, presents the agent's
    /// certificate if it has one.
    pub client: rustls::ClientConfig,
    /// Its own HTTPS listener: address and config.
    pub https: Option<(SocketAddr, Arc<rustls::ServerConfig>)>,
    /// No plain HTTP listener (`--http-addr ""`; `http_addr` is then the
    /// HTTPS address).
    pub http_off: bool,
}

/// A running agent: shared by its tasks and HTTP handlers.
pub struct Agent {
    pub config: AgentConfig,
    pub local: Arc<Local>,
    servers: Servers,
    /// Tokens resolved through the servers for this agent's own endpoints.
    tokens: acl::Tokens,
    /// Leaf certificates made here (their keys never leave the agent).
    leaves: connect::AgentLeaves,
    node_id: String,
    /// Check id → (registration it runs, its task).
    runners: Mutex<HashMap<String, (u64, tokio::task::AbortHandle)>>,
    /// Serializes writes of the data dir (the last one holds the latest).
    persisting: tokio::sync::Mutex<()>,
    /// Live agents plus servers, as the last heartbeat said.
    cluster_size: AtomicUsize,
    /// Anti-entropy, heartbeats, the reaper, central config: the process
    /// stops if one dies.
    pub tasks: crate::tasks::Tasks,
    datacenter: RwLock<String>,
    primary_datacenter: RwLock<String>,
    /// `PUT /v1/agent/leave`: leave the cluster and stop.
    leave: tokio::sync::Notify,
    /// Held (shared) by each heartbeat and anti-entropy round while it
    /// talks to the servers; leaving takes it exclusively, so no request
    /// still in flight can register the node again after it left.
    talking: tokio::sync::RwLock<()>,
    /// Anti-entropy runs so far, and whether the last one succeeded (API
    /// writes wait on it: [`sync::pushed`]).
    sync_runs: tokio::sync::watch::Sender<(u64, bool)>,
    /// The user events received (`events`).
    events: events::Events,
    /// Views answering blocking health reads (`health_view`).
    health_views: health_view::HealthViews,
    /// Its node's network coordinate, moved by each heartbeat's RTT
    /// (`liveness`).
    coordinate: parking_lot::Mutex<crate::coordinate::Client>,
    /// Its ACL tokens as set now: the configuration's, replaced in memory
    /// by `PUT /v1/agent/token/:kind` (with the kinds cairn only keeps).
    acl_tokens: parking_lot::RwLock<(
        crate::structs::acl::AgentTokens,
        BTreeMap<&'static str, String>,
    )>,
}

impl Agent {
    pub fn cluster_size(&self) -> usize {
        self.cluster_size.load(Ordering::Relaxed).max(1)
    }

    pub fn datacenter(&self) -> String {
        self.datacenter
            .read()
            .map(|d| d.clone())
            .unwrap_or_default()
    }

    /// The federation's primary datacenter as the servers last said, else
    /// its own (a server's agent: its server's `--primary-datacenter`).
    pub fn primary_datacenter(&self) -> String {
        self.primary_datacenter
            .read()
            .ok()
            .filter(|d| !d.is_empty())
            .map(|d| d.clone())
            .unwrap_or_else(|| self.datacenter())
    }

    /// The token of requests made or forwarded without one.
    pub fn default_token(&self) -> Option<String> {
        self.acl_tokens.read().0.default.clone()
    }

    /// The token its DNS answers with: the `dns` token, else the default.
    pub fn dns_token(&self) -> Option<String> {
        let t = self.acl_tokens.read();
        t.1.get("dns").cloned().or_else(|| t.0.default.clone())
    }

    /// The replication token set on this agent (a server's own agent:
    /// `PUT /v1/agent/token/replication` or `acl.tokens.replication`), which
    /// the server's replication from the primary sends.
    pub fn replication_token(&self) -> Option<String> {
        self.acl_tokens.read().1.get("replication").cloned()
    }

    /// Whether `token` is the agent recovery token set on this agent.
    fn is_recovery_token(&self, token: &str) -> bool {
        !token.is_empty()
            && self
                .acl_tokens
                .read()
                .1
                .get("agent_recovery")
                .map(String::as_str)
                == Some(token)
    }

    /// Sets one of the agent's tokens (a kind `ops::token_kind` knows).
    fn set_token(&self, kind: &'static str, token: Option<String>) {
        let mut t = self.acl_tokens.write();
        match kind {
            "default" => t.0.default = token,
            "agent" => t.0.agent = token,
            other => match token {
                Some(v) => {
                    t.1.insert(other, v);
                }
                None => {
                    t.1.remove(other);
                }
            },
        }
        self.servers.set_own_token(t.0.own().map(String::from));
    }

    /// `PUT /v1/agent/reload`: the configuration files read again. Their
    /// services and checks are registered anew where they changed, those
    /// no longer there removed; what the API registered stays. A file
    /// that does not read changes nothing.
    async fn reload(self: &Arc<Self>) -> Result<()> {
        let (sources, node) = (self.config.config_sources.clone(), self.config.node.clone());
        let defs = tokio::task::spawn_blocking(move || define::config_files(&sources, &node))
            .await
            .map_err(|e| Error::Internal(e.to_string()))?
            .map_err(|e| Error::Internal(format!("Failed to reload configs: {e:#}")))?;
        self.config
            .script_checks
            .permit(false, defs.specs())
            .map_err(|e| Error::Internal(format!("Failed to reload configs: {e}")))?;
        let now = Instant::now();
        let (added, removed) = self.local.with(|t| {
            let mut wanted: std::collections::HashSet<String> = std::collections::HashSet::new();
            for d in &defs.services {
                wanted.insert(d.service.id.clone());
                if let Some(sc) = &d.sidecar {
                    wanted.insert(sc.service.id.clone());
                }
            }
            let gone: Vec<String> = t
                .live_services()
                .filter(|s| s.source == Source::Config && !wanted.contains(&s.registered.id))
                .map(|s| s.registered.id.clone())
                .collect();
            for id in &gone {
                t.remove_service(id);
            }
            let checks: std::collections::HashSet<String> = defs
                .checks
                .iter()
                .map(|(c, _)| c.check_id.clone())
                .collect();
            let gone_checks: Vec<String> = t
                .live_checks()
                .filter(|c| c.source == Source::Config && c.check.service_id.is_empty())
                .filter(|c| !checks.contains(&c.check.check_id))
                .map(|c| c.check.check_id.clone())
                .collect();
            for id in &gone_checks {
                t.remove_check(id);
            }
            let mut added = 0;
            for def in defs.services {
                // Unchanged: left as it runs (its checks keep their status).
                let same = t
                    .live_service(&def.service.id)
                    .is_some_and(|s| s.source == Source::Config && s.registered == def.service);
                if !same {
                    t.put_definition(def, Source::Config, true, now, None)?;
                    added += 1;
                }
            }
            for (c, spec) in defs.checks {
                if t.live_check(&c.check_id)
                    .is_none_or(|l| l.source != Source::Config)
                {
                    t.put_check(c, spec, Source::Config, now);
                }
            }
            Ok::<_, Error>((added, gone.len()))
        })?;
        tracing::info!(added, removed, "configuration reloaded");
        self.sync_runners();
        sync::pushed(self).await;
        Ok(())
    }

    /// Records what a heartbeat told about the cluster.
    fn learn(&self, members: usize, dc: &str, primary: &str) {
        self.cluster_size.store(members, Ordering::Relaxed);
        for (known, told) in [(&self.datacenter, dc), (&self.primary_datacenter, primary)] {
            if !told.is_empty()
                && let Ok(mut d) = known.write()
                && *d != told
            {
                *d = told.to_string();
            }
        }
    }

    /// Writes the API-registered services and checks to the data dir.
    async fn persist(&self) -> Result<()> {
        let _one_at_a_time = self.persisting.lock().await;
        let state = self.local.with(|t| persist::Persisted {
            node_id: self.node_id.clone(),
            services: t
                .live_services()
                .filter(|s| s.source == Source::Api)
                .map(|s| s.registered.clone())
                .collect(),
            checks: t
                .live_checks()
                .filter(|c| c.source == Source::Api)
                .map(|c| c.check.clone())
                .collect(),
            sidecars: t
                .live_services()
                .filter_map(|s| {
                    let record = persist::SidecarRecord {
                        parent: s.sidecar_of.clone()?,
                        port: u16::try_from(s.registered.port).unwrap_or(0),
                    };
                    Some((s.registered.id.clone(), record))
                })
                .collect(),
        });
        let dir = self.config.data_dir.clone();
        tokio::task::spawn_blocking(move || persist::save(&dir, &state))
            .await
            .map_err(|e| Error::Internal(e.to_string()))?
            .map_err(|e| {
                tracing::error!(error = %e, "cannot write the agent's data dir");
                Error::Internal(format!("cannot persist agent state: {e}"))
            })
    }

    /// Starts runners for new or re-registered checks, stops those of
    /// checks that are gone.
    fn sync_runners(self: &Arc<Self>) {
        let wanted: BTreeMap<String, (u64, spec::CheckSpec)> = self.local.with(|t| {
            t.live_checks()
                .filter_map(|c| Some((c.check.check_id.clone(), (c.run_id, c.spec.clone()?))))
                .filter(|(_, (_, spec))| spec.has_runner())
                .collect()
        });
        let mut runners = self.runners.lock().unwrap_or_else(|p| p.into_inner());
        runners.retain(|id, (run, task)| {
            let keep = wanted.get(id).is_some_and(|(r, _)| r == run);
            if !keep {
                task.abort();
            }
            keep
        });
        for (id, (run, spec)) in wanted {
            if runners.contains_key(&id) {
                continue;
            }
            let span = tracing::debug_span!("check", id = %id);
            let task = tokio::spawn(
                checks::run(
                    self.local.clone(),
                    self.servers.http.clone(),
                    id.clone(),
                    spec,
                )
                .instrument(span),
            );
            runners.insert(id, (run, task.abort_handle()));
        }
    }

    /// Adds (or replaces) a service with its checks and its sidecar.
    async fn register_service(
        self: &Arc<Self>, def: ServiceDef, source: Source, replace_checks: bool,
    ) -> Result<()> {
        let id = def.service.id.clone();
        let sidecar = def.sidecar.as_ref().map(|s| s.service.id.clone());
        self.config
            .script_checks
            .permit(source == Source::Api, def.specs())
            .map_err(Error::BadRequest)?;
        self.local
            .with(|t| t.put_definition(def, source, replace_checks, Instant::now(), None))?;
        tracing::info!(service = %id, sidecar = ?sidecar, "service registered");
        self.sync_runners();
        self.persist().await
    }

    async fn deregister_service(self: &Arc<Self>, id: &str) -> Result<()> {
        if !self.local.with(|t| t.remove_service(id)) {
            return Err(Error::NotFound(format!(
                "Unknown service ID {id:?}. Ensure that the service ID is passed, not the service name."
            )));
        }
        tracing::info!(service = %id, "service deregistered");
        self.sync_runners();
        self.persist().await
    }

    async fn register_check(
        self: &Arc<Self>, (check, spec): (crate::structs::HealthCheck, spec::CheckSpec),
        source: Source,
    ) -> Result<()> {
        let sid = check.service_id.clone();
        self.config
            .script_checks
            .permit(source == Source::Api, std::iter::once(&spec))
            .map_err(Error::BadRequest)?;
        let added = self.local.with(|t| {
            if !sid.is_empty() && t.live_service(&sid).is_none() {
                return false;
            }
            t.put_check(check, spec, source, Instant::now());
            true
        });
        if !added {
            // Consul's 404: the check is fine, its service is not there.
            return Err(Error::NotFound(format!("ServiceID {sid:?} does not exist")));
        }
        self.sync_runners();
        self.persist().await
    }

    async fn deregister_check(self: &Arc<Self>, id: &str) -> Result<()> {
        if !self.local.with(|t| t.remove_check(id)) {
            return Err(Error::NotFound(format!("Unknown check ID {id:?}")));
        }
        self.sync_runners();
        self.persist().await
    }

    /// `/v1/agent/check/pass|warn|fail|update`: sets a TTL check's status
    /// and renews its TTL.
    async fn update_ttl(
        self: &Arc<Self>, id: &str, status: crate::structs::HealthStatus, output: &str,
    ) -> Result<()> {
        let reset = self.local.with(|t| {
            let c = t
                .live_check(id)
                .ok_or_else(|| Error::NotFound(format!("Unknown check ID {id:?}")))?;
            if !c.spec.as_ref().is_some_and(|s| s.is_ttl()) {
                return Err(Error::bad(format!(
                    "CheckID {id:?} does not have associated TTL"
                )));
            }
            let reset = c.ttl_reset.clone();
            t.set_check_status(id, status, output, Instant::now());
            Ok(reset)
        })?;
        reset.notify_one();
        self.persist().await
    }
}

/// Deregisters services whose check stayed critical longer than its
/// `DeregisterCriticalServiceAfter` (Consul reaps every 30 s).
async fn reap_critical(a: Arc<Agent>) {
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let due = a
            .local
            .with(|t| local::due_for_deregistration(t, Instant::now()));
        for id in due {
            tracing::warn!(service = %id, "critical for too long: deregistering");
            if let Err(e) = a.deregister_service(&id).await {
                tracing::warn!(service = %id, error = %e, "could not deregister");
            }
        }
    }
}

/// The node as the agent registers it: addressed by `--advertise`, else
/// by its HTTP address (a wildcard address advertises loopback).
fn node_info(config: &AgentConfig, id: String) -> NodeInfo {
    let ip = match (config.advertise, config.http_addr.ip()) {
        (Some(ip), _) => ip.to_string(),
        (None, ip) if ip.is_unspecified() => "127.0.0.1".to_string(),
        (None, ip) => ip.to_string(),
    };
    let tagged = ["lan", "lan_ipv4", "wan", "wan_ipv4"]
        .iter()
        .map(|k| (k.to_string(), ip.clone()))
        .collect();
    NodeInfo {
        name: config.node.clone(),
        id,
        address: ip,
        tagged_addresses: tagged,
        meta: [(
            crate::structs::agent::AGENT_META.to_string(),
            config.http_addr.to_string(),
        )]
        .into_iter()
        .collect(),
    }
}

/// Loads the data dir and the config dir into a new agent.
async fn start(config: AgentConfig) -> anyhow::Result<Arc<Agent>> {
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("cannot create --data-dir {}", config.data_dir.display()))?;
    let saved = persist::load(&config.data_dir)?.unwrap_or_default();
    let node_id = if saved.node_id.is_empty() {
        uuid::Uuid::new_v4().to_string()
    } else {
        saved.node_id.clone()
    };
    let from_dir = define::config_files(&config.config_sources, &config.node)?;
    config
        .script_checks
        .permit(false, from_dir.specs())
        .map_err(|e| anyhow::anyhow!(e))?;
    let tables = Tables::new(node_info(&config, node_id.clone()));
    let agent = Arc::new(Agent {
        servers: Servers::new(
            config.servers.clone(),
            config.tls.as_ref().map(|t| t.client.clone()),
            config.tokens.own().map(String::from),
        )?,
        local: Arc::new(Local::new(tables)),
        tokens: acl::Tokens::at(&config.data_dir),
        leaves: Default::default(),
        node_id,
        runners: Mutex::new(HashMap::new()),
        tasks: Default::default(),
        persisting: tokio::sync::Mutex::new(()),
        cluster_size: AtomicUsize::new(1),
        datacenter: RwLock::new(config.datacenter.clone()),
        primary_datacenter: RwLock::new(config.primary_datacenter.clone()),
        leave: tokio::sync::Notify::new(),
        talking: tokio::sync::RwLock::new(()),
        sync_runs: tokio::sync::watch::Sender::new((0, true)),
        events: Default::default(),
        health_views: health_view::HealthViews::new(),
        coordinate: Default::default(),
        acl_tokens: parking_lot::RwLock::new((config.tokens.clone(), BTreeMap::new())),
        config,
    });
    let now = Instant::now();
    let restored = agent
        .local
        .with(|t| {
            for svc in saved.services {
                t.put_service(svc, Vec::new(), Source::Api, false, now);
            }
            for (id, r) in &saved.sidecars {
                t.set_sidecar_of(id, &r.parent);
            }
            let mut n = 0;
            for c in saved.checks {
                if !c.service_id.is_empty() && t.live_service(&c.service_id).is_none() {
                    continue;
                }
                // Stored checks were valid when registered; one that no longer
                // parses (older version) is dropped rather than fatal.
                // So is a script check the agent no longer allows.
                let allowed = |spec: spec::CheckSpec| {
                    let scripts = &agent.config.script_checks;
                    scripts.permit(true, std::iter::once(&spec)).map(|_| spec)
                };
                match maintenance::spec_of(&c)
                    .map(Ok)
                    .unwrap_or_else(|| spec::CheckSpec::parse(&c))
                    .and_then(allowed)
                {
                    Ok(spec) => {
                        t.put_check(c, spec, Source::Api, now);
                        n += 1;
                    }
                    Err(e) => tracing::warn!(error = %e, "stored check dropped"),
                }
            }
            for def in from_dir.services {
                // A config-dir sidecar gets the port it had before a restart.
                let hint = def
                    .sidecar
                    .as_ref()
                    .and_then(|s| saved.sidecars.get(&s.service.id))
                    .map(|r| r.port);
                t.put_definition(def, Source::Config, false, now, hint)?;
            }
            for (c, spec) in from_dir.checks {
                t.put_check(c, spec, Source::Config, now);
            }
            Ok::<_, Error>((t.services.len(), n))
        })
        .map_err(|e| anyhow::anyhow!("configuration: {e}"))?;
    tracing::info!(
        node = %agent.config.node,
        services = restored.0,
        checks = restored.1,
        "agent state loaded"
    );
    // The tokens the configuration files give beyond the flags' (the
    // files were read once already: they parse).
    if let Ok(file) = crate::config_file::FileConfig::load(&agent.config.config_sources) {
        for (kind, token) in file.tokens_other {
            if let Some(kind) = ops::token_kind(&kind) {
                agent.set_token(kind, Some(token));
            }
        }
    }
    agent.sync_runners();
    // Re-written so that the node id is kept even before any registration.
    agent.persist().await.map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(agent)
}

/// Starts an agent's background work: anti-entropy, heartbeats, the
/// critical-service reaper and central config.
fn spawn_tasks(agent: &Arc<Agent>) {
    let tasks = &agent.tasks;
    tasks.spawn("agent sync", sync::run(agent.clone()));
    tasks.spawn("agent heartbeats", liveness::heartbeat_loop(agent.clone()));
    tasks.spawn("agent critical reaper", reap_critical(agent.clone()));
    tasks.spawn("agent user events", events::follow(agent.clone()));
    central::spawn(agent);
}

/// The agent of a server's own node: the same agent as `cairn agent`,
/// whose server is the server it runs in (its HTTP API, over loopback, so
/// writes take the server's usual path to the leader). Its endpoints are
/// served by the server's router ([`api::server_routes`]); it never leaves
/// the cluster on shutdown, as a Consul server does not: its node and
/// services stay registered across a restart.
pub async fn embedded(config: AgentConfig) -> anyhow::Result<Arc<Agent>> {
    let agent = start(config).await?;
    spawn_tasks(&agent);
    Ok(agent)
}

/// Runs an agent until SIGINT or SIGTERM, then leaves the cluster; with
/// `dns`, answers DNS too (from a server's catalog).
pub async fn run(
    mut config: AgentConfig, dns: Option<crate::dns::DnsConfig>,
) -> anyhow::Result<()> {
    let tls = config.tls.clone();
    let http_off = tls.as_ref().is_some_and(|t| t.http_off);
    let listener = if http_off {
        None
    } else {
        Some(
            tokio::net::TcpListener::bind(config.http_addr)
                .await
                .with_context(|| format!("cannot listen on --http-addr {}", config.http_addr))?,
        )
    };
    let https = match tls.as_ref().and_then(|t| t.https.clone()) {
        Some((addr, tls)) => Some((
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on --https-addr {addr}"))?,
            tls,
        )),
        None => None,
    };
    if let Some((l, _)) = &https {
        config.ports.https = Some(l.local_addr()?.port());
    }
    let dns = match dns {
        Some(d) => {
            let l = crate::dns::bind(d.addr).await?;
            config.ports.dns = Some(l.addr.port());
            Some((l, d))
        }
        None => None,
    };
    let agent = start(config).await?;
    spawn_tasks(&agent);
    if let Some((l, d)) = dns {
        let catalog = Arc::new(dns::AgentCatalog(agent.clone()));
        tokio::spawn(crate::dns::serve(l, d, catalog));
    }
    tracing::info!(
        addr = %agent.config.http_addr,
        https = http_off || https.is_some(),
        node = %agent.config.node,
        servers = ?agent.config.servers,
        "agent HTTP API listening"
    );
    let app = api::router(agent.clone()).merge(crate::request::ui::routes(&agent.config.ui));
    // Not graceful: a forwarded blocking query may hold its connection for
    // minutes, and nothing an agent serves needs finishing.
    let plain = async {
        match listener {
            Some(l) => axum::serve(l, app.clone()).await,
            None => std::future::pending().await,
        }
    };
    let secure = async {
        match https {
            // Within the HTTP limits servers keep (the handshake included).
            Some((l, tls)) => {
                let stop = Arc::new(tokio::sync::Notify::new());
                crate::request::serve::serve_tls(l, app.clone(), Default::default(), stop, tls)
                    .await
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = plain => r?,
        _ = secure => {},
        ended = agent.tasks.failed() => {
            tracing::error!("{ended}: stopping");
            std::process::exit(crate::tasks::TASK_EXIT);
        }
        _ = crate::signal::shutdown() => liveness::leave_cluster(&agent).await,
        _ = agent.leave.notified() => liveness::leave_cluster(&agent).await,
    }
    tracing::info!("agent stopped");
    Ok(())
}

/// How long a watch of the servers waits after its `failures`-th failure
/// in a row: doubling from 1 s up to 30 s, with jitter so that agents do
/// not all ask again at once.
fn retry_wait(failures: u32) -> Duration {
    use rand::Rng;
    Duration::from_millis(500)
        .saturating_mul(1 << failures.min(6))
        .min(Duration::from_secs(30))
        .mul_f64(rand::thread_rng().gen_range(0.75..1.0))
}
