//! Random draws that the simulation can seed.
//!
//! A server draws from the operating system's randomness as usual. The
//! deterministic simulation runs every simulated host on one thread and
//! calls [`seed`] at the start of a run: from then on the draws on that
//! thread (openraft's election timeouts, a blocking query's jitter, the
//! order of shuffled answers) are a pure function of the seed and of the
//! (seeded) order in which tasks run, so a seed replays the same run.
//! Keys and identifiers that must be unguessable never come from here.

use std::cell::Cell;

use rand::SeedableRng;
use rand::rngs::StdRng;

thread_local! {
    /// The next seed on this thread; `None` until the simulation seeds it
    /// (or the first draw takes one from the operating system).
    static NEXT_SEED: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Makes the draws on this thread follow `seed`.
pub fn seed(seed: u64) {
    NEXT_SEED.with(|s| s.set(Some(seed)));
}

/// A fresh, well-mixed seed (SplitMix64) for one use.
pub fn next_seed() -> u64 {
    NEXT_SEED.with(|s| {
        let seed = s.get().unwrap_or_else(rand::random);
        let z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        s.set(Some(z));
        let z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    })
}

/// A generator for one use (a jitter, a shuffle), from [`next_seed`].
pub fn rng() -> StdRng {
    StdRng::seed_from_u64(next_seed())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn a_seeded_thread_draws_the_same_numbers_again() {
        let draw = || -> Vec<u64> { (0..4).map(|_| rng().gen_range(0..1_000_000)).collect() };
        seed(7);
        let a = draw();
        seed(7);
        assert_eq!(draw(), a);
        seed(8);
        assert_ne!(draw(), a);
    }
}
