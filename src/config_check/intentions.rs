//! `service-intentions`: normalization (precedence, source order, the
//! `consul` type, upper-case methods) and validation with the rules and
//! wording of Consul's `ServiceIntentionsConfigEntry`. Whether L7
//! permissions fit the destination's protocol depends on other entries: it
//! is checked with the graph (`discovery_chain::validate_write`).

use super::ConfigEntryError;
use crate::structs::config_entry::ServiceIntentionsConfigEntry;

type Result<T = ()> = std::result::Result<T, ConfigEntryError>;

fn invalid(msg: impl Into<String>) -> ConfigEntryError {
    ConfigEntryError::Invalid(msg.into())
}

/// Consul's intention precedence: higher for exact names than for `*`,
/// the destination weighing more than the source (namespaces are always
/// the exact `default` here): 9 exact → exact, 8 `*` → exact, 6 exact →
/// `*`, 5 `*` → `*`.
pub fn precedence(source: &str, destination: &str) -> i32 {
    let max = if destination == "*" { 6 } else { 9 };
    max - if source == "*" { 1 } else { 0 }
}

pub fn normalize(e: &mut ServiceIntentionsConfigEntry) {
    for s in &mut e.sources {
        if s.type_.is_empty() {
            s.type_ = "consul".into();
        }
        if s.namespace == "default" {
            s.namespace.clear();
        }
        if s.partition == "default" {
            s.partition.clear();
        }
        s.action = s.action.to_lowercase();
        for p in &mut s.permissions {
            p.action = p.action.to_lowercase();
            if let Some(h) = &mut p.http {
                for m in &mut h.methods {
                    *m = m.to_uppercase();
                }
            }
        }
        s.precedence = precedence(&s.name, &e.name);
    }
    // Evaluation order: highest precedence first, then by name (stable).
    e.sources.sort_by(|a, b| {
        b.precedence
            .cmp(&a.precedence)
            .then_with(|| a.name.cmp(&b.name))
    });
}

const METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

fn check_wildcard(what: &str, name: &str) -> Result {
    if name != "*" && name.contains('*') {
        return Err(invalid(format!(
            "{what}: wildcard character '*' cannot be used with partial values"
        )));
    }
    Ok(())
}

