//! `cairn connect ca get-config|set-config`, `cairn connect expose` (a
//! service behind an ingress gateway, as Consul's) and `cairn connect
//! envoy`: Envoy run (exec'd) for a sidecar with its bootstrap, or with
//! `-bootstrap` the bootstrap printed, as `consul connect envoy` (node id =
//! the proxy's service ID, one static cluster to the agent's gRPC port, ADS
//! over Delta gRPC with the token as `x-consul-token`); `cairn connect
//! grpc-bootstrap -service ID`:
//! the xDS bootstrap of a proxyless gRPC client (node id = the service
//! instance it is: the agent's, else a catalog instance, agentless, with
//! `-node` to choose among nodes; the server's gRPC port with `xds_v3`, the
//! token in the node's metadata, since gRPC's bootstrap sets no call
//! metadata).

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::{CliError, CliResult, Client, enc, env_var, print_json};

#[derive(Subcommand, Debug)]
pub enum ConnectCmd {
    /// The Connect CA's configuration.
    #[command(subcommand)]
    Ca(CaCmd),
    /// Run Envoy for a sidecar, reading its bootstrap (-bootstrap: print
    /// the bootstrap instead).
    Envoy(EnvoyArgs),
    /// Print the xDS bootstrap of a proxyless gRPC client (its
    /// GRPC_XDS_BOOTSTRAP file).
    GrpcBootstrap(GrpcBootstrapArgs),
    /// Expose a service through an ingress gateway: a listener on -port
    /// for it in the gateway's config entry, and an intention allowing the
    /// gateway to connect.
    Expose(ExposeArgs),
}

#[derive(Args, Debug)]
pub struct ExposeArgs {
    /// The ingress gateway service to use.
    #[arg(long, default_value = "")]
    ingress_gateway: String,
    /// The service to expose.
    #[arg(long, default_value = "")]
    service: String,
    /// The gateway's listener port for the service.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// The listener's protocol.
    #[arg(long, default_value = "tcp")]
    protocol: String,
    /// A DNS name routed to the service (repeatable).
    #[arg(long)]
    host: Vec<String>,
}

