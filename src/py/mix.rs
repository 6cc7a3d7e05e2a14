//! `ferrofeed._core.MixPlan`: the Python face of [`crate::plan::mix`].
//!
//! A `ferrofeed.Mix` given to a `DataLoader` makes one per epoch (and per
//! world of an elastic resume): iterating it yields each batch's ids and
//! the part each id was drawn from, walked in Rust without a search per
//! batch; the loader reads the sharded parts' samples with their own
//! plans, which `locate`, `pass_seed` and `pass_history` describe.

use std::sync::Mutex;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::plan::{next_batch, plan_methods, segments};
use crate::plan::{MixConfig, MixError, MixPlan, Part, Plan, Stop};

impl From<MixError> for PyErr {
    /// Every [`MixError`] is an argument that does not fit: `ValueError`.
    #[cold]
    fn from(err: MixError) -> PyErr {
        PyValueError::new_err(err.to_string())
    }
}

/// One part as Python gives it: a map-style part's length, or a sharded
/// part's `(counts, window)`.
#[derive(FromPyObject)]
enum PyPart {
    Map(u64),
    Sharded(Vec<u64>, u64),
}

/// Where an epoch ends, as Python gives it: `"shortest"`, `"longest"` or
/// a number of samples.
#[derive(FromPyObject)]
enum PyStop {
    Samples(u64),
    Named(String),
}

/// One epoch's batches of a mixture on one rank.
#[pyclass(name = "MixPlan", module = "ferrofeed._core", frozen)]
struct PyMixPlan {
    inner: MixPlan,
}

plan_methods!(PyMixPlan(MixPlan), "an epoch", getters {
    /// Samples a rank draws in the current world.
    samples => |p| p.samples(),
    /// The samples of all parts (`T`: pass `q`'s ids start at `q * T`).
    total => |p| p.config().total(),
}, {
    #[new]
    #[pyo3(signature = (
        parts, weights, stop, batch_size, *, shuffle=false, seed=0, epoch=0, rank=0,
        world_size=1, drop_last=false, history=Vec::new(), start=0
    ))]
    #[allow(clippy::too_many_arguments)] // the loader's keywords
    fn new(
        parts: Vec<PyPart>,
        weights: Vec<f64>,
        stop: PyStop,
        batch_size: u64,
        shuffle: bool,
        seed: u64,
        epoch: u64,
        rank: u64,
        world_size: u64,
        drop_last: bool,
        history: Vec<(u64, u64)>,
        start: u64,
    ) -> PyResult<Self> {
        let stop = match stop {
            PyStop::Samples(n) => Stop::Samples(n),
            PyStop::Named(name) if name == "shortest" => Stop::Shortest,
            PyStop::Named(name) if name == "longest" => Stop::Longest,
            PyStop::Named(name) => {
                return Err(PyValueError::new_err(format!(
                    "stop must be 'shortest', 'longest' or a number of samples, not {name:?}"
                )))
            }
        };
        let parts = parts
            .into_iter()
            .map(|p| match p {
                PyPart::Map(len) => Part::Map { len },
                PyPart::Sharded(counts, window) => Part::Sharded { counts, window },
            })
            .collect();
        let config = MixConfig {
            parts,
            weights,
            stop,
            batch_size,
            shuffle,
            seed,
            rank,
            world_size,
            drop_last,
        };
        Ok(Self {
            inner: MixPlan::new(&config, epoch, &segments(history), start)?,
        })
    }

    /// How many samples each part gave before position `p` of the current
    /// world.
    fn counts_at(&self, p: u64) -> Vec<u64> {
        self.inner.counts_at(p)
    }

    /// How many samples each part gave this rank in the epoch before
    /// position `p` of the current world, earlier worlds included.
    fn drawn(&self, p: u64) -> Vec<u64> {
        self.inner.drawn(p)
    }

    /// `(pass, position in the pass)` of the `n`-th sample part `part`
    /// gives in the current world.
    fn locate(&self, part: usize, n: u64) -> PyResult<(u64, u64)> {
        self.check_part(part)?;
        Ok(self.inner.locate(part, n)?)
    }

    /// The seed of pass `pass_no` over part `part`.
    fn pass_seed(&self, part: usize, pass_no: u64) -> PyResult<u64> {
        self.check_part(part)?;
        Ok(self.inner.config().pass_seed(part, pass_no))
    }

    /// The `(world_size, samples per rank)` worlds pass `pass_no` over part
    /// `part` ran on before the current one.
    fn pass_history(&self, part: usize, pass_no: u64) -> PyResult<Vec<(u64, u64)>> {
        self.check_part(part)?;
        Ok(self
            .inner
            .pass_history(part, pass_no)
            .into_iter()
            .map(|s| (s.world_size, s.batches_done))
            .collect())
    }

    /// `(batch_no, ids, parts)` for every batch from `start` on.
    fn __iter__(slf: Bound<'_, Self>) -> PyMixPlanIter {
        let plan = slf.get();
        let start = plan.inner.start();
        let counts = plan.inner.counts_at(start * plan.inner.config().batch_size);
        PyMixPlanIter {
            plan: slf.unbind(),
            next: std::sync::atomic::AtomicU64::new(start),
            counts: Mutex::new(counts),
        }
    }
});

impl PyMixPlan {
    fn check_part(&self, part: usize) -> PyResult<()> {
        let parts = self.inner.config().parts.len();
        if part < parts {
            Ok(())
        } else {
            Err(pyo3::exceptions::PyIndexError::new_err(format!(
                "part {part} is not one of {parts}"
            )))
        }
    }
}

/// One batch as the iterator yields it: its number, its ids, and the part
/// each id was drawn from.
type Batch = (u64, Vec<u64>, Vec<usize>);

/// The iterator of a [`PyMixPlan`]: the draws walked on from each batch to
/// the next.
#[pyclass(name = "MixPlanIterator", module = "ferrofeed._core", frozen)]
struct PyMixPlanIter {
    plan: Py<PyMixPlan>,
    next: std::sync::atomic::AtomicU64,
    /// What each part gave before the next batch.
    counts: Mutex<Vec<u64>>,
}

#[pymethods]
impl PyMixPlanIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self) -> PyResult<Option<Batch>> {
        let plan = &self.plan.get().inner;
        let mut counts = self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(batch_no) = next_batch(&self.next, plan) else {
            return Ok(None);
        };
        let draws = plan.draws_on(&mut counts, plan.batch_len(batch_no))?;
        Ok(Some((
            batch_no,
            draws.iter().map(|d| d.id).collect(),
            draws.iter().map(|d| d.part).collect(),
        )))
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyMixPlan>()?;
    m.add_class::<PyMixPlanIter>()
}
