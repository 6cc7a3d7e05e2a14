//! `ferrofeed._core.Permutation`, `shuffle_order` and `_ShuffleBuffer`:
//! the Python face of [`crate::sampler`], whose generators are the only
//! shuffles of ferrofeed (Python's `random` and `NumPy`'s generators make
//! none: their streams are not ours to pin).

use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyIterator;

use crate::sampler::{sample_seed, Permutation, ShuffleBuffer};
use crate::seed::{crop_seed, mix, Stream};

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

/// The stream named `name`, or a `ValueError` listing the names.
fn stream(name: &str) -> PyResult<Stream> {
    Stream::from_name(name).ok_or_else(|| {
        PyValueError::new_err(format!(
            "stream is one of {}, not {name:?}",
            Stream::NAMES.map(|n| format!("{n:?}")).join(", ")
        ))
    })
}

/// [`crate::seed::mix`]: the seed of item `index`'s draws of kind `stream`
/// (a name of [`Stream::NAMES`]) in `epoch` of a run seeded with `seed`.
#[pyfunction]
fn mix_seed(seed: u64, epoch: u64, index: u64, stream: &str) -> PyResult<u64> {
    Ok(mix(seed, epoch, index, self::stream(stream)?))
}

/// [`crate::seed::crop_seed`]: the seed of one image's random crop and flip.
#[pyfunction(name = "crop_seed")]
fn py_crop_seed(seed: u64, epoch: u64, index: u64) -> u64 {
    crop_seed(seed, epoch, index)
}

/// [`Permutation::seeded`], whole: the order of `range(n)` that item `index`
/// draws in `epoch` for shuffles of kind `stream`.
#[pyfunction]
#[pyo3(signature = (n, *, seed, epoch, index, stream))]
fn shuffle_order(n: u64, seed: u64, epoch: u64, index: u64, stream: &str) -> PyResult<Vec<u64>> {
    Ok(Permutation::seeded(n, seed, epoch, index, self::stream(stream)?).to_vec())
}

/// An iterator over `items` shuffled through a [`ShuffleBuffer`] of
/// `window` items, drawing from `(seed, epoch, index)`. An error of `items`
/// is raised, and ends the iteration.
#[pyclass(name = "_ShuffleBuffer", module = "ferrofeed._core")]
struct PyShuffleBuffer {
    /// The iterator read; `None` once it ended (or raised).
    items: Option<Py<PyIterator>>,
    buffer: ShuffleBuffer<Py<PyAny>>,
    /// What is left once `items` ended, in the order handed out (last first).
    rest: Vec<Py<PyAny>>,
}

#[pymethods]
impl PyShuffleBuffer {
    #[new]
    #[pyo3(signature = (items, window, *, seed, epoch, index))]
    fn new(
        items: &Bound<'_, PyAny>,
        window: usize,
        seed: u64,
        epoch: u64,
        index: u64,
    ) -> PyResult<Self> {
        Ok(Self {
            items: Some(items.try_iter()?.unbind()),
            buffer: ShuffleBuffer::new(window, seed, epoch, index),
            rest: Vec::new(),
        })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        while let Some(items) = &self.items {
            let next = items.bind(py).clone().next();
            match next {
                Some(Ok(item)) => {
                    if let Some(out) = self.buffer.push(item.unbind()) {
                        return Ok(Some(out));
                    }
                }
                None => {
                    self.items = None;
                    self.rest = self.buffer.drain();
                    self.rest.reverse();
                }
                Some(Err(e)) => {
                    self.items = None;
                    drop(self.buffer.drain());
                    return Err(e);
                }
            }
        }
        Ok(self.rest.pop())
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPermutation>()?;
    m.add_class::<PyShuffleBuffer>()?;
    m.add_function(wrap_pyfunction!(py_sample_seed, m)?)?;
    m.add_function(wrap_pyfunction!(py_crop_seed, m)?)?;
    m.add_function(wrap_pyfunction!(shuffle_order, m)?)?;
    m.add_function(wrap_pyfunction!(mix_seed, m)?)
}
