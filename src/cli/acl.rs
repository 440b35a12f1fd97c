//! `cairn acl`: bootstrap, tokens, policies and roles, printed as Consul's
//! CLI prints them (`AccessorID:`, `SecretID:`, ... lines), or `-format
//! json`.

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::{CliError, CliResult, Client, Format, enc, print_json};

#[derive(Subcommand, Debug)]
pub enum AclCmd {
    /// Create the first management token (once per cluster).
    Bootstrap(FormatArg),
    /// Create, read, list and delete tokens.
    #[command(subcommand)]
    Token(TokenCmd),
    /// Create, read, list and delete policies.
    #[command(subcommand)]
    Policy(PolicyCmd),
    /// Create, read, list and delete roles.
    #[command(subcommand)]
    Role(RoleCmd),
    /// Set one of the agent's tokens (default, agent, dns, recovery,
    /// config_file_service_registration, replication), in its memory.
    SetAgentToken(SetAgentToken),
}

#[derive(Args, Debug)]
pub struct SetAgentToken {
    kind: String,
    token: String,
}

#[derive(Args, Debug)]
pub struct FormatArg {
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

#[derive(Subcommand, Debug)]
pub enum TokenCmd {
    Create(TokenCreate),
    /// Change a token's description, policies or roles.
    Update(TokenUpdate),
    /// A new token with the same policies and roles as -id.
    Clone(TokenClone),
    Read(TokenRead),
    List(FormatArg),
    Delete(ById),
}

#[derive(Args, Debug)]
pub struct TokenCreate {
    #[arg(long, default_value = "")]
    description: String,
    #[command(flatten)]
    policies: PolicyLinks,
    #[command(flatten)]
    roles: RoleLinks,
    /// The token's secret (a UUID; default: a new one).
    #[arg(long)]
    secret: Option<String>,
    /// The token's accessor (a UUID; default: a new one).
    #[arg(long)]
    accessor: Option<String>,
    /// A Go duration after which the token stops working.
    #[arg(long)]
    expires_ttl: Option<String>,
    #[arg(long)]
    local: bool,
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

#[derive(Args, Debug)]
pub struct TokenUpdate {
    /// The token's accessor ID.
    #[arg(long)]
    id: String,
    #[arg(long)]
    description: Option<String>,
    #[command(flatten)]
    policies: PolicyLinks,
    #[command(flatten)]
    roles: RoleLinks,
    /// Add the given policies to the token's own (else they replace them).
    #[arg(long)]
    merge_policies: bool,
    /// Add the given roles to the token's own (else they replace them).
    #[arg(long)]
    merge_roles: bool,
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

#[derive(Args, Debug)]
pub struct TokenClone {
    /// The accessor ID of the token to clone.
    #[arg(long)]
    id: String,
    #[arg(long)]
    description: Option<String>,
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

#[derive(Args, Debug)]
pub struct TokenRead {
    /// The token's accessor ID.
    #[arg(long)]
    id: Option<String>,
    /// The token this command runs with.
    #[arg(long = "self")]
    me: bool,
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

#[derive(Args, Debug)]
pub struct ById {
    #[arg(long)]
    id: String,
}

#[derive(Subcommand, Debug)]
pub enum PolicyCmd {
    Create(PolicyCreate),
    /// Change a policy's name, description or rules.
    Update(PolicyUpdate),
    Read(ByIdOrName),
    List(FormatArg),
    Delete(ByIdOrName),
}

#[derive(Args, Debug)]
pub struct PolicyCreate {
    #[arg(long)]
    name: String,
    #[arg(long, default_value = "")]
    description: String,
    /// The rules (HCL or JSON), or `@file` to read them from a file.
    #[arg(long, default_value = "")]
    rules: String,
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

#[derive(Args, Debug)]
pub struct PolicyUpdate {
    #[arg(long)]
    id: Option<String>,
    #[arg(long)]
    name: Option<String>,
    #[arg(long)]
    new_name: Option<String>,
    #[arg(long)]
    description: Option<String>,
    /// The new rules (HCL or JSON), or `@file`.
    #[arg(long)]
    rules: Option<String>,
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

#[derive(Args, Debug)]
pub struct ByIdOrName {
    #[arg(long)]
    id: Option<String>,
    #[arg(long)]
    name: Option<String>,
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

#[derive(Subcommand, Debug)]
pub enum RoleCmd {
    Create(RoleCreate),
    Read(ByIdOrName),
    List(FormatArg),
    Delete(ByIdOrName),
}

#[derive(Args, Debug)]
pub struct RoleCreate {
    #[arg(long)]
    name: String,
    #[arg(long, default_value = "")]
    description: String,
    #[command(flatten)]
    policies: PolicyLinks,
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

/// The roles a token links to.
#[derive(Args, Debug)]
pub struct RoleLinks {
    /// A role by name (repeatable).
    #[arg(long)]
    role_name: Vec<String>,
    /// A role by ID (repeatable).
    #[arg(long)]
    role_id: Vec<String>,
}

/// The policies a new token or role links to.
#[derive(Args, Debug)]
pub struct PolicyLinks {
    /// A policy by name (repeatable).
    #[arg(long)]
    policy_name: Vec<String>,
    /// A policy by ID (repeatable).
    #[arg(long)]
    policy_id: Vec<String>,
}

pub fn run(c: &Client, cmd: AclCmd) -> CliResult {
    match cmd {
        AclCmd::Bootstrap(f) => {
            let t = send(
                c,
                reqwest::Method::PUT,
                "/v1/acl/bootstrap",
                Some(json!({})),
            )?;
            show(f.format, &t, print_token)
        }
        AclCmd::Token(t) => token(c, t),
        AclCmd::SetAgentToken(a) => {
            let path = format!("/v1/agent/token/{}", super::enc(&a.kind));
            let body = json!({ "Token": a.token }).to_string();
            c.expect_ok(reqwest::Method::PUT, &path, Some(body))
                .map_err(|e| CliError(format!("Failed setting token: {}", e.0)))?;
            println!("ACL token {:?} set successfully", a.kind);
            Ok(())
        }
        AclCmd::Policy(p) => policy(c, p),
        AclCmd::Role(r) => role(c, r),
    }
}

/// A request whose answer must be 2xx JSON.
fn send(
    c: &Client, method: reqwest::Method, path: &str, body: Option<Value>,
) -> Result<Value, CliError> {
    let body = body.map(|b| b.to_string());
    c.expect_ok(method, path, body)?.json()
}

fn show(format: Format, v: &Value, pretty: fn(&Value)) -> CliResult {
    if format == Format::Json {
        return print_json(v);
    }
    pretty(v);
    Ok(())
}

/// `PUT path` with `body` (a create), its answer shown.
fn create(c: &Client, path: &str, body: Value, format: Format, pretty: fn(&Value)) -> CliResult {
    let v = send(c, reqwest::Method::PUT, path, Some(body))?;
    show(format, &v, pretty)
}

/// `GET path` (a listing), each item shown.
fn list(c: &Client, path: &str, format: Format, pretty: fn(&Value)) -> CliResult {
    let v = &send(c, reqwest::Method::GET, path, None)?;
    if format == Format::Json {
        return print_json(v);
    }
    for (i, item) in v.as_array().into_iter().flatten().enumerate() {
        if i > 0 {
            println!();
        }
        pretty(item);
    }
    Ok(())
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

fn links(v: &Value) {
    for l in v.as_array().into_iter().flatten() {
        println!("   {} - {}", s(&l["ID"]), s(&l["Name"]));
    }
}

fn print_token(t: &Value) {
    println!("AccessorID:       {}", s(&t["AccessorID"]));
    println!("SecretID:         {}", s(&t["SecretID"]));
    println!("Description:      {}", s(&t["Description"]));
    println!(
        "Local:            {}",
        t["Local"].as_bool().unwrap_or(false)
    );
    println!("Create Time:      {}", s(&t["CreateTime"]));
    if !s(&t["ExpirationTime"]).is_empty() {
        println!("Expiration Time:  {}", s(&t["ExpirationTime"]));
    }
    if t["Policies"].as_array().is_some_and(|p| !p.is_empty()) {
        println!("Policies:");
        links(&t["Policies"]);
    }
    if t["Roles"].as_array().is_some_and(|p| !p.is_empty()) {
        println!("Roles:");
        links(&t["Roles"]);
    }
}

fn print_policy(p: &Value) {
    println!("ID:           {}", s(&p["ID"]));
    println!("Name:         {}", s(&p["Name"]));
    println!("Description:  {}", s(&p["Description"]));
    let dcs: Vec<&str> = p["Datacenters"]
        .as_array()
        .into_iter()
        .flatten()
        .map(s)
        .collect();
    println!("Datacenters:  {}", dcs.join(", "));
    println!("Rules:");
    println!("{}", s(&p["Rules"]));
}

fn print_role(r: &Value) {
    println!("ID:           {}", s(&r["ID"]));
    println!("Name:         {}", s(&r["Name"]));
    println!("Description:  {}", s(&r["Description"]));
    if r["Policies"].as_array().is_some_and(|p| !p.is_empty()) {
        println!("Policies:");
        links(&r["Policies"]);
    }
}

fn link_list(ids: &[String], names: &[String]) -> Vec<Value> {
    ids.iter()
        .map(|i| json!({ "ID": i }))
        .chain(names.iter().map(|n| json!({ "Name": n })))
        .collect()
}

/// Rules as given, or read from `@file`.
fn rules_arg(rules: String) -> Result<String, CliError> {
    match rules.strip_prefix('@') {
        Some(file) => std::fs::read_to_string(file)
            .map_err(|e| CliError(format!("Failed to read rules from {file}: {e}"))),
        None => Ok(rules),
    }
}

/// A token's links after an update: the given ones added (`merge`) or in
/// place of the old; none given leaves them as they were.
fn relink(current: &mut Value, given: Vec<Value>, merge: bool) {
    if given.is_empty() {
        return;
    }
    if merge && let Some(list) = current.as_array_mut() {
        list.extend(given);
    } else {
        *current = Value::Array(given);
    }
}

fn token(c: &Client, cmd: TokenCmd) -> CliResult {
    match cmd {
        TokenCmd::Create(a) => {
            let mut body = json!({
                "Description": a.description,
                "Policies": link_list(&a.policies.policy_id, &a.policies.policy_name),
                "Roles": link_list(&a.roles.role_id, &a.roles.role_name),
                "Local": a.local,
            });
            if let Some(sec) = a.secret {
                body["SecretID"] = json!(sec);
            }
            if let Some(acc) = a.accessor {
                body["AccessorID"] = json!(acc);
            }
            if let Some(ttl) = a.expires_ttl {
                body["ExpirationTTL"] = json!(ttl);
            }
            create(c, "/v1/acl/token", body, a.format, print_token)
        }
        TokenCmd::Update(a) => {
            let path = format!("/v1/acl/token/{}", enc(&a.id));
            let mut t = send(c, reqwest::Method::GET, &path, None)
                .map_err(|e| CliError(format!("Error when retrieving current token: {}", e.0)))?;
            // Reads show the secret as `<hidden>`; an update keeps it.
            if let Some(o) = t.as_object_mut() {
                o.remove("SecretID");
            }
            if let Some(d) = a.description {
                t["Description"] = json!(d);
            }
            let policies = link_list(&a.policies.policy_id, &a.policies.policy_name);
            relink(&mut t["Policies"], policies, a.merge_policies);
            relink(
                &mut t["Roles"],
                link_list(&a.roles.role_id, &a.roles.role_name),
                a.merge_roles,
            );
            let v = send(c, reqwest::Method::PUT, &path, Some(t))
                .map_err(|e| CliError(format!("Failed to update token {}: {}", a.id, e.0)))?;
            if a.format == Format::Pretty {
                println!("Token updated successfully.");
            }
            show(a.format, &v, print_token)
        }
        TokenCmd::Clone(a) => {
            let path = format!("/v1/acl/token/{}/clone", enc(&a.id));
            let body = json!({ "Description": a.description.unwrap_or_default() });
            let v = send(c, reqwest::Method::PUT, &path, Some(body))
                .map_err(|e| CliError(format!("Failed to clone token: {}", e.0)))?;
            if a.format == Format::Pretty {
                println!("Token cloned successfully.");
            }
            show(a.format, &v, print_token)
        }
        TokenCmd::Read(a) => {
            let path = match (a.me, a.id) {
                (true, _) => "/v1/acl/token/self".to_string(),
                (false, Some(id)) => format!("/v1/acl/token/{}", enc(&id)),
                (false, None) => return Err(CliError("Must specify the -id or -self".into())),
            };
            let t = send(c, reqwest::Method::GET, &path, None)?;
            show(a.format, &t, print_token)
        }
        TokenCmd::List(f) => list(c, "/v1/acl/tokens", f.format, print_token),
        TokenCmd::Delete(a) => {
            send(
                c,
                reqwest::Method::DELETE,
                &format!("/v1/acl/token/{}", enc(&a.id)),
                None,
            )?;
            println!("Token {:?} deleted successfully", a.id);
            Ok(())
        }
    }
}

/// A policy's or role's path by `-id` or `-name`.
fn by(kind: &str, a: &ByIdOrName) -> Result<String, CliError> {
    match (&a.id, &a.name) {
        (Some(id), _) => Ok(format!("/v1/acl/{kind}/{}", enc(id))),
        (None, Some(n)) => Ok(format!("/v1/acl/{kind}/name/{}", enc(n))),
        (None, None) => Err(CliError("Must specify the -id or -name".into())),
    }
}

/// Reads a policy or role (`kind`) by `-id` or `-name`.
fn read_named(c: &Client, kind: &str, a: &ByIdOrName, pretty: fn(&Value)) -> CliResult {
    let v = send(c, reqwest::Method::GET, &by(kind, a)?, None)?;
    show(a.format, &v, pretty)
}

/// Deletes a policy or role found by `-id` or `-name` (the API deletes by
/// ID only).
fn delete_named(c: &Client, kind: &str, label: &str, a: &ByIdOrName) -> CliResult {
    let v = send(c, reqwest::Method::GET, &by(kind, a)?, None)?;
    let id = s(&v["ID"]).to_string();
    let path = format!("/v1/acl/{kind}/{}", enc(&id));
    send(c, reqwest::Method::DELETE, &path, None)?;
    println!("{label} {id:?} deleted successfully");
    Ok(())
}

fn policy(c: &Client, cmd: PolicyCmd) -> CliResult {
    match cmd {
        PolicyCmd::Create(a) => {
            let rules = rules_arg(a.rules)?;
            let body = json!({ "Name": a.name, "Description": a.description, "Rules": rules });
            create(c, "/v1/acl/policy", body, a.format, print_policy)
        }
        PolicyCmd::Update(a) => {
            let which = ByIdOrName {
                id: a.id,
                name: a.name,
                format: a.format,
            };
            let mut p = send(c, reqwest::Method::GET, &by("policy", &which)?, None)
                .map_err(|e| CliError(format!("Error retrieving the policy: {}", e.0)))?;
            if let Some(n) = a.new_name {
                p["Name"] = json!(n);
            }
            if let Some(d) = a.description {
                p["Description"] = json!(d);
            }
            if let Some(r) = a.rules {
                p["Rules"] = json!(rules_arg(r)?);
            }
            let path = format!("/v1/acl/policy/{}", enc(s(&p["ID"])));
            let v = send(c, reqwest::Method::PUT, &path, Some(p))
                .map_err(|e| CliError(format!("Error updating policy: {}", e.0)))?;
            show(a.format, &v, print_policy)
        }
        PolicyCmd::Read(a) => read_named(c, "policy", &a, print_policy),
        PolicyCmd::List(f) => list(c, "/v1/acl/policies", f.format, print_policy),
        PolicyCmd::Delete(a) => delete_named(c, "policy", "Policy", &a),
    }
}

fn role(c: &Client, cmd: RoleCmd) -> CliResult {
    match cmd {
        RoleCmd::Create(a) => {
            let body = json!({
                "Name": a.name,
                "Description": a.description,
                "Policies": link_list(&a.policies.policy_id, &a.policies.policy_name),
            });
            create(c, "/v1/acl/role", body, a.format, print_role)
        }
        RoleCmd::Read(a) => read_named(c, "role", &a, print_role),
        RoleCmd::List(f) => list(c, "/v1/acl/roles", f.format, print_role),
        RoleCmd::Delete(a) => delete_named(c, "role", "Role", &a),
    }
}
