//! The Python face of the sharded sources ([`crate::shards`]) and their
//! plan ([`crate::plan::sharded`]).
//!
//! - `_core.ShardPlan`: one epoch's batches of a sharded source on one rank.
//! - `_core._ShardReader`: counts shards and reads windows of them, without
//!   the GIL (the readers run in Rust, on the caller's thread or on a few
//!   threads of their own for counting).
//! - `_core._ShardWindow`: the samples of one window, held in Rust; a sample
//!   becomes a Python dict only when a Python transform asks for it, and the
//!   native image chain takes image bytes straight from here
//!   (`plan_group`), so they never become Python objects.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::plan::{Plan, ShardPlan, ShardPlanConfig};
use crate::remote::{RemoteError, RemoteShards};
use crate::shards::index::SampleOffsets;
use crate::shards::jsonl::JsonLinesFormat;
use crate::shards::mds::MdsFormat;
use crate::shards::parquet::ParquetFormat;
use crate::shards::tar::TarFormat;
use crate::shards::{Sample, Shard, ShardError, ShardFormat, Value};

use super::errors::{shard_error, shard_exception, ShardClass};
use super::parallel::in_parallel;
use super::pipeline::{Item, PyPlanGroup};
use super::plan::{check_batch, next_batch, segments};
use super::remote::PyRemoteShards;
use super::samples::{tar_sample, to_py};

/// The format of a source's shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Tar,
    JsonLines,
    Parquet,
    Mds,
}

/// `(samples, first_key, last_key, damage)` of a shard, as `count` returns it.
type Counted = (
    u64,
    Option<String>,
    Option<String>,
    Option<(String, String)>,
);

/// Bytes of a remote Parquet file's tail fetched to count it: its footer, in
/// one GET for most files (a second one fetches a larger footer whole).
const PARQUET_TAIL: u64 = 64 << 10;

/// Where the shards' bytes are: local files, or remote objects fetched
/// through [`RemoteShards`].
#[derive(Clone)]
pub(super) struct Sources {
    kind: Kind,
    paths: Arc<Vec<PathBuf>>,
    remote: Option<Arc<RemoteShards>>,
    /// Each remote tar shard's sample offsets, from its folder's index
    /// (`crate::shards::index`): a window then fetches its samples' bytes
    /// alone.
    offsets: Option<Arc<Vec<SampleOffsets>>>,
}

impl Sources {
    fn remote_error(&self, shard: usize, e: Arc<RemoteError>) -> ShardError {
        ShardError::Remote {
            shard: self.paths[shard].clone(),
            source: e,
        }
    }

    /// Shard `shard` for counting: a Parquet file's footer alone, a whole
    /// tar or JSON lines shard (through the cache, if any).
    pub(super) fn for_count(&self, shard: usize) -> Result<Shard, ShardError> {
        let name = &self.paths[shard];
        let Some(remote) = &self.remote else {
            return Ok(Shard::file(name));
        };
        let fail = |e| self.remote_error(shard, Arc::new(e));
        if self.kind == Kind::Parquet {
            let (mut tail, size) = remote.tail(shard, PARQUET_TAIL).map_err(fail)?;
            // The footer's length is in the 4 bytes before the closing "PAR1".
            if let Some(at) = tail.len().checked_sub(8) {
                let footer = u64::from(u32::from_le_bytes(
                    tail[at..at + 4].try_into().expect("4 bytes"),
                ));
                let need = footer + 8;
                if need > tail.len() as u64 && need <= size {
                    tail = remote.tail(shard, need).map_err(fail)?.0;
                }
            }
            return Ok(Shard::tail(name, tail, size));
        }
        let bytes = remote.fetch_now(shard).map_err(fail)?;
        Ok(Shard::memory(name, bytes))
    }

    /// The pieces' samples fetched by their offsets, each a shard of its own
    /// whose sample 0 is the piece's `lo` (`index::fetch_pieces`).
    fn fetch_pieces(&self, pieces: &[(usize, u64, u64)]) -> Vec<Option<Result<Shard, ShardError>>> {
        match (&self.offsets, &self.remote) {
            (Some(o), Some(r)) => crate::shards::index::fetch_pieces(r, o, &self.paths, pieces),
            _ => pieces.iter().map(|_| None).collect(),
        }
    }

