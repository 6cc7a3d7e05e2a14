//! The sharded plan: which samples of a sharded source each batch of an
//! epoch holds, on each rank, and which pieces of which shards a rank reads.
//!
//! A sharded source (tar, Parquet, JSON lines; [`crate::shards`]) is read in
//! order, whole: a random read per sample is slow on disk and ruinous on
//! object storage. So the order of an epoch is not a permutation of the
//! samples (as [`super::map`] makes for map-style datasets) but a shuffle in
//! two levels that a reader streams.
//!
//! # The rule
//!
//! - **The stream.** The shards, in the order of a permutation keyed by
//!   `(seed, epoch)` (stored order without shuffling), laid end to end: a
//!   stream of the epoch's `N` samples.
//! - **Ranks.** Rank `r` of `W` takes a contiguous range of the stream:
//!   `N / W` samples, one more for the first `N % W` ranks. A rank thus
//!   reads about `1/W` of the bytes, whole shards but for the two at its
//!   range's ends, read from a member on.
//! - **Batches.** Every rank yields the same number of batches, so ranks step
//!   in lockstep (a rank that runs out early hangs a DDP job). With
//!   `drop_last`, every rank takes `N / W` samples in `(N / W) / B` full
//!   batches and leaves the rest. Without it, every rank yields
//!   `ceil(ceil(N / W) / B)` batches: full ones of `B`, and, at the end of a
//!   rank with fewer samples, batches short by one sample where needed, so
//!   that every sample is read exactly once. (This needs every rank to have
//!   at least one sample per batch: refused otherwise, which happens only
//!   with batches of 1 or fewer samples than ranks; `drop_last` then works.)
//! - **Windows.** A rank's range is cut into windows of `window` samples (a
//!   multiple of the batch size) from its start; the samples of each window
//!   are permuted by `(seed, epoch, window)` and then cut into batches. A
//!   batch never spans two windows, and a reader holds one window (plus the
//!   one it reads ahead) whatever the dataset's size. With a window of
//!   several shards, a batch mixes samples of several shards.
//!
//! The order is a function of `(seed, epoch)`, the shard sizes, the world
//! and the batch size, never of how many threads or workers load it.
//!
//! # Resume, also elastic
//!
//! A plan starts at any batch of its epoch. A run resumed with another
//! world size finishes the same epoch with every remaining sample exactly
//! once: the epoch's history is a list of [`Segment`]s, `(world_size,
//! batches_done)`, one per world the epoch ran on. The samples those
//! batches consumed (the same on every rank: ranks step in lockstep) are
//! taken out of the stream, and the remaining ones, in stream order, are
//! planned afresh by the rule above for the new world, with windows keyed by
//! the segment too.
//!
//! # Examples
//!
//! ```
//! use ferrofeed::plan::{Plan, ShardPlan, ShardPlanConfig};
//!
//! let config = ShardPlanConfig {
//!     counts: vec![4, 4, 4],
//!     batch_size: 2,
//!     window: 4,
//!     ..ShardPlanConfig::default()
//! };
//! let plan = ShardPlan::new(&config, 0, &[], 0).unwrap();
//! let batches: Vec<Vec<u64>> = plan.groups().map(|g| g.ids).collect();
//! assert_eq!(batches.len(), 6);
//! assert_eq!(batches[0], vec![0, 1]); // no shuffle: stored order
//! ```

use super::{check_start, check_world, Plan, PlanError, ShardPlanError, Split};
use crate::sampler::Permutation;
use crate::seed::{finalize, mix, Stream};

/// Everything of a sharded source's order but the epoch and the resume point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPlanConfig {
    /// Samples in each shard, in stored order.
    pub counts: Vec<u64>,
    /// Samples per batch (at least 1).
    pub batch_size: u64,
    /// Permute the shards and each window.
    pub shuffle: bool,
    /// The shuffle's seed.
    pub seed: u64,
    /// This process's rank, in `0..world_size`.
    pub rank: u64,
    /// The number of ranks (at least 1).
    pub world_size: u64,
    /// Give every rank `N / W` samples in full batches.
    pub drop_last: bool,
    /// Samples per window, rounded up to a multiple of `batch_size`.
    pub window: u64,
}

impl Default for ShardPlanConfig {
    /// No shards, batches of 1, no shuffle, one rank, windows of 1024.
    fn default() -> Self {
        Self {
            counts: Vec::new(),
            batch_size: 1,
            shuffle: false,
            seed: 0,
            rank: 0,
            world_size: 1,
            drop_last: false,
            window: 1024,
        }
    }
}

