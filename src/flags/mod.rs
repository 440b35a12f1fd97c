//! The server's and agent's command-line flags (clap), and how they meet
//! the configuration files: a flag given (on the command line or through
//! its environment variable) wins over the files, a file's value over a
//! flag's default (`merge`, with table tests of that precedence, as etcd's
//! `embed.Config`); clap's defaults stay the one place of defaults.
//! `ServerArgs::start` and `AgentArgs::start` turn the merged flags into
//! the configurations `process` runs, so `main` is only dispatch.

mod merge;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::ArgMatches;

use crate::config_file::FileConfig;
use crate::request::serve::HttpLimits;

/// Consul's agent configuration files: flags given win over them.
#[derive(clap::Args)]
pub struct ConfigArgs {
    /// A configuration file, HCL or JSON, in Consul's format (repeatable).
    #[arg(long, value_name = "FILE")]
    config_file: Vec<PathBuf>,
    /// A directory whose `*.hcl` and `*.json` files are read in lexical
    /// order (repeatable); service and check definitions in them are
    /// registered, and read again by `PUT /v1/agent/reload`.
    #[arg(long, value_name = "DIR")]
    config_dir: Vec<PathBuf>,
}

impl ConfigArgs {
    fn sources(&self) -> crate::config_file::Sources {
        crate::config_file::Sources {
            files: self.config_file.clone(),
            dirs: self.config_dir.clone(),
        }
    }
}

/// What servers and agents take alike: the configuration files, where
/// the HTTP API listens and its TLS, the ACL tokens, logging, DNS, the UI
/// and script checks.
#[derive(clap::Args)]
pub struct CommonArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(flatten)]
    listen: ListenArgs,
    #[command(flatten)]
    acl: AclArgs,
    #[arg(long, default_value = "info")]
    log_level: String,
    #[arg(long)]
    log_json: bool,
    #[command(flatten)]
    dns: DnsArgs,
    #[command(flatten)]
    ui: UiArgs,
    #[command(flatten)]
    checks: ChecksArgs,
}

