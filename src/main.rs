//! The `cairn` binary: a server, a client agent, or a CLI command.

use std::net::SocketAddr;
use std::path::PathBuf;

use cairn::config_file::FileConfig;
use cairn::request::serve::HttpLimits;
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};

/// mimalloc, not glibc's malloc: a profile of the leader under write load
/// spent about a quarter of its CPU in glibc's malloc and free (small,
/// short-lived allocations across threads: requests, entries, rows).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "cairn",
    version,
    about = "A Consul-compatible service catalog and service-mesh control plane"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// The ACL token client commands send (default: CAIRN_HTTP_TOKEN, then
    /// CONSUL_HTTP_TOKEN).
    #[arg(long, global = true)]
    token: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Run a server (its flags, and an agent's, boxed: they outweigh every
    /// other command's).
    Server(Box<ServerArgs>),
    /// Run a client agent: keeps its node's services and checks, runs the
    /// checks, and keeps the catalog in step by anti-entropy.
    Agent(Box<AgentArgs>),
    /// Inspect a stopped server's data dir: what a start would find.
    #[command(subcommand)]
    Debug(DebugCmd),
    /// Print a fresh key for `cairn server --encrypt` (base64 of 32 random
    /// bytes); generate one and give every server the same.
    Keygen,
    /// Print cairn's version and the Consul release whose API it follows.
    Version,
    /// Check configuration files (or directories of them) as `server` and
    /// `agent` read them, starting nothing.
    Validate {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Commands against a server's HTTP API (see `cairn::cli`).
    #[command(flatten)]
    Cli(cairn::cli::CliCommand),
}

#[derive(Subcommand)]
enum DebugCmd {
    /// Checks every Raft log segment, the snapshot file and the state's
    /// format version without changing anything; exits 1 if a start would
    /// refuse.
    DataDir { dir: PathBuf },
}

/// Consul's agent configuration files: flags given win over them.
#[derive(clap::Args)]
struct ConfigArgs {
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
    fn sources(&self) -> cairn::config_file::Sources {
        cairn::config_file::Sources {
            files: self.config_file.clone(),
            dirs: self.config_dir.clone(),
        }
    }
}

#[derive(clap::Args)]
struct ServerArgs {
    /// One server with its data in a fresh temporary directory.
    #[arg(long)]
    dev: bool,
    #[command(flatten)]
    config: ConfigArgs,
    #[arg(long)]
    node: Option<String>,
    #[arg(long)]
    data_dir: Option<PathBuf>,
    #[arg(long, default_value_t = cairn::server::RAFT_ADDR)]
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
    #[command(flatten)]
    listen: ListenArgs,
    #[command(flatten)]
    acl: AclArgs,

    #[arg(long, default_value = cairn::server::DATACENTER)]
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
    #[arg(long, default_value_t = cairn::server::SNAPSHOT_THRESHOLD, hide = true)]
    raft_snapshot_threshold: u64,
    /// Start a new Raft log segment file past this many bytes.
    #[arg(long, default_value_t = cairn::raft::log_store::SEGMENT_BYTES, hide = true)]
    raft_log_segment_bytes: u64,
    /// How long the index entries of deleted keys, services, nodes and
    /// config entries (tombstones) are kept before the leader reaps them.
    #[arg(long, value_parser = parse_flag_duration, default_value_t = FlagDuration(cairn::server::TOMBSTONE_TTL))]
    tombstone_ttl: FlagDuration,
    #[arg(long, default_value = "info")]
    log_level: String,
    #[arg(long)]
    log_json: bool,
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
    #[arg(long, default_value_t = cairn::raft::network::PortLimits::default().max_conns)]
    raft_max_conns: usize,
    /// The most sled's page cache holds, in MiB (it grows as pages are
    /// touched, up to this).
    #[arg(long, default_value_t = cairn::server::SLED_CACHE_BYTES >> 20, hide = true)]
    sled_cache_mb: u64,
    #[command(flatten)]
    dns: DnsArgs,
    #[command(flatten)]
    ui: UiArgs,
    #[command(flatten)]
    checks: ChecksArgs,
    /// Where gRPC listens (Envoy's xDS, consul-dataplane's services); ""
    /// turns it off.
    #[arg(long, default_value = "127.0.0.1:8502")]
    grpc_addr: String,
    /// xDS streams open at once; past it a new one is refused
    /// (RESOURCE_EXHAUSTED).
    #[arg(long, default_value_t = cairn::http::grpc::MAX_STREAMS, hide = true)]
    grpc_max_streams: usize,
    /// gRPC connections open at once; past it a new one is closed at once.
    #[arg(long, default_value_t = cairn::http::grpc::MAX_CONNS, hide = true)]
    grpc_max_conns: usize,
    /// xDS streams with no token (ACLs on) open at once, apart from those
    /// with one; past it a new one is refused (RESOURCE_EXHAUSTED).
    #[arg(long, default_value_t = cairn::xds::Limits::default().max_anonymous, hide = true)]
    xds_max_anonymous_streams: usize,
    /// An xDS stream with no first request within this is closed.
    #[arg(long, value_parser = parse_flag_duration, default_value_t = FlagDuration(cairn::xds::Limits::default().first_request), hide = true)]
    xds_first_request_timeout: FlagDuration,
}

/// Which script checks the node's agent runs (servers and agents alike).
#[derive(clap::Args)]
struct ChecksArgs {
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
    fn config(&self) -> cairn::agent::spec::ScriptChecks {
        cairn::agent::spec::ScriptChecks {
            enabled: self.enable_script_checks,
            local: self.enable_local_script_checks,
        }
    }
}

/// The web UI's flags (servers and agents alike).
#[derive(clap::Args)]
struct UiArgs {
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
    fn config(&self, dev: bool) -> cairn::request::ui::UiConfig {
        cairn::request::ui::UiConfig {
            enabled: self.ui || dev,
            dir: self.ui_dir.clone(),
        }
    }
}

/// The DNS interface's flags (servers and agents alike).
#[derive(clap::Args)]
struct DnsArgs {
    /// Where DNS listens, UDP and TCP; "" turns it off.
    #[arg(long, default_value = "127.0.0.1:8600")]
    dns_addr: String,
    /// The domain DNS answers for.
    #[arg(long, default_value = "consul.", value_parser = cairn::dns::parse_domain)]
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
    fn config(&self) -> anyhow::Result<Option<cairn::dns::DnsConfig>> {
        if self.dns_addr.is_empty() {
            return Ok(None);
        }
        let addr = self
            .dns_addr
            .parse()
            .map_err(|e| anyhow::anyhow!("--dns-addr {:?}: {e}", self.dns_addr))?;
        Ok(Some(cairn::dns::DnsConfig {
            addr,
            domain: self.domain.clone(),
            only_passing: self.dns_only_passing,
            service_ttl: self.dns_service_ttl,
            node_ttl: self.dns_node_ttl,
        }))
    }
}

#[derive(clap::Args)]
struct AgentArgs {
    /// This agent's node name (default: the host name).
    #[arg(long)]
    node: Option<String>,
    /// Where the agent keeps its state (required, here or as `data_dir`
    /// in a configuration file).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    #[command(flatten)]
    listen: ListenArgs,
    #[command(flatten)]
    acl: AclArgs,
    /// A server's HTTP address (repeatable): http://host:port, host:port,
    /// or https://host:port (with --tls-ca-file). Required, here or as a
    /// configuration file's `retry_join` (a host there means its port 8500).
    #[arg(long = "server")]
    servers: Vec<String>,
    #[command(flatten)]
    config: ConfigArgs,
    #[arg(long, default_value = cairn::server::DATACENTER, hide = true)]
    datacenter: String,
    /// The full anti-entropy period before scaling by cluster size
    /// (a Go duration; default 1m).
    #[arg(long, value_parser = parse_duration, default_value = "1m")]
    sync_interval: std::time::Duration,
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
    /// Answer blocking `/v1/health/service|connect` reads from views fed
    /// by one event stream per service (and token) instead of forwarding
    /// each to a server (Consul's `use_streaming_backend`).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    use_streaming_backend: bool,
}

/// A record TTL: a Go duration (0 allowed), in whole seconds.
fn parse_ttl(s: &str) -> Result<u32, String> {
    let d = cairn::structs::duration::Duration::parse(s)?;
    if d.nanos() < 0 {
        return Err("must not be negative".into());
    }
    u32::try_from(d.nanos() / 1_000_000_000).map_err(|_| "too long".into())
}

/// Where the HTTP API listens and the TLS flags: servers and agents take
/// the same, checked together.
#[derive(clap::Args)]
struct ListenArgs {
    /// The plain HTTP API's address; "" for none (HTTPS only).
    #[arg(long, default_value_t = cairn::server::HTTP_ADDR.to_string())]
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
struct AclArgs {
    /// Enforce ACLs (servers).
    #[arg(long)]
    acl_enabled: bool,
    /// What a token's rules do not decide (servers): allow or deny.
    #[arg(long, default_value = "allow", value_parser = str::parse::<cairn::acl::DefaultPolicy>)]
    acl_default_policy: cairn::acl::DefaultPolicy,
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
    fn tokens(&self) -> cairn::structs::acl::AgentTokens {
        cairn::structs::acl::AgentTokens {
            default: self.acl_token.clone().filter(|t| !t.is_empty()),
            agent: self.acl_agent_token.clone().filter(|t| !t.is_empty()),
        }
    }

    fn server(&self) -> cairn::state::token_resolver::AclConfig {
        cairn::state::token_resolver::AclConfig {
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
    fn files(&self) -> anyhow::Result<Option<cairn::tls::Tls>> {
        match (&self.tls_ca_file, &self.tls_cert_file, &self.tls_key_file) {
            (None, None, None) => {
                anyhow::ensure!(
                    self.https_addr.is_none() && !self.tls_verify_incoming,
                    "--https-addr and --tls-verify-incoming need --tls-ca-file, --tls-cert-file and --tls-key-file"
                );
                Ok(None)
            }
            (Some(ca), Some(cert), Some(key)) => Ok(Some(cairn::tls::Tls::load(ca, cert, key)?)),
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

/// Whether the user gave this flag (on the command line or through its
/// environment variable): then it wins over the configuration files.
fn given(m: &ArgMatches, id: &str) -> bool {
    matches!(
        m.value_source(id),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    )
}

/// `$dst` takes the file's value unless flag `$id` was given.
macro_rules! from_file {
    ($m:expr, $id:literal, $dst:expr, $src:expr) => {
        if !given($m, $id)
            && let Some(v) = $src
        {
            $dst = v;
        }
    };
}

/// `enable_script_checks`, `enable_local_script_checks` from the files,
/// unless a flag said them.
fn apply_checks(m: &ArgMatches, f: &FileConfig, c: &mut ChecksArgs) {
    from_file!(
        m,
        "enable_script_checks",
        c.enable_script_checks,
        f.enable_script_checks
    );
    from_file!(
        m,
        "enable_local_script_checks",
        c.enable_local_script_checks,
        f.enable_local_script_checks
    );
}

/// `ui_config { enabled, dir }` from the files, unless a flag said it.
fn apply_ui(m: &ArgMatches, f: &FileConfig, ui: &mut UiArgs) {
    from_file!(m, "ui", ui.ui, f.ui_enabled);
    from_file!(m, "ui_dir", ui.ui_dir, f.ui_dir.clone().map(Some));
}

fn load_files(c: &ConfigArgs) -> anyhow::Result<FileConfig> {
    FileConfig::load(&c.sources()).map_err(|e| anyhow::anyhow!(e.0))
}

/// One line per configuration key cairn does not use (once logging runs).
fn warn_unused(f: &FileConfig) {
    for (key, file) in &f.unused {
        tracing::warn!(key = %key, file = %file.display(), "configuration key not used by cairn: ignored");
    }
}

/// What servers and agents take alike from the files: listeners, TLS,
/// their tokens, logging.
fn apply_common(
    m: &ArgMatches, f: &FileConfig, listen: &mut ListenArgs, acl: &mut AclArgs, dns: &mut DnsArgs,
    log: (&mut String, &mut bool),
) -> anyhow::Result<()> {
    from_file!(
        m,
        "http_addr",
        listen.http_addr,
        f.listen(&f.addresses.http, f.ports.http, 8500)
    );
    if !given(m, "advertise")
        && let Some(ip) = &f.advertise_addr
    {
        listen.advertise = Some(
            ip.parse()
                .map_err(|e| anyhow::anyhow!("advertise_addr {ip:?}: {e}"))?,
        );
    }
    if !given(m, "https_addr") && f.ports.https.is_some_and(|p| p > 0) {
        let addr = f
            .listen(&f.addresses.https, f.ports.https, 8501)
            .unwrap_or_default();
        listen.https_addr = Some(
            addr.parse()
                .map_err(|e| anyhow::anyhow!("addresses.https {addr:?}: {e}"))?,
        );
    }
    from_file!(
        m,
        "dns_addr",
        dns.dns_addr,
        f.listen(&f.addresses.dns, f.ports.dns, 8600)
    );
    from_file!(
        m,
        "tls_ca_file",
        listen.tls_ca_file,
        f.tls_ca_file.clone().map(Some)
    );
    from_file!(
        m,
        "tls_cert_file",
        listen.tls_cert_file,
        f.tls_cert_file.clone().map(Some)
    );
    from_file!(
        m,
        "tls_key_file",
        listen.tls_key_file,
        f.tls_key_file.clone().map(Some)
    );
    from_file!(
        m,
        "tls_verify_incoming",
        listen.tls_verify_incoming,
        f.tls_verify_incoming
    );
    from_file!(
        m,
        "acl_token",
        acl.acl_token,
        f.token_default.clone().map(Some)
    );
    from_file!(
        m,
        "acl_agent_token",
        acl.acl_agent_token,
        f.token_agent.clone().map(Some)
    );
    from_file!(m, "log_level", *log.0, f.log_level.clone());
    from_file!(m, "log_json", *log.1, f.log_json);
    Ok(())
}

/// A server's flags over its configuration files.
fn apply_server(m: &ArgMatches, f: &FileConfig, a: &mut ServerArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        f.server != Some(false),
        "the configuration says server = false: a client agent is `cairn agent`"
    );
    apply_common(
        m,
        f,
        &mut a.listen,
        &mut a.acl,
        &mut a.dns,
        (&mut a.log_level, &mut a.log_json),
    )?;
    apply_ui(m, f, &mut a.ui);
    apply_checks(m, f, &mut a.checks);
    from_file!(m, "node", a.node, f.node_name.clone().map(Some));
    from_file!(m, "data_dir", a.data_dir, f.data_dir.clone().map(Some));
    from_file!(m, "datacenter", a.datacenter, f.datacenter.clone());
    from_file!(
        m,
        "primary_datacenter",
        a.primary_datacenter,
        f.primary_datacenter.clone().map(Some)
    );
    from_file!(
        m,
        "bootstrap_expect",
        a.bootstrap_expect,
        f.bootstrap_expect
    );
    from_file!(m, "encrypt", a.encrypt, f.encrypt.clone().map(Some));
    from_file!(
        m,
        "http_max_conns_per_client",
        a.http_max_conns_per_client,
        f.http_max_conns_per_client
    );
    from_file!(
        m,
        "grpc_addr",
        a.grpc_addr,
        f.listen(&f.addresses.grpc, f.ports.grpc, 8502)
    );
    let server_port = f.ports.server.unwrap_or(8300);
    if !given(m, "raft_addr") && (f.bind_addr.is_some() || f.ports.server.is_some()) {
        let bind = f.bind_addr.as_deref().unwrap_or("127.0.0.1");
        let addr = cairn::config_file::join_host_port(bind, server_port);
        a.raft_addr = addr
            .parse()
            .map_err(|e| anyhow::anyhow!("bind_addr {bind:?}: {e}"))?;
    }
    // retry_join names servers; one without a port is at the server port.
    if !given(m, "join") && !f.retry_join.is_empty() {
        a.join = f
            .retry_join
            .iter()
            .map(|h| with_port(h, server_port))
            .collect();
    }
    if !given(m, "join_wan") && !f.retry_join_wan.is_empty() {
        a.join_wan = f
            .retry_join_wan
            .iter()
            .map(|h| with_port(h, server_port))
            .collect();
    }
    from_file!(m, "acl_enabled", a.acl.acl_enabled, f.acl_enabled);
    if !given(m, "acl_default_policy")
        && let Some(p) = &f.acl_default_policy
    {
        a.acl.acl_default_policy = p
            .parse()
            .map_err(|e| anyhow::anyhow!("acl.default_policy {p:?}: {e}"))?;
    }
    from_file!(
        m,
        "acl_initial_management_token",
        a.acl.acl_initial_management_token,
        f.token_initial_management.clone().map(Some)
    );
    from_file!(
        m,
        "acl_replication_token",
        a.acl.acl_replication_token,
        f.tokens_other.get("replication").cloned().map(Some)
    );
    Ok(())
}

/// A client agent's flags over its configuration files. Its ACL block's
/// `enabled` and `default_policy` are the servers' business.
fn apply_agent(m: &ArgMatches, f: &FileConfig, a: &mut AgentArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        f.server != Some(true),
        "the configuration says server = true: a server is `cairn server`"
    );
    apply_common(
        m,
        f,
        &mut a.listen,
        &mut a.acl,
        &mut a.dns,
        (&mut a.log_level, &mut a.log_json),
    )?;
    apply_ui(m, f, &mut a.ui);
    apply_checks(m, f, &mut a.checks);
    from_file!(m, "node", a.node, f.node_name.clone().map(Some));
    from_file!(m, "data_dir", a.data_dir, f.data_dir.clone().map(Some));
    from_file!(m, "datacenter", a.datacenter, f.datacenter.clone());
    from_file!(
        m,
        "use_streaming_backend",
        a.use_streaming_backend,
        f.use_streaming_backend
    );
    // An agent talks to servers' HTTP API: a retry_join host means its
    // port 8500.
    if !given(m, "servers") && !f.retry_join.is_empty() {
        a.servers = f.retry_join.iter().map(|h| with_port(h, 8500)).collect();
    }
    Ok(())
}

/// `host` with `port` unless it names one.
fn with_port(host: &str, port: i64) -> String {
    let has_port = match host.rsplit_once(':') {
        Some((h, p)) => p.parse::<u16>().is_ok() && (!h.contains(':') || h.ends_with(']')),
        None => false,
    };
    if has_port {
        host.to_string()
    } else {
        cairn::config_file::join_host_port(host, port)
    }
}

/// `cairn validate`: the files (or directories) read as a start reads
/// them, service and check definitions included.
fn validate(paths: &[PathBuf]) -> anyhow::Result<()> {
    let (dirs, files) = paths.iter().cloned().partition(|p| p.is_dir());
    let sources = cairn::config_file::Sources { files, dirs };
    let f = FileConfig::load(&sources).map_err(|e| anyhow::anyhow!(e.0))?;
    cairn::agent::config_files(&sources, "validate")?;
    for (key, file) in &f.unused {
        println!("{}: {key}: not used by cairn", file.display());
    }
    println!("Configuration is valid!");
    Ok(())
}

/// A duration flag: parsed as a Go duration, its default shown as one.
#[derive(Clone, Copy, Debug)]
struct FlagDuration(std::time::Duration);

impl std::fmt::Display for FlagDuration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nanos = i64::try_from(self.0.as_nanos()).unwrap_or(i64::MAX);
        cairn::structs::duration::Duration(nanos).fmt(f)
    }
}

fn parse_flag_duration(s: &str) -> Result<FlagDuration, String> {
    parse_duration(s).map(FlagDuration)
}

fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let d = cairn::structs::duration::Duration::parse(s)?;
    if d.nanos() <= 0 {
        return Err("must be positive".into());
    }
    Ok(std::time::Duration::from_nanos(d.nanos() as u64))
}

fn init_logging(level: &str, json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!("{level},openraft=warn,sled=warn"))
    });
    // Colour only on a terminal: logs sent to a file or a pipe stay plain
    // text, as Consul's.
    use std::io::IsTerminal;
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let stderr = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let stderr = if json {
        stderr.json().boxed()
    } else {
        stderr.boxed()
    };
    // Each with its own filter: `/v1/agent/monitor` may ask for lines
    // stderr does not show.
    tracing_subscriber::registry()
        .with(stderr.with_filter(filter))
        .with(cairn::monitor::layer())
        .init();
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "cairn".into())
}