impl ShardPlanConfig {
    fn validate(&self) -> Result<(), ShardPlanError> {
        check_world(self.batch_size, self.rank, self.world_size)?;
        if self.window == 0 {
            return Err(ShardPlanError::ZeroWindow);
        }
        Ok(())
    }

    /// The window in samples: `window` rounded up to a multiple of the batch
    /// size.
    pub fn window_samples(&self) -> u64 {
        self.window.div_ceil(self.batch_size.max(1)) * self.batch_size.max(1)
    }

    /// Samples in all shards.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// One world an epoch ran on before it was resumed on another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// The ranks of that world.
    pub world_size: u64,
    /// The batches every rank yielded in it.
    pub batches_done: u64,
}

impl Segment {
    /// `batches_done` batches on every rank of a world of `world_size`.
    pub const fn new(world_size: u64, batches_done: u64) -> Self {
        Self {
            world_size,
            batches_done,
        }
    }
}

/// Samples `lo..hi` of shard `shard` (its index in stored order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The shard, by its position in the stored order.
    pub shard: usize,
    /// The first sample, by its number in the shard.
    pub lo: u64,
    /// One past the last.
    pub hi: u64,
}

/// Sorted, disjoint intervals of stream positions, addressed by their rank
/// in the set ("index space": the `i`-th remaining sample).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Remaining {
    /// `(start, end)` of each interval, ascending.
    spans: Vec<(u64, u64)>,
    /// The index of each interval's first position.
    first: Vec<u64>,
    len: u64,
}

impl Remaining {
    fn new(spans: Vec<(u64, u64)>) -> Self {
        let mut first = Vec::with_capacity(spans.len());
        let mut len = 0;
        for &(s, e) in &spans {
            first.push(len);
            len += e - s;
        }
        Self { spans, first, len }
    }

    /// The stream position of the `i`-th remaining sample.
    fn position(&self, i: u64) -> u64 {
        let k = self.first.partition_point(|&f| f <= i) - 1;
        self.spans[k].0 + (i - self.first[k])
    }

    /// The stream intervals of indices `lo..hi`.
    fn spans_of(&self, lo: u64, hi: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        if lo >= hi {
            return out;
        }
        let mut k = self.first.partition_point(|&f| f <= lo) - 1;
        let mut i = lo;
        while i < hi {
            let (s, e) = self.spans[k];
            let from = s + (i - self.first[k]);
            let take = (e - from).min(hi - i);
            out.push((from, from + take));
            i += take;
            k += 1;
        }
        out
    }

    /// The remaining set less the indices in `taken` (sorted, disjoint
    /// index intervals).
    fn without(&self, taken: &[(u64, u64)]) -> Self {
        let mut keep = Vec::new();
        let mut at = 0;
        for &(lo, hi) in taken {
            if lo > at {
                keep.extend(self.spans_of(at, lo));
            }
            at = at.max(hi);
        }
        if at < self.len {
            keep.extend(self.spans_of(at, self.len));
        }
        // Neighbouring spans merge back into one.
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(keep.len());
        for (s, e) in keep {
            match merged.last_mut() {
                Some(last) if last.1 == s => last.1 = e,
                _ => merged.push((s, e)),
            }
        }
        Self::new(merged)
    }
}

/// One rank's share of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Share {
    /// Its first index in the segment's remaining set.
    start: u64,
    /// The samples it yields.
    samples: u64,
    /// Its batches.
    batches: u64,
    batch_size: u64,
    drop_last: bool,
}

impl Share {
    /// Rank `rank`'s share of `n` samples over `world` ranks.
    fn of(
        n: u64,
        world: u64,
        rank: u64,
        batch_size: u64,
        drop_last: bool,
    ) -> Result<Self, ShardPlanError> {
        let split = Split {
            samples: n,
            batch_size,
            world_size: world,
            drop_last,
        };
        let (base, extra) = (split.least(), n % world);
        let start = rank * base + rank.min(extra);
        let batches = split.batches();
        if drop_last {
            return Ok(Self {
                start,
                samples: batches * batch_size,
                batches,
                batch_size,
                drop_last,
            });
        }
        if n > 0 && base < batches {
            return Err(ShardPlanError::Uneven {
                samples: n,
                world_size: world,
                batch_size,
                least: base,
                batches,
            });
        }
        Ok(Self {
            start,
            samples: base + u64::from(rank < extra),
            batches,
            batch_size,
            drop_last,
        })
    }

    /// The first share-local position of batch `j` (`j == batches`: `len`).
    fn batch_start(&self, j: u64) -> u64 {
        if j >= self.batches {
            return self.samples;
        }
        if self.drop_last {
            return j * self.batch_size;
        }
        // Full batches, except that each batch left needs a sample: on a
        // rank one sample short, the last batches give one up each.
        (j * self.batch_size).min(self.samples - (self.batches - j))
    }
}