#[derive(clap::Args)]
pub struct ServerArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// One server with its data in a fresh temporary directory.
    #[arg(long)]
    dev: bool,
    /// Serve Consul's `/debug/pprof/` (a CPU profile, a thread dump) with
    /// ACLs off too (with ACLs on they are served behind operator:read);
    /// on with --dev, as Consul's `enable_debug`.
    #[arg(long)]
    enable_debug: bool,
    #[arg(long)]
    node: Option<String>,
    #[arg(long)]
    data_dir: Option<PathBuf>,
    #[arg(long, default_value_t = crate::server::RAFT_ADDR)]
    raft_addr: SocketAddr,
    /// The Raft port's shared key (base64 of 32 bytes, from `cairn
    /// keygen`; the same on every server): peers must prove it, and all
    /// Raft traffic is encrypted with it.
    #[arg(long, value_name = "KEY")]
    encrypt: Option<String>,
    /// Serve a --raft-addr that is not loopback with neither TLS nor
    /// --encrypt (anyone reaching the port could join the cluster).
    #[arg(long)]
    insecure_raft: bool,

    #[arg(long, default_value = crate::server::DATACENTER)]
    datacenter: String,
    #[arg(long, default_value_t = 0)]
    bootstrap_expect: usize,
    /// Another server's --raft-addr (repeatable).
    #[arg(long)]
    join: Vec<String>,
    /// The datacenter that holds the federation's authoritative state
    /// (default: this server's own).
    #[arg(long, value_name = "DC")]
    primary_datacenter: Option<String>,
    /// The --raft-addr of a server in another datacenter (repeatable):
    /// the datacenters then learn of each other (WAN federation).
    #[arg(long, value_name = "ADDR")]
    join_wan: Vec<String>,
    /// Snapshot the state and compact the Raft log after this many entries.
    #[arg(long, default_value_t = crate::server::SNAPSHOT_THRESHOLD, hide = true)]
    raft_snapshot_threshold: u64,
    /// Start a new Raft log segment file past this many bytes.
    #[arg(long, default_value_t = crate::raft::log_store::SEGMENT_BYTES, hide = true)]
    raft_log_segment_bytes: u64,
    /// How long the index entries of deleted keys, services, nodes and
    /// config entries (tombstones) are kept before the leader reaps them.
    #[arg(long, value_parser = parse_flag_duration, default_value_t = FlagDuration(crate::server::TOMBSTONE_TTL))]
    tombstone_ttl: FlagDuration,
    /// HTTP connections open at once; past it a new one is closed at once
    /// (default: 16384, or less to stay within the open-files limit).
    #[arg(long)]
    http_max_conns: Option<usize>,
    /// HTTP connections one client IP may hold open at once (Consul's
    /// `limits.http_max_conns_per_client`); past it a new one is closed.
    #[arg(long, default_value_t = HttpLimits::default().max_conns_per_client)]
    http_max_conns_per_client: usize,
    /// Time a request's head may take to arrive, from its first byte.
    #[arg(long, value_parser = parse_flag_duration, default_value_t = FlagDuration(HttpLimits::default().header_timeout))]
    http_read_header_timeout: FlagDuration,
    /// An HTTP connection with no request in flight and no traffic for
    /// this long is closed.
    #[arg(long, value_parser = parse_flag_duration, default_value_t = FlagDuration(HttpLimits::default().idle_timeout))]
    http_idle_timeout: FlagDuration,
    /// Blocking queries waiting at once; past it one answers 429.
    #[arg(long, default_value_t = HttpLimits::default().max_blocking)]
    http_max_blocking_queries: usize,
    /// Connections open at once on the Raft port (from one IP: a quarter).
    #[arg(long, default_value_t = crate::raft::network::PortLimits::default().max_conns)]
    raft_max_conns: usize,
    /// The most sled's page cache holds, in MiB (it grows as pages are
    /// touched, up to this).
    #[arg(long, default_value_t = crate::server::SLED_CACHE_BYTES >> 20, hide = true)]
    sled_cache_mb: u64,
    /// Where gRPC listens (Envoy's xDS, consul-dataplane's services); ""
    /// turns it off.
    #[arg(long, default_value = "127.0.0.1:8502")]
    grpc_addr: String,
    /// xDS streams open at once; past it a new one is refused
    /// (RESOURCE_EXHAUSTED).
    #[arg(long, default_value_t = crate::grpc::MAX_STREAMS, hide = true)]
    grpc_max_streams: usize,
    /// gRPC connections open at once; past it a new one is closed at once.
    #[arg(long, default_value_t = crate::grpc::MAX_CONNS, hide = true)]
    grpc_max_conns: usize,
    /// xDS streams with no token (ACLs on) open at once, apart from those
    /// with one; past it a new one is refused (RESOURCE_EXHAUSTED).
    #[arg(long, default_value_t = crate::xds::Limits::default().max_anonymous, hide = true)]
    xds_max_anonymous_streams: usize,
    /// An xDS stream with no first request within this is closed.
    #[arg(long, value_parser = parse_flag_duration, default_value_t = FlagDuration(crate::xds::Limits::default().first_request), hide = true)]
    xds_first_request_timeout: FlagDuration,
}

/// Which script checks the node's agent runs (servers and agents alike).
#[derive(clap::Args)]
pub struct ChecksArgs {
    /// Run script checks (`Args`) from any source, the HTTP API included
    /// (Consul's enable_script_checks: anyone who may register a check
    /// runs commands on this host).
    #[arg(long)]
    enable_script_checks: bool,
    /// Run script checks from the configuration files only.
    #[arg(long)]
    enable_local_script_checks: bool,
}

impl ChecksArgs {
    fn config(&self) -> crate::agent::spec::ScriptChecks {
        crate::agent::spec::ScriptChecks {
            enabled: self.enable_script_checks,
            local: self.enable_local_script_checks,
        }
    }
}

/// The web UI's flags (servers and agents alike).
#[derive(clap::Args)]
pub struct UiArgs {
    /// Serve the web UI at /ui/ (and redirect / there); always on with
    /// --dev.
    #[arg(long)]
    ui: bool,
    /// Serve the web UI from this directory instead of the one built in
    /// (implies --ui; Consul's ui_config.dir).
    #[arg(long, value_name = "DIR")]
    ui_dir: Option<PathBuf>,
}

impl UiArgs {
    fn config(&self, dev: bool) -> crate::request::ui::UiConfig {
        crate::request::ui::UiConfig {
            enabled: self.ui || dev,
            dir: self.ui_dir.clone(),
        }
    }
}

