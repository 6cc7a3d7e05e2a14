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
mod tests {
    use super::*;
    use crate::plan::Group;
    use std::collections::BTreeSet;

    fn config(counts: &[u64], batch: u64, window: u64, world: u64, rank: u64) -> ShardPlanConfig {
        ShardPlanConfig {
            counts: counts.to_vec(),
            batch_size: batch,
            shuffle: true,
            seed: 7,
            rank,
            world_size: world,
            drop_last: false,
            window,
        }
    }

    fn all_batches(
        c: &ShardPlanConfig,
        epoch: u64,
        history: &[Segment],
        start: u64,
    ) -> Vec<Vec<u64>> {
        ShardPlan::new(c, epoch, history, start)
            .unwrap()
            .groups()
            .map(|g| g.ids)
            .collect()
    }

    /// Every rank's batches of one world, from `start`.
    fn world(
        c: &ShardPlanConfig,
        world: u64,
        history: &[Segment],
        start: u64,
    ) -> Vec<Vec<Vec<u64>>> {
        (0..world)
            .map(|r| {
                let c = ShardPlanConfig {
                    rank: r,
                    world_size: world,
                    ..c.clone()
                };
                all_batches(&c, 3, history, start)
            })
            .collect()
    }

    #[test]
    fn every_sample_once_and_ranks_in_lockstep() {
        for counts in [
            vec![5, 9, 1, 13, 7],
            vec![3],
            vec![100],
            vec![2, 2, 2, 2, 2, 2, 2],
        ] {
            for world in 1..=5 {
                for batch in 2..=4 {
                    for window in [1, 4, 8, 64] {
                        let c = config(&counts, batch, window, world, 0);
                        let total = c.total();
                        let ranks = world_ids(&c, world);
                        let Some(ranks) = ranks else {
                            // Refused: fewer samples than batches on a rank.
                            assert!(total / world < total.div_ceil(world).div_ceil(batch));
                            continue;
                        };
                        let n = ranks[0].len();
                        assert!(ranks.iter().all(|r| r.len() == n), "lockstep");
                        let mut seen: Vec<u64> =
                            ranks.iter().flatten().flatten().copied().collect();
                        seen.sort_unstable();
                        assert_eq!(seen, (0..total).collect::<Vec<_>>());
                        for b in ranks.iter().flatten() {
                            assert!(!b.is_empty() && b.len() as u64 <= batch);
                        }
                    }
                }
            }
        }
    }

    fn world_ids(c: &ShardPlanConfig, world: u64) -> Option<Vec<Vec<Vec<u64>>>> {
        (0..world)
            .map(|r| {
                let c = ShardPlanConfig {
                    rank: r,
                    world_size: world,
                    ..c.clone()
                };
                match ShardPlan::new(&c, 0, &[], 0) {
                    Ok(p) => Some(p.groups().map(|g| g.ids).collect()),
                    Err(ShardPlanError::Uneven { .. }) => None,
                    Err(e) => panic!("{e}"),
                }
            })
            .collect()
    }

    #[test]
    fn drop_last_gives_full_batches() {
        let c = ShardPlanConfig {
            drop_last: true,
            ..config(&[5, 9, 1, 13, 7], 4, 8, 3, 0)
        };
        let ranks = world(&c, 3, &[], 0);
        for r in &ranks {
            assert_eq!(r.len(), (35 / 3) / 4);
            assert!(r.iter().all(|b| b.len() == 4));
        }
        let seen: BTreeSet<u64> = ranks.iter().flatten().flatten().copied().collect();
        assert_eq!(seen.len(), 3 * 2 * 4);
    }

    #[test]
    fn resume_at_every_batch_is_the_rest() {
        let c = config(&[5, 9, 1, 13, 7, 20], 3, 6, 2, 1);
        let full = all_batches(&c, 1, &[], 0);
        for start in 0..=full.len() as u64 {
            assert_eq!(all_batches(&c, 1, &[], start), full[start as usize..]);
        }
    }

