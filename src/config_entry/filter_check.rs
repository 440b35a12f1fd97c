//! A syntax-only check of bexpr filter expressions for resolver subsets.
//!
//! TODO(filter): replace with `crate::filter::Filter::parse` once the filter
//! module lands on main; this only has to refuse what bexpr refuses to parse.
//!
//! Grammar checked (as go-bexpr's):
//!   or    := and ("or" and)*
//!   and   := not ("and" not)*
//!   not   := "not" not | "(" or ")" | match
//!   match := selector ("==" | "!=") value
//!          | selector ["not"] ("contains" | "matches") value
//!          | selector "is" ["not"] "empty"
//!          | value ["not"] "in" selector

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Open,
    Close,
    Eq,
    Ne,
    Quoted,
    Word(String),
}

fn tokenize(s: &str) -> Result<Vec<Tok>, String> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    while let Some(&c) = chars.peek() {
        match c {
            c if c.is_whitespace() => {
                chars.next();
            }
            '(' => {
                chars.next();
                out.push(Tok::Open);
            }
            ')' => {
                chars.next();
                out.push(Tok::Close);
            }
            '=' | '!' => {
                chars.next();
                if chars.next() != Some('=') {
                    return Err(format!("unexpected {c:?}"));
                }
                out.push(if c == '=' { Tok::Eq } else { Tok::Ne });
            }
            '"' | '`' => {
                chars.next();
                let mut closed = false;
                while let Some(x) = chars.next() {
                    if x == '\\' && c == '"' {
                        chars.next();
                    } else if x == c {
                        closed = true;
                        break;
                    }
                }
                if !closed {
                    return Err("unterminated string".into());
                }
                out.push(Tok::Quoted);
            }
            _ => {
                let mut w = String::new();
                while let Some(&x) = chars.peek() {
                    if x.is_whitespace() || "()\"`=!".contains(x) {
                        break;
                    }
                    w.push(x);
                    chars.next();
                }
                out.push(Tok::Word(w));
            }
        }
    }
    Ok(out)
}

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
}

impl Parser {
    fn peek_word(&self, w: &str) -> bool {
        matches!(self.toks.get(self.pos), Some(Tok::Word(x)) if x == w)
    }

    fn eat_word(&mut self, w: &str) -> bool {
        let hit = self.peek_word(w);
        if hit {
            self.pos += 1;
        }
        hit
    }

    fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn or(&mut self) -> Result<(), String> {
        self.and()?;
        while self.eat_word("or") {
            self.and()?;
        }
        Ok(())
    }

    fn and(&mut self) -> Result<(), String> {
        self.not()?;
        while self.eat_word("and") {
            self.not()?;
        }
        Ok(())
    }

    fn not(&mut self) -> Result<(), String> {
        if self.eat_word("not") {
            return self.not();
        }
        if self.toks.get(self.pos) == Some(&Tok::Open) {
            self.pos += 1;
            self.or()?;
            return match self.next() {
                Some(Tok::Close) => Ok(()),
                _ => Err("expected \")\"".into()),
            };
        }
        self.matcher()
    }

    fn value(&mut self) -> Result<(), String> {
        match self.next() {
            Some(Tok::Quoted) => Ok(()),
            Some(Tok::Word(w)) if !is_keyword(&w) => Ok(()),
            _ => Err("expected a value".into()),
        }
    }

    fn selector(&mut self) -> Result<(), String> {
        match self.next() {
            Some(Tok::Word(w)) if is_selector(&w) => Ok(()),
            _ => Err("expected a selector".into()),
        }
    }

    fn matcher(&mut self) -> Result<(), String> {
        // "value [not] in selector" is told apart by what follows the operand.
        let after = self.toks.get(self.pos + 1);
        let value_first = matches!(after, Some(Tok::Word(w)) if w == "in")
            || (matches!(after, Some(Tok::Word(w)) if w == "not")
                && matches!(self.toks.get(self.pos + 2), Some(Tok::Word(w)) if w == "in"));
        if value_first {
            self.value()?;
            self.eat_word("not");
            self.eat_word("in");
            return self.selector();
        }
        self.selector()?;
        match self.next() {
            Some(Tok::Eq | Tok::Ne) => self.value(),
            Some(Tok::Word(w)) if w == "is" => {
                self.eat_word("not");
                if self.eat_word("empty") {
                    Ok(())
                } else {
                    Err("expected \"empty\"".into())
                }
            }
            Some(Tok::Word(w)) if w == "not" || w == "contains" || w == "matches" => {
                if w == "not" && !(self.eat_word("contains") || self.eat_word("matches")) {
                    return Err("expected \"contains\" or \"matches\"".into());
                }
                self.value()
            }
            _ => Err("expected a match operator".into()),
        }
    }
}

fn is_keyword(w: &str) -> bool {
    matches!(
        w,
        "and" | "or" | "not" | "in" | "is" | "empty" | "contains" | "matches"
    )
}

fn is_selector(w: &str) -> bool {
    w.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && !is_keyword(w)
        && w.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_./[]-".contains(c))
}

/// Ok if `expr` parses as a bexpr boolean expression.
pub(crate) fn check(expr: &str) -> Result<(), String> {
    let mut p = Parser {
        toks: tokenize(expr)?,
        pos: 0,
    };
    p.or()?;
    if p.pos < p.toks.len() {
        return Err(format!("unexpected input at token {}", p.pos + 1));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn accepts_bexpr() {
        for ok in [
            "Service.Meta.version == v1",
            "Service.Meta.version != bypass",
            r#"Service.Meta.version == "1.0""#,
            "Service.Tags contains canary and not (Node.Meta.zone == a or Checks is empty)",
            "v2 in Service.Tags",
            "v2 not in Service.Tags",
            "Service.ID not matches `^web-`",
            "Service.Meta is not empty",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn refuses_garbage() {
        for bad in [
            "random string",
            "",
            "Service.Meta.version ==",
            "(a == b",
            "a == b and",
            "a = b",
            "\"unterminated",
            "a is full",
        ] {
            assert!(check(bad).is_err(), "{bad}");
        }
    }
}
