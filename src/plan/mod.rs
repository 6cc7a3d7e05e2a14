//! The plans: which samples each batch of an epoch holds, on each rank.
//!
//! A loader's order is arithmetic on a few numbers (the data's size, the
//! batch size, the shuffle's `(seed, epoch)`, this rank's share of the
//! world, whether the uneven tail is dropped), done once, in one place, for
//! every executor (threads, worker processes, the native image chain). Two
//! kinds of source, two plans, one trait, [`Plan`]:
//!
//! - [`EpochPlan`] ([`map`]): a map-style dataset, read in a permutation of
//!   its indices; a rank takes every `W`-th position, padded or cut.
//! - [`ShardPlan`] ([`sharded`]): a sharded source, read in order, whole: a
//!   contiguous range of the shards' stream per rank, shuffled by windows,
//!   and resumable on another world size (its elastic history).
//!
//! # The vocabulary
//!
//! Both plans say the same things with the same words:
//!
//! - **Batches.** An epoch's batches on one rank are numbered
//!   `0..batches()`; a batch keeps its number (`batch_no`) from the plan to
//!   the consumer. Every rank has the same number of batches, so ranks step
//!   in lockstep.
//! - **Sample ids.** What a batch holds, in order: a map-style dataset's
//!   indices, or a sharded source's positions in its shards' stored order
//!   (counted across shards). A [`Group`] is a batch's number with its ids.
//! - **Samples per rank** and **batches per pass.** A pass over the data is
//!   shared out over the ranks by one rule ([`Split`]): each rank's share
//!   padded to `ceil(N / W)` samples, or cut to `N / W` with `drop_last`,
//!   and cut into batches, a last partial one kept short or dropped.
//! - **Start and remaining.** A plan starts at any batch of its epoch (the
//!   resume point, [`Plan::start`]) and yields exactly the groups a plan
//!   from 0 yields from there; [`Plan::remaining`] batches are left.
//!   [`Plan::resumed`] is the same plan from another batch. A position is
//!   all a resume needs: `(epoch, start)`, plus the sharded plan's history
//!   of worlds.
//!
//! # Examples
//!
//! Code that only walks an epoch works on either plan:
//!
//! ```
//! use ferrofeed::plan::{EpochPlan, Plan, PlanConfig, ShardPlan, ShardPlanConfig};
//!
//! fn ids(plan: &impl Plan) -> Vec<u64> {
//!     plan.groups().flat_map(|group| group.ids).collect()
//! }
//!
//! let map = EpochPlan::new(PlanConfig { len: 5, batch_size: 2, ..PlanConfig::default() }, 0, 0)
//!     .unwrap();
//! let config = ShardPlanConfig { counts: vec![2, 3], batch_size: 2, ..ShardPlanConfig::default() };
//! let sharded = ShardPlan::new(&config, 0, &[], 0).unwrap();
//! assert_eq!(ids(&map), ids(&sharded));
//! assert_eq!(ids(&map.resumed(2).unwrap()), vec![4]);
//! ```

mod error;
mod interleave;
pub mod map;
pub mod mix;
pub mod sharded;

pub use error::{MixError, PlanError, ShardPlanError};
pub use map::{EpochPlan, PlanConfig};
pub use mix::{Draw, MixConfig, MixPlan, Part, Stop};
pub use sharded::{Piece, Segment, ShardPlan, ShardPlanConfig};

/// Checks the batch size and this rank's place in the world, as every plan
/// needs them.
///
/// # Errors
///
/// [`PlanError`] for a batch size or world size of 0, or a rank outside the
/// world.
fn check_world(batch_size: u64, rank: u64, world_size: u64) -> Result<(), PlanError> {
    if batch_size == 0 {
        return Err(PlanError::ZeroBatchSize);
    }
    if world_size == 0 {
        return Err(PlanError::ZeroWorldSize);
    }
    if rank >= world_size {
        return Err(PlanError::RankOutOfRange { rank, world_size });
    }
    Ok(())
}

/// Checks a resume point against the epoch's `batches` (`start == batches`
/// is an epoch with nothing left).
///
/// # Errors
///
/// [`PlanError::StartPastEnd`] when `start > batches`.
fn check_start(start: u64, batches: u64) -> Result<(), PlanError> {
    if start > batches {
        return Err(PlanError::StartPastEnd {
            start,
            len: batches,
        });
    }
    Ok(())
}

