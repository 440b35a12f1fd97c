//! Consul's agent configuration files (`--config-file F`, `--config-dir D`:
//! HCL or JSON) read into [`FileConfig`]: the keys cairn uses, typed, and
//! the keys it does not (reported once each, never an error). A key of the
//! wrong type is an error naming the key and the file. The binary lays the
//! result under its flags (a flag given wins); the service and check
//! definitions (`service`, `services`, `check`, `checks`) are the agent's
//! (`agent::define::config_files` reads them from the same [`Sources`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

/// A configuration that cannot be read, with a one-line reason.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Where a process's configuration comes from: files, then every `*.hcl`
/// and `*.json` of each directory in lexical order. Read again on reload,
/// so a file added to a directory is picked up.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    pub files: Vec<PathBuf>,
    pub dirs: Vec<PathBuf>,
}

impl Sources {
    pub fn is_empty(&self) -> bool {
        self.files.is_empty() && self.dirs.is_empty()
    }

    /// Every file to read, in order.
    pub fn paths(&self) -> Result<Vec<PathBuf>, ConfigError> {
        let mut out = self.files.clone();
        for d in &self.dirs {
            let mut found: Vec<PathBuf> = std::fs::read_dir(d)
                .map_err(|e| ConfigError(format!("cannot read config dir {}: {e}", d.display())))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("json" | "hcl")))
                .collect();
            found.sort();
            out.extend(found);
        }
        Ok(out)
    }

    /// Each file's parsed document (a JSON object), in order.
    pub fn documents(&self) -> Result<Vec<Document>, ConfigError> {
        self.paths()?
            .into_iter()
            .map(|p| {
                let doc = read(&p)?;
                Ok((p, doc))
            })
            .collect()
    }
}

/// A file and its top-level object.
pub type Document = (PathBuf, Map<String, Value>);

/// One file parsed (HCL or JSON) into its top-level object.
pub fn read(path: &Path) -> Result<Map<String, Value>, ConfigError> {
    let what = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError(format!("cannot read {what}: {e}")))?;
    match crate::definition::parse_json_or_hcl(&text, &what).map_err(|e| ConfigError(e.0))? {
        Value::Object(m) => Ok(m),
        _ => Err(ConfigError(format!(
            "{what}: a configuration must be an object"
        ))),
    }
}

/// `addresses { ... }`: where each listener binds (overrides `client_addr`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Addresses {
    pub http: Option<String>,
    pub https: Option<String>,
    pub grpc: Option<String>,
    pub dns: Option<String>,
}

/// `ports { ... }`: a negative port turns its listener off (Consul's -1).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ports {
    pub http: Option<i64>,
    pub https: Option<i64>,
    pub grpc: Option<i64>,
    pub dns: Option<i64>,
    pub server: Option<i64>,
}

/// The keys of Consul's agent configuration cairn uses, as the files gave
/// them (none: not given; a later file overrides an earlier one).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FileConfig {
    pub datacenter: Option<String>,
    pub primary_datacenter: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub node_name: Option<String>,
    pub server: Option<bool>,
    pub bootstrap_expect: Option<usize>,
    /// Appended across files.
    pub retry_join: Vec<String>,
    /// Servers of other datacenters (appended across files).
    pub retry_join_wan: Vec<String>,
    pub bind_addr: Option<String>,
    /// `advertise_addr`: the address others reach this node on.
    pub advertise_addr: Option<String>,
    pub client_addr: Option<String>,
    pub addresses: Addresses,
    pub ports: Ports,
    pub log_level: Option<String>,
    pub log_json: Option<bool>,
    pub acl_enabled: Option<bool>,
    pub acl_default_policy: Option<String>,
    pub token_initial_management: Option<String>,
    pub token_agent: Option<String>,
    pub token_default: Option<String>,
    /// The agent's other tokens by kind (`agent_recovery`, `dns`,
    /// `replication`, `config_file_service_registration`): the agent sets
    /// them at its start, as `PUT /v1/agent/token/:kind` would.
    pub tokens_other: std::collections::BTreeMap<String, String>,
    pub tls_ca_file: Option<PathBuf>,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    pub tls_verify_incoming: Option<bool>,
    pub encrypt: Option<String>,
    /// `ui_config.enabled` (or the legacy `ui`).
    pub ui_enabled: Option<bool>,
    /// `ui_config.dir` (or the legacy `ui_dir`).
    pub ui_dir: Option<PathBuf>,
    /// `use_streaming_backend`: a client agent answers blocking health
    /// reads from views fed by the servers' event stream (Consul's key).
    pub use_streaming_backend: Option<bool>,
    /// `enable_script_checks` and `enable_local_script_checks`.
    pub enable_script_checks: Option<bool>,
    /// `enable_debug`: serve `/debug/pprof/` with ACLs off.
    pub enable_debug: Option<bool>,
    pub enable_local_script_checks: Option<bool>,
    /// `limits.http_max_conns_per_client`: HTTP connections one client IP
    /// may hold open at once.
    pub http_max_conns_per_client: Option<usize>,
    /// Keys cairn does not use (`telemetry`, `acl.enable_token_persistence`, …),
    /// each once, with the first file that has it.
    pub unused: Vec<(String, PathBuf)>,
}