    /// Shard `shard` for reading: its file, or its bytes once fetched
    /// (blocking until they are).
    fn for_read(&self, shard: usize) -> Result<Shard, ShardError> {
        let name = &self.paths[shard];
        match &self.remote {
            None => Ok(Shard::file(name)),
            Some(remote) => match remote.get(shard) {
                Ok(bytes) => Ok(Shard::memory(name, bytes)),
                Err(e) => Err(self.remote_error(shard, e)),
            },
        }
    }
}

/// Counts shards and reads windows of them.
#[pyclass(name = "_ShardReader", module = "ferrofeed._core", frozen)]
pub(super) struct PyShardReader {
    kind: Kind,
    format: Arc<dyn ShardFormat>,
    pub(super) sources: Sources,
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
        if offsets.as_ref().is_some_and(|o| o.len() != paths.len()) {
            return Err(PyValueError::new_err("one entry of offsets per shard"));
        }
        let (kind, format): (Kind, Arc<dyn ShardFormat>) = match kind {
            "tar" => (Kind::Tar, Arc::new(TarFormat)),
            "jsonl" => (Kind::JsonLines, Arc::new(JsonLinesFormat)),
            "parquet" => (Kind::Parquet, Arc::new(ParquetFormat::new(columns))),
            "mds" => (Kind::Mds, Arc::new(MdsFormat)),
            other => {
                return Err(PyValueError::new_err(format!(
                    "unknown shard format {other:?}: 'tar', 'jsonl', 'parquet' or 'mds'"
                )))
            }
        };
        let remote = remote.map(|r| Arc::clone(&r.inner));
        if let Some(r) = &remote {
            if r.objects().len() != paths.len() {
                return Err(PyValueError::new_err(format!(
                    "{} remote shards for {} paths",
                    r.objects().len(),
                    paths.len()
                )));
            }
        }
        Ok(Self {
            kind,
            format,
            sources: Sources {
                kind,
                paths: Arc::new(paths),
                remote,
                offsets: offsets.map(Arc::new),
            },
            decode,
        })
    }

    /// `(samples, first_key, last_key, damage)` of every shard, counted on up
    /// to `threads` threads without the GIL; `damage` is `(at, message)` of a
    /// shard whose content breaks off (`samples` are those before it), else
    /// `None`. The first other error (in shard order) is raised, naming its
    /// shard.
    fn count(&self, py: Python<'_>, threads: usize) -> PyResult<Vec<Counted>> {
        let sources = self.sources.clone();
        let format = Arc::clone(&self.format);
        let results = py.detach(move || count_all(&*format, &sources, threads.max(1)));
        let mut out = Vec::with_capacity(results.len());
        for r in results {
            match r {
                Ok(info) => out.push((
                    info.samples,
                    info.first_key,
                    info.last_key,
                    info.damage.map(|d| (d.at, d.message)),
                )),
                Err(e) => return Err(shard_error(py, &e)),
            }
        }
        Ok(out)
    }

    /// Reads `pieces`, `(shard, lo, hi)` each, whose first samples have the
    /// global ids `first_ids`, into a window (without the GIL, the pieces on
    /// threads of their own side by side). Errors are kept per sample and
    /// raised when the sample is asked for.
    fn read(
        &self,
        py: Python<'_>,
        pieces: Vec<(usize, u64, u64)>,
        first_ids: Vec<u64>,
    ) -> PyResult<PyShardWindow> {
        if pieces.len() != first_ids.len() {
            return Err(PyValueError::new_err("one first id per piece"));
        }
        let paths = &self.sources.paths;
        for &(shard, lo, hi) in &pieces {
            if shard >= paths.len() || lo > hi {
                return Err(PyIndexError::new_err(format!(
                    "no piece {lo}..{hi} of shard {shard} (of {})",
                    paths.len()
                )));
            }
        }
        let sources = self.sources.clone();
        let format = Arc::clone(&self.format);
        let spans = py.detach(move || {
            let fetched = sources.fetch_pieces(&pieces);
            // The pieces are parsed side by side when their bytes are at hand (local
            // files; remote pieces all fetched by their index offsets): on a machine of
            // many cores, one thread parsing a window would feed fewer images a second
            // than the decode threads take. Whole remote shards are taken in the plan's
            // order (the prefetcher fetches ahead of the reader, on its own tasks).
            let threads = if sources.remote.is_some() && fetched.iter().any(Option::is_none) {
                1
            } else {
                piece_threads(pieces.len())
            };
            let fetched: Vec<Mutex<_>> = fetched.into_iter().map(Mutex::new).collect();
            in_parallel(pieces.len(), threads, |i| {
                let (shard, lo, hi) = pieces[i];
                // A fetched piece is a shard of its own, from its sample `lo`.
                let taken = fetched[i].lock().map(|mut f| f.take()).ok().flatten();
                let (data, base) = match taken {
                    Some(data) => (data, lo),
                    None => (sources.for_read(shard), 0),
                };
                read_piece(
                    &*format,
                    &sources,
                    (shard, lo, hi),
                    first_ids[i],
                    data,
                    base,
                )
            })
        });
        Ok(PyShardWindow {
            kind: self.kind,
            decode: self.decode,
            paths: Arc::clone(&self.sources.paths),
            spans,
        })
    }

    /// The shards' paths (or URLs).
    #[getter]
    fn paths(&self) -> Vec<String> {
        self.sources
            .paths
            .iter()
            .map(|p| p.display().to_string())
            .collect()
    }
}

