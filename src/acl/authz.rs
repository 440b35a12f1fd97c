//! Authorization decisions: a token's merged policies, over the default
//! policy, answering one yes/no question per Consul permission.
//!
//! Consul's order of decision: an exact rule for the name beats every prefix
//! rule; among prefix rules the longest matching prefix wins (`""` matches
//! everything); where no rule matches, the default policy decides. Tables
//! are built once in [`Authorizer::new`], so a check is a hash lookup per
//! distinct prefix length and allocates nothing: list filtering calls it per
//! row.

use std::collections::HashMap;

use super::rules::{Access, Named, Rules};

/// The servers' `--acl-default-policy`: what a token may do where none of
/// its rules matches. Written `allow` or `deny` (flag and JSON alike);
/// Consul's default is `allow`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DefaultPolicy {
    #[default]
    Allow,
    Deny,
}

impl std::str::FromStr for DefaultPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "allow" => Ok(DefaultPolicy::Allow),
            "deny" => Ok(DefaultPolicy::Deny),
            _ => Err(format!("{s:?}: must be allow or deny")),
        }
    }
}

/// Consul's anonymous token, named in denials by its own words.
const ANONYMOUS: &str = "00000000-0000-0000-0000-000000000002";

/// A failed check, with Consul's exact message (the body of its 403).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.message())]
pub struct Denied {
    pub accessor: String,
    /// `resource:level`, e.g. `key:write`.
    pub permission: String,
    /// The name checked; empty for resources without names (`operator`).
    pub resource: String,
}

impl Denied {
    fn message(&self) -> String {
        let mut m = String::from("Permission denied");
        if self.accessor == ANONYMOUS {
            m.push_str(": anonymous token");
        } else {
            m.push_str(&format!(": token with AccessorID '{}'", self.accessor));
        }
        m.push_str(&format!(" lacks permission '{}'", self.permission));
        if !self.resource.is_empty() {
            m.push_str(&format!(" on \"{}\"", self.resource));
        }
        if self.accessor == ANONYMOUS {
            m.push_str(
                ". The anonymous token is used implicitly when a request does not specify a token.",
            );
        }
        m
    }
}

/// What decides where no rule matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fallback {
    /// Consul's default `allow`: everything but ACL management and snapshots.
    Allow,
    Deny,
    /// Management (and ACLs off): everything.
    Manage,
}

impl Fallback {
    fn allows(self, manage_only: bool) -> bool {
        match self {
            Fallback::Manage => true,
            Fallback::Allow => !manage_only,
            Fallback::Deny => false,
        }
    }
}

/// One resource kind's rules, ready for lookups.
#[derive(Debug, Default, PartialEq)]
struct Table {
    exact: HashMap<Box<str>, Access>,
    prefix: HashMap<Box<str>, Access>,
    /// The distinct prefix lengths, longest first.
    lens: Box<[usize]>,
    /// Every rule name (exact or prefix) that grants less than write,
    /// sorted: `key_write_prefix` looks for one under a prefix.
    weak: Box<[Box<str>]>,
}

impl Table {
    fn new(named: &Named) -> Table {
        let exact: HashMap<Box<str>, Access> = named
            .exact
            .iter()
            .map(|(n, a)| (n.as_str().into(), *a))
            .collect();
        let prefix: HashMap<Box<str>, Access> = named
            .prefix
            .iter()
            .map(|(n, a)| (n.as_str().into(), *a))
            .collect();
        let mut lens: Vec<usize> = prefix.keys().map(|p| p.len()).collect();
        lens.sort_unstable_by(|a, b| b.cmp(a));
        lens.dedup();
        let mut weak: Vec<Box<str>> = named
            .exact
            .iter()
            .chain(named.prefix.iter())
            .filter(|(_, a)| **a != Access::Write)
            .map(|(n, _)| n.as_str().into())
            .collect();
        weak.sort_unstable();
        weak.dedup();
        Table {
            exact,
            prefix,
            lens: lens.into(),
            weak: weak.into(),
        }
    }

    /// The rule for `name`: exact, else the longest matching prefix.
    fn get(&self, name: &str) -> Option<Access> {
        if let Some(a) = self.exact.get(name) {
            return Some(*a);
        }
        self.longest_prefix(name)
    }

