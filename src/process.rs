//! Where a process is assembled: a server from its `ServerConfig`, a
//! client agent from its `AgentConfig`, each with the listeners it serves
//! on handed in ([`Listeners`]; `Listeners::bind` binds the configured
//! addresses), so that tests and the simulation can pass their own.
//!
//! A server is its core (`Server::assemble`: Raft, transport, formation,
//! publisher, proxycfg) plus what [`start`] adds to every server, the
//! simulation's included: the leader module's watcher, which runs every
//! leader duty while this server leads. [`server`] then puts the HTTP(S)
//! API, DNS, the gRPC port and the server's own agent in front of it, and
//! [`ServerProcess::run`] runs it until a signal or a fault.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use openraft::storage::RaftLogStorage;
use tokio::net::TcpListener;

use crate::agent::{Agent, AgentConfig};
use crate::dns::DnsConfig;
use crate::grpc::{self, GrpcConfig};
use crate::raft::TypeConfig;
use crate::raft::network::Accept;
use crate::server::{Server, ServerConfig, ServerParts};

/// The sockets a server serves on. `raft` is required; the others are
/// served when present.
pub struct Listeners {
    pub raft: TcpListener,
    pub http: Option<TcpListener>,
    pub https: Option<TcpListener>,
    pub grpc: Option<TcpListener>,
    pub dns: Option<crate::dns::Listeners>,
}

impl Listeners {
    /// Binds what the configuration names: `--raft-addr`, `--http-addr`
    /// (unless HTTPS only), `--https-addr`, `--dns-addr`, `--grpc-addr`.
    pub async fn bind(
        config: &ServerConfig, dns: Option<&DnsConfig>, grpc: Option<&GrpcConfig>,
    ) -> anyhow::Result<Listeners> {
        let raft = TcpListener::bind(config.raft_addr)
            .await
            .with_context(|| format!("cannot listen on --raft-addr {}", config.raft_addr))?;
        let tls = config.tls.as_ref();
        let http =
            match tls {
                Some(t) if t.http_off => None,
                _ => Some(TcpListener::bind(config.http_addr).await.with_context(|| {
                    format!("cannot listen on --http-addr {}", config.http_addr)
                })?),
            };
        let https = match tls.and_then(|t| t.https_addr) {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen on --https-addr {addr}"))?,
            ),
            None => None,
        };
        let dns = match dns {
            Some(d) => Some(crate::dns::bind(d.addr).await?),
            None => None,
        };
        let grpc = match grpc {
            Some(g) => Some(grpc::bind(g.addr).await?),
            None => None,
        };
        Ok(Listeners {
            raft,
            http,
            https,
            grpc,
            dns,
        })
    }
}

/// A server core from its parts, with what every server runs besides:
/// the simulation's servers are built here, from in-memory parts.
pub async fn assemble<L, A>(
    config: ServerConfig, parts: ServerParts<L, A>,
) -> anyhow::Result<Arc<Server>>
where
    L: RaftLogStorage<TypeConfig>,
    A: Accept,
{
    let server = Server::assemble(config, parts).await?;
    start(&server, None);
    Ok(server)
}

/// A server assembled as by [`assemble`], with WAN federation and no
/// listener but the Raft port's: the simulation's federation scenario.
pub struct Federated {
    pub server: Arc<Server>,
    /// Its federation, greeting and replicating (the leader's duties have
    /// it) but not yet answering other datacenters: the caller serves it
    /// (`Federation::serve`) with `answer` or a handler around it.
    pub federation: Arc<crate::federation::Federation>,
    /// Answers a request from another datacenter as [`server`]'s
    /// federation does: the HTTP router, in process.
    pub answer: crate::federation::Handler,
}

/// [`assemble`] with WAN federation (`--datacenter`, `--primary-datacenter`,
/// `--join-wan` of `config`): the leader duties get the `Federation`, and
/// requests are answered by the HTTP router in process, as in [`server`].
pub async fn assemble_federated<L, A>(
    config: ServerConfig, parts: ServerParts<L, A>,
) -> anyhow::Result<Federated>
where
    L: RaftLogStorage<TypeConfig>,
    A: Accept,
{
    let server = Server::assemble(config, parts).await?;
    let federation = crate::federation::Federation::new(server.clone());
    start(&server, Some(federation.clone()));
    let app = crate::http::router(server.clone()).layer(axum::Extension(federation.clone()));
    Ok(Federated {
        server,
        federation,
        answer: wan_handler(app),
    })
}