/// The DNS interface's flags (servers and agents alike).
#[derive(clap::Args)]
pub struct DnsArgs {
    /// Where DNS listens, UDP and TCP; "" turns it off.
    #[arg(long, default_value = "127.0.0.1:8600")]
    dns_addr: String,
    /// The domain DNS answers for.
    #[arg(long, default_value = "consul.", value_parser = crate::dns::parse_domain)]
    domain: hickory_proto::rr::Name,
    /// Leave instances with a warning check out of DNS answers.
    #[arg(long)]
    dns_only_passing: bool,
    /// TTL of service records (a Go duration, whole seconds).
    #[arg(long, value_parser = parse_ttl, default_value = "0s")]
    dns_service_ttl: u32,
    /// TTL of node records (a Go duration, whole seconds).
    #[arg(long, value_parser = parse_ttl, default_value = "0s")]
    dns_node_ttl: u32,
}

impl DnsArgs {
    fn config(&self) -> anyhow::Result<Option<crate::dns::DnsConfig>> {
        if self.dns_addr.is_empty() {
            return Ok(None);
        }
        let addr = self
            .dns_addr
            .parse()
            .map_err(|e| anyhow::anyhow!("--dns-addr {:?}: {e}", self.dns_addr))?;
        Ok(Some(crate::dns::DnsConfig {
            addr,
            domain: self.domain.clone(),
            only_passing: self.dns_only_passing,
            service_ttl: self.dns_service_ttl,
            node_ttl: self.dns_node_ttl,
        }))
    }
}

#[derive(clap::Args)]
pub struct AgentArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// This agent's node name (default: the host name).
    #[arg(long)]
    node: Option<String>,
    /// Where the agent keeps its state (required, here or as `data_dir`
    /// in a configuration file).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// A server's HTTP address (repeatable): http://host:port, host:port,
    /// or https://host:port (with --tls-ca-file). Required, here or as a
    /// configuration file's `retry_join` (a host there means its port 8500).
    #[arg(long = "server")]
    servers: Vec<String>,
    #[arg(long, default_value = crate::server::DATACENTER, hide = true)]
    datacenter: String,
    /// The full anti-entropy period before scaling by cluster size
    /// (a Go duration; default 1m).
    #[arg(long, value_parser = parse_duration, default_value = "1m")]
    sync_interval: std::time::Duration,
    /// Answer blocking `/v1/health/service|connect` reads from views fed
    /// by one event stream per service (and token) instead of forwarding
    /// each to a server (Consul's `use_streaming_backend`).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    use_streaming_backend: bool,
}

/// A record TTL: a Go duration (0 allowed), in whole seconds.
fn parse_ttl(s: &str) -> Result<u32, String> {
    let d = crate::structs::duration::Duration::parse(s)?;
    if d.nanos() < 0 {
        return Err("must not be negative".into());
    }
    u32::try_from(d.nanos() / 1_000_000_000).map_err(|_| "too long".into())
}

/// Where the HTTP API listens and the TLS flags: servers and agents take
/// the same, checked together.
#[derive(clap::Args)]
pub struct ListenArgs {
    /// The plain HTTP API's address; "" for none (HTTPS only).
    #[arg(long, default_value_t = crate::server::HTTP_ADDR.to_string())]
    http_addr: String,
    /// The CA certificate (PEM) that peers' and clients' certificates are
    /// checked against.
    #[arg(long)]
    tls_ca_file: Option<PathBuf>,
    /// This process's certificate (PEM; `cairn tls cert create`).
    #[arg(long)]
    tls_cert_file: Option<PathBuf>,
    /// This process's certificate key (PEM).
    #[arg(long)]
    tls_key_file: Option<PathBuf>,
    /// Serve the HTTP API over HTTPS here too (or only, with
    /// `--http-addr ""`).
    #[arg(long)]
    https_addr: Option<SocketAddr>,
    /// HTTPS clients must present a certificate signed by the CA.
    #[arg(long)]
    tls_verify_incoming: bool,
    /// The address others reach this node on (Consul's `-advertise`): its
    /// catalog address and, on a server, the Raft (and, for a wildcard
    /// --http-addr, HTTP) address its peers use. Default: the bound ones.
    #[arg(long, value_name = "IP")]
    advertise: Option<std::net::IpAddr>,
}

