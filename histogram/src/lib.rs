//! cairn's own stand-in for the `base2histogram` crate: the part of its API
//! openraft uses for its runtime statistics (`Histogram`, `PercentileStats`,
//! `AsciiChart`), put in its place by `[patch.crates-io]`.
//!
//! Why: openraft creates its statistics histograms when a node starts, and
//! base2histogram 0.2.3 builds the lookup tables of all 16 bucket widths at
//! the first one (25.6 MiB, width 16 alone 13 MB), although openraft only
//! uses width 3. That was over half of an idle server's memory. Here a
//! value's bucket is computed from its bits, so nothing is built up front:
//! a histogram is its 252 counters (2 KiB), nothing shared.
//!
//! Buckets are base-2 logarithmic with 4 linear sub-buckets per power of
//! two (values 0..4 exact), so an estimate is within 12.5% of the value,
//! the precision openraft's default width had.

use std::fmt;
use std::marker::PhantomData;

/// Sub-buckets per power of two (2 bits after the most significant one).
const SUB_BITS: u32 = 2;
const SUB: usize = 1 << SUB_BITS;
/// Values below `SUB` have a bucket each; then `SUB` per bit position
/// `SUB_BITS..=63`.
pub const BUCKETS: usize = SUB + (64 - SUB_BITS as usize) * SUB;

/// The bucket a value is counted in.
fn bucket_of(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let msb = 63 - v.leading_zeros();
    let sub = ((v >> (msb - SUB_BITS)) as usize) & (SUB - 1);
    SUB + (msb - SUB_BITS) as usize * SUB + sub
}

/// The smallest and largest value of a bucket.
fn bucket_range(b: usize) -> (u64, u64) {
    if b < SUB {
        return (b as u64, b as u64);
    }
    let shift = ((b - SUB) / SUB) as u32;
    let sub = ((b - SUB) % SUB) as u64;
    let low = (SUB as u64 | sub) << shift;
    (low, low + ((1u64 << shift) - 1))
}

/// A histogram of `u64` values for percentile estimates. `T` is the
/// per-period metadata of the original's sliding windows; openraft keeps
/// one period, so only the type parameter remains.
pub struct Histogram<T = ()> {
    counts: Vec<u64>,
    total: u64,
    _meta: PhantomData<fn() -> T>,
}

impl<T> Histogram<T> {
    pub fn new() -> Self {
        Histogram {
            counts: vec![0; BUCKETS],
            total: 0,
            _meta: PhantomData,
        }
    }

    pub fn record(&mut self, value: u64) {
        self.record_n(value, 1);
    }

    pub fn record_n(&mut self, value: u64, n: u64) {
        self.counts[bucket_of(value)] += n;
        self.total += n;
    }

    /// How many values were recorded.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The value below which a fraction `p` (0.0..=1.0) of the recorded
    /// values lie: the middle of the bucket holding that rank (0 if empty).
    pub fn percentile(&self, p: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((p.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (low, high) = bucket_range(b);
                return low + (high - low) / 2;
            }
        }
        bucket_range(BUCKETS - 1).1
    }

    pub fn percentile_stats(&self) -> PercentileStats {
        PercentileStats {
            samples: self.total,
            p0_1: self.percentile(0.001),
            p1: self.percentile(0.01),
            p5: self.percentile(0.05),
            p10: self.percentile(0.10),
            p50: self.percentile(0.50),
            p90: self.percentile(0.90),
            p99: self.percentile(0.99),
            p99_9: self.percentile(0.999),
        }
    }

    /// The non-empty buckets as (smallest value, largest value, count).
    fn nonempty(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .map(|(b, &c)| {
                let (low, high) = bucket_range(b);
                (low, high, c)
            })
    }
}

// By hand rather than derived: derives would demand `T: Clone` etc. of the
// metadata type, which is never stored.
impl<T> Default for Histogram<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for Histogram<T> {
    fn clone(&self) -> Self {
        Histogram {
            counts: self.counts.clone(),
            total: self.total,
            _meta: PhantomData,
        }
    }
}

impl<T> PartialEq for Histogram<T> {
    fn eq(&self, other: &Self) -> bool {
        self.total == other.total && self.counts == other.counts
    }
}

impl<T> Eq for Histogram<T> {}

impl<T> fmt::Debug for Histogram<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let buckets: Vec<_> = self.nonempty().collect();
        f.debug_struct("Histogram")
            .field("total", &self.total)
            .field("buckets", &buckets)
            .finish()
    }
}

/// Percentile estimates of one histogram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PercentileStats {
    pub samples: u64,
    pub p0_1: u64,
    pub p1: u64,
    pub p5: u64,
    pub p10: u64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p99_9: u64,
}

