//! The ACL rules language: a policy's `Rules` text, in Consul's HCL or JSON
//! syntax, parsed into per-resource tables of exact and prefix rules.
//!
//! Both syntaxes describe the same thing:
//!
//! ```text
//! key_prefix "app/" { policy = "write" }     {"key_prefix": {"app/": {"policy": "write"}}}
//! service "web" { policy = "read" intentions = "write" }
//! operator = "read"                          {"operator": "read"}
//! ```
//!
//! Two rules for the same name (in one text, or when several policies are
//! merged) combine as Consul's policy merger does: `deny` over `write` over
//! `list` over `read` ([`Access::merge`]).

use std::collections::BTreeMap;

/// One rule's disposition. The order (`Deny < Read < List < Write`) is the
/// order of what it grants; [`Access::merge`] is the precedence between two.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    Deny,
    Read,
    List,
    Write,
}

impl Access {
    /// Two rules for the same resource, as Consul merges them: an explicit
    /// `deny` wins, otherwise the one that grants more.
    pub fn merge(self, other: Access) -> Access {
        if self == Access::Deny || other == Access::Deny {
            Access::Deny
        } else {
            self.max(other)
        }
    }

    /// Whether this rule grants `need`: `write` grants everything, `list`
    /// grants listing and reading (Consul's `enforce`), `read` only reading,
    /// `deny` nothing.
    pub fn grants(self, need: Access) -> bool {
        match self {
            Access::Write => true,
            Access::List => matches!(need, Access::List | Access::Read),
            Access::Read => need == Access::Read,
            Access::Deny => false,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Access::Deny => "deny",
            Access::Read => "read",
            Access::List => "list",
            Access::Write => "write",
        }
    }
}

/// The rules of one segmented resource kind: exact names and name prefixes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Named {
    pub exact: BTreeMap<String, Access>,
    pub prefix: BTreeMap<String, Access>,
}

impl Named {
    fn add(&mut self, prefix: bool, name: &str, access: Access) {
        let map = if prefix {
            &mut self.prefix
        } else {
            &mut self.exact
        };
        map.entry(name.to_owned())
            .and_modify(|a| *a = a.merge(access))
            .or_insert(access);
    }

    fn merge(&mut self, other: &Named) {
        for (n, a) in &other.exact {
            self.add(false, n, *a);
        }
        for (n, a) in &other.prefix {
            self.add(true, n, *a);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.prefix.is_empty()
    }
}

/// A policy's rules. `intentions` holds only the explicit `intentions = …`
/// of service rules: the implied ones (read for a service `read`/`write`
/// rule, deny otherwise) are derived after merging, as Consul does, so that
/// a merged `deny` also takes the implied intention access with it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rules {
    pub key: Named,
    pub service: Named,
    pub intentions: Named,
    pub node: Named,
    pub agent: Named,
    pub session: Named,
    pub query: Named,
    pub event: Named,
    pub operator: Option<Access>,
    pub acl: Option<Access>,
    pub mesh: Option<Access>,
    pub peering: Option<Access>,
    pub keyring: Option<Access>,
}

impl Rules {
    /// Adds another policy's rules to these, with Consul's precedence.
    pub fn merge(&mut self, other: &Rules) {
        self.key.merge(&other.key);
        self.service.merge(&other.service);
        self.intentions.merge(&other.intentions);
        self.node.merge(&other.node);
        self.agent.merge(&other.agent);
        self.session.merge(&other.session);
        self.query.merge(&other.query);
        self.event.merge(&other.event);
        for (mine, theirs) in [
            (&mut self.operator, other.operator),
            (&mut self.acl, other.acl),
            (&mut self.mesh, other.mesh),
            (&mut self.peering, other.peering),
            (&mut self.keyring, other.keyring),
        ] {
            merge_scalar(mine, theirs);
        }
    }

