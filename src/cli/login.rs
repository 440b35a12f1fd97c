//! `cairn login`, `cairn logout`, and `cairn acl auth-method|binding-rule`:
//! Consul's verbs and flags over `/v1/acl/login`, `/logout`,
//! `/auth-method*` and `/binding-rule*`.

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::{CliError, CliResult, Client, Format, enc};
use super::{create, list, rules_arg, s, send, show};

#[derive(Args, Debug)]
pub struct LoginArgs {
    /// The auth method to log in through.
    #[arg(long)]
    method: String,
    /// A file holding the bearer token (a JWT, a service account token).
    #[arg(long)]
    bearer_token_file: String,
    /// Where the new token's SecretID is written.
    #[arg(long)]
    token_sink_file: String,
    /// `key=value`: metadata for the token's description (repeatable).
    #[arg(long)]
    meta: Vec<String>,
}

pub fn login(c: &Client, a: LoginArgs) -> CliResult {
    let bearer = std::fs::read_to_string(&a.bearer_token_file)
        .map_err(|e| CliError(format!("Error reading bearer token file: {e}")))?;
    let mut meta = serde_json::Map::new();
    for kv in &a.meta {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| CliError(format!("-meta {kv:?}: expected key=value")))?;
        meta.insert(k.to_string(), json!(v));
    }
    let body = json!({"AuthMethod": a.method, "BearerToken": bearer.trim(), "Meta": meta});
    let t = send(c, reqwest::Method::POST, "/v1/acl/login", Some(body))
        .map_err(|e| CliError(format!("Error logging in: {}", e.0)))?;
    write_private(&a.token_sink_file, s(&t["SecretID"]))
        .map_err(|e| CliError(format!("Error writing token to file sink: {e}")))?;
    Ok(())
}

/// Writes the secret readable by its owner only.
fn write_private(path: &str, secret: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(secret.as_bytes())
}

pub fn logout(c: &Client) -> CliResult {
    send(c, reqwest::Method::POST, "/v1/acl/logout", None)
        .map_err(|e| CliError(format!("Error destroying token: {}", e.0)))?;
    Ok(())
}

#[derive(Subcommand, Debug)]
pub enum AuthMethodCmd {
    Create(MethodArgs),
    /// Replace a method's settings (its type stays).
    Update(MethodArgs),
    Read(ByName),
    List(FormatArg),
    Delete(ByName),
}

