//! The plans: which samples each batch of an epoch holds, on each rank.
//!
//! - [`map`]: [`EpochPlan`], a map-style dataset's epoch.
//! - [`sharded`]: [`ShardPlan`], a sharded source's epoch.

pub mod map;
pub mod sharded;

pub use map::{EpochPlan, PlanConfig, PlanError};
pub use sharded::{Piece, Segment, ShardPlan, ShardPlanConfig, ShardPlanError};
