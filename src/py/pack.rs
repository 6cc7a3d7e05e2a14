//! The Python face of the pack ([`crate::pack`]): `_core._Packer`, which
//! `ferrofeed.write_shards` drives.
//!
//! An image folder's files go to [`run::pack_files`] as paths: their bytes
//! are read, checked and written by Rust threads with the GIL released and
//! never become Python objects. Other samples come in batches of tuples
//! (`add`), converted once. Every call that writes releases the GIL; the
//! progress callback takes it briefly, and a signal (Ctrl-C) raised there
//! stops the pack with the shard being written removed.

use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyString};

use crate::pack::run::{self, FileInput};
use crate::pack::{
    Dest, OnError, OutputFormat, PackError, PackOptions, Packer, Progress, Reencode, Sample, Value,
};

use super::errors::pack_error;

/// A sample as Python hands it over: key, path, `(field, value)` pairs.
type PySample = (Option<String>, Option<String>, Vec<(String, Py<PyAny>)>);

/// A field's value: bytes (or any buffer of bytes), str, int or float.
fn value(name: &str, v: &Bound<'_, PyAny>) -> PyResult<Value> {
    if let Ok(b) = v.cast::<PyBytes>() {
        return Ok(Value::Bytes(b.as_bytes().to_vec()));
    }
    if let Ok(s) = v.cast::<PyString>() {
        return Ok(Value::Text(s.to_str()?.to_owned()));
    }
    if v.is_instance_of::<PyBool>() || v.is_instance_of::<PyInt>() {
        return v.extract::<i64>().map(Value::Int).map_err(|_| {
            PyValueError::new_err(format!("field {name:?}: {v} does not fit in 64 bits"))
        });
    }
    if let Ok(f) = v.cast::<PyFloat>() {
        return Ok(Value::Float(f.value()));
    }
    Err(PyTypeError::new_err(format!(
        "field {name:?}: a {} is not bytes, str, int or float",
        v.get_type().name()?
    )))
}

/// The value of `given` among `options` (`(name, value)`), or a
/// `ValueError` naming the argument and the names it takes.
fn choice<T: Copy>(argument: &str, given: &str, options: &[(&str, T)]) -> PyResult<T> {
    options
        .iter()
        .find(|(name, _)| *name == given)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let names: Vec<String> = options.iter().map(|(n, _)| format!("{n:?}")).collect();
            PyValueError::new_err(format!(
                "{argument} must be one of {}, not {given:?}",
                names.join(", ")
            ))
        })
}

/// The progress as Python sees it.
fn progress_tuple(p: Progress) -> (u64, u64, u64, u64, u64) {
    (p.done, p.samples, p.bytes, p.skipped, p.shards)
}

/// The pack's writer (see `crate::pack::writer`).
#[pyclass(name = "_Packer", module = "ferrofeed._core")]
pub(crate) struct PyPacker {
    inner: Mutex<Option<Packer>>,
    workers: usize,
}

impl PyPacker {
    /// Runs `f` on the packer with the GIL released; an error drops the
    /// packer (the shard being written is removed; finished ones stay).
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Packer) -> Result<T, PackError> + Send,
    ) -> PyResult<T> {
        let result = py.detach(|| {
            let mut slot = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(packer) = slot.as_mut() else {
                return Err(None);
            };
            let r = f(packer);
            if r.is_err() {
                *slot = None;
            }
            r.map_err(Some)
        });
        result.map_err(|e| match e {
            Some(e) => pack_error(py, &e),
            None => PyRuntimeError::new_err("this pack is finished or failed"),
        })
    }
}

#[pymethods]
impl PyPacker {
    #[new]
    #[allow(clippy::too_many_arguments)] // write_shards' options, as Python passes them
    #[pyo3(signature = (dest, *, format, shard_size, samples_per_shard, workers, on_error, resize, quality, prefix, class_names, storage_options, input))]
    fn new(
        py: Python<'_>,
        dest: &str,
        format: &str,
        shard_size: Option<u64>,
        samples_per_shard: Option<u64>,
        workers: usize,
        on_error: &str,
        resize: Option<usize>,
        quality: u8,
        prefix: String,
        class_names: Option<Vec<String>>,
        mut storage_options: Vec<(String, String)>,
        input: &str,
    ) -> PyResult<Self> {
        let format = choice(
            "format",
            format,
            &[
                ("tar", OutputFormat::Tar),
                ("parquet", OutputFormat::Parquet),
            ],
        )?;
        let on_error = choice(
            "on_error",
            on_error,
            &[("raise", OnError::Raise), ("skip", OnError::Skip)],
        )?;
        let input: serde_json::Value = serde_json::from_str(input)
            .map_err(|e| PyValueError::new_err(format!("input: not JSON ({e})")))?;
        storage_options.sort();
        let options = PackOptions {
            format,
            shard_size,
            samples_per_shard,
            workers,
            on_error,
            reencode: resize.map(|shorter| Reencode { shorter, quality }),
            prefix,
            class_names,
        };
        let packer = py
            .detach(|| {
                let dest = Dest::open(dest, &storage_options)?;
                Packer::open(dest, options, &input)
            })
            .map_err(|e| pack_error(py, &e))?;
        Ok(Self {
            inner: Mutex::new(Some(packer)),
            workers: workers.max(1),
        })
    }

