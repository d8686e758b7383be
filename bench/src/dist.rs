//! Seeded generators for message sizes and keys. Deterministic for a seed,
//! so two runs of one workload send the same sequence of sizes and keys.

use crate::workload::{KeyDist, SizeDist};

/// SplitMix64: tiny, fast, good enough for load generation.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0); the modulo bias is negligible for our n.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        self.next_u64() % n
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Zipf over `0..n` with exponent `s`, by inverse CDF over a precomputed
/// table (n is at most a few million keys, so the table is cheap).
#[derive(Debug, Clone)]
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    pub fn new(n: u64, s: f64) -> Zipf {
        assert!(n > 0 && s > 0.0);
        let mut cdf = Vec::with_capacity(n as usize);
        let mut sum = 0.0;
        for k in 1..=n {
            sum += 1.0 / (k as f64).powf(s);
            cdf.push(sum);
        }
        for v in &mut cdf {
            *v /= sum;
        }
        Zipf { cdf }
    }

    pub fn sample(&self, rng: &mut Rng) -> u64 {
        let u = rng.unit();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1) as u64
    }
}

/// Draws message sizes.
#[derive(Debug, Clone)]
pub struct SizeGen {
    dist: SizeDist,
    weight_total: u64,
}

impl SizeGen {
    pub fn new(dist: SizeDist) -> SizeGen {
        let weight_total = match &dist {
            SizeDist::Weighted { choices } => choices.iter().map(|c| u64::from(c.1)).sum(),
            _ => 0,
        };
        SizeGen { dist, weight_total }
    }

    pub fn next(&self, rng: &mut Rng) -> usize {
        match &self.dist {
            SizeDist::Fixed { bytes } => *bytes,
            SizeDist::Uniform { min, max } => min + rng.below((max - min) as u64 + 1) as usize,
            SizeDist::Weighted { choices } => {
                let mut pick = rng.below(self.weight_total);
                for (size, weight) in choices {
                    if pick < u64::from(*weight) {
                        return *size;
                    }
                    pick -= u64::from(*weight);
                }
                choices.last().map(|c| c.0).unwrap_or(0)
            }
        }
    }
}

/// Draws message keys (`k<n>`), or none.
#[derive(Debug, Clone)]
pub enum KeyGen {
    None,
    Uniform(u64),
    Zipf(Zipf),
}

impl KeyGen {
    pub fn new(dist: KeyDist, keys: u64, exponent: f64) -> KeyGen {
        match dist {
            KeyDist::None => KeyGen::None,
            KeyDist::Uniform => KeyGen::Uniform(keys),
            KeyDist::Zipf => KeyGen::Zipf(Zipf::new(keys, exponent)),
        }
    }

    /// The key index, if keys are on.
    pub fn next(&self, rng: &mut Rng) -> Option<u64> {
        match self {
            KeyGen::None => None,
            KeyGen::Uniform(n) => Some(rng.below(*n)),
            KeyGen::Zipf(z) => Some(z.sample(rng)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_is_skewed_and_in_range() {
        let z = Zipf::new(1000, 1.0);
        let mut rng = Rng::new(7);
        let mut counts = vec![0u32; 1000];
        for _ in 0..100_000 {
            counts[z.sample(&mut rng) as usize] += 1;
        }
        // With s = 1 and n = 1000, P(0) = 1/H(1000) ~ 0.134 and P(9) ~ 0.0134.
        assert!((12_000..15_000).contains(&counts[0]), "{}", counts[0]);
        assert!(counts[0] > 5 * counts[9]);
    }

    #[test]
    fn sizes_stay_in_bounds_and_weights_hold() {
        let mut rng = Rng::new(3);
        let u = SizeGen::new(SizeDist::Uniform { min: 10, max: 20 });
        for _ in 0..1000 {
            assert!((10..=20).contains(&u.next(&mut rng)));
        }
        let w = SizeGen::new(SizeDist::Weighted { choices: vec![(1, 9), (2, 1)] });
        let ones = (0..10_000).filter(|_| w.next(&mut rng) == 1).count();
        assert!((8_700..9_300).contains(&ones), "{ones}");
    }
}