pub fn validate(e: &ServiceIntentionsConfigEntry) -> Result {
    check_wildcard("Name", &e.name)?;
    let mut seen = std::collections::BTreeSet::new();
    for (i, s) in e.sources.iter().enumerate() {
        if s.name.is_empty() {
            return Err(invalid(format!("Sources[{i}].Name is required")));
        }
        check_wildcard(&format!("Sources[{i}].Name"), &s.name)?;
        for (what, v) in [("Namespace", &s.namespace), ("Partition", &s.partition)] {
            if !v.is_empty() {
                return Err(invalid(format!(
                    "Sources[{i}].{what} {v:?} is not supported: only the \"default\" {} is served",
                    what.to_lowercase()
                )));
            }
        }
        if !s.peer.is_empty() {
            return Err(invalid(format!(
                "Sources[{i}].Peer is not supported: cluster peering is not served"
            )));
        }
        if !seen.insert(s.name.clone()) {
            return Err(invalid(format!(
                "Sources[{i}] defines {:?} more than once",
                s.name
            )));
        }
        if s.type_ != "consul" {
            return Err(invalid(format!(
                "Sources[{i}].Type must be set to 'consul'"
            )));
        }
        if s.legacy_id.is_empty()
            && (!s.legacy_meta.is_empty()
                || s.legacy_create_time.is_some()
                || s.legacy_update_time.is_some())
        {
            return Err(invalid(format!(
                "Sources[{i}].LegacyMeta, LegacyCreateTime and LegacyUpdateTime must be omitted"
            )));
        }
        if s.description.len() > 512 {
            return Err(invalid(format!(
                "Sources[{i}].Description exceeds maximum length 512"
            )));
        }
        if s.permissions.is_empty() {
            if s.action != "allow" && s.action != "deny" {
                return Err(invalid(format!(
                    "Sources[{i}].Action must be set to 'allow' or 'deny'"
                )));
            }
            continue;
        }
        if !s.action.is_empty() {
            return Err(invalid(format!(
                "Sources[{i}].Action must be omitted if Permissions are specified"
            )));
        }
        for (j, p) in s.permissions.iter().enumerate() {
            let at = format!("Sources[{i}].Permissions[{j}]");
            if p.action != "allow" && p.action != "deny" {
                return Err(invalid(format!(
                    "{at}.Action must be set to 'allow' or 'deny'"
                )));
            }
            let Some(h) = &p.http else {
                return Err(invalid(format!("{at}.HTTP is required")));
            };
            let paths = [&h.path_exact, &h.path_prefix, &h.path_regex]
                .iter()
                .filter(|p| !p.is_empty())
                .count();
            if paths == 0 && h.header.is_empty() && h.methods.is_empty() {
                return Err(invalid(format!("{at}.HTTP should not be empty")));
            }
            if paths > 1 {
                return Err(invalid(format!(
                    "{at}.HTTP should only contain at most one of PathExact, PathPrefix, or PathRegex"
                )));
            }
            for (what, v) in [("PathExact", &h.path_exact), ("PathPrefix", &h.path_prefix)] {
                if !v.is_empty() && !v.starts_with('/') {
                    return Err(invalid(format!(
                        "{at}.HTTP.{what} doesn't start with '/': {v:?}"
                    )));
                }
            }
            if !h.path_regex.is_empty() && regex::Regex::new(&h.path_regex).is_err() {
                return Err(invalid(format!(
                    "{at}.HTTP.PathRegex is not a valid regular expression: {:?}",
                    h.path_regex
                )));
            }
            for (k, hd) in h.header.iter().enumerate() {
                if hd.name.is_empty() {
                    return Err(invalid(format!(
                        "{at}.HTTP.Header[{k}] missing required Name field"
                    )));
                }
                let kinds = [
                    hd.present,
                    !hd.exact.is_empty(),
                    !hd.prefix.is_empty(),
                    !hd.suffix.is_empty(),
                    !hd.regex.is_empty(),
                ]
                .iter()
                .filter(|b| **b)
                .count();
                if kinds > 1 {
                    return Err(invalid(format!(
                        "{at}.HTTP.Header[{k}] should only contain one of Present, Exact, Prefix, Suffix, or Regex"
                    )));
                }
            }
            let mut methods = std::collections::BTreeSet::new();
            for m in &h.methods {
                if !METHODS.contains(&m.as_str()) {
                    return Err(invalid(format!(
                        "{at}.HTTP.Methods contains an invalid method {m:?}"
                    )));
                }
                if !methods.insert(m) {
                    return Err(invalid(format!(
                        "{at}.HTTP.Methods contains {m:?} more than once"
                    )));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structs::config_entry::SourceIntention;

    #[test]
    fn precedence_is_consuls() {
        // Consul's table without namespaces: exact beats `*`, destination
        // before source.
        assert_eq!(precedence("web", "db"), 9);
        assert_eq!(precedence("*", "db"), 8);
        assert_eq!(precedence("web", "*"), 6);
        assert_eq!(precedence("*", "*"), 5);
    }

    #[test]
    fn normalize_orders_sources_and_fills_defaults() {
        let src = |name: &str| SourceIntention {
            name: name.into(),
            action: "ALLOW".into(),
            namespace: "default".into(),
            ..Default::default()
        };
        let mut e = ServiceIntentionsConfigEntry {
            name: "db".into(),
            sources: vec![src("*"), src("b"), src("a")],
            ..Default::default()
        };
        normalize(&mut e);
        let got: Vec<(&str, i32, &str, &str)> = e
            .sources
            .iter()
            .map(|s| {
                (
                    s.name.as_str(),
                    s.precedence,
                    s.type_.as_str(),
                    s.action.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("a", 9, "consul", "allow"),
                ("b", 9, "consul", "allow"),
                ("*", 8, "consul", "allow")
            ]
        );
        assert!(e.sources.iter().all(|s| s.namespace.is_empty()));
        assert_eq!(validate(&e), Ok(()));
    }
}
