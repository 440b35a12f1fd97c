//! The flags over the configuration files: a flag given on the command
//! line or through its environment variable wins; else a file's value;
//! else the flag's default. One `apply_*` per process kind, the keys both
//! take in `apply_common`.

use clap::ArgMatches;
use clap::parser::ValueSource;

use super::{AgentArgs, ChecksArgs, CommonArgs, ServerArgs, UiArgs};
use crate::config_file::FileConfig;

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

/// What servers and agents take alike from the files: listeners, TLS,
/// their tokens, logging, the UI and script checks.
fn apply_common(m: &ArgMatches, f: &FileConfig, c: &mut CommonArgs) -> anyhow::Result<()> {
    from_file!(
        m,
        "http_addr",
        c.listen.http_addr,
        f.listen(&f.addresses.http, f.ports.http, 8500)
    );
    if !given(m, "advertise")
        && let Some(ip) = &f.advertise_addr
    {
        c.listen.advertise = Some(
            ip.parse()
                .map_err(|e| anyhow::anyhow!("advertise_addr {ip:?}: {e}"))?,
        );
    }
    if !given(m, "https_addr") && f.ports.https.is_some_and(|p| p > 0) {
        let addr = f
            .listen(&f.addresses.https, f.ports.https, 8501)
            .unwrap_or_default();
        c.listen.https_addr = Some(
            addr.parse()
                .map_err(|e| anyhow::anyhow!("addresses.https {addr:?}: {e}"))?,
        );
    }
    from_file!(
        m,
        "dns_addr",
        c.dns.dns_addr,
        f.listen(&f.addresses.dns, f.ports.dns, 8600)
    );
    from_file!(
        m,
        "tls_ca_file",
        c.listen.tls_ca_file,
        f.tls_ca_file.clone().map(Some)
    );
    from_file!(
        m,
        "tls_cert_file",
        c.listen.tls_cert_file,
        f.tls_cert_file.clone().map(Some)
    );
    from_file!(
        m,
        "tls_key_file",
        c.listen.tls_key_file,
        f.tls_key_file.clone().map(Some)
    );
    from_file!(
        m,
        "tls_verify_incoming",
        c.listen.tls_verify_incoming,
        f.tls_verify_incoming
    );
    from_file!(
        m,
        "acl_token",
        c.acl.acl_token,
        f.token_default.clone().map(Some)
    );
    from_file!(
        m,
        "acl_agent_token",
        c.acl.acl_agent_token,
        f.token_agent.clone().map(Some)
    );
    from_file!(m, "log_level", c.log_level, f.log_level.clone());
    from_file!(m, "log_json", c.log_json, f.log_json);
    apply_ui(m, f, &mut c.ui);
    apply_checks(m, f, &mut c.checks);
    Ok(())
}

/// A server's flags over its configuration files.
pub(super) fn apply_server(
    m: &ArgMatches, f: &FileConfig, a: &mut ServerArgs,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        f.server != Some(false),
        "the configuration says server = false: a client agent is `cairn agent`"
    );
    apply_common(m, f, &mut a.common)?;
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
    from_file!(m, "enable_debug", a.enable_debug, f.enable_debug);
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
        let addr = crate::config_file::join_host_port(bind, server_port);
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
    from_file!(m, "acl_enabled", a.common.acl.acl_enabled, f.acl_enabled);
    if !given(m, "acl_default_policy")
        && let Some(p) = &f.acl_default_policy
    {
        a.common.acl.acl_default_policy = p
            .parse()
            .map_err(|e| anyhow::anyhow!("acl.default_policy {p:?}: {e}"))?;
    }
    from_file!(
        m,
        "acl_initial_management_token",
        a.common.acl.acl_initial_management_token,
        f.token_initial_management.clone().map(Some)
    );
    from_file!(
        m,
        "acl_replication_token",
        a.common.acl.acl_replication_token,
        f.tokens_other.get("replication").cloned().map(Some)
    );
    Ok(())
}

/// A client agent's flags over its configuration files. Its ACL block's
/// `enabled` and `default_policy` are the servers' business.
pub(super) fn apply_agent(m: &ArgMatches, f: &FileConfig, a: &mut AgentArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        f.server != Some(true),
        "the configuration says server = true: a server is `cairn server`"
    );
    apply_common(m, f, &mut a.common)?;
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
        crate::config_file::join_host_port(host, port)
    }
}

#[cfg(test)]
mod tests {
    use clap::{Args, FromArgMatches};

    use super::super::{AgentArgs, ServerArgs};

    /// `flags` parsed as `cairn <kind>` would, merged over a file holding
    /// `hcl` (none: no file).
    fn merged<A: Args + FromArgMatches>(
        kind: &str, hcl: Option<&str>, flags: &[&str],
        merge: impl Fn(&clap::ArgMatches, A) -> anyhow::Result<A>,
    ) -> anyhow::Result<A> {
        let dir = tempfile::tempdir().unwrap();
        let mut argv = vec![kind.to_string()];
        if let Some(hcl) = hcl {
            let file = dir.path().join("c.hcl");
            std::fs::write(&file, hcl).unwrap();
            argv.extend(["--config-file".to_string(), file.display().to_string()]);
        }
        argv.extend(flags.iter().map(|f| f.to_string()));
        let m = A::augment_args(clap::Command::new("cairn")).try_get_matches_from(argv)?;
        let a = A::from_arg_matches(&m)?;
        merge(&m, a)
    }