    /// The input position the pack goes on from.
    #[getter]
    fn resume_at(&self) -> PyResult<u64> {
        self.read(Packer::resume_at)
    }

    /// Whether the destination holds this whole pack already.
    #[getter]
    fn complete(&self) -> PyResult<bool> {
        self.read(|p| p.complete().is_some())
    }

    /// `(done, samples, bytes, skipped, shards)`.
    fn progress(&self) -> PyResult<(u64, u64, u64, u64, u64)> {
        self.read(|p| progress_tuple(p.progress()))
    }

    /// Packs the next samples, the first at input position `first`.
    fn add(&self, py: Python<'_>, samples: Vec<PySample>, first: u64) -> PyResult<()> {
        let mut converted = Vec::with_capacity(samples.len());
        for (key, path, fields) in samples {
            let fields = fields
                .iter()
                .map(|(name, v)| Ok((name.clone(), value(name, v.bind(py))?)))
                .collect::<PyResult<Vec<_>>>()?;
            converted.push(Sample { key, path, fields });
        }
        let workers = self.workers;
        self.with(py, move |p| run::pack_samples(converted, first, p, workers))
    }

    /// Packs image files (`paths[i]` stored as `stored[i]`, class
    /// `labels[i]`), from where the pack resumes; `report(done, samples,
    /// bytes, skipped, shards)` now and then.
    #[pyo3(signature = (paths, stored, labels, report=None))]
    fn add_files(
        &self,
        py: Python<'_>,
        paths: Vec<PathBuf>,
        stored: Vec<String>,
        labels: Option<Vec<i64>>,
        report: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        if stored.len() != paths.len() || labels.as_ref().is_some_and(|l| l.len() != paths.len()) {
            return Err(PyValueError::new_err(
                "paths, stored and labels differ in length",
            ));
        }
        let mut labels = labels.map(Vec::into_iter);
        let files: Vec<FileInput> = paths
            .into_iter()
            .zip(stored)
            .map(|(path, stored)| FileInput {
                path,
                stored,
                label: labels.as_mut().and_then(Iterator::next),
            })
            .collect();
        let workers = self.workers;
        // Called from the pack's thread, with the GIL taken again.
        let report: Option<Py<PyAny>> = report.map(|r| r.clone().unbind());
        let raised: Mutex<Option<PyErr>> = Mutex::new(None);
        let mut call = |p: Progress| {
            Python::attach(|py| {
                let r = py.check_signals().and_then(|()| match &report {
                    Some(cb) => cb.call1(py, progress_tuple(p)).map(drop),
                    None => Ok(()),
                });
                match r {
                    Ok(()) => true,
                    Err(e) => {
                        *raised.lock().unwrap_or_else(PoisonError::into_inner) = Some(e);
                        false
                    }
                }
            })
        };
        let result = self.with(py, |p| run::pack_files(&files, p, workers, &mut call));
        if let Some(e) = raised.lock().unwrap_or_else(PoisonError::into_inner).take() {
            return Err(e);
        }
        result
    }

    /// Finishes the pack (the last shard, the index) and returns its
    /// summary as a dict.
    fn finish<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let packer = self
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("this pack is finished or failed"))?;
        let s = py
            .detach(move || packer.finish())
            .map_err(|e| pack_error(py, &e))?;
        let d = PyDict::new(py);
        d.set_item("samples", s.samples)?;
        d.set_item("shards", s.shards)?;
        d.set_item("bytes", s.bytes)?;
        let skipped: Vec<(u64, String, String)> = s
            .skipped
            .into_iter()
            .map(|k| (k.position, k.name, k.reason))
            .collect();
        d.set_item("skipped", skipped)?;
        d.set_item("resumed", s.resumed)?;
        d.set_item("seconds", s.seconds)?;
        d.set_item("index", s.index)?;
        Ok(d)
    }

    /// Drops the pack without finishing it: the shard being written is
    /// removed; the finished ones and their records stay, for a resume.
    fn abort(&self, py: Python<'_>) {
        let packer = self
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        py.detach(move || drop(packer));
    }
}

impl PyPacker {
    /// `f` of the packer; never waits for a pack running on another thread
    /// (which may be waiting for the GIL this thread holds).
    fn read<T>(&self, f: impl FnOnce(&Packer) -> T) -> PyResult<T> {
        let slot = match self.inner.try_lock() {
            Ok(slot) => slot,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                return Err(PyRuntimeError::new_err(
                    "this pack is writing on another thread",
                ))
            }
        };
        slot.as_ref()
            .map(f)
            .ok_or_else(|| PyRuntimeError::new_err("this pack is finished or failed"))
    }
}

/// Adds the pack's classes to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPacker>()?;
    Ok(())
}
