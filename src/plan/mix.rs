//! The mixture plan: several sources drawn at set proportions, each in its
//! own order, as one epoch of numbered batches on each rank.
//!
//! # The rule
//!
//! - **Parts.** Each source of the mixture (a *part*) is read in its own
//!   order, on this rank, one *pass* at a time: a map-style part in the
//!   permutation of its samples keyed by the pass's seed, rank `r` of `W`
//!   taking every `W`-th position from `r` (as [`super::map`] shares an
//!   epoch); a sharded part by the [`ShardPlan`] of that seed, with batches
//!   of one sample and `drop_last` (a contiguous range of the shards per
//!   rank, shuffled by windows). A pass's seed is
//!   `mix(seed, pass, part, Stream::Source)`, so each part keeps its own
//!   shuffle, different in every pass and every epoch. Every rank takes
//!   `R / W` samples of a pass's `R` remaining ones.
//! - **The draw.** Position `p` of the epoch on a rank (counted across its
//!   batches) draws from one part, by a low-discrepancy interleave rather
//!   than by coin flips: part `k` of weight `w_k` has a tick at each time
//!   `(j + φ_k) / w_k`, `j = 0, 1, ...`, its phase `φ_k` in `[0, 1)` drawn
//!   from `(seed, epoch, segment, k)` (stream `Mix`); position `p` is the
//!   `p`-th tick of all parts in time order (ties to the lower part), and
//!   draws the next sample of that part. Over any `L` consecutive positions
//!   part `k` is drawn `L w_k` times, give or take 1 plus the number of
//!   parts, so the proportions hold over an epoch and over every window of
//!   a few thousand samples alike. The draw is a pure function of
//!   `(seed, epoch, position)`: the same on 1 or N threads, in worker
//!   processes, and after a resume, which costs a binary search per part
//!   (no replay). Weights are fixed-point (their sum `2^40`) and times are
//!   compared exactly in integers, the same on every machine.
//! - **The epoch's end** ([`Stop`]): `Shortest`, the position where some
//!   part would have to start a second pass (no sample is drawn twice);
//!   `Longest`, the position after every part's first pass is done (the
//!   others start over, each pass shuffled anew); `Samples(n)`, `n / W`
//!   positions per rank (parts start over as they run out). Batches are
//!   cut from the positions as [`super::Split`] cuts a rank's share: the
//!   last one short, or dropped with `drop_last`. Every rank draws the same
//!   positions from the same parts, so ranks step in lockstep.
//!
//! # Resume, also elastic
//!
//! A position is all a resume needs. A run resumed on another world size
//! finishes the epoch with nothing repeated: the epoch's history of worlds
//! (`Segment`s of `(world_size, batches_done)`) says how many samples each
//! part gave on every rank in each world (the same on all of them), which
//! leave the part's pass (a map-style part's first `n * W` positions of the
//! pass; a sharded part's history of worlds, as its own plan keeps it); the
//! new world draws from what is left, with phases keyed by the new segment.
//! A pass's remainder that `W` does not divide (`R mod W` samples) is left
//! out of it, as `drop_last` leaves them out of a sharded plan.
//!
//! # Ids
//!
//! A drawn sample's id is `pass * T + offset_k + i`: `T` the samples of all
//! parts, `offset_k` those of the parts before `k`, `i` the sample's index
//! in its part (a map-style part's index, a sharded part's position in its
//! shards' stored order). Pass 0's ids are thus the parts laid end to end,
//! and no two draws of an epoch share an id; the id is the "dataset index"
//! of the seed rule (random crops).
//!
//! # Examples
//!
//! ```
//! use ferrofeed::plan::{MixConfig, MixPlan, Part, Plan, Stop};
//!
//! let config = MixConfig {
//!     parts: vec![Part::Map { len: 70 }, Part::Map { len: 30 }],
//!     weights: vec![0.7, 0.3],
//!     stop: Stop::Shortest,
//!     batch_size: 10,
//!     ..MixConfig::default()
//! };
//! let plan = MixPlan::new(&config, 0, &[], 0).unwrap();
//! let ids: Vec<u64> = plan.groups().flat_map(|g| g.ids).collect();
//! assert!(ids.len() >= 95);
//! let first = ids.iter().filter(|&&id| id < 70).count();
//! assert!((first as f64 / ids.len() as f64 - 0.7).abs() < 0.02);
//! ```

