//! Identities: what a token or role grants besides its policies, as
//! Consul's synthetic policies. A service identity, a node identity and a
//! templated policy each expand to rule text (Consul's built-in templates,
//! rendered with the identity's name) that the authorizer merges like any
//! policy's, in the datacenters the identity names.
//!
//! The rules of the `acl` types, as pure functions: the state layer's token
//! resolver expands identities once per token version, the HTTP layer
//! validates them on write and previews templates.

use super::acl::{
    AclPolicy, Identities, NodeIdentity, ServiceIdentity, TemplateVariables, TemplatedPolicy,
};

/// One of Consul's built-in templated policies.
pub struct Template {
    pub name: &'static str,
    pub id: &'static str,
    /// The JSON schema of its variables (empty: it takes none).
    pub schema: &'static str,
    /// Rule text; `{{.Name}}` stands for the `name` variable.
    pub template: &'static str,
    pub description: &'static str,
}

pub const SERVICE: &str = "builtin/service";
pub const NODE: &str = "builtin/node";

/// The schema of a template that needs a name.
const NAME_SCHEMA: &str = "{\n\t\"type\": \"object\",\n\t\"properties\": {\n\t\t\"name\": { \"type\": \"string\", \"$ref\": \"#/definitions/min-length-one\" }\n\t},\n\t\"required\": [\"name\"],\n\t\"definitions\": {\n\t\t\"min-length-one\": {\n\t\t\t\t\"type\": \"string\",\n\t\t\t\t\"minLength\": 1\n\t\t}\n\t}\n}";

/// Consul CE's built-in templates (its `workload-identity` one is gone
/// from Consul, and needs the v2 `identity` rules cairn does not have).
pub const TEMPLATES: &[Template] = &[
    Template {
        name: SERVICE,
        id: "00000000-0000-0000-0000-000000000003",
        schema: NAME_SCHEMA,
        template: "\nservice \"{{.Name}}\" {\n\tpolicy = \"write\"\n}\nservice \"{{.Name}}-sidecar-proxy\" {\n\tpolicy = \"write\"\n}\nservice_prefix \"\" {\n\tpolicy = \"read\"\n}\nnode_prefix \"\" {\n\tpolicy = \"read\"\n}",
        description: "Gives the token or role permissions to register a service and discover services in the Consul catalog. It also gives the specified service's sidecar proxy the permission to discover and route traffic to other services.",
    },
    Template {
        name: NODE,
        id: "00000000-0000-0000-0000-000000000004",
        schema: NAME_SCHEMA,
        template: "\nnode \"{{.Name}}\" {\n\tpolicy = \"write\"\n}\nservice_prefix \"\" {\n\tpolicy = \"read\"\n}",
        description: "Gives the token or role permissions for a register an agent/node into the catalog. A node is typically a consul agent but can also be a physical server, cloud instance or a container.",
    },
    Template {
        name: "builtin/dns",
        id: "00000000-0000-0000-0000-000000000005",
        schema: "",
        template: "\nnode_prefix \"\" {\n\tpolicy = \"read\"\n}\nservice_prefix \"\" {\n\tpolicy = \"read\"\n}\nquery_prefix \"\" {\n\tpolicy = \"read\"\n}",
        description: "Gives the token or role permissions for the Consul DNS to query services in the network.",
    },
    Template {
        name: "builtin/nomad-server",
        id: "00000000-0000-0000-0000-000000000006",
        schema: "",
        template: "\nacl = \"write\"\nagent_prefix \"\" {\n  policy = \"read\"\n}\nnode_prefix \"\" {\n  policy = \"read\"\n}\nservice_prefix \"\" {\n  policy = \"write\"\n}",
        description: "Gives the token or role permissions required for integration with a nomad server.",
    },
    Template {
        name: "builtin/api-gateway",
        id: "00000000-0000-0000-0000-000000000008",
        schema: NAME_SCHEMA,
        template: "mesh = \"read\"\nnode_prefix \"\" {\n\tpolicy = \"read\"\n}\nservice_prefix \"\" {\n\tpolicy = \"read\"\n}\nservice \"{{.Name}}\" {\n\tpolicy = \"write\"\n}",
        description: "Gives the token or role permissions for a Consul api gateway",
    },
    Template {
        name: "builtin/nomad-client",
        id: "00000000-0000-0000-0000-000000000009",
        schema: "",
        template: "agent_prefix \"\" {\n  policy = \"read\"\n}\nnode_prefix \"\" {\n  policy = \"read\"\n}\nservice_prefix \"\" {\n  policy = \"write\"\n}\nkey_prefix \"\" {\n  policy = \"read\"\n}",
        description: "Gives the token or role permissions required for integration with a nomad client.",
    },
];

