//! Go `time.Duration` in JSON: parsed from Go duration strings ("5s",
//! "1m30s", "-1.5h") or integer nanoseconds, written back as Go writes them.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A signed duration in nanoseconds, as Go's `time.Duration`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration(pub i64);

const NS: u128 = 1;
const US: u128 = 1_000;
const MS: u128 = 1_000_000;
const SEC: u128 = 1_000_000_000;
const MIN: u128 = 60 * SEC;
const HOUR: u128 = 60 * MIN;

impl Duration {
    pub const fn from_secs(s: i64) -> Self {
        Duration(s * 1_000_000_000)
    }

    pub fn nanos(self) -> i64 {
        self.0
    }

    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// `is_zero` for serde's `skip_serializing_if`, which passes a reference.
    pub fn is_zero_ref(&self) -> bool {
        self.0 == 0
    }

    /// Parses a Go duration string exactly as `time.ParseDuration` accepts it.
    pub fn parse(s: &str) -> Result<Self, String> {
        let invalid = || format!("time: invalid duration \"{s}\"");
        let (neg, mut rest) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            _ => (false, s),
        };
        if rest == "0" {
            return Ok(Duration(0));
        }
        if rest.is_empty() {
            return Err(invalid());
        }
        // Accumulate in u128 nanoseconds; fractions are kept exactly by
        // scaling the fractional digits with the unit.
        let mut total: u128 = 0;
        while !rest.is_empty() {
            let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
            let int_part = &rest[..int_len];
            rest = &rest[int_len..];
            let mut frac_part = "";
            if let Some(r) = rest.strip_prefix('.') {
                let n = r.bytes().take_while(u8::is_ascii_digit).count();
                frac_part = &r[..n];
                rest = &r[n..];
            }
            if int_part.is_empty() && frac_part.is_empty() {
                return Err(invalid());
            }
            let unit_len = rest
                .char_indices()
                .find(|(_, c)| *c == '.' || c.is_ascii_digit())
                .map_or(rest.len(), |(i, _)| i);
            let unit = &rest[..unit_len];
            rest = &rest[unit_len..];
            let scale = match unit {
                "" => return Err(format!("time: missing unit in duration \"{s}\"")),
                "ns" => NS,
                "us" | "µs" | "μs" => US,
                "ms" => MS,
                "s" => SEC,
                "m" => MIN,
                "h" => HOUR,
                _ => return Err(format!("time: unknown unit \"{unit}\" in duration \"{s}\"")),
            };
            let int: u128 = if int_part.is_empty() {
                0
            } else {
                int_part.parse().map_err(|_| invalid())?
            };
            let mut v = int.checked_mul(scale).ok_or_else(invalid)?;
            // Fractional digits beyond nanosecond precision are dropped, as in Go.
            let mut place = scale;
            for d in frac_part.bytes() {
                place /= 10;
                if place == 0 {
                    break;
                }
                v += u128::from(d - b'0') * place;
            }
            total = total.checked_add(v).ok_or_else(invalid)?;
            if total > i64::MAX as u128 + u128::from(neg) {
                return Err(invalid());
            }
        }
        let v = total as i128;
        Ok(Duration(if neg { -v } else { v } as i64))
    }
}

/// Writes `v` (in units of 10^-prec) with its fraction, trailing zeros trimmed.
fn frac(out: &mut String, v: u128, prec: u32) {
    let p = 10u128.pow(prec);
    out.push_str(&(v / p).to_string());
    let f = v % p;
    if f != 0 {
        let mut digits = format!("{:0width$}", f, width = prec as usize);
        while digits.ends_with('0') {
            digits.pop();
        }
        out.push('.');
        out.push_str(&digits);
    }
}

impl fmt::Display for Duration {
    /// Formats as Go's `Duration.String()`: "0s", "1.5ms", "2m0s", "1h0m0s".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        if self.0 < 0 {
            out.push('-');
        }
        let u = u128::from(self.0.unsigned_abs());
        if u == 0 {
            return f.write_str("0s");
        }
        if u < SEC {
            if u < US {
                out.push_str(&u.to_string());
                out.push_str("ns");
            } else if u < MS {
                frac(&mut out, u, 3);
                out.push_str("µs");
            } else {
                frac(&mut out, u, 6);
                out.push_str("ms");
            }
            return f.write_str(&out);
        }
        if u >= HOUR {
            out.push_str(&(u / HOUR).to_string());
            out.push('h');
        }
        if u >= MIN {
            out.push_str(&((u / MIN) % 60).to_string());
            out.push('m');
        }
        frac(&mut out, u % MIN, 9);
        out.push('s');
        f.write_str(&out)
    }
}

impl Serialize for Duration {
    /// Zero is written as "" so that Consul's `omitempty` shape is kept once
    /// empty members are pruned.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.0 == 0 {
            s.serialize_str("")
        } else {
            s.serialize_str(&self.to_string())
        }
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(s) if s.is_empty() => Ok(Duration(0)),
            serde_json::Value::String(s) => Duration::parse(&s).map_err(D::Error::custom),
            serde_json::Value::Number(n) => n
                .as_i64()
                .or_else(|| {
                    n.as_f64()
                        .filter(|f| f.fract() == 0.0 && f.abs() < 9.2e18)
                        .map(|f| f as i64)
                })
                .map(Duration)
                .ok_or_else(|| D::Error::custom(format!("invalid duration {n}"))),
            serde_json::Value::Null => Ok(Duration(0)),
            other => Err(D::Error::custom(format!(
                "invalid type: {other}, expected a duration string"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_go() {
        let cases = [
            (0, "0s"),
            (1, "1ns"),
            (1_500, "1.5µs"),
            (1_500_000, "1.5ms"),
            (5_000_000_000, "5s"),
            (33_000_000_000, "33s"),
            (90_000_000_000, "1m30s"),
            (120_000_000_000, "2m0s"),
            (3_600_000_000_000, "1h0m0s"),
            (3_661_500_000_000, "1h1m1.5s"),
            (-1_000_000_000, "-1s"),
        ];
        for (ns, s) in cases {
            assert_eq!(Duration(ns).to_string(), s);
        }
    }

    #[test]
    fn parses_like_go() {
        let cases = [
            ("0", 0),
            ("5s", 5_000_000_000),
            ("1m30s", 90_000_000_000),
            ("-1s", -1_000_000_000),
            ("1.5h", 5_400_000_000_000),
            ("10ms", 10_000_000),
            ("2us", 2_000),
            ("2µs", 2_000),
            (".5s", 500_000_000),
            ("1h2m3s4ms", 3_723_004_000_000),
        ];
        for (s, ns) in cases {
            assert_eq!(Duration::parse(s), Ok(Duration(ns)), "{s}");
        }
        for bad in ["", "5", "abc", "5x", "-", ".s", "1.2.3s"] {
            assert!(Duration::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn round_trips() {
        for ns in [
            1,
            999,
            1_000_001,
            59_999_999_999,
            86_400_000_000_000,
            i64::MAX,
        ] {
            let d = Duration(ns);
            assert_eq!(Duration::parse(&d.to_string()), Ok(d));
        }
    }
}