/// The ACL flags: servers take all of them, agents only their tokens.
#[derive(clap::Args)]
pub struct AclArgs {
    /// Enforce ACLs (servers).
    #[arg(long)]
    acl_enabled: bool,
    /// What a token's rules do not decide (servers): allow or deny.
    #[arg(long, default_value = "allow", value_parser = str::parse::<crate::acl::DefaultPolicy>)]
    acl_default_policy: crate::acl::DefaultPolicy,
    /// A management token the first leader creates with this secret
    /// (servers; Consul's `initial_management`).
    #[arg(
        long,
        env = "CAIRN_ACL_INITIAL_MANAGEMENT_TOKEN",
        hide_env_values = true
    )]
    acl_initial_management_token: Option<String>,
    /// The token of requests this agent makes or forwards without one.
    #[arg(long)]
    acl_token: Option<String>,
    /// The token of this agent's own anti-entropy, heartbeats and leave
    /// (default: --acl-token).
    #[arg(long)]
    acl_agent_token: Option<String>,
    /// A secondary's token for replication from the primary (servers;
    /// Consul's `acl.tokens.replication`): the primary checks it (`acl:write`;
    /// `service:read` and `intention:read` on every service for config
    /// entries). Without it the pulls are trusted as a server's, over the
    /// authenticated Raft transport.
    #[arg(long, env = "CAIRN_ACL_REPLICATION_TOKEN", hide_env_values = true)]
    acl_replication_token: Option<String>,
}

impl AclArgs {
    fn tokens(&self) -> crate::structs::acl::AgentTokens {
        crate::structs::acl::AgentTokens {
            default: self.acl_token.clone().filter(|t| !t.is_empty()),
            agent: self.acl_agent_token.clone().filter(|t| !t.is_empty()),
        }
    }

    fn server(&self) -> crate::state::token_resolver::AclConfig {
        crate::state::token_resolver::AclConfig {
            enabled: self.acl_enabled,
            default_policy: self.acl_default_policy,
            initial_management: self
                .acl_initial_management_token
                .clone()
                .filter(|t| !t.is_empty()),
        }
    }

    /// A client agent enforces nothing itself (its servers do).
    fn agent_only(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            !self.acl_enabled
                && self.acl_initial_management_token.is_none()
                && self.acl_replication_token.is_none(),
            "--acl-enabled, --acl-initial-management-token and --acl-replication-token are server flags"
        );
        Ok(())
    }
}

impl ListenArgs {
    /// The plain HTTP address (none for `""`) and the address the process
    /// is reached on (the HTTPS one when plain HTTP is off).
    fn addrs(&self) -> anyhow::Result<(Option<SocketAddr>, SocketAddr)> {
        if self.http_addr.trim().is_empty() {
            let https = self
                .https_addr
                .ok_or_else(|| anyhow::anyhow!("--http-addr \"\" needs --https-addr"))?;
            return Ok((None, https));
        }
        let plain: SocketAddr = self
            .http_addr
            .parse()
            .map_err(|e| anyhow::anyhow!("--http-addr {:?}: {e}", self.http_addr))?;
        Ok((Some(plain), plain))
    }

    /// The three files loaded, if given (all or none).
    fn files(&self) -> anyhow::Result<Option<crate::tls::Tls>> {
        match (&self.tls_ca_file, &self.tls_cert_file, &self.tls_key_file) {
            (None, None, None) => {
                anyhow::ensure!(
                    self.https_addr.is_none() && !self.tls_verify_incoming,
                    "--https-addr and --tls-verify-incoming need --tls-ca-file, --tls-cert-file and --tls-key-file"
                );
                Ok(None)
            }
            (Some(ca), Some(cert), Some(key)) => Ok(Some(crate::tls::Tls::load(ca, cert, key)?)),
            (_, None, Some(_)) | (_, Some(_), None) => {
                anyhow::bail!("--tls-cert-file and --tls-key-file go together")
            }
            (None, _, _) => anyhow::bail!("--tls-cert-file needs --tls-ca-file"),
            (Some(_), None, None) => {
                anyhow::ensure!(
                    self.https_addr.is_none(),
                    "--https-addr needs --tls-cert-file and --tls-key-file"
                );
                Ok(None)
            }
        }
    }
}

/// What `cairn server` runs: its configuration, DNS and gRPC, and (with
/// `--dev` and no data dir) the temporary data dir, removed when dropped.
pub struct ServerStart {
    pub config: crate::server::ServerConfig,
    pub dns: Option<crate::dns::DnsConfig>,
    pub grpc: Option<crate::grpc::GrpcConfig>,
    pub dev_dir: Option<TempDir>,
}

/// The configuration files `c` names, read.
pub fn load_files(c: &ConfigArgs) -> anyhow::Result<FileConfig> {
    FileConfig::load(&c.sources()).map_err(|e| anyhow::anyhow!(e.0))
}