/// The configuration's addresses made those of the listeners handed in (a
/// test's port 0 becomes the port it got): peers, the server's own agent
/// and its answers name what is actually served.
fn bound_addresses(config: &mut ServerConfig, l: &Listeners) -> std::io::Result<()> {
    config.raft_addr = l.raft.local_addr()?;
    // Without plain HTTP, `http_addr` is the HTTPS address.
    let http_off = config.tls.as_ref().is_some_and(|t| t.http_off);
    match (&l.http, &l.https) {
        (Some(h), _) if !http_off => config.http_addr = h.local_addr()?,
        (_, Some(s)) if http_off => config.http_addr = s.local_addr()?,
        _ => {}
    }
    Ok(())
}

/// What every server runs on top of its core: the endpoint calls other
/// servers forward to it, the leader module's watcher
/// (every leader duty, while this server leads), with the WAN federation
/// its federation duties use (none in the simulation).
fn start(server: &Arc<Server>, federation: Option<Arc<crate::federation::Federation>>) {
    // The calls its datacenter's other servers forward to it as leader.
    crate::endpoint::serve(server, federation.clone());
    server.tasks().spawn(
        "leader duties",
        crate::leader::run(server.clone(), federation),
    );
}

/// A server whose every listener is bound and serving: run it with
/// [`ServerProcess::run`].
pub struct ServerProcess {
    pub server: Arc<Server>,
    pub agent: Arc<Agent>,
    serve: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
    stops: Vec<Arc<tokio::sync::Notify>>,
}