fn main() -> anyhow::Result<()> {
    let matches = Cli::command().get_matches_from(cairn::cli::go_style_args(std::env::args()));
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let sub = |name: &str| {
        matches
            .subcommand_matches(name)
            .cloned()
            .unwrap_or_default()
    };
    // ring for any rustls client built without a config of ours.
    cairn::tls::install_default_provider();
    match cli.command {
        Command::Cli(cmd) => std::process::exit(cairn::cli::run(cmd, inspect_snapshot, cli.token)),
        Command::Keygen => {
            println!("{}", cairn::raft::encrypt::EncryptKey::generate()?);
            Ok(())
        }
        Command::Validate { paths } => {
            if let Err(e) = validate(&paths) {
                eprintln!("Config validation failed: {e:#}");
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Version => {
            use cairn::structs::agent::{CONSUL_VERSION, VERSION_METADATA};
            println!("cairn v{}", env!("CARGO_PKG_VERSION"));
            println!("Consul API v{CONSUL_VERSION} ({VERSION_METADATA})");
            Ok(())
        }
        Command::Debug(DebugCmd::DataDir { dir }) => {
            let (lines, ok) = cairn::raft::inspect::inspect_data_dir(&dir);
            for l in lines {
                println!("{l}");
            }
            std::process::exit(if ok { 0 } else { 1 })
        }
        Command::Agent(a) => {
            let mut a = *a;
            let file = load_files(&a.config)?;
            apply_agent(&sub("agent"), &file, &mut a)?;
            init_logging(&a.log_level, a.log_json);
            warn_unused(&file);
            a.acl.agent_only()?;
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
                .map(|s| cairn::cli::normalize_addr(s).map_err(|e| anyhow::anyhow!(e.0)))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let flags = &a.listen;
            let (plain, http_addr) = flags.addrs()?;
            let files = flags.files()?;
            let tls = match (&a.listen.tls_ca_file, &files) {
                (_, Some(f)) => Some(std::sync::Arc::new(cairn::agent::AgentTls {
                    client: f.client()?,
                    https: match a.listen.https_addr {
                        Some(addr) => Some((addr, f.https_server(a.listen.tls_verify_incoming)?)),
                        None => None,
                    },
                    http_off: plain.is_none(),
                })),
                // A CA alone: HTTPS to servers, no certificate of its own.
                (Some(ca), None) => Some(std::sync::Arc::new(cairn::agent::AgentTls {
                    client: cairn::tls::client_config(ca, None)?,
                    https: None,
                    http_off: false,
                })),
                (None, None) => None,
            };
            let config = cairn::agent::AgentConfig {
                node: a.node.unwrap_or_else(hostname),
                data_dir,
                http_addr,
                advertise: a.listen.advertise,
                servers,
                ui: a.ui.config(false),
                config_sources: a.config.sources(),
                sync_interval: a.sync_interval,
                datacenter: a.datacenter.clone(),
                primary_datacenter: String::new(),
                in_server: false,
                ports: Default::default(),
                tls,
                tokens: a.acl.tokens(),
                blocking: cairn::request::serve::Blocking::new(
                    cairn::request::serve::HttpLimits::default().max_blocking,
                ),
                streaming_backend: a.use_streaming_backend,
                script_checks: a.checks.config(),
            };
            let dns = a.dns.config()?;
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(cairn::process::run_agent(config, dns))
        }
        Command::Server(a) => {
            let mut a = *a;
            let file = load_files(&a.config)?;
            apply_server(&sub("server"), &file, &mut a)?;
            init_logging(&a.log_level, a.log_json);
            warn_unused(&file);
            let encrypt = a
                .encrypt
                .as_deref()
                .map(cairn::raft::encrypt::EncryptKey::parse)
                .transpose()?;
            let limits = server_limits(&a);
            let (data_dir, _tmp) = match (a.dev, a.data_dir) {
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
            let flags = &a.listen;
            let (plain, http_addr) = flags.addrs()?;
            let tls = match flags.files()? {
                Some(files) => Some(std::sync::Arc::new(cairn::server::ServerTls {
                    files,
                    https_addr: a.listen.https_addr,
                    verify_incoming: a.listen.tls_verify_incoming,
                    http_off: plain.is_none(),
                    domain: cairn::tls::tls_domain(&a.dns.domain.to_string()),
                })),
                None => {
                    // A CA alone means nothing to a server: it needs its
                    // own certificate for HTTPS and the Raft port.
                    anyhow::ensure!(
                        a.listen.tls_ca_file.is_none(),
                        "a server needs --tls-cert-file and --tls-key-file with --tls-ca-file"
                    );
                    None
                }
            };
            let config = cairn::server::ServerConfig {
                node: a.node.unwrap_or_else(hostname),
                datacenter: a.datacenter,
                data_dir,
                http_addr,
                raft_addr: a.raft_addr,
                advertise: a.listen.advertise,
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
                acl: a.acl.server(),
                agent_tokens: a.acl.tokens(),
                acl_replication_token: a
                    .acl
                    .acl_replication_token
                    .clone()
                    .filter(|t| !t.is_empty()),
                ui: a.ui.config(a.dev),
                config_sources: a.config.sources(),
                script_checks: a.checks.config(),
            };
            let dns = a.dns.config()?;
            let grpc = if a.grpc_addr.trim().is_empty() {
                None
            } else {
                Some(cairn::http::grpc::GrpcConfig {
                    addr: a
                        .grpc_addr
                        .parse::<SocketAddr>()
                        .map_err(|e| anyhow::anyhow!("--grpc-addr {:?}: {e}", a.grpc_addr))?,
                    xds: cairn::xds::Limits {
                        max_streams: a.grpc_max_streams,
                        max_anonymous: a.xds_max_anonymous_streams,
                        first_request: a.xds_first_request_timeout.0,
                        ..Default::default()
                    },
                    max_conns: a.grpc_max_conns,
                })
            };
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(cairn::process::run_server(config, dns, grpc))
        }
    }
}

fn server_limits(a: &ServerArgs) -> cairn::server::Limits {
    let mut l = cairn::server::Limits::default();
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
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The CLI's view of a snapshot file, read by the raft layer (the CLI sits
/// below it and cannot read one itself).
fn inspect_snapshot(bytes: &[u8]) -> Result<cairn::cli::snapshot::Inspection, String> {
    let framed =
        cairn::raft::snapshot_archive::unwrap(bytes, cairn::raft::snapshot_archive::MAX_STATE)
            .map_err(|e| e.to_string())?;
    let c = cairn::raft::snapshot_file::inspect(&framed)?;
    Ok(cairn::cli::snapshot::Inspection {
        index: c.index,
        term: c.term,
        tables: c.tables,
    })
}
