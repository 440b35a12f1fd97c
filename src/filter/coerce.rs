//! Converting the raw text of a filter value to the type of the field it is
//! compared with.
//!
//! bexpr keeps every literal as text and converts it with Go's `strconv`
//! functions once the field type is known, so `Port == "80"`, `Port == 80`
//! and `Port == 0x50` all mean the same thing, and `Enabled == t` is a valid
//! boolean test. These helpers reproduce the `strconv` rules that matter.

use serde_json::{Number, Value};

use super::schema::Schema;

/// Go's `strconv.ParseBool`.
pub(crate) fn parse_bool(raw: &str) -> Result<bool, String> {
    match raw {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!("{raw:?} is not a boolean")),
    }
}

/// Go's `strconv.ParseInt(raw, 0, 64)` / `ParseUint` without the range
/// check: optional sign, `0x`/`0o`/`0b` or leading-`0` octal prefixes, and
/// `_` separators between digits. Returned as i128 so both the signed and
/// the unsigned 64-bit range fit.
pub(crate) fn parse_int(raw: &str) -> Result<i128, String> {
    let bad = || format!("{raw:?} is not an integer");
    let (negative, body) = match raw.as_bytes().first() {
        Some(b'-') => (true, &raw[1..]),
        Some(b'+') => (false, &raw[1..]),
        _ => (false, raw),
    };
    let lower = body.to_ascii_lowercase();
    let (radix, digits, prefixed) = if let Some(d) = lower.strip_prefix("0x") {
        (16, d, true)
    } else if let Some(d) = lower.strip_prefix("0o") {
        (8, d, true)
    } else if let Some(d) = lower.strip_prefix("0b") {
        (2, d, true)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..], true)
    } else {
        (10, lower.as_str(), false)
    };
    // Underscores may only separate digits (or follow a base prefix).
    let underscores_ok =
        !digits.ends_with('_') && !digits.contains("__") && (prefixed || !digits.starts_with('_'));
    if digits.is_empty() || !underscores_ok {
        return Err(bad());
    }
    let mut value: i128 = 0;
    for c in digits.chars().filter(|c| *c != '_') {
        let d = c.to_digit(radix).ok_or_else(bad)?;
        value = value
            .checked_mul(radix as i128)
            .and_then(|v| v.checked_add(d as i128))
            .filter(|v| *v <= u64::MAX as i128)
            .ok_or_else(|| format!("{raw:?} is out of range"))?;
    }
    Ok(if negative { -value } else { value })
}

/// `parse_int` restricted to the i64 range.
pub(crate) fn parse_i64(raw: &str) -> Result<i64, String> {
    i64::try_from(parse_int(raw)?).map_err(|_| format!("{raw:?} is out of range"))
}

/// `parse_int` restricted to the u64 range; like Go's `ParseUint` a sign is
/// not accepted.
pub(crate) fn parse_u64(raw: &str) -> Result<u64, String> {
    if raw.starts_with(['-', '+']) {
        return Err(format!("{raw:?} is not an unsigned integer"));
    }
    u64::try_from(parse_int(raw)?).map_err(|_| format!("{raw:?} is out of range"))
}

/// Go's `strconv.ParseFloat(raw, 64)` for the decimal forms people write.
pub(crate) fn parse_f64(raw: &str) -> Result<f64, String> {
    raw.parse::<f64>()
        .map_err(|_| format!("{raw:?} is not a number"))
}

/// Checks that `raw` converts to a field of shape `target` (validation).
pub(crate) fn check(raw: &str, target: &Schema) -> Result<(), String> {
    match target {
        Schema::Bool => parse_bool(raw).map(drop),
        Schema::Int => parse_i64(raw).map(drop),
        Schema::Uint => parse_u64(raw).map(drop),
        Schema::Float => parse_f64(raw).map(drop),
        _ => Ok(()),
    }
}

/// Whether the JSON scalar `actual` equals the literal `raw` converted to
/// its type. `schema` (when known) decides integer vs float; otherwise the
/// JSON number itself does. `Err` when `raw` cannot be converted, or when
/// `actual` is not a scalar (bexpr has no equality for lists and maps).
pub(crate) fn equals(raw: &str, actual: &Value, schema: Option<&Schema>) -> Result<bool, String> {
    match actual {
        Value::String(s) => Ok(s == raw),
        Value::Bool(b) => Ok(parse_bool(raw)? == *b),
        Value::Number(n) => number_equals(raw, n, schema),
        Value::Null => Ok(false),
        Value::Array(_) => Err("equality is not supported on a list".into()),
        Value::Object(_) => Err("equality is not supported on a map or struct".into()),
    }
}

fn number_equals(raw: &str, n: &Number, schema: Option<&Schema>) -> Result<bool, String> {
    let integer_field = match schema {
        Some(Schema::Int | Schema::Uint) => true,
        Some(Schema::Float) => false,
        _ => !n.is_f64(),
    };
    if integer_field {
        let want = match schema {
            Some(Schema::Uint) => parse_u64(raw)? as i128,
            Some(Schema::Int) => parse_i64(raw)? as i128,
            _ => parse_int(raw)?,
        };
        let have = n
            .as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from));
        Ok(match have {
            Some(have) => have == want,
            // An integer field serialised as a float (e.g. 5.0).
            None => n.as_f64() == Some(want as f64),
        })
    } else {
        Ok(n.as_f64() == Some(parse_f64(raw)?))
    }
}