use std::sync::Mutex;

use super::interleave::Schedule;
use super::{check_start, check_world, MixError, Plan, PlanError, Segment, ShardPlan};
use super::{ShardPlanConfig, Split};
use crate::sampler::Permutation;
use crate::seed::{epoch_key, mix, Stream};

/// The fixed-point sum of the weights: each part's weight is a count of
/// `2^-40`ths.
const WEIGHT_BITS: u32 = 40;
/// The most samples of the parts and of an epoch: a tick's time is then
/// below `2^(48 + 32)` and its products with a weight below `2^120`
/// ([`Schedule`]).
const MAX_SAMPLES: u64 = 1 << 48;

/// Where a mixture's epoch ends (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// When some part would have to start its second pass.
    Shortest,
    /// When every part has finished its first pass.
    Longest,
    /// After this many samples across all ranks (`n / W` positions a rank).
    Samples(u64),
}

/// One source of a mixture, as its plan sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// A map-style dataset of `len` samples.
    Map {
        /// Its samples.
        len: u64,
    },
    /// A sharded source.
    Sharded {
        /// Samples in each shard, in stored order.
        counts: Vec<u64>,
        /// Its shuffle window, in samples.
        window: u64,
    },
}

impl Part {
    /// The part's samples.
    pub fn len(&self) -> u64 {
        match self {
            Part::Map { len } => *len,
            Part::Sharded { counts, .. } => counts.iter().sum(),
        }
    }

    /// Whether the part has no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A mixture: its parts, their weights, where an epoch ends, and the
/// loader's batch size, shuffle and world.
#[derive(Debug, Clone, PartialEq)]
pub struct MixConfig {
    /// The sources, in order.
    pub parts: Vec<Part>,
    /// Their weights (any scale; 0 leaves a part out).
    pub weights: Vec<f64>,
    /// Where an epoch ends.
    pub stop: Stop,
    /// Samples per batch (at least 1).
    pub batch_size: u64,
    /// Shuffle each part (and draw the interleave's phases from the seed).
    pub shuffle: bool,
    /// The seed.
    pub seed: u64,
    /// This process's rank, in `0..world_size`.
    pub rank: u64,
    /// The number of ranks (at least 1).
    pub world_size: u64,
    /// Drop a last, partial batch.
    pub drop_last: bool,
}

impl Default for MixConfig {
    /// No parts, stop at the shortest, batches of 1, no shuffle, one rank.
    fn default() -> Self {
        Self {
            parts: Vec::new(),
            weights: Vec::new(),
            stop: Stop::Shortest,
            batch_size: 1,
            shuffle: false,
            seed: 0,
            rank: 0,
            world_size: 1,
            drop_last: false,
        }
    }
}

impl MixConfig {
    /// The parts' weights in fixed point (summing to about `2^40`; 0 for a
    /// part left out), checked.
    ///
    /// # Errors
    ///
    /// [`MixError`] for a missing, negative, NaN or too small weight, all
    /// zero, or an empty part that would be drawn from.
    pub fn units(&self) -> Result<Vec<u64>, MixError> {
        if self.parts.is_empty() {
            return Err(MixError::NoParts);
        }
        if self.weights.len() != self.parts.len() {
            return Err(MixError::WeightCount {
                weights: self.weights.len(),
                parts: self.parts.len(),
            });
        }
        for (part, &weight) in self.weights.iter().enumerate() {
            if !weight.is_finite() || weight < 0.0 {
                return Err(MixError::BadWeight { part, weight });
            }
        }
        let total: f64 = self.weights.iter().sum();
        if total <= 0.0 {
            return Err(MixError::AllZero);
        }
        let one = f64::from(1u32 << 20) * f64::from(1u32 << (WEIGHT_BITS - 20));
        let mut units = Vec::with_capacity(self.weights.len());
        for (part, (&weight, p)) in self.weights.iter().zip(&self.parts).enumerate() {
            // In [0, 2^40]: the cast cannot truncate.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let unit = (weight / total * one).round() as u64;
            if weight > 0.0 && unit == 0 {
                return Err(MixError::WeightTooSmall { part, weight });
            }
            if unit > 0 && p.is_empty() {
                return Err(MixError::EmptyPart { part });
            }
            units.push(unit);
        }
        Ok(units)
    }