#[derive(Args, Debug)]
pub struct GrpcBootstrapArgs {
    /// The service instance the client is: its ID, or its service's name
    /// when one instance has it (on the agent, else in the catalog: an
    /// agentless instance).
    #[arg(long)]
    service: String,
    /// The node of a catalog instance, where several nodes have one.
    #[arg(long)]
    node: Option<String>,
    /// The xDS server (default: the agent's gRPC port on 127.0.0.1, or
    /// CONSUL_GRPC_ADDR; `https://` for a TLS port).
    #[arg(long)]
    grpc_addr: Option<String>,
    /// The CA that signed the gRPC port's certificate (a TLS port); also
    /// CONSUL_GRPC_CACERT, then CONSUL_CACERT.
    #[arg(long)]
    grpc_ca_file: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum CaCmd {
    /// Print the CA configuration (JSON).
    GetConfig,
    /// Replace the CA configuration with the JSON in -config-file.
    SetConfig(SetConfig),
}

#[derive(Args, Debug)]
pub struct SetConfig {
    #[arg(long)]
    config_file: String,
}

#[derive(Args, Debug)]
pub struct EnvoyArgs {
    /// Print the bootstrap instead of running Envoy.
    #[arg(long)]
    bootstrap: bool,
    /// The Envoy binary to run (default: `envoy` on the PATH).
    #[arg(long)]
    envoy_binary: Option<std::path::PathBuf>,
    /// The ID of the service whose sidecar this is (found in the agent's
    /// services).
    #[arg(long)]
    sidecar_for: Option<String>,
    /// The proxy's own service ID, instead of -sidecar-for.
    #[arg(long)]
    proxy_id: Option<String>,
    /// Envoy's admin listener.
    #[arg(long, default_value = "localhost:19000")]
    admin_bind: String,
    /// The xDS server (default: the agent's gRPC port on 127.0.0.1, or
    /// CONSUL_GRPC_ADDR).
    #[arg(long)]
    grpc_addr: Option<String>,
    /// The CA that signed the gRPC port's certificate (a TLS port); also
    /// CONSUL_GRPC_CACERT, then CONSUL_CACERT.
    #[arg(long)]
    grpc_ca_file: Option<String>,
    /// Arguments for Envoy itself, after `--`.
    #[arg(last = true)]
    envoy_args: Vec<String>,
}

pub fn run(c: &Client, cmd: ConnectCmd, token: Option<String>) -> CliResult {
    match cmd {
        ConnectCmd::Ca(CaCmd::GetConfig) => {
            let v = c
                .get_json("/v1/connect/ca/configuration")
                .map_err(|e| CliError(format!("Error request CA configuration: {}", e.0)))?;
            print_json(&v)
        }
        ConnectCmd::Ca(CaCmd::SetConfig(a)) => {
            let body = std::fs::read_to_string(&a.config_file)
                .map_err(|e| CliError(format!("Error reading config file: {e}")))?;
            serde_json::from_str::<Value>(&body)
                .map_err(|e| CliError(format!("Error parsing config file: {e}")))?;
            c.expect_ok(
                reqwest::Method::PUT,
                "/v1/connect/ca/configuration",
                Some(body),
            )
            .map_err(|e| CliError(format!("Error setting CA configuration: {}", e.0)))?;
            println!("Configuration updated!");
            Ok(())
        }
        ConnectCmd::Envoy(a) => {
            let b = envoy_bootstrap(c, &a, token)?;
            if a.bootstrap {
                return print_json(&b);
            }
            exec_envoy(&a, &b)
        }
        ConnectCmd::GrpcBootstrap(a) => print_json(&grpc_bootstrap(c, &a, token)?),
        ConnectCmd::Expose(a) => expose(c, a),
    }
}

/// `connect expose`, as Consul's: the service added to (or updated on) the
/// gateway's listener for the port, written check-and-set, then an allow
/// intention from the gateway unless one exists.
fn expose(c: &Client, a: ExposeArgs) -> CliResult {
    if a.service.is_empty() {
        return Err(CliError(
            "A service name must be given via the -service flag.".into(),
        ));
    }
    if a.ingress_gateway.is_empty() {
        return Err(CliError(
            "An ingress gateway service must be given via the -ingress-gateway flag.".into(),
        ));
    }
    if a.port == 0 {
        return Err(CliError(
            "A port must be provided via the -port flag.".into(),
        ));
    }
    let (gw, svc) = (&a.ingress_gateway, &a.service);
    let path = format!("/v1/config/ingress-gateway/{}", enc(gw));
    let r = c.send(reqwest::Method::GET, &path, None)?;
    let mut entry = match r.status {
        200 => r.json()?,
        404 => json!({"Kind": "ingress-gateway", "Name": gw}),
        st => {
            let e = super::unexpected(st, r.body.as_bytes());
            return Err(CliError(format!(
                "Error fetching existing ingress gateway configuration: {}",
                e.0
            )));
        }
    };
    let cas = entry["ModifyIndex"].as_u64().unwrap_or(0);
    let service = json!({"Name": svc, "Hosts": a.host});
    if !entry["Listeners"].is_array() {
        entry["Listeners"] = json!([]);
    }
    let listeners = entry["Listeners"].as_array_mut().expect("an array");
    match listeners
        .iter_mut()
        .find(|l| l["Port"].as_u64() == Some(u64::from(a.port)))
    {
        Some(l) => {
            let protocol = l["Protocol"].as_str().unwrap_or("tcp");
            if protocol != a.protocol {
                return Err(CliError(format!(
                    "Listener on port {} already configured with conflicting protocol {protocol:?}",
                    a.port
                )));
            }
            if !l["Services"].is_array() {
                l["Services"] = json!([]);
            }
            let services = l["Services"].as_array_mut().expect("an array");
            match services.iter_mut().find(|s| s["Name"] == json!(svc)) {
                Some(s) => {
                    println!(
                        "Updating service definition for {svc:?} on listener with port {}",
                        a.port
                    );
                    *s = service;
                }
                None => services.push(service),
            }
        }
        None => listeners.push(json!({
            "Port": a.port, "Protocol": a.protocol, "Services": [service],
        })),
    }
    let r = c
        .expect_ok(
            reqwest::Method::PUT,
            &format!("/v1/config?cas={cas}"),
            Some(entry.to_string()),
        )
        .map_err(|e| CliError(format!("Error writing ingress config entry: {}", e.0)))?;
    if r.body.trim() != "true" {
        return Err(CliError(
            "Ingress config entry was changed while attempting to update, please try again.".into(),
        ));
    }
    println!("Successfully updated config entry for ingress service {gw:?}");
    let exact = format!(
        "/v1/connect/intentions/exact?source={}&destination={}",
        enc(gw),
        enc(svc)
    );
    let r = c.send(reqwest::Method::GET, &exact, None)?;
    if r.status == 200 && r.json()?["Action"] == "allow" {
        println!("Intention already exists for {gw:?} -> {svc:?}");
        return Ok(());
    }
    c.expect_ok(
        reqwest::Method::PUT,
        &exact,
        Some(json!({"SourceType": "consul", "Action": "allow"}).to_string()),
    )
    .map_err(|e| CliError(format!("Error upserting intention: {}", e.0)))?;
    println!("Successfully set up intention for {gw:?} -> {svc:?}");
    Ok(())
}

/// Replaces this process with Envoy reading `bootstrap`, as Consul's
/// `connect envoy` does: the file (it holds the token) unlinked at once
/// and handed over open, as Envoy's stdin (`--config-path /dev/stdin`),
/// hot restart off unless Envoy's own arguments configure it.
fn exec_envoy(a: &EnvoyArgs, bootstrap: &Value) -> CliResult {
    use std::io::{Seek, Write};
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::process::CommandExt;
    let binary = match &a.envoy_binary {
        Some(b) => b.clone(),
        None => find_on_path("envoy").ok_or_else(|| {
            CliError(
                "Couldn't find envoy binary: exec: \"envoy\": executable file not found in $PATH"
                    .into(),
            )
        })?,
    };
    let wrote = |e: std::io::Error| {
        CliError(format!(
            "Could not write envoy bootstrap config to a temp file: {e}"
        ))
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let path = std::env::temp_dir().join(format!(
        "envoy-ephemeral-config-{}-{nanos}",
        std::process::id()
    ));
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(wrote)?;
    std::fs::remove_file(&path).map_err(wrote)?;
    file.write_all(serde_json::to_string(bootstrap)?.as_bytes())
        .map_err(wrote)?;
    file.rewind().map_err(wrote)?;
    let hot_restart = a.envoy_args.iter().any(|x| {
        [
            "--restart-epoch",
            "--hot-restart-version",
            "--drain-time-s",
            "--parent-shutdown-time-s",
        ]
        .iter()
        .any(|o| x == o || x.starts_with(&format!("{o}=")))
    });
    let mut cmd = std::process::Command::new(&binary);
    cmd.arg("--config-path").arg("/dev/stdin").stdin(file);
    if !hot_restart {
        cmd.arg("--disable-hot-restart");
    }
    cmd.args(&a.envoy_args);
    let e = cmd.exec();
    Err(CliError(format!("Failed to exec envoy: {e}")))
}

/// The first executable `name` in the PATH's directories.
fn find_on_path(name: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| std::path::Path::new(d).join(name))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// The proxy's service ID: given, or the sidecar registered for
/// `-sidecar-for` on the agent.
fn proxy_id(c: &Client, a: &EnvoyArgs) -> Result<(String, String), CliError> {
    let services = c
        .get_json("/v1/agent/services")
        .map_err(|e| CliError(format!("Failed to look up the agent's services: {}", e.0)))?;
    let all = services.as_object().cloned().unwrap_or_default();
    let pick = |id: &str| all.get(id).cloned();
    let proxy = match (&a.proxy_id, &a.sidecar_for) {
        (Some(id), _) => pick(id)
            .ok_or_else(|| CliError(format!("No proxy with service ID {id:?} on the agent")))?,
        (None, Some(target)) => {
            let found: Vec<&Value> = all
                .values()
                .filter(|s| {
                    s["Kind"] == "connect-proxy" && s["Proxy"]["DestinationServiceID"] == *target
                })
                .collect();
            match found.as_slice() {
                [one] => (*one).clone(),
                [] => {
                    return Err(CliError(format!(
                        "No sidecar proxy registered for {target}"
                    )));
                }
                _ => {
                    return Err(CliError(format!(
                        "More than one sidecar proxy registered for {target}; use -proxy-id"
                    )));
                }
            }
        }
        (None, None) => {
            return Err(CliError(
                "No proxy ID specified: use -sidecar-for or -proxy-id".into(),
            ));
        }
    };
    let id = proxy["ID"].as_str().unwrap_or("").to_string();
    // Envoy's cluster is the service the proxy stands for.
    let cluster = proxy["Proxy"]["DestinationServiceName"]
        .as_str()
        .filter(|s| !s.is_empty())
        .or(proxy["Service"].as_str())
        .unwrap_or(&id)
        .to_string();
    Ok((id, cluster))
}

/// The gRPC port to name: `-grpc-addr` (or CONSUL_GRPC_ADDR; `https://`
/// for TLS), else the agent's own (plaintext first) on 127.0.0.1.
fn grpc_server(me: &Value, given: Option<String>) -> Result<(String, u16, bool), CliError> {
    let xds = &me["xDS"];
    let plain = xds["Ports"]["Plaintext"].as_i64().filter(|p| *p > 0);
    let tls_port = xds["Ports"]["TLS"].as_i64().filter(|p| *p > 0);
    match given.or_else(|| env_var(&["CONSUL_GRPC_ADDR"])) {
        Some(g) => {
            let tls = g.starts_with("https://");
            let (h, p) = host_port(&g, "-grpc-addr")?;
            Ok((h, p, tls))
        }
        None => match (plain, tls_port) {
            (Some(p), _) => Ok(("127.0.0.1".to_string(), p as u16, false)),
            (None, Some(p)) => Ok(("127.0.0.1".to_string(), p as u16, true)),
            (None, None) => Err(CliError(
                "The agent serves no gRPC port: give -grpc-addr".into(),
            )),
        },
    }
}

/// The bootstrap of a proxyless gRPC client (gRFC A27's format): cairn's
/// gRPC port as its one xDS server (state-of-the-world ADS, `xds_v3`), the
/// node id the service instance it is, whose node is named in the
/// metadata, with the token there too (gRPC's bootstrap sets no call
/// metadata; the server reads it from there when the call has none).
pub fn grpc_bootstrap(
    c: &Client, a: &GrpcBootstrapArgs, token: Option<String>,
) -> Result<Value, CliError> {
    let me = c.get_json("/v1/agent/self")?;
    let (id, service, node_name) = match a.node.as_deref() {
        Some(node) => catalog_instance(c, &a.service, Some(node))?,
        None => match agent_instance(c, &a.service)? {
            Some((id, service)) => {
                let node = me["Config"]["NodeName"].as_str().unwrap_or("").to_string();
                (id, service, node)
            }
            None => catalog_instance(c, &a.service, None)?,
        },
    };
    let (host, port, tls) = grpc_server(&me, a.grpc_addr.clone())?;
    let creds = if tls {
        let ca_file = a
            .grpc_ca_file
            .clone()
            .or_else(|| env_var(&["CONSUL_GRPC_CACERT", "CAIRN_CACERT", "CONSUL_CACERT"]))
            .ok_or_else(|| CliError("The gRPC port is TLS: give -grpc-ca-file (its CA)".into()))?;
        json!({ "type": "tls", "config": { "ca_certificate_file": ca_file } })
    } else {
        json!({ "type": "insecure" })
    };
    let mut metadata = json!({ "node_name": node_name });
    let token = token
        .filter(|t| !t.is_empty())
        .or_else(|| env_var(&["CAIRN_HTTP_TOKEN", "CONSUL_HTTP_TOKEN"]));
    if let Some(t) = token {
        metadata["x-consul-token"] = json!(t);
    }
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    Ok(json!({
        "xds_servers": [{
            "server_uri": format!("{host}:{port}"),
            "channel_creds": [creds],
            "server_features": ["xds_v3"]
        }],
        "node": {
            "id": id,
            "cluster": service,
            "metadata": metadata
        }
    }))
}

/// The agent's instance `wanted` (its ID, or the name of its one
/// instance): its ID and service name; none when the agent has none.
fn agent_instance(c: &Client, wanted: &str) -> Result<Option<(String, String)>, CliError> {
    let services = c
        .get_json("/v1/agent/services")
        .map_err(|e| CliError(format!("Failed to look up the agent's services: {}", e.0)))?;
    let all = services.as_object().cloned().unwrap_or_default();
    let pick = |s: &Value| {
        let text = |k: &str| s[k].as_str().unwrap_or("").to_string();
        (text("ID"), text("Service"))
    };
    if let Some(s) = all.get(wanted) {
        return Ok(Some(pick(s)));
    }
    let named: Vec<&Value> = all.values().filter(|s| s["Service"] == *wanted).collect();
    match named.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(pick(one))),
        _ => Err(CliError(format!(
            "More than one instance of {wanted} on the agent; give its ID"
        ))),
    }
}

