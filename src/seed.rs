//! Seeds: the one mixing function behind every random draw of ferrofeed.
//!
//! Shuffles ([`crate::sampler::Permutation`] and
//! [`crate::sampler::ShuffleBuffer`]: every shuffle of ferrofeed, the
//! epoch's, a sharded source's windows and `bucket_by` batches, an iterable
//! dataset's buffer), random crops ([`crate::image::Crop::RandomResized`],
//! drawn by the batch engine and the image ops, all keyed by [`crop_seed`])
//! and the per-sample seeds that worker processes give Python's
//! `random`, `NumPy` and torch ([`crate::sampler::sample_seed`]) all derive
//! their randomness here, from `(seed, epoch, index, stream)`:
//!
//! - [`finalize`] is the `SplitMix64` output function (Steele, Lea and
//!   Flood, "Fast splittable pseudorandom number generators", 2014; the
//!   variant of `java.util.SplittableRandom` and of Vigna's `splitmix64.c`):
//!   a bijection of `u64` whose every output bit depends on every input bit.
//! - [`epoch_key`] folds a seed and an epoch into one key (it keys the
//!   shuffle of that epoch).
//! - [`mix`] folds that key with a [`Stream`] tag, then with an index: the
//!   seed of one sample's draws of one kind. Streams keep the draws of one
//!   kind independent of the others' (a sample's crop does not follow from
//!   its worker seed).
//! - [`SplitMix64`] turns one such seed into a sequence of draws.
//! - [`hash_bytes`] turns a name (a file path) into an index, for draws
//!   keyed by a file rather than by a position.
//! - [`crop_seed`] is the one rule of an image's random crop and flip.
//!
//! The values are part of ferrofeed's reproducibility promise (the same
//! seed gives the same shuffles and crops in every release, on every
//! platform), so they are computed here with fixed constants rather than
//! by a hasher whose output may change between Rust releases (std's
//! `DefaultHasher` says it may), and pinned by golden-value tests, in Rust
//! here and in Python (`tests/test_workers.py`, `tests/test_seeds.py`). Changing any of them is a
//! breaking change. The function is small enough to spell out; a crate
//! would add a dependency whose output we would have to pin all the same.
//!
//! # Examples
//!
//! ```
//! use ferrofeed::seed::{mix, SplitMix64, Stream};
//!
//! let crop_seed = mix(42, 3, 7, Stream::Crop);
//! assert_eq!(crop_seed, mix(42, 3, 7, Stream::Crop));
//! assert_ne!(crop_seed, mix(42, 3, 7, Stream::Sample));
//! let mut rng = SplitMix64::new(crop_seed);
//! let x = rng.uniform(0.0, 1.0);
//! assert!((0.0..1.0).contains(&x));
//! ```

/// `SplitMix64`'s increment (the golden ratio, `2^64 / phi`, made odd).
pub const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The odd multiplier that spreads the epoch before it meets the seed.
const EPOCH_MULTIPLIER: u64 = 0xD6E8_FEB8_6659_FD93;

