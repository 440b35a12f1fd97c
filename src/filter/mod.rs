//! The bexpr filter language used by `?filter=` and resolver subsets.
//!
//! Consul filters list endpoints with [go-bexpr] expressions such as
//!
//! ```text
//! Service.Meta.version == v1 and "canary" in Service.Tags
//! Checks.Status != passing or Node.Meta["rack id"] matches `^r1`
//! ```
//!
//! This module parses them ([`Filter::parse`]), checks selectors against the
//! row type of an endpoint ([`Filter::validate`], [`schemas`]) and evaluates
//! them against the JSON form of a row ([`Filter::matches`]). The JSON field
//! names are Consul's, so a `/v1/health/service` row is
//! `{"Node": {..}, "Service": {..}, "Checks": [..]}`.
//!
//! Typical HTTP use:
//!
//! ```
//! use cairn::filter::{Filter, schemas};
//! use serde_json::json;
//!
//! let filter = Filter::parse_for("Service.Port == 8080", &schemas::HEALTH_SERVICE).unwrap();
//! let row = json!({"Node": {"Node": "n1"}, "Service": {"Port": 8080}, "Checks": []});
//! assert!(filter.matches(&row));
//! // Unknown selectors are rejected up front, as Consul does (HTTP 400).
//! let err = Filter::parse_for("Service.Foo == 1", &schemas::HEALTH_SERVICE).unwrap_err();
//! assert_eq!(err.to_string(), r#"Selector "Service.Foo" is not valid"#);
//! ```
//!
//! Semantics follow go-bexpr as Consul uses it. The notes at the top of
//! `eval.rs` cover evaluation (a selector through a list matches if *any*
//! element matches; missing map keys; zero values), `parser.rs` the grammar
//! (precedence `not` > `and` > `or`), `schema.rs` validation.
//!
//! [go-bexpr]: https://github.com/hashicorp/go-bexpr

mod ast;
mod coerce;
mod error;
mod eval;
mod parser;
mod schema;
pub mod schemas;
mod validate;

#[cfg(test)]
mod tests;

use std::fmt;
use std::str::FromStr;

use serde_json::Value;

pub use ast::Expr;
pub use error::FilterError;
pub use schema::Schema;

/// A parsed (and optionally schema-bound) filter expression.
///
/// Cheap to clone; `Send + Sync`, so one parsed filter can be shared by the
/// tasks evaluating rows.
#[derive(Debug, Clone)]
pub struct Filter {
    source: String,
    expr: Expr,
    schema: Option<&'static Schema>,
}

impl Filter {
    /// Parses a filter expression. Syntax errors carry the position
    /// (`1:12 (11): ...`); invalid `matches` regexes are reported here too.
    /// An empty string is an error: callers treat "no filter" separately
    /// (see [`Filter::parse_optional`]).
    pub fn parse(input: &str) -> Result<Filter, FilterError> {
        Ok(Filter {
            source: input.to_string(),
            expr: parser::parse(input)?,
            schema: None,
        })
    }

    #[cfg(test)]
    /// `None` for an empty `?filter=` (Consul ignores it), else [`Filter::parse`].
    pub fn parse_optional(input: &str) -> Result<Option<Filter>, FilterError> {
        if input.is_empty() {
            Ok(None)
        } else {
            Filter::parse(input).map(Some)
        }
    }

    /// Parses, validates against `schema` and binds the schema, so that
    /// evaluation treats absent/`null` struct fields as Go zero values and
    /// compares numbers by the declared field type. This is what an HTTP
    /// handler wants: one call, every Consul-side error surfaced up front.
    pub fn parse_for(input: &str, schema: &'static Schema) -> Result<Filter, FilterError> {
        let mut filter = Filter::parse(input)?;
        filter.validate(schema)?;
        filter.schema = Some(schema);
        Ok(filter)
    }

    /// Checks every selector, operator and value against `schema`, with
    /// Consul's error messages: `Selector "Foo" is not valid`,
    /// `Invalid match operator "Matches" for selector "ServicePort"`,
    /// `Failed to coerce value "x" for selector "ServicePort": ...`.
    pub fn validate(&self, schema: &Schema) -> Result<(), FilterError> {
        validate::validate(&self.expr, schema)
    }

    /// Evaluates the filter against one row. Errors only arise when the row
    /// does not have the shape the expression needs (e.g. `Port == abc` on a
    /// number without prior validation).
    pub fn evaluate(&self, row: &Value) -> Result<bool, FilterError> {
        eval::evaluate(&self.expr, row, self.schema)
    }

    /// [`Filter::evaluate`], counting an evaluation error as "no match".
    pub fn matches(&self, row: &Value) -> bool {
        self.evaluate(row).unwrap_or(false)
    }

    #[cfg(test)]
    /// Evaluates against any serialisable row (converted to JSON first).
    pub fn evaluate_row<T: serde::Serialize + ?Sized>(&self, row: &T) -> Result<bool, FilterError> {
        let value = serde_json::to_value(row)
            .map_err(|e| FilterError::Evaluate(format!("cannot serialise row: {e}")))?;
        self.evaluate(&value)
    }

    #[cfg(test)]
    /// The expression text as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    #[cfg(test)]
    /// The parsed expression tree.
    pub fn expr(&self) -> &Expr {
        &self.expr
    }

    #[cfg(test)]
    /// The schema bound by [`Filter::parse_for`], if any.
    pub fn schema(&self) -> Option<&'static Schema> {
        self.schema
    }
}

impl FromStr for Filter {
    type Err = FilterError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Filter::parse(s)
    }
}

impl fmt::Display for Filter {
    /// The original expression text.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}