pub fn template(name: &str) -> Option<&'static Template> {
    TEMPLATES.iter().find(|t| t.name == name)
}

/// Why an identity is refused, in Consul's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("Service identity is missing the service name field on this {0}")]
    MissingServiceName(&'static str),
    #[error("Service identity {0:?} cannot specify a list of datacenters on a local token")]
    LocalDatacenters(String),
    #[error(
        "Service identity {0:?} has an invalid name. Only lowercase alphanumeric characters, '-' and '_' are allowed"
    )]
    BadServiceName(String),
    #[error("Node identity is missing the node name field on this {0}")]
    MissingNodeName(&'static str),
    #[error("Node identity is missing the datacenter field on this {0}")]
    MissingDatacenter(&'static str),
    #[error(
        "Node identity has an invalid name. Only lowercase alphanumeric characters, '-' and '_' are allowed"
    )]
    BadNodeName,
    #[error("templated policy is missing the template name field on this {0}")]
    MissingTemplateName(&'static str),
    #[error("no such ACL templated policy with Name {0:?}")]
    NoSuchTemplate(String),
    #[error("validation error for templated policy {0:?}: {1}")]
    Variables(String, String),
    #[error("templated policy {0:?} cannot specify a list of datacenters on a local token")]
    TemplateLocalDatacenters(String),
}

/// Consul's identity names: lowercase letters and digits, with `-` and `_`
/// inside, at most 256 bytes.
pub fn valid_identity_name(name: &str) -> bool {
    let b = name.as_bytes();
    let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= 256
        && b.first().is_some_and(edge)
        && b.last().is_some_and(edge)
        && b.iter().all(|c| edge(c) || *c == b'-' || *c == b'_')
}

/// Checks a token's (`local` given) or a role's (`None`) identities and
/// returns them deduplicated as Consul stores them: one service identity
/// per name (their datacenters joined), one node identity per name and
/// datacenter, one templated policy per template and variables.
pub fn normalize(ids: Identities, local: Option<bool>) -> Result<Identities, IdentityError> {
    let on = if local.is_some() { "token" } else { "role" };
    let local = local.unwrap_or(false);
    let mut services: Vec<ServiceIdentity> = Vec::new();
    for s in ids.service_identities {
        if s.service_name.is_empty() {
            return Err(IdentityError::MissingServiceName(on));
        }
        if local && !s.datacenters.is_empty() {
            return Err(IdentityError::LocalDatacenters(s.service_name));
        }
        if !valid_identity_name(&s.service_name) {
            return Err(IdentityError::BadServiceName(s.service_name));
        }
        match services
            .iter_mut()
            .find(|o| o.service_name == s.service_name)
        {
            // One without datacenters holds in all of them.
            Some(o) if o.datacenters.is_empty() || s.datacenters.is_empty() => {
                o.datacenters.clear();
            }
            Some(o) => {
                for dc in s.datacenters {
                    if !o.datacenters.contains(&dc) {
                        o.datacenters.push(dc);
                    }
                }
            }
            None => services.push(s),
        }
    }
    let mut nodes: Vec<NodeIdentity> = Vec::new();
    for n in ids.node_identities {
        if n.node_name.is_empty() {
            return Err(IdentityError::MissingNodeName(on));
        }
        if n.datacenter.is_empty() {
            return Err(IdentityError::MissingDatacenter(on));
        }
        if !valid_identity_name(&n.node_name) {
            return Err(IdentityError::BadNodeName);
        }
        if !nodes.contains(&n) {
            nodes.push(n);
        }
    }
    let mut templated: Vec<TemplatedPolicy> = Vec::new();
    for t in ids.templated_policies {
        if t.template_name.is_empty() {
            return Err(IdentityError::MissingTemplateName(on));
        }
        let Some(tpl) = template(&t.template_name) else {
            return Err(IdentityError::NoSuchTemplate(t.template_name));
        };
        if local && !t.datacenters.is_empty() {
            return Err(IdentityError::TemplateLocalDatacenters(t.template_name));
        }
        let mut t = t;
        if tpl.schema.is_empty() {
            // It takes no variables: one of it is enough.
            t.template_variables = None;
        } else {
            check_variables(tpl, t.template_variables.as_ref())?;
        }
        let same = |o: &TemplatedPolicy| {
            o.template_name == t.template_name && o.template_variables == t.template_variables
        };
        if !templated.iter().any(same) {
            templated.push(t);
        }
    }
    Ok(Identities {
        service_identities: services,
        node_identities: nodes,
        templated_policies: templated,
    })
}