    fn named_mut(&mut self, kind: Segmented) -> &mut Named {
        match kind {
            Segmented::Key => &mut self.key,
            Segmented::Service => &mut self.service,
            Segmented::Node => &mut self.node,
            Segmented::Agent => &mut self.agent,
            Segmented::Session => &mut self.session,
            Segmented::Query => &mut self.query,
            Segmented::Event => &mut self.event,
        }
    }

    fn scalar_mut(&mut self, kind: Scalar) -> &mut Option<Access> {
        match kind {
            Scalar::Operator => &mut self.operator,
            Scalar::Acl => &mut self.acl,
            Scalar::Mesh => &mut self.mesh,
            Scalar::Peering => &mut self.peering,
            Scalar::Keyring => &mut self.keyring,
        }
    }
}

fn merge_scalar(mine: &mut Option<Access>, theirs: Option<Access>) {
    if let Some(t) = theirs {
        *mine = Some(mine.map_or(t, |m| m.merge(t)));
    }
}

/// What is wrong with a rules text; each message names the place, for a 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RulesError {
    #[error("Failed to parse ACL rules: {0}")]
    Syntax(String),
    #[error("Failed to parse ACL rules: unknown resource \"{0}\"")]
    UnknownResource(String),
    #[error("Failed to parse ACL rules: Invalid {resource} policy {value:?}{}", on(.name))]
    InvalidPolicy {
        resource: String,
        name: Option<String>,
        value: String,
    },
    #[error("Failed to parse ACL rules: {resource} {name:?} has no policy")]
    MissingPolicy { resource: String, name: String },
    #[error("Failed to parse ACL rules: {resource}{} has unknown field \"{field}\"", on(.name))]
    UnknownField {
        resource: String,
        name: Option<String>,
        field: String,
    },
    #[error("Failed to parse ACL rules: {resource} {detail}")]
    Shape { resource: String, detail: String },
}

