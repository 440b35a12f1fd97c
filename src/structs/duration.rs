//! Go duration strings (`"5s"`, `"1m30s"`, `"150ms"`), as Consul's JSON
//! and query parameters use them.

use std::time::Duration;

/// Parses a Go duration; a bare number is taken as nanoseconds, as Go's
/// JSON decoding of a `time.Duration` does.
pub fn parse(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration".into());
    }
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if let Ok(n) = s.parse::<u64>() {
        return Ok(Duration::from_nanos(n));
    }
    let (neg, mut rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("time: missing unit in duration {s:?}"))?;
        if num_len == 0 {
            return Err(format!("time: invalid duration {s:?}"));
        }
        let value: f64 = rest[..num_len]
            .parse()
            .map_err(|_| format!("time: invalid duration {s:?}"))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let nanos = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            u => return Err(format!("time: unknown unit {u:?} in duration {s:?}")),
        };
        total += value * nanos;
        rest = &rest[unit_len..];
    }
    if neg && total > 0.0 {
        return Err(format!("negative duration {s:?}"));
    }
    if !total.is_finite() || total > u64::MAX as f64 {
        return Err(format!("time: invalid duration {s:?}"));
    }
    Ok(Duration::from_nanos(total as u64))
}

/// Formats as Go's `time.Duration.String()` does.
pub fn format(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}µs", trim(nanos as f64 / 1e3));
    }
    if nanos < 1_000_000_000 {
        return format!("{}ms", trim(nanos as f64 / 1e6));
    }
    let total_secs = d.as_secs();
    let (h, m) = (total_secs / 3600, (total_secs / 60) % 60);
    let secs = (nanos % 60_000_000_000) as f64 / 1e9;
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if h > 0 || m > 0 {
        out.push_str(&format!("{m}m"));
    }
    out.push_str(&format!("{}s", trim(secs)));
    out
}

fn trim(v: f64) -> String {
    let s = format!("{v:.9}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_go_forms() {
        for (text, d) in [
            ("5s", Duration::from_secs(5)),
            ("1m30s", Duration::from_secs(90)),
            ("150ms", Duration::from_millis(150)),
            ("1h0m0s", Duration::from_secs(3600)),
            ("1.5s", Duration::from_millis(1500)),
        ] {
            assert_eq!(parse(text).unwrap(), d, "{text}");
            assert_eq!(format(d), text);
        }
        assert_eq!(parse("2m").unwrap(), Duration::from_secs(120));
        assert!(parse("5").is_ok());
        assert!(parse("abc").is_err());
        assert!(parse("5x").is_err());
        assert!(parse("-5s").is_err());
    }
}