/// A template's `name` variable, as its schema and Consul's name rules ask
/// (the name goes into rule text, so only identity names are taken).
fn check_variables(tpl: &Template, vars: Option<&TemplateVariables>) -> Result<(), IdentityError> {
    let bad = |why: &str| IdentityError::Variables(tpl.name.to_string(), why.to_string());
    let name = vars.map(|v| v.name.as_str()).unwrap_or_default();
    if vars.is_none() {
        return Err(bad("name is required"));
    }
    if name.is_empty() {
        return Err(bad(
            "name: String length must be greater than or equal to 1",
        ));
    }
    if !valid_identity_name(name) {
        let what = if tpl.name == NODE { "node" } else { "service" };
        return Err(bad(&format!(
            "{what} identity {name:?} has an invalid name. Only lowercase alphanumeric characters, '-' and '_' are allowed"
        )));
    }
    Ok(())
}

/// A template's rule text for `vars` (checked when written).
pub fn render(tpl: &Template, vars: Option<&TemplateVariables>) -> String {
    let name = vars.map(|v| v.name.as_str()).unwrap_or_default();
    tpl.template.replace("{{.Name}}", name)
}

/// Whether something scoped to `dcs` (a policy, an identity, a templated
/// policy) holds in `dc`: none named, all.
pub fn holds_in(dcs: &[String], dc: &str) -> bool {
    dcs.is_empty() || dcs.iter().any(|d| d == dc)
}

/// The rule text every identity in `ids` grants in datacenter `dc`.
pub fn rules_in(ids: &Identities, dc: &str) -> Vec<String> {
    let by_name = |name: &str| template(name).expect("a built-in template");
    let mut out = Vec::new();
    for s in ids.service_identities.iter() {
        if holds_in(&s.datacenters, dc) {
            let vars = TemplateVariables {
                name: s.service_name.clone(),
            };
            out.push(render(by_name(SERVICE), Some(&vars)));
        }
    }
    for n in ids.node_identities.iter().filter(|n| n.datacenter == dc) {
        let vars = TemplateVariables {
            name: n.node_name.clone(),
        };
        out.push(render(by_name(NODE), Some(&vars)));
    }
    for t in ids.templated_policies.iter() {
        if let Some(tpl) = template(&t.template_name)
            && holds_in(&t.datacenters, dc)
        {
            out.push(render(tpl, t.template_variables.as_ref()));
        }
    }
    out
}