fn on(name: &Option<String>) -> String {
    match name {
        Some(n) => format!(" {n:?}"),
        None => String::new(),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Segmented {
    Key,
    Service,
    Node,
    Agent,
    Session,
    Query,
    Event,
}

#[derive(Clone, Copy)]
enum Scalar {
    Operator,
    Acl,
    Mesh,
    Peering,
    Keyring,
}

enum Kind {
    /// A segmented resource, and whether the rule is a prefix rule.
    Named(Segmented, bool),
    Scalar(Scalar),
}

fn kind_of(resource: &str) -> Option<Kind> {
    use Segmented::*;
    Some(match resource {
        "key" => Kind::Named(Key, false),
        "key_prefix" => Kind::Named(Key, true),
        "service" => Kind::Named(Service, false),
        "service_prefix" => Kind::Named(Service, true),
        "node" => Kind::Named(Node, false),
        "node_prefix" => Kind::Named(Node, true),
        "agent" => Kind::Named(Agent, false),
        "agent_prefix" => Kind::Named(Agent, true),
        "session" => Kind::Named(Session, false),
        "session_prefix" => Kind::Named(Session, true),
        "query" => Kind::Named(Query, false),
        "query_prefix" => Kind::Named(Query, true),
        "event" => Kind::Named(Event, false),
        "event_prefix" => Kind::Named(Event, true),
        "operator" => Kind::Scalar(Scalar::Operator),
        "acl" => Kind::Scalar(Scalar::Acl),
        "mesh" => Kind::Scalar(Scalar::Mesh),
        "peering" => Kind::Scalar(Scalar::Peering),
        "keyring" => Kind::Scalar(Scalar::Keyring),
        _ => return None,
    })
}

/// Parses a policy's rules, HCL or JSON (Consul takes both; text whose first
/// non-blank character is `{` is JSON). Empty text is a policy without rules.
pub fn parse_rules(text: &str) -> Result<Rules, RulesError> {
    let mut rules = Rules::default();
    let trimmed = text.trim_start();
    if trimmed.is_empty() {
        return Ok(rules);
    }
    if trimmed.starts_with('{') {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| RulesError::Syntax(e.to_string()))?;
        let serde_json::Value::Object(top) = value else {
            return Err(RulesError::Syntax("rules must be a JSON object".into()));
        };
        for (resource, v) in &top {
            add_entry(&mut rules, resource, v)?;
        }
        return Ok(rules);
    }
    let body =
        hcl::parse(&one_attribute_a_line(text)).map_err(|e| RulesError::Syntax(e.to_string()))?;
    for structure in body.into_iter() {
        match structure {
            hcl::Structure::Attribute(attr) => {
                let resource = attr.key().to_owned();
                add_entry(&mut rules, &resource, &json_of(attr.expr.into())?)?;
            }
            hcl::Structure::Block(block) => {
                let resource = block.identifier().to_owned();
                let kind =
                    kind_of(&resource).ok_or(RulesError::UnknownResource(resource.clone()))?;
                let Kind::Named(seg, prefix) = kind else {
                    return Err(RulesError::Shape {
                        resource,
                        detail: "takes a value (operator = \"read\"), not a block".into(),
                    });
                };
                let [label] = block.labels() else {
                    return Err(RulesError::Shape {
                        resource,
                        detail: "block needs exactly one name: key_prefix \"app/\" { … }".into(),
                    });
                };
                let name = label.as_str().to_owned();
                let body = fields_of(&resource, &name, block.body)?;
                add_rule(&mut rules, &resource, seg, prefix, &name, &body)?;
            }
        }
    }
    Ok(rules)
}

/// HCL 1 takes several attributes in a one-line block (`service "a" {
/// policy = "write" intentions = "read" }`, as Consul's docs write rules),
/// and several blocks on one line (`service "a" { .. } node_prefix "" {
/// .. }`); HCL 2 wants each on a line of its own. After a string ends, a
/// name on the same line can only start another attribute: a newline goes
/// before it, and after the block's `{` and before its `}`; after a block's
/// `}`, a name on the same line starts the next item: a newline goes
/// before it. Strings (with their escapes) and comments are read past
/// untouched.
/// Whether a name (an attribute's or a block's) starts on this line at
/// `i`, after blanks.
fn starts_a_name(bytes: &[u8], mut i: usize) -> bool {
    while i < bytes.len() && (bytes[i] == b' ' || bytes[i] == b'\t') {
        i += 1;
    }
    i < bytes.len() && (bytes[i].is_ascii_alphabetic() || bytes[i] == b'_')
}

fn one_attribute_a_line(text: &str) -> std::borrow::Cow<'_, str> {
    let bytes = text.as_bytes();
    let line_end = |from: usize| text[from..].find('\n').map_or(bytes.len(), |n| from + n);
    // Where a newline goes; the open blocks (their `{`, whether split).
    let mut breaks: Vec<usize> = Vec::new();
    let mut open: Vec<(usize, bool)> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i = (i + 1).min(bytes.len());
                if starts_a_name(bytes, i) {
                    breaks.push(i);
                    if let Some((brace, split)) = open.last_mut()
                        && !*split
                    {
                        *split = true;
                        breaks.push(*brace + 1);
                    }
                }
            }
            b'{' => {
                open.push((i, false));
                i += 1;
            }
            b'}' => {
                // Split already, or the block began on an earlier line and
                // something precedes its `}` on this one: `}` to a line of
                // its own.
                let line_start = text[..i].rfind('\n');
                match open.pop() {
                    Some((_, true)) => breaks.push(i),
                    Some((brace, false))
                        if line_start
                            .is_some_and(|l| l > brace && !text[l + 1..i].trim().is_empty()) =>
                    {
                        breaks.push(i)
                    }
                    _ => {}
                }
                i += 1;
                // Another block or attribute after it on the same line.
                if starts_a_name(bytes, i) {
                    breaks.push(i);
                }
            }
            b'#' => i = line_end(i),
            b'/' if bytes.get(i + 1) == Some(&b'/') => i = line_end(i),
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i = text[i + 2..]
                    .find("*/")
                    .map_or(bytes.len(), |n| i + 2 + n + 2)
            }
            _ => i += 1,
        }
    }
    if breaks.is_empty() {
        return std::borrow::Cow::Borrowed(text);
    }
    breaks.sort_unstable();
    let mut out = String::with_capacity(text.len() + breaks.len());
    let mut copied = 0;
    for b in breaks {
        out.push_str(&text[copied..b]);
        out.push('\n');
        copied = b;
    }
    out.push_str(&text[copied..]);
    std::borrow::Cow::Owned(out)
}