/// How one pass of `samples` is shared out over `world_size` ranks in
/// batches of `batch_size`: the arithmetic both plans share.
///
/// The ranks' shares differ by one sample at most: `N / W` or one more.
/// With `drop_last` every share is cut to the fewer and a last, partial
/// batch is dropped; without it every rank yields as many batches as the
/// largest share needs, the last one short (the map-style plan pads every
/// share to the larger size; the sharded plan shortens a smaller share's
/// last batches by one sample instead, so that no sample repeats).
///
/// ```
/// use ferrofeed::plan::Split;
///
/// let split = Split { samples: 10, batch_size: 2, world_size: 3, drop_last: false };
/// assert_eq!((split.least(), split.most(), split.per_rank(), split.batches()), (3, 4, 4, 2));
/// let split = Split { drop_last: true, ..split };
/// assert_eq!((split.per_rank(), split.batches()), (3, 1));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    /// Samples in the pass (`N`).
    pub samples: u64,
    /// Samples per batch (`B`, at least 1).
    pub batch_size: u64,
    /// The number of ranks (`W`, at least 1).
    pub world_size: u64,
    /// Cut every share to `N / W` and drop a last, partial batch.
    pub drop_last: bool,
}

impl Split {
    /// The fewest samples a rank's share holds: `N / W`.
    pub fn least(&self) -> u64 {
        self.samples / self.world_size
    }

    /// The most samples a rank's share holds: `N / W` rounded up.
    pub fn most(&self) -> u64 {
        self.samples.div_ceil(self.world_size)
    }

    /// Every rank's share when all are made the same size: cut to
    /// [`Split::least`] with `drop_last`, padded to [`Split::most`] without.
    pub fn per_rank(&self) -> u64 {
        if self.drop_last {
            self.least()
        } else {
            self.most()
        }
    }

    /// The batches every rank yields in the pass: [`Split::per_rank`] over
    /// the batch size, rounded down with `drop_last`, up without.
    pub fn batches(&self) -> u64 {
        let per_rank = self.per_rank();
        if self.drop_last {
            per_rank / self.batch_size
        } else {
            per_rank.div_ceil(self.batch_size)
        }
    }
}

/// One batch of a plan: its number in the epoch and its samples' ids, in
/// order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The batch's number in the epoch (`0..batches()`).
    pub batch_no: u64,
    /// Its samples' ids (see the module docs).
    pub ids: Vec<u64>,
}

/// One epoch's batches on one rank, from a resume point (see the module
/// docs for the vocabulary).
pub trait Plan {
    /// The epoch planned.
    fn epoch(&self) -> u64;

    /// Batches in the epoch on this rank, numbered `0..batches()` (those
    /// before [`Plan::start`] included; the sharded plan's: of the current
    /// world).
    fn batches(&self) -> u64;

    /// Batches this rank yields per pass over the data (an epoch of the
    /// sharded plan is one pass).
    fn batches_per_pass(&self) -> u64;

    /// Samples in this rank's share of a pass, after padding or cutting
    /// ([`Split`]): the map-style plan's is the same on every rank (and with
    /// `drop_last` counts a last, dropped batch's samples); the sharded
    /// plan's is the samples this rank yields in the current world.
    fn samples_per_rank(&self) -> u64;

    /// The first batch the plan yields: the resume point.
    fn start(&self) -> u64;

    /// Batches left from [`Plan::start`] to the end of the epoch.
    fn remaining(&self) -> u64 {
        self.batches() - self.start()
    }

    /// The number of samples in batch `batch_no`.
    ///
    /// # Panics
    ///
    /// When `batch_no >= batches()`.
    fn batch_len(&self, batch_no: u64) -> u64;

    /// The sample ids of batch `batch_no`, in order.
    ///
    /// # Panics
    ///
    /// When `batch_no >= batches()`.
    fn batch(&self, batch_no: u64) -> Vec<u64>;

    /// Batch `batch_no` as a [`Group`].
    ///
    /// # Panics
    ///
    /// When `batch_no >= batches()`.
    fn group(&self, batch_no: u64) -> Group {
        Group {
            batch_no,
            ids: self.batch(batch_no),
        }
    }

    /// The groups from [`Plan::start`] to the end of the epoch.
    fn groups(&self) -> Groups<'_, Self>
    where
        Self: Sized,
    {
        Groups {
            plan: self,
            next: self.start(),
            end: self.batches(),
        }
    }

    /// The same plan (epoch, configuration, history) from batch `start`.
    ///
    /// # Errors
    ///
    /// [`PlanError::StartPastEnd`] when `start > batches()`.
    fn resumed(&self, start: u64) -> Result<Self, PlanError>
    where
        Self: Sized;
}

/// The groups of a [`Plan`] from its start, in order ([`Plan::groups`]).
#[derive(Debug, Clone)]
pub struct Groups<'a, P: Plan> {
    plan: &'a P,
    next: u64,
    end: u64,
}

impl<P: Plan> Iterator for Groups<'_, P> {
    type Item = Group;

    fn next(&mut self) -> Option<Group> {
        if self.next >= self.end {
            return None;
        }
        let group = self.plan.group(self.next);
        self.next += 1;
        Some(group)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = usize::try_from(self.end - self.next).unwrap_or(usize::MAX);
        (left, Some(left))
    }
}

impl<P: Plan> ExactSizeIterator for Groups<'_, P> {}

#[cfg(test)]
mod tests;