    #[test]
    fn elastic_resume_reads_every_remaining_sample_once() {
        let counts = [5, 9, 1, 13, 7, 20, 11, 4];
        let total: u64 = counts.iter().sum();
        for (w1, w2, w3) in [(2, 3, 1), (4, 1, 2), (3, 3, 5), (1, 4, 4)] {
            for batch in [2, 3] {
                for window in [3, 10] {
                    let c = config(&counts, batch, window, 1, 0);
                    let first = world(&c, w1, &[], 0);
                    let n1 = first[0].len() as u64;
                    for done1 in [0, 1, n1 / 2, n1] {
                        let h1 = [Segment {
                            world_size: w1,
                            batches_done: done1,
                        }];
                        let second = world(&c, w2, &h1, 0);
                        let n2 = second[0].len() as u64;
                        let done2 = n2 / 3;
                        let h2 = [
                            h1[0],
                            Segment {
                                world_size: w2,
                                batches_done: done2,
                            },
                        ];
                        let third = world(&c, w3, &h2, 0);
                        let mut seen: Vec<u64> = Vec::new();
                        for r in &first {
                            seen.extend(r[..done1 as usize].iter().flatten());
                        }
                        for r in &second {
                            seen.extend(r[..done2 as usize].iter().flatten());
                        }
                        for r in &third {
                            seen.extend(r.iter().flatten());
                            assert_eq!(r.len(), third[0].len(), "lockstep");
                        }
                        seen.sort_unstable();
                        assert_eq!(
                            seen,
                            (0..total).collect::<Vec<_>>(),
                            "{w1} {w2} {w3} {batch} {window} {done1}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn same_world_resume_through_history_is_not_exact_but_complete() {
        // The loader resumes a same-world run at its batch (exact); the
        // history is only for a change of world. Check the batch count.
        let c = config(&[10, 10], 2, 4, 1, 0);
        let p = ShardPlan::new(
            &c,
            0,
            &[Segment {
                world_size: 1,
                batches_done: 4,
            }],
            0,
        )
        .unwrap();
        assert_eq!(p.batches(), 6);
        assert_eq!(p.remaining_samples(), 12);
    }

    #[test]
    fn a_history_past_its_end_is_refused() {
        let c = config(&[10, 10], 2, 4, 1, 0);
        let e = ShardPlan::new(
            &c,
            0,
            &[Segment {
                world_size: 2,
                batches_done: 6,
            }],
            0,
        )
        .unwrap_err();
        assert!(
            matches!(e, ShardPlanError::BadHistory { len: 5, .. }),
            "{e}"
        );
    }

    #[test]
    fn windows_hold_the_batches_and_pieces_cover_them() {
        let c = config(&[5, 9, 1, 13, 7, 20], 4, 8, 2, 1);
        let p = ShardPlan::new(&c, 2, &[], 0).unwrap();
        let offsets: Vec<u64> = c
            .counts
            .iter()
            .scan(0, |a, &n| {
                let o = *a;
                *a += n;
                Some(o)
            })
            .collect();
        for Group { batch_no: j, ids } in p.groups() {
            let w = p.window_of(j);
            let pieces = p.window_pieces(w);
            let held: usize = pieces.iter().map(|x| (x.hi - x.lo) as usize).sum();
            assert!(held as u64 <= p.window());
            for id in ids {
                assert!(
                    pieces
                        .iter()
                        .any(|x| (offsets[x.shard] + x.lo..offsets[x.shard] + x.hi).contains(&id)),
                    "batch {j}: {id} not in window {w}'s pieces {pieces:?}"
                );
            }
        }
    }

    #[test]
    fn ranks_read_contiguous_ranges_of_the_stream() {
        // Each rank's pieces together are at most two partial shards plus
        // whole ones: it reads about its share of the bytes.
        let counts = vec![10; 12];
        for world in [2, 3, 5] {
            let mut pieces_total = 0;
            for rank in 0..world {
                let c = config(&counts, 4, 1000, world, rank);
                let p = ShardPlan::new(&c, 0, &[], 0).unwrap();
                let pieces: Vec<Piece> =
                    (0..p.windows()).flat_map(|w| p.window_pieces(w)).collect();
                let partial = pieces.iter().filter(|x| x.hi - x.lo != 10).count();
                assert!(partial <= 2, "{pieces:?}");
                pieces_total += pieces.iter().map(|x| x.hi - x.lo).sum::<u64>();
            }
            assert_eq!(pieces_total, 120);
        }
    }

    #[test]
    fn a_batch_mixes_shards_and_the_order_follows_the_epoch() {
        let c = config(&[16; 8], 8, 64, 1, 0);
        let e0 = all_batches(&c, 0, &[], 0);
        let e1 = all_batches(&c, 1, &[], 0);
        assert_ne!(e0, e1);
        assert_eq!(e0, all_batches(&c, 0, &[], 0));
        let shards: BTreeSet<u64> = e0[0].iter().map(|id| id / 16).collect();
        assert!(shards.len() >= 3, "{shards:?}");
    }

    #[test]
    fn without_shuffle_the_order_is_stored_order() {
        let c = ShardPlanConfig {
            shuffle: false,
            ..config(&[3, 4, 5], 2, 4, 1, 0)
        };
        let flat: Vec<u64> = all_batches(&c, 9, &[], 0).into_iter().flatten().collect();
        assert_eq!(flat, (0..12).collect::<Vec<_>>());
    }

    #[test]
    fn refusals() {
        let c = config(&[5], 1, 4, 2, 0);
        assert!(matches!(
            ShardPlan::new(&c, 0, &[], 0),
            Err(ShardPlanError::Uneven { .. })
        ));
        let c = ShardPlanConfig {
            drop_last: true,
            ..c
        };
        assert_eq!(ShardPlan::new(&c, 0, &[], 0).unwrap().batches(), 2);
        let c = config(&[5], 2, 4, 2, 2);
        assert!(matches!(
            ShardPlan::new(&c, 0, &[], 0),
            Err(ShardPlanError::Plan(PlanError::RankOutOfRange { .. }))
        ));
        let c = config(&[5], 2, 4, 1, 0);
        assert!(matches!(
            ShardPlan::new(&c, 0, &[], 4),
            Err(ShardPlanError::Plan(PlanError::StartPastEnd { .. }))
        ));
        let empty = config(&[], 2, 4, 3, 1);
        assert_eq!(ShardPlan::new(&empty, 0, &[], 0).unwrap().batches(), 0);
    }
}