/// The shards laid end to end in an epoch's order.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Layout {
    /// The shards in stream order (positions in the stored order).
    order: Vec<usize>,
    /// The stream position of each shard of `order`, and the total last.
    starts: Vec<u64>,
    /// Each shard's first global id (stored order).
    offsets: Vec<u64>,
}

impl Layout {
    fn new(config: &ShardPlanConfig, epoch: u64) -> Self {
        let n = config.counts.len();
        let order: Vec<usize> = if config.shuffle && n > 1 {
            let perm = Permutation::new(n as u64, mix(config.seed, epoch, 0, Stream::Shards));
            (0..n as u64).map(|i| perm.get(i) as usize).collect()
        } else {
            (0..n).collect()
        };
        let mut starts = Vec::with_capacity(n + 1);
        let mut at = 0;
        for &s in &order {
            starts.push(at);
            at += config.counts[s];
        }
        starts.push(at);
        let mut offsets = Vec::with_capacity(n);
        let mut at = 0;
        for &c in &config.counts {
            offsets.push(at);
            at += c;
        }
        Self {
            order,
            starts,
            offsets,
        }
    }

    /// The position in `order` of the shard holding stream position `p`.
    fn shard_at(&self, p: u64) -> usize {
        self.starts.partition_point(|&s| s <= p) - 1
    }

    /// The global id (stored-order index) of stream position `p`.
    fn id(&self, p: u64) -> u64 {
        let k = self.shard_at(p);
        self.offsets[self.order[k]] + (p - self.starts[k])
    }

    /// The pieces of shards that stream positions `lo..hi` cover.
    fn pieces(&self, lo: u64, hi: u64, out: &mut Vec<Piece>) {
        let mut p = lo;
        while p < hi {
            let k = self.shard_at(p);
            let end = self.starts[k + 1].min(hi);
            let (base, shard) = (self.starts[k], self.order[k]);
            match out.last_mut() {
                Some(last) if last.shard == shard && last.hi == p - base => last.hi = end - base,
                _ => out.push(Piece {
                    shard,
                    lo: p - base,
                    hi: end - base,
                }),
            }
            p = end;
        }
    }
}

/// One epoch's batches of a sharded source on one rank, from a resume point
/// (see the module docs for the rule).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPlan {
    config: ShardPlanConfig,
    epoch: u64,
    segment: u64,
    layout: Layout,
    remaining: Remaining,
    share: Share,
    window: u64,
    start: u64,
}

