//! `cairn acl`: bootstrap, tokens, policies and roles, printed as Consul's
//! CLI prints them (`AccessorID:`, `SecretID:`, ... lines), or `-format
//! json`.

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::{
    CliError, CliResult, Client, Format, create, enc, list, print_json, rules_arg, s, send, show,
};

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
    /// List, read and preview the built-in templated policies.
    #[command(subcommand)]
    TemplatedPolicy(TemplatedCmd),
    /// Create, read, update, list and delete auth methods.
    #[command(subcommand)]
    AuthMethod(super::login::AuthMethodCmd),
    /// Create, read, update, list and delete binding rules.
    #[command(subcommand)]
    BindingRule(super::login::BindingRuleCmd),
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
    #[command(flatten)]
    identities: IdentityArgs,
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
    /// Change a role: its policies and identities added to its own
    /// (`-no-merge`: in their place).
    Update(RoleUpdate),
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
    #[command(flatten)]
    identities: IdentityArgs,
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

#[derive(Args, Debug)]
pub struct RoleUpdate {
    /// The role's ID.
    #[arg(long)]
    id: String,
    /// A new name.
    #[arg(long)]
    name: Option<String>,
    #[arg(long)]
    description: Option<String>,
    #[command(flatten)]
    policies: PolicyLinks,
    #[command(flatten)]
    identities: IdentityArgs,
    /// Replace the role's policies and identities with those given (and
    /// its description with the one given, or none), instead of adding.
    #[arg(long)]
    no_merge: bool,
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

/// A new token's or role's identities, as Consul's flags give them.
#[derive(Args, Debug)]
pub struct IdentityArgs {
    /// `NAME[:DC1,DC2]`: a service identity (repeatable).
    #[arg(long)]
    service_identity: Vec<String>,
    /// `NAME:DC`: a node identity (repeatable).
    #[arg(long)]
    node_identity: Vec<String>,
    /// A built-in templated policy by name (`-var` gives its variables).
    #[arg(long)]
    templated_policy: Option<String>,
    /// `name:VALUE`: a variable of `-templated-policy`.
    #[arg(long)]
    var: Vec<String>,
}

impl IdentityArgs {
    /// Their JSON fields (`ServiceIdentities`, `NodeIdentities`,
    /// `TemplatedPolicies`), added to `body`.
    fn add_to(&self, body: &mut Value) -> CliResult {
        use crate::structs::acl::{Identities, NodeIdentity, ServiceIdentity, TemplatedPolicy};
        let service_identities = self
            .service_identity
            .iter()
            .map(|si| match si.split_once(':') {
                Some((name, dcs)) => ServiceIdentity {
                    service_name: name.into(),
                    datacenters: dcs.split(',').map(String::from).collect(),
                },
                None => ServiceIdentity {
                    service_name: si.clone(),
                    datacenters: Vec::new(),
                },
            })
            .collect();
        let node_identities = self
            .node_identity
            .iter()
            .map(|ni| match ni.split_once(':') {
                Some((name, dc)) => Ok(NodeIdentity {
                    node_name: name.into(),
                    datacenter: dc.into(),
                }),
                None => Err(CliError(format!(
                    "Malformed -node-identity argument: {ni:?}"
                ))),
            })
            .collect::<Result<_, CliError>>()?;
        let templated_policies = match &self.templated_policy {
            Some(name) => vec![TemplatedPolicy {
                template_name: name.clone(),
                template_variables: Some(variables(&self.var)?),
                datacenters: Vec::new(),
            }],
            None if !self.var.is_empty() => {
                return Err(CliError("-var must be used with -templated-policy".into()));
            }
            None => Vec::new(),
        };
        let ids = Identities {
            service_identities,
            node_identities,
            templated_policies,
        };
        // The token's or role's own JSON fields (empty ones left out).
        if let (Value::Object(fields), Some(out)) = (
            serde_json::to_value(&ids).unwrap_or_default(),
            body.as_object_mut(),
        ) {
            out.extend(fields);
        }
        Ok(())
    }
}

/// `-var name:VALUE` flags as a template's variables (`name` is the one
/// the built-in templates take).
fn variables(vars: &[String]) -> Result<crate::structs::acl::TemplateVariables, CliError> {
    let mut out = crate::structs::acl::TemplateVariables::default();
    for v in vars {
        let (k, val) = v.split_once(':').ok_or_else(|| {
            CliError(format!(
                "Malformed -var argument: {v:?}, expecting VariableName:Value"
            ))
        })?;
        if !k.eq_ignore_ascii_case("name") {
            return Err(CliError(format!("Unknown -var {k:?}: templates take name")));
        }
        out.name = val.to_string();
    }
    Ok(out)
}

#[derive(Subcommand, Debug)]
pub enum TemplatedCmd {
    List(FormatArg),
    Read(TemplatedName),
    /// The policy a template renders to with `-var` variables.
    Preview(TemplatedPreview),
}

#[derive(Args, Debug)]
pub struct TemplatedName {
    #[arg(long)]
    name: String,
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

#[derive(Args, Debug)]
pub struct TemplatedPreview {
    #[arg(long)]
    name: String,
    /// `name:VALUE` (repeatable).
    #[arg(long)]
    var: Vec<String>,
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
        AclCmd::TemplatedPolicy(t) => templated(c, t),
        AclCmd::AuthMethod(m) => super::login::auth_method(c, m),
        AclCmd::BindingRule(r) => super::login::binding_rule(c, r),
    }
}

fn print_template(t: &Value) {
    println!("Name:            {}", s(&t["TemplateName"]));
    println!("Description:     {}", s(&t["Description"]));
    let needs = if s(&t["Schema"]).is_empty() {
        "None"
    } else {
        "name"
    };
    println!("Input variables: {needs}");
    println!("Raw Template:");
    println!("{}", s(&t["Template"]));
}

fn templated(c: &Client, cmd: TemplatedCmd) -> CliResult {
    match cmd {
        TemplatedCmd::List(f) => {
            let all = send(c, reqwest::Method::GET, "/v1/acl/templated-policies", None)?;
            if f.format == Format::Json {
                return print_json(&all);
            }
            for (i, t) in all
                .as_object()
                .into_iter()
                .flatten()
                .map(|(_, t)| t)
                .enumerate()
            {
                if i > 0 {
                    println!();
                }
                println!("{}", s(&t["TemplateName"]));
                println!("   Description: {}", s(&t["Description"]));
            }
            Ok(())
        }
        TemplatedCmd::Read(a) => {
            let path = format!("/v1/acl/templated-policy/name/{}", a.name);
            let t = send(c, reqwest::Method::GET, &path, None)?;
            show(a.format, &t, print_template)
        }
        TemplatedCmd::Preview(a) => {
            let path = format!("/v1/acl/templated-policy/preview/{}", a.name);
            let body = serde_json::to_value(variables(&a.var)?).unwrap_or_default();
            let p = send(c, reqwest::Method::POST, &path, Some(body))?;
            show(a.format, &p, print_policy)
        }
    }
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
    print_identities(t);
}

/// A token's or role's identities, as Consul's CLI lists them.
fn print_identities(v: &Value) {
    let Ok(ids) = serde_json::from_value::<crate::structs::acl::Identities>(v.clone()) else {
        return;
    };
    let dcs = |d: &[String]| {
        if d.is_empty() {
            "all".to_string()
        } else {
            d.join(", ")
        }
    };
    let section = |title: &str, lines: Vec<String>| {
        if !lines.is_empty() {
            println!("{title}:");
            lines.iter().for_each(|l| println!("{l}"));
        }
    };
    let services = ids.service_identities.iter();
    section(
        "Service Identities",
        services
            .map(|si| {
                format!(
                    "   {} (Datacenters: {})",
                    si.service_name,
                    dcs(&si.datacenters)
                )
            })
            .collect(),
    );
    let nodes = ids.node_identities.iter();
    section(
        "Node Identities",
        nodes
            .map(|ni| format!("   {} (Datacenter: {})", ni.node_name, ni.datacenter))
            .collect(),
    );
    let templated = ids.templated_policies.iter();
    section(
        "Templated Policies",
        templated
            .map(|tp| {
                let name = tp.template_variables.as_ref().map(|v| v.name.as_str());
                let name = name.filter(|n| !n.is_empty());
                format!(
                    "   {}{}\n      Datacenters: {}",
                    tp.template_name,
                    name.map(|n| format!("\n      Name: {n}"))
                        .unwrap_or_default(),
                    dcs(&tp.datacenters)
                )
            })
            .collect(),
    );
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
    print_identities(r);
}

fn link_list(ids: &[String], names: &[String]) -> Vec<Value> {
    ids.iter()
        .map(|i| json!({ "ID": i }))
        .chain(names.iter().map(|n| json!({ "Name": n })))
        .collect()
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
            a.identities.add_to(&mut body)?;
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
            let mut body = json!({
                "Name": a.name,
                "Description": a.description,
                "Policies": link_list(&a.policies.policy_id, &a.policies.policy_name),
            });
            a.identities.add_to(&mut body)?;
            create(c, "/v1/acl/role", body, a.format, print_role)
        }
        RoleCmd::Update(a) => {
            let path = format!("/v1/acl/role/{}", enc(&a.id));
            let mut r = send(c, reqwest::Method::GET, &path, None)
                .map_err(|e| CliError(format!("Error when retrieving current role: {}", e.0)))?;
            if let Some(n) = a.name {
                r["Name"] = json!(n);
            }
            match a.description {
                Some(d) => r["Description"] = json!(d),
                None if a.no_merge => r["Description"] = json!(""),
                None => {}
            }
            let mut given = json!({
                "Policies": link_list(&a.policies.policy_id, &a.policies.policy_name),
            });
            a.identities.add_to(&mut given)?;
            for field in [
                "Policies",
                "ServiceIdentities",
                "NodeIdentities",
                "TemplatedPolicies",
            ] {
                let new = given[field].as_array().cloned().unwrap_or_default();
                if a.no_merge {
                    r[field] = Value::Array(new);
                } else {
                    if !r[field].is_array() {
                        r[field] = json!([]);
                    }
                    relink(&mut r[field], new, true);
                }
            }
            let v = send(c, reqwest::Method::PUT, &path, Some(r))
                .map_err(|e| CliError(format!("Failed to update role {}: {}", a.id, e.0)))?;
            if a.format == Format::Pretty {
                println!("Role updated successfully.");
            }
            show(a.format, &v, print_role)
        }
        RoleCmd::Read(a) => read_named(c, "role", &a, print_role),
        RoleCmd::List(f) => list(c, "/v1/acl/roles", f.format, print_role),
        RoleCmd::Delete(a) => delete_named(c, "role", "Role", &a),
    }
}