fn json_of(v: hcl::Value) -> Result<serde_json::Value, RulesError> {
    serde_json::to_value(v).map_err(|e| RulesError::Syntax(e.to_string()))
}

/// A rule block's attributes as a JSON object (a rule has no inner blocks).
fn fields_of(resource: &str, name: &str, body: hcl::Body) -> Result<serde_json::Value, RulesError> {
    let mut fields = serde_json::Map::new();
    for structure in body.into_iter() {
        match structure {
            hcl::Structure::Attribute(attr) => {
                let key = attr.key().to_owned();
                fields.insert(key, json_of(attr.expr.into())?);
            }
            hcl::Structure::Block(inner) => {
                return Err(RulesError::UnknownField {
                    resource: resource.into(),
                    name: Some(name.into()),
                    field: inner.identifier().into(),
                });
            }
        }
    }
    Ok(serde_json::Value::Object(fields))
}

/// One top-level entry: `resource = value` in HCL, `"resource": value` in
/// JSON.
fn add_entry(rules: &mut Rules, resource: &str, v: &serde_json::Value) -> Result<(), RulesError> {
    use serde_json::Value;
    let kind = kind_of(resource).ok_or_else(|| RulesError::UnknownResource(resource.into()))?;
    match (kind, v) {
        // `keyring = ""` is no rule, as in Consul.
        (Kind::Scalar(_), Value::String(p)) if p.is_empty() => Ok(()),
        (Kind::Scalar(s), Value::String(p)) => {
            let access = access_of(resource, None, p, false)?;
            merge_scalar(rules.scalar_mut(s), Some(access));
            Ok(())
        }
        (Kind::Scalar(_), _) => Err(RulesError::Shape {
            resource: resource.into(),
            detail: "must be a string: \"read\", \"write\" or \"deny\"".into(),
        }),
        (Kind::Named(seg, prefix), Value::Object(names)) => {
            for (name, body) in names {
                add_rule(rules, resource, seg, prefix, name, body)?;
            }
            Ok(())
        }
        // HCL 1 turned into JSON repeats blocks as arrays of objects.
        (Kind::Named(..), Value::Array(items)) => {
            for item in items {
                add_entry(rules, resource, item)?;
            }
            Ok(())
        }
        (Kind::Named(..), _) => Err(RulesError::Shape {
            resource: resource.into(),
            detail: "must map names to rules: {\"name\": {\"policy\": \"read\"}}".into(),
        }),
    }
}

/// One named rule's body: `{ policy = "…" }`, for services also
/// `intentions = "…"`.
fn add_rule(
    rules: &mut Rules, resource: &str, seg: Segmented, prefix: bool, name: &str,
    body: &serde_json::Value,
) -> Result<(), RulesError> {
    use serde_json::Value;
    let fields = match body {
        Value::Object(fields) => fields,
        Value::Array(items) => {
            for item in items {
                add_rule(rules, resource, seg, prefix, name, item)?;
            }
            return Ok(());
        }
        _ => {
            return Err(RulesError::Shape {
                resource: resource.into(),
                detail: format!("{name:?} must be a block: {{ policy = \"read\" }}"),
            });
        }
    };
    let mut policy = None;
    let mut intentions = None;
    for (field, v) in fields {
        let Value::String(s) = v else {
            return Err(RulesError::InvalidPolicy {
                resource: resource.into(),
                name: Some(name.into()),
                value: v.to_string(),
            });
        };
        match field.as_str() {
            "policy" => policy = Some(access_of(resource, Some(name), s, seg == Segmented::Key)?),
            "intentions" if seg == Segmented::Service => {
                let resource = format!("{resource} intentions");
                intentions = Some(access_of(&resource, Some(name), s, false)?)
            }
            _ => {
                return Err(RulesError::UnknownField {
                    resource: resource.into(),
                    name: Some(name.into()),
                    field: field.clone(),
                });
            }
        }
    }
    let policy = policy.ok_or_else(|| RulesError::MissingPolicy {
        resource: resource.into(),
        name: name.into(),
    })?;
    rules.named_mut(seg).add(prefix, name, policy);
    if let Some(i) = intentions {
        rules.intentions.add(prefix, name, i);
    }
    Ok(())
}