    /// The samples of all parts (`T` of the ids' rule).
    pub fn total(&self) -> u64 {
        self.parts.iter().map(Part::len).sum()
    }

    /// The seed of pass `pass` over part `part`.
    pub fn pass_seed(&self, part: usize, pass: u64) -> u64 {
        mix(self.seed, pass, part as u64, Stream::Source)
    }
}

/// Where one part stands at the start of a world: the pass it is in and
/// that pass's history of worlds (samples per rank in each).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Standing {
    pass: u64,
    history: Vec<Segment>,
    /// Samples of the pass taken by the history (`sum(n * W)`).
    taken: u64,
}

impl Standing {
    /// Samples of the current pass left to a rank of `world` ranks.
    fn rest(&self, len: u64, world: u64) -> u64 {
        (len - self.taken) / world
    }

    /// Moves on by `n` samples a rank drawn in a world of `world` ranks.
    fn advance(&mut self, len: u64, n: u64, world: u64) {
        let rest = self.rest(len, world);
        if n <= rest {
            if n > 0 {
                self.history.push(Segment {
                    world_size: world,
                    batches_done: n,
                });
                self.taken += n * world;
            }
            return;
        }
        let full = len / world;
        let over = n - rest;
        self.pass += 1 + over / full;
        let left = over % full;
        self.history.clear();
        self.taken = 0;
        if left > 0 {
            self.history.push(Segment {
                world_size: world,
                batches_done: left,
            });
            self.taken = left * world;
        }
    }
}

/// One epoch's batches of a mixture on one rank, from a resume point (see
/// the module docs for the rule).
#[derive(Debug)]
pub struct MixPlan {
    config: MixConfig,
    epoch: u64,
    schedule: Schedule,
    standings: Vec<Standing>,
    /// Samples each part gave a rank in the history's worlds (for figures).
    before: Vec<u64>,
    samples: u64,
    batches: u64,
    start: u64,
    /// The last sharded pass planned, per part (`batch` asks for the same
    /// pass's samples one by one).
    shard_plans: Mutex<Vec<Option<(u64, ShardPlan)>>>,
}