    fn server(hcl: Option<&str>, flags: &[&str]) -> anyhow::Result<ServerArgs> {
        merged("server", hcl, flags, |m, a: ServerArgs| Ok(a.merged(m)?.0))
    }

    fn agent(hcl: Option<&str>, flags: &[&str]) -> anyhow::Result<AgentArgs> {
        merged("agent", hcl, flags, |m, a: AgentArgs| Ok(a.merged(m)?.0))
    }

    /// A flag given wins over the file, even with its default's value; the
    /// file wins over a flag's default; neither: the default.
    #[test]
    fn flags_given_win_files_beat_defaults() {
        type Case = (Option<&'static str>, &'static [&'static str], &'static str);
        let datacenter: &[Case] = &[
            (None, &[], "dc1"),
            (Some(r#"datacenter = "east""#), &[], "east"),
            (
                Some(r#"datacenter = "east""#),
                &["--datacenter", "west"],
                "west",
            ),
            (
                Some(r#"datacenter = "east""#),
                &["--datacenter", "dc1"],
                "dc1",
            ),
            (None, &["--datacenter", "west"], "west"),
        ];
        for (hcl, flags, want) in datacenter {
            let a = server(*hcl, flags).unwrap();
            assert_eq!(a.datacenter, *want, "{hcl:?} {flags:?}");
        }
        let http: &[Case] = &[
            (None, &[], "127.0.0.1:8500"),
            (Some("ports { http = 9500 }"), &[], "127.0.0.1:9500"),
            (
                Some("ports { http = 9500 }"),
                &["--http-addr", "127.0.0.1:7500"],
                "127.0.0.1:7500",
            ),
            (
                Some(r#"addresses { http = "0.0.0.0" }"#),
                &[],
                "0.0.0.0:8500",
            ),
        ];
        for (hcl, flags, want) in http {
            let a = server(*hcl, flags).unwrap();
            assert_eq!(a.common.listen.http_addr, *want, "{hcl:?} {flags:?}");
            let a = agent(*hcl, flags).unwrap();
            assert_eq!(a.common.listen.http_addr, *want, "agent {hcl:?} {flags:?}");
        }
        let level: &[Case] = &[
            (None, &[], "info"),
            (Some(r#"log_level = "debug""#), &[], "debug"),
            (
                Some(r#"log_level = "debug""#),
                &["--log-level", "warn"],
                "warn",
            ),
        ];
        for (hcl, flags, want) in level {
            assert_eq!(server(*hcl, flags).unwrap().log().0, *want);
            assert_eq!(agent(*hcl, flags).unwrap().log().0, *want);
        }
    }

    /// The keys both kinds take once (`apply_common`): the UI and script
    /// checks too, for servers and agents alike.
    #[test]
    fn ui_and_script_checks_come_from_the_files_for_both_kinds() {
        let hcl = "ui_config { enabled = true }\nenable_local_script_checks = true";
        let s = server(Some(hcl), &[]).unwrap();
        let a = agent(Some(hcl), &[]).unwrap();
        for c in [&s.common, &a.common] {
            assert!(c.ui.ui);
            assert!(c.checks.enable_local_script_checks);
            assert!(!c.checks.enable_script_checks);
        }
    }

    /// `retry_join` names servers at their server port (8300, or the
    /// file's `ports.server`) for a server, their HTTP port for an agent; a
    /// `--join` flag replaces them.
    #[test]
    fn retry_join_is_a_servers_join_and_an_agents_servers() {
        let hcl = r#"retry_join = ["10.0.0.1", "10.0.0.2:9000"]"#;
        assert_eq!(
            server(Some(hcl), &[]).unwrap().join,
            ["10.0.0.1:8300", "10.0.0.2:9000"]
        );
        let with_port = format!("{hcl}\nports {{ server = 9300 }}");
        assert_eq!(
            server(Some(&with_port), &[]).unwrap().join,
            ["10.0.0.1:9300", "10.0.0.2:9000"]
        );
        assert_eq!(
            server(Some(hcl), &["--join", "10.9.9.9:8300"])
                .unwrap()
                .join,
            ["10.9.9.9:8300"]
        );
        assert_eq!(
            agent(Some(hcl), &[]).unwrap().servers,
            ["10.0.0.1:8500", "10.0.0.2:9000"]
        );
    }

    /// A file for the other kind is refused by name.
    #[test]
    fn a_file_for_the_other_kind_is_refused() {
        let e = server(Some("server = false"), &[]).err().unwrap();
        assert!(e.to_string().contains("cairn agent"), "{e}");
        let e = agent(Some("server = true"), &[]).err().unwrap();
        assert!(e.to_string().contains("cairn server"), "{e}");
    }
}