    fn longest_prefix(&self, name: &str) -> Option<Access> {
        self.lens
            .iter()
            .filter(|&&l| l <= name.len() && name.is_char_boundary(l))
            .find_map(|&l| self.prefix.get(&name[..l]).copied())
    }

    /// Some rule name at or under `prefix` grants less than write.
    fn weak_under(&self, prefix: &str) -> bool {
        let i = self.weak.partition_point(|n| &**n < prefix);
        self.weak.get(i).is_some_and(|n| n.starts_with(prefix))
    }

    /// Consul's `anyAllowed`: some rule grants `need` (Some(true)); else a
    /// `""` prefix rule decides (Some(false)); else no decision.
    fn any_allowed(&self, need: Access) -> Option<bool> {
        if self
            .exact
            .values()
            .chain(self.prefix.values())
            .any(|a| a.grants(need))
        {
            return Some(true);
        }
        self.prefix.get("").map(|_| false)
    }

    /// Consul's `allAllowed`: no rule refuses `need`, and the `""` prefix
    /// grants it; any refusal is a refusal; else no decision.
    fn all_allowed(&self, need: Access) -> Option<bool> {
        if self
            .exact
            .values()
            .chain(self.prefix.values())
            .any(|a| !a.grants(need))
        {
            return Some(false);
        }
        self.prefix.get("").map(|_| true)
    }
}

/// The merged rules of a token's policies, as tables.
#[derive(Debug, Default, PartialEq)]
struct Policy {
    key: Table,
    service: Table,
    intention: Table,
    node: Table,
    agent: Table,
    session: Table,
    query: Table,
    event: Table,
    operator: Option<Access>,
    acl: Option<Access>,
    mesh: Option<Access>,
    peering: Option<Access>,
    keyring: Option<Access>,
    service_write_any: Option<bool>,
    intention_read_any: Option<bool>,
    intention_write_all: Option<bool>,
}

impl Policy {
    fn new(rules: &Rules) -> Policy {
        let intention = Table::new(&intentions_of(rules));
        let service = Table::new(&rules.service);
        Policy {
            key: Table::new(&rules.key),
            service_write_any: service.any_allowed(Access::Write),
            intention_read_any: intention.any_allowed(Access::Read),
            intention_write_all: intention.all_allowed(Access::Write),
            service,
            intention,
            node: Table::new(&rules.node),
            agent: Table::new(&rules.agent),
            session: Table::new(&rules.session),
            query: Table::new(&rules.query),
            event: Table::new(&rules.event),
            operator: rules.operator,
            acl: rules.acl,
            mesh: rules.mesh,
            peering: rules.peering,
            keyring: rules.keyring,
        }
    }
}

/// Intention rules: each service rule's explicit `intentions`, else read for
/// a service `read`/`write` rule and deny for the rest (Consul derives them
/// after merging).
fn intentions_of(rules: &Rules) -> Named {
    let implied = |policy: Access| match policy {
        Access::Read | Access::Write => Access::Read,
        _ => Access::Deny,
    };
    let derive = |services: &std::collections::BTreeMap<String, Access>,
                  explicit: &std::collections::BTreeMap<String, Access>| {
        services
            .iter()
            .map(|(n, p)| (n.clone(), explicit.get(n).copied().unwrap_or(implied(*p))))
            .collect()
    };
    Named {
        exact: derive(&rules.service.exact, &rules.intentions.exact),
        prefix: derive(&rules.service.prefix, &rules.intentions.prefix),
    }
}

/// What one request may do. Cheap to share in an `Arc`; every check is a
/// pure function of the merged rules and the default. Equal authorizers
/// allow the same (a subscription compares them when its token is
/// resolved again).
#[derive(Debug, PartialEq)]
pub struct Authorizer {
    accessor: String,
    fallback: Fallback,
    /// None for management and ACLs off: there are no rules to consult.
    policy: Option<Box<Policy>>,
}

impl Authorizer {
    /// Merges several policies' rules (a token's policies and its roles'
    /// policies) over the default policy.
    pub fn new(accessor: &str, policies: &[&Rules], default: DefaultPolicy) -> Self {
        let mut merged = Rules::default();
        for rules in policies {
            merged.merge(rules);
        }
        Authorizer {
            accessor: accessor.to_owned(),
            fallback: match default {
                DefaultPolicy::Allow => Fallback::Allow,
                DefaultPolicy::Deny => Fallback::Deny,
            },
            policy: Some(Box::new(Policy::new(&merged))),
        }
    }