impl MixPlan {
    /// The plan of `epoch` after the worlds of `history`, starting at batch
    /// `start` of the current world.
    ///
    /// # Errors
    ///
    /// [`MixError`] for a config it cannot plan, a history that does not
    /// fit, or a `start` past the end.
    pub fn new(
        config: &MixConfig,
        epoch: u64,
        history: &[Segment],
        start: u64,
    ) -> Result<Self, MixError> {
        check_world(config.batch_size, config.rank, config.world_size)?;
        if config.stop == Stop::Samples(0) {
            return Err(MixError::ZeroSamples);
        }
        for samples in [
            config.total(),
            if let Stop::Samples(n) = config.stop {
                n
            } else {
                0
            },
        ] {
            if samples > MAX_SAMPLES {
                return Err(MixError::TooLarge { samples });
            }
        }
        let units = config.units()?;
        let mut standings = vec![
            Standing {
                pass: 0,
                history: Vec::new(),
                taken: 0,
            };
            config.parts.len()
        ];
        let mut before = vec![0; config.parts.len()];
        let mut drawn = 0; // samples across all ranks, for Stop::Samples
        for (g, seg) in history.iter().enumerate() {
            if seg.world_size == 0 {
                return Err(PlanError::ZeroWorldSize.into());
            }
            let schedule =
                Schedule::new(units.clone(), &phases(config, epoch, g as u64, units.len()));
            let samples = epoch_samples(config, &schedule, &standings, seg.world_size, drawn)?;
            let batches = batches_of(config, samples);
            if seg.batches_done > batches {
                return Err(MixError::BadHistory {
                    segment: g,
                    world_size: seg.world_size,
                    batches_done: seg.batches_done,
                    len: batches,
                });
            }
            let done = (seg.batches_done * config.batch_size).min(samples);
            let counts = schedule.counts_at(done);
            for (k, standing) in standings.iter_mut().enumerate() {
                standing.advance(config.parts[k].len(), counts[k], seg.world_size);
                before[k] += counts[k];
            }
            drawn += done * seg.world_size;
        }
        let segment = history.len() as u64;
        let schedule = Schedule::new(units, &phases(config, epoch, segment, config.parts.len()));
        let samples = epoch_samples(config, &schedule, &standings, config.world_size, drawn)?;
        let batches = batches_of(config, samples);
        check_start(start, batches)?;
        let plan = Self {
            config: config.clone(),
            epoch,
            schedule,
            standings,
            before,
            samples,
            batches,
            start,
            shard_plans: Mutex::new(vec![None; config.parts.len()]),
        };
        // The sharded parts' current passes, planned now so that a history
        // they refuse is refused here.
        for k in 0..plan.config.parts.len() {
            if matches!(plan.config.parts[k], Part::Sharded { .. }) && plan.schedule.unit(k) > 0 {
                let pass = plan.standings[k].pass;
                plan.with_shard_plan(k, pass, |_| ())?;
            }
        }
        Ok(plan)
    }

    /// The configuration.
    pub fn config(&self) -> &MixConfig {
        &self.config
    }

    /// The samples (positions) a rank draws in the current world.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// How many samples each part gave this rank in the epoch before
    /// position `p` of the current world (the history's worlds included).
    pub fn drawn(&self, p: u64) -> Vec<u64> {
        let counts = self.schedule.counts_at(p.min(self.samples));
        counts
            .iter()
            .zip(&self.before)
            .map(|(a, b)| a + b)
            .collect()
    }

    /// Where the `n`-th sample part `part` gives in the current world lies:
    /// `(pass, position in the pass's share of this rank)`.
    ///
    /// # Errors
    ///
    /// [`MixError::TooFewSamples`] when it would start a pass with fewer
    /// samples than ranks.
    pub fn locate(&self, part: usize, n: u64) -> Result<(u64, u64), MixError> {
        let (len, world) = (self.config.parts[part].len(), self.config.world_size);
        let standing = &self.standings[part];
        let rest = standing.rest(len, world);
        if n < rest {
            return Ok((standing.pass, n));
        }
        let full = len / world;
        if full == 0 {
            return Err(MixError::TooFewSamples {
                part,
                samples: len,
                world_size: world,
            });
        }
        let over = n - rest;
        Ok((standing.pass + 1 + over / full, over % full))
    }

    /// The history of worlds of pass `pass` over part `part` (samples per
    /// rank): the part's history for its current pass, none for a later
    /// one.
    pub fn pass_history(&self, part: usize, pass: u64) -> Vec<Segment> {
        let standing = &self.standings[part];
        if pass == standing.pass {
            standing.history.clone()
        } else {
            Vec::new()
        }
    }

