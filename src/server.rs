//! Wires a server together: sled, the Raft log and state machine, the
//! transport, cluster formation and the HTTP API.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use openraft::error::{ClientWriteError, RaftError};

use crate::error::{Error, Result};
use crate::raft::cluster::Cluster;
use crate::raft::log_store::LogStore;
use crate::raft::network::{self, Network};
use crate::raft::state_machine::StateMachine;
use crate::raft::{Raft, ServerNode, raft_config};
use crate::state::{Command, Response, SledBackend, Store};
use crate::stream::Publisher;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub node: String,
    pub datacenter: String,
    pub data_dir: PathBuf,
    pub http_addr: SocketAddr,
    pub raft_addr: SocketAddr,
    pub bootstrap_expect: usize,
    pub join: Vec<String>,
    /// Take a snapshot (and compact the log) after this many entries.
    pub snapshot_threshold: u64,
}

pub struct Server {
    pub config: ServerConfig,
    pub raft: Raft,
    pub store: Arc<Store>,
    pub publisher: Arc<Publisher>,
    pub cluster: Arc<Cluster>,
    pub proxycfg: crate::proxycfg::Manager,
    pub http: reqwest::Client,
    db: sled::Db,
}

/// How long a write waits for a leader before answering `No cluster leader`.
pub const LEADER_HOLD: Duration = Duration::from_secs(7);

fn node_id(db: &sled::Db) -> anyhow::Result<u64> {
    let tree = db.open_tree("server")?;
    if let Some(v) = tree.get("node_id")? {
        let mut b = [0u8; 8];
        b.copy_from_slice(&v);
        return Ok(u64::from_be_bytes(b));
    }
    // Random, kept forever: a server replaced on a fresh data dir is a new server.
    let id = rand::random::<u64>() >> 1;
    tree.insert("node_id", &id.to_be_bytes())?;
    db.flush()?;
    Ok(id)
}

impl Server {
    /// Opens the data dir, starts Raft and its transport, and begins
    /// forming or rejoining the cluster.
    pub async fn start(config: ServerConfig) -> anyhow::Result<Arc<Server>> {
        std::fs::create_dir_all(&config.data_dir)?;
        let db = sled::Config::new()
            .path(config.data_dir.join("db"))
            .cache_capacity(256 << 20)
            .mode(sled::Mode::HighThroughput)
            .open()?;
        let id = node_id(&db)?;
        let log = LogStore::new(&db)?;
        let used = log.is_used();
        let store = Arc::new(Store::open(Box::new(SledBackend::new(&db)?))?);
        let publisher = Arc::new(Publisher::default());
        let sm = StateMachine::new(
            store.clone(),
            publisher.clone(),
            config.data_dir.join("snapshots"),
        )?;
        let raft = Raft::new(
            id,
            Arc::new(raft_config(config.snapshot_threshold).validate()?),
            Network,
            log,
            sm,
        )
        .await?;

        let me = ServerNode {
            name: config.node.clone(),
            raft_addr: config.raft_addr.to_string(),
            http_addr: config.http_addr.to_string(),
        };
        let cluster = Arc::new(Cluster::new(
            id,
            me,
            raft.clone(),
            store.clone(),
            config.bootstrap_expect,
            config.join.clone(),
        ));
        let listener = tokio::net::TcpListener::bind(config.raft_addr)
            .await
            .with_context(|| format!("cannot listen on --raft-addr {}", config.raft_addr))?;
        tokio::spawn(network::serve(listener, raft.clone(), cluster.clone()));
        tokio::spawn(cluster.clone().form(used));
        tokio::spawn(cluster.clone().lead());
        tracing::info!(node = %config.node, id, raft = %config.raft_addr, "server started");

        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            .timeout(Duration::from_secs(660))
            .build()?;
        let proxycfg =
            crate::proxycfg::Manager::start(store.clone(), &publisher, &config.datacenter);
        Ok(Arc::new(Server {
            proxycfg,
            config,
            raft,
            store,
            publisher,
            cluster,
            http,
            db,
        }))
    }

    /// Commits a command through Raft and returns what the state machine
    /// answered. Only the leader can; waits up to `LEADER_HOLD` for one.
    pub async fn write(&self, cmd: Command) -> Result<Response> {
        let deadline = tokio::time::Instant::now() + LEADER_HOLD;
        loop {
            // A leader cut off from its quorum never commits: bound the wait.
            // The entry may still commit later, as in Consul.
            let attempt = tokio::time::timeout_at(deadline, self.raft.client_write(cmd.clone()));
            match attempt.await {
                Err(_) => return Err(Error::NoLeader),
                Ok(Ok(r)) => return Ok(r.data),
                Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                    if f.leader_id.is_some() && f.leader_id != Some(self.cluster.id) {
                        return Err(Error::LeadershipLost);
                    }
                }
                Ok(Err(e)) => return Err(Error::Internal(e.to_string())),
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::NoLeader);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until this server knows a leader, up to `LEADER_HOLD`.
    pub async fn await_leader(&self) -> Result<(u64, ServerNode)> {
        let deadline = tokio::time::Instant::now() + LEADER_HOLD;
        let mut metrics = self.raft.metrics();
        loop {
            if let Some(l) = self.cluster.leader() {
                return Ok(l);
            }
            if tokio::time::timeout_at(deadline, metrics.changed())
                .await
                .is_err()
            {
                return Err(Error::NoLeader);
            }
        }
    }

    /// Confirms leadership with a quorum and waits for this server to apply
    /// everything committed before (`?consistent`).
    pub async fn linearize(&self) -> Result<()> {
        match tokio::time::timeout(LEADER_HOLD, self.raft.ensure_linearizable()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(Error::LeadershipLost),
            Err(_) => Err(Error::NoLeader),
        }
    }

    /// Stops Raft and flushes sled.
    pub async fn shutdown(&self) {
        let _ = self.raft.shutdown().await;
        let _ = self.db.flush_async().await;
        tracing::info!("server stopped");
    }
}

/// Runs a server until SIGINT or SIGTERM.
pub async fn run(config: ServerConfig) -> anyhow::Result<()> {
    let server = Server::start(config.clone()).await?;
    let app = crate::http::router(server.clone());
    let listener = tokio::net::TcpListener::bind(config.http_addr)
        .await
        .with_context(|| format!("cannot listen on --http-addr {}", config.http_addr))?;
    tracing::info!(addr = %config.http_addr, "HTTP API listening");
    let stop = Arc::new(tokio::sync::Notify::new());
    let serve = axum::serve(listener, app).with_graceful_shutdown({
        let stop = stop.clone();
        async move { stop.notified().await }
    });
    tokio::select! {
        r = serve => r?,
        _ = shutdown_signal() => {
            // Blocking queries may wait minutes: give requests in flight a
            // moment to finish, then stop regardless.
            stop.notify_one();
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    server.shutdown().await;
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("signal handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
}
