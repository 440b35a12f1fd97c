//! Consul's service and check definitions (`service { ... }` in HCL or
//! JSON, snake_case or PascalCase, as agents' config files and
//! `consul services register` take them) turned into catalog shapes: the
//! one parser the CLI and the client agent share.
//!
//! Consul's docs write definitions in HCL 1, which allows blocks inside
//! values; no maintained crate parses HCL 1, so those blocks are rewritten
//! as HCL 2 attributes first, by a scan that leaves strings, heredocs and
//! comments alone.

use std::path::PathBuf;

use serde_json::{Map, Value, json};

/// A definition that cannot be read, with a one-line reason.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct DefinitionError(pub String);

/// Parses a file's text as JSON when it looks like JSON, as HCL otherwise.
/// HCL blocks become JSON objects (a single `check { ... }` is an object,
/// not a one-element list); blocks repeated under one name become a list.
pub fn parse_json_or_hcl(text: &str, what: &str) -> Result<Value, DefinitionError> {
    if text.trim_start().starts_with('{') {
        return serde_json::from_str(text)
            .map_err(|e| DefinitionError(format!("Error parsing {what} as JSON: {e}")));
    }
    let first = match hcl::from_str::<Value>(text) {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    // Consul's docs write entries in HCL 1, which allows blocks inside
    // object values (`Routes = [{ Match { HTTP { ... } } }]`); HCL 2 wants
    // `Match = { ... }` there. Retry with every `Name {` as `Name = {`.
    hcl::from_str::<Value>(&blocks_as_attributes(text))
        .map_err(|_| DefinitionError(format!("Error parsing {what} (as HCL or JSON): {first}")))
}

/// Rewrites every HCL 1 block `Name {` as the HCL 2 attribute `Name = {`,
/// outside strings, heredocs and comments (whose text is kept as it is).
/// No maintained crate parses HCL 1, and hcl-rs parses HCL 2 only.
fn blocks_as_attributes(text: &str) -> String {
    let b = text.as_bytes();
    let ident_start = |c: u8| c.is_ascii_alphabetic() || c == b'_';
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'-';
    let mut out = String::with_capacity(text.len() + 64);
    let mut i = 0;
    // Every delimiter is ASCII, so each slice taken starts and ends on a
    // character boundary.
    while i < b.len() {
        let start = i;
        match b[i] {
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i = (i + 1).min(b.len());
            }
            b'#' => i = line_end(b, i),
            b'/' if b.get(i + 1) == Some(&b'/') => i = line_end(b, i),
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i = text[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
            }
            b'<' if b.get(i + 1) == Some(&b'<') => i = heredoc_end(text, i),
            c if ident_start(c) && (i == 0 || !ident(b[i - 1])) => {
                while i < b.len() && ident(b[i]) {
                    i += 1;
                }
                let mut j = i;
                while j < b.len() && b[j].is_ascii_whitespace() {
                    j += 1;
                }
                if b.get(j) == Some(&b'{') {
                    out.push_str(&text[start..j]);
                    out.push_str("= ");
                    i = j;
                    continue;
                }
            }
            _ => i += 1,
        }
        // A multi-byte character: copy it whole.
        while i < b.len() && !text.is_char_boundary(i) {
            i += 1;
        }
        out.push_str(&text[start..i]);
    }
    out
}

fn line_end(b: &[u8], from: usize) -> usize {
    b[from..]
        .iter()
        .position(|&c| c == b'\n')
        .map_or(b.len(), |e| from + e)
}

/// The end of a heredoc starting at `from` (`<<EOF` or `<<-EOF` ... a line
/// holding only `EOF`); past the text if it never ends.
fn heredoc_end(text: &str, from: usize) -> usize {
    let rest = &text[from + 2..];
    let rest = rest.strip_prefix('-').unwrap_or(rest);
    let marker: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    if marker.is_empty() {
        return from + 2;
    }
    let mut at = line_end(text.as_bytes(), from);
    while at < text.len() {
        let next = line_end(text.as_bytes(), at + 1);
        if text[at + 1..next].trim() == marker {
            return next;
        }
        at = next;
    }
    text.len()
}

