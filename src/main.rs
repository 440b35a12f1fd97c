//! The `cairn` binary: a server, a client agent, or a CLI command, only
//! dispatch (the flags and their merge over the configuration files are
//! `cairn::flags`'s). stderr's log layer and `monitor`'s each have their
//! own filter.

use std::path::PathBuf;

use cairn::config_file::FileConfig;
use cairn::flags::{self, AgentArgs, ServerArgs};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

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
    /// Capture a live bundle of the agent's state, metrics, logs and
    /// profiles for a bug report, as `consul debug` (`data-dir`: inspect a
    /// stopped server's data dir instead).
    Debug(DebugCommand),
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

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
struct DebugCommand {
    #[command(subcommand)]
    cmd: Option<DebugCmd>,
    #[command(flatten)]
    bundle: cairn::cli::debug::DebugArgs,
}

#[derive(Subcommand)]
enum DebugCmd {
    /// Checks every Raft log segment, the snapshot file and the state's
    /// format version without changing anything; exits 1 if a start would
    /// refuse.
    DataDir { dir: PathBuf },
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
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    };
    match cli.command {
        Command::Cli(cmd) => {
            let snapshots = cairn::cli::snapshot::Readers {
                inspect: inspect_snapshot,
                decode: decode_snapshot,
            };
            std::process::exit(cairn::cli::run(cmd, snapshots, cli.token))
        }
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
        Command::Debug(DebugCommand {
            cmd: Some(DebugCmd::DataDir { dir }),
            ..
        }) => {
            let (lines, ok) = cairn::raft::inspect::inspect_data_dir(&dir);
            for l in lines {
                println!("{l}");
            }
            std::process::exit(if ok { 0 } else { 1 })
        }
        Command::Debug(DebugCommand { cmd: None, bundle }) => {
            std::process::exit(cairn::cli::run_debug(bundle, cli.token))
        }
        Command::Agent(a) => {
            let (a, file) = a.merged(&sub("agent"))?;
            let (level, json) = a.log();
            init_logging(level, json);
            flags::warn_unused(&file);
            let (config, dns) = a.start()?;
            runtime()?.block_on(cairn::process::run_agent(config, dns))
        }
        Command::Server(a) => {
            let (a, file) = a.merged(&sub("server"))?;
            let (level, json) = a.log();
            init_logging(level, json);
            flags::warn_unused(&file);
            let start = a.start()?;
            // Kept until the server stops: its drop removes a dev data dir.
            let _dev_dir = start.dev_dir;
            runtime()?.block_on(cairn::process::run_server(
                start.config,
                start.dns,
                start.grpc,
            ))
        }
    }
}

/// A snapshot file's records for `cairn snapshot decode`, read by the raft
/// layer.
fn decode_snapshot(
    bytes: &[u8], each: &mut dyn FnMut(&str, serde_json::Value),
) -> Result<(), String> {
    let framed =
        cairn::raft::snapshot_archive::unwrap(bytes, cairn::raft::snapshot_archive::MAX_STATE)
            .map_err(|e| e.to_string())?;
    cairn::raft::snapshot_file::decode(&framed, each)
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
