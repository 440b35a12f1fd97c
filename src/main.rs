//! The `cairn` binary: a server, a client agent, or a CLI command.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

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
}

#[derive(Subcommand)]
enum Command {
    /// Run a server.
    Server(ServerArgs),
    /// Commands against a server's HTTP API (see `cairn::cli`).
    #[command(flatten)]
    Cli(cairn::cli::CliCommand),
}

#[derive(clap::Args)]
struct ServerArgs {
    /// One server with its data in a fresh temporary directory.
    #[arg(long)]
    dev: bool,
    #[arg(long)]
    node: Option<String>,
    #[arg(long)]
    data_dir: Option<PathBuf>,
    #[arg(long, default_value = "127.0.0.1:8500")]
    http_addr: SocketAddr,
    #[arg(long, default_value = "127.0.0.1:8300")]
    raft_addr: SocketAddr,
    #[arg(long, default_value = "dc1")]
    datacenter: String,
    #[arg(long, default_value_t = 0)]
    bootstrap_expect: usize,
    /// Another server's --raft-addr (repeatable).
    #[arg(long)]
    join: Vec<String>,
    /// Snapshot the state and compact the Raft log after this many entries.
    #[arg(long, default_value_t = 16_384, hide = true)]
    raft_snapshot_threshold: u64,
    #[arg(long, default_value = "info")]
    log_level: String,
    #[arg(long)]
    log_json: bool,
}

fn init_logging(level: &str, json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!("{level},openraft=warn,sled=warn"))
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "cairn".into())
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse_from(cairn::cli::go_style_args(std::env::args()));
    match cli.command {
        Command::Cli(cmd) => std::process::exit(cairn::cli::run(cmd)),
        Command::Server(a) => {
            init_logging(&a.log_level, a.log_json);
            let (data_dir, _tmp) = match (a.dev, a.data_dir) {
                (_, Some(d)) => (d, None),
                (true, None) => {
                    let tmp =
                        std::env::temp_dir().join(format!("cairn-dev-{}", std::process::id()));
                    (tmp.clone(), Some(TempDir(tmp)))
                }
                (false, None) => anyhow::bail!("--data-dir is required (or use --dev)"),
            };
            let config = cairn::server::ServerConfig {
                node: a.node.unwrap_or_else(hostname),
                datacenter: a.datacenter,
                data_dir,
                http_addr: a.http_addr,
                raft_addr: a.raft_addr,
                bootstrap_expect: a.bootstrap_expect,
                join: a.join,
                snapshot_threshold: a.raft_snapshot_threshold,
            };
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(cairn::server::run(config))
        }
    }
}

/// The dev server's data dir, removed when the server stops.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