impl fmt::Display for PercentileStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[samples: {}, P0.1: {}, P1: {}, P5: {}, P10: {}, P50: {}, P90: {}, P99: {}, P99.9: {}]",
            self.samples,
            self.p0_1,
            self.p1,
            self.p5,
            self.p10,
            self.p50,
            self.p90,
            self.p99,
            self.p99_9
        )
    }
}

/// Named histograms drawn as text bars, one line per non-empty bucket.
pub struct AsciiChart<T = ()> {
    series: Vec<(String, Histogram<T>)>,
}

impl<T> AsciiChart<T> {
    pub fn new() -> Self {
        AsciiChart { series: Vec::new() }
    }

    pub fn add(mut self, name: &str, hist: Histogram<T>) -> Self {
        self.series.push((name.to_string(), hist));
        self
    }

    /// Every series' buckets with a bar scaled to the series' largest.
    pub fn detailed(&self) -> impl fmt::Display + '_ {
        Detailed(self)
    }
}

impl<T> Default for AsciiChart<T> {
    fn default() -> Self {
        Self::new()
    }
}

struct Detailed<'a, T>(&'a AsciiChart<T>);

const BAR: usize = 40;

impl<T> fmt::Display for Detailed<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, hist) in &self.0.series {
            writeln!(f, "{name} (n={})", hist.total())?;
            let max = hist.nonempty().map(|(_, _, c)| c).max().unwrap_or(0);
            for (low, high, c) in hist.nonempty() {
                let len = ((c as u128 * BAR as u128).div_ceil(max as u128)) as usize;
                writeln!(f, "  {low:>20}..={high:<20} {c:>10} {}", "#".repeat(len))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_falls_in_its_bucket() {
        let mut edges = vec![0u64, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 1000, 4095, 4096];
        edges.extend([u64::MAX / 2, u64::MAX - 1, u64::MAX]);
        edges.extend((0..64).flat_map(|s| [(1u64 << s) - 1, 1 << s, (1 << s) + 1]));
        for v in edges {
            let b = bucket_of(v);
            assert!(b < BUCKETS, "{v} -> bucket {b}");
            let (low, high) = bucket_range(b);
            assert!(
                low <= v && v <= high,
                "{v} not in bucket {b} = {low}..={high}"
            );
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn buckets_tile_the_range_in_order() {
        let mut next = 0u64;
        for b in 0..BUCKETS {
            let (low, high) = bucket_range(b);
            assert_eq!(
                low,
                next,
                "bucket {b} starts where {} ended",
                b.saturating_sub(1)
            );
            assert!(high >= low);
            // A bucket is at most a quarter of its low end wide, so its
            // middle is within 12.5% of any value in it.
            assert!((high - low) <= low / 4, "bucket {b}: {low}..={high}");
            next = high.wrapping_add(1);
        }
        assert_eq!(next, 0, "the last bucket ends at u64::MAX");
    }

    #[test]
    fn percentiles_estimate_within_an_eighth() {
        let mut h = Histogram::<()>::new();
        for v in 1..=1000u64 {
            h.record(v);
        }
        h.record_n(0, 0);
        assert_eq!(h.total(), 1000);
        let s = h.percentile_stats();
        assert_eq!(s.samples, 1000);
        for (got, want) in [
            (s.p1, 10.0),
            (s.p10, 100.0),
            (s.p50, 500.0),
            (s.p90, 900.0),
            (s.p99, 990.0),
        ] {
            let err = (got as f64 - want).abs() / want;
            assert!(err <= 0.125, "estimate {got} for {want}");
        }
        assert!(s.p0_1 <= s.p1 && s.p1 <= s.p5 && s.p5 <= s.p10 && s.p10 <= s.p50);
        assert!(s.p50 <= s.p90 && s.p90 <= s.p99 && s.p99 <= s.p99_9);
    }

    #[test]
    fn small_values_are_exact_and_empty_is_zero() {
        let mut h = Histogram::<()>::default();
        assert_eq!(h.percentile_stats(), PercentileStats::default());
        h.record_n(3, 10);
        h.record(1);
        assert_eq!(h.percentile(0.05), 1);
        assert_eq!(h.percentile(0.5), 3);
        let c = h.clone();
        assert_eq!(c, h);
        h.record(1);
        assert_ne!(c, h);
    }

    #[test]
    fn chart_lists_each_series_buckets() {
        let mut h = Histogram::<()>::new();
        h.record_n(100, 4);
        h.record(7);
        let text = AsciiChart::new().add("apply", h).detailed().to_string();
        assert!(text.starts_with("apply (n=5)\n"), "{text}");
        assert_eq!(text.lines().count(), 3, "{text}");
        assert!(text.contains(&"#".repeat(BAR)), "{text}");
    }
}
