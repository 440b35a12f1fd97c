//! Prepared queries (`/v1/query`) in Consul's JSON: the definition, the
//! checks a definition must pass (Consul's words), and templates — a
//! query whose name is a prefix, rendered for the name it is executed by
//! (`${name.full}`, `${name.prefix}`, `${name.suffix}`, `${match(N)}`,
//! `${agent.segment}` in the strings of its `Service` part).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::duration::Duration;
use super::serde_util::null_default;

/// Shown instead of a query's stored token to a caller without `acl:write`.
pub const REDACTED: &str = "<hidden>";
/// The one template type Consul has.
pub const NAME_PREFIX_MATCH: &str = "name_prefix_match";

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct PreparedQuery {
    #[serde(rename = "ID", deserialize_with = "null_default")]
    pub id: String,
    #[serde(deserialize_with = "null_default")]
    pub name: String,
    /// A session the query lives and dies with.
    #[serde(deserialize_with = "null_default")]
    pub session: String,
    /// The token the query is executed with (else the caller's).
    #[serde(deserialize_with = "null_default")]
    pub token: String,
    #[serde(deserialize_with = "null_default")]
    pub template: QueryTemplate,
    #[serde(deserialize_with = "null_default")]
    pub service: ServiceQuery,
    #[serde(rename = "DNS", deserialize_with = "null_default")]
    pub dns: QueryDns,
    pub create_index: u64,
    pub modify_index: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct QueryTemplate {
    #[serde(deserialize_with = "null_default")]
    pub r#type: String,
    #[serde(deserialize_with = "null_default")]
    pub regexp: String,
    pub remove_empty_tags: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ServiceQuery {
    #[serde(deserialize_with = "null_default")]
    pub service: String,
    #[serde(deserialize_with = "null_default")]
    pub failover: QueryFailover,
    #[serde(rename = "IgnoreCheckIDs", deserialize_with = "null_default")]
    pub ignore_check_ids: Vec<String>,
    pub only_passing: bool,
    #[serde(deserialize_with = "null_default")]
    pub near: String,
    #[serde(deserialize_with = "null_default")]
    pub tags: Vec<String>,
    #[serde(deserialize_with = "null_default")]
    pub node_meta: BTreeMap<String, String>,
    #[serde(deserialize_with = "null_default")]
    pub service_meta: BTreeMap<String, String>,
    pub connect: bool,
    #[serde(deserialize_with = "null_default")]
    pub peer: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct QueryFailover {
    #[serde(rename = "NearestN")]
    pub nearest_n: i64,
    #[serde(deserialize_with = "null_default")]
    pub datacenters: Vec<String>,
    #[serde(deserialize_with = "null_default")]
    pub targets: Vec<QueryTarget>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct QueryTarget {
    #[serde(deserialize_with = "null_default")]
    pub peer: String,
    #[serde(deserialize_with = "null_default")]
    pub datacenter: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct QueryDns {
    #[serde(rename = "TTL", deserialize_with = "null_default")]
    pub ttl: String,
}

impl QueryDns {
    /// The TTL in whole seconds, if one is set (checked at write).
    pub fn ttl_secs(&self) -> Option<u32> {
        if self.ttl.is_empty() {
            return None;
        }
        let d = Duration::parse(&self.ttl).ok()?;
        Some((d.nanos().max(0) / 1_000_000_000).min(i64::from(u32::MAX)) as u32)
    }
}

impl PreparedQuery {
    pub fn is_template(&self) -> bool {
        !self.template.r#type.is_empty()
    }

    /// The name prefix the query's ACLs are checked on: none for a query
    /// with neither name nor template (whoever knows its ID may use it,
    /// as in Consul).
    pub fn acl_prefix(&self) -> Option<&str> {
        (!self.name.is_empty() || self.is_template()).then_some(self.name.as_str())
    }

    /// What a definition must satisfy on its own, in Consul's words (the
    /// state checks names and sessions; templates compile in `compile`).
    pub fn validate(&self) -> Result<(), String> {
        if self.name.is_empty() && !self.is_template() && self.session.is_empty() {
            return Err("Must be bound to a session".into());
        }
        if self.token == REDACTED {
            return Err(format!(
                "Bad Token '{REDACTED}', it looks like a query definition with a redacted token was submitted"
            ));
        }
        let svc = &self.service;
        if svc.service.is_empty() {
            return Err("Must provide a Service name to query".into());
        }
        let f = &svc.failover;
        if f.nearest_n < 0 {
            return Err(format!("Bad NearestN '{}', must be >= 0", f.nearest_n));
        }
        if (f.nearest_n != 0 || !f.datacenters.is_empty()) && !f.targets.is_empty() {
            return Err("Targets cannot be populated with NearestN or Datacenters".into());
        }
        for t in &f.targets {
            if t.peer.is_empty() == t.datacenter.is_empty() {
                return Err("Targets must specify exactly one of Peer or Datacenter".into());
            }
        }
        // cairn has no cluster peering: a query that needs it could never
        // answer, so it is refused rather than stored.
        if !svc.peer.is_empty() || f.targets.iter().any(|t| !t.peer.is_empty()) {
            return Err("Cluster peering is not supported: Peer must be empty".into());
        }
        for k in svc.node_meta.keys().chain(svc.service_meta.keys()) {
            if k.is_empty() {
                return Err("Couldn't load metadata pair ('', ...): key cannot be blank".into());
            }
        }
        if !self.dns.ttl.is_empty() {
            let ttl = Duration::parse(&self.dns.ttl)
                .map_err(|e| format!("Bad DNS TTL '{}': {e}", self.dns.ttl))?;
            if ttl.nanos() < 0 {
                return Err(format!("DNS TTL '{}', must be >=0", self.dns.ttl));
            }
        }
        if self.is_template() {
            Template::compile(self)?;
        }
        Ok(())
    }
}

/// One piece of a templated string.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    NameFull,
    NamePrefix,
    NameSuffix,
    AgentSegment,
    Match(usize),
}

/// Parses `${...}` interpolations (`$${` is a literal `${`).
fn parse_pieces(s: &str) -> Result<Vec<Piece>, String> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut rest = s;
    while let Some(at) = rest.find('$') {
        text.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(after) = tail.strip_prefix("$${") {
            text.push_str("${");
            rest = after;
        } else if let Some(after) = tail.strip_prefix("${") {
            let end = after
                .find('}')
                .ok_or_else(|| "unterminated interpolation: missing '}'".to_string())?;
            if !text.is_empty() {
                out.push(Piece::Text(std::mem::take(&mut text)));
            }
            out.push(parse_expr(after[..end].trim())?);
            rest = &after[end + 1..];
        } else {
            text.push('$');
            rest = &tail[1..];
        }
    }
    text.push_str(rest);
    if !text.is_empty() {
        out.push(Piece::Text(text));
    }
    Ok(out)
}

fn parse_expr(e: &str) -> Result<Piece, String> {
    Ok(match e {
        "name.full" => Piece::NameFull,
        "name.prefix" => Piece::NamePrefix,
        "name.suffix" => Piece::NameSuffix,
        "agent.segment" => Piece::AgentSegment,
        _ => {
            let arg = e
                .strip_prefix("match(")
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(|| format!("unknown variable accessed: {e}"))?;
            let n = arg
                .trim()
                .parse::<usize>()
                .map_err(|_| format!("match() takes an integer, got {:?}", arg.trim()))?;
            Piece::Match(n)
        }
    })
}

/// A template checked and ready to render.
pub struct Template {
    query: PreparedQuery,
    re: Option<regex::Regex>,
}

/// The strings of a `Service` part, each with its path in Consul's error
/// words (`Service.Tags[0]`).
fn service_strings(svc: &mut ServiceQuery, mut f: impl FnMut(&str, &mut String)) {
    f(".Service", &mut svc.service);
    f(".Near", &mut svc.near);
    f(".Peer", &mut svc.peer);
    for (i, t) in svc.tags.iter_mut().enumerate() {
        f(&format!(".Tags[{i}]"), t);
    }
    for (i, t) in svc.ignore_check_ids.iter_mut().enumerate() {
        f(&format!(".IgnoreCheckIDs[{i}]"), t);
    }
    for (i, t) in svc.failover.datacenters.iter_mut().enumerate() {
        f(&format!(".Failover.Datacenters[{i}]"), t);
    }
    for (i, t) in svc.failover.targets.iter_mut().enumerate() {
        f(
            &format!(".Failover.Targets[{i}].Datacenter"),
            &mut t.datacenter,
        );
        f(&format!(".Failover.Targets[{i}].Peer"), &mut t.peer);
    }
    for (k, v) in svc.node_meta.iter_mut() {
        f(&format!(".NodeMeta[{k}]"), v);
    }
    for (k, v) in svc.service_meta.iter_mut() {
        f(&format!(".ServiceMeta[{k}]"), v);
    }
}

impl Template {
    /// Checks a template: its type, its regexp, every string of its
    /// `Service` part, and a trial render with its own name (as Consul).
    pub fn compile(query: &PreparedQuery) -> Result<Template, String> {
        if query.template.r#type != NAME_PREFIX_MATCH {
            return Err(format!("Bad Template.Type '{}'", query.template.r#type));
        }
        let re = match query.template.regexp.as_str() {
            "" => None,
            r => Some(
                regex::RegexBuilder::new(r)
                    .size_limit(1 << 20)
                    .build()
                    .map_err(|e| format!("Bad Regexp: {e}"))?,
            ),
        };
        let mut err = None;
        service_strings(&mut query.service.clone(), |path, v| {
            if err.is_none()
                && let Err(e) = parse_pieces(v)
            {
                err = Some(format!("Bad format '{v}' in Service{path}: {e}"));
            }
        });
        if let Some(e) = err {
            return Err(e);
        }
        let t = Template {
            query: query.clone(),
            re,
        };
        t.render(&query.name, "");
        Ok(t)
    }

    /// The query for `name`: every string of `Service` interpolated.
    pub fn render(&self, name: &str, segment: &str) -> PreparedQuery {
        let mut q = self.query.clone();
        let caps: Vec<String> = match &self.re {
            Some(re) => re
                .captures(name)
                .map(|c| {
                    c.iter()
                        .map(|m| m.map_or(String::new(), |m| m.as_str().to_string()))
                        .collect()
                })
                .unwrap_or_default(),
            None => Vec::new(),
        };
        let prefix = self.query.name.as_str();
        // The name matched its prefix in any case: the suffix is what
        // follows that many characters.
        let suffix = name.get(prefix.len()..).unwrap_or("");
        service_strings(&mut q.service, |_, v| {
            // Checked at compile: a piece that fails to parse is left as is.
            let Ok(pieces) = parse_pieces(v) else { return };
            let mut out = String::new();
            for p in pieces {
                match p {
                    Piece::Text(t) => out.push_str(&t),
                    Piece::NameFull => out.push_str(name),
                    Piece::NamePrefix => out.push_str(prefix),
                    Piece::NameSuffix => out.push_str(suffix),
                    Piece::AgentSegment => out.push_str(segment),
                    Piece::Match(i) => out.push_str(caps.get(i).map_or("", String::as_str)),
                }
            }
            *v = out;
        });
        if q.template.remove_empty_tags {
            q.service.tags.retain(|t| !t.is_empty());
        }
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(name: &str, regexp: &str, service: &str, tags: &[&str]) -> PreparedQuery {
        PreparedQuery {
            name: name.into(),
            template: QueryTemplate {
                r#type: NAME_PREFIX_MATCH.into(),
                regexp: regexp.into(),
                remove_empty_tags: true,
            },
            service: ServiceQuery {
                service: service.into(),
                tags: tags.iter().map(|t| t.to_string()).collect(),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn renders_names_matches_and_drops_empty_tags() {
        let q = template(
            "geo-db-",
            r"^geo-db-(.*?)-([^\-]+?)$",
            "mysql-${match(1)}",
            &["${match(2)}", "${match(7)}", "x-${name.suffix}", "$${lit}"],
        );
        let t = Template::compile(&q).unwrap();
        let r = t.render("geo-db-customer-primary", "");
        assert_eq!(r.service.service, "mysql-customer");
        assert_eq!(
            r.service.tags,
            ["primary", "x-customer-primary", "${lit}"].map(String::from)
        );
        let p = template("", "", "${name.full}-${name.prefix}|${agent.segment}", &[]);
        let r = Template::compile(&p).unwrap().render("web", "seg");
        assert_eq!(r.service.service, "web-|seg");
    }

    #[test]
    fn bad_templates_are_refused_in_consuls_words() {
        let mut q = template("a", "(", "x", &[]);
        assert!(q.validate().unwrap_err().starts_with("Bad Regexp:"));
        q = template("a", "", "${nope}", &[]);
        assert_eq!(
            q.validate().unwrap_err(),
            "Bad format '${nope}' in Service.Service: unknown variable accessed: nope"
        );
        q = template("a", "", "${match(1)", &[]);
        assert!(q.validate().unwrap_err().contains("unterminated"));
        q.template.r#type = "regexp".into();
        assert_eq!(q.validate().unwrap_err(), "Bad Template.Type 'regexp'");
    }

    #[test]
    fn definitions_are_checked() {
        let mut q = PreparedQuery {
            name: "q".into(),
            ..Default::default()
        };
        assert_eq!(
            q.validate().unwrap_err(),
            "Must provide a Service name to query"
        );
        q.service.service = "web".into();
        q.service.failover.nearest_n = -1;
        assert_eq!(q.validate().unwrap_err(), "Bad NearestN '-1', must be >= 0");
        q.service.failover.nearest_n = 1;
        q.service.failover.targets = vec![QueryTarget {
            datacenter: "dc2".into(),
            ..Default::default()
        }];
        assert!(q.validate().unwrap_err().starts_with("Targets cannot"));
        q.service.failover = QueryFailover::default();
        q.dns.ttl = "soon".into();
        assert!(q.validate().unwrap_err().starts_with("Bad DNS TTL 'soon'"));
        q.dns.ttl = "10s".into();
        assert_eq!(q.dns.ttl_secs(), Some(10));
        q.validate().unwrap();
        q.name.clear();
        assert_eq!(q.validate().unwrap_err(), "Must be bound to a session");
        q.session = "s".into();
        q.token = REDACTED.into();
        assert!(q.validate().unwrap_err().contains("redacted token"));
    }
}
