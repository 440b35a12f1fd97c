//! bexpr's validation pass: every match of an expression checked against
//! a [`Schema`] (selector, operator, and a value that converts to the
//! field's type) before the filter runs.

use super::ast::{Expr, MatchExpr};
use super::coerce;
use super::error::FilterError;
use super::schema::Schema;

/// Checks every match in `expr` against `schema` (bexpr's validation pass).
pub(crate) fn validate(expr: &Expr, schema: &Schema) -> Result<(), FilterError> {
    match expr {
        Expr::And(items) | Expr::Or(items) => items.iter().try_for_each(|e| validate(e, schema)),
        Expr::Not(inner) => validate(inner, schema),
        Expr::Match(m) => validate_match(m, schema),
    }
}

fn validate_match(m: &MatchExpr, schema: &Schema) -> Result<(), FilterError> {
    let node = schema.resolve(&m.selector.path)?;
    if !node.supports(m.op) {
        return Err(FilterError::InvalidOperator {
            op: m.op,
            selector: m.selector.dotted(),
        });
    }
    let Some(raw) = &m.value else {
        return Ok(());
    };
    // The value must convert to the type it will be compared with: the
    // field itself, or the element type for `in` on a list.
    let target = match node {
        Schema::List(elem) => *elem,
        Schema::Map(_) => &Schema::String,
        other => other,
    };
    coerce::check(raw, target).map_err(|reason| FilterError::Coerce {
        value: raw.clone(),
        selector: m.selector.dotted(),
        reason,
    })
}