/// `SplitMix64`'s output function ("mix13" of Stafford's variants): a
/// bijection of `u64` with full avalanche.
///
/// # Examples
///
/// ```
/// assert_eq!(ferrofeed::seed::finalize(0), 0);
/// assert_ne!(ferrofeed::seed::finalize(1), 1);
/// ```
pub const fn finalize(z: u64) -> u64 {
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One `SplitMix64` step from `state`: advance by [`GAMMA`], then
/// [`finalize`].
const fn step(state: u64) -> u64 {
    finalize(state.wrapping_add(GAMMA))
}

/// The key of `(seed, epoch)`: the first stage of [`mix`], and the key of
/// that epoch's shuffle ([`crate::sampler::Permutation::key`]).
///
/// # Examples
///
/// ```
/// use ferrofeed::seed::epoch_key;
/// assert_ne!(epoch_key(1, 0), epoch_key(1, 1));
/// ```
pub const fn epoch_key(seed: u64, epoch: u64) -> u64 {
    step(seed ^ epoch.wrapping_mul(EPOCH_MULTIPLIER))
}

/// What a seed is for. Each stream has a fixed 64-bit tag (see
/// [`Stream::tag`]); the tags are part of the pinned values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stream {
    /// The seed that worker processes give Python's `random`, `NumPy` and
    /// torch before a sample ([`crate::sampler::sample_seed`]).
    Sample,
    /// The draws of one image's random resized crop.
    Crop,
    /// Whether one image is mirrored by a random horizontal flip (drawn
    /// from the image's seed, the one its crop draws from).
    Flip,
    /// The order of a sharded source's shards in an epoch
    /// ([`crate::plan::sharded`]).
    Shards,
    /// The shuffle of one window of a sharded source's samples
    /// ([`crate::plan::sharded`]).
    Window,
    /// The order of one window's batches remade by a key (a sharded
    /// source's `bucket_by`), index = the window's first batch
    /// ([`crate::sampler::Permutation::seeded`]).
    Bucket,
    /// The draws of an iterable dataset's shuffle buffer, index = the
    /// worker reading the stream ([`crate::sampler::ShuffleBuffer`]).
    Buffer,
    /// The phases of a mixture's interleave in one world of an epoch
    /// (index = the segment of its elastic history, then the source;
    /// [`crate::plan::mix`]).
    Mix,
    /// The seed of one pass over one source of a mixture (epoch = the pass,
    /// index = the source; [`crate::plan::mix`]): the seed its own plan is
    /// shuffled with.
    Source,
}

impl Stream {
    /// Every stream's name, as [`Stream::from_name`] reads them.
    pub const NAMES: [&'static str; 9] = [
        "sample", "crop", "flip", "shards", "window", "bucket", "buffer", "mix", "source",
    ];

    /// The stream's tag, mixed into the key.
    pub const fn tag(self) -> u64 {
        match self {
            Stream::Sample => 0x5EED_5A3D_1E5E_ED00,
            Stream::Crop => 0xC409_5EED_0000_0001,
            Stream::Flip => 0xF11B_5EED_0000_0002,
            Stream::Shards => 0x5AA2_D5EE_D000_0003,
            Stream::Window => 0x3140_D0E5_EED0_0004,
            Stream::Bucket => 0xB0C4_E75E_ED00_0005,
            Stream::Buffer => 0xB0FF_E25E_ED00_0006,
            Stream::Mix => 0x3170_5EED_0000_0007,
            Stream::Source => 0x5025_CE5E_ED00_0008,
        }
    }

    /// The stream named `name` (its variant's name in lower case, as
    /// [`Stream::NAMES`] lists them), for bindings.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "sample" => Some(Stream::Sample),
            "crop" => Some(Stream::Crop),
            "flip" => Some(Stream::Flip),
            "shards" => Some(Stream::Shards),
            "window" => Some(Stream::Window),
            "bucket" => Some(Stream::Bucket),
            "buffer" => Some(Stream::Buffer),
            "mix" => Some(Stream::Mix),
            "source" => Some(Stream::Source),
            _ => None,
        }
    }
}

/// The seed of item `index`'s draws of kind `stream`, in `epoch` of a run
/// seeded with `seed`:
///
/// ```text
/// k = splitmix(seed ^ epoch * 0xD6E8FEB86659FD93)    // epoch_key
/// s = splitmix(k ^ stream.tag())
/// mix = splitmix(s ^ index * 0x9E3779B97F4A7C15)
/// ```
///
/// where `splitmix(x) = finalize(x + 0x9E3779B97F4A7C15)` (wrapping
/// arithmetic throughout).
///
/// # Examples
///
/// ```
/// use ferrofeed::seed::{mix, Stream};
/// // Pinned forever (see the module's documentation).
/// assert_eq!(mix(0, 0, 0, Stream::Sample), 16_894_410_173_589_626_229);
/// ```
pub const fn mix(seed: u64, epoch: u64, index: u64, stream: Stream) -> u64 {
    let s = step(epoch_key(seed, epoch) ^ stream.tag());
    step(s ^ index.wrapping_mul(GAMMA))
}

