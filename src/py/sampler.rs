//! `ferrofeed._core.Permutation`: the Python face of [`crate::sampler`].

use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;

use crate::sampler::{sample_seed, Permutation};
use crate::seed::{mix, Stream};

/// A seekable pseudo-random permutation of `range(n)`, keyed by
/// `(seed, epoch)`, or the identity when `shuffle` is false.
#[pyclass(name = "Permutation", module = "ferrofeed._core", frozen)]
struct PyPermutation {
    inner: Permutation,
    shuffle: bool,
}

#[pymethods]
impl PyPermutation {
    #[new]
    #[pyo3(signature = (n, *, seed=0, epoch=0, shuffle=true))]
    fn new(n: u64, seed: u64, epoch: u64, shuffle: bool) -> Self {
        Self {
            inner: Permutation::new(n, Permutation::key(seed, epoch)),
            shuffle,
        }
    }

    fn __len__(&self) -> usize {
        usize::try_from(self.inner.len()).unwrap_or(usize::MAX)
    }

    /// The element at position `i` (negative counts from the end).
    fn __getitem__(&self, i: i64) -> PyResult<u64> {
        let n = self.inner.len();
        let pos = if i < 0 {
            i128::from(n) + i128::from(i)
        } else {
            i128::from(i)
        };
        match u64::try_from(pos) {
            Ok(p) if p < n => Ok(self.get(p)),
            _ => Err(PyIndexError::new_err(format!(
                "position {i} out of range(0, {n})"
            ))),
        }
    }

    /// Elements at positions `start, start + stride, ...` below `end`, taken
    /// modulo `len()` (so a range past the end wraps around to the start:
    /// that is how ranks pad a shard).
    #[pyo3(signature = (start, end, stride=1))]
    fn take(&self, start: u64, end: u64, stride: u64) -> PyResult<Vec<u64>> {
        let n = self.inner.len();
        if stride == 0 {
            return Err(PyValueError::new_err("stride must be at least 1"));
        }
        if n == 0 {
            return Ok(Vec::new());
        }
        Ok((start..end)
            .step_by(usize::try_from(stride).unwrap_or(usize::MAX))
            .map(|p| self.get(p % n))
            .collect())
    }
}

impl PyPermutation {
    fn get(&self, p: u64) -> u64 {
        if self.shuffle {
            self.inner.get(p)
        } else {
            p
        }
    }
}

/// The seed of one sample's random augmentations, from the loader's seed,
/// the epoch and the sample's index (see [`crate::sampler::sample_seed`]).
#[pyfunction(name = "sample_seed")]
fn py_sample_seed(seed: u64, epoch: u64, index: u64) -> u64 {
    sample_seed(seed, epoch, index)
}

/// [`crate::seed::mix`]: the seed of item `index`'s draws of kind `stream`
/// (`"sample"`, `"crop"` or `"flip"`) in `epoch` of a run seeded with `seed`.
#[pyfunction]
fn mix_seed(seed: u64, epoch: u64, index: u64, stream: &str) -> PyResult<u64> {
    let stream = Stream::from_name(stream).ok_or_else(|| {
        PyValueError::new_err(format!(
            "stream is \"sample\", \"crop\" or \"flip\", not {stream:?}"
        ))
    })?;
    Ok(mix(seed, epoch, index, stream))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPermutation>()?;
    m.add_function(wrap_pyfunction!(py_sample_seed, m)?)?;
    m.add_function(wrap_pyfunction!(mix_seed, m)?)
}