impl PyShardReader {
    /// How many shards it reads.
    pub(super) fn shards(&self) -> usize {
        self.sources.paths.len()
    }
}

/// Counts every shard on up to `threads` threads; results in shard order.
fn count_all(
    format: &dyn ShardFormat,
    sources: &Sources,
    threads: usize,
) -> Vec<Result<crate::shards::ShardInfo, ShardError>> {
    in_parallel(sources.paths.len(), threads, |i| {
        sources.for_count(i).and_then(|shard| format.count(&shard))
    })
}

/// The threads a window's pieces are read on: one per piece, at most the
/// machine's cores and 8 (a piece is a file read or a fetch's wait plus
/// parsing; more threads than that only contend).
fn piece_threads(pieces: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    pieces.min(cores).min(8)
}

/// A sample of a window, or the error that kept it from being read. Behind a
/// lock of its own: the native chain takes its image bytes out (a move, not a
/// copy), while Python transforms only read it.
type Entry = Mutex<Result<Sample, Arc<ShardError>>>;

/// One piece of a window: the samples of a shard from global id `first`.
struct Span {
    first: u64,
    shard: usize,
    samples: Vec<Entry>,
}

/// Reads the piece `(shard, lo, hi)` from `data`, whose sample `base` is the
/// shard's sample 0 (a whole shard: 0; a piece fetched by its offsets: `lo`).
fn read_piece(
    format: &dyn ShardFormat,
    sources: &Sources,
    (shard, lo, hi): (usize, u64, u64),
    first: u64,
    data: Result<Shard, ShardError>,
    base: u64,
) -> Span {
    let n = (hi - lo) as usize;
    let path = &sources.paths[shard];
    let mut samples: Vec<Option<Result<Sample, Arc<ShardError>>>> = Vec::with_capacity(n);
    samples.resize_with(n, || None);
    let result = data.and_then(|data| {
        format.read(&data, lo - base, hi - base, &mut |k, sample| {
            if let Some(slot) = (k + base)
                .checked_sub(lo)
                .and_then(|i| samples.get_mut(i as usize))
            {
                *slot = Some(sample.map_err(Arc::new));
            }
        })
    });
    // What the reader did not deliver is lost with the error that ended it
    // (the rest of the shard), or, should a reader stop short without one,
    // with an error that says the shard changed.
    let lost = match result {
        Err(e) => Arc::new(e),
        Ok(()) => Arc::new(ShardError::Changed {
            shard: path.clone(),
            expected: hi,
            found: lo + samples.iter().filter(|s| s.is_some()).count() as u64,
        }),
    };
    Span {
        first,
        shard,
        samples: samples
            .into_iter()
            .map(|s| Mutex::new(s.unwrap_or_else(|| Err(Arc::clone(&lost)))))
            .collect(),
    }
}

/// The samples of one window of a sharded source, by global id.
#[pyclass(name = "_ShardWindow", module = "ferrofeed._core", frozen)]
struct PyShardWindow {
    kind: Kind,
    /// As the reader's.
    decode: bool,
    paths: Arc<Vec<PathBuf>>,
    spans: Vec<Span>,
}

impl PyShardWindow {
    fn entry(&self, id: u64) -> PyResult<(&Span, &Entry)> {
        for span in &self.spans {
            if let Some(i) = id.checked_sub(span.first) {
                if let Some(s) = span.samples.get(i as usize) {
                    return Ok((span, s));
                }
            }
        }
        Err(PyIndexError::new_err(format!(
            "sample {id} is not in this window"
        )))
    }

    fn shard_name(&self, span: &Span) -> String {
        self.paths[span.shard].display().to_string()
    }
}