impl ShardPlan {
    /// The plan of `epoch` after the worlds of `history`, starting at batch
    /// `start` of the current world's share.
    ///
    /// # Errors
    ///
    /// [`ShardPlanError`] for a config it cannot plan (see the variants), a
    /// history that does not fit, or a `start` past the end.
    pub fn new(
        config: &ShardPlanConfig,
        epoch: u64,
        history: &[Segment],
        start: u64,
    ) -> Result<Self, ShardPlanError> {
        config.validate()?;
        let layout = Layout::new(config, epoch);
        let window = config.window_samples();
        let mut remaining = Remaining::new(if config.total() > 0 {
            vec![(0, config.total())]
        } else {
            Vec::new()
        });
        for (g, seg) in history.iter().enumerate() {
            if seg.world_size == 0 {
                return Err(PlanError::ZeroWorldSize.into());
            }
            let mut taken = Vec::new();
            for rank in 0..seg.world_size {
                let share = Share::of(
                    remaining.len,
                    seg.world_size,
                    rank,
                    config.batch_size,
                    config.drop_last,
                )?;
                if seg.batches_done > share.batches {
                    return Err(ShardPlanError::BadHistory {
                        segment: g,
                        world_size: seg.world_size,
                        batches_done: seg.batches_done,
                        len: share.batches,
                    });
                }
                consumed(
                    config,
                    epoch,
                    g as u64,
                    &share,
                    window,
                    seg.batches_done,
                    &mut taken,
                );
            }
            remaining = remaining.without(&taken);
        }
        let share = Share::of(
            remaining.len,
            config.world_size,
            config.rank,
            config.batch_size,
            config.drop_last,
        )?;
        check_start(start, share.batches)?;
        Ok(Self {
            config: config.clone(),
            epoch,
            segment: history.len() as u64,
            layout,
            remaining,
            share,
            window,
            start,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ShardPlanConfig {
        &self.config
    }

    /// Samples left to all ranks of the current world (the epoch's samples
    /// less those of the history's batches).
    pub fn remaining_samples(&self) -> u64 {
        self.remaining.len
    }

    /// Samples per window (a multiple of the batch size).
    pub fn window(&self) -> u64 {
        self.window
    }

    /// Windows in this rank's share.
    pub fn windows(&self) -> u64 {
        self.share.samples.div_ceil(self.window)
    }

    /// The window batch `j` lies in.
    pub fn window_of(&self, j: u64) -> u64 {
        self.share.batch_start(j) / self.window
    }

    /// The pieces of shards window `w` holds, in stream order.
    pub fn window_pieces(&self, w: u64) -> Vec<Piece> {
        let (lo, hi) = self.window_bounds(w);
        let mut out = Vec::new();
        for (s, e) in self
            .remaining
            .spans_of(self.share.start + lo, self.share.start + hi)
        {
            self.layout.pieces(s, e, &mut out);
        }
        out
    }

    fn check(&self, batch_no: u64) {
        assert!(
            batch_no < self.share.batches,
            "batch {batch_no} of {}",
            self.share.batches
        );
    }

    fn window_bounds(&self, w: u64) -> (u64, u64) {
        let lo = w * self.window;
        (lo, (lo + self.window).min(self.share.samples))
    }

    fn window_permutation(&self, segment: u64, lo: u64, hi: u64) -> Option<Permutation> {
        window_permutation(&self.config, self.epoch, segment, &self.share, lo, hi)
    }
}

impl Plan for ShardPlan {
    fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Batches in this rank's share of the current world (from its start,
    /// whatever the resume point).
    fn batches(&self) -> u64 {
        self.share.batches
    }

    /// The batches of the current world: an epoch is one pass.
    fn batches_per_pass(&self) -> u64 {
        self.share.batches
    }

    /// Samples this rank yields in the current world.
    fn samples_per_rank(&self) -> u64 {
        self.share.samples
    }

    fn start(&self) -> u64 {
        self.start
    }

    fn batch_len(&self, batch_no: u64) -> u64 {
        self.check(batch_no);
        self.share.batch_start(batch_no + 1) - self.share.batch_start(batch_no)
    }

    /// The global ids (positions in the shards' stored order, counted
    /// across shards) of batch `batch_no`'s samples, in order.
    fn batch(&self, batch_no: u64) -> Vec<u64> {
        self.check(batch_no);
        let j = batch_no;
        let (lo, hi) = (self.share.batch_start(j), self.share.batch_start(j + 1));
        let w = lo / self.window;
        let (wlo, whi) = self.window_bounds(w);
        let perm = self.window_permutation(self.segment, wlo, whi);
        (lo..hi)
            .map(|q| {
                let local = wlo + perm.map_or(q - wlo, |p| p.get(q - wlo));
                self.layout
                    .id(self.remaining.position(self.share.start + local))
            })
            .collect()
    }

    fn resumed(&self, start: u64) -> Result<Self, PlanError> {
        check_start(start, self.share.batches)?;
        Ok(Self {
            start,
            ..self.clone()
        })
    }
}

/// The permutation of window `w` (share-local `lo..hi`), or `None` without
/// shuffling. Keyed by the epoch, the segment and the window's first index
/// in the segment, so no two windows of an epoch share a key.
fn window_permutation(
    config: &ShardPlanConfig,
    epoch: u64,
    segment: u64,
    share: &Share,
    lo: u64,
    hi: u64,
) -> Option<Permutation> {
    if !config.shuffle {
        return None;
    }
    let at = finalize((share.start + lo) ^ segment.rotate_left(48));
    Some(Permutation::new(
        hi - lo,
        mix(config.seed, epoch, at, Stream::Window),
    ))
}

/// Appends to `taken` the indices (in the segment's remaining set) of the
/// samples that `share`'s first `done` batches consumed, as sorted, disjoint
/// intervals.
fn consumed(
    config: &ShardPlanConfig,
    epoch: u64,
    segment: u64,
    share: &Share,
    window: u64,
    done: u64,
    taken: &mut Vec<(u64, u64)>,
) {
    if done == 0 {
        return;
    }
    let end = share.batch_start(done);
    let w = end / window;
    let full = w * window;
    if full > 0 {
        taken.push((share.start, share.start + full));
    }
    if end > full {
        let hi = (full + window).min(share.samples);
        let perm = window_permutation(config, epoch, segment, share, full, hi);
        let mut points: Vec<u64> = (0..end - full)
            .map(|t| share.start + full + perm.map_or(t, |p| p.get(t)))
            .collect();
        points.sort_unstable();
        for p in points {
            match taken.last_mut() {
                Some(last) if last.1 == p => last.1 += 1,
                _ => taken.push((p, p + 1)),
            }
        }
    }
}

#[cfg(test)]
mod tests;
