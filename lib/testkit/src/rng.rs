//! One small seeded generator for tests, so that test files stop hand-rolling their own.
//!
//! [`Rng::new`] is SplitMix64 (Steele, Lea & Flood 2014): any seed, including 0, gives a
//! good stream. [`Rng::xorshift64star`] runs Marsaglia/Vigna's xorshift64* from a raw state
//! instead, for the tests whose data were generated with it and must stay bit-identical
//! (their fixed expectations — "both paths ran", counts — depend on the exact values).
//! No dependency; not for anything but tests.
//!
//! ```
//! use gradkit_testkit::rng::Rng;
//! let mut a = Rng::new(7);
//! let mut b = Rng::new(7);
//! assert_eq!(a.next_u64(), b.next_u64());
//! assert!(a.below(10) < 10);
//! let u = a.unit_f64();
//! assert!((0.0..1.0).contains(&u));
//! ```

/// A deterministic 64-bit generator (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rng {
    state: u64,
    algo: Algo,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Algo {
    SplitMix64,
    XorShift64Star,
}

impl Rng {
    /// SplitMix64 seeded with `seed` (the state is the seed; the first output is the mix of
    /// `seed + 0x9E37_79B9_7F4A_7C15`).
    pub fn new(seed: u64) -> Self {
        Rng {
            state: seed,
            algo: Algo::SplitMix64,
        }
    }

    /// xorshift64* (shifts 12, 25, 27; multiplier 0x2545_F491_4F6C_DD1D) from the raw,
    /// non-zero `state`.
    ///
    /// # Panics
    /// If `state == 0` (xorshift's fixed point).
    pub fn xorshift64star(state: u64) -> Self {
        assert_ne!(state, 0, "xorshift64* needs a non-zero state");
        Rng {
            state,
            algo: Algo::XorShift64Star,
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        match self.algo {
            Algo::SplitMix64 => {
                self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = self.state;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^ (z >> 31)
            }
            Algo::XorShift64Star => {
                let mut x = self.state;
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                self.state = x;
                x.wrapping_mul(0x2545_F491_4F6C_DD1D)
            }
        }
    }

    /// `next_u64() % n` (a slight modulo bias, irrelevant for tests).
    ///
    /// # Panics
    /// If `n == 0`.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        self.next_u64() % n
    }

    /// A uniform integer in `lo..=hi`.
    pub fn range_i64(&mut self, lo: i64, hi: i64) -> i64 {
        assert!(lo <= hi, "range_i64({lo}, {hi})");
        let span = (hi as i128 - lo as i128 + 1) as u128;
        (lo as i128 + (self.next_u64() as u128 % span) as i128) as i64
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn unit_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, 1) with 24 random bits (exact in f32).
    pub fn unit_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Standard normal by Box–Muller (two uniforms per value).
    pub fn normal_f64(&mut self) -> f64 {
        let (u, v) = (self.unit_f64().max(1e-300), self.unit_f64());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }

    /// A dyadic value `q/den` with `q` uniform in `-max..=max`: sums of a few are exact in
    /// f32 whatever the order, so references can compare bit for bit.
    pub fn dyadic(&mut self, max: i64, den: u32) -> f32 {
        assert!(den.is_power_of_two(), "dyadic denominator {den}");
        self.range_i64(-max, max) as f32 / den as f32
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn splitmix64_matches_the_published_stream() {
        // SplitMix64 with seed 1234567 (the reference values of Vigna's splitmix64.c).
        let mut r = Rng::new(1234567);
        let want = [
            6457827717110365317u64,
            3203168211198807973,
            9817491932198370423,
            4593380528125082431,
            16408922859458223821,
        ];
        for w in want {
            assert_eq!(r.next_u64(), w);
        }
    }

    #[test]
    fn xorshift64star_matches_a_hand_step() {
        let mut r = Rng::xorshift64star(1);
        // x = 1: x ^= x>>12 → 1; x ^= x<<25 → 1 + 2^25; x ^= x>>27 → unchanged (< 2^27).
        let x: u64 = 1 + (1 << 25);
        assert_eq!(r.next_u64(), x.wrapping_mul(0x2545_F491_4F6C_DD1D));
    }

    #[test]
    fn helpers_stay_in_range() {
        let mut r = Rng::new(0);
        for _ in 0..1000 {
            assert!(r.below(7) < 7);
            let v = r.range_i64(-3, 3);
            assert!((-3..=3).contains(&v));
            assert!((0.0..1.0).contains(&r.unit_f64()));
            assert!((0.0..1.0).contains(&r.unit_f32()));
            assert!(r.normal_f64().is_finite());
            let d = r.dyadic(16, 4);
            assert!(d.abs() <= 4.0 && (d * 4.0).fract() == 0.0);
        }
    }
}