#[pymethods]
impl PyShardWindow {
    /// Samples held.
    fn __len__(&self) -> usize {
        self.spans.iter().map(|s| s.samples.len()).sum()
    }

    /// Sample `id` as Python objects: a tar sample as a dict in the
    /// `WebDataset` layout (`__key__`, `__shard__`, one entry per extension,
    /// decoded by it), a Parquet row or an MDS sample as a dict of its
    /// columns, a JSON line as its parsed value. A sample that could not be
    /// read raises its error, naming the shard and where in it.
    fn sample<'py>(&self, py: Python<'py>, id: u64) -> PyResult<Bound<'py, PyAny>> {
        let (span, entry) = self.entry(id)?;
        let entry = lock(entry);
        let sample = entry.as_ref().map_err(|e| shard_error(py, e))?;
        let shard = self.shard_name(span);
        match self.kind {
            Kind::Tar => tar_sample(py, sample, &shard, self.decode),
            Kind::Parquet | Kind::Mds => {
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
            Kind::JsonLines => match sample.fields.as_slice() {
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
            .map(|(data, name, label)| Item::Bytes {
                data,
                name,
                label,
                pos: None,
            })
            .collect();
        Ok((PyPlanGroup::from_items(batch_no, kept, items), skipped))
    }
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
    ) -> PyResult<(Vec<u8>, String, Option<i64>)> {
        let (span, entry) = self.entry(id)?;
        let mut entry = lock(entry);
        let sample = entry.as_mut().map_err(|e| shard_error(py, e))?;
        let shard = self.shard_name(span);
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
            Value::Bytes(_) => {}
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
        let name = match self.kind {
            Kind::Tar => format!("{shard}: member {}.{field}", sample.key),
            _ => format!("{shard}: {at}, field {field:?}"),
        };
        // Taken, not copied: checked above to be bytes.
        let data = sample
            .fields
            .iter_mut()
            .find_map(|(k, v)| match v {
                Value::Bytes(b) if k == field => Some(std::mem::take(b)),
                _ => None,
            })
            .unwrap_or_default();
        Ok((data, name, label))
    }

    /// Where a sample is in its shard, for messages.
    fn place(&self, sample: &Sample) -> String {
        match self.kind {
            Kind::Tar => format!("sample {}", sample.key),
            _ => sample.key.clone(),
        }
    }
}

/// Locks a window's entry (a panic elsewhere cannot leave one half-written:
/// its lock is only held to read it or to take bytes out).
fn lock(entry: &Entry) -> std::sync::MutexGuard<'_, Result<Sample, Arc<ShardError>>> {
    entry
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
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
        Value::Bytes(_) => "bytes",
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

#[pymethods]
impl PyShardPlan {
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

    /// Batches in this rank's share of the current world (from its start).
    fn __len__(&self) -> usize {
        usize::try_from(self.inner.batches()).unwrap_or(usize::MAX)
    }

    /// The first batch the plan yields (the resume point).
    #[getter]
    fn start(&self) -> u64 {
        self.inner.start()
    }

    /// Samples this rank yields in the current world.
    #[getter]
    fn samples(&self) -> u64 {
        self.inner.samples_per_rank()
    }

    /// Samples left to all ranks of the current world (not batches, as
    /// `EpochPlan.remaining` counts: the Python name predates the trait).
    #[getter]
    fn remaining(&self) -> u64 {
        self.inner.remaining_samples()
    }

    /// Samples per window (a multiple of the batch size).
    #[getter]
    fn window(&self) -> u64 {
        self.inner.window()
    }

    /// Windows in this rank's share.
    #[getter]
    fn windows(&self) -> u64 {
        self.inner.windows()
    }

    /// The window of batch `batch_no`.
    fn window_of(&self, batch_no: u64) -> PyResult<u64> {
        check_batch(&self.inner, batch_no, "a share")?;
        Ok(self.inner.window_of(batch_no))
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

    /// The global ids of batch `batch_no`'s samples.
    fn batch(&self, batch_no: u64) -> PyResult<Vec<u64>> {
        check_batch(&self.inner, batch_no, "a share")?;
        Ok(self.inner.batch(batch_no))
    }

    /// `(batch_no, window, ids)` for every batch from `start` on.
    fn __iter__(slf: Bound<'_, Self>) -> PyShardPlanIter {
        let next = slf.get().inner.start();
        PyShardPlanIter {
            plan: slf.unbind(),
            next: AtomicU64::new(next),
        }
    }
}

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
    m.add_class::<PyShardWindow>()?;
    Ok(())
}
