//! Binding rules: which of an auth method's rules a login's identity
//! matches (`Selector`, in the `?filter` language over the method's
//! selectable fields) and what each makes of it (`BindType`, `BindName`
//! with `${var}` interpolated from the identity). Pure.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::filter::{Filter, Schema};
use crate::structs::acl::{
    Identities, Link, NodeIdentity, ServiceIdentity, TemplateVariables, TemplatedPolicy,
};
use crate::structs::auth::{AclBindingRule, BIND_TYPES};
use crate::structs::identity;

/// What a login proved about its caller: the fields selectors see and the
/// variables bind names interpolate.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Identity {
    pub fields: Value,
    pub vars: BTreeMap<String, String>,
}

/// A `jwt` method's fields: its claim mappings' values and lists.
pub static JWT_FIELDS: Schema = Schema::Struct(&[
    ("value", Schema::Map(&Schema::String)),
    ("list", Schema::Map(&Schema::List(&Schema::String))),
]);

/// A `kubernetes` method's fields: the service account the TokenReview
/// named.
pub static KUBERNETES_FIELDS: Schema = Schema::Struct(&[(
    "serviceaccount",
    Schema::Struct(&[
        ("namespace", Schema::String),
        ("name", Schema::String),
        ("uid", Schema::String),
    ]),
)]);

/// The selector parsed against a method's fields (empty: matches all).
pub fn selector(text: &str, fields: &'static Schema) -> Result<Option<Filter>, String> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    Filter::parse_for(text, fields)
        .map(Some)
        .map_err(|e| format!("Invalid Binding Rule: Selector is invalid: {e}"))
}

/// `${name}` replaced by `vars[name]` (HIL's interpolation, variables only);
/// `lower`: values lowercased, as Consul makes service and node names.
pub fn interpolate(
    text: &str, vars: &BTreeMap<String, String>, lower: bool,
) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find('}').ok_or("unterminated ${ in BindName")?;
        let name = after[..end].trim();
        let value = vars
            .get(name)
            .ok_or_else(|| format!("unknown variable accessed: {name}"))?;
        if lower {
            out.push_str(&value.to_lowercase());
        } else {
            out.push_str(value);
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The name a rule binds to for this identity, checked as a name of its
/// type: a name that interpolates to something invalid refuses the login
/// rather than make a bad token.
pub fn bind_name(rule: &AclBindingRule, vars: &BTreeMap<String, String>) -> Result<String, String> {
    let lower = matches!(rule.bind_type.as_str(), "service" | "node");
    let name = interpolate(&rule.bind_name, vars, lower)?;
    let ok = match rule.bind_type.as_str() {
        "service" | "node" => identity::valid_identity_name(&name),
        "role" | "policy" => crate::structs::acl::valid_name(&name),
        "templated-policy" => identity::template(&name).is_some(),
        _ => false,
    };
    if ok {
        Ok(name)
    } else {
        Err(format!(
            "invalid BindName {:?} for bind type {}",
            name, rule.bind_type
        ))
    }
}

/// Checks a rule as written, before it is stored: its type, its selector
/// against the method's fields, and its bind name with every variable
/// blank-filled (Consul's check), so that a rule that can never bind is
/// refused up front.
pub fn validate_rule(
    rule: &AclBindingRule, fields: &'static Schema, var_names: &[String],
) -> Result<(), String> {
    if rule.bind_type.is_empty() {
        return Err("Invalid Binding Rule: no BindType is set".into());
    }
    if !BIND_TYPES.contains(&rule.bind_type.as_str()) {
        return Err(format!(
            "Invalid Binding Rule: unknown BindType {:?}",
            rule.bind_type
        ));
    }
    if rule.bind_name.is_empty() {
        return Err("Invalid Binding Rule: no BindName is set".into());
    }
    selector(&rule.selector, fields)?;
    let blank: BTreeMap<String, String> = var_names
        .iter()
        .map(|v| (v.clone(), "blank".to_string()))
        .collect();
    bind_name(rule, &blank).map_err(|e| format!("Invalid Binding Rule: {e}"))?;
    if let Some(vars) = &rule.bind_vars {
        interpolate(&vars.name, &blank, true).map_err(|e| format!("Invalid Binding Rule: {e}"))?;
    }
    Ok(())
}

/// What the matching rules grant; roles and policies by name, looked up
/// by the caller (a name that does not exist is skipped, as Consul's).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Bound {
    pub identities: Identities,
    pub roles: Vec<String>,
    pub policies: Vec<String>,
}

impl Bound {
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.identities.is_empty() && self.roles.is_empty() && self.policies.is_empty()
    }
}

