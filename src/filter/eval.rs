//! Evaluating an expression against the JSON form of one result row.
//!
//! Semantics follow go-bexpr as Consul uses it (the reflection-based
//! evaluator behind `bexpr.CreateFilter(expr, nil, rowType)`):
//!
//! * A selector walks objects by key. When it reaches a **list before its
//!   last element** (`Checks.Status`), the rest of the selector is applied
//!   to every element and the test passes if **any** element passes; an
//!   empty list therefore fails every test, including `!=`.
//! * A selector whose map key is missing gives the operator's
//!   "not present" answer: `==`, `in`, `matches`, `is not empty` are false;
//!   `!=`, `not in`, `not matches`, `is empty` are true.
//! * With a schema, a struct field that is absent or `null` in the JSON acts
//!   as Go's zero value (`""`, `0`, `false`, empty list/map), because in
//!   Consul the Go struct always has the field. Without a schema, absent and
//!   `null` values get the "not present" answer.
//! * `in`/`contains` test map keys, list elements (converted to the
//!   element's type) and substrings; `is empty` tests length.

use serde_json::Value;

use super::ast::{Expr, MatchExpr, MatchOp};
use super::coerce;
use super::error::FilterError;
use super::schema::Schema;

pub(crate) fn evaluate(
    expr: &Expr, row: &Value, schema: Option<&Schema>,
) -> Result<bool, FilterError> {
    match expr {
        Expr::And(items) => {
            for item in items {
                if !evaluate(item, row, schema)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        Expr::Or(items) => {
            for item in items {
                if evaluate(item, row, schema)? {
                    return Ok(true);
                }
            }
            Ok(false)
        }
        Expr::Not(inner) => Ok(!evaluate(inner, row, schema)?),
        Expr::Match(m) => walk(m, row, schema, 0),
    }
}

/// Follows `m.selector` from `value` (already at path element `depth`).
fn walk(
    m: &MatchExpr, value: &Value, schema: Option<&Schema>, depth: usize,
) -> Result<bool, FilterError> {
    let path = &m.selector.path;
    if depth == path.len() {
        return apply(m, value, schema);
    }
    match value {
        Value::Array(items) => {
            // Implicit ANY: same depth, each element.
            let elem = match schema {
                Some(Schema::List(e)) => Some(*e),
                other => other,
            };
            for item in items {
                if walk(m, item, elem, depth)? {
                    return Ok(true);
                }
            }
            Ok(false)
        }
        Value::Object(map) => {
            let key = path[depth].as_str();
            let (child_schema, in_map) = match schema {
                Some(Schema::Struct(_)) => (schema.and_then(|s| s.child(key)), false),
                Some(Schema::Map(v)) => (Some(*v), true),
                _ => (None, true),
            };
            let mut child = map.get(key);
            if child.is_none() && !in_map {
                // Struct fields are matched case-insensitively as a fallback,
                // like Go's JSON decoding, in case a row serialises a field
                // with different casing (e.g. `address` vs `Address`).
                child = map
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(key))
                    .map(|(_, v)| v);
            }
            match (child, child_schema) {
                (Some(c), _) if !c.is_null() => walk(m, c, child_schema, depth + 1),
                (_, Some(cs)) if !in_map => walk(m, &cs.zero_value(), Some(cs), depth + 1),
                _ => Ok(m.op.not_present_disposition()),
            }
        }
        Value::Null => Ok(m.op.not_present_disposition()),
        other => Err(FilterError::Evaluate(format!(
            "Value at selector {:?} with type {} does not support nested field selection",
            m.selector.dotted_prefix(depth),
            type_name(other)
        ))),
    }
}

/// Applies the operator to the value the selector reached.
fn apply(m: &MatchExpr, value: &Value, schema: Option<&Schema>) -> Result<bool, FilterError> {
    if value.is_null() {
        // Only reachable for opaque fields; treat like a missing value.
        return Ok(m.op.not_present_disposition());
    }
    let raw = m.value.as_deref().unwrap_or_default();
    let positive = match m.op {
        MatchOp::Equal | MatchOp::NotEqual => {
            coerce::equals(raw, value, schema).map_err(|reason| coerce_error(m, reason))?
        }
        MatchOp::In | MatchOp::NotIn => contains(m, value, schema)?,
        MatchOp::IsEmpty | MatchOp::IsNotEmpty => match value {
            Value::String(s) => s.is_empty(),
            Value::Array(a) => a.is_empty(),
            Value::Object(o) => o.is_empty(),
            other => return Err(unsupported(m, other)),
        },
        MatchOp::Matches | MatchOp::NotMatches => match (value, &m.regex) {
            (Value::String(s), Some(re)) => re.is_match(s),
            (other, _) => return Err(unsupported(m, other)),
        },
    };
    Ok(positive != m.op.is_negated())
}

fn contains(m: &MatchExpr, value: &Value, schema: Option<&Schema>) -> Result<bool, FilterError> {
    let raw = m.value.as_deref().unwrap_or_default();
    match value {
        Value::Object(map) => Ok(map.contains_key(raw)),
        Value::String(s) => Ok(s.contains(raw)),
        Value::Array(items) => {
            let elem = match schema {
                Some(Schema::List(e)) => Some(*e),
                _ => None,
            };
            // An element the value cannot be converted for (e.g. "x" against
            // a number in a mixed list) simply does not match, as in bexpr.
            Ok(items
                .iter()
                .any(|item| coerce::equals(raw, item, elem).unwrap_or(false)))
        }
        Value::Null => Ok(false),
        other => Err(unsupported(m, other)),
    }
}

fn coerce_error(m: &MatchExpr, reason: String) -> FilterError {
    FilterError::Coerce {
        value: m.value.clone().unwrap_or_default(),
        selector: m.selector.dotted(),
        reason,
    }
}

fn unsupported(m: &MatchExpr, value: &Value) -> FilterError {
    FilterError::Evaluate(format!(
        "Cannot perform \"{}\" on a {} for selector {:?}",
        m.op,
        type_name(value),
        m.selector.dotted()
    ))
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "map",
    }
}
