//! Lexer and recursive-descent parser for the bexpr filter grammar.
//!
//! The accepted language follows go-bexpr's PEG grammar:
//!
//! ```text
//! or     := and ( "or" and )*
//! and    := unary ( "and" unary )*
//! unary  := "not" unary | "(" or ")" | match
//! match  := selector ( "==" | "!=" | "contains" | "not contains"
//!                    | "matches" | "not matches" ) value
//!         | selector "is" [ "not" ] "empty"
//!         | value ( "in" | "not in" ) selector
//! value  := selector | number | string
//! ```
//!
//! so precedence is `not` > `and` > `or`. Word operators must be separated
//! from their neighbours by whitespace (bexpr writes them as `_ "and" _`);
//! `==` and `!=` need none. A bare-word value is a selector whose dotted text
//! is the value (`Status == passing`, `Meta.version == v1.2.3`).
//!
//! Deliberate difference: bexpr cannot express a `"` inside a double-quoted
//! string (its grammar ends the literal at the first `"`), we accept `\"`.

use regex::RegexBuilder;

use super::ast::{Expr, MatchExpr, MatchOp, Selector};
use super::error::FilterError;

/// Nesting limit for parentheses and `not`, so hostile input cannot exhaust
/// the stack in the recursive parser or evaluator.
const MAX_DEPTH: usize = 100;

/// The most `matches` / `not matches` clauses one filter may hold, and what
/// each regex may cost compiled (its program, and its lazy DFA's cache):
/// a filter is parsed on every request, by anonymous callers too, so its
/// regexes must stay cheap to build and small to hold (at most about
/// `MAX_REGEXES × (REGEX_SIZE + REGEX_DFA_SIZE)`, 20 MiB, for one request).
pub(crate) const MAX_REGEXES: usize = 16;
pub(crate) const REGEX_SIZE: usize = 1 << 20;
const REGEX_DFA_SIZE: usize = 256 << 10;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    LParen,
    RParen,
    Eq,
    Ne,
    /// A selector; `simple` means a single plain identifier, which is how the
    /// word operators (`and`, `in`, `empty`, ...) arrive from the lexer.
    Selector {
        path: Vec<String>,
        simple: bool,
    },
    Number(String),
    Str(String),
    Eof,
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    /// Byte offset of the first character.
    start: usize,
    /// Whether whitespace (or the start of input) precedes the token.
    ws_before: bool,
}

impl Token {
    /// The token is the plain word `w`.
    fn is_word(&self, w: &str) -> bool {
        matches!(&self.tok, Tok::Selector { path, simple: true } if path[0] == w)
    }

    /// Human description for error messages.
    fn describe(&self) -> String {
        match &self.tok {
            Tok::LParen => "\"(\"".into(),
            Tok::RParen => "\")\"".into(),
            Tok::Eq => "\"==\"".into(),
            Tok::Ne => "\"!=\"".into(),
            Tok::Selector { path, .. } => format!("{:?}", path.join(".")),
            Tok::Number(n) => format!("number {n}"),
            Tok::Str(s) => format!("string {s:?}"),
            Tok::Eof => "end of expression".into(),
        }
    }
}

fn is_ws(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

struct Lexer<'a> {
    src: &'a str,
    pos: usize,
}

