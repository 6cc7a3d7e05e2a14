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
//!
//! These are ferrofeed's only shuffles: the epoch's ([`Permutation::key`]),
//! a sharded source's shards, windows and `bucket_by` batches
//! ([`Permutation::seeded`]), and an iterable dataset's [`ShuffleBuffer`],
//! for a stream that cannot be indexed. None goes through Python's `random`
//! or `NumPy`, whose outputs ferrofeed cannot pin; these are pinned by
//! golden-value tests here and in `tests/test_seeds.py`.

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

    /// The permutation of `0..n` that item `index` draws in `epoch` of a
    /// run seeded with `seed`, for shuffles of kind `stream` (a sharded
    /// source's window, its `bucket_by` batches): keyed by
    /// [`crate::seed::mix`].
    ///
    /// # Examples
    ///
    /// ```
    /// use ferrofeed::sampler::Permutation;
    /// use ferrofeed::seed::{mix, Stream};
    /// let p = Permutation::seeded(5, 42, 1, 3, Stream::Bucket);
    /// assert_eq!(p, Permutation::new(5, mix(42, 1, 3, Stream::Bucket)));
    /// ```
    pub fn seeded(n: u64, seed: u64, epoch: u64, index: u64, stream: Stream) -> Self {
        Self::new(n, mix(seed, epoch, index, stream))
    }

    /// The whole permutation, position by position (O(n) memory: for the
    /// small orders that are used whole, a window's batches).
    pub fn to_vec(&self) -> Vec<u64> {
        (0..self.n).map(|i| self.get(i)).collect()
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

/// A shuffle buffer (as tf.data's `shuffle`, PyTorch's `Shuffler`): the
/// shuffle of a stream that cannot be indexed (an iterable dataset's),
/// holding at most `window` items.
///
/// Until the buffer is full, each item [`push`](Self::push)ed is kept;
/// after, each one takes the place of an item drawn uniformly from the
/// buffer, which is handed out. [`drain`](Self::drain) hands out the rest in
/// a random order (a [`Permutation`] keyed by the next draw). The draws are a
/// [`SplitMix64`] seeded with `mix(seed, epoch, index, Stream::Buffer)`
/// (`index`: the worker reading the stream), so the order is a pure function
/// of `(seed, epoch, index, window)` and the stream: a replayed stream is
/// shuffled alike, and the values are pinned by tests.
///
/// # Examples
///
/// ```
/// use ferrofeed::sampler::ShuffleBuffer;
/// let mut buffer = ShuffleBuffer::new(3, 42, 0, 0);
/// let mut out: Vec<u32> = (0..10).filter_map(|i| buffer.push(i)).collect();
/// out.extend(buffer.drain());
/// let mut sorted = out.clone();
/// sorted.sort_unstable();
/// assert_eq!(sorted, (0..10).collect::<Vec<_>>());
/// ```
#[derive(Debug, Clone)]
pub struct ShuffleBuffer<T> {
    window: usize,
    items: Vec<T>,
    draws: SplitMix64,
}

impl<T> ShuffleBuffer<T> {
    /// An empty buffer of `window` items for the stream `index` reads in
    /// `epoch` of a run seeded with `seed`.
    pub fn new(window: usize, seed: u64, epoch: u64, index: u64) -> Self {
        Self {
            window,
            items: Vec::with_capacity(window.min(1 << 16)),
            draws: SplitMix64::new(mix(seed, epoch, index, Stream::Buffer)),
        }
    }

    /// Takes `item`; returns the item it replaces once the buffer is full
    /// (`item` itself with a window of 0), `None` while it fills.
    pub fn push(&mut self, item: T) -> Option<T> {
        if self.items.len() < self.window {
            self.items.push(item);
            return None;
        }
        if self.items.is_empty() {
            return Some(item);
        }
        let k = self.draws.below(self.items.len());
        Some(std::mem::replace(&mut self.items[k], item))
    }

    /// The items held, in a random order; the buffer is empty after.
    pub fn drain(&mut self) -> Vec<T> {
        let n = self.items.len();
        let order = Permutation::new(n as u64, self.draws.next_u64());
        let mut slots: Vec<Option<T>> = self.items.drain(..).map(Some).collect();
        (0..n as u64)
            .filter_map(|i| usize::try_from(order.get(i)).ok())
            .filter_map(|k| slots[k].take())
            .collect()
    }

    /// The number of items held.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether the buffer holds nothing.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
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

    // Golden values of every shuffle: changing them changes every user's
    // orders. Computed by an independent Python transcription of the Feistel
    // network, `seed::mix` and the buffer's rule (as `seed`'s goldens were).

    #[test]
    fn epoch_permutations_are_pinned() {
        let order = |n, seed, epoch| Permutation::new(n, Permutation::key(seed, epoch)).to_vec();
        assert_eq!(order(10, 0, 0), [1, 0, 4, 9, 7, 8, 5, 3, 6, 2]);
        assert_eq!(order(10, 42, 3), [1, 5, 7, 0, 3, 6, 9, 4, 2, 8]);
    }

    #[test]
    fn seeded_permutations_are_pinned() {
        let bucket = |n, seed, epoch, index| {
            Permutation::seeded(n, seed, epoch, index, Stream::Bucket).to_vec()
        };
        assert_eq!(bucket(8, 0, 0, 0), [1, 2, 5, 6, 7, 3, 4, 0]);
        assert_eq!(bucket(10, 42, 3, 5), [1, 4, 5, 3, 8, 7, 9, 6, 2, 0]);
    }

    fn buffered(n: u32, window: usize, seed: u64, epoch: u64, index: u64) -> Vec<u32> {
        let mut buffer = ShuffleBuffer::new(window, seed, epoch, index);
        let mut out: Vec<u32> = (0..n).filter_map(|i| buffer.push(i)).collect();
        out.extend(buffer.drain());
        assert!(buffer.is_empty());
        out
    }

    #[test]
    fn shuffle_buffers_are_pinned() {
        assert_eq!(
            buffered(12, 4, 0, 0, 0),
            [1, 0, 3, 4, 6, 5, 2, 8, 9, 11, 10, 7]
        );
        assert_eq!(buffered(10, 3, 42, 1, 1), [2, 3, 0, 5, 1, 7, 6, 9, 8, 4]);
        // A stream shorter than the window: only the drain's order.
        assert_eq!(buffered(3, 5, 7, 0, 0), [1, 0, 2]);
    }

    #[test]
    fn shuffle_buffers_hand_out_each_item_once() {
        for (n, window) in [(0, 4), (1, 1), (5, 0), (5, 1), (100, 7), (7, 100)] {
            let mut out = buffered(n, window, 3, 2, 1);
            out.sort_unstable();
            assert_eq!(out, (0..n).collect::<Vec<_>>(), "n={n} window={window}");
        }
        // A window of 0 does not shuffle; other seeds, epochs and workers
        // shuffle otherwise.
        assert_eq!(buffered(5, 0, 3, 2, 1), [0, 1, 2, 3, 4]);
        let base = buffered(50, 8, 1, 0, 0);
        assert_ne!(base, buffered(50, 8, 2, 0, 0));
        assert_ne!(base, buffered(50, 8, 1, 1, 0));
        assert_ne!(base, buffered(50, 8, 1, 0, 1));
        assert_eq!(base, buffered(50, 8, 1, 0, 0));
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
