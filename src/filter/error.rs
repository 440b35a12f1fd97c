//! Errors produced while parsing, validating or evaluating a filter.
//!
//! Messages follow go-bexpr's wording where Consul users are likely to have
//! seen it (`Selector "Foo" is not valid`, `Invalid match operator ...`), so
//! the HTTP layer can return `to_string()` verbatim as a 400 body.

use super::ast::MatchOp;

/// Everything that can go wrong with a filter expression.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    /// The expression text is malformed. `line`/`column` are 1-based (column
    /// counts characters), `offset` is the byte offset into the input; the
    /// rendering mimics the `line:col (offset): message` form of bexpr's
    /// parser so the position is easy to spot in a 400 body.
    #[error("{line}:{column} ({offset}): {message}")]
    Parse {
        line: usize,
        column: usize,
        offset: usize,
        message: String,
    },

    /// A `matches` / `not matches` operand is not a valid regular expression.
    #[error("Failed to compile regular expression {pattern:?}: {reason}")]
    Regex { pattern: String, reason: String },

    /// More `matches` clauses than one request may compile.
    #[error("Filter has more than {max} \"matches\" expressions")]
    TooManyRegexes { max: usize },

    /// The selector does not name a field of the row type (schema validation).
    #[error("Selector {selector:?} is not valid")]
    InvalidSelector { selector: String },

    /// The operator cannot be applied to the selected field's type.
    #[error("Invalid match operator \"{op}\" for selector {selector:?}")]
    InvalidOperator { op: MatchOp, selector: String },

    /// The literal value cannot be converted to the selected field's type.
    #[error("Failed to coerce value {value:?} for selector {selector:?}: {reason}")]
    Coerce {
        value: String,
        selector: String,
        reason: String,
    },

    /// The data did not have the shape the expression needs (only possible
    /// when evaluating without a schema, or against rows that do not match it).
    #[error("{0}")]
    Evaluate(String),
}

impl FilterError {
    /// Builds a [`FilterError::Parse`] for a byte offset into `src`.
    pub(crate) fn parse_at(src: &str, offset: usize, message: impl Into<String>) -> Self {
        // Clamp so a bad offset can never panic while slicing; walk back to a
        // char boundary for the same reason.
        let mut offset = offset.min(src.len());
        while !src.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &src[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = before[line_start..].chars().count() + 1;
        FilterError::Parse {
            line,
            column,
            offset,
            message: message.into(),
        }
    }
}