#[derive(Args, Debug)]
pub struct FormatArg {
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

#[derive(Args, Debug)]
pub struct ByName {
    #[arg(long)]
    name: String,
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

#[derive(Args, Debug)]
pub struct MethodArgs {
    #[arg(long)]
    name: String,
    /// jwt or kubernetes (`update` keeps the method's own).
    #[arg(long = "type", default_value = "")]
    kind: String,
    #[arg(long, default_value = "")]
    display_name: String,
    #[arg(long, default_value = "")]
    description: String,
    /// A Go duration: the longest a login token lives.
    #[arg(long, default_value = "")]
    max_token_ttl: String,
    /// local (default) or global.
    #[arg(long, default_value = "")]
    token_locality: String,
    /// The method's `Config` as JSON, or `@file`.
    #[arg(long)]
    config: Option<String>,
    /// A kubernetes method's API server.
    #[arg(long)]
    kubernetes_host: Option<String>,
    /// A kubernetes method's CA certificate (PEM, or `@file`).
    #[arg(long)]
    kubernetes_ca_cert: Option<String>,
    /// The token a kubernetes method reviews logins with (or `@file`).
    #[arg(long)]
    kubernetes_service_account_jwt: Option<String>,
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

impl MethodArgs {
    fn body(&self) -> Result<Value, CliError> {
        let mut config = match &self.config {
            Some(c) => serde_json::from_str::<Value>(&rules_arg(c.clone())?)
                .map_err(|e| CliError(format!("Error parsing -config: {e}")))?,
            None => json!({}),
        };
        for (key, v) in [
            ("Host", &self.kubernetes_host),
            ("CACert", &self.kubernetes_ca_cert),
            ("ServiceAccountJWT", &self.kubernetes_service_account_jwt),
        ] {
            if let Some(v) = v {
                config[key] = json!(rules_arg(v.clone())?);
            }
        }
        Ok(json!({
            "Name": self.name,
            "Type": self.kind,
            "DisplayName": self.display_name,
            "Description": self.description,
            "MaxTokenTTL": self.max_token_ttl,
            "TokenLocality": self.token_locality,
            "Config": config,
        }))
    }
}

fn print_method(m: &Value) {
    println!("Name:          {}", s(&m["Name"]));
    println!("Type:          {}", s(&m["Type"]));
    println!("DisplayName:   {}", s(&m["DisplayName"]));
    println!("Description:   {}", s(&m["Description"]));
    if let Some(ttl) = m["MaxTokenTTL"].as_str() {
        println!("MaxTokenTTL:   {ttl}");
    }
    println!(
        "TokenLocality: {}",
        m["TokenLocality"].as_str().unwrap_or("local")
    );
    if m.get("Config").is_some() {
        println!("Config:");
        println!(
            "{}",
            serde_json::to_string_pretty(&m["Config"]).unwrap_or_default()
        );
    }
}

pub fn auth_method(c: &Client, cmd: AuthMethodCmd) -> CliResult {
    match cmd {
        AuthMethodCmd::Create(a) => {
            create(c, "/v1/acl/auth-method", a.body()?, a.format, print_method)
        }
        AuthMethodCmd::Update(a) => {
            let path = format!("/v1/acl/auth-method/{}", enc(&a.name));
            let v = send(c, reqwest::Method::PUT, &path, Some(a.body()?)).map_err(|e| {
                CliError(format!("Error updating auth method {:?}: {}", a.name, e.0))
            })?;
            show(a.format, &v, print_method)
        }
        AuthMethodCmd::Read(a) => {
            let path = format!("/v1/acl/auth-method/{}", enc(&a.name));
            show(
                a.format,
                &send(c, reqwest::Method::GET, &path, None)?,
                print_method,
            )
        }
        AuthMethodCmd::List(f) => list(c, "/v1/acl/auth-methods", f.format, print_method),
        AuthMethodCmd::Delete(a) => {
            let path = format!("/v1/acl/auth-method/{}", enc(&a.name));
            send(c, reqwest::Method::DELETE, &path, None)?;
            println!("Auth-method {:?} deleted successfully", a.name);
            Ok(())
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum BindingRuleCmd {
    Create(RuleArgs),
    /// Replace a rule's settings (`-id` names it).
    Update(RuleArgs),
    Read(ById),
    List(RuleList),
    Delete(ById),
}

#[derive(Args, Debug)]
pub struct ById {
    #[arg(long)]
    id: String,
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

#[derive(Args, Debug)]
pub struct RuleList {
    /// Only the rules of this auth method.
    #[arg(long)]
    method: Option<String>,
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

#[derive(Args, Debug)]
pub struct RuleArgs {
    /// The rule to update (`update` only).
    #[arg(long)]
    id: Option<String>,
    /// The auth method the rule belongs to.
    #[arg(long, default_value = "")]
    method: String,
    #[arg(long, default_value = "")]
    description: String,
    /// A filter over the method's fields; empty: every login.
    #[arg(long, default_value = "")]
    selector: String,
    /// service, node, role, policy or templated-policy.
    #[arg(long, default_value = "")]
    bind_type: String,
    /// What to bind, `${var}` interpolated.
    #[arg(long, default_value = "")]
    bind_name: String,
    /// `name=VALUE`: a templated policy's variable.
    #[arg(long)]
    bind_vars: Vec<String>,
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

impl RuleArgs {
    fn body(&self) -> Result<Value, CliError> {
        let mut body = json!({
            "AuthMethod": self.method,
            "Description": self.description,
            "Selector": self.selector,
            "BindType": self.bind_type,
            "BindName": self.bind_name,
        });
        for kv in &self.bind_vars {
            match kv.split_once('=') {
                Some(("name", v)) => body["BindVars"] = json!({"Name": v}),
                _ => return Err(CliError(format!("-bind-vars {kv:?}: expected name=VALUE"))),
            }
        }
        Ok(body)
    }
}

fn print_rule(r: &Value) {
    println!("ID:           {}", s(&r["ID"]));
    println!("AuthMethod:   {}", s(&r["AuthMethod"]));
    println!("Description:  {}", s(&r["Description"]));
    println!("BindType:     {}", s(&r["BindType"]));
    println!("BindName:     {}", s(&r["BindName"]));
    println!("Selector:     {}", s(&r["Selector"]));
}

pub fn binding_rule(c: &Client, cmd: BindingRuleCmd) -> CliResult {
    match cmd {
        BindingRuleCmd::Create(a) => {
            create(c, "/v1/acl/binding-rule", a.body()?, a.format, print_rule)
        }
        BindingRuleCmd::Update(a) => {
            let id =
                a.id.clone()
                    .ok_or_else(|| CliError("Must specify the -id parameter".into()))?;
            let path = format!("/v1/acl/binding-rule/{}", enc(&id));
            let v = send(c, reqwest::Method::PUT, &path, Some(a.body()?))
                .map_err(|e| CliError(format!("Error updating binding rule {id:?}: {}", e.0)))?;
            show(a.format, &v, print_rule)
        }
        BindingRuleCmd::Read(a) => {
            let path = format!("/v1/acl/binding-rule/{}", enc(&a.id));
            show(
                a.format,
                &send(c, reqwest::Method::GET, &path, None)?,
                print_rule,
            )
        }
        BindingRuleCmd::List(a) => {
            let path = match &a.method {
                Some(m) => format!("/v1/acl/binding-rules?authmethod={}", enc(m)),
                None => "/v1/acl/binding-rules".to_string(),
            };
            list(c, &path, a.format, print_rule)
        }
        BindingRuleCmd::Delete(a) => {
            let path = format!("/v1/acl/binding-rule/{}", enc(&a.id));
            send(c, reqwest::Method::DELETE, &path, None)?;
            println!("Binding rule {:?} deleted successfully", a.id);
            Ok(())
        }
    }
}