impl<'a> Lexer<'a> {
    fn peek(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn peek_at(&self, n: usize) -> Option<char> {
        self.src[self.pos..].chars().nth(n)
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    fn err(&self, at: usize, msg: impl Into<String>) -> FilterError {
        FilterError::parse_at(self.src, at, msg)
    }

    fn tokens(mut self) -> Result<Vec<Token>, FilterError> {
        let mut out = Vec::new();
        loop {
            let before = self.pos;
            while self.peek().is_some_and(is_ws) {
                self.pos += 1;
            }
            let ws_before = self.pos > before || self.pos == 0;
            let start = self.pos;
            let Some(c) = self.peek() else {
                out.push(Token {
                    tok: Tok::Eof,
                    start,
                    ws_before,
                });
                return Ok(out);
            };
            let tok = match c {
                '(' => {
                    self.pos += 1;
                    Tok::LParen
                }
                ')' => {
                    self.pos += 1;
                    Tok::RParen
                }
                '=' if self.peek_at(1) == Some('=') => {
                    self.pos += 2;
                    Tok::Eq
                }
                '!' if self.peek_at(1) == Some('=') => {
                    self.pos += 2;
                    Tok::Ne
                }
                '"' | '`' => Tok::Str(self.string()?),
                '-' | '0'..='9' => Tok::Number(self.number()?),
                c if c.is_ascii_alphabetic() => self.selector()?,
                '=' => return Err(self.err(start, "unexpected \"=\", did you mean \"==\"?")),
                c => return Err(self.err(start, format!("unexpected character {c:?}"))),
            };
            out.push(Token {
                tok,
                start,
                ws_before,
            });
        }
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)?` which must be followed by
    /// whitespace, `)` or the end of input (bexpr's `AfterNumbers`).
    fn number(&mut self) -> Result<String, FilterError> {
        let start = self.pos;
        if self.peek() == Some('-') {
            self.pos += 1;
        }
        match self.peek() {
            Some('0') => self.pos += 1,
            Some('1'..='9') => {
                while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                    self.pos += 1;
                }
            }
            _ => return Err(self.err(start, "unexpected character '-'")),
        }
        if self.peek() == Some('.') && self.peek_at(1).is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
            while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                self.pos += 1;
            }
        }
        match self.peek() {
            None | Some(')') => {}
            Some(c) if is_ws(c) => {}
            Some(_) => {
                return Err(self.err(
                    start,
                    "Invalid number literal (quote values such as IP addresses or versions)",
                ));
            }
        }
        Ok(self.src[start..self.pos].to_string())
    }

    /// `Identifier ( "." Identifier | "." [0-9]+ | "[" string "]" )*`
    fn selector(&mut self) -> Result<Tok, FilterError> {
        let mut path = vec![self.identifier()];
        let mut simple = true;
        loop {
            match self.peek() {
                Some('.') if self.peek_at(1).is_some_and(|c| c.is_ascii_alphabetic()) => {
                    self.pos += 1;
                    path.push(self.identifier());
                }
                Some('.') if self.peek_at(1).is_some_and(|c| c.is_ascii_digit()) => {
                    self.pos += 1;
                    let start = self.pos;
                    while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                        self.pos += 1;
                    }
                    path.push(self.src[start..self.pos].to_string());
                }
                Some('[') => {
                    let open = self.pos;
                    self.pos += 1;
                    self.skip_ws();
                    if !matches!(self.peek(), Some('"' | '`')) {
                        return Err(self.err(open, "Invalid index: expected a quoted map key"));
                    }
                    path.push(self.string()?);
                    self.skip_ws();
                    if self.peek() != Some(']') {
                        return Err(self.err(open, "Unclosed index expression"));
                    }
                    self.pos += 1;
                }
                _ => break,
            }
            simple = false;
        }
        Ok(Tok::Selector { path, simple })
    }

    fn identifier(&mut self) -> String {
        let start = self.pos;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            self.pos += 1;
        }
        self.src[start..self.pos].to_string()
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(is_ws) {
            self.pos += 1;
        }
    }

    /// A double-quoted string with Go escapes, or a backtick raw string
    /// (no escapes; carriage returns dropped, as Go's `strconv.Unquote` does).
    fn string(&mut self) -> Result<String, FilterError> {
        let start = self.pos;
        let quote = self.bump().unwrap_or('"');
        let mut out = String::new();
        if quote == '`' {
            loop {
                match self.bump() {
                    None => return Err(self.err(start, "Unterminated string literal")),
                    Some('`') => return Ok(out),
                    Some('\r') => {}
                    Some(c) => out.push(c),
                }
            }
        }
        loop {
            let at = self.pos;
            match self.bump() {
                None => return Err(self.err(start, "Unterminated string literal")),
                Some('"') => return Ok(out),
                Some('\n') => {
                    return Err(
                        self.err(at, "newline in string literal (use \\n or a `raw` string)")
                    );
                }
                Some('\\') => out.push(self.escape(at)?),
                Some(c) => out.push(c),
            }
        }
    }

    /// One escape sequence after a backslash, as Go interprets them inside
    /// double quotes. Escapes that would produce invalid UTF-8 (`\xff`) are
    /// rejected because values are Rust strings.
    fn escape(&mut self, at: usize) -> Result<char, FilterError> {
        let bad = |lx: &Self, what: &str| {
            lx.err(
                at,
                format!("invalid escape sequence in string literal: {what}"),
            )
        };
        let c = self
            .bump()
            .ok_or_else(|| self.err(at, "Unterminated string literal"))?;
        let simple = match c {
            'a' => Some('\u{7}'),
            'b' => Some('\u{8}'),
            'f' => Some('\u{c}'),
            'n' => Some('\n'),
            'r' => Some('\r'),
            't' => Some('\t'),
            'v' => Some('\u{b}'),
            '\\' => Some('\\'),
            '"' => Some('"'),
            _ => None,
        };
        if let Some(ch) = simple {
            return Ok(ch);
        }
        let (radix, len) = match c {
            'x' => (16, 2),
            'u' => (16, 4),
            'U' => (16, 8),
            '0'..='7' => (8, 2),
            other => return Err(bad(self, &format!("\\{other}"))),
        };
        let mut digits = String::new();
        if radix == 8 {
            digits.push(c);
        }
        for _ in 0..len {
            match self.bump() {
                Some(d) if d.is_digit(radix) => digits.push(d),
                _ => return Err(bad(self, &format!("\\{c}{digits}"))),
            }
        }
        let code = u32::from_str_radix(&digits, radix).map_err(|_| bad(self, &digits))?;
        // \x and octal escapes are single bytes in Go; only ASCII ones map
        // onto a char without producing invalid UTF-8.
        if matches!(c, 'x' | '0'..='7') && code > 0x7f {
            return Err(bad(
                self,
                &format!("byte {code:#x} is not valid UTF-8 on its own"),
            ));
        }
        char::from_u32(code)
            .ok_or_else(|| bad(self, &format!("{code:#x} is not a Unicode scalar value")))
    }
}