    /// Consul's built-in `global-management` policy: everything, ACL
    /// management and snapshots included.
    /// The anonymous token's (what a request without a token runs with).
    pub fn is_anonymous(&self) -> bool {
        self.accessor == ANONYMOUS
    }

    pub fn management(accessor: &str) -> Self {
        Authorizer {
            accessor: accessor.to_owned(),
            fallback: Fallback::Manage,
            policy: None,
        }
    }

    /// ACLs disabled: everything is allowed (Consul's `ManageAll`).
    pub fn allow_all() -> Self {
        Self::management("")
    }

    pub fn accessor(&self) -> &str {
        &self.accessor
    }

    /// Whether this is `allow_all`, what a server without ACLs hands out:
    /// every token, management's included, has an accessor.
    pub fn acls_off(&self) -> bool {
        self.accessor.is_empty() && matches!(self.fallback, Fallback::Manage)
    }

    /// The error for a failed check, e.g. `a.deny("key:write", "other/x")`;
    /// `resource` empty for permissions without a name (`operator:read`).
    pub fn deny(&self, permission: &str, resource: &str) -> Denied {
        Denied {
            accessor: self.accessor.clone(),
            permission: permission.to_owned(),
            resource: resource.to_owned(),
        }
    }

    fn named(&self, table: fn(&Policy) -> &Table, name: &str, need: Access) -> bool {
        match &self.policy {
            Some(p) => table(p)
                .get(name)
                .map_or_else(|| self.fallback.allows(false), |a| a.grants(need)),
            None => self.fallback.allows(false),
        }
    }

    fn scalar(&self, rule: fn(&Policy) -> Option<Access>, need: Access, manage_only: bool) -> bool {
        match self.policy.as_deref().and_then(rule) {
            Some(a) => a.grants(need),
            None => self.fallback.allows(manage_only),
        }
    }

    fn decided(&self, decision: fn(&Policy) -> Option<bool>) -> bool {
        self.policy
            .as_deref()
            .and_then(decision)
            .unwrap_or_else(|| self.fallback.allows(false))
    }

    pub fn key_read(&self, key: &str) -> bool {
        self.named(|p| &p.key, key, Access::Read)
    }

    /// Listing keys under `prefix` (`?keys`, `?recurse`): needs `list` (or
    /// `write`) by the rule that covers the prefix.
    pub fn key_list(&self, prefix: &str) -> bool {
        self.named(|p| &p.key, prefix, Access::List)
    }

    pub fn key_write(&self, key: &str) -> bool {
        self.named(|p| &p.key, key, Access::Write)
    }

    /// Writing a whole tree (a recursive delete): Consul's KeyWritePrefix.
    /// The longest prefix rule covering `prefix` must grant write, and no
    /// rule (exact or prefix) at or under `prefix` may grant less; without
    /// any covering prefix rule the default decides, unless a rule under it
    /// refuses.
    pub fn key_write_prefix(&self, prefix: &str) -> bool {
        let Some(p) = &self.policy else {
            return self.fallback.allows(false);
        };
        let base = p.key.longest_prefix(prefix);
        if base.is_some_and(|a| a != Access::Write) || p.key.weak_under(prefix) {
            return false;
        }
        base.is_some() || self.fallback.allows(false)
    }

    pub fn service_read(&self, name: &str) -> bool {
        self.named(|p| &p.service, name, Access::Read)
    }

    pub fn service_write(&self, name: &str) -> bool {
        self.named(|p| &p.service, name, Access::Write)
    }

    /// Write on some service (Consul's ServiceWriteAny): any rule granting
    /// write; else a `""` prefix rule that does not refuses; else the
    /// default.
    pub fn service_write_any(&self) -> bool {
        self.decided(|p| p.service_write_any)
    }

    pub fn node_read(&self, name: &str) -> bool {
        self.named(|p| &p.node, name, Access::Read)
    }

    pub fn node_write(&self, name: &str) -> bool {
        self.named(|p| &p.node, name, Access::Write)
    }

    pub fn agent_read(&self, node: &str) -> bool {
        self.named(|p| &p.agent, node, Access::Read)
    }

