//! The map-style plan: which dataset indices each batch of an epoch holds,
//! on each rank.
//!
//! A loader's order is arithmetic on a few numbers: the dataset's length,
//! the batch size, the shuffle's `(seed, epoch)`, this rank's share of the
//! world, whether the uneven tail is dropped, and how many batches an epoch
//! has. [`EpochPlan`] does that arithmetic once, in one place, for every
//! executor (threads, worker processes, the native image chain): it yields
//! numbered groups `(batch_no, indices)`, and a batch keeps its number and
//! its indices from the plan to the consumer.
//!
//! # The rule
//!
//! - **Order.** Pass `p` over the data reads the dataset in the order of
//!   [`Permutation`] keyed by `(seed, p)` (or `0..n` without shuffling).
//! - **Ranks.** Each rank gets `samples_per_rank` samples of a pass: `n / W`
//!   rounded down with `drop_last`, up without it ([`Split::per_rank`]).
//!   Rank `r` takes positions
//!   `r, r + W, r + 2W, ...` of the pass's order; a position past the end
//!   wraps round to the start (the padding that keeps every rank's share
//!   the same size), so ranks never overlap within `n` and together cover
//!   the dataset.
//! - **Batches.** A rank's share is cut into batches of `batch_size`; with
//!   `drop_last` a last, partial batch is dropped, else it is kept short
//!   ([`Split::batches`]).
//! - **Epochs.** An epoch is one pass, or with `batches_per_epoch` exactly
//!   that many batches: epochs then continue where the previous one stopped
//!   and go round the data as often as needed (as `AllenNLP` defines it).
//! - **Resume.** A plan starts at any batch of its epoch (`start`): the
//!   batches it yields are exactly those the epoch would yield from there.
//!
//! Every rank gets the same number of batches, so ranks step in lockstep.
//!
//! # Examples
//!
//! ```
//! use ferrofeed::plan::{EpochPlan, Plan, PlanConfig};
//!
//! let config = PlanConfig { len: 10, batch_size: 4, ..PlanConfig::default() };
//! let plan = EpochPlan::new(config, 0, 0).unwrap();
//! let groups: Vec<_> = plan.groups().map(|g| (g.batch_no, g.ids)).collect();
//! assert_eq!(groups, vec![(0, vec![0, 1, 2, 3]), (1, vec![4, 5, 6, 7]), (2, vec![8, 9])]);
//! ```

use super::{check_start, check_world, Plan, PlanError, Split};
use crate::sampler::Permutation;

/// Everything of a loader's order but the epoch and the resume point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanConfig {
    /// Samples in the dataset.
    pub len: u64,
    /// Samples per batch (at least 1).
    pub batch_size: u64,
    /// Permute the order of every pass.
    pub shuffle: bool,
    /// The shuffle's seed.
    pub seed: u64,
    /// This process's rank, in `0..world_size`.
    pub rank: u64,
    /// The number of ranks (at least 1).
    pub world_size: u64,
    /// Cut every rank's share to `len / world_size` and drop a last,
    /// partial batch.
    pub drop_last: bool,
    /// A fixed number of batches per epoch (see the module docs).
    pub batches_per_epoch: Option<u64>,
}

impl Default for PlanConfig {
    /// An empty dataset, batches of 1, no shuffle, one rank.
    fn default() -> Self {
        Self {
            len: 0,
            batch_size: 1,
            shuffle: false,
            seed: 0,
            rank: 0,
            world_size: 1,
            drop_last: false,
            batches_per_epoch: None,
        }
    }
}

impl PlanConfig {
    /// Checks the numbers a plan needs.
    ///
    /// # Errors
    ///
    /// [`PlanError`] for a batch size, world size or `batches_per_epoch` of
    /// 0, or a rank outside the world.
    pub fn validate(&self) -> Result<(), PlanError> {
        check_world(self.batch_size, self.rank, self.world_size)?;
        if self.batches_per_epoch == Some(0) {
            return Err(PlanError::ZeroBatchesPerEpoch);
        }
        Ok(())
    }

    /// How a pass over the data is shared out over the ranks.
    pub fn split(&self) -> Split {
        Split {
            samples: self.len,
            batch_size: self.batch_size,
            world_size: self.world_size,
            drop_last: self.drop_last,
        }
    }

    /// Samples each rank reads per pass over the data (after padding or
    /// dropping).
    pub fn samples_per_rank(&self) -> u64 {
        self.split().per_rank()
    }

    /// Batches each rank yields per pass over the data.
    pub fn batches_per_pass(&self) -> u64 {
        self.split().batches()
    }

    /// Batches per epoch (0 when a rank's share cannot fill one).
    pub fn batches_per_epoch(&self) -> u64 {
        match self.batches_per_pass() {
            0 => 0,
            per_pass => self.batches_per_epoch.unwrap_or(per_pass),
        }
    }
}