/// The seed of one image's random crop and flip: the one crop-seed rule,
/// `mix(seed, epoch, index, Stream::Crop)`. Every random crop and flip of
/// ferrofeed draws from it (the flip through [`Stream::Flip`], mixed from
/// this seed: [`crate::image::Flip::Random`]); what `(seed, epoch, index)`
/// are depends only on where the image is made:
///
/// - in a `DataLoader` (the native chain, or `io.decode_image` without
///   `seed=` in a transform, on any thread or worker process, resumed or
///   not): the loader's seed, the epoch, the sample's dataset index (its id
///   in a sharded or iterable source);
/// - in a pipeline, `ops.decode_image(seed=s)`: `(s, the pipeline's epoch,
///   the item's position in the source)`, or [`hash_bytes`] of the file's
///   name for an item without a position;
/// - `io.load_images(seed=s)`: `(s, 0, the image's position in the batch)`.
///
/// (`io.decode_image(seed=s)` takes `s` itself as the image's seed.)
///
/// # Examples
///
/// ```
/// use ferrofeed::seed::{crop_seed, mix, Stream};
/// assert_eq!(crop_seed(7, 1, 3), mix(7, 1, 3, Stream::Crop));
/// ```
pub const fn crop_seed(seed: u64, epoch: u64, index: u64) -> u64 {
    mix(seed, epoch, index, Stream::Crop)
}

/// A stable 64-bit hash of `bytes` (a file's name, to key its draws by
/// name): 8-byte little-endian words absorbed one `SplitMix64` step each,
/// the length last. Not for hash tables under attack; for seeds only.
///
/// # Examples
///
/// ```
/// use ferrofeed::seed::hash_bytes;
/// assert_ne!(hash_bytes(b"a.jpg"), hash_bytes(b"b.jpg"));
/// assert_ne!(hash_bytes(b""), hash_bytes(b"\0"));
/// ```
pub fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut h = 0u64;
    for chunk in bytes.chunks(8) {
        // The last chunk is zero-padded; the length, absorbed last, tells
        // "ab" from "ab\0".
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        h = step(h ^ u64::from_le_bytes(word));
    }
    step(h ^ bytes.len() as u64)
}

/// A seed for when the user gives none: fresh entropy (std's per-process
/// random hasher keys and the time), different in every call. Not pinned
/// (it is meant to differ); every value derived from it is.
pub fn fresh_seed() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(std::time::Instant::now())
}

