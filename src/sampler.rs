//! Shuffled index orders that start in O(1): a keyed pseudo-random
//! permutation of `0..n` whose `i`-th element is computed on demand.
//!
//! A data loader shuffles its dataset's indices every epoch. Materialising
//! and shuffling `n` indices costs O(n) before the first batch, and O(n)
//! memory in every process; [`Permutation::get`] instead maps a position to
//! an index with a small Feistel network keyed by `(seed, epoch)`, walking
//! the cycle until the value falls inside `0..n` (the network permutes
//! `0..4^k` for the smallest `4^k >= n`, so on average fewer than four
//! rounds of walking are needed). Resuming at position `p` is O(1), and
//! every rank computes its own shard without any shared state.
//!
//! No crate offers a seekable permutation of an arbitrary range (the
//! shuffles of `rand` materialise the sequence), hence this small one. Its
//! keys come from [`crate::seed`], as every seed of ferrofeed does.

use crate::seed::{epoch_key, mix, SplitMix64, Stream};

/// A bijection of `0..n` determined by a 64-bit key.
///
/// # Examples
///
/// ```
/// use ferrofeed::sampler::Permutation;
/// let p = Permutation::new(10, 42);
/// let mut seen: Vec<u64> = (0..10).map(|i| p.get(i)).collect();
/// seen.sort_unstable();
/// assert_eq!(seen, (0..10).collect::<Vec<_>>());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permutation {
    n: u64,
    half_bits: u32,
    keys: [u64; ROUNDS],
}

const ROUNDS: usize = 6;

impl Permutation {
    /// The permutation of `0..n` for `key` (combine a seed and an epoch
    /// with [`Permutation::key`]).
    pub fn new(n: u64, key: u64) -> Self {
        // Smallest even bit width 2h with 2^(2h) >= n (h >= 1).
        let bits = 64 - n.saturating_sub(1).leading_zeros();
        let half_bits = bits.div_ceil(2).max(1);
        let mut rng = SplitMix64::new(key);
        let keys = std::array::from_fn(|_| rng.next_u64());
        Self { n, half_bits, keys }
    }

    /// A key for `(seed, epoch)`: [`crate::seed::epoch_key`].
    pub fn key(seed: u64, epoch: u64) -> u64 {
        epoch_key(seed, epoch)
    }

    /// Length of the permuted range.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    fn round(&self, x: u64, key: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let mut z = x ^ key;
        z = z.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        z ^= z >> 29;
        z = z.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
        (z ^ (z >> 32)) & mask
    }

    fn feistel(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut l, mut r) = (x >> self.half_bits, x & mask);
        for &k in &self.keys {
            let next = l ^ self.round(r, k);
            l = r;
            r = next;
        }
        (l << self.half_bits) | r
    }

    /// The element at position `i` (`i < len()`); `i` itself when `i` is out
    /// of range (a caller bug, but never a panic or a hang).
    pub fn get(&self, i: u64) -> u64 {
        if i >= self.n {
            return i;
        }
        // Cycle walking: the Feistel network permutes 0..2^(2h) and n > that
        // range's quarter, so this terminates after a few steps on average.
        let mut x = self.feistel(i);
        while x >= self.n {
            x = self.feistel(x);
        }
        x
    }
}

/// The seed of one sample's random augmentations: a fixed mix of the
/// loader's `seed`, the `epoch` and the sample's dataset `index`.
///
/// Worker processes seed Python's `random`, `NumPy`'s global generator and
/// torch's with it before each sample, so a random augmentation draws the
/// same numbers for a sample whichever worker (or how many) runs it, and in
/// a resumed run. It is [`crate::seed::mix`] with [`Stream::Sample`]: the
/// values are part of ferrofeed's reproducibility promise and pinned by
/// tests.
///
/// # Examples
///
/// ```
/// use ferrofeed::sampler::sample_seed;
/// assert_eq!(sample_seed(0, 0, 0), sample_seed(0, 0, 0));
/// assert_ne!(sample_seed(0, 0, 1), sample_seed(0, 1, 0));
/// ```
pub fn sample_seed(seed: u64, epoch: u64, index: u64) -> u64 {
    mix(seed, epoch, index, Stream::Sample)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_seeds_are_pinned() {
        // Golden values: changing them changes every user's augmentations.
        assert_eq!(sample_seed(0, 0, 0), GOLDEN[0]);
        assert_eq!(sample_seed(0, 0, 1), GOLDEN[1]);
        assert_eq!(sample_seed(42, 3, 1_000_000), GOLDEN[2]);
        assert_eq!(sample_seed(u64::MAX, u64::MAX, u64::MAX), GOLDEN[3]);
    }

    const GOLDEN: [u64; 4] = [
        16_894_410_173_589_626_229,
        394_551_072_080_122_867,
        7_443_091_746_617_491_268,
        12_625_010_139_469_418_024,
    ];

    #[test]
    fn sample_seeds_differ_by_seed_epoch_and_index() {
        let mut seen = std::collections::HashSet::new();
        for seed in 0..4 {
            for epoch in 0..4 {
                for index in 0..256 {
                    assert!(seen.insert(sample_seed(seed, epoch, index)));
                }
            }
        }
    }

    #[test]
    fn is_a_permutation_for_many_sizes_and_keys() {
        for n in [0u64, 1, 2, 3, 5, 16, 17, 100, 1000, 4097] {
            for key in [0u64, 1, 0xDEAD_BEEF] {
                let p = Permutation::new(n, key);
                let mut seen = vec![false; usize::try_from(n).unwrap()];
                for i in 0..n {
                    let v = p.get(i);
                    assert!(v < n, "n={n} key={key}: {v}");
                    let slot = &mut seen[usize::try_from(v).unwrap()];
                    assert!(!*slot, "n={n}: {v} twice");
                    *slot = true;
                }
            }
        }
    }

    #[test]
    fn keys_and_epochs_give_different_orders() {
        let n = 1000;
        let a: Vec<u64> = (0..n)
            .map(|i| Permutation::new(n, Permutation::key(7, 0)).get(i))
            .collect();
        let b: Vec<u64> = (0..n)
            .map(|i| Permutation::new(n, Permutation::key(7, 1)).get(i))
            .collect();
        let again: Vec<u64> = (0..n)
            .map(|i| Permutation::new(n, Permutation::key(7, 0)).get(i))
            .collect();
        assert_eq!(a, again);
        assert_ne!(a, b);
        // Not the identity, nor close to it.
        let fixed = a
            .iter()
            .enumerate()
            .filter(|(i, v)| *i as u64 == **v)
            .count();
        assert!(fixed < 20, "{fixed} fixed points");
    }

    #[test]
    fn out_of_range_is_identity() {
        assert_eq!(Permutation::new(10, 1).get(12), 12);
        assert_eq!(Permutation::new(u64::MAX, 3).len(), u64::MAX);
    }
}
