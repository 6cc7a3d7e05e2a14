//! The Python face of the sharded sources ([`crate::shards`]) and their
//! plan ([`crate::plan::sharded`]).
//!
//! - `_core.ShardPlan`: one epoch's batches of a sharded source on one rank.
//! - `_core._ShardReader`: a [`ShardSet`] (a source's shards in one format,
//!   from the format registry), counted and read without the GIL.
//! - `_core._ShardFeed`: a [`WindowFeed`], one per loader over a source;
//!   `epoch(plan)` yields the plan's batches, each with its window, read a
//!   window ahead (and the next epoch's first window at an epoch's end) in
//!   the core.
//! - `_core._ShardWindow`: the samples of one window, held in Rust; a sample
//!   becomes a Python dict only when a Python transform asks for it, and the
//!   native image chain takes image bytes straight from here
//!   (`plan_group`), so they never become Python objects.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use pyo3::exceptions::{PyIndexError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::plan::{Plan, ShardPlan, ShardPlanConfig};
use crate::shards::index::SampleOffsets;
use crate::shards::lock_entry as lock;
use crate::shards::{
    registry, EpochWindows, FeedError, Sample, SampleLayout, ShardSet, ShardSetError, Value,
    Window, WindowFeed,
};

use super::errors::{remote_error, shard_error, shard_exception, ShardClass};
use super::pipeline::{Item, PyPlanGroup};
use super::plan::{next_batch, plan_methods, segments};
use super::remote::PyRemoteShards;
use super::samples::{tar_sample, to_py};

/// `(samples, first_key, last_key, damage)` of a shard, as `count` returns it.
type Counted = (
    u64,
    Option<String>,
    Option<String>,
    Option<(String, String)>,
);