/// `SplitMix64` as a generator: each draw advances the state by [`GAMMA`]
/// and returns its [`finalize`]d value. Seed it with a [`mix`].
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator whose first draw is `finalize(seed + GAMMA)`.
    pub const fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GAMMA);
        finalize(self.0)
    }

    /// Uniform in `[lo, hi)`, from the draw's top 53 bits.
    #[allow(clippy::cast_precision_loss)]
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        lo + (hi - lo) * unit
    }

    /// Uniform integer in `[0, n)` (0 when `n` is 0), by multiply-shift
    /// (bias below `n / 2^64`).
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Golden values: pinned forever. A change here changes every user's
    // shuffles, crops and per-sample seeds. They were computed by an
    // independent Python transcription of the formulas in the docs (the
    // `Sample` ones predate this module: `sampler::sample_seed`'s).

    #[test]
    fn finalize_is_pinned() {
        // Vigna's splitmix64.c seeded with 0: its first outputs.
        let mut g = SplitMix64::new(0);
        assert_eq!(g.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(g.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(g.next_u64(), 0x06C4_5D18_8009_454F);
        assert_eq!(finalize(0), 0);
        assert_eq!(finalize(GAMMA), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn mix_is_pinned() {
        assert_eq!(mix(0, 0, 0, Stream::Sample), 16_894_410_173_589_626_229);
        assert_eq!(mix(0, 0, 1, Stream::Sample), 394_551_072_080_122_867);
        assert_eq!(
            mix(42, 3, 1_000_000, Stream::Sample),
            7_443_091_746_617_491_268
        );
        assert_eq!(
            mix(u64::MAX, u64::MAX, u64::MAX, Stream::Sample),
            12_625_010_139_469_418_024
        );
        assert_eq!(mix(0, 0, 0, Stream::Crop), CROP_GOLDEN[0]);
        assert_eq!(mix(7, 1, 3, Stream::Crop), CROP_GOLDEN[1]);
        assert_eq!(
            mix(u64::MAX, u64::MAX, u64::MAX, Stream::Crop),
            CROP_GOLDEN[2]
        );
    }

    #[test]
    fn flip_stream_is_pinned() {
        assert_eq!(mix(0, 0, 0, Stream::Flip), FLIP_GOLDEN[0]);
        assert_eq!(mix(7, 1, 3, Stream::Flip), FLIP_GOLDEN[1]);
    }

    #[test]
    fn shuffle_streams_are_pinned() {
        assert_eq!(mix(0, 0, 0, Stream::Bucket), 12_561_458_183_599_317_634);
        assert_eq!(mix(7, 1, 3, Stream::Bucket), 2_179_948_761_187_503_675);
        assert_eq!(mix(0, 0, 0, Stream::Buffer), 6_440_925_709_431_095_892);
        assert_eq!(mix(7, 1, 3, Stream::Buffer), 14_271_414_223_230_950_480);
    }

    #[test]
    fn crop_seed_is_pinned() {
        // The crop stream's goldens: the rule is `mix` with `Crop`.
        assert_eq!(crop_seed(0, 0, 0), CROP_GOLDEN[0]);
        assert_eq!(crop_seed(7, 1, 3), CROP_GOLDEN[1]);
        assert_eq!(crop_seed(7, 1, 5), 13_701_360_014_256_768_237);
    }

    const FLIP_GOLDEN: [u64; 2] = [7_597_842_688_844_317_922, 1_284_616_718_397_077_426];

    const CROP_GOLDEN: [u64; 3] = [
        11_492_569_862_326_130_707,
        3_522_167_460_412_779_704,
        15_917_774_939_899_584_926,
    ];

    #[test]
    fn epoch_key_is_pinned() {
        assert_eq!(epoch_key(0, 0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(epoch_key(7, 1), EPOCH_GOLDEN);
    }

    const EPOCH_GOLDEN: u64 = 8_979_970_331_585_092_768;

    #[test]
    fn hash_bytes_is_pinned() {
        assert_eq!(hash_bytes(b""), HASH_GOLDEN[0]);
        assert_eq!(hash_bytes(b"a.jpg"), HASH_GOLDEN[1]);
        assert_eq!(
            hash_bytes(b"/data/train/n01440764/0001.JPEG"),
            HASH_GOLDEN[2]
        );
    }

    const HASH_GOLDEN: [u64; 3] = [
        16_294_208_416_658_607_535,
        12_082_068_421_537_688_176,
        5_948_697_761_586_711_307,
    ];

    #[test]
    fn streams_indices_epochs_and_seeds_all_matter() {
        let mut seen = std::collections::HashSet::new();
        for stream in [
            Stream::Sample,
            Stream::Crop,
            Stream::Flip,
            Stream::Shards,
            Stream::Window,
            Stream::Bucket,
            Stream::Buffer,
        ] {
            for seed in 0..4 {
                for epoch in 0..4 {
                    for index in 0..64 {
                        assert!(seen.insert(mix(seed, epoch, index, stream)));
                    }
                }
            }
        }
    }

    #[test]
    fn hash_bytes_sees_every_byte_and_the_length() {
        let mut seen = std::collections::HashSet::new();
        for len in 0..20 {
            let zeros = vec![0u8; len];
            assert!(seen.insert(hash_bytes(&zeros)));
            for at in 0..len {
                let mut one = zeros.clone();
                one[at] = 1;
                assert!(seen.insert(hash_bytes(&one)));
            }
        }
    }

    #[test]
    fn draws_are_in_range() {
        let mut g = SplitMix64::new(mix(1, 2, 3, Stream::Crop));
        for n in [1usize, 2, 3, 1000] {
            for _ in 0..100 {
                assert!(g.below(n) < n);
                let x = g.uniform(-1.0, 2.0);
                assert!((-1.0..2.0).contains(&x));
            }
        }
        assert_eq!(g.below(0), 0);
        assert_eq!(Stream::from_name("crop"), Some(Stream::Crop));
        assert_eq!(Stream::from_name("flip"), Some(Stream::Flip));
        assert_eq!(Stream::from_name("sample"), Some(Stream::Sample));
        assert_eq!(Stream::from_name("shuffle"), None);
        for name in Stream::NAMES {
            assert!(Stream::from_name(name).is_some(), "{name}");
        }
    }
}