    pub fn agent_write(&self, node: &str) -> bool {
        self.named(|p| &p.agent, node, Access::Write)
    }

    pub fn session_read(&self, node: &str) -> bool {
        self.named(|p| &p.session, node, Access::Read)
    }

    pub fn session_write(&self, node: &str) -> bool {
        self.named(|p| &p.session, node, Access::Write)
    }

    pub fn query_read(&self, name: &str) -> bool {
        self.named(|p| &p.query, name, Access::Read)
    }

    pub fn query_write(&self, name: &str) -> bool {
        self.named(|p| &p.query, name, Access::Write)
    }

    pub fn event_read(&self, name: &str) -> bool {
        self.named(|p| &p.event, name, Access::Read)
    }

    pub fn event_write(&self, name: &str) -> bool {
        self.named(|p| &p.event, name, Access::Write)
    }

    /// Reading intentions on `name` (a destination or source service). The
    /// wildcard `*` needs read on some service's intentions (Consul).
    pub fn intention_read(&self, name: &str) -> bool {
        if name == "*" {
            return self.decided(|p| p.intention_read_any);
        }
        self.named(|p| &p.intention, name, Access::Read)
    }

    /// Writing intentions on `name`. The wildcard `*` needs write on every
    /// service's intentions (a `""` prefix granting it, nothing refusing).
    pub fn intention_write(&self, name: &str) -> bool {
        if name == "*" {
            return self.decided(|p| p.intention_write_all);
        }
        self.named(|p| &p.intention, name, Access::Write)
    }

    pub fn operator_read(&self) -> bool {
        self.scalar(|p| p.operator, Access::Read, false)
    }

    pub fn operator_write(&self) -> bool {
        self.scalar(|p| p.operator, Access::Write, false)
    }

    /// ACL management is never granted by the default `allow` (Consul's
    /// AllowAll excludes it): only an `acl` rule or management.
    pub fn acl_read(&self) -> bool {
        self.scalar(|p| p.acl, Access::Read, true)
    }

    pub fn acl_write(&self) -> bool {
        self.scalar(|p| p.acl, Access::Write, true)
    }

    /// Snapshot save and restore: `acl = "write"` or management (Consul).
    pub fn snapshot(&self) -> bool {
        self.acl_write()
    }

    /// Without a `mesh` rule, the `operator` rule decides (Consul).
    pub fn mesh_read(&self) -> bool {
        self.scalar(|p| p.mesh.or(p.operator), Access::Read, false)
    }

    pub fn mesh_write(&self) -> bool {
        self.scalar(|p| p.mesh.or(p.operator), Access::Write, false)
    }

    /// Without a `peering` rule, the `operator` rule decides (Consul).
    pub fn peering_read(&self) -> bool {
        self.scalar(|p| p.peering.or(p.operator), Access::Read, false)
    }

    pub fn peering_write(&self) -> bool {
        self.scalar(|p| p.peering.or(p.operator), Access::Write, false)
    }

    pub fn keyring_read(&self) -> bool {
        self.scalar(|p| p.keyring, Access::Read, false)
    }

