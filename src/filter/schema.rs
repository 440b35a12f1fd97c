//! Schemas: the shape of a result row, used to validate selectors, operators
//! and values before a filter runs, the way Consul does.
//!
//! Consul builds go-bexpr "field configurations" by reflecting over the Go
//! struct of each endpoint's rows and rejects filters that do not fit them.
//! A [`Schema`] is our hand-written equivalent: a small tree of typed leaves,
//! structs (named fields), maps (any string key) and lists. The rules below
//! are bexpr's:
//!
//! | node              | operators                                   |
//! |-------------------|---------------------------------------------|
//! | string            | ==, !=, in, not in, matches, not matches    |
//! | int/uint/float/bool | ==, !=                                    |
//! | map               | is empty, is not empty, in, not in (keys)   |
//! | list of scalars   | in, not in, is empty, is not empty          |
//! | list of others    | is empty, is not empty                      |
//! | struct, opaque    | none                                        |
//!
//! A selector may continue through a list of structs (`Checks.Status`): the
//! list is transparent for naming, and at evaluation time the test passes
//! if any element passes.

use serde_json::Value;

use super::ast::MatchOp;
use super::error::FilterError;

/// A named struct field.
pub type Field = (&'static str, Schema);

/// The shape of a value inside a result row.
#[derive(Debug, Clone, Copy)]
pub enum Schema {
    String,
    /// Signed integer (Go `int`, `int64`, ...).
    Int,
    /// Unsigned integer (Go `uint64`, ...).
    Uint,
    Float,
    Bool,
    /// A struct with exactly these fields (matched case-sensitively).
    Struct(&'static [Field]),
    /// A map with string keys and values of the given shape.
    Map(&'static Schema),
    /// A list of the given shape.
    List(&'static Schema),
    /// Present but not filterable (Go `interface{}` values such as
    /// `Proxy.Config`): no operators, no nested selection.
    Opaque,
}

impl Schema {
    fn is_scalar(&self) -> bool {
        matches!(
            self,
            Schema::String | Schema::Int | Schema::Uint | Schema::Float | Schema::Bool
        )
    }

    /// Operators bexpr allows on a field of this shape.
    pub fn supports(&self, op: MatchOp) -> bool {
        use MatchOp::*;
        match self {
            Schema::String => matches!(op, Equal | NotEqual | In | NotIn | Matches | NotMatches),
            Schema::Int | Schema::Uint | Schema::Float | Schema::Bool => {
                matches!(op, Equal | NotEqual)
            }
            Schema::Map(_) => matches!(op, IsEmpty | IsNotEmpty | In | NotIn),
            Schema::List(elem) if elem.is_scalar() => {
                matches!(op, In | NotIn | IsEmpty | IsNotEmpty)
            }
            Schema::List(_) => matches!(op, IsEmpty | IsNotEmpty),
            Schema::Struct(_) | Schema::Opaque => false,
        }
    }

    /// The node a path element selects below this one, if any. Lists are
    /// looked through (their elements' fields are selectable directly).
    pub(crate) fn child(&self, name: &str) -> Option<&Schema> {
        match self {
            Schema::Struct(fields) => fields.iter().find(|(n, _)| *n == name).map(|(_, s)| s),
            Schema::Map(value) if !matches!(value, Schema::Opaque) => Some(value),
            Schema::List(elem) => elem.child(name),
            _ => None,
        }
    }

    /// Resolves a whole selector path, or reports the first invalid prefix.
    pub fn resolve(&self, path: &[String]) -> Result<&Schema, FilterError> {
        let mut node = self;
        for (i, name) in path.iter().enumerate() {
            node = node
                .child(name)
                .ok_or_else(|| FilterError::InvalidSelector {
                    selector: path[..=i].join("."),
                })?;
        }
        Ok(node)
    }

    /// The value Go would see for a field of this shape that is absent or
    /// null in the JSON row: zero values, empty collections.
    pub(crate) fn zero_value(&self) -> Value {
        match self {
            Schema::String => Value::String(String::new()),
            Schema::Int | Schema::Uint => Value::from(0),
            Schema::Float => Value::from(0.0),
            Schema::Bool => Value::Bool(false),
            Schema::List(_) => Value::Array(Vec::new()),
            Schema::Map(_) | Schema::Struct(_) => Value::Object(Default::default()),
            Schema::Opaque => Value::Null,
        }
    }

    /// Every valid selector path below this node with the operators it
    /// supports, in declaration order; map keys appear as `<any>`, as in the
    /// Consul docs' selector tables.
    pub fn selectors(&self) -> Vec<(String, Vec<MatchOp>)> {
        let mut out = Vec::new();
        self.collect("", &mut out);
        out
    }

    fn collect(&self, prefix: &str, out: &mut Vec<(String, Vec<MatchOp>)>) {
        use MatchOp::*;
        let join = |name: &str| {
            if prefix.is_empty() {
                name.to_string()
            } else {
                format!("{prefix}.{name}")
            }
        };
        let children: Vec<(String, &Schema)> = match self {
            Schema::Struct(fields) => fields.iter().map(|(n, s)| (join(n), s)).collect(),
            Schema::Map(value) if !matches!(value, Schema::Opaque) => vec![(join("<any>"), value)],
            Schema::List(elem) => return elem.collect(prefix, out),
            _ => Vec::new(),
        };
        for (path, node) in children {
            let ops: Vec<MatchOp> = [
                Equal, NotEqual, In, NotIn, IsEmpty, IsNotEmpty, Matches, NotMatches,
            ]
            .into_iter()
            .filter(|op| node.supports(*op))
            .collect();
            if !ops.is_empty() {
                out.push((path.clone(), ops));
            }
            node.collect(&path, out);
        }
    }
}