/// A catalog instance (the agentless path) of service `wanted` (a name),
/// on `node` when given (there also by its ID): its ID, service and node.
fn catalog_instance(
    c: &Client, wanted: &str, node: Option<&str>,
) -> Result<(String, String, String), CliError> {
    let enc = crate::request::enc;
    let rows = c
        .get_json(&format!("/v1/catalog/service/{}", enc(wanted)))
        .map_err(|e| CliError(format!("Failed to look up the catalog: {}", e.0)))?;
    let text = |v: &Value, k: &str| v[k].as_str().unwrap_or("").to_string();
    let mut found: Vec<(String, String, String)> = rows
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| node.is_none_or(|n| r["Node"] == *n))
        .map(|r| {
            (
                text(r, "ServiceID"),
                text(r, "ServiceName"),
                text(r, "Node"),
            )
        })
        .collect();
    if found.is_empty()
        && let Some(n) = node
    {
        // By its ID on that node.
        let services = c.get_json(&format!("/v1/catalog/node-services/{}", enc(n)))?;
        found = services["Services"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["ID"] == *wanted)
            .map(|s| (text(s, "ID"), text(s, "Service"), n.to_string()))
            .collect();
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(CliError(match node {
            Some(n) => format!("No service instance {wanted:?} on node {n:?}"),
            None => format!("No service instance {wanted:?} on the agent or in the catalog"),
        })),
        _ => Err(CliError(format!(
            "More than one instance of {wanted} in the catalog; give -node"
        ))),
    }
}