    /// The config of the plan of pass `pass` over sharded part `part`
    /// (batches of one sample, `drop_last`, the pass's seed), as its reader
    /// needs it; `None` for a map-style part.
    pub fn shard_config(&self, part: usize, pass: u64) -> Option<ShardPlanConfig> {
        let Part::Sharded { counts, window } = &self.config.parts[part] else {
            return None;
        };
        let c = &self.config;
        Some(ShardPlanConfig {
            counts: counts.clone(),
            batch_size: 1,
            shuffle: c.shuffle,
            seed: c.pass_seed(part, pass),
            rank: c.rank,
            world_size: c.world_size,
            drop_last: true,
            window: *window,
        })
    }

    /// The sample id of the `j`-th sample of pass `pass` over part `part`
    /// on this rank (see the module docs).
    ///
    /// # Errors
    ///
    /// [`MixError::Shard`] when a sharded part's plan of the pass refuses.
    pub fn id(&self, part: usize, pass: u64, j: u64) -> Result<u64, MixError> {
        let c = &self.config;
        let offset: u64 = c.parts[..part].iter().map(Part::len).sum();
        let index = match &c.parts[part] {
            Part::Map { len } => {
                let taken = if pass == self.standings[part].pass {
                    self.standings[part].taken
                } else {
                    0
                };
                let at = taken + j * c.world_size + c.rank;
                if c.shuffle {
                    Permutation::new(*len, epoch_key(c.pass_seed(part, pass), self.epoch)).get(at)
                } else {
                    at
                }
            }
            Part::Sharded { .. } => self.with_shard_plan(part, pass, |plan| plan.batch(j)[0])?,
        };
        Ok(pass * c.total() + offset + index)
    }

    /// `f` of the plan of pass `pass` over sharded part `part`, made once
    /// per pass.
    fn with_shard_plan<R>(
        &self,
        part: usize,
        pass: u64,
        f: impl FnOnce(&ShardPlan) -> R,
    ) -> Result<R, MixError> {
        let mut plans = self
            .shard_plans
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let slot = &mut plans[part];
        if slot.as_ref().is_none_or(|(p, _)| *p != pass) {
            let config = self.shard_config(part, pass).expect("a sharded part");
            let plan = ShardPlan::new(&config, self.epoch, &self.pass_history(part, pass), 0)
                .map_err(|error| MixError::Shard { part, error })?;
            *slot = Some((pass, plan));
        }
        Ok(f(&slot.as_ref().expect("planned above").1))
    }

    /// The draws of positions `lo..hi`: each one's part, pass, position in
    /// the pass and id.
    ///
    /// # Errors
    ///
    /// [`MixError`] when a part cannot start a pass it needs.
    pub fn draws(&self, lo: u64, hi: u64) -> Result<Vec<Draw>, MixError> {
        let hi = hi.min(self.samples).max(lo);
        let mut counts = self.schedule.counts_at(lo);
        self.draws_on(&mut counts, hi - lo)
    }

    /// How many samples each part gives in the current world before
    /// position `p`: where [`MixPlan::draws_on`] starts from `p`.
    pub fn counts_at(&self, p: u64) -> Vec<u64> {
        self.schedule.counts_at(p.min(self.samples))
    }

    /// The next `n` draws after those `counts` says each part gave (see
    /// [`MixPlan::counts_at`]), which they then include: a walk through an
    /// epoch without a search per batch.
    ///
    /// # Errors
    ///
    /// [`MixError`] when a part cannot start a pass it needs.
    pub fn draws_on(&self, counts: &mut [u64], n: u64) -> Result<Vec<Draw>, MixError> {
        let parts = self.schedule.draws(counts, n);
        let mut out = Vec::with_capacity(parts.len());
        for part in parts {
            let (pass, j) = self.locate(part, counts[part])?;
            counts[part] += 1;
            out.push(Draw {
                part,
                pass,
                j,
                id: self.id(part, pass, j)?,
            });
        }
        Ok(out)
    }
}

/// One position's draw: its part, the pass over it, the position in that
/// pass's share of this rank, and the sample's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Draw {
    /// The part.
    pub part: usize,
    /// The pass over it.
    pub pass: u64,
    /// The position in the pass's share of this rank.
    pub j: u64,
    /// The sample's id (see the module docs).
    pub id: u64,
}

