//! `ferrofeed._core.EpochPlan`: the Python face of [`crate::plan::map`].
//!
//! The `DataLoader` makes one per epoch and iterates it: each step is one
//! batch's `(batch_no, indices)`, computed in Rust. The helpers below
//! ([`check_batch`], [`next_batch`]) serve every plan's class, `ShardPlan`'s
//! too (`shards.rs`).

use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::exceptions::PyIndexError;
use pyo3::prelude::*;

use crate::plan::{EpochPlan, Plan, PlanConfig, Segment};

/// One epoch's batches on one rank: numbered groups of dataset indices.
#[pyclass(name = "EpochPlan", module = "ferrofeed._core", frozen)]
struct PyEpochPlan {
    inner: EpochPlan,
}

#[pymethods]
impl PyEpochPlan {
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

    /// Batches in the whole epoch (those before `start` included).
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

    /// Batches from `start` to the end of the epoch.
    #[getter]
    fn remaining(&self) -> u64 {
        self.inner.remaining()
    }

    /// Samples each rank reads per pass over the data.
    #[getter]
    fn samples_per_rank(&self) -> u64 {
        self.inner.samples_per_rank()
    }

    /// Batches each rank yields per pass over the data.
    #[getter]
    fn batches_per_pass(&self) -> u64 {
        self.inner.batches_per_pass()
    }

    /// The dataset indices of batch `batch_no` of the epoch.
    fn batch(&self, batch_no: u64) -> PyResult<Vec<u64>> {
        check_batch(&self.inner, batch_no, "an epoch")?;
        Ok(self.inner.batch(batch_no))
    }

    /// The number of samples in batch `batch_no` of the epoch.
    fn batch_len(&self, batch_no: u64) -> PyResult<u64> {
        check_batch(&self.inner, batch_no, "an epoch")?;
        Ok(self.inner.batch_len(batch_no))
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
}

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