    pub fn keyring_write(&self) -> bool {
        self.scalar(|p| p.keyring, Access::Write, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::parse_rules;

    fn authz(default: DefaultPolicy, texts: &[&str]) -> Authorizer {
        let rules: Vec<Rules> = texts.iter().map(|t| parse_rules(t).unwrap()).collect();
        let refs: Vec<&Rules> = rules.iter().collect();
        Authorizer::new("a1b2", &refs, default)
    }

    /// (check, name, want) rows against one authorizer.
    fn check(a: &Authorizer, rows: &[(&str, &str, bool)]) {
        for (perm, name, want) in rows {
            let got = match *perm {
                "key:read" => a.key_read(name),
                "key:list" => a.key_list(name),
                "key:write" => a.key_write(name),
                "key:write-prefix" => a.key_write_prefix(name),
                "service:read" => a.service_read(name),
                "service:write" => a.service_write(name),
                "service:write-any" => a.service_write_any(),
                "node:read" => a.node_read(name),
                "node:write" => a.node_write(name),
                "agent:read" => a.agent_read(name),
                "agent:write" => a.agent_write(name),
                "session:read" => a.session_read(name),
                "session:write" => a.session_write(name),
                "query:read" => a.query_read(name),
                "query:write" => a.query_write(name),
                "event:read" => a.event_read(name),
                "event:write" => a.event_write(name),
                "intention:read" => a.intention_read(name),
                "intention:write" => a.intention_write(name),
                "operator:read" => a.operator_read(),
                "operator:write" => a.operator_write(),
                "acl:read" => a.acl_read(),
                "acl:write" => a.acl_write(),
                "mesh:read" => a.mesh_read(),
                "mesh:write" => a.mesh_write(),
                "peering:read" => a.peering_read(),
                "peering:write" => a.peering_write(),
                "keyring:read" => a.keyring_read(),
                "keyring:write" => a.keyring_write(),
                "snapshot" => a.snapshot(),
                other => panic!("no check {other}"),
            };
            assert_eq!(got, *want, "{perm} on {name:?}");
        }
    }

    #[test]
    fn exact_beats_prefix_and_the_longest_prefix_wins() {
        let a = authz(
            DefaultPolicy::Deny,
            &[r#"
            key_prefix "" { policy = "read" }
            key_prefix "foo/" { policy = "write" }
            key_prefix "foo/priv/" { policy = "deny" }
            key "foo/priv/open" { policy = "write" }
            key "bar" { policy = "deny" }
            key_prefix "bar" { policy = "write" }
            "#],
        );
        check(
            &a,
            &[
                ("key:read", "other", true),
                ("key:write", "other", false),
                ("key:write", "foo/x", true),
                ("key:write", "foo/", true),
                ("key:write", "foo", false), // "foo/" does not cover "foo"
                ("key:read", "foo/priv/x", false),
                ("key:write", "foo/priv/open", true),
                ("key:write", "foo/priv/open2", false),
                ("key:read", "bar", false), // exact deny over prefix write
                ("key:write", "barn", true),
                ("key:read", "", true),
            ],
        );
    }

    #[test]
    fn no_rule_falls_through_to_the_default() {
        let text = r#"key_prefix "app/" { policy = "read" }
            service "web" { policy = "write" }"#;
        let deny = authz(DefaultPolicy::Deny, &[text]);
        let allow = authz(DefaultPolicy::Allow, &[text]);
        let rows = |d: bool| {
            vec![
                ("key:read", "app/x", true),
                ("key:write", "app/x", false), // a rule matched: no default
                ("key:write", "other/x", d),
                ("key:read", "other/x", d),
                ("service:write", "web", true),
                ("service:read", "db", d),
                ("node:read", "n1", d),
                ("agent:write", "n1", d),
                ("session:write", "n1", d),
                ("query:read", "q", d),
                ("event:write", "e", d),
                ("operator:write", "", d),
                ("mesh:write", "", d),
                ("keyring:read", "", d),
                // Consul's default allow never grants ACL management.
                ("acl:read", "", false),
                ("acl:write", "", false),
                ("snapshot", "", false),
            ]
        };
        check(&deny, &rows(false));
        check(&allow, &rows(true));
    }

    #[test]
    fn deny_wins_within_one_policy_and_across_merged_policies() {
        let within = authz(
            DefaultPolicy::Allow,
            &[r#"
            key "k" { policy = "write" }
            key "k" { policy = "deny" }
            service_prefix "" { policy = "write" }
            service_prefix "" { policy = "deny" }
            "#],
        );
        check(
            &within,
            &[("key:read", "k", false), ("service:read", "any", false)],
        );
        let across = authz(
            DefaultPolicy::Allow,
            &[
                r#"node "n" { policy = "write" }
                   key_prefix "a/" { policy = "read" }
                   operator = "write""#,
                r#"node "n" { policy = "deny" }
                   key_prefix "a/" { policy = "write" }
                   operator = "read""#,
                r#"key_prefix "a/" { policy = "list" }"#,
            ],
        );
        check(
            &across,
            &[
                ("node:read", "n", false),
                ("key:write", "a/x", true), // write over list over read
                ("operator:write", "", true),
            ],
        );
    }

    #[test]
    fn write_implies_read_and_list_list_implies_read() {
        let a = authz(
            DefaultPolicy::Deny,
            &[r#"
            key_prefix "w/" { policy = "write" }
            key_prefix "l/" { policy = "list" }
            key_prefix "r/" { policy = "read" }
            "#],
        );
        check(
            &a,
            &[
                ("key:read", "w/x", true),
                ("key:list", "w/", true),
                ("key:write", "w/x", true),
                ("key:read", "l/x", true),
                ("key:list", "l/", true),
                ("key:write", "l/x", false),
                ("key:read", "r/x", true),
                ("key:list", "r/", false),
                ("key:write", "r/x", false),
            ],
        );
    }

    #[test]
    fn key_write_prefix_needs_write_with_nothing_weaker_below() {
        let a = authz(
            DefaultPolicy::Deny,
            &[r#"
            key_prefix "" { policy = "read" }
            key_prefix "app/" { policy = "write" }
            key "app/secret" { policy = "read" }
            key_prefix "db/" { policy = "write" }
            key_prefix "db/locked/" { policy = "deny" }
            key_prefix "all/" { policy = "write" }
            key "all/x" { policy = "write" }
            "#],
        );
        check(
            &a,
            &[
                ("key:write-prefix", "app/", false), // app/secret is read only
                ("key:write-prefix", "app/other/", true),
                ("key:write-prefix", "db/", false),
                ("key:write-prefix", "db/open/", true),
                ("key:write-prefix", "all/", true),
                ("key:write-prefix", "", false), // "" prefix is read
                ("key:write-prefix", "x/", false),
            ],
        );
        // Without a covering prefix rule the default decides, unless
        // something below refuses.
        let b = authz(
            DefaultPolicy::Allow,
            &[r#"
            key "x/a" { policy = "write" }
            key "y/a" { policy = "read" }
            "#],
        );
        check(
            &b,
            &[
                ("key:write-prefix", "x/", true),
                ("key:write-prefix", "y/", false),
                ("key:write-prefix", "", false),
                ("key:write-prefix", "z/", true),
            ],
        );
        let c = authz(DefaultPolicy::Deny, &[r#"key "x/a" { policy = "write" }"#]);
        check(&c, &[("key:write-prefix", "x/", false)]);
    }

    #[test]
    fn intentions_follow_service_rules_unless_given() {
        let a = authz(
            DefaultPolicy::Deny,
            &[r#"
            service "web" { policy = "write" }
            service "db" {
              policy = "read"
              intentions = "write"
            }
            service "api" {
              policy = "write"
              intentions = "deny"
            }
            service "gone" { policy = "deny" }
            service_prefix "pay-" { policy = "read" }
            "#],
        );
        check(
            &a,
            &[
                ("intention:read", "web", true), // implied read
                ("intention:write", "web", false),
                ("intention:write", "db", true),
                ("intention:read", "api", false),
                ("service:write", "api", true),
                ("intention:read", "gone", false),
                ("intention:read", "pay-x", true),
                ("intention:read", "other", false),
                ("intention:read", "*", true), // some service's intentions
                ("intention:write", "*", false), // not every service's
            ],
        );
        // A merged deny takes the implied intention access with it.
        let b = authz(
            DefaultPolicy::Allow,
            &[
                r#"service "web" { policy = "write" }"#,
                r#"service "web" { policy = "deny" }"#,
            ],
        );
        check(&b, &[("intention:read", "web", false)]);
        let c = authz(
            DefaultPolicy::Deny,
            &[r#"service_prefix "" {
                policy = "write"
                intentions = "write"
            }"#],
        );
        check(&c, &[("intention:write", "*", true)]);
    }

    #[test]
    fn service_write_any() {
        let cases: &[(&str, DefaultPolicy, bool)] = &[
            (
                r#"service "web" { policy = "write" }"#,
                DefaultPolicy::Deny,
                true,
            ),
            (
                r#"service_prefix "x" { policy = "write" }"#,
                DefaultPolicy::Deny,
                true,
            ),
            (
                r#"service "web" { policy = "read" }"#,
                DefaultPolicy::Deny,
                false,
            ),
            (
                r#"service "web" { policy = "read" }"#,
                DefaultPolicy::Allow,
                true,
            ),
            // A "" rule that does not grant write decides over the default.
            (
                r#"service_prefix "" { policy = "read" }"#,
                DefaultPolicy::Allow,
                false,
            ),
            (
                r#"service_prefix "" { policy = "deny" }
                   service "web" { policy = "write" }"#,
                DefaultPolicy::Deny,
                true,
            ),
            ("", DefaultPolicy::Allow, true),
            ("", DefaultPolicy::Deny, false),
        ];
        for (text, default, want) in cases {
            let a = authz(*default, &[text]);
            assert_eq!(a.service_write_any(), *want, "{text} {default:?}");
        }
    }

    #[test]
    fn scalar_resources_and_mesh_falling_back_to_operator() {
        let a = authz(
            DefaultPolicy::Deny,
            &[r#"
            operator = "write"
            acl = "read"
            keyring = "deny"
            "#],
        );
        check(
            &a,
            &[
                ("operator:read", "", true),
                ("operator:write", "", true),
                ("mesh:write", "", true), // no mesh rule: operator's
                ("peering:write", "", true),
                ("acl:read", "", true),
                ("acl:write", "", false),
                ("snapshot", "", false),
                ("keyring:read", "", false),
            ],
        );
        let b = authz(
            DefaultPolicy::Allow,
            &[r#"
            operator = "write"
            mesh = "read"
            acl = "write"
            "#],
        );
        check(
            &b,
            &[
                ("mesh:read", "", true),
                ("mesh:write", "", false),
                ("acl:write", "", true),
                ("snapshot", "", true),
            ],
        );
    }

    #[test]
    fn every_segmented_kind_uses_its_own_rules() {
        let a = authz(
            DefaultPolicy::Deny,
            &[r#"
            node_prefix "n" { policy = "read" }
            agent_prefix "a" { policy = "write" }
            session "s1" { policy = "write" }
            query_prefix "q" { policy = "read" }
            event_prefix "" { policy = "write" }
            "#],
        );
        check(
            &a,
            &[
                ("node:read", "n1", true),
                ("node:write", "n1", false),
                ("node:read", "a1", false),
                ("agent:write", "a1", true),
                ("agent:read", "n1", false),
                ("session:write", "s1", true),
                ("session:read", "s2", false),
                ("query:read", "q1", true),
                ("query:write", "q1", false),
                ("event:write", "anything", true),
                ("key:read", "n1", false),
            ],
        );
    }

    #[test]
    fn management_and_acls_off_allow_everything() {
        assert!(Authorizer::allow_all().acls_off());
        assert!(!Authorizer::management("m1").acls_off());
        for a in [Authorizer::management("m1"), Authorizer::allow_all()] {
            check(
                &a,
                &[
                    ("key:write", "x", true),
                    ("key:write-prefix", "", true),
                    ("service:write-any", "", true),
                    ("intention:write", "*", true),
                    ("acl:write", "", true),
                    ("snapshot", "", true),
                    ("operator:write", "", true),
                    ("keyring:write", "", true),
                ],
            );
        }
        assert_eq!(Authorizer::management("m1").accessor(), "m1");
    }

    #[test]
    fn prefixes_respect_character_boundaries() {
        // A prefix length that falls inside a multi-byte character of the
        // name must not panic or match.
        let a = authz(
            DefaultPolicy::Deny,
            &[r#"key_prefix "ab" { policy = "read" }"#],
        );
        check(&a, &[("key:read", "aé", false), ("key:read", "abé", true)]);
        let b = authz(
            DefaultPolicy::Deny,
            &[r#"key_prefix "é" { policy = "read" }"#],
        );
        check(&b, &[("key:read", "éa", true), ("key:read", "e", false)]);
    }

    #[test]
    fn denials_carry_consuls_text() {
        let a = authz(DefaultPolicy::Deny, &[""]);
        assert_eq!(
            a.deny("key:write", "other/x").to_string(),
            "Permission denied: token with AccessorID 'a1b2' lacks permission 'key:write' on \"other/x\""
        );
        assert_eq!(
            a.deny("operator:read", "").to_string(),
            "Permission denied: token with AccessorID 'a1b2' lacks permission 'operator:read'"
        );
        let anon = Authorizer::new(ANONYMOUS, &[], DefaultPolicy::Deny);
        assert_eq!(
            anon.deny("service:write", "web").to_string(),
            "Permission denied: anonymous token lacks permission 'service:write' on \"web\". \
             The anonymous token is used implicitly when a request does not specify a token."
        );
    }

    #[test]
    fn authorizer_is_shareable() {
        fn shareable<T: Send + Sync + 'static>() {}
        shareable::<Authorizer>();
        shareable::<Denied>();
    }
}