/// A server from its data dir, serving on `listeners`: its core (as
/// [`assemble`]), the HTTP and HTTPS API, DNS answered from its state, the
/// gRPC port (xDS and the dataplane's services) and its own agent.
pub async fn server(
    mut config: ServerConfig, dns: Option<DnsConfig>, grpc: Option<GrpcConfig>,
    listeners: Listeners,
) -> anyhow::Result<ServerProcess> {
    bound_addresses(&mut config, &listeners)?;
    let Listeners {
        raft,
        http: listener,
        https,
        grpc: grpc_listener,
        dns: dns_listeners,
    } = listeners;
    let server = Server::start(config.clone(), raft).await?;
    // WAN federation: served once the router that answers for it is built;
    // the leader's federation duties (its states, replication) use it.
    let federation = crate::federation::Federation::new(server.clone());
    start(&server, Some(federation.clone()));
    server.tasks().spawn(
        "coordinate probes",
        crate::http::coordinate::probe_servers(server.clone()),
    );
    let tls = config.tls.clone();
    let https = match (https, &tls) {
        (Some(l), Some(t)) => Some((l, t.files.https_server(t.verify_incoming)?)),
        _ => None,
    };
    let grpc_port = port_of(grpc_listener.as_ref())?;
    let stop_grpc = Arc::new(tokio::sync::Notify::new());
    if let (Some(l), Some(g)) = (grpc_listener, grpc) {
        // TLS with the server's certificate when the files are given;
        // client certificates only with --tls-verify-incoming (a proxy
        // authenticates with its ACL token, not a certificate).
        let tls = match &tls {
            Some(t) => Some(t.files.https_server(t.verify_incoming)?),
            None => None,
        };
        let port = grpc::serve(server.clone(), l, tls, g.clone(), stop_grpc.clone());
        server.tasks().spawn("gRPC port", port);
    }
    let mut agent_config = agent_config(&config)?;
    agent_config.blocking = server.blocking().clone();
    agent_config.ports.dns = dns_listeners.as_ref().map(|l| l.addr.port());
    // With the TLS files the gRPC port speaks TLS only.
    match tls {
        Some(_) => agent_config.ports.grpc_tls = grpc_port,
        None => agent_config.ports.grpc = grpc_port,
    }
    agent_config.ports.https = port_of(https.as_ref().map(|(l, _)| l))?;
    // Bound first: the agent talks to this server through that address.
    let agent = crate::agent::embedded(agent_config).await?;
    server.set_agent(agent.clone());
    let app = crate::http::router(server.clone())
        .merge(crate::agent::api::server_routes(agent.clone()))
        .layer(axum::Extension(crate::http::resolver(&server)))
        .layer(axum::Extension(federation.clone()))
        .merge(crate::request::ui::routes(&config.ui))
        .fallback(crate::request::no_route);
    // WAN frames only where the transport proves its peers (or the
    // operator accepted a plain one): `ServerConfig::serves_wan`.
    if config.serves_wan() {
        federation.serve(wan_handler(app.clone()));
    } else {
        tracing::info!(
            "WAN federation off: the Raft transport authenticates no peer (--encrypt or TLS turns it on)"
        );
    }
    // Chain targets in other datacenters: their instances read there.
    server
        .proxycfg()
        .set_remote(Arc::new(crate::federation::MeshReads {
            federation: federation.clone(),
            token: config.agent_tokens.own().map(str::to_string),
        }));
    if let Some(d) = &dns {
        // An ingress gateway's leaf names `*.ingress.<domain>`.
        server.proxycfg().set_dns_domain(&d.domain.to_ascii());
    }
    if let (Some(l), Some(d)) = (dns_listeners, dns) {
        let catalog = Arc::new(crate::dns::StateCatalog {
            store: server.store().clone(),
            datacenter: config.datacenter.clone(),
            acl: server.acl().clone(),
            token: config.agent_tokens.default.clone(),
            remote: Some(federation.clone()),
            queries: Some(Arc::new(crate::endpoint::query::Queries {
                server: server.clone(),
                federation: Some(federation.clone()),
            })),
        });
        server
            .tasks()
            .spawn("DNS listeners", crate::dns::serve(l, d, catalog));
    }
    // One each: `Notify::notify_one` wakes one waiter (or the next).
    let (stop, stop_tls) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    // Followers forward every client's request to the leader: the servers'
    // own IPs are not held to one client's share of connections.
    let mut http_limits = config.limits.http.clone();
    http_limits.exempt = Some(crate::request::serve::Exempt({
        let server = server.clone();
        Arc::new(move |ip| {
            server.cluster().members().iter().any(|(_, n, _)| {
                n.raft_addr
                    .parse::<std::net::SocketAddr>()
                    .is_ok_and(|a| a.ip() == ip)
            })
        })
    }));
    let plain = {
        let (app, limits, stop) = (app.clone(), http_limits.clone(), stop.clone());
        async move {
            match listener {
                Some(l) => {
                    tracing::info!(addr = ?l.local_addr().ok(), "HTTP API listening");
                    crate::request::serve::serve(l, app, limits, stop).await
                }
                None => std::future::pending().await,
            }
        }
    };
    let secure = {
        let (limits, stop) = (http_limits, stop_tls.clone());
        async move {
            match https {
                Some((l, tls)) => {
                    tracing::info!(addr = ?l.local_addr().ok(), "HTTPS API listening");
                    crate::request::serve::serve_tls(l, app, limits, stop, tls).await
                }
                None => std::future::pending().await,
            }
        }
    };
    Ok(ServerProcess {
        server,
        agent,
        serve: Box::pin(async move {
            tokio::join!(plain, secure);
        }),
        stops: vec![stop, stop_tls, stop_grpc],
    })
}

/// Answers a request from another datacenter with this server's router,
/// in process, as if it had been asked here (marked as forwarded).
fn wan_handler(app: axum::Router) -> crate::federation::Handler {
    use axum::response::IntoResponse;
    use tower::ServiceExt;
    Arc::new(move |r| {
        let app = app.clone();
        Box::pin(async move {
            let resp = match crate::http::wan::request_of(r) {
                Ok(req) => match app.oneshot(req).await {
                    Ok(resp) => resp,
                    Err(never) => match never {},
                },
                Err(e) => e.into_response(),
            };
            crate::http::wan::answer_of(resp).await
        })
    })
}