/// A [`ShardSetError`] as Python's: a piece outside the shards is an
/// `IndexError`, the rest `ValueError`s.
fn set_error(e: &ShardSetError) -> PyErr {
    match e {
        ShardSetError::Piece { .. } => PyIndexError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// A [`FeedError`] as Python's.
fn feed_error(py: Python<'_>, e: &FeedError) -> PyErr {
    match e {
        FeedError::Remote(e) => remote_error(py, e),
        FeedError::Set(e) => set_error(e),
        FeedError::Plan { .. } => PyValueError::new_err(e.to_string()),
        FeedError::Runtime(_) | FeedError::Cancelled | FeedError::Panicked(_) => {
            PyRuntimeError::new_err(e.to_string())
        }
    }
}

/// A source's shards, counted and read.
#[pyclass(name = "_ShardReader", module = "ferrofeed._core", frozen)]
pub(super) struct PyShardReader {
    pub(super) set: Arc<ShardSet>,
    /// Whether a tar sample's fields are decoded (see `samples::tar_sample`).
    decode: bool,
}

#[pymethods]
impl PyShardReader {
    #[new]
    #[pyo3(signature = (kind, paths, columns=None, remote=None, decode=true, offsets=None))]
    fn new(
        kind: &str,
        paths: Vec<PathBuf>,
        columns: Option<Vec<String>>,
        remote: Option<PyRef<'_, PyRemoteShards>>,
        decode: bool,
        offsets: Option<Vec<SampleOffsets>>,
    ) -> PyResult<Self> {
        let format = registry::by_name(kind, columns).ok_or_else(|| {
            PyValueError::new_err(format!(
                "unknown shard format {kind:?}: {}",
                registry::names()
            ))
        })?;
        let remote = remote.map(|r| Arc::clone(&r.inner));
        let set = ShardSet::new(format, paths, remote, offsets).map_err(|e| set_error(&e))?;
        Ok(Self {
            set: Arc::new(set),
            decode,
        })
    }

    /// `(samples, first_key, last_key, damage)` of every shard, counted on up
    /// to `threads` threads without the GIL; `damage` is `(at, message)` of a
    /// shard whose content breaks off (`samples` are those before it), else
    /// `None`. The first other error (in shard order) is raised, naming its
    /// shard.
    fn count(&self, py: Python<'_>, threads: usize) -> PyResult<Vec<Counted>> {
        let set = Arc::clone(&self.set);
        let results = py.detach(move || set.count(threads));
        let mut out = Vec::with_capacity(results.len());
        for r in results {
            let info = r.map_err(|e| shard_error(py, &e))?;
            out.push((
                info.samples,
                info.first_key,
                info.last_key,
                info.damage.map(|d| (d.at, d.message)),
            ));
        }
        Ok(out)
    }

    /// Reads `pieces`, `(shard, lo, hi)` each, whose first samples have the
    /// global ids `first_ids`, into a window (without the GIL, the pieces on
    /// threads of their own side by side). Errors are kept per sample and
    /// raised when the sample is asked for.
    #[allow(clippy::needless_pass_by_value)] // pyo3 extracts owned arguments
    fn read(
        &self,
        py: Python<'_>,
        pieces: Vec<(usize, u64, u64)>,
        first_ids: Vec<u64>,
    ) -> PyResult<PyShardWindow> {
        let pieces: Vec<crate::plan::Piece> = pieces
            .into_iter()
            .map(|(shard, lo, hi)| crate::plan::Piece { shard, lo, hi })
            .collect();
        let set = Arc::clone(&self.set);
        let window = py
            .detach(move || set.read(&pieces, &first_ids))
            .map_err(|e| set_error(&e))?;
        Ok(self.window(Arc::new(window)))
    }

    /// Whether windows fetch their samples' byte ranges (remote, with an
    /// index), rather than whole shards fetched ahead.
    #[getter]
    fn ranged(&self) -> bool {
        self.set.ranged()
    }

    /// `(pieces served, bytes held)` of the pieces an indexed remote source's
    /// windows fetched, kept for later windows within `prefetch_bytes`.
    #[getter]
    fn kept(&self) -> (u64, u64) {
        self.set.kept_stats()
    }

    /// The shards' paths (or URLs).
    #[getter]
    fn paths(&self) -> Vec<String> {
        self.set
            .paths()
            .iter()
            .map(|p| p.display().to_string())
            .collect()
    }
}

impl PyShardReader {
    fn window(&self, window: Arc<Window>) -> PyShardWindow {
        PyShardWindow {
            layout: self.set.format().layout(),
            decode: self.decode,
            window,
        }
    }
}

/// A sharded source's windows read ahead of its batches, in its plan's
/// order: one per loader over the source (it keeps the next epoch's first
/// window between epochs).
#[pyclass(name = "_ShardFeed", module = "ferrofeed._core", frozen)]
struct PyShardFeed {
    reader: Py<PyShardReader>,
    feed: Arc<WindowFeed>,
}

#[pymethods]
impl PyShardFeed {
    /// `located`: fields whose bytes the windows leave in local plain tar
    /// shards' files, for the native image chain's decode threads to read
    /// (its image fields).
    #[new]
    #[pyo3(signature = (reader, located=Vec::new()))]
    fn new(reader: Bound<'_, PyShardReader>, located: Vec<String>) -> Self {
        let feed = Arc::new(WindowFeed::locating(Arc::clone(&reader.get().set), located));
        Self {
            reader: reader.unbind(),
            feed,
        }
    }

    /// `(batch_no, window_no, ids, window)` of each of `plan`'s batches from
    /// its start: window `w + 1` is read while window `w`'s batches are
    /// loaded; remote shards fetched whole are fetched ahead in the plan's
    /// order. With `read_ahead`, the next epoch's first window is read once
    /// the last one is reached.
    #[pyo3(signature = (plan, read_ahead=true))]
    fn epoch(
        &self,
        py: Python<'_>,
        plan: &PyShardPlan,
        read_ahead: bool,
    ) -> PyResult<PyShardEpoch> {
        let epoch = self
            .feed
            .epoch(plan.inner.clone(), read_ahead)
            .map_err(|e| feed_error(py, &e))?;
        Ok(PyShardEpoch {
            reader: self.reader.clone_ref(py),
            epoch: Mutex::new(Some(epoch)),
        })
    }

    /// Window reads started so far (each window once; the next epoch's
    /// first once, when read ahead).
    #[getter]
    fn reads(&self) -> u64 {
        self.feed.reads()
    }

    /// `(shard, lo, hi)` of each piece of the window read ahead for the
    /// next epoch, until an epoch takes it; else `None`.
    #[getter]
    fn ahead(&self) -> Option<Vec<(usize, u64, u64)>> {
        self.feed
            .ahead()
            .map(|pieces| pieces.iter().map(|p| (p.shard, p.lo, p.hi)).collect())
    }
}

/// A batch of an epoch as Python gets it: `(batch_no, window_no, ids, window)`.
type FedTuple = (u64, u64, Vec<u64>, PyShardWindow);

/// One epoch of a `_ShardFeed`: an iterator of `(batch_no, window_no, ids,
/// window)`.
#[pyclass(name = "_ShardEpoch", module = "ferrofeed._core", frozen)]
struct PyShardEpoch {
    reader: Py<PyShardReader>,
    /// `None` once ended or closed.
    epoch: Mutex<Option<EpochWindows>>,
}

#[pymethods]
impl PyShardEpoch {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next batch, waiting (without the GIL) for its window.
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<FedTuple>> {
        let next = py.detach(|| {
            let mut guard = self
                .epoch
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let next = guard.as_mut().and_then(Iterator::next);
            if !matches!(next, Some(Ok(_))) {
                *guard = None; // ended, or failed: its reads are dropped
            }
            next
        });
        match next {
            None => Ok(None),
            Some(Err(e)) => Err(feed_error(py, &e)),
            Some(Ok(batch)) => Ok(Some((
                batch.batch_no,
                batch.window_no,
                batch.ids,
                self.reader.get().window(batch.window),
            ))),
        }
    }

    /// Ends the epoch: reads not started are cancelled (the next epoch's
    /// first window, if read ahead, goes on).
    fn close(&self) {
        self.epoch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
    }
}

/// The samples of one window of a sharded source, by global id.
#[pyclass(name = "_ShardWindow", module = "ferrofeed._core", frozen)]
struct PyShardWindow {
    /// The format's.
    layout: SampleLayout,
    /// As the reader's.
    decode: bool,
    window: Arc<Window>,
}

impl PyShardWindow {
    /// Sample `id`'s shard (its name) and entry.
    fn entry(&self, id: u64) -> PyResult<(String, &crate::shards::Entry)> {
        self.window
            .entry(id)
            .map(|(path, entry)| (path.display().to_string(), entry))
            .ok_or_else(|| PyIndexError::new_err(format!("sample {id} is not in this window")))
    }
}

#[pymethods]
impl PyShardWindow {
    /// Samples held.
    fn __len__(&self) -> usize {
        self.window.len()
    }

    /// Sample `id` as Python objects: a tar sample as a dict in the
    /// `WebDataset` layout (`__key__`, `__shard__`, one entry per extension,
    /// decoded by it), a Parquet row or an MDS sample as a dict of its
    /// columns, a JSON line as its parsed value. A sample that could not be
    /// read raises its error, naming the shard and where in it.
    fn sample<'py>(&self, py: Python<'py>, id: u64) -> PyResult<Bound<'py, PyAny>> {
        let (shard, entry) = self.entry(id)?;
        let entry = lock(entry);
        let sample = entry.as_ref().map_err(|e| shard_error(py, e))?;
        match self.layout {
            SampleLayout::Members => tar_sample(py, sample, &shard, self.decode),
            SampleLayout::Columns => {
                let d = PyDict::new(py);
                for (k, v) in &sample.fields {
                    let value = to_py(py, v).map_err(|e| {
                        let at = format!("{}, column {k:?}", sample.key);
                        let message = format!("{shard}: {at}: {}", e.value(py));
                        shard_exception(py, ShardClass::Corrupt, &message, &shard, Some(&at))
                    })?;
                    d.set_item(k, value)?;
                }
                Ok(d.into_any())
            }
            SampleLayout::Value => match sample.fields.as_slice() {
                [(k, v)] if k.is_empty() => to_py(py, v),
                fields => {
                    let d = PyDict::new(py);
                    for (k, v) in fields {
                        d.set_item(k, to_py(py, v)?)?;
                    }
                    Ok(d.into_any())
                }
            },
        }
    }

    /// A native group of batch `batch_no` for the image chain: each
    /// sample's image bytes (the first of the fields `image` it has) and
    /// its integer label (field `label`), never made Python objects.
    /// Returns `(group, skipped)`: with `skip`, a sample that cannot be read
    /// or lacks a field is left out and listed as `(id, reason)`; without,
    /// its error is raised.
    #[pyo3(signature = (batch_no, ids, image, label=None, skip=false))]
    #[allow(clippy::needless_pass_by_value)] // pyo3 extracts owned arguments
    fn plan_group(
        &self,
        py: Python<'_>,
        batch_no: u64,
        ids: Vec<u64>,
        image: Vec<String>,
        label: Option<String>,
        skip: bool,
    ) -> PyResult<(PyPlanGroup, Vec<(u64, String)>)> {
        let mut kept = Vec::with_capacity(ids.len());
        let mut found = Vec::with_capacity(ids.len());
        let mut skipped = Vec::new();
        for id in ids {
            match self.image_item(py, id, &image, label.as_deref()) {
                Ok(item) => {
                    kept.push(id);
                    found.push(item);
                }
                Err(e) if skip => {
                    let name = e
                        .get_type(py)
                        .name()
                        .map_or_else(|_| "ShardError".to_owned(), |n| n.to_string());
                    skipped.push((id, format!("{name}: {}", e.value(py))));
                }
                Err(e) => return Err(e),
            }
        }
        let items = found
            .into_iter()
            .map(|(data, name, label)| match data {
                ImageData::Bytes(data) => Item::Bytes {
                    data,
                    name,
                    label,
                    pos: None,
                },
                ImageData::Located(at) => Item::Located { at, name, label },
            })
            .collect();
        Ok((PyPlanGroup::from_items(batch_no, kept, items), skipped))
    }
}