/// Keys the agent reads itself (service and check definitions).
const DEFINITIONS: &[&str] = &["service", "services", "check", "checks"];

impl FileConfig {
    /// Reads every file of `sources`, in order.
    pub fn load(sources: &Sources) -> Result<FileConfig, ConfigError> {
        let mut c = FileConfig::default();
        let mut seen = BTreeSet::new();
        let mut unused = Vec::new();
        for (path, doc) in sources.documents()? {
            let mut f = Reader {
                file: &path,
                seen: &mut seen,
                unused: &mut unused,
            };
            c.apply(&mut f, doc)?;
        }
        c.unused = unused;
        Ok(c)
    }

    fn apply(&mut self, f: &mut Reader, doc: Map<String, Value>) -> Result<(), ConfigError> {
        for (key, v) in doc {
            match key.as_str() {
                "datacenter" => self.datacenter = Some(f.string(&key, &v)?),
                "primary_datacenter" => self.primary_datacenter = Some(f.string(&key, &v)?),
                "data_dir" => self.data_dir = Some(f.string(&key, &v)?.into()),
                "node_name" => self.node_name = Some(f.string(&key, &v)?),
                "server" => self.server = Some(f.bool(&key, &v)?),
                "bootstrap_expect" => {
                    let n = f.int(&key, &v)?;
                    self.bootstrap_expect =
                        Some(usize::try_from(n).map_err(|_| f.wrong(&key, "a count", &v))?);
                }
                "retry_join" => self.retry_join.extend(f.strings(&key, &v)?),
                "retry_join_wan" => self.retry_join_wan.extend(f.strings(&key, &v)?),
                "bind_addr" => self.bind_addr = Some(f.string(&key, &v)?),
                "advertise_addr" => self.advertise_addr = Some(f.string(&key, &v)?),
                "client_addr" => self.client_addr = Some(f.string(&key, &v)?),
                "log_level" => self.log_level = Some(f.string(&key, &v)?),
                "log_json" => self.log_json = Some(f.bool(&key, &v)?),
                "encrypt" => self.encrypt = Some(f.string(&key, &v)?),
                "ui" => self.ui_enabled = Some(f.bool(&key, &v)?),
                "use_streaming_backend" => self.use_streaming_backend = Some(f.bool(&key, &v)?),
                "enable_script_checks" => self.enable_script_checks = Some(f.bool(&key, &v)?),
                "enable_debug" => self.enable_debug = Some(f.bool(&key, &v)?),
                "enable_local_script_checks" => {
                    self.enable_local_script_checks = Some(f.bool(&key, &v)?)
                }
                "ui_dir" => self.ui_dir = Some(f.string(&key, &v)?.into()),
                "ui_config" => {
                    for (k, v) in f.block(&key, v)? {
                        let name = format!("{key}.{k}");
                        match k.as_str() {
                            "enabled" => self.ui_enabled = Some(f.bool(&name, &v)?),
                            "dir" => self.ui_dir = Some(f.string(&name, &v)?.into()),
                            _ => f.unused(&name),
                        }
                    }
                }
                "addresses" => {
                    for (k, v) in f.block(&key, v)? {
                        let a = &mut self.addresses;
                        let slot = match k.as_str() {
                            "http" => &mut a.http,
                            "https" => &mut a.https,
                            "grpc" => &mut a.grpc,
                            "dns" => &mut a.dns,
                            _ => {
                                f.unused(&format!("{key}.{k}"));
                                continue;
                            }
                        };
                        *slot = Some(f.string(&format!("{key}.{k}"), &v)?);
                    }
                }
                "ports" => {
                    for (k, v) in f.block(&key, v)? {
                        let p = &mut self.ports;
                        let slot = match k.as_str() {
                            "http" => &mut p.http,
                            "https" => &mut p.https,
                            "grpc" => &mut p.grpc,
                            "dns" => &mut p.dns,
                            "server" => &mut p.server,
                            _ => {
                                f.unused(&format!("{key}.{k}"));
                                continue;
                            }
                        };
                        let name = format!("{key}.{k}");
                        let n = f.int(&name, &v)?;
                        if n > i64::from(u16::MAX) {
                            return Err(f.wrong(&name, "a port", &v));
                        }
                        *slot = Some(n);
                    }
                }
                "acl" => self.acl(f, v)?,
                "limits" => {
                    for (k, v) in f.block(&key, v)? {
                        let name = format!("{key}.{k}");
                        match k.as_str() {
                            "http_max_conns_per_client" => {
                                let n = f.int(&name, &v)?;
                                self.http_max_conns_per_client = Some(
                                    usize::try_from(n)
                                        .map_err(|_| f.wrong(&name, "a count", &v))?,
                                );
                            }
                            _ => f.unused(&name),
                        }
                    }
                }
                "tls" => {
                    for (k, v) in f.block(&key, v)? {
                        if k != "defaults" {
                            f.unused(&format!("tls.{k}"));
                            continue;
                        }
                        for (k, v) in f.block("tls.defaults", v)? {
                            let name = format!("tls.defaults.{k}");
                            match k.as_str() {
                                "ca_file" => self.tls_ca_file = Some(f.string(&name, &v)?.into()),
                                "cert_file" => {
                                    self.tls_cert_file = Some(f.string(&name, &v)?.into())
                                }
                                "key_file" => self.tls_key_file = Some(f.string(&name, &v)?.into()),
                                "verify_incoming" => {
                                    self.tls_verify_incoming = Some(f.bool(&name, &v)?)
                                }
                                _ => f.unused(&name),
                            }
                        }
                    }
                }
                k if DEFINITIONS.contains(&k) => {}
                _ => f.unused(&key),
            }
        }
        Ok(())
    }