/// Keys whose values are free-form maps: their keys are the user's and are
/// never renamed.
const FREE_FORM: &[&str] = &[
    "Meta",
    "NodeMeta",
    "Header",
    "Config",
    "TaggedAddresses",
    "Env",
];

/// snake_case (or lower-case) definition keys → the API's PascalCase.
fn pascal(key: &str) -> String {
    if key.chars().any(|c| c.is_ascii_uppercase()) {
        return key.to_string();
    }
    let special = [
        ("id", "ID"),
        ("service_id", "ServiceID"),
        ("serviceid", "ServiceID"),
        ("check_id", "CheckID"),
        ("checkid", "CheckID"),
        ("http", "HTTP"),
        ("tcp", "TCP"),
        ("udp", "UDP"),
        ("grpc", "GRPC"),
        ("grpc_use_tls", "GRPCUseTLS"),
        ("ttl", "TTL"),
        ("h2ping", "H2PING"),
        ("h2ping_use_tls", "H2PingUseTLS"),
        ("tls_skip_verify", "TLSSkipVerify"),
        ("tls_server_name", "TLSServerName"),
        ("tcp_use_tls", "TCPUseTLS"),
        ("docker_container_id", "DockerContainerID"),
        ("destination_service_id", "DestinationServiceID"),
        ("os_service", "OSService"),
    ];
    if let Some((_, v)) = special.iter().find(|(k, _)| *k == key) {
        return v.to_string();
    }
    key.split('_')
        .map(|part| {
            let mut cs = part.chars();
            match cs.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + cs.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

/// Renames keys recursively, leaving free-form maps' own keys alone (but
/// still normalizing objects inside them, e.g. tagged addresses).
pub fn normalize(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, v)| {
                    let k = pascal(&k);
                    let v = if FREE_FORM.contains(&k.as_str()) {
                        match v {
                            Value::Object(inner) => Value::Object(
                                inner
                                    .into_iter()
                                    .map(|(ik, iv)| (ik, normalize(iv)))
                                    .collect(),
                            ),
                            other => other,
                        }
                    } else {
                        normalize(v)
                    };
                    (k, v)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(normalize).collect()),
        other => other,
    }
}

/// The service objects of a definition file's JSON.
pub fn services_of(doc: Value) -> Result<Vec<Map<String, Value>>, DefinitionError> {
    let doc = normalize(doc);
    let Value::Object(mut top) = doc else {
        return Err(DefinitionError(
            "A service definition must be a JSON object".into(),
        ));
    };
    let list = if let Some(s) = top.remove("Service") {
        // Repeated `service { ... }` blocks in HCL come as a list.
        match s {
            Value::Array(a) => a,
            s => vec![s],
        }
    } else if let Some(Value::Array(a)) = top.remove("Services") {
        a
    } else {
        vec![Value::Object(top)]
    };
    list.into_iter()
        .map(|s| match s {
            Value::Object(m) => Ok(m),
            _ => Err(DefinitionError(
                "A service definition must be an object".into(),
            )),
        })
        .collect()
}

/// Check-definition fields that go under `Definition` in the catalog.
pub const DEFINITION_FIELDS: &[&str] = &[
    "HTTP",
    "Header",
    "Method",
    "Body",
    "DisableRedirects",
    "TLSServerName",
    "TLSSkipVerify",
    "TCP",
    "TCPUseTLS",
    "UDP",
    "GRPC",
    "GRPCUseTLS",
    "H2PING",
    "H2PingUseTLS",
    "OSService",
    "OutputMaxSize",
    "Args",
    "ScriptArgs",
    "DockerContainerID",
    "Shell",
    "AliasNode",
    "AliasService",
    "DeregisterCriticalServiceAfter",
    "TTL",
    "Interval",
    "Timeout",
    "SuccessBeforePassing",
    "FailuresBeforeWarning",
    "FailuresBeforeCritical",
];

fn check_type(def: &Map<String, Value>) -> &'static str {
    for (field, kind) in [
        ("HTTP", "http"),
        ("TCP", "tcp"),
        ("UDP", "udp"),
        ("GRPC", "grpc"),
        ("H2PING", "h2ping"),
        ("TTL", "ttl"),
        ("AliasService", "alias"),
        ("DockerContainerID", "docker"),
        ("Args", "script"),
        ("ScriptArgs", "script"),
    ] {
        if def.contains_key(field) {
            return kind;
        }
    }
    ""
}

