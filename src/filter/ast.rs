//! The syntax tree of a parsed filter expression.
//!
//! `and`/`or` are stored n-ary (a flat list of operands) rather than as
//! nested binary nodes: a filter with thousands of `and` terms then costs no
//! recursion depth when evaluated or dropped. The `Display` impls render a
//! canonical, fully parenthesised form that parses back to the same tree,
//! which the tests use to check precedence and round-tripping.

use std::fmt;

use regex::Regex;

/// A boolean expression over one result row.
#[derive(Debug, Clone)]
pub enum Expr {
    /// All operands must hold (two or more operands).
    And(Vec<Expr>),
    /// At least one operand must hold (two or more operands).
    Or(Vec<Expr>),
    /// Negation.
    Not(Box<Expr>),
    /// A single `<selector> <op> <value>` test.
    Match(MatchExpr),
}

/// A matching operator. `contains` / `not contains` are spellings of
/// [`MatchOp::In`] / [`MatchOp::NotIn`] with the operands swapped, exactly as
/// in go-bexpr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MatchOp {
    Equal,
    NotEqual,
    In,
    NotIn,
    IsEmpty,
    IsNotEmpty,
    Matches,
    NotMatches,
}

impl MatchOp {
    /// Result of the operator when the selector runs into a missing map key
    /// (or a missing/null value when no schema says what it should be).
    /// Mirrors bexpr: nothing equals, contains or matches a missing value,
    /// and a missing value is empty.
    pub fn not_present_disposition(self) -> bool {
        match self {
            MatchOp::Equal | MatchOp::In | MatchOp::IsNotEmpty | MatchOp::Matches => false,
            MatchOp::NotEqual | MatchOp::NotIn | MatchOp::IsEmpty | MatchOp::NotMatches => true,
        }
    }

    /// Whether the operator is the negation of a positive test.
    pub(crate) fn is_negated(self) -> bool {
        matches!(
            self,
            MatchOp::NotEqual | MatchOp::NotIn | MatchOp::IsNotEmpty | MatchOp::NotMatches
        )
    }
}

impl fmt::Display for MatchOp {
    /// The names bexpr and the Consul docs use ("Not Equal", "Is Empty", ...).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MatchOp::Equal => "Equal",
            MatchOp::NotEqual => "Not Equal",
            MatchOp::In => "In",
            MatchOp::NotIn => "Not In",
            MatchOp::IsEmpty => "Is Empty",
            MatchOp::IsNotEmpty => "Is Not Empty",
            MatchOp::Matches => "Matches",
            MatchOp::NotMatches => "Not Matches",
        })
    }
}

/// A dotted field path such as `Service.Meta.version` or
/// `Node.Meta["key with spaces"]`; each element is one field name or map key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Selector {
    pub path: Vec<String>,
}

impl Selector {
    /// The path joined with dots, as bexpr prints selectors in its errors
    /// and as it turns a bare-word value into its raw text.
    pub fn dotted(&self) -> String {
        self.path.join(".")
    }

    /// The first `n` path elements joined with dots.
    pub(crate) fn dotted_prefix(&self, n: usize) -> String {
        self.path[..n.min(self.path.len())].join(".")
    }
}

impl fmt::Display for Selector {
    /// Renders in a form the parser accepts back: plain identifiers are
    /// dotted, anything else (and any numeric segment after the first) is
    /// written as a quoted index.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, seg) in self.path.iter().enumerate() {
            if is_identifier(seg) {
                if i > 0 {
                    f.write_str(".")?;
                }
                f.write_str(seg)?;
            } else {
                write!(f, "[{}]", quote(seg))?;
            }
        }
        Ok(())
    }
}

/// One matching test. `value` is absent only for `is empty` /
/// `is not empty`; `regex` is present only for `matches` / `not matches`
/// (compiled once at parse time).
#[derive(Debug, Clone)]
pub struct MatchExpr {
    pub selector: Selector,
    pub op: MatchOp,
    pub value: Option<String>,
    pub(crate) regex: Option<Regex>,
}

impl fmt::Display for MatchExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = self.value.as_deref().unwrap_or_default();
        match self.op {
            MatchOp::Equal => write!(f, "{} == {}", self.selector, quote(value)),
            MatchOp::NotEqual => write!(f, "{} != {}", self.selector, quote(value)),
            MatchOp::In => write!(f, "{} in {}", quote(value), self.selector),
            MatchOp::NotIn => write!(f, "{} not in {}", quote(value), self.selector),
            MatchOp::IsEmpty => write!(f, "{} is empty", self.selector),
            MatchOp::IsNotEmpty => write!(f, "{} is not empty", self.selector),
            MatchOp::Matches => write!(f, "{} matches {}", self.selector, quote(value)),
            MatchOp::NotMatches => write!(f, "{} not matches {}", self.selector, quote(value)),
        }
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::And(items) | Expr::Or(items) => {
                let sep = if matches!(self, Expr::And(_)) {
                    " and "
                } else {
                    " or "
                };
                f.write_str("(")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(sep)?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str(")")
            }
            Expr::Not(inner) => write!(f, "(not {inner})"),
            Expr::Match(m) => write!(f, "{m}"),
        }
    }
}

/// bexpr identifiers: an ASCII letter followed by ASCII letters, digits and
/// underscores.
pub(crate) fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Quotes a string so the filter parser reads it back unchanged. Uses a
/// backtick raw string when possible (no escapes to get wrong), otherwise a
/// double-quoted string with the escapes the parser understands.
pub(crate) fn quote(s: &str) -> String {
    if !s.contains('`') && !s.contains('\r') {
        return format!("`{s}`");
    }
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