/// A sample's image for the native chain: its bytes, read with the window,
/// or where they are in the shard's file (read by the decode thread).
enum ImageData {
    Bytes(Vec<u8>),
    Located(crate::fs::FileRange),
}

impl PyShardWindow {
    /// Sample `id`'s image bytes, their name for errors, and its label. The
    /// bytes are taken out of the window (each sample of a window goes into
    /// one batch, once): the batch decodes the very buffer the shard was read
    /// into.
    fn image_item(
        &self,
        py: Python<'_>,
        id: u64,
        image: &[String],
        label: Option<&str>,
    ) -> PyResult<(ImageData, String, Option<i64>)> {
        let (shard, entry) = self.entry(id)?;
        let mut entry = lock(entry);
        let sample = entry.as_mut().map_err(|e| shard_error(py, e))?;
        let at = self.place(sample);
        let missing = |what: &str, names: &str| {
            let have: Vec<&str> = sample.fields.iter().map(|(k, _)| k.as_str()).collect();
            shard_exception(
                py,
                ShardClass::Field,
                &format!(
                    "{shard}: {at}: no {what} field {names} (the sample has: {})",
                    if have.is_empty() {
                        "nothing".to_owned()
                    } else {
                        have.join(", ")
                    }
                ),
                &shard,
                Some(&at),
            )
        };
        let Some((field, value)) = image
            .iter()
            .find_map(|name| sample.get(name).map(|v| (name, v)))
        else {
            return Err(missing("image", &quoted(image)));
        };
        match value {
            Value::Bytes(_) | Value::Located(_) => {}
            other => {
                return Err(shard_exception(
                    py,
                    ShardClass::Corrupt,
                    &format!(
                        "{shard}: {at}: field {field:?} holds {}, not image bytes",
                        value_kind(other)
                    ),
                    &shard,
                    Some(&at),
                ))
            }
        }
        let label = match label {
            None => None,
            Some(names) => {
                // `names`: one field, or alternatives as "cls;label" (the first the
                // sample has).
                let Some((name, v)) = names
                    .split(';')
                    .filter(|n| !n.is_empty())
                    .find_map(|n| sample.get(n).map(|v| (n, v)))
                else {
                    let names: Vec<String> = names
                        .split(';')
                        .filter(|n| !n.is_empty())
                        .map(str::to_owned)
                        .collect();
                    return Err(missing("label", &quoted(&names)));
                };
                Some(int_label(v).ok_or_else(|| {
                    shard_exception(
                        py,
                        ShardClass::Corrupt,
                        &format!(
                            "{shard}: {at}: label field {name:?} is not an integer ({})",
                            describe_value(v)
                        ),
                        &shard,
                        Some(&at),
                    )
                })?)
            }
        };
        let name = match self.layout {
            SampleLayout::Members => format!("{shard}: member {}.{field}", sample.key),
            _ => format!("{shard}: {at}, field {field:?}"),
        };
        // Taken, not copied: checked above to be bytes (or where they are).
        let data = sample
            .fields
            .iter_mut()
            .find_map(|(k, v)| match v {
                Value::Bytes(b) if k == field => Some(ImageData::Bytes(std::mem::take(b))),
                Value::Located(at) if k == field => Some(ImageData::Located(at.clone())),
                _ => None,
            })
            .unwrap_or(ImageData::Bytes(Vec::new()));
        Ok((data, name, label))
    }

