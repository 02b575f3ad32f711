//! A seeded, portable random number generator (SplitMix64).
//!
//! Written here rather than taken from a crate so that the same seed gives the
//! same stream on every platform and every future build: the simulator's
//! digests are pinned to it.

/// SplitMix64: tiny, fast, and good enough for workload generation.
#[derive(Clone, Debug)]
pub struct SimRng {
    state: u64,
}

impl SimRng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> SimRng {
        SimRng { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi] (inclusive).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        debug_assert!(lo <= hi);
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Exponentially distributed with the given mean.
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }

    /// Picks from `(weight, value)` pairs in proportion to the weights.
    pub fn weighted<T: Copy>(&mut self, choices: &[(u32, T)]) -> T {
        let total: u64 = choices.iter().map(|&(w, _)| u64::from(w)).sum();
        let mut x = self.next_u64() % total;
        for &(w, v) in choices {
            if x < u64::from(w) {
                return v;
            }
            x -= u64::from(w);
        }
        unreachable!("x < total")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_is_pinned() {
        // SplitMix64's published first outputs for seed 0: a change here would
        // silently change every simulation digest.
        let mut r = SimRng::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn helpers_stay_in_range() {
        let mut r = SimRng::new(7);
        for _ in 0..10_000 {
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
            assert!((3..=9).contains(&r.range(3, 9)));
            assert!(r.exp(5.0) >= 0.0);
            assert!([1, 2].contains(&r.weighted(&[(1, 1), (3, 2)])));
        }
    }
}