pub fn text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

/// The catalog form (`HealthCheck` JSON) of one check definition: its
/// runnable fields go under `Definition`, its type is derived from them,
/// and it starts critical unless it names a status.
pub fn check_definition_to_health_check(
    def: &Map<String, Value>, default_id: String, default_name: String, service_id: &str,
) -> Value {
    // Definitions name a check's id `id` (API: `ID`) or `CheckID`.
    let check_id = match text(def.get("CheckID").or(def.get("ID"))) {
        c if c.is_empty() => default_id,
        c => c,
    };
    let check_name = match text(def.get("Name")) {
        n if n.is_empty() => default_name,
        n => n,
    };
    let definition: Map<String, Value> = def
        .iter()
        .filter(|(k, _)| DEFINITION_FIELDS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let status = match text(def.get("Status")) {
        s if s.is_empty() => "critical".to_string(),
        s => s,
    };
    json!({
        "CheckID": check_id,
        "Name": check_name,
        "Status": status,
        "Notes": text(def.get("Notes")),
        "ServiceID": service_id,
        "Type": check_type(def),
        "Interval": text(def.get("Interval")),
        "Timeout": text(def.get("Timeout")),
        "Definition": definition,
    })
}

/// Builds the catalog registration for one service definition on `node`.
pub fn service_definition_to_register(
    mut svc: Map<String, Value>, node: &str,
) -> Result<Value, DefinitionError> {
    if let Some(name) = svc.remove("Name") {
        svc.entry("Service").or_insert(name);
    }
    let name = text(svc.get("Service"));
    if name.is_empty() {
        return Err(DefinitionError(
            "Service definition is missing a name".into(),
        ));
    }
    let id = match text(svc.get("ID")) {
        id if id.is_empty() => name.clone(),
        id => id,
    };
    svc.insert("ID".into(), Value::String(id.clone()));

    let mut defs: Vec<Value> = Vec::new();
    for key in ["Check", "Checks"] {
        match svc.remove(key) {
            // Repeated `check { ... }` blocks in HCL come as a list, a
            // single `checks { ... }` block as one object.
            Some(Value::Array(cs)) => defs.extend(cs),
            Some(Value::Null) | None => {}
            Some(c) => defs.push(c),
        }
    }
    let many = defs.len() > 1;
    let mut checks = Vec::new();
    for (i, def) in defs.into_iter().enumerate() {
        let Value::Object(def) = def else {
            return Err(DefinitionError(
                "A check definition must be an object".into(),
            ));
        };
        // Consul's names for a service's checks: service:ID, or
        // service:ID:N when there are several.
        let default_id = if many {
            format!("service:{id}:{}", i + 1)
        } else {
            format!("service:{id}")
        };
        checks.push(check_definition_to_health_check(
            &def,
            default_id,
            format!("Service '{name}' check"),
            &id,
        ));
    }
    Ok(json!({
        "Node": node,
        "Address": "127.0.0.1",
        "SkipNodeUpdate": true,
        "Service": svc,
        "Checks": checks,
    }))
}

pub fn read_definitions(path: &PathBuf) -> Result<Vec<Map<String, Value>>, DefinitionError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| DefinitionError(format!("Error reading {}: {e}", path.display())))?;
    let doc = parse_json_or_hcl(&text, &path.display().to_string())?;
    let list = services_of(doc)?;
    if list.is_empty() {
        return Err(DefinitionError(format!(
            "No services in {}",
            path.display()
        )));
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hcl1_blocks_are_rewritten_outside_strings_heredocs_and_comments() {
        let text = r#"Kind = "service-router"
Name = "web" # Name {
// Routes {
/* Match { */
Routes = [
  {
    Match { HTTP { PathPrefix = "/x Name { = \"q\" {" } }
    Destination {
      Service = "api"
      Note = <<EOT
Header { = "
EOT
    }
  },
]
"#;
        let rewritten = blocks_as_attributes(text);
        assert!(
            rewritten.contains("Match = { HTTP = { PathPrefix"),
            "{rewritten}"
        );
        assert!(
            rewritten.contains(r#""/x Name { = \"q\" {""#),
            "{rewritten}"
        );
        assert!(
            rewritten.contains("# Name {\n// Routes {\n/* Match { */"),
            "{rewritten}"
        );
        assert!(rewritten.contains("Header { = \"\nEOT"), "{rewritten}");
        let v = parse_json_or_hcl(text, "t").unwrap();
        let route = &v["Routes"][0];
        assert_eq!(route["Match"]["HTTP"]["PathPrefix"], r#"/x Name { = "q" {"#);
        assert_eq!(route["Destination"]["Service"], "api");
        assert_eq!(route["Destination"]["Note"], "Header { = \"\n");
    }

    #[test]
    fn hcl1_rewrite_keeps_non_ascii_text() {
        // Only HCL 1 (a block inside a list's object) takes the rewrite.
        let v =
            parse_json_or_hcl("L = [{ Meta { team = \"équipe {\" }, X { y = 1 } }]", "t").unwrap();
        assert_eq!(v["L"][0]["Meta"]["team"], "équipe {");
        assert_eq!(v["L"][0]["X"]["y"], 1);
    }

    #[test]
    fn hcl_entries_and_blocks() {
        let v = parse_json_or_hcl(
            r#"
Kind = "service-defaults"
Name = "web"
protocol = "http"
Meta {
  team = "a"
}
"#,
            "t",
        )
        .unwrap();
        assert_eq!(
            v,
            json!({"Kind": "service-defaults", "Name": "web", "protocol": "http",
                   "Meta": {"team": "a"}})
        );
        // One block is an object; a repeated block a list.
        let v = parse_json_or_hcl(
            r#"service {
  name = "web"
  port = 80
  check {
    ttl = "10s"
  }
}"#,
            "t",
        )
        .unwrap();
        assert_eq!(
            v,
            json!({"service": {"name": "web", "port": 80, "check": {"ttl": "10s"}}})
        );
        let v = parse_json_or_hcl("check {\n a = 1\n}\ncheck {\n a = 2\n}\n", "t").unwrap();
        assert_eq!(v, json!({"check": [{"a": 1}, {"a": 2}]}));
        // HCL 1's blocks inside objects, as Consul's docs write them.
        let v = parse_json_or_hcl(
            "Kind = \"service-router\"\nName = \"web\"\nRoutes = [\n  {\n    Match { HTTP { PathPrefix = \"/admin\" } }\n    Destination {\n      Service = \"admin\"\n    }\n  },\n]\n",
            "t",
        )
        .unwrap();
        assert_eq!(
            v["Routes"],
            json!([{"Match": {"HTTP": {"PathPrefix": "/admin"}},
                    "Destination": {"Service": "admin"}}])
        );
        // JSON still parses as JSON; broken input is an error naming it.
        assert_eq!(
            parse_json_or_hcl(r#" {"a": 1}"#, "t").unwrap(),
            json!({"a": 1})
        );
        let e = parse_json_or_hcl("Kind = ", "f.hcl").unwrap_err();
        assert!(e.0.contains("f.hcl"), "{}", e.0);
    }

    #[test]
    fn snake_case_definition_with_checks() {
        let doc = json!({"service": {
            "name": "web", "port": 8080, "tags": ["a"],
            "meta": {"some_key": "v"},
            "tagged_addresses": {"lan": {"address": "10.0.0.1", "port": 80}},
            "checks": [
                {"http": "http://localhost:8080/health", "interval": "10s"},
                {"ttl": "30s", "status": "passing"},
            ],
        }});
        let svcs = services_of(doc).unwrap();
        let req = service_definition_to_register(svcs.into_iter().next().unwrap(), "n1").unwrap();
        assert_eq!(req["Node"], "n1");
        assert_eq!(req["Address"], "127.0.0.1");
        assert_eq!(req["SkipNodeUpdate"], true);
        let s = &req["Service"];
        assert_eq!(s["Service"], "web");
        assert_eq!(s["ID"], "web");
        assert_eq!(s["Port"], 8080);
        assert_eq!(s["Meta"], json!({"some_key": "v"}));
        assert_eq!(s["TaggedAddresses"]["lan"]["Address"], "10.0.0.1");
        let checks = req["Checks"].as_array().unwrap();
        assert_eq!(checks[0]["CheckID"], "service:web:1");
        assert_eq!(checks[0]["Type"], "http");
        assert_eq!(checks[0]["Status"], "critical");
        assert_eq!(checks[0]["Interval"], "10s");
        assert_eq!(
            checks[0]["Definition"]["HTTP"],
            "http://localhost:8080/health"
        );
        assert_eq!(checks[1]["Status"], "passing");
        assert_eq!(checks[1]["ServiceID"], "web");
    }

    #[test]
    fn a_single_hcl_checks_block_is_one_check() {
        let hcl = r#"
            service {
              name = "web"
              port = 80
              checks {
                ttl = "10s"
              }
            }
        "#;
        let doc = parse_json_or_hcl(hcl, "web.hcl").unwrap();
        let svc = services_of(doc).unwrap().into_iter().next().unwrap();
        let req = service_definition_to_register(svc, "n1").unwrap();
        let checks = req["Checks"].as_array().unwrap();
        assert_eq!(checks.len(), 1, "{req}");
        assert_eq!(checks[0]["CheckID"], "service:web");
        assert_eq!(checks[0]["Definition"]["TTL"], "10s");
    }

    #[test]
    fn filterable_check_fields_are_kept_in_both_spellings() {
        // Consul filters on these three (`Definition.OutputMaxSize` ...):
        // dropping them made such filters match nothing.
        for check in [
            json!({"http": "http://x/", "disable_redirects": true,
                   "h2ping_use_tls": false, "output_max_size": 8192, "interval": "5s"}),
            json!({"HTTP": "http://x/", "DisableRedirects": true,
                   "H2PingUseTLS": false, "OutputMaxSize": 8192, "Interval": "5s"}),
        ] {
            let svcs = services_of(json!({"service": {"name": "web", "check": check}})).unwrap();
            let req = service_definition_to_register(svcs[0].clone(), "n1").unwrap();
            let def = &req["Checks"][0]["Definition"];
            assert_eq!(def["DisableRedirects"], true, "{def}");
            assert_eq!(def["H2PingUseTLS"], false, "{def}");
            assert_eq!(def["OutputMaxSize"], 8192, "{def}");
        }
    }

    #[test]
    fn bare_and_pascal_case_and_lists() {
        let svcs = services_of(json!({"Name": "db", "ID": "db1", "Port": 5432})).unwrap();
        let req = service_definition_to_register(svcs[0].clone(), "n").unwrap();
        assert_eq!(req["Service"]["ID"], "db1");
        assert_eq!(req["Service"]["Service"], "db");
        let svcs = services_of(json!({"services": [{"name": "a"}, {"name": "b"}]})).unwrap();
        assert_eq!(svcs.len(), 2);
        let err = service_definition_to_register(Map::new(), "n").unwrap_err();
        assert!(err.0.contains("name"));
    }
}