/// One line per configuration key cairn does not use (once logging runs).
pub fn warn_unused(f: &FileConfig) {
    for (key, file) in &f.unused {
        tracing::warn!(key = %key, file = %file.display(), "configuration key not used by cairn: ignored");
    }
}

impl ServerArgs {
    /// The flags over the configuration files they name (`m`: this
    /// command's matches, which say which flags were given); the files
    /// too, for their unused keys.
    pub fn merged(mut self, m: &ArgMatches) -> anyhow::Result<(Self, FileConfig)> {
        let file = load_files(&self.common.config)?;
        merge::apply_server(m, &file, &mut self)?;
        Ok((self, file))
    }

    /// The log level and whether logs are JSON.
    pub fn log(&self) -> (&str, bool) {
        (&self.common.log_level, self.common.log_json)
    }

    /// The server's configuration from its (merged) flags.
    pub fn start(self) -> anyhow::Result<ServerStart> {
        let a = self;
        let encrypt = a
            .encrypt
            .as_deref()
            .map(crate::raft::encrypt::EncryptKey::parse)
            .transpose()?;
        let limits = server_limits(&a);
        let (data_dir, dev_dir) = match (a.dev, a.data_dir) {
            (_, Some(d)) => (d, None),
            (true, None) => {
                // Fresh every start: a killed dev server leaves its dir
                // behind, and a later process may get the same pid.
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.subsec_nanos());
                let tmp = std::env::temp_dir()
                    .join(format!("cairn-dev-{}-{nanos:08x}", std::process::id()));
                anyhow::ensure!(!tmp.exists(), "{} exists already", tmp.display());
                (tmp.clone(), Some(TempDir(tmp)))
            }
            (false, None) => anyhow::bail!("--data-dir is required (or use --dev)"),
        };
        let flags = &a.common.listen;
        let (plain, http_addr) = flags.addrs()?;
        let tls = match flags.files()? {
            Some(files) => Some(std::sync::Arc::new(crate::server::ServerTls {
                files,
                https_addr: a.common.listen.https_addr,
                verify_incoming: a.common.listen.tls_verify_incoming,
                http_off: plain.is_none(),
                domain: crate::tls::tls_domain(&a.common.dns.domain.to_string()),
            })),
            None => {
                // A CA alone means nothing to a server: it needs its
                // own certificate for HTTPS and the Raft port.
                anyhow::ensure!(
                    a.common.listen.tls_ca_file.is_none(),
                    "a server needs --tls-cert-file and --tls-key-file with --tls-ca-file"
                );
                None
            }
        };
        let config = crate::server::ServerConfig {
            node: a.node.unwrap_or_else(hostname),
            datacenter: a.datacenter,
            data_dir,
            http_addr,
            raft_addr: a.raft_addr,
            advertise: a.common.listen.advertise,
            bootstrap_expect: a.bootstrap_expect,
            join: a.join,
            primary_datacenter: a.primary_datacenter,
            join_wan: a.join_wan,
            snapshot_threshold: a.raft_snapshot_threshold,
            log_segment_bytes: a.raft_log_segment_bytes,
            tombstone_ttl: a.tombstone_ttl.0,
            limits,
            tls,
            encrypt,
            insecure_raft: a.insecure_raft,
            dev: a.dev,
            enable_debug: a.enable_debug || a.dev,
            acl: a.common.acl.server(),
            agent_tokens: a.common.acl.tokens(),
            acl_replication_token: a
                .common
                .acl
                .acl_replication_token
                .clone()
                .filter(|t| !t.is_empty()),
            ui: a.common.ui.config(a.dev),
            config_sources: a.common.config.sources(),
            script_checks: a.common.checks.config(),
        };
        let dns = a.common.dns.config()?;
        let grpc = if a.grpc_addr.trim().is_empty() {
            None
        } else {
            Some(crate::grpc::GrpcConfig {
                addr: a
                    .grpc_addr
                    .parse::<SocketAddr>()
                    .map_err(|e| anyhow::anyhow!("--grpc-addr {:?}: {e}", a.grpc_addr))?,
                xds: crate::xds::Limits {
                    max_streams: a.grpc_max_streams,
                    max_anonymous: a.xds_max_anonymous_streams,
                    first_request: a.xds_first_request_timeout.0,
                    ..Default::default()
                },
                max_conns: a.grpc_max_conns,
            })
        };
        Ok(ServerStart {
            config,
            dns,
            grpc,
            dev_dir,
        })
    }
}