/// `host:port` split, a name resolved as Envoy wants an IP or a name.
fn host_port(addr: &str, what: &str) -> Result<(String, u16), CliError> {
    let addr = addr
        .trim_start_matches("http://")
        .trim_start_matches("https://");
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| CliError(format!("Invalid {what} {addr:?}: want host:port")))?;
    let port = port
        .parse()
        .map_err(|_| CliError(format!("Invalid {what} port in {addr:?}")))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let host = if host == "localhost" {
        "127.0.0.1"
    } else {
        host
    };
    Ok((host.to_string(), port))
}

fn socket(host: &str, port: u16) -> Value {
    json!({ "socket_address": { "address": host, "port_value": port } })
}

pub fn envoy_bootstrap(
    c: &Client, a: &EnvoyArgs, token: Option<String>,
) -> Result<Value, CliError> {
    let (id, cluster) = proxy_id(c, a)?;
    let me = c.get_json("/v1/agent/self")?;
    let node_name = me["Config"]["NodeName"].as_str().unwrap_or("").to_string();
    let (grpc_host, grpc_port, tls) = grpc_server(&me, a.grpc_addr.clone())?;
    let (admin_host, admin_port) = host_port(&a.admin_bind, "-admin-bind")?;
    let token = token
        .filter(|t| !t.is_empty())
        .or_else(|| env_var(&["CAIRN_HTTP_TOKEN", "CONSUL_HTTP_TOKEN"]))
        .unwrap_or_default();
    let mut agent_cluster = json!({
        "name": "local_agent",
        "connect_timeout": "1s",
        "type": "STATIC",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": { "http2_protocol_options": {} }
            }
        },
        "load_assignment": {
            "cluster_name": "local_agent",
            "endpoints": [{ "lb_endpoints": [{ "endpoint": {
                "address": socket(&grpc_host, grpc_port)
            } }] }]
        }
    });
    if tls {
        let ca_file = a
            .grpc_ca_file
            .clone()
            .or_else(|| env_var(&["CONSUL_GRPC_CACERT", "CAIRN_CACERT", "CONSUL_CACERT"]))
            .ok_or_else(|| CliError("The gRPC port is TLS: give -grpc-ca-file (its CA)".into()))?;
        let ca = std::fs::read_to_string(&ca_file)
            .map_err(|e| CliError(format!("Failed to read {ca_file}: {e}")))?;
        agent_cluster["transport_socket"] = json!({
            "name": "tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "common_tls_context": { "validation_context": {
                    "trusted_ca": { "inline_string": ca }
                } }
            }
        });
    }
    let ads = json!({ "ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3" });
    let mut grpc_service = json!({ "envoy_grpc": { "cluster_name": "local_agent" } });
    if !token.is_empty() {
        grpc_service["initial_metadata"] = json!([{ "key": "x-consul-token", "value": token }]);
    }
    Ok(json!({
        "admin": {
            "access_log": [{
                "name": "Consul Listener Filter Log",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog"
                }
            }],
            "address": socket(&admin_host, admin_port)
        },
        "node": {
            "cluster": cluster,
            "id": id,
            "metadata": {
                "node_name": node_name,
                "namespace": "default",
                "partition": "default"
            }
        },
        "layered_runtime": { "layers": [{
            "name": "base",
            "static_layer": { "re2.max_program_size.error_level": 1048576 }
        }] },
        "static_resources": { "clusters": [agent_cluster] },
        "dynamic_resources": {
            "lds_config": ads.clone(),
            "cds_config": ads,
            "ads_config": {
                "api_type": "DELTA_GRPC",
                "transport_api_version": "V3",
                "grpc_services": [grpc_service]
            }
        }
    }))
}