/// Parses `src` into an expression tree.
pub(crate) fn parse(src: &str) -> Result<Expr, FilterError> {
    let toks = Lexer { src, pos: 0 }.tokens()?;
    let mut p = Parser {
        src,
        toks,
        pos: 0,
        depth: 0,
        regexes: 0,
    };
    if p.peek().tok == Tok::Eof {
        return Err(p.err_here("empty filter expression"));
    }
    let expr = p.or()?;
    match &p.peek().tok {
        Tok::Eof => Ok(expr),
        Tok::RParen => Err(p.err_here("unmatched \")\"")),
        _ => Err(p.err_here(format!(
            "unexpected {}, expected \"and\", \"or\" or end of expression",
            p.peek().describe()
        ))),
    }
}

struct Parser<'a> {
    src: &'a str,
    toks: Vec<Token>,
    pos: usize,
    depth: usize,
    /// The regexes compiled so far (`MAX_REGEXES`).
    regexes: usize,
}

impl Parser<'_> {
    fn peek(&self) -> &Token {
        // The lexer always ends the vector with Eof and we never advance
        // past it, so the index is in bounds; `min` keeps that certain.
        &self.toks[self.pos.min(self.toks.len() - 1)]
    }

    fn peek2(&self) -> &Token {
        &self.toks[(self.pos + 1).min(self.toks.len() - 1)]
    }

    fn advance(&mut self) -> Token {
        let t = self.peek().clone();
        if t.tok != Tok::Eof {
            self.pos += 1;
        }
        t
    }

    fn err_at(&self, offset: usize, msg: impl Into<String>) -> FilterError {
        FilterError::parse_at(self.src, offset, msg)
    }

    fn err_here(&self, msg: impl Into<String>) -> FilterError {
        self.err_at(self.peek().start, msg)
    }

    /// Consumes the word `w` if it is next, checking bexpr's whitespace rule:
    /// whitespace before the word and, except after the final `empty` of
    /// `is empty`, before whatever follows it.
    fn eat_word(&mut self, w: &str) -> Result<bool, FilterError> {
        if !self.peek().is_word(w) {
            return Ok(false);
        }
        if !self.peek().ws_before {
            return Err(self.err_here(format!("expected whitespace before \"{w}\"")));
        }
        self.advance();
        if w != "empty" && !self.peek().ws_before && self.peek().tok != Tok::Eof {
            return Err(self.err_here(format!("expected whitespace after \"{w}\"")));
        }
        Ok(true)
    }

    fn enter(&mut self) -> Result<(), FilterError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.err_here(format!(
                "expression nested too deeply (more than {MAX_DEPTH} levels)"
            )));
        }
        Ok(())
    }

    fn or(&mut self) -> Result<Expr, FilterError> {
        let mut items = vec![self.and()?];
        while self.eat_word("or")? {
            items.push(self.and()?);
        }
        Ok(if items.len() == 1 {
            items.remove(0)
        } else {
            Expr::Or(items)
        })
    }

    fn and(&mut self) -> Result<Expr, FilterError> {
        let mut items = vec![self.unary()?];
        while self.eat_word("and")? {
            items.push(self.unary()?);
        }
        Ok(if items.len() == 1 {
            items.remove(0)
        } else {
            Expr::And(items)
        })
    }

    fn unary(&mut self) -> Result<Expr, FilterError> {
        if !self.peek().is_word("not") {
            return self.primary();
        }
        // `not` is normally the negation operator, but bexpr's PEG backtracks
        // and also accepts it as a selector or bare-word value (`not == x`,
        // `not in Tags`). Try the operator reading first, fall back to the
        // match reading, and report whichever error got further.
        let saved = (self.pos, self.depth);
        let as_operator = (|| {
            self.advance();
            if !self.peek().ws_before {
                return Err(self.err_here("expected whitespace after \"not\""));
            }
            self.enter()?;
            let inner = self.unary()?;
            self.depth -= 1;
            // `not not x` is just `x`, as in bexpr.
            Ok(match inner {
                Expr::Not(e) => *e,
                e => Expr::Not(Box::new(e)),
            })
        })();
        match as_operator {
            Ok(e) => Ok(e),
            Err(op_err) => {
                let op_pos = self.pos;
                (self.pos, self.depth) = saved;
                match self.primary() {
                    Ok(e) => Ok(e),
                    Err(match_err) if self.pos > op_pos => Err(match_err),
                    Err(_) => Err(op_err),
                }
            }
        }
    }

    fn primary(&mut self) -> Result<Expr, FilterError> {
        if self.peek().tok != Tok::LParen {
            return self.matcher();
        }
        let open = self.advance();
        self.enter()?;
        let inner = self.or()?;
        self.depth -= 1;
        if self.peek().tok != Tok::RParen {
            return Err(self.err_here(format!(
                "Unmatched parentheses: expected \")\" to close the \"(\" at offset {}, found {}",
                open.start,
                self.peek().describe()
            )));
        }
        self.advance();
        Ok(inner)
    }

    fn matcher(&mut self) -> Result<Expr, FilterError> {
        let first = self.advance();
        match first.tok.clone() {
            Tok::Selector { path, .. } => self.after_selector(Selector { path }),
            Tok::Number(raw) | Tok::Str(raw) => self.after_value(raw),
            Tok::Eof => Err(self.err_at(
                first.start,
                "unexpected end of expression, expected a selector, value or \"(\"",
            )),
            _ => Err(self.err_at(
                first.start,
                format!(
                    "unexpected {}, expected a selector, value or \"(\"",
                    first.describe()
                ),
            )),
        }
    }

    /// After a leading selector: `== v`, `!= v`, `contains v`, `matches v`
    /// (and their `not` forms), `is [not] empty`, or `[not] in sel` with the
    /// selector's dotted text acting as the value.
    fn after_selector(&mut self, sel: Selector) -> Result<Expr, FilterError> {
        match self.peek().tok {
            Tok::Eq => {
                self.advance();
                let v = self.value()?;
                return self.build(sel, MatchOp::Equal, Some(v));
            }
            Tok::Ne => {
                self.advance();
                let v = self.value()?;
                return self.build(sel, MatchOp::NotEqual, Some(v));
            }
            _ => {}
        }
        if self.eat_word("is")? {
            let negated = self.eat_word("not")?;
            if !self.eat_word("empty")? {
                return Err(self.err_here(format!(
                    "expected \"empty\" after \"is{}\"",
                    if negated { " not" } else { "" }
                )));
            }
            let op = if negated {
                MatchOp::IsNotEmpty
            } else {
                MatchOp::IsEmpty
            };
            return self.build(sel, op, None);
        }
        let negated = if self.peek().is_word("not")
            && ["in", "contains", "matches"]
                .iter()
                .any(|w| self.peek2().is_word(w))
        {
            self.eat_word("not")?
        } else {
            false
        };
        let op = if self.eat_word("contains")? {
            Some(if negated { MatchOp::NotIn } else { MatchOp::In })
        } else if self.eat_word("matches")? {
            Some(if negated {
                MatchOp::NotMatches
            } else {
                MatchOp::Matches
            })
        } else {
            None
        };
        if let Some(op) = op {
            let v = self.value()?;
            return self.build(sel, op, Some(v));
        }
        if self.eat_word("in")? {
            // `foo in Tags`: the leading bare word was the value.
            let target = self.selector()?;
            let op = if negated { MatchOp::NotIn } else { MatchOp::In };
            return self.build(target, op, Some(sel.dotted()));
        }
        Err(self.err_here(format!(
            "unexpected {} after selector {:?}, expected one of ==, !=, is empty, is not empty, \
             contains, not contains, matches, not matches, in, not in",
            self.peek().describe(),
            sel.dotted()
        )))
    }

    /// After a leading number or string: only `[not] in <selector>` fits.
    fn after_value(&mut self, raw: String) -> Result<Expr, FilterError> {
        let negated = self.peek().is_word("not") && self.peek2().is_word("in");
        if negated {
            self.eat_word("not")?;
        }
        if !self.eat_word("in")? {
            return Err(self.err_here(format!(
                "unexpected {} after value, expected \"in\" or \"not in\" \
                 (a value on the left must be followed by \"in <selector>\")",
                self.peek().describe()
            )));
        }
        let target = self.selector()?;
        let op = if negated { MatchOp::NotIn } else { MatchOp::In };
        self.build(target, op, Some(raw))
    }

    fn selector(&mut self) -> Result<Selector, FilterError> {
        match self.peek().tok.clone() {
            Tok::Selector { path, .. } => {
                self.advance();
                Ok(Selector { path })
            }
            _ => Err(self.err_here(format!(
                "Invalid selector: expected a selector, found {}",
                self.peek().describe()
            ))),
        }
    }

    /// A value: a bare-word selector (its dotted text), a number (its
    /// literal text) or a string.
    fn value(&mut self) -> Result<String, FilterError> {
        match self.peek().tok.clone() {
            Tok::Selector { path, .. } => {
                self.advance();
                Ok(path.join("."))
            }
            Tok::Number(raw) | Tok::Str(raw) => {
                self.advance();
                Ok(raw)
            }
            _ => Err(self.err_here(format!(
                "expected a value, found {}",
                self.peek().describe()
            ))),
        }
    }

    fn build(
        &mut self, selector: Selector, op: MatchOp, value: Option<String>,
    ) -> Result<Expr, FilterError> {
        let regex = match (op, &value) {
            (MatchOp::Matches | MatchOp::NotMatches, Some(pattern)) => {
                self.regexes += 1;
                if self.regexes > MAX_REGEXES {
                    return Err(FilterError::TooManyRegexes { max: MAX_REGEXES });
                }
                let regex = RegexBuilder::new(pattern)
                    .size_limit(REGEX_SIZE)
                    .dfa_size_limit(REGEX_DFA_SIZE)
                    .build()
                    .map_err(|e| FilterError::Regex {
                        pattern: pattern.clone(),
                        reason: e.to_string(),
                    })?;
                Some(regex)
            }
            _ => None,
        };
        Ok(Expr::Match(MatchExpr {
            selector,
            op,
            value,
            regex,
        }))
    }
}