impl Plan for MixPlan {
    fn epoch(&self) -> u64 {
        self.epoch
    }

    fn batches(&self) -> u64 {
        self.batches
    }

    fn batches_per_pass(&self) -> u64 {
        self.batches
    }

    fn samples_per_rank(&self) -> u64 {
        self.samples
    }

    fn start(&self) -> u64 {
        self.start
    }

    fn batch_len(&self, batch_no: u64) -> u64 {
        let lo = batch_no * self.config.batch_size;
        (lo + self.config.batch_size).min(self.samples) - lo
    }

    fn resumed(&self, start: u64) -> Result<Self, PlanError> {
        check_start(start, self.batches)?;
        Ok(Self {
            config: self.config.clone(),
            epoch: self.epoch,
            schedule: self.schedule.clone(),
            standings: self.standings.clone(),
            before: self.before.clone(),
            samples: self.samples,
            batches: self.batches,
            start,
            shard_plans: Mutex::new(vec![None; self.config.parts.len()]),
        })
    }

    fn batch(&self, batch_no: u64) -> Vec<u64> {
        assert!(
            batch_no < self.batches,
            "batch {batch_no} of {}",
            self.batches
        );
        let lo = batch_no * self.config.batch_size;
        self.draws(lo, lo + self.batch_len(batch_no))
            .expect("the plan's passes were checked when it was made")
            .into_iter()
            .map(|d| d.id)
            .collect()
    }
}

/// The interleave's phases in world `segment` of `epoch`: part `k`'s is
/// `mix(key, 0, k, Mix)`, its key `mix(seed, epoch, segment, Mix)` (with
/// a shuffle; without, seed and epoch 0: the same interleave every epoch).
fn phases(config: &MixConfig, epoch: u64, segment: u64, parts: usize) -> Vec<u64> {
    let key = if config.shuffle {
        mix(config.seed, epoch, segment, Stream::Mix)
    } else {
        mix(0, 0, segment, Stream::Mix)
    };
    (0..parts as u64)
        .map(|k| mix(key, 0, k, Stream::Mix))
        .collect()
}

/// The batches of `samples` positions.
fn batches_of(config: &MixConfig, samples: u64) -> u64 {
    Split {
        samples,
        batch_size: config.batch_size,
        world_size: 1,
        drop_last: config.drop_last,
    }
    .batches()
}

/// The positions a rank draws in a world of `world` ranks, the parts
/// standing as `standings` say and `drawn` samples drawn by the worlds
/// before; checked that every part can give what it is asked.
fn epoch_samples(
    config: &MixConfig,
    schedule: &Schedule,
    standings: &[Standing],
    world: u64,
    drawn: u64,
) -> Result<u64, MixError> {
    let lens: Vec<u64> = config.parts.iter().map(Part::len).collect();
    let drawn_parts = (0..lens.len()).filter(|&k| schedule.unit(k) > 0);
    let samples = match config.stop {
        Stop::Samples(n) => n.saturating_sub(drawn) / world,
        Stop::Shortest => drawn_parts
            .map(|k| schedule.position(k, standings[k].rest(lens[k], world)))
            .min()
            .unwrap_or(0),
        Stop::Longest => drawn_parts
            .filter(|&k| standings[k].pass == 0 && standings[k].rest(lens[k], world) > 0)
            .map(|k| schedule.position(k, standings[k].rest(lens[k], world) - 1) + 1)
            .max()
            .unwrap_or(0),
    };
    let counts = schedule.counts_at(samples);
    for (k, &n) in counts.iter().enumerate() {
        if n > standings[k].rest(lens[k], world) && lens[k] / world == 0 {
            return Err(MixError::TooFewSamples {
                part: k,
                samples: lens[k],
                world_size: world,
            });
        }
    }
    Ok(samples)
}

#[cfg(test)]
mod tests;
