//! What the plans cannot be made from: one error type per plan, and the
//! refusals every plan shares ([`PlanError`]), which the others wrap.

/// What a plan cannot be made from, whichever the plan.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// `batch_size` is 0.
    #[error("batch_size must be at least 1")]
    ZeroBatchSize,
    /// `world_size` is 0.
    #[error("world_size must be at least 1")]
    ZeroWorldSize,
    /// `rank` is not below `world_size`.
    #[error("rank {rank} is not in [0, world_size={world_size})")]
    RankOutOfRange {
        /// The rank given.
        rank: u64,
        /// The world size given.
        world_size: u64,
    },
    /// `batches_per_epoch` is 0 (the map-style plan's).
    #[error("batches_per_epoch must be at least 1")]
    ZeroBatchesPerEpoch,
    /// The resume point is past the epoch's end.
    #[error("cannot start at batch {start} of an epoch of {len} batches")]
    StartPastEnd {
        /// The batch to start at.
        start: u64,
        /// The epoch's number of batches (the sharded plan's: in the current
        /// world).
        len: u64,
    },
}

/// What a sharded plan cannot be made from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardPlanError {
    /// A refusal every plan shares: a batch size or world size of 0, a rank
    /// outside the world, a resume point past the end ([`PlanError`]).
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// `window` is 0.
    #[error("shuffle_window must be at least 1")]
    ZeroWindow,
    /// Without `drop_last`, some rank would have fewer samples than batches.
    #[error(
        "{samples} samples cannot give each of {world_size} ranks the same number of \
         batches of at most {batch_size} without repeating a sample (a rank would have \
         {least} samples for {batches} batches); use drop_last=True, a larger batch size \
         or fewer ranks"
    )]
    Uneven {
        /// Samples to share out.
        samples: u64,
        /// Ranks.
        world_size: u64,
        /// The batch size.
        batch_size: u64,
        /// The fewest samples a rank gets.
        least: u64,
        /// The batches every rank would yield.
        batches: u64,
    },
    /// A segment of the resume history does not fit the source.
    #[error(
        "the resume history's segment {segment} ({batches_done} batches on {world_size} \
         ranks) does not fit: that world had {len} batches left"
    )]
    BadHistory {
        /// The segment's position in the history.
        segment: usize,
        /// Its world size.
        world_size: u64,
        /// Its batches done.
        batches_done: u64,
        /// The batches that world had.
        len: u64,
    },
}

/// What a mixture plan cannot be made from.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MixError {
    /// A refusal every plan shares ([`PlanError`]).
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// A sharded part's own plan refused ([`ShardPlanError`]).
    #[error("source {part}: {error}")]
    Shard {
        /// The part.
        part: usize,
        /// Its plan's refusal.
        error: ShardPlanError,
    },
    /// No parts.
    #[error("a mixture needs at least one source")]
    NoParts,
    /// As many weights as parts are needed.
    #[error("{weights} weights for {parts} sources")]
    WeightCount {
        /// Weights given.
        weights: usize,
        /// Parts.
        parts: usize,
    },
    /// A weight is negative, NaN or infinite.
    #[error("weight {weight} of source {part} is not a finite number >= 0")]
    BadWeight {
        /// The part.
        part: usize,
        /// Its weight.
        weight: f64,
    },
    /// Every weight is 0.
    #[error("every weight is 0: at least one source must be drawn from")]
    AllZero,
    /// A weight is so small next to the others that it rounds to 0.
    #[error("weight {weight} of source {part} is too small next to the others (below 2^-40 of their sum)")]
    WeightTooSmall {
        /// The part.
        part: usize,
        /// Its weight.
        weight: f64,
    },
    /// A part with a weight above 0 has no samples.
    #[error("source {part} is empty")]
    EmptyPart {
        /// The part.
        part: usize,
    },
    /// `Stop::Samples(0)`.
    #[error("samples_per_epoch must be at least 1")]
    ZeroSamples,
    /// More than `2^48` samples in the parts or an epoch (the interleave's
    /// exact integer times need them below).
    #[error("{samples} samples: a mixture holds at most 2^48 samples in its sources and epochs")]
    TooLarge {
        /// The samples asked for.
        samples: u64,
    },
    /// A part must start a new pass in a world with more ranks than samples.
    #[error(
        "source {part} has {samples} samples, fewer than the {world_size} ranks: it cannot \
         start over with a sample for every rank"
    )]
    TooFewSamples {
        /// The part.
        part: usize,
        /// Its samples.
        samples: u64,
        /// The ranks.
        world_size: u64,
    },
    /// A segment of the resume history does not fit the mixture.
    #[error(
        "the resume history's segment {segment} ({batches_done} batches on {world_size} \
         ranks) does not fit: that world had {len} batches"
    )]
    BadHistory {
        /// The segment's position in the history.
        segment: usize,
        /// Its world size.
        world_size: u64,
        /// Its batches done.
        batches_done: u64,
        /// The batches that world had.
        len: u64,
    },
}