/// The policy a template renders to, as Consul's preview shows it: its ID
/// is the hex of the rules followed by the FNV-128a of nothing (Consul
/// appends the empty hash to the rules, and cairn shows the same ID).
pub fn synthetic_policy(tpl: &Template, vars: Option<&TemplateVariables>) -> AclPolicy {
    const FNV128A_EMPTY: &str = "6c62272e07bb014262b821756295c58d";
    let rules = render(tpl, vars);
    let id: String = rules
        .bytes()
        .map(|b| format!("{b:02x}"))
        .chain(std::iter::once(FNV128A_EMPTY.to_string()))
        .collect();
    AclPolicy {
        name: format!("synthetic-policy-{id}"),
        description: format!(
            "synthetic policy generated from templated policy: {}",
            tpl.name
        ),
        hash: crate::structs::acl::content_hash(&[&rules]),
        id,
        rules,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::{Authorizer, DefaultPolicy, parse_rules};

    fn authz(ids: &Identities, dc: &str) -> Authorizer {
        let rules: Vec<_> = rules_in(ids, dc)
            .iter()
            .map(|r| parse_rules(r).unwrap())
            .collect();
        let refs: Vec<_> = rules.iter().collect();
        Authorizer::new("t", &refs, DefaultPolicy::Deny)
    }

    fn service(name: &str, dcs: &[&str]) -> ServiceIdentity {
        ServiceIdentity {
            service_name: name.into(),
            datacenters: dcs.iter().map(|d| d.to_string()).collect(),
        }
    }

    #[test]
    fn every_template_renders_to_rules_that_parse() {
        let vars = TemplateVariables { name: "web".into() };
        for t in TEMPLATES {
            let text = render(t, Some(&vars));
            assert!(!text.contains("{{"), "{}", t.name);
            parse_rules(&text).unwrap_or_else(|e| panic!("{}: {e}", t.name));
        }
    }

    #[test]
    fn a_service_identity_grants_its_service_and_sidecar_and_reads() {
        let ids = Identities {
            service_identities: vec![service("web", &["dc1"])],
            ..Default::default()
        };
        let a = authz(&ids, "dc1");
        assert!(a.service_write("web") && a.service_write("web-sidecar-proxy"));
        assert!(!a.service_write("db") && !a.service_write("web2"));
        assert!(a.service_read("db") && a.node_read("any"));
        assert!(!a.node_write("any") && !a.key_read("k") && !a.acl_read());
        // Scoped to dc1: nothing in dc2.
        let b = authz(&ids, "dc2");
        assert!(!b.service_write("web") && !b.service_read("db"));
    }

    #[test]
    fn a_node_identity_holds_in_its_datacenter_only() {
        let ids = Identities {
            node_identities: vec![NodeIdentity {
                node_name: "n1".into(),
                datacenter: "dc1".into(),
            }],
            ..Default::default()
        };
        let a = authz(&ids, "dc1");
        assert!(a.node_write("n1") && !a.node_write("n2"));
        assert!(a.service_read("x") && !a.service_write("x"));
        assert!(!authz(&ids, "dc2").node_write("n1"));
    }

    #[test]
    fn templated_policies_render_their_template() {
        let ids = Identities {
            templated_policies: vec![TemplatedPolicy {
                template_name: "builtin/dns".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let a = authz(&ids, "dc1");
        assert!(a.query_read("q") && a.service_read("s") && a.node_read("n"));
        assert!(!a.service_write("s"));
    }

    #[test]
    fn normalize_checks_and_deduplicates_in_consuls_words() {
        let err =
            |ids: Identities, local: Option<bool>| normalize(ids, local).unwrap_err().to_string();
        let svc = |list: Vec<ServiceIdentity>| Identities {
            service_identities: list,
            ..Default::default()
        };
        assert_eq!(
            err(svc(vec![service("", &[])]), Some(false)),
            "Service identity is missing the service name field on this token"
        );
        assert_eq!(
            err(svc(vec![service("", &[])]), None),
            "Service identity is missing the service name field on this role"
        );
        assert_eq!(
            err(svc(vec![service("web", &["dc1"])]), Some(true)),
            "Service identity \"web\" cannot specify a list of datacenters on a local token"
        );
        for bad in ["-abc", "abc-", "_abc", "Abc", "a:bc", "a\"b"] {
            assert!(
                err(svc(vec![service(bad, &[])]), Some(false)).contains("has an invalid name"),
                "{bad}"
            );
        }
        for good in ["a-bc", "a_bc", "0abc", "a"] {
            assert!(
                normalize(svc(vec![service(good, &[])]), Some(false)).is_ok(),
                "{good}"
            );
        }
        let merged = normalize(
            svc(vec![
                service("web", &["dc1"]),
                service("web", &["dc2"]),
                service("db", &[]),
            ]),
            Some(false),
        )
        .unwrap();
        assert_eq!(
            merged.service_identities,
            vec![service("web", &["dc1", "dc2"]), service("db", &[])]
        );
        let nodes = |n: &str, dc: &str| Identities {
            node_identities: vec![NodeIdentity {
                node_name: n.into(),
                datacenter: dc.into(),
            }],
            ..Default::default()
        };
        assert_eq!(
            err(nodes("n1", ""), Some(false)),
            "Node identity is missing the datacenter field on this token"
        );
        assert_eq!(
            err(nodes("", "dc1"), None),
            "Node identity is missing the node name field on this role"
        );
        let tpl = |name: &str, var: Option<&str>| Identities {
            templated_policies: vec![TemplatedPolicy {
                template_name: name.into(),
                template_variables: var.map(|v| TemplateVariables { name: v.into() }),
                datacenters: vec![],
            }],
            ..Default::default()
        };
        assert_eq!(
            err(tpl("builtin/nope", None), Some(false)),
            "no such ACL templated policy with Name \"builtin/nope\""
        );
        assert_eq!(
            err(tpl(SERVICE, None), Some(false)),
            "validation error for templated policy \"builtin/service\": name is required"
        );
        assert!(
            err(
                tpl(SERVICE, Some("x\" { policy = \"write\" } #")),
                Some(false)
            )
            .contains("invalid name")
        );
        assert!(normalize(tpl(SERVICE, Some("api")), Some(false)).is_ok());
        // A template without variables keeps none.
        let dns = normalize(tpl("builtin/dns", Some("x")), Some(false)).unwrap();
        assert_eq!(dns.templated_policies[0].template_variables, None);
    }

    #[test]
    fn a_preview_is_consuls_synthetic_policy() {
        let tpl = template(SERVICE).unwrap();
        let p = synthetic_policy(tpl, Some(&TemplateVariables { name: "api".into() }));
        assert!(p.rules.contains("service \"api\" {"), "{}", p.rules);
        assert!(
            p.rules.contains("service \"api-sidecar-proxy\""),
            "{}",
            p.rules
        );
        assert_eq!(p.name, format!("synthetic-policy-{}", p.id));
        assert!(p.id.starts_with("0a7365727669636520"), "{}", p.id);
        assert!(p.id.ends_with("6c62272e07bb014262b821756295c58d"));
    }
}