impl ServerProcess {
    /// Serves until `shutdown` completes (`signal::shutdown`: SIGINT or
    /// SIGTERM) or the server leaves the cluster (or a storage fault, which
    /// ends the process with `FAULT_EXIT`, or a critical task's death, with
    /// `TASK_EXIT`), then shuts the server down.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let ServerProcess {
            server,
            agent,
            serve,
            stops,
        } = self;
        tokio::select! {
            _ = serve => {},
            why = server.raft_failed() => fault_stop(&server, &why),
            ended = server.tasks().failed() => fail_task_or_fault(&server, ended).await,
            ended = agent.tasks.failed() => fail_task_or_fault(&server, ended).await,
            _ = async {
                tokio::select! {
                    _ = shutdown => {},
                    _ = server.stop_requested() => tracing::info!("left the cluster: stopping"),
                }
            } => {
                // Blocking queries may wait minutes: give requests in
                // flight a moment to finish, then stop regardless.
                for s in &stops {
                    s.notify_one();
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
        server.shutdown().await;
        Ok(())
    }
}

/// `cairn server`: binds the configured addresses, builds the server and
/// runs it.
pub async fn run_server(
    config: ServerConfig, dns: Option<DnsConfig>, grpc: Option<GrpcConfig>,
) -> anyhow::Result<()> {
    // Refused before anything is bound or opened.
    config.check_raft_protection()?;
    config.check_wan_protection()?;
    let listeners = Listeners::bind(&config, dns.as_ref(), grpc.as_ref()).await?;
    let process = server(config, dns, grpc, listeners).await?;
    process.run(crate::signal::shutdown()).await
}

/// `cairn agent`: a client agent from its configuration, until a signal.
pub async fn run_agent(config: AgentConfig, dns: Option<DnsConfig>) -> anyhow::Result<()> {
    crate::agent::run(config, dns).await
}

/// A critical task died: the server would answer while broken (no
/// transport, no events, no leader duties), so it stops, naming the task,
/// for a supervisor to restart it.
/// A task that ended because Raft stopped on a storage fault (the leader
/// duties do) is that fault's consequence: exit as the fault, not the task,
/// so the exit code says what a supervisor needs to know.
async fn fail_task_or_fault(server: &Server, ended: crate::tasks::Ended) -> ! {
    if let Ok(why) = tokio::time::timeout(Duration::from_secs(1), server.raft_failed()).await {
        fault_stop(server, &why);
    }
    fail_task(ended)
}

/// Fail stop: a server whose log or state store failed must not linger
/// answering 500s and stale reads. Exiting lets a supervisor restart it;
/// the restart recovers from the data dir (rebuilding the state's rows,
/// no longer vouched for), or refuses to start naming what is wrong.
fn fault_stop(server: &Server, why: &str) -> ! {
    tracing::error!("storage fault, stopping: {why}");
    crate::state::persist::distrust_rows(&server.config().data_dir);
    std::process::exit(crate::server::FAULT_EXIT);
}

fn fail_task(ended: crate::tasks::Ended) -> ! {
    tracing::error!("{ended}: stopping");
    std::process::exit(crate::tasks::TASK_EXIT);
}

/// The port a listener is bound to (none without a listener).
fn port_of(l: Option<&TcpListener>) -> std::io::Result<Option<u16>> {
    l.map(|l| l.local_addr().map(|a| a.port())).transpose()
}

/// The server's own agent: its node, in `<data-dir>/agent`, talking to
/// this server's HTTP API (loopback for a wildcard address; HTTPS with the
/// server's own certificate when only HTTPS is served).
fn agent_config(config: &ServerConfig) -> anyhow::Result<AgentConfig> {
    let mut local = config.http_addr;
    if local.ip().is_unspecified() {
        local.set_ip(match local {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let (scheme, tls) = match &config.tls {
        Some(t) => (
            if t.http_off { "https" } else { "http" },
            Some(Arc::new(crate::agent::AgentTls {
                client: t.files.client()?,
                https: None,
                http_off: t.http_off,
            })),
        ),
        None => ("http", None),
    };
    Ok(crate::agent::AgentConfig {
        node: config.node.clone(),
        data_dir: config.data_dir.join("agent"),
        http_addr: config.http_addr,
        advertise: config.advertise,
        servers: vec![format!("{scheme}://{local}")],
        config_sources: config.config_sources.clone(),
        sync_interval: crate::agent::sync::DEFAULT_INTERVAL,
        datacenter: config.datacenter.clone(),
        primary_datacenter: config.primary().to_string(),
        in_server: true,
        ports: Default::default(),
        tls,
        tokens: config.agent_tokens.clone(),
        // The server's own, set by `run`.
        blocking: crate::request::serve::Blocking::new(config.limits.http.max_blocking),
        ui: Default::default(),
        // The server answers health reads from its own views.
        streaming_backend: false,
        script_checks: config.script_checks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn listen() -> TcpListener {
        TcpListener::bind("127.0.0.1:0").await.unwrap()
    }

    /// Listeners for the Raft port and plain HTTP only.
    async fn raft_and_http() -> Listeners {
        Listeners {
            raft: listen().await,
            http: Some(listen().await),
            https: None,
            grpc: None,
            dns: None,
        }
    }

    fn config(dir: &std::path::Path) -> ServerConfig {
        // Ports 0: the listeners handed in decide.
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        ServerConfig {
            http_addr: any,
            raft_addr: any,
            bootstrap_expect: 1,
            ..ServerConfig::new("p1", dir.to_path_buf())
        }
    }

    /// A server built on listeners a test bound itself serves on them, and
    /// once it leads, the leader module has established its duties for
    /// that term (the cluster id and CA root written by one of them).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_serves_on_the_listeners_handed_in_and_its_leader_runs_the_duties() {
        crate::tls::install_default_provider();
        let dir = tempfile::tempdir().unwrap();
        let listeners = raft_and_http().await;
        let http = listeners.http.as_ref().unwrap().local_addr().unwrap();
        let p = server(config(dir.path()), None, None, listeners)
            .await
            .unwrap();
        let s = p.server.clone();
        assert_eq!(
            s.config().http_addr,
            http,
            "the configuration names the bound port"
        );
        tokio::spawn(p.serve);
        let settled = async {
            loop {
                let st = s.state();
                let term = s.cluster().leading_term();
                if term.is_some()
                    && s.duties().get() == term
                    && !st.cluster_id.is_empty()
                    && st.connect_ca.is_some()
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), settled)
            .await
            .expect("the leader's duties ran");
        let leader: String = crate::tls::http_client()
            .build()
            .unwrap()
            .get(format!("http://{http}/v1/status/leader"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(leader, s.config().raft_addr.to_string());
        s.shutdown().await;
    }

    /// A server shutting down closes its Raft port first: a peer's open
    /// connection is closed and a new one refused, so the leader backs off
    /// from it rather than hearing "raft stopped" for every heartbeat
    /// while the server writes its state.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_closes_the_raft_port_first() {
        use tokio::io::AsyncReadExt;
        crate::tls::install_default_provider();
        let dir = tempfile::tempdir().unwrap();
        let listeners = raft_and_http().await;
        let raft_addr = listeners.raft.local_addr().unwrap();
        let p = server(config(dir.path()), None, None, listeners)
            .await
            .unwrap();
        let s = p.server.clone();
        tokio::spawn(p.serve);
        let mut open = tokio::net::TcpStream::connect(raft_addr).await.unwrap();
        // The greeting the server sends first: the connection is served.
        let mut greeting = vec![0u8; crate::raft::network::greeting().len()];
        open.read_exact(&mut greeting).await.unwrap();
        s.shutdown().await;
        let mut rest = Vec::new();
        let closed =
            tokio::time::timeout(Duration::from_secs(5), open.read_to_end(&mut rest)).await;
        assert!(
            closed.is_ok(),
            "an open Raft connection outlived the shutdown"
        );
        let again = tokio::net::TcpStream::connect(raft_addr).await;
        assert!(again.is_err(), "the Raft port still accepts after shutdown");
    }

    /// The WAN frames as a stranger sends them to a server's Raft port: a
    /// forwarded request from a datacenter it does not know is refused
    /// before any handler runs, so is a greeting claiming its own
    /// datacenter or another primary; a greeting with more datacenters
    /// and servers than allowed is taken in only up to the bounds, and the
    /// request of a datacenter that greeted is answered by the router.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn wan_frames_from_strangers_are_refused_and_bounded() {
        use crate::raft::network::{Conn, Dial, Reply, Request, TcpConnect, decode, open_channel};
        use crate::raft::wan::{WanDatacenter, WanHello, WanRequest, WanResponse, WanServer};
        crate::tls::install_default_provider();
        let dir = tempfile::tempdir().unwrap();
        let listeners = raft_and_http().await;
        // WAN frames are served on a plain transport only when told so
        // (this test's frames are plain TCP).
        let mut config = config(dir.path());
        config.insecure_raft = true;
        let p = server(config, None, None, listeners).await.unwrap();
        let s = p.server.clone();
        tokio::spawn(p.serve);
        let addr = s.config().raft_addr.to_string();
        let call = |req: Request| {
            let mut conn = Conn::new(Arc::new(TcpConnect), addr.clone());
            async move { conn.call(&req, Duration::from_secs(5)).await.unwrap() }
        };
        // A forwarded request, on a channel opened as from `from` (the
        // request's own `from` is not believed).
        let ask = |from: &str| {
            let req = WanRequest {
                from: "dc2".into(),
                method: "GET".into(),
                path_and_query: "/v1/catalog/datacenters".into(),
                headers: Vec::new(),
                body: Vec::new(),
            };
            let first = Request::WanChannel { from: from.into() };
            let addr = addr.clone();
            async move {
                let ch = open_channel(&TcpConnect, &addr, &Dial::Local, &first)
                    .await
                    .unwrap();
                let body = bincode::serialize(&req).unwrap();
                let answer = ch
                    .call(body, Duration::from_secs(5))
                    .await
                    .unwrap()
                    .unwrap();
                decode::<Result<WanResponse, String>>(&answer).unwrap()
            }
        };
        match ask("dc9").await {
            Err(e) => assert!(e.contains("unknown datacenter"), "{e}"),
            other => panic!("{other:?}"),
        }
        let server_of = |dc: &str, n: usize| WanServer {
            name: format!("{dc}-s{n}"),
            raft_addr: format!("10.9.{}.{n}:8300", dc.len()),
        };
        let hello = |dc: &str, primary: &str, known: Vec<WanDatacenter>| {
            Request::WanHello(WanHello {
                datacenter: dc.into(),
                primary: primary.into(),
                server: server_of(dc, 0),
                known,
            })
        };
        for (dc, primary, why) in [
            ("dc1", "dc1", "of this datacenter"),
            ("dc2", "dc7", "primary datacenter mismatch"),
            ("bad dc", "dc1", "invalid datacenter name"),
        ] {
            match call(hello(dc, primary, Vec::new())).await {
                Reply::WanHello(Err(e)) => assert!(e.contains(why), "{e}"),
                other => panic!("{dc}: {other:?}"),
            }
        }
        // 100 datacenters of 40 servers each: at most 64 and 16 kept.
        let flood: Vec<WanDatacenter> = (0..100)
            .map(|i| WanDatacenter {
                datacenter: format!("f{i}"),
                servers: (0..40).map(|n| server_of(&format!("f{i}"), n)).collect(),
            })
            .collect();
        match call(hello("dc2", "dc1", flood)).await {
            Reply::WanHello(Ok(h)) => {
                assert_eq!(h.datacenter, "dc1");
                // Its own first, then what it took in.
                assert!(h.known.len() <= 65, "{}", h.known.len());
                assert!(h.known.iter().all(|d| d.servers.len() <= 16));
            }
            other => panic!("{other:?}"),
        }
        // A datacenter that greeted is answered, by the router.
        match ask("f0").await {
            Ok(r) => {
                assert_eq!(r.status, 200);
                let dcs: Vec<String> = serde_json::from_slice(&r.body).unwrap();
                // Itself and 64 others (dc2 and the first 63 of the flood).
                assert_eq!(dcs.len(), 65);
                assert_eq!(dcs[0], "dc1");
            }
            other => panic!("{other:?}"),
        }
        s.shutdown().await;
    }
}