    fn acl(&mut self, f: &mut Reader, v: Value) -> Result<(), ConfigError> {
        for (k, v) in f.block("acl", v)? {
            let name = format!("acl.{k}");
            match k.as_str() {
                "enabled" => self.acl_enabled = Some(f.bool(&name, &v)?),
                "default_policy" => self.acl_default_policy = Some(f.string(&name, &v)?),
                "tokens" => {
                    for (k, v) in f.block(&name, v)? {
                        let name = format!("acl.tokens.{k}");
                        let slot = match k.as_str() {
                            // Consul's legacy name first.
                            "master" | "initial_management" => &mut self.token_initial_management,
                            "agent" => &mut self.token_agent,
                            "default" => &mut self.token_default,
                            "agent_recovery"
                            | "agent_master"
                            | "dns"
                            | "replication"
                            | "config_file_service_registration" => {
                                let kind = if k == "agent_master" {
                                    "agent_recovery"
                                } else {
                                    &k
                                };
                                let v = f.string(&name, &v)?;
                                self.tokens_other.insert(kind.to_string(), v);
                                continue;
                            }
                            _ => {
                                f.unused(&name);
                                continue;
                            }
                        };
                        *slot = Some(f.string(&name, &v)?);
                    }
                }
                _ => f.unused(&name),
            }
        }
        Ok(())
    }

    /// The address a listener binds: its own address, else `client_addr`
    /// (the first of a space-separated list), else loopback; `None` when
    /// neither the address nor the port was given (the flag's default
    /// stands), `Some("")` when the port turns it off.
    pub fn listen(
        &self, addr: &Option<String>, port: Option<i64>, default_port: u16,
    ) -> Option<String> {
        let host = addr.clone().or_else(|| {
            self.client_addr
                .as_deref()
                .and_then(|c| c.split_whitespace().next())
                .map(String::from)
        });
        if host.is_none() && port.is_none() {
            return None;
        }
        let port = port.unwrap_or(i64::from(default_port));
        if port < 0 {
            return Some(String::new());
        }
        let host = host.unwrap_or_else(|| "127.0.0.1".into());
        Some(join_host_port(&host, port))
    }
}