/// One epoch's batches on one rank, from a resume point: numbered groups of
/// dataset indices (see the module docs for the rule).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochPlan {
    config: PlanConfig,
    epoch: u64,
    start: u64,
    batches: u64,
}

impl EpochPlan {
    /// The plan of `epoch`, starting at its batch `start` (0: the beginning).
    ///
    /// # Errors
    ///
    /// [`PlanError`] for a config that [`PlanConfig::validate`] refuses, or
    /// a `start` past the epoch's last batch (`start == batches()` is an
    /// epoch with nothing left).
    pub fn new(config: PlanConfig, epoch: u64, start: u64) -> Result<Self, PlanError> {
        config.validate()?;
        let batches = config.batches_per_epoch();
        check_start(start, batches)?;
        Ok(Self {
            config,
            epoch,
            start,
            batches,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &PlanConfig {
        &self.config
    }

    /// This rank's batch number `global` over all passes, split into the
    /// pass and the batch within it.
    fn locate(&self, batch_no: u64) -> (u64, u64) {
        let per_pass = self.config.batches_per_pass();
        let per_epoch = self.config.batches_per_epoch.unwrap_or(per_pass);
        let global = self.epoch * per_epoch + batch_no;
        (global / per_pass, global % per_pass)
    }
}

impl Plan for EpochPlan {
    fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Batches in the whole epoch (those before `start` included).
    fn batches(&self) -> u64 {
        self.batches
    }

    fn batches_per_pass(&self) -> u64 {
        self.config.batches_per_pass()
    }

    fn samples_per_rank(&self) -> u64 {
        self.config.samples_per_rank()
    }

    fn start(&self) -> u64 {
        self.start
    }

    fn batch_len(&self, batch_no: u64) -> u64 {
        assert!(
            batch_no < self.batches,
            "batch {batch_no} of {}",
            self.batches
        );
        let (_, b) = self.locate(batch_no);
        let first = b * self.config.batch_size;
        (first + self.config.batch_size).min(self.config.samples_per_rank()) - first
    }

    /// The dataset indices of batch `batch_no` of the epoch, in order.
    fn batch(&self, batch_no: u64) -> Vec<u64> {
        let count = self.batch_len(batch_no);
        let (pass, b) = self.locate(batch_no);
        let c = &self.config;
        let order = Permutation::new(c.len, Permutation::key(c.seed, pass));
        let first = b * c.batch_size;
        (first..first + count)
            .map(|k| {
                // Rank r takes positions r, r + W, ... of the pass's order;
                // past the end they wrap round to its start (padding).
                let position = (c.rank + k * c.world_size) % c.len;
                if c.shuffle {
                    order.get(position)
                } else {
                    position
                }
            })
            .collect()
    }

    fn resumed(&self, start: u64) -> Result<Self, PlanError> {
        check_start(start, self.batches)?;
        Ok(Self {
            start,
            ..self.clone()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Group;

    fn configs() -> impl Iterator<Item = PlanConfig> {
        let mut out = Vec::new();
        for len in [0_u64, 1, 2, 7, 10, 33, 64] {
            for batch_size in [1_u64, 3, 4, 10] {
                for shuffle in [false, true] {
                    for drop_last in [false, true] {
                        for world_size in [1_u64, 2, 3, 5] {
                            for bpe in [None, Some(1), Some(5)] {
                                for rank in 0..world_size {
                                    out.push(PlanConfig {
                                        len,
                                        batch_size,
                                        shuffle,
                                        seed: 11,
                                        rank,
                                        world_size,
                                        drop_last,
                                        batches_per_epoch: bpe,
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
        out.into_iter()
    }

    fn all(config: PlanConfig, epoch: u64) -> Vec<Group> {
        EpochPlan::new(config, epoch, 0).unwrap().groups().collect()
    }

    #[test]
    fn resume_at_every_batch_yields_the_rest() {
        for config in configs() {
            for epoch in [0, 3] {
                let whole = all(config, epoch);
                assert_eq!(whole.len() as u64, config.batches_per_epoch());
                for start in 0..=whole.len() {
                    let plan = EpochPlan::new(config, epoch, start as u64).unwrap();
                    let rest: Vec<_> = plan.groups().collect();
                    assert_eq!(
                        rest,
                        whole[start..],
                        "{config:?} epoch {epoch} from {start}"
                    );
                    assert_eq!(plan.remaining() as usize, whole.len() - start);
                }
            }
        }
    }

    #[test]
    fn batch_numbers_count_up_and_batches_are_full_but_the_last_of_a_pass() {
        for config in configs() {
            let per_pass = config.batches_per_pass();
            for (
                k,
                Group {
                    batch_no,
                    ids: indices,
                },
            ) in all(config, 2).into_iter().enumerate()
            {
                assert_eq!(batch_no, k as u64);
                assert!(indices.iter().all(|&i| i < config.len));
                let full = indices.len() as u64 == config.batch_size;
                if config.drop_last {
                    assert!(full, "{config:?}");
                } else if !full {
                    // Only a pass's last batch may be short.
                    let plan = EpochPlan::new(config, 2, 0).unwrap();
                    assert_eq!(plan.locate(batch_no).1, per_pass - 1, "{config:?}");
                }
            }
        }
    }

    #[test]
    fn ranks_cover_the_dataset_once_per_pass() {
        for config in configs().filter(|c| c.rank == 0 && c.batches_per_epoch.is_none()) {
            for epoch in [0, 1] {
                let mut seen = vec![0_u32; config.len as usize];
                let mut lens = Vec::new();
                for rank in 0..config.world_size {
                    let batches = all(PlanConfig { rank, ..config }, epoch);
                    lens.push(batches.len());
                    for Group { ids: indices, .. } in batches {
                        for i in indices {
                            seen[i as usize] += 1;
                        }
                    }
                }
                // Every rank steps in lockstep: the same number of batches.
                assert!(
                    lens.windows(2).all(|w| w[0] == w[1]),
                    "{config:?}: {lens:?}"
                );
                let total: u32 = seen.iter().sum();
                if config.drop_last {
                    // Each sample at most once, and all but the dropped tail.
                    assert!(seen.iter().all(|&s| s <= 1), "{config:?}");
                    let per_rank = config.samples_per_rank();
                    let kept = per_rank / config.batch_size * config.batch_size;
                    assert_eq!(u64::from(total), kept * config.world_size, "{config:?}");
                } else if config.len > 0 {
                    // Each sample at least once; only the padding repeats.
                    assert!(seen.iter().all(|&s| s >= 1), "{config:?}");
                    let padded = config.samples_per_rank() * config.world_size;
                    assert_eq!(u64::from(total), padded, "{config:?}");
                }
            }
        }
    }

    #[test]
    fn fixed_epochs_continue_where_the_last_stopped() {
        for config in configs().filter(|c| c.batches_per_epoch.is_some()) {
            let plain = PlanConfig {
                batches_per_epoch: None,
                ..config
            };
            let fixed: Vec<Vec<u64>> = (0..3)
                .flat_map(|e| all(config, e).into_iter().map(|g| g.ids))
                .collect();
            // The plain passes, in order, until they hold as many batches.
            let mut passes: Vec<Vec<u64>> = Vec::new();
            let mut pass = 0;
            while passes.len() < fixed.len() {
                passes.extend(all(plain, pass).into_iter().map(|g| g.ids));
                pass += 1;
            }
            assert_eq!(fixed, passes[..fixed.len()], "{config:?}");
        }
    }

    #[test]
    fn shuffling_depends_on_seed_and_epoch_only() {
        let config = PlanConfig {
            len: 100,
            batch_size: 10,
            shuffle: true,
            seed: 5,
            ..PlanConfig::default()
        };
        assert_eq!(all(config, 1), all(config, 1));
        assert_ne!(all(config, 1), all(config, 2));
        assert_ne!(all(config, 1), all(PlanConfig { seed: 6, ..config }, 1));
        let sorted = {
            let mut v: Vec<u64> = all(config, 1).into_iter().flat_map(|g| g.ids).collect();
            v.sort_unstable();
            v
        };
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn bad_configs_are_refused() {
        let ok = PlanConfig {
            len: 10,
            ..PlanConfig::default()
        };
        let bad = |c: PlanConfig| EpochPlan::new(c, 0, 0).unwrap_err();
        assert_eq!(
            bad(PlanConfig {
                batch_size: 0,
                ..ok
            }),
            PlanError::ZeroBatchSize
        );
        assert_eq!(
            bad(PlanConfig {
                world_size: 0,
                ..ok
            }),
            PlanError::ZeroWorldSize
        );
        assert_eq!(
            bad(PlanConfig { rank: 1, ..ok }),
            PlanError::RankOutOfRange {
                rank: 1,
                world_size: 1
            }
        );
        assert_eq!(
            bad(PlanConfig {
                batches_per_epoch: Some(0),
                ..ok
            }),
            PlanError::ZeroBatchesPerEpoch
        );
        assert_eq!(
            EpochPlan::new(ok, 0, 11).unwrap_err(),
            PlanError::StartPastEnd { start: 11, len: 10 }
        );
        assert_eq!(EpochPlan::new(ok, 0, 10).unwrap().remaining(), 0);
    }

    #[test]
    fn huge_datasets_start_at_once() {
        let config = PlanConfig {
            len: 1 << 40,
            batch_size: 256,
            shuffle: true,
            seed: 1,
            rank: 3,
            world_size: 8,
            ..PlanConfig::default()
        };
        let plan = EpochPlan::new(config, 7, (1 << 29) - 1).unwrap();
        let group = plan.groups().next().unwrap();
        assert_eq!(group.batch_no, (1 << 29) - 1);
        assert_eq!(group.ids.len(), 256);
    }
}
