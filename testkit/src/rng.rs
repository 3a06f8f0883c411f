//! splitmix64: a small seeded generator for the property tests, so a failing seed can be
//! replayed (every such test prints or names its seed).

pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// A number in `0..n`, for u64 ranges.
    pub fn below_u64(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }

    pub fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len())]
    }

    /// Each of `from` with probability `percent`%.
    pub fn some<T: Copy>(&mut self, from: &[T], percent: u64) -> Vec<T> {
        from.iter()
            .copied()
            .filter(|_| self.chance(percent))
            .collect()
    }
}

/// Fails unless each count a property test kept is over its floor, `(what, count, floor)`,
/// showing `all` beside: a generator that stops reaching a case must fail its test, not pass
/// over nothing.
pub fn reached(counts: &[(&str, usize, usize)], all: &impl std::fmt::Debug) {
    for (what, n, floor) in counts {
        assert!(n > floor, "only {n} {what}: {all:?}");
    }
}