    /// Where a sample is in its shard, for messages.
    fn place(&self, sample: &Sample) -> String {
        match self.layout {
            SampleLayout::Members => format!("sample {}", sample.key),
            _ => sample.key.clone(),
        }
    }
}

fn quoted(names: &[String]) -> String {
    names
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(" or ")
}

fn value_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a bool",
        Value::Int(_) => "an int",
        Value::Float(_) => "a float",
        Value::Str(_) => "text",
        Value::Bytes(_) | Value::Located(_) => "bytes",
        Value::List(_) => "a list",
        Value::Map(_) => "a map",
        Value::UInt(_) => "an int beyond 64 bits",
        Value::Json(_) => "JSON",
        Value::Array(_) => "an array",
    }
}

fn describe_value(v: &Value) -> String {
    match v {
        Value::Bytes(b) => format!("{:?}", String::from_utf8_lossy(&b[..b.len().min(40)])),
        Value::Str(s) => format!("{:?}", &s[..s.len().min(40)]),
        other => value_kind(other).to_owned(),
    }
}

/// An integer label from a field: an int, or text or bytes holding one
/// (a tar's `cls` member).
fn int_label(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::Str(s) => s.trim().parse().ok(),
        Value::Bytes(b) => std::str::from_utf8(b).ok()?.trim().parse().ok(),
        _ => None,
    }
}