/// `host:port`, bracketing an IPv6 host.
pub fn join_host_port(host: &str, port: i64) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Reads one file's values: type checks naming the key and the file, and
/// the unused keys, each once across all files.
struct Reader<'a> {
    file: &'a Path,
    seen: &'a mut BTreeSet<String>,
    unused: &'a mut Vec<(String, PathBuf)>,
}

impl Reader<'_> {
    fn unused(&mut self, key: &str) {
        if self.seen.insert(key.to_string()) {
            self.unused.push((key.to_string(), self.file.to_path_buf()));
        }
    }

    fn wrong(&self, key: &str, want: &str, got: &Value) -> ConfigError {
        let kind = match got {
            Value::Null => "null",
            Value::Bool(_) => "a bool",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::Array(_) => "a list",
            Value::Object(_) => "a block",
        };
        ConfigError(format!(
            "{}: invalid config key {key}: expected {want}, got {kind} ({got})",
            self.file.display()
        ))
    }

    fn string(&self, key: &str, v: &Value) -> Result<String, ConfigError> {
        match v {
            Value::String(s) => Ok(s.clone()),
            _ => Err(self.wrong(key, "a string", v)),
        }
    }

    fn strings(&self, key: &str, v: &Value) -> Result<Vec<String>, ConfigError> {
        match v {
            Value::String(s) => Ok(vec![s.clone()]),
            Value::Array(a) => a.iter().map(|v| self.string(key, v)).collect(),
            _ => Err(self.wrong(key, "a list of strings", v)),
        }
    }

    /// Consul's decoder is weakly typed: `"true"` and `"3"` are taken too.
    fn bool(&self, key: &str, v: &Value) -> Result<bool, ConfigError> {
        match v {
            Value::Bool(b) => Ok(*b),
            Value::String(s) if s == "true" => Ok(true),
            Value::String(s) if s == "false" => Ok(false),
            _ => Err(self.wrong(key, "a bool", v)),
        }
    }

    fn int(&self, key: &str, v: &Value) -> Result<i64, ConfigError> {
        match v {
            Value::Number(n) if n.as_i64().is_some() => Ok(n.as_i64().unwrap_or_default()),
            Value::String(s) if s.parse::<i64>().is_ok() => Ok(s.parse().unwrap_or_default()),
            _ => Err(self.wrong(key, "an integer", v)),
        }
    }

    /// A block's keys: HCL repeats a block as a list of objects, merged
    /// here in order.
    fn block(&self, key: &str, v: Value) -> Result<Map<String, Value>, ConfigError> {
        match v {
            Value::Object(m) => Ok(m),
            Value::Array(a) if a.iter().all(Value::is_object) => Ok(a
                .into_iter()
                .flat_map(|o| match o {
                    Value::Object(m) => m,
                    _ => Map::new(),
                })
                .collect()),
            v => Err(self.wrong(key, "a block", &v)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(files: &[(&str, &str)]) -> Result<FileConfig, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        FileConfig::load(&Sources {
            files: vec![],
            dirs: vec![dir.path().to_path_buf()],
        })
    }

    /// Consul's key for a client agent's streaming backend, a bool.
    #[test]
    fn use_streaming_backend_is_a_bool() {
        let c = load(&[("a.hcl", "use_streaming_backend = false")]).unwrap();
        assert_eq!(c.use_streaming_backend, Some(false));
        assert!(c.unused.is_empty());
        let e = load(&[("a.json", r#"{"use_streaming_backend": "no"}"#)]).unwrap_err();
        assert!(e.0.contains("use_streaming_backend"), "{e}");
    }

    #[test]
    fn consul_server_example() {
        let c = load(&[(
            "server.hcl",
            r#"
datacenter = "east"
data_dir = "/opt/consul"
server = true
bootstrap_expect = 3
retry_join = ["10.0.0.2", "10.0.0.3"]
primary_datacenter = "west"
retry_join_wan = ["10.1.0.2:8300"]
client_addr = "0.0.0.0"
addresses { http = "127.0.0.1" }
ports {
  grpc = 8502
  dns = -1
}
ui_config { enabled = true }
acl {
  enabled = true
  default_policy = "deny"
  tokens {
    initial_management = "root"
    agent = "agent-secret"
    replication = "r"
    agent_master = "old"
  }
}
telemetry { prometheus_retention_time = "1m" }
"#,
        )])
        .unwrap();
        assert_eq!(c.datacenter.as_deref(), Some("east"));
        assert_eq!(c.server, Some(true));
        assert_eq!(c.bootstrap_expect, Some(3));
        assert_eq!(c.retry_join, ["10.0.0.2", "10.0.0.3"]);
        assert_eq!(c.primary_datacenter.as_deref(), Some("west"));
        assert_eq!(c.retry_join_wan, ["10.1.0.2:8300"]);
        assert!(!c.unused.iter().any(|(k, _)| k.contains("wan")));
        assert_eq!(c.acl_enabled, Some(true));
        assert_eq!(c.token_initial_management.as_deref(), Some("root"));
        assert_eq!(c.token_agent.as_deref(), Some("agent-secret"));
        assert_eq!(
            c.listen(&c.addresses.http, c.ports.http, 8500).as_deref(),
            Some("127.0.0.1:8500")
        );
        assert_eq!(
            c.listen(&c.addresses.grpc, c.ports.grpc, 8502).as_deref(),
            Some("0.0.0.0:8502")
        );
        assert_eq!(
            c.listen(&c.addresses.dns, c.ports.dns, 8600).as_deref(),
            Some("")
        );
        assert_eq!(c.tokens_other["replication"], "r");
        assert_eq!(c.tokens_other["agent_recovery"], "old");
        let unused: Vec<&str> = c.unused.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(unused, ["telemetry"]);
        assert_eq!(c.ui_enabled, Some(true));
    }

    #[test]
    fn later_files_override_and_unused_keys_come_once() {
        let c = load(&[
            ("a.json", r#"{"datacenter": "a", "telemetry": {}}"#),
            ("b.hcl", "datacenter = \"b\"\ntelemetry {}\n"),
        ])
        .unwrap();
        assert_eq!(c.datacenter.as_deref(), Some("b"));
        assert_eq!(c.unused.len(), 1);
        assert!(c.unused[0].1.ends_with("a.json"));
    }

    #[test]
    fn ui_config_and_its_legacy_keys() {
        let c = load(&[(
            "ui.hcl",
            "ui_config {\n  enabled = true\n  dir = \"/srv/ui\"\n  metrics_provider = \"x\"\n}\n",
        )])
        .unwrap();
        assert_eq!(c.ui_enabled, Some(true));
        assert_eq!(c.ui_dir.as_deref(), Some(std::path::Path::new("/srv/ui")));
        assert_eq!(c.unused[0].0, "ui_config.metrics_provider");
        let c = load(&[("old.json", r#"{"ui": false, "ui_dir": "/d"}"#)]).unwrap();
        assert_eq!((c.ui_enabled, c.ui_dir.is_some()), (Some(false), true));
        let err = load(&[("bad.hcl", "ui_config { enabled = [1] }")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("key ui_config.enabled:"), "{err}");
    }

    #[test]
    fn a_wrong_type_names_the_key_and_the_file() {
        for (text, key) in [
            ("bootstrap_expect = \"three\"", "bootstrap_expect"),
            ("server = 3", "server"),
            ("ports { http = \"x\" }", "ports.http"),
            ("ports { http = 70000 }", "ports.http"),
            ("acl { enabled = \"yes\" }", "acl.enabled"),
            ("acl = 1", "acl"),
            ("datacenter = [\"a\"]", "datacenter"),
        ] {
            let err = load(&[("bad.hcl", text)]).unwrap_err().to_string();
            assert!(err.contains("bad.hcl"), "{text}: {err}");
            assert!(err.contains(&format!("key {key}:")), "{text}: {err}");
        }
        // Weakly typed as Consul's decoder: the strings are taken.
        let c = load(&[("ok.hcl", "server = \"true\"\nbootstrap_expect = \"1\"")]).unwrap();
        assert_eq!((c.server, c.bootstrap_expect), (Some(true), Some(1)));
    }
}
