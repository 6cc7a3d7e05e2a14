//! `ferrofeed._core.EpochPlan`: the Python face of [`crate::plan::map`].
//!
//! The `DataLoader` makes one per epoch and iterates it: each step is one
//! batch's `(batch_no, indices)`, computed in Rust. What every plan's class
//! shares is here too: the methods of the [`Plan`] trait
//! ([`plan_methods!`]: `__len__`, `epoch`, `start`, `batch`) and the
//! helpers ([`check_batch`], [`next_batch`], [`segments`]) that
//! `ShardPlan` (`shards.rs`) and `MixPlan` (`mix.rs`) use too.

use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::exceptions::PyIndexError;
use pyo3::prelude::*;

use crate::plan::{EpochPlan, Plan, PlanConfig, Segment};

/// The `#[pymethods]` of a plan's class `$class` (a struct whose `inner`
/// is the [`Plan`] `$inner`): the [`Plan`] trait's methods every plan's class shares, the
/// class's own number getters (`name => |plan| value`, each with its doc
/// comment), then the class's own items. `$what` names what a batch number
/// is out of, for the `IndexError` of `batch` and of the class's own
/// methods that take one (`checked(batch_no)`).
macro_rules! plan_methods {
    (
        $class:ident($inner:ty),
        $what:literal,
        getters { $($(#[$doc:meta])* $name:ident => |$p:ident| $value:expr),* $(,)? },
        { $($own:tt)* }
    ) => {
        #[pymethods]
        impl $class {
            /// Batches of the epoch on this rank, numbered `0..len` (those
            /// before `start` included; a sharded or mixed plan's: of the
            /// current world).
            fn __len__(&self) -> usize {
                usize::try_from(self.inner.batches()).unwrap_or(usize::MAX)
            }

            /// The epoch.
            #[getter]
            fn epoch(&self) -> u64 {
                self.inner.epoch()
            }

            /// The first batch the plan yields (the resume point).
            #[getter]
            fn start(&self) -> u64 {
                self.inner.start()
            }

            /// The ids of batch `batch_no` (a map-style plan's: dataset
            /// indices).
            fn batch(&self, batch_no: u64) -> PyResult<Vec<u64>> {
                Ok(self.checked(batch_no)?.batch(batch_no))
            }

            $(
                $(#[$doc])*
                #[getter]
                fn $name(&self) -> u64 {
                    let $p = &self.inner;
                    $value
                }
            )*

            $($own)*
        }

        impl $class {
            /// The plan, once `batch_no` is checked to be one of its
            /// batches (else `IndexError`).
            fn checked(&self, batch_no: u64) -> PyResult<&$inner> {
                super::plan::check_batch(&self.inner, batch_no, $what)?;
                Ok(&self.inner)
            }
        }
    };
}
pub(super) use plan_methods;

/// One epoch's batches on one rank: numbered groups of dataset indices.
#[pyclass(name = "EpochPlan", module = "ferrofeed._core", frozen)]
struct PyEpochPlan {
    inner: EpochPlan,
}

plan_methods!(PyEpochPlan(EpochPlan), "an epoch", getters {
    /// Batches from `start` to the end of the epoch.
    remaining => |p| p.remaining(),
    /// Samples each rank reads per pass over the data.
    samples_per_rank => |p| p.samples_per_rank(),
    /// Batches each rank yields per pass over the data.
    batches_per_pass => |p| p.batches_per_pass(),
}, {
    #[new]
    #[pyo3(signature = (
        len, batch_size, *, shuffle=false, seed=0, epoch=0, rank=0, world_size=1,
        drop_last=false, batches_per_epoch=None, start=0
    ))]
    #[allow(clippy::too_many_arguments)] // the loader's keywords
    fn new(
        len: u64,
        batch_size: u64,
        shuffle: bool,
        seed: u64,
        epoch: u64,
        rank: u64,
        world_size: u64,
        drop_last: bool,
        batches_per_epoch: Option<u64>,
        start: u64,
    ) -> PyResult<Self> {
        let config = PlanConfig {
            len,
            batch_size,
            shuffle,
            seed,
            rank,
            world_size,
            drop_last,
            batches_per_epoch,
        };
        Ok(Self {
            inner: EpochPlan::new(config, epoch, start)?,
        })
    }

    /// The number of samples in batch `batch_no` of the epoch.
    fn batch_len(&self, batch_no: u64) -> PyResult<u64> {
        Ok(self.checked(batch_no)?.batch_len(batch_no))
    }

    /// `(batch_no, indices)` for every batch from `start` on.
    fn __iter__(slf: Bound<'_, Self>) -> PyEpochPlanIter {
        let next = slf.get().inner.start();
        PyEpochPlanIter {
            plan: slf.unbind(),
            next: AtomicU64::new(next),
        }
    }

    fn __repr__(&self) -> String {
        let c = self.inner.config();
        format!(
            "EpochPlan(len={}, batch_size={}, shuffle={}, seed={}, epoch={}, rank={}, \
             world_size={}, drop_last={}, batches_per_epoch={}, start={})",
            c.len,
            c.batch_size,
            py_bool(c.shuffle),
            c.seed,
            self.inner.epoch(),
            c.rank,
            c.world_size,
            py_bool(c.drop_last),
            c.batches_per_epoch
                .map_or_else(|| "None".to_owned(), |b| b.to_string()),
            self.inner.start(),
        )
    }
});

/// `IndexError` unless `batch_no` is one of `plan`'s batches (`what`: the
/// epoch or the share it is not in, for the message).
pub(super) fn check_batch(plan: &impl Plan, batch_no: u64, what: &str) -> PyResult<()> {
    if batch_no < plan.batches() {
        Ok(())
    } else {
        Err(PyIndexError::new_err(format!(
            "batch {batch_no} is not in {what} of {} batches",
            plan.batches()
        )))
    }
}

/// The next batch a plan's iterator yields, counted in `next`, or `None`
/// past `plan`'s last batch (and from then on).
pub(super) fn next_batch(next: &AtomicU64, plan: &impl Plan) -> Option<u64> {
    let end = plan.batches();
    next.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
        (b < end).then_some(b + 1)
    })
    .ok()
}

/// An elastic history as Python gives it, `(world_size, batches_done)`
/// pairs, as the plans take it.
pub(super) fn segments(history: Vec<(u64, u64)>) -> Vec<Segment> {
    history
        .into_iter()
        .map(|(world_size, batches_done)| Segment::new(world_size, batches_done))
        .collect()
}

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// The iterator of an [`PyEpochPlan`].
#[pyclass(name = "EpochPlanIterator", module = "ferrofeed._core", frozen)]
struct PyEpochPlanIter {
    plan: Py<PyEpochPlan>,
    next: AtomicU64,
}

#[pymethods]
impl PyEpochPlanIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self) -> Option<(u64, Vec<u64>)> {
        let plan = &self.plan.get().inner;
        let batch_no = next_batch(&self.next, plan)?;
        Some((batch_no, plan.batch(batch_no)))
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEpochPlan>()?;
    m.add_class::<PyEpochPlanIter>()
}