/// One epoch's batches of a sharded source on one rank (see
/// [`crate::plan::sharded`]).
#[pyclass(name = "ShardPlan", module = "ferrofeed._core", frozen)]
struct PyShardPlan {
    inner: ShardPlan,
}

plan_methods!(PyShardPlan(ShardPlan), "a share", getters {
    /// Samples this rank yields in the current world.
    samples => |p| p.samples_per_rank(),
    /// Samples left to all ranks of the current world (not batches, as
    /// `EpochPlan.remaining` counts: the Python name predates the trait).
    remaining => |p| p.remaining_samples(),
    /// Samples per window (a multiple of the batch size).
    window => |p| p.window(),
    /// Windows in this rank's share.
    windows => |p| p.windows(),
}, {
    #[new]
    #[pyo3(signature = (
        counts, batch_size, *, shuffle=false, seed=0, epoch=0, rank=0, world_size=1,
        drop_last=false, window=1024, history=Vec::new(), start=0
    ))]
    #[allow(clippy::too_many_arguments)] // the loader's keywords
    fn new(
        counts: Vec<u64>,
        batch_size: u64,
        shuffle: bool,
        seed: u64,
        epoch: u64,
        rank: u64,
        world_size: u64,
        drop_last: bool,
        window: u64,
        history: Vec<(u64, u64)>,
        start: u64,
    ) -> PyResult<Self> {
        let config = ShardPlanConfig {
            counts,
            batch_size,
            shuffle,
            seed,
            rank,
            world_size,
            drop_last,
            window,
        };
        Ok(Self {
            inner: ShardPlan::new(&config, epoch, &segments(history), start)?,
        })
    }

    /// The window of batch `batch_no`.
    fn window_of(&self, batch_no: u64) -> PyResult<u64> {
        Ok(self.checked(batch_no)?.window_of(batch_no))
    }

    /// `(shard, lo, hi)` of each piece of window `window`, in stream order.
    fn window_pieces(&self, window: u64) -> PyResult<Vec<(usize, u64, u64)>> {
        if window >= self.inner.windows() {
            return Err(PyIndexError::new_err(format!(
                "window {window} is not in a share of {} windows",
                self.inner.windows()
            )));
        }
        Ok(self
            .inner
            .window_pieces(window)
            .into_iter()
            .map(|p| (p.shard, p.lo, p.hi))
            .collect())
    }

    /// `(batch_no, window, ids)` for every batch from `start` on.
    fn __iter__(slf: Bound<'_, Self>) -> PyShardPlanIter {
        let next = slf.get().inner.start();
        PyShardPlanIter {
            plan: slf.unbind(),
            next: AtomicU64::new(next),
        }
    }
});

/// The iterator of a [`PyShardPlan`].
#[pyclass(name = "ShardPlanIterator", module = "ferrofeed._core", frozen)]
struct PyShardPlanIter {
    plan: Py<PyShardPlan>,
    next: AtomicU64,
}

#[pymethods]
impl PyShardPlanIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self) -> Option<(u64, u64, Vec<u64>)> {
        let plan = &self.plan.get().inner;
        let j = next_batch(&self.next, plan)?;
        Some((j, plan.window_of(j), plan.batch(j)))
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyShardPlan>()?;
    m.add_class::<PyShardPlanIter>()?;
    m.add_class::<PyShardReader>()?;
    m.add_class::<PyShardFeed>()?;
    m.add_class::<PyShardEpoch>()?;
    m.add_class::<PyShardWindow>()?;
    Ok(())
}