/// Applies every rule whose selector matches `id`; `dc` is the
/// datacenter a node identity is bound in.
pub fn bind<'a>(
    rules: impl IntoIterator<Item = &'a AclBindingRule>, fields: &'static Schema, id: &Identity,
    dc: &str,
) -> Result<Bound, String> {
    let mut out = Bound::default();
    for rule in rules {
        let matches = match selector(&rule.selector, fields)? {
            Some(f) => f.matches(&id.fields),
            None => true,
        };
        if !matches {
            continue;
        }
        let name = bind_name(rule, &id.vars)?;
        match rule.bind_type.as_str() {
            "service" => out.identities.service_identities.push(ServiceIdentity {
                service_name: name,
                datacenters: Vec::new(),
            }),
            "node" => out.identities.node_identities.push(NodeIdentity {
                node_name: name,
                datacenter: dc.to_string(),
            }),
            "role" => out.roles.push(name),
            "policy" => out.policies.push(name),
            _ => {
                let vars = match &rule.bind_vars {
                    Some(v) if !v.name.is_empty() => Some(TemplateVariables {
                        name: interpolate(&v.name, &id.vars, true)?,
                    }),
                    _ => None,
                };
                out.identities.templated_policies.push(TemplatedPolicy {
                    template_name: name,
                    template_variables: vars,
                    datacenters: Vec::new(),
                });
            }
        }
    }
    Ok(out)
}

/// Links for the names of `wanted` that `find` knows (by name → ID).
pub fn links(wanted: &[String], find: impl Fn(&str) -> Option<String>) -> Vec<Link> {
    let mut out: Vec<Link> = Vec::new();
    for name in wanted {
        if let Some(id) = find(name)
            && !out.iter().any(|l| l.id == id)
        {
            out.push(Link {
                id,
                name: name.clone(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn rule(selector: &str, bind_type: &str, bind_name: &str) -> AclBindingRule {
        AclBindingRule {
            selector: selector.into(),
            bind_type: bind_type.into(),
            bind_name: bind_name.into(),
            ..Default::default()
        }
    }

    #[test]
    fn bind_names_interpolate_and_service_names_are_lowercased() {
        let v = vars(&[("value.svc", "Web"), ("value.team", "Ops")]);
        assert_eq!(interpolate("${value.svc}-x", &v, true).unwrap(), "web-x");
        assert_eq!(
            interpolate("r-${ value.team }", &v, false).unwrap(),
            "r-Ops"
        );
        assert!(interpolate("${value.nope}", &v, false).is_err());
        assert!(interpolate("${value.svc", &v, false).is_err());
    }

    #[test]
    fn a_rule_that_interpolates_to_a_bad_name_refuses_rather_than_binds() {
        let r = rule("", "service", "${value.svc}");
        assert!(bind_name(&r, &vars(&[("value.svc", "a b")])).is_err());
        assert!(bind_name(&r, &vars(&[("value.svc", "")])).is_err());
        let r = rule("", "role", "${value.r}");
        assert!(bind_name(&r, &vars(&[("value.r", "a/../b")])).is_err());
        let r = rule("", "templated-policy", "builtin/nope");
        assert!(bind_name(&r, &vars(&[])).is_err());
    }

    #[test]
    fn only_matching_rules_bind() {
        let id = Identity {
            fields: serde_json::json!({"value": {"ns": "prod", "svc": "web"}, "list": {"groups": ["a", "b"]}}),
            vars: vars(&[("value.ns", "prod"), ("value.svc", "web")]),
        };
        let rules = [
            rule(r#"value.ns == "prod""#, "service", "${value.svc}"),
            rule(r#"value.ns == "dev""#, "service", "dev-${value.svc}"),
            rule(r#""b" in list.groups"#, "role", "group-b"),
            rule("", "node", "${value.svc}-node"),
        ];
        let b = bind(&rules, &JWT_FIELDS, &id, "dc1").unwrap();
        assert_eq!(b.identities.service_identities.len(), 1);
        assert_eq!(b.identities.service_identities[0].service_name, "web");
        assert_eq!(b.roles, vec!["group-b".to_string()]);
        assert_eq!(b.identities.node_identities[0].datacenter, "dc1");
        let none = bind(&rules[1..2], &JWT_FIELDS, &id, "dc1").unwrap();
        assert!(none.is_empty());
    }

    #[test]
    fn rules_are_validated_against_the_methods_fields() {
        let names = vec!["serviceaccount.name".to_string()];
        let ok = rule(
            r#"serviceaccount.namespace == default"#,
            "service",
            "${serviceaccount.name}",
        );
        assert_eq!(validate_rule(&ok, &KUBERNETES_FIELDS, &names), Ok(()));
        let bad_sel = rule("value.x == y", "service", "web");
        assert!(
            validate_rule(&bad_sel, &KUBERNETES_FIELDS, &names)
                .unwrap_err()
                .contains("Selector is invalid")
        );
        let bad_var = rule("", "service", "${value.x}");
        assert!(validate_rule(&bad_var, &KUBERNETES_FIELDS, &names).is_err());
        let bad_type = rule("", "admin", "x");
        assert!(
            validate_rule(&bad_type, &KUBERNETES_FIELDS, &names)
                .unwrap_err()
                .contains("unknown BindType")
        );
    }
}