fn access_of(
    resource: &str, name: Option<&str>, value: &str, list_allowed: bool,
) -> Result<Access, RulesError> {
    match value {
        "read" => Ok(Access::Read),
        "write" => Ok(Access::Write),
        "deny" => Ok(Access::Deny),
        "list" if list_allowed => Ok(Access::List),
        _ => Err(RulesError::InvalidPolicy {
            resource: resource.into(),
            name: name.map(str::to_owned),
            value: value.into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(exact: &[(&str, Access)], prefix: &[(&str, Access)]) -> Named {
        let map = |rows: &[(&str, Access)]| rows.iter().map(|(n, a)| (n.to_string(), *a)).collect();
        Named {
            exact: map(exact),
            prefix: map(prefix),
        }
    }

    const HCL: &str = r#"
        # every resource kind once
        key "app/config" { policy = "read" }
        key_prefix "app/" { policy = "write" }
        key_prefix "" { policy = "list" }
        service "web" {
          policy = "write"
          intentions = "deny"
        }
        service_prefix "" { policy = "read" }
        node "n1" { policy = "write" }
        node_prefix "" { policy = "read" }
        agent "n1" { policy = "read" }
        agent_prefix "a" { policy = "deny" }
        session "n1" { policy = "write" }
        session_prefix "" { policy = "read" }
        query "q" { policy = "write" }
        query_prefix "" { policy = "read" }
        event "deploy" { policy = "write" }
        event_prefix "" { policy = "read" }
        operator = "read"
        acl = "write"
        mesh = "deny"
        keyring = "read"
    "#;

    const JSON: &str = r#"{
        "key": {"app/config": {"policy": "read"}},
        "key_prefix": {"app/": {"policy": "write"}, "": {"policy": "list"}},
        "service": {"web": {"policy": "write", "intentions": "deny"}},
        "service_prefix": {"": {"policy": "read"}},
        "node": {"n1": {"policy": "write"}},
        "node_prefix": {"": {"policy": "read"}},
        "agent": {"n1": {"policy": "read"}},
        "agent_prefix": {"a": {"policy": "deny"}},
        "session": {"n1": {"policy": "write"}},
        "session_prefix": {"": {"policy": "read"}},
        "query": {"q": {"policy": "write"}},
        "query_prefix": {"": {"policy": "read"}},
        "event": {"deploy": {"policy": "write"}},
        "event_prefix": {"": {"policy": "read"}},
        "operator": "read",
        "acl": "write",
        "mesh": "deny",
        "keyring": "read"
    }"#;

    fn expected() -> Rules {
        use Access::*;
        Rules {
            key: named(&[("app/config", Read)], &[("app/", Write), ("", List)]),
            service: named(&[("web", Write)], &[("", Read)]),
            intentions: named(&[("web", Deny)], &[]),
            node: named(&[("n1", Write)], &[("", Read)]),
            agent: named(&[("n1", Read)], &[("a", Deny)]),
            session: named(&[("n1", Write)], &[("", Read)]),
            query: named(&[("q", Write)], &[("", Read)]),
            event: named(&[("deploy", Write)], &[("", Read)]),
            operator: Some(Read),
            acl: Some(Write),
            mesh: Some(Deny),
            peering: None,
            keyring: Some(Read),
        }
    }

    #[test]
    fn hcl_and_json_give_the_same_rules() {
        assert_eq!(parse_rules(HCL).unwrap(), expected());
        assert_eq!(parse_rules(JSON).unwrap(), expected());
    }

    #[test]
    fn empty_text_is_no_rules() {
        assert_eq!(parse_rules("").unwrap(), Rules::default());
        assert_eq!(parse_rules("  \n# nothing\n").unwrap(), Rules::default());
        assert_eq!(parse_rules("{}").unwrap(), Rules::default());
    }

    #[test]
    fn two_rules_for_one_name_merge_deny_first_then_the_stronger() {
        let r = parse_rules(
            r#"
            key "a" { policy = "write" }
            key "a" { policy = "deny" }
            key "a" { policy = "read" }
            key_prefix "b/" { policy = "read" }
            key_prefix "b/" { policy = "list" }
            service "s" { policy = "read" }
            service "s" { policy = "write" }
            "#,
        );
        // A repeated scalar is an HCL error (hcl-rs refuses a redefined
        // attribute): a 400, not a silent pick.
        let twice = parse_rules("operator = \"read\"\noperator = \"write\"\n");
        assert!(matches!(twice, Err(RulesError::Syntax(_))), "{twice:?}");
        let r = r.unwrap();
        assert_eq!(r.key.exact["a"], Access::Deny);
        assert_eq!(r.key.prefix["b/"], Access::List);
        assert_eq!(r.service.exact["s"], Access::Write);
    }

    #[test]
    fn merge_across_policies_follows_consuls_precedence() {
        use Access::*;
        let cases = [
            (Read, Write, Write),
            (Write, Read, Write),
            (Read, List, List),
            (List, Write, Write),
            (Write, Deny, Deny),
            (Deny, Write, Deny),
            (Deny, Read, Deny),
        ];
        for (a, b, want) in cases {
            let mut x = Rules {
                key: named(&[("k", a)], &[]),
                acl: Some(a),
                ..Rules::default()
            };
            let y = Rules {
                key: named(&[("k", b)], &[]),
                acl: Some(b),
                ..Rules::default()
            };
            x.merge(&y);
            assert_eq!(x.key.exact["k"], want, "{a:?} + {b:?}");
            assert_eq!(x.acl, Some(want), "{a:?} + {b:?}");
        }
        let mut only = Rules::default();
        only.merge(&Rules {
            operator: Some(Read),
            ..Rules::default()
        });
        assert_eq!(only.operator, Some(Read));
    }

    #[test]
    fn repeated_json_arrays_from_hcl1_are_read() {
        let r = parse_rules(
            r#"{"key_prefix": [{"a/": [{"policy": "read"}]}, {"b/": {"policy": "write"}}]}"#,
        )
        .unwrap();
        assert_eq!(r.key.prefix["a/"], Access::Read);
        assert_eq!(r.key.prefix["b/"], Access::Write);
    }

    #[test]
    fn bad_rules_are_errors_that_say_what_is_wrong() {
        let cases: &[(&str, &str)] = &[
            (r#"kye "a" { policy = "read" }"#, "unknown resource \"kye\""),
            (r#"{"kye": {}}"#, "unknown resource \"kye\""),
            (r#"namespace "a" { policy = "read" }"#, "unknown resource"),
            (
                r#"key "a" { policy = "rw" }"#,
                "Invalid key policy \"rw\" \"a\"",
            ),
            (
                r#"service "a" { policy = "list" }"#,
                "Invalid service policy \"list\"",
            ),
            (r#"operator = "list""#, "Invalid operator policy \"list\""),
            (r#"acl = "admin""#, "Invalid acl policy \"admin\""),
            (
                "service \"a\" {\n policy = \"read\"\n intentions = \"list\"\n}",
                "Invalid service intentions policy \"list\" \"a\"",
            ),
            (
                r#"key "a" { intentions = "read" }"#,
                "unknown field \"intentions\"",
            ),
            (r#"node "a" { }"#, "node \"a\" has no policy"),
            (r#"node "a" { polcy = "read" }"#, "unknown field \"polcy\""),
            (r#"key "a" { policy = 3 }"#, "Invalid key policy"),
            (
                r#"service "a" { policy = "write" intentions = "foo" }"#,
                "Invalid service intentions policy \"foo\" \"a\"",
            ),
            (r#"key "a" { policy = "" }"#, "Invalid key policy"),
            (r#"key { policy = "read" }"#, "exactly one name"),
            (r#"key "a" "b" { policy = "read" }"#, "exactly one name"),
            (r#"operator { policy = "read" }"#, "not a block"),
            (r#"key = "read""#, "must map names to rules"),
            (r#"{"operator": {"policy": "read"}}"#, "must be a string"),
            (r#"{"key": {"a": "read"}}"#, "must be a block"),
            (r#"key "a" { policy = "read" "#, "Failed to parse ACL rules"),
            (r#"{"key": "#, "Failed to parse ACL rules"),
            (r#"["key"]"#, "Failed to parse ACL rules"),
        ];
        for (text, want) in cases {
            let e = parse_rules(text).expect_err(text).to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn hcl1_one_line_blocks_and_empty_scalars_parse_as_in_consul() {
        let r = parse_rules(
            "service \"foo\" { policy = \"write\" intentions = \"read\" } # a \"quoted\" x = 1\n\
             key \"a \\\" b\" { policy = \"read\" }\nkeyring = \"\"\nmesh = \"\"",
        )
        .unwrap();
        assert_eq!(r.service.exact["foo"], Access::Write);
        assert_eq!(r.intentions.exact["foo"], Access::Read);
        assert_eq!(r.key.exact["a \" b"], Access::Read);
        assert_eq!(r.keyring, None);
        assert_eq!(r.mesh, None);
        assert!(matches!(
            one_attribute_a_line("key \"a\" { policy = \"read\" }"),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    /// Consul's HCL 1 parser takes any number of blocks and attributes on
    /// one line; each of these reads as the same rules written a line each.
    #[test]
    fn several_blocks_and_attributes_on_one_line_parse_as_in_consul() {
        let spread =
            "service \"web\" {\n policy = \"read\"\n}\nnode_prefix \"\" {\n policy = \"read\"\n}\n";
        let cases = [
            r#"service "web" { policy = "read" } node_prefix "" { policy = "read" }"#,
            r#"service "web" { policy = "read" }  node_prefix "" { policy = "read" }  "#,
            "service \"web\" { policy = \"read\" }\tnode_prefix \"\" { policy = \"read\" } # two",
            r#"service "web" {
  policy = "read" } node_prefix "" { policy = "read" }"#,
        ];
        let want = parse_rules(spread).unwrap();
        for c in cases {
            assert_eq!(parse_rules(c).unwrap(), want, "{c}");
        }
        // Three blocks, one with two attributes, and a top-level attribute.
        let r = parse_rules(
            r#"key_prefix "" { policy = "read" } service "db" { policy = "write" intentions = "read" } operator = "read""#,
        )
        .unwrap();
        assert_eq!(r.key.prefix[""], Access::Read);
        assert_eq!(r.service.exact["db"], Access::Write);
        assert_eq!(r.intentions.exact["db"], Access::Read);
        assert_eq!(r.operator, Some(Access::Read));
        // Nested blocks on one line.
        let r = parse_rules(r#"service_prefix "" { policy = "read" } key "a" { policy = "deny" }"#)
            .unwrap();
        assert_eq!(r.key.exact["a"], Access::Deny);
    }

    #[test]
    fn list_is_for_keys_only() {
        assert_eq!(
            parse_rules(r#"key "a" { policy = "list" }"#)
                .unwrap()
                .key
                .exact["a"],
            Access::List
        );
        assert!(parse_rules(r#"node_prefix "" { policy = "list" }"#).is_err());
    }

    #[test]
    fn access_serializes_as_consuls_words() {
        assert_eq!(serde_json::to_string(&Access::List).unwrap(), "\"list\"");
        let a: Access = serde_json::from_str("\"deny\"").unwrap();
        assert_eq!(a, Access::Deny);
        assert_eq!(Access::Write.as_str(), "write");
    }
}