impl AgentArgs {
    /// The flags over the configuration files they name, as
    /// [`ServerArgs::merged`].
    pub fn merged(mut self, m: &ArgMatches) -> anyhow::Result<(Self, FileConfig)> {
        let file = load_files(&self.common.config)?;
        merge::apply_agent(m, &file, &mut self)?;
        Ok((self, file))
    }

    /// The log level and whether logs are JSON.
    pub fn log(&self) -> (&str, bool) {
        (&self.common.log_level, self.common.log_json)
    }

    /// The agent's configuration and DNS from its (merged) flags.
    pub fn start(
        self,
    ) -> anyhow::Result<(crate::agent::AgentConfig, Option<crate::dns::DnsConfig>)> {
        let a = self;
        a.common.acl.agent_only()?;
        let data_dir = a.data_dir.clone().ok_or_else(|| {
            anyhow::anyhow!("--data-dir is required (or data_dir in a configuration file)")
        })?;
        anyhow::ensure!(
            !a.servers.is_empty(),
            "--server is required (or retry_join in a configuration file)"
        );
        let servers = a
            .servers
            .iter()
            .map(|s| crate::cli::normalize_addr(s).map_err(|e| anyhow::anyhow!(e.0)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let flags = &a.common.listen;
        let (plain, http_addr) = flags.addrs()?;
        let files = flags.files()?;
        let tls = match (&a.common.listen.tls_ca_file, &files) {
            (_, Some(f)) => Some(std::sync::Arc::new(crate::agent::AgentTls {
                client: f.client()?,
                https: match a.common.listen.https_addr {
                    Some(addr) => {
                        Some((addr, f.https_server(a.common.listen.tls_verify_incoming)?))
                    }
                    None => None,
                },
                http_off: plain.is_none(),
            })),
            // A CA alone: HTTPS to servers, no certificate of its own.
            (Some(ca), None) => Some(std::sync::Arc::new(crate::agent::AgentTls {
                client: crate::tls::client_config(ca, None)?,
                https: None,
                http_off: false,
            })),
            (None, None) => None,
        };
        let config = crate::agent::AgentConfig {
            node: a.node.unwrap_or_else(hostname),
            data_dir,
            http_addr,
            advertise: a.common.listen.advertise,
            servers,
            ui: a.common.ui.config(false),
            config_sources: a.common.config.sources(),
            sync_interval: a.sync_interval,
            datacenter: a.datacenter.clone(),
            primary_datacenter: String::new(),
            in_server: false,
            ports: Default::default(),
            tls,
            tokens: a.common.acl.tokens(),
            blocking: crate::request::serve::Blocking::new(
                crate::request::serve::HttpLimits::default().max_blocking,
            ),
            streaming_backend: a.use_streaming_backend,
            script_checks: a.common.checks.config(),
        };
        let dns = a.common.dns.config()?;
        Ok((config, dns))
    }
}

/// A duration flag: parsed as a Go duration, its default shown as one.
#[derive(Clone, Copy, Debug)]
pub struct FlagDuration(std::time::Duration);

impl std::fmt::Display for FlagDuration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nanos = i64::try_from(self.0.as_nanos()).unwrap_or(i64::MAX);
        crate::structs::duration::Duration(nanos).fmt(f)
    }
}

pub fn parse_flag_duration(s: &str) -> Result<FlagDuration, String> {
    parse_duration(s).map(FlagDuration)
}

pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let d = crate::structs::duration::Duration::parse(s)?;
    if d.nanos() <= 0 {
        return Err("must be positive".into());
    }
    Ok(std::time::Duration::from_nanos(d.nanos() as u64))
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "cairn".into())
}

fn server_limits(a: &ServerArgs) -> crate::server::Limits {
    let mut l = crate::server::Limits::default();
    if let Some(n) = a.http_max_conns {
        l.http.max_conns = n.max(1);
    }
    l.http.max_conns_per_client = a.http_max_conns_per_client.max(1);
    l.http.header_timeout = a.http_read_header_timeout.0;
    l.http.idle_timeout = a.http_idle_timeout.0;
    l.http.max_blocking = a.http_max_blocking_queries.max(1);
    l.raft_port.max_conns = a.raft_max_conns.max(4);
    l.raft_port.max_conns_per_ip = (a.raft_max_conns / 4).max(4);
    l.sled_cache_bytes = Some(a.sled_cache_mb.max(1) << 20);
    l
}

/// The dev server's data dir, removed when the server stops.
pub struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
