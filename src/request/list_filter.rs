//! Read-side helpers shared by the catalog and health endpoints: the
//! `?filter` hookup, `?node-meta` and `?tag` matching, and `?passing`.
//!
//! Every list endpoint filters the same way — on the JSON form of each row,
//! after the blocking read — so the bexpr hookup lives in `RowFilter` alone.

use serde::Serialize;
use serde_json::Value;

use super::Params;
use crate::error::{Error, Result};
use crate::filter::{Filter, schemas};
use crate::structs::{Meta, Node, NodeService};

/// The row type an endpoint filters, which decides the valid selectors
/// (Consul validates them per endpoint, before running the query).
#[derive(Debug, Clone, Copy)]
pub enum Rows {
    /// `structs.Node`: `/v1/catalog/nodes`.
    Nodes,
    /// The flat `ServiceNode`: `/v1/catalog/service/:s`, `/connect/:s`, `/services`.
    ServiceNodes,
    /// `NodeService`: `/v1/catalog/node/:n`, `/node-services/:n`.
    NodeServices,
    /// `HealthCheck`: `/v1/health/node/:n`, `/checks/:s`, `/state/:state`.
    Checks,
    /// `{Node, Service, Checks}`: `/v1/health/service/:s`, `/connect/:s`.
    CheckServiceNodes,
}

/// A parsed `?filter=` expression, bound to its endpoint's row type.
pub struct RowFilter(Filter);

impl RowFilter {
    /// `None` when there is no (or an empty) `?filter`; a bad expression is
    /// a 400 naming the problem, before anything is read.
    pub fn from_params(p: &Params, rows: Rows) -> Result<Option<RowFilter>> {
        let Some(src) = p.get("filter") else {
            return Ok(None);
        };
        if src.trim().is_empty() {
            return Ok(None);
        }
        let schema = match rows {
            Rows::Nodes => &schemas::CATALOG_NODES,
            Rows::ServiceNodes => &schemas::CATALOG_SERVICE,
            Rows::NodeServices => &schemas::CATALOG_NODE_SERVICES,
            Rows::Checks => &schemas::HEALTH_CHECKS,
            Rows::CheckServiceNodes => &schemas::HEALTH_SERVICE,
        };
        Filter::parse_for(src, schema)
            .map(|f| Some(RowFilter(f)))
            .map_err(|e| {
                Error::bad(format!(
                    "Failed to create boolean expression evaluator: {e}"
                ))
            })
    }

    /// Whether one row (already in its JSON form) passes.
    pub fn matches(&self, row: &Value) -> bool {
        self.0.matches(row)
    }

    /// Keeps the rows whose JSON form passes.
    pub fn retain<T: Serialize>(&self, rows: &mut Vec<T>) {
        rows.retain(|r| {
            serde_json::to_value(r)
                .map(|v| self.matches(&v))
                .unwrap_or(false)
        });
    }
}

/// Applies an optional filter to a list of rows.
pub fn apply_filter<T: Serialize>(f: &Option<RowFilter>, rows: &mut Vec<T>) {
    if let Some(f) = f {
        f.retain(rows);
    }
}

/// `?node-meta=key:value` (repeatable): every pair must be on the node.
pub fn node_meta_filters(p: &Params) -> Vec<(String, String)> {
    p.all("node-meta")
        .into_iter()
        .filter(|v| !v.is_empty())
        .map(|v| match v.split_once(':') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (v.to_string(), String::new()),
        })
        .collect()
}

pub fn meta_matches(meta: &Meta, want: &[(String, String)]) -> bool {
    want.iter()
        .all(|(k, v)| meta.get(k).is_some_and(|have| have == v))
}

pub fn node_matches(node: &Node, want: &[(String, String)]) -> bool {
    meta_matches(&node.meta, want)
}

/// `?tag=` (repeatable): the service must carry every tag. Consul compares
/// tags case-insensitively here.
pub fn tags_match(svc: &NodeService, want: &[&str]) -> bool {
    want.iter()
        .all(|w| svc.tags.iter().any(|t| t.eq_ignore_ascii_case(w)))
}

/// `?passing`, `?passing=true|false` (a flag without a value means true).
pub fn passing_flag(p: &Params) -> Result<bool> {
    match p.get("passing") {
        None => Ok(false),
        Some("") => Ok(true),
        Some(v) => parse_bool(v).ok_or_else(|| Error::bad("Invalid value for ?passing")),
    }
}

/// Go's `strconv.ParseBool`, which Consul uses for query flags.
pub fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_meta_pairs() {
        let p = Params::parse(Some(
            "node-meta=rack:r1&node-meta=env:prod%3Ax&node-meta=bare",
        ));
        assert_eq!(
            node_meta_filters(&p),
            vec![
                ("rack".to_string(), "r1".to_string()),
                ("env".to_string(), "prod:x".to_string()),
                ("bare".to_string(), String::new()),
            ]
        );
    }

    #[test]
    fn tags_all_must_match() {
        let svc = NodeService {
            tags: vec!["Primary".into(), "v1".into()],
            ..Default::default()
        };
        assert!(tags_match(&svc, &[]));
        assert!(tags_match(&svc, &["primary", "v1"]));
        assert!(!tags_match(&svc, &["primary", "v2"]));
    }

    #[test]
    fn passing_values() {
        assert!(!passing_flag(&Params::parse(None)).unwrap());
        assert!(passing_flag(&Params::parse(Some("passing"))).unwrap());
        assert!(passing_flag(&Params::parse(Some("passing=true"))).unwrap());
        assert!(!passing_flag(&Params::parse(Some("passing=0"))).unwrap());
        assert!(passing_flag(&Params::parse(Some("passing=maybe"))).is_err());
    }
}
