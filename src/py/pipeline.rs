//! `ferrofeed._core.Pipeline` and the native ops: the Python face of
//! [`crate::pipeline`].
//!
//! Items are [`Item`]s: a Python object, or a native value that native ops
//! produce and consume without the GIL and that becomes a Python object
//! only at the sink.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyIterator, PyList, PyRange, PyRangeMethods, PyTuple};

use crate::pipeline::{
    format_table, AccumulateStage, AggregateStage, AsyncItemFn, CombineFn, DisaggregateStage,
    ErrorPolicy, Failure, FailureKind, FlushFn, ItemFn, MapStage, Next, Pipeline, PipelineConfig,
    ReportFn, SessionFn, SkipHook, Source, SplitFn, Stage, StageTimeout, Stall, StallFn,
    StallWatch, StatsReporter, StatsSnapshot, TimeoutErrorFn, Work,
};

/// Bumped in every child right after a fork (see `_after_fork_in_child`):
/// a pipeline built in another generation belongs to the parent.
static FORK_GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn fork_generation() -> u64 {
    FORK_GENERATION.load(std::sync::atomic::Ordering::Acquire)
}

/// Registered with `os.register_at_fork(after_in_child=...)` by the package.
#[pyfunction]
fn _after_fork_in_child() {
    FORK_GENERATION.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
}

/// The threads the process keeps for native work, which outlive every
/// pipeline: `(runtime threads, runtime tasks not finished, CPU pool
/// threads)`. The runtime's threads are its workers and its blocking-pool
/// threads (those idle for 10 s end); its tasks are the stage tasks of the
/// pipelines now running (none once every pipeline is stopped). Each count
/// is 0 until the runtime or pool is first used in this process. For tests
/// that tell these threads from threads a pipeline left behind.
#[pyfunction]
fn _native_threads() -> (usize, usize, usize) {
    (
        crate::pipeline::runtime::threads(),
        crate::pipeline::runtime::alive_tasks(),
        crate::cpu::threads(),
    )
}

/// The number of threads of the process's CPU pool (made now if it was
/// not yet): the most batch-decode jobs that run at once.
#[pyfunction]
fn _cpu_pool_size() -> usize {
    crate::cpu::pool_threads()
}

/// How long `__next__` waits without the GIL before checking for signals.
const WAIT_SLICE: Duration = Duration::from_millis(50);

/// An item travelling through a pipeline.
pub(crate) enum Item {
    /// A Python object.
    Py(Py<PyAny>),
    /// A native integer (from a native range source).
    Int(i64),
    /// A native group (from `aggregate` over native items).
    List(Vec<Item>),
    /// A file path, with an optional label (from a source of paths).
    Path {
        path: std::path::PathBuf,
        label: Option<i64>,
    },
    /// Encoded bytes (a file's content), named for errors.
    Bytes {
        data: Vec<u8>,
        name: String,
        label: Option<i64>,
    },
    /// A decoded image.
    Image {
        image: crate::image::DecodedImage,
        name: String,
        label: Option<i64>,
    },
    /// A collated batch of images, and their labels.
    Batch {
        images: crate::staging::Tensor,
        labels: Option<crate::staging::Tensor>,
    },
    /// A batch made by `DataLoader`'s batch op: its number in the epoch and
    /// the dataset indices of its items, the images that decoded (none when
    /// every one failed), their labels, and the items left out under
    /// `on_error="skip"` as (dataset index, reason).
    Loaded {
        batch_no: u64,
        indices: Vec<u64>,
        images: Option<crate::staging::Tensor>,
        labels: Option<crate::staging::Tensor>,
        skipped: Vec<(u64, String)>,
    },
}

impl Item {
    /// What kind of item this is, for error messages.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Item::Py(_) => "a Python object",
            Item::Int(_) => "an int",
            Item::List(_) => "a list",
            Item::Path { .. } => "a path",
            Item::Bytes { .. } => "bytes",
            Item::Image { .. } => "a decoded image",
            Item::Batch { .. } | Item::Loaded { .. } => "a batch",
        }
    }

    /// A native item for a Python source object when there is one: a path
    /// (`str` or `os.PathLike`), encoded `bytes`, or either paired with an
    /// int label; else the object itself.
    pub(crate) fn from_source(obj: Bound<'_, PyAny>) -> Item {
        fn plain(obj: &Bound<'_, PyAny>, label: Option<i64>) -> Option<Item> {
            if let Ok(b) = obj.cast::<pyo3::types::PyBytes>() {
                return Some(Item::Bytes {
                    data: b.as_bytes().to_vec(),
                    name: "<bytes>".into(),
                    label,
                });
            }
            let is_path = obj.is_instance_of::<pyo3::types::PyString>()
                || obj
                    .hasattr(pyo3::intern!(obj.py(), "__fspath__"))
                    .unwrap_or(false);
            if !is_path {
                return None;
            }
            let path: std::path::PathBuf = obj.extract().ok()?;
            Some(Item::Path { path, label })
        }
        if let Ok(t) = obj.cast::<PyTuple>() {
            if t.len() == 2 {
                if let (Ok(first), Ok(label)) = (
                    t.get_item(0),
                    t.get_item(1).and_then(|l| l.extract::<i64>()),
                ) {
                    if let Some(item) = plain(&first, Some(label)) {
                        return item;
                    }
                }
            }
        }
        // A list of paths or bytes (with labels): a native group, as
        // `DataLoader` hands its batches of files to the batch op.
        if let Ok(list) = obj.cast::<PyList>() {
            if !list.is_empty() {
                let items: Vec<Item> = list
                    .iter()
                    .map(Item::from_source)
                    .take_while(|i| !matches!(i, Item::Py(_)))
                    .collect();
                if items.len() == list.len() {
                    return Item::List(items);
                }
            }
        }
        plain(&obj, None).unwrap_or_else(|| Item::Py(obj.unbind()))
    }

    /// The item as a Python object (at the sink, or for a Python stage).
    pub(crate) fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let labelled = |obj: Bound<'_, PyAny>, label: Option<i64>| -> PyResult<Py<PyAny>> {
            Ok(match label {
                Some(l) => PyTuple::new(py, [obj, l.into_pyobject(py)?.into_any()])?
                    .into_any()
                    .unbind(),
                None => obj.unbind(),
            })
        };
        Ok(match self {
            Item::Py(o) => o,
            Item::Int(i) => i.into_pyobject(py)?.into_any().unbind(),
            Item::Path { path, label } => labelled(path.into_pyobject(py)?.into_any(), label)?,
            Item::Bytes { data, label, .. } => {
                labelled(pyo3::types::PyBytes::new(py, &data).into_any(), label)?
            }
            Item::Image { image, label, .. } => {
                let tensor = image_tensor(py, &image)?;
                labelled(Bound::new(py, tensor)?.into_any(), label)?
            }
            Item::Batch { images, labels } => {
                let images = Bound::new(py, super::dlpack::PyTensor::new(images))?.into_any();
                match labels {
                    Some(l) => PyTuple::new(
                        py,
                        [
                            images,
                            Bound::new(py, super::dlpack::PyTensor::new(l))?.into_any(),
                        ],
                    )?
                    .into_any()
                    .unbind(),
                    None => images.unbind(),
                }
            }
            Item::Loaded {
                batch_no,
                indices,
                images,
                labels,
                skipped,
            } => {
                let tensor = |t: Option<crate::staging::Tensor>| -> PyResult<Bound<'_, PyAny>> {
                    Ok(match t {
                        Some(t) => Bound::new(py, super::dlpack::PyTensor::new(t))?.into_any(),
                        None => py.None().into_bound(py),
                    })
                };
                let skipped = PyList::new(py, skipped)?.into_any();
                let batch_no = batch_no.into_pyobject(py)?.into_any();
                let indices = PyList::new(py, indices)?.into_any();
                PyTuple::new(
                    py,
                    [batch_no, indices, tensor(images)?, tensor(labels)?, skipped],
                )?
                    .into_any()
                    .unbind()
            }
            Item::List(items) => {
                let list = PyList::empty(py);
                for it in items {
                    list.append(it.into_py(py)?)?;
                }
                list.into_any().unbind()
            }
        })
    }
}

/// A decoded image as a `(H, W, C)` uint8 tensor from the default pool.
fn image_tensor(
    py: Python<'_>,
    image: &crate::image::DecodedImage,
) -> PyResult<super::dlpack::PyTensor> {
    let pool = super::staging::pool_or_default(py, None)?;
    let mut t = crate::staging::Tensor::empty(
        &pool,
        &[image.height, image.width, image.channels],
        crate::dlpack::DType::U8,
    )?;
    t.bytes_mut()
        .expect("a new tensor has no other owner")
        .copy_from_slice(&image.data);
    Ok(super::dlpack::PyTensor::new(t))
}

/// What `ops.decode_image` and `ops.collate` were made with: the
/// `DataLoader`'s batch op (`py/ops.rs`) is built from them. It lives here,
/// with the ops that carry it, so that this module never names `ops`.
#[derive(Clone, Copy)]
pub(crate) enum OpConfig {
    /// `decode_image`: the image spec, and the seed the user gave (if any).
    Decode {
        spec: crate::image::spec::ImageSpec,
        seed: Option<u64>,
    },
    /// `collate`: the layout and dtype of the batch.
    Collate(crate::image::batch::Layout),
}

/// A native stage: Rust code run on items without the GIL.
#[pyclass(name = "NativeOp", module = "ferrofeed._core", frozen)]
pub(crate) struct PyNativeOp {
    name: String,
    /// Run on the blocking pool (CPU-heavy) rather than inline.
    blocking: bool,
    f: ItemFn<Item, PyErr>,
    /// For a grouping op (`collate`): the group size, `drop_last`, and how
    /// a group becomes one item.
    group: Option<(usize, bool, CombineFn<Item, PyErr>)>,
    /// What the op was made with, when another op is built from it
    /// (`DataLoader`'s batch op takes `decode_image`'s and `collate`'s).
    config: Option<OpConfig>,
}

#[pymethods]
impl PyNativeOp {
    /// The op's name (the default stage name).
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// For a grouping op (`ops.collate`), the number of items per group (0
    /// when none was given: a `DataLoader` then uses its batch size).
    #[getter]
    fn group_size(&self) -> Option<usize> {
        self.group.as_ref().map(|g| g.0)
    }

    /// For a grouping op, whether a short last group is dropped.
    #[getter]
    fn drop_last(&self) -> Option<bool> {
        self.group.as_ref().map(|g| g.1)
    }

    /// `ops.decode_image`'s image spec (`None` for other ops).
    #[getter]
    fn spec(&self) -> Option<super::spec::PyImageSpec> {
        match self.config {
            Some(OpConfig::Decode { spec, .. }) => Some(super::spec::PyImageSpec(spec)),
            _ => None,
        }
    }

    /// `ops.decode_image`'s `seed=` (`None` when none was given, and for
    /// other ops).
    #[getter]
    fn seed(&self) -> Option<u64> {
        match self.config {
            Some(OpConfig::Decode { seed, .. }) => seed,
            _ => None,
        }
    }

    /// `ops.collate`'s batch layout (`None` for other ops).
    #[getter]
    fn layout(&self) -> Option<super::spec::PyBatchLayout> {
        match self.config {
            Some(OpConfig::Collate(layout)) => Some(super::spec::PyBatchLayout(layout)),
            _ => None,
        }
    }

    fn __repr__(&self) -> String {
        format!("<ferrofeed native op {}>", self.name)
    }
}

impl PyNativeOp {
    pub(crate) fn new(name: &str, blocking: bool, f: ItemFn<Item, PyErr>) -> Self {
        Self {
            name: name.to_owned(),
            blocking,
            f,
            group: None,
            config: None,
        }
    }

    /// The op, remembering what it was made with.
    pub(crate) fn with_config(mut self, config: OpConfig) -> Self {
        self.config = Some(config);
        self
    }

    /// What the op was made with (see [`PyNativeOp::with_config`]).
    pub(crate) fn config(&self) -> Option<OpConfig> {
        self.config
    }

    /// For a grouping op, its group size (0: none given) and `drop_last`.
    pub(crate) fn grouping(&self) -> Option<(usize, bool)> {
        self.group.as_ref().map(|g| (g.0, g.1))
    }

    /// A grouping op: `size` items (fewer at the end unless `drop_last`)
    /// become one through `combine`.
    pub(crate) fn aggregate(
        name: &str,
        size: usize,
        drop_last: bool,
        combine: CombineFn<Item, PyErr>,
    ) -> Self {
        Self {
            name: name.to_owned(),
            blocking: false,
            f: Arc::new(|_| {
                Err(pyo3::exceptions::PyTypeError::new_err(
                    "a grouping op is used with PipelineBuilder.pipe(), which makes it an aggregate stage",
                ))
            }),
            group: Some((size, drop_last, combine)),
            config: None,
        }
    }
}

/// `ops.identity()`: passes items through unchanged (natively).
#[pyfunction]
fn _op_identity() -> PyNativeOp {
    PyNativeOp::new("identity", false, Arc::new(|item| Ok(Some(item))))
}

/// A Python iterator pulled on the source thread, several items per GIL
/// acquisition.
struct PySource {
    iter: Py<PyIterator>,
    /// Turn paths and bytes into native items (the first stage is native).
    native: bool,
}

impl PySource {
    fn convert(&self, v: Bound<'_, PyAny>) -> Item {
        if self.native {
            Item::from_source(v)
        } else {
            Item::Py(v.unbind())
        }
    }
}

impl Source<Item, PyErr> for PySource {
    fn next_batch(&mut self, max: usize, out: &mut Vec<Item>) -> PyResult<bool> {
        self.next_batch_offering(max, out, &mut Some)
    }

    /// Pulls up to `max` items in one GIL acquisition, offering each as it
    /// comes: an iterator that is slow to yield (a stream, a queue) has each
    /// item go on as soon as it is pulled, not when a batch is full.
    fn next_batch_offering(
        &mut self,
        max: usize,
        out: &mut Vec<Item>,
        offer: &mut dyn FnMut(Item) -> Option<Item>,
    ) -> PyResult<bool> {
        Python::attach(|py| {
            let mut it = self.iter.bind(py).clone();
            for _ in 0..max {
                let Some(v) = it.next() else {
                    return Ok(false);
                };
                let item = self.convert(v?);
                if out.is_empty() {
                    // Refused (the queue is full): the engine sends it, and
                    // what follows, when the GIL is let go.
                    out.extend(offer(item));
                } else {
                    out.push(item);
                }
            }
            Ok(true)
        })
    }
}

/// A native range of integers: no GIL at all.
struct RangeSource {
    next: i64,
    stop: i64,
    step: i64,
}

impl Source<Item, PyErr> for RangeSource {
    fn next_batch(&mut self, max: usize, out: &mut Vec<Item>) -> PyResult<bool> {
        for _ in 0..max {
            let more = if self.step > 0 {
                self.next < self.stop
            } else {
                self.next > self.stop
            };
            if !more {
                return Ok(false);
            }
            out.push(Item::Int(self.next));
            self.next = match self.next.checked_add(self.step) {
                Some(n) => n,
                None => self.stop,
            };
        }
        Ok(true)
    }
}

fn logger(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static LOGGER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    LOGGER
        .get_or_try_init(py, || {
            Ok::<_, PyErr>(
                py.import("logging")?
                    .call_method1("getLogger", ("ferrofeed.pipeline",))?
                    .unbind(),
            )
        })
        .map(|l| l.bind(py))
}

/// Calls a Python callable on an item, with the GIL, on the caller's thread.
fn call_python(callable: &Py<PyAny>, item: Item) -> PyResult<Option<Item>> {
    Python::attach(|py| {
        let arg = item.into_py(py)?;
        let out = callable.bind(py).call1((arg,))?;
        Ok((!out.is_none()).then(|| Item::Py(out.unbind())))
    })
}

/// The bridge to the pipeline's event loop for `async def` stages: each
/// call submits a coroutine (through the Python-side runner, on a feeder
/// thread of its own) and completes when the loop finishes it.
#[pyclass(module = "ferrofeed._core", frozen)]
struct Completion {
    reply: Mutex<Option<tokio::sync::oneshot::Sender<PyResult<Option<Item>>>>>,
}

#[pymethods]
impl Completion {
    /// Called by the event loop with the finished task.
    fn __call__(&self, task: &Bound<'_, PyAny>) -> PyResult<()> {
        let out = if task.call_method0("cancelled")?.is_truthy()? {
            Err(pyo3::exceptions::asyncio::CancelledError::new_err(
                "the coroutine was cancelled",
            ))
        } else {
            match task.call_method0("exception")? {
                e if e.is_none() => {
                    let v = task.call_method0("result")?;
                    Ok((!v.is_none()).then(|| Item::Py(v.unbind())))
                }
                e => Err(PyErr::from_value(e)),
            }
        };
        let sender = self
            .reply
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(s) = sender {
            // The pipeline may be gone; then nobody waits for this result.
            let _ = s.send(out);
        }
        Ok(())
    }
}

type AsyncJob = (
    Py<PyAny>,
    Item,
    tokio::sync::oneshot::Sender<PyResult<Option<Item>>>,
);

/// Feeds coroutines to the runner from a thread of its own, many per GIL
/// acquisition.
struct AsyncFeeder {
    jobs: flume::Sender<AsyncJob>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AsyncFeeder {
    fn start(runner: Py<PyAny>) -> PyResult<Self> {
        let (jobs, rx) = flume::unbounded::<AsyncJob>();
        let thread = std::thread::Builder::new()
            .name("ff-async-feed".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    Python::attach(|py| {
                        let mut job = Some(first);
                        while let Some((op, item, reply)) =
                            job.take().or_else(|| rx.try_recv().ok())
                        {
                            let done = Completion {
                                reply: Mutex::new(Some(reply)),
                            };
                            let submitted = item.into_py(py).and_then(|arg| {
                                runner.bind(py).call_method1("submit", (op, arg, done))
                            });
                            if let Err(e) = submitted {
                                // The runner refused (it is stopping): the
                                // pipeline is going away; say why in the log.
                                let _ = logger(py).and_then(|l| {
                                    l.call_method1(
                                        "debug",
                                        ("async submit failed: %r", e.value(py)),
                                    )
                                });
                            }
                        }
                    });
                }
            })
            .map_err(|e| PyRuntimeError::new_err(format!("cannot start a thread: {e}")))?;
        Ok(Self {
            jobs,
            thread: Some(thread),
        })
    }
}

/// An `("aggregate_native", op, name)` stage: a grouping native op.
fn parse_native_aggregate(spec: &Bound<'_, PyTuple>) -> PyResult<Stage<Item, PyErr>> {
    let (_, op, name): (String, Bound<'_, PyAny>, String) = spec.extract()?;
    let op = op.cast::<PyNativeOp>()?.get();
    let (size, drop_last, combine) = op
        .group
        .clone()
        .ok_or_else(|| PyValueError::new_err(format!("{} is not a grouping op", op.name)))?;
    if size == 0 {
        return Err(PyValueError::new_err(format!(
            "ops.{}() without a batch size takes the DataLoader's; in a pipeline, give one: \
             ops.{}(batch_size, ...)",
            op.name, op.name
        )));
    }
    Ok(Stage::Aggregate(AggregateStage {
        name,
        size,
        drop_last,
        combine,
    }))
}

/// `("map", kind, op, concurrency, name, on_error, max_failures, ordered,
/// timeout)` from the Python builder.
type MapSpec = (
    String,
    String,
    Py<PyAny>,
    usize,
    String,
    String,
    Option<u64>,
    bool,
    Option<f64>,
);

/// A stage's `timeout=` (seconds): calls that run longer fail with
/// `TimeoutError`.
fn parse_timeout(secs: f64) -> PyResult<StageTimeout<PyErr>> {
    let limit = Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "timeout must be a positive number of seconds, not {secs}"
            ))
        })?;
    let error: TimeoutErrorFn<PyErr> = Arc::new(|stage: &str, limit: Duration| {
        pyo3::exceptions::PyTimeoutError::new_err(format!(
            "a call of stage {stage:?} ran longer than timeout={} s",
            limit.as_secs_f64()
        ))
    });
    Ok(StageTimeout { limit, error })
}

/// A `("disaggregate", name)` stage: a native group splits without the GIL;
/// a Python object is iterated (a list, a tuple, any iterable) with it.
fn parse_disaggregate(spec: &Bound<'_, PyTuple>) -> PyResult<Stage<Item, PyErr>> {
    let (_, name): (String, String) = spec.extract()?;
    let split: SplitFn<Item, PyErr> = Arc::new(|item| match item {
        Item::List(items) => Ok(items),
        other => Python::attach(|py| {
            let obj = other.into_py(py)?;
            obj.bind(py)
                .try_iter()?
                .map(|v| v.map(|v| Item::Py(v.unbind())))
                .collect()
        }),
    });
    Ok(Stage::Disaggregate(DisaggregateStage { name, split }))
}

/// An `("accumulate", accumulate, flush, name)` stage: a custom aggregator
/// (`flush` is `None` under `drop_last`).
fn parse_accumulate(spec: &Bound<'_, PyTuple>) -> PyResult<Stage<Item, PyErr>> {
    let (_, accumulate, flush, name): (String, Py<PyAny>, Option<Py<PyAny>>, String) =
        spec.extract()?;
    let flush = flush.map(|flush| -> FlushFn<Item, PyErr> {
        Arc::new(move || {
            Python::attach(|py| {
                let out = flush.bind(py).call0()?;
                Ok((!out.is_none()).then(|| Item::Py(out.unbind())))
            })
        })
    });
    Ok(Stage::Accumulate(AccumulateStage {
        name,
        accumulate: Arc::new(move |item| call_python(&accumulate, item)),
        flush,
    }))
}

/// A stage specification from the Python builder.
fn parse_stage(
    py: Python<'_>,
    spec: &Bound<'_, PyTuple>,
    feeder: &mut Option<AsyncFeeder>,
    runner: Option<&Py<PyAny>>,
) -> PyResult<Stage<Item, PyErr>> {
    let kind: String = spec.get_item(0)?.extract()?;
    match kind.as_str() {
        "map" => {
            let (_, op_kind, op, concurrency, name, on_error, max_failures, ordered, timeout): MapSpec =
                spec.extract()?;
            let timeout = timeout.map(parse_timeout).transpose()?;
            let on_error = match on_error.as_str() {
                "raise" => ErrorPolicy::Raise,
                "skip" => ErrorPolicy::Skip { max_failures },
                other => {
                    return Err(PyValueError::new_err(format!(
                        "on_error must be 'raise' or 'skip', not {other:?}"
                    )))
                }
            };
            let work = match op_kind.as_str() {
                "native" => {
                    let native = op.bind(py).cast::<PyNativeOp>()?.get();
                    if native.blocking {
                        Work::Blocking(Arc::clone(&native.f))
                    } else {
                        Work::Inline(Arc::clone(&native.f))
                    }
                }
                "sync" => {
                    // One GIL acquisition for all the items a thread has at hand;
                    // `call_python`'s own `attach` is then a cheap re-entry.
                    let session: SessionFn = Arc::new(|run: &mut dyn FnMut()| {
                        Python::attach(|_| run());
                    });
                    Work::Dedicated(Arc::new(move |item| call_python(&op, item)), Some(session))
                }
                "async" => {
                    let runner = runner.ok_or_else(|| {
                        PyRuntimeError::new_err("an async stage needs the pipeline's event loop")
                    })?;
                    if feeder.is_none() {
                        *feeder = Some(AsyncFeeder::start(runner.clone_ref(py))?);
                    }
                    let jobs = feeder.as_ref().map(|f| f.jobs.clone()).expect("just set");
                    let f: AsyncItemFn<Item, PyErr> = Arc::new(move |item| {
                        let (reply, done) = tokio::sync::oneshot::channel();
                        let op = Python::attach(|py| op.clone_ref(py));
                        let sent = jobs.send((op, item, reply)).is_ok();
                        Box::pin(async move {
                            if !sent {
                                return Err(PyRuntimeError::new_err("the event loop is gone"));
                            }
                            done.await.unwrap_or_else(|_| {
                                Err(PyRuntimeError::new_err(
                                    "the event loop dropped the coroutine",
                                ))
                            })
                        })
                    });
                    Work::Async(f)
                }
                other => return Err(PyValueError::new_err(format!("unknown op kind {other:?}"))),
            };
            Ok(Stage::Map(MapStage {
                name,
                work,
                concurrency,
                ordered,
                on_error,
                timeout,
            }))
        }
        "aggregate_native" => parse_native_aggregate(spec),
        "disaggregate" => parse_disaggregate(spec),
        "accumulate" => parse_accumulate(spec),
        "aggregate" => {
            let (_, size, drop_last, name): (String, usize, bool, String) = spec.extract()?;
            let combine: CombineFn<Item, PyErr> = Arc::new(|items: Vec<Item>| {
                if items.iter().all(|i| !matches!(i, Item::Py(_))) {
                    return Ok(Item::List(items));
                }
                Python::attach(|py| {
                    let list = PyList::empty(py);
                    for it in items {
                        list.append(it.into_py(py)?)?;
                    }
                    Ok(Item::Py(list.into_any().unbind()))
                })
            });
            Ok(Stage::Aggregate(AggregateStage {
                name,
                size,
                drop_last,
                combine,
            }))
        }
        other => Err(PyValueError::new_err(format!(
            "unknown stage kind {other:?}"
        ))),
    }
}

/// Builds the exception a failure raises in the consumer: a
/// `ferrofeed.PipelineError` (an `ExceptionGroup`) around the original.
fn failure_to_pyerr(py: Python<'_>, failure: Failure<PyErr>) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let Failure { stage, kind } = failure;
        let (message, inner) = match kind {
            FailureKind::Item(e) => (format!("stage {stage:?} failed"), e),
            FailureKind::TooManyFailures { limit, count, last } => (
                format!(
                    "stage {stage:?} failed on {count} items, more than max_failures={limit}; \
                     the last error is attached"
                ),
                last,
            ),
            FailureKind::Panicked(msg) => (
                format!("stage {stage:?} failed"),
                PyRuntimeError::new_err(format!("native code panicked: {msg}")),
            ),
        };
        let value = inner.into_value(py);
        value
            .bind(py)
            .call_method1("add_note", (format!("raised in pipeline stage {stage:?}"),))?;
        let cls = py.import("ferrofeed._errors")?.getattr("PipelineError")?;
        let group = cls.call1((message, PyList::new(py, [value])?))?;
        group.setattr("stage", stage)?;
        Ok(PyErr::from_value(group))
    };
    build().unwrap_or_else(|e| e)
}

/// `stall_warning_after=secs`: a WARNING on the `ferrofeed.pipeline` logger
/// naming the stage that holds a stalled pipeline.
fn stall_watch(secs: f64) -> PyResult<StallWatch> {
    let after = Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| PyValueError::new_err("stall_warning_after must be > 0"))?;
    let report: StallFn = Arc::new(|stall: &Stall| {
        Python::attach(|py| {
            let _ = logger(py).and_then(|l| {
                l.call_method1(
                    "warning",
                    (
                        "pipeline made no progress for %.1f s; stage %r holds it \
                         (%d items in flight)",
                        stall.idle.as_secs_f64(),
                        &stall.stage,
                        stall.in_flight,
                    ),
                )
            });
        });
    });
    Ok(StallWatch { after, report })
}

fn snapshot_dict<'py>(py: Python<'py>, s: &StatsSnapshot) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("concurrency", s.concurrency)?;
    d.set_item("items_in", s.items_in)?;
    d.set_item("items_out", s.items_out)?;
    d.set_item("dropped", s.dropped)?;
    d.set_item("failures", s.failures)?;
    d.set_item("busy_s", s.busy.as_secs_f64())?;
    d.set_item("busy_per_item_s", s.busy_per_item().as_secs_f64())?;
    d.set_item("wait_upstream_s", s.wait_upstream.as_secs_f64())?;
    d.set_item("wait_downstream_s", s.wait_downstream.as_secs_f64())?;
    d.set_item("queue_mean", s.queue_mean)?;
    d.set_item("queue_capacity", s.queue_capacity)?;
    Ok(d)
}

struct Inner {
    pipeline: Pipeline<Item, PyErr>,
    feeder: Option<AsyncFeeder>,
    runner: Option<Py<PyAny>>,
    exhausted: bool,
}

/// A running (or runnable) pipeline; see `ferrofeed.PipelineBuilder`.
#[pyclass(name = "Pipeline", module = "ferrofeed._core", frozen, weakref)]
pub(crate) struct PyPipeline {
    inner: Mutex<Inner>,
    /// The fork generation the pipeline was built in.
    generation: u64,
    /// The stages' task hooks, as one object whose `enter()` the start calls
    /// (their `stage_hook()`s) and whose `exit()` the stop calls.
    stage_hooks: Option<Py<PyAny>>,
}

impl PyPipeline {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether this is the process (and fork generation) that built the
    /// pipeline: in a forked child, its threads, runtime and event loop are
    /// the parent's.
    fn in_creator(&self, inner: &Inner) -> bool {
        self.generation == fork_generation() && inner.pipeline.is_in_creator_process()
    }

    /// Stops the engine, the feeder and the runner (call detached from the
    /// GIL for the joins, attached for the runner). The finished items the
    /// consumer has not taken stay readable.
    fn shutdown(&self, py: Python<'_>) -> PyResult<()> {
        let (feeder, runner, in_creator, left) = py.detach(|| {
            let mut inner = self.lock();
            inner.pipeline.stop();
            let left = inner.pipeline.take_left_running();
            // A stopped pipeline is finished once its leftovers are read:
            // iterating it again then says so.
            inner.exhausted = !inner.pipeline.has_leftovers();
            if self.in_creator(&inner) {
                (inner.feeder.take(), inner.runner.take(), true, left)
            } else {
                forget_in_child(&mut inner);
                (None, None, false, left)
            }
        });
        if !left.is_empty() {
            // Not a warning: Ctrl-C during a long call is the usual cause,
            // and nothing is wrong (see `stop` in `PipelineBuilder`'s docs).
            let _ = logger(py).and_then(|l| {
                l.call_method1(
                    "info",
                    (
                        "pipeline stopped; %d thread(s) still inside a call of user code                          (%s) are left to finish on their own, their results discarded",
                        left.len(),
                        left.join(", "),
                    ),
                )
            });
        }
        let result = match &runner {
            Some(r) => r.bind(py).call_method0("stop").map(drop),
            None => Ok(()),
        };
        if let Some(mut f) = feeder {
            let thread = f.thread.take();
            drop(f); // closes the job channel: the feeder thread returns
            if let Some(t) = thread {
                py.detach(|| {
                    let _ = t.join();
                });
            }
        }
        // After every stage is stopped: the stage hooks end (once).
        let hooks = match &self.stage_hooks {
            Some(h) if in_creator => h.bind(py).call_method0("exit").map(drop),
            _ => Ok(()),
        };
        result.and(hooks)
    }
}

#[pymethods]
impl PyPipeline {
    #[new]
    #[pyo3(signature = (source, stages, *, sink_buffer=3, num_threads=None, runner=None, report_interval=None, native_source=false, stall_warning=None, stage_hooks=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        source: &Bound<'_, PyAny>,
        stages: &Bound<'_, PyList>,
        sink_buffer: usize,
        num_threads: Option<usize>,
        runner: Option<Py<PyAny>>,
        report_interval: Option<f64>,
        native_source: bool,
        stall_warning: Option<f64>,
        stage_hooks: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let mut feeder = None;
        let stages = stages
            .iter()
            .map(|s| parse_stage(py, s.cast::<PyTuple>()?, &mut feeder, runner.as_ref()))
            .collect::<PyResult<Vec<_>>>()?;
        let mut config = PipelineConfig {
            sink_buffer,
            ..PipelineConfig::default()
        };
        if let Some(n) = num_threads {
            config.num_threads = n;
        }
        let hook: SkipHook<PyErr> = Arc::new(|stage: &str, e: &PyErr| {
            Python::attach(|py| {
                let _ = logger(py).and_then(|l| {
                    l.call_method1(
                        "warning",
                        (
                            "stage %r skipped an item: %s: %s",
                            stage,
                            e.get_type(py).name()?,
                            e.value(py),
                        ),
                    )
                });
            });
        });
        let mut pipeline = if let Ok(range) = source.cast::<PyRange>() {
            let int = |v: isize| i64::try_from(v).map_err(|e| PyValueError::new_err(e.to_string()));
            Pipeline::new(
                RangeSource {
                    next: int(range.start()?)?,
                    stop: int(range.stop()?)?,
                    step: int(range.step()?)?,
                },
                stages,
                config,
                Some(hook),
            )
        } else {
            let iter = source.try_iter()?.unbind();
            Pipeline::new(
                PySource {
                    iter,
                    native: native_source,
                },
                stages,
                config,
                Some(hook),
            )
        }
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
        if let Some(secs) = report_interval {
            if !(secs > 0.0 && secs.is_finite()) {
                return Err(PyValueError::new_err("report_stats_interval must be > 0"));
            }
            let report: ReportFn = Arc::new(|snaps: &[StatsSnapshot]| {
                let table = format_table(snaps);
                Python::attach(|py| {
                    let _ = logger(py)
                        .and_then(|l| l.call_method1("info", ("pipeline stats\n%s", table)));
                });
            });
            pipeline.set_reporter(StatsReporter {
                interval: Duration::from_secs_f64(secs),
                report,
            });
        }
        if let Some(secs) = stall_warning {
            pipeline.set_stall_watch(stall_watch(secs)?);
        }
        Ok(Self {
            inner: Mutex::new(Inner {
                pipeline,
                feeder,
                runner,
                exhausted: false,
            }),
            generation: fork_generation(),
            stage_hooks,
        })
    }

    /// Starts the pipeline's threads (iteration starts it too).
    fn start(&self, py: Python<'_>) -> PyResult<()> {
        let runner = {
            let inner = self.lock();
            if self.generation != fork_generation() || !inner.pipeline.is_in_creator_process() {
                return Err(PyRuntimeError::new_err(
                    "this pipeline was built in another process (before a fork); build a new one",
                ));
            }
            if inner.pipeline.is_started() {
                return Ok(());
            }
            inner.runner.as_ref().map(|r| r.clone_ref(py))
        };
        if let Some(h) = &self.stage_hooks {
            // Before any item moves (once: `enter` does nothing the second time).
            h.bind(py).call_method0("enter")?;
        }
        if let Some(r) = runner {
            r.bind(py).call_method0("start")?;
        }
        py.detach(|| self.lock().pipeline.start())
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// Stops every stage and joins every thread, except those still inside
    /// a call of user code after 0.25 s (left to finish on their own, their
    /// results discarded); idempotent.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        self.shutdown(py)
    }

    fn __iter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        if slf.get().lock().exhausted {
            return Err(PyRuntimeError::new_err(
                "this pipeline has finished: a pipeline is one pass over its source; \
                 build a new one (PipelineBuilder.build()) for the next epoch",
            ));
        }
        Ok(slf)
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        // The fast path: an item that is ready is taken with one lock and
        // without releasing the GIL. A pipeline inherited through a fork
        // never takes it, and `start` refuses it.
        let ready = {
            let mut inner = self.lock();
            if inner.pipeline.is_started()
                && !inner.exhausted
                && self.generation == fork_generation()
            {
                inner.pipeline.try_next()
            } else {
                None
            }
        };
        if let Some(item) = ready {
            return item.into_py(py).map(Some);
        }
        self.start(py)?;
        loop {
            let next = py.detach(|| {
                let mut inner = self.lock();
                if inner.exhausted {
                    return Next::Finished;
                }
                inner.pipeline.next_timeout(WAIT_SLICE)
            });
            match next {
                Next::Item(item) => return item.into_py(py).map(Some),
                Next::Timeout => {
                    if let Err(e) = py.check_signals() {
                        self.shutdown(py)?;
                        return Err(e);
                    }
                }
                Next::Finished => {
                    self.lock().exhausted = true;
                    self.shutdown(py)?;
                    return Ok(None);
                }
                Next::Failed(f) => {
                    self.lock().exhausted = true;
                    self.shutdown(py)?;
                    return Err(failure_to_pyerr(py, f));
                }
            }
        }
    }

    /// Whether every item was delivered, or the pipeline stopped or failed.
    #[getter]
    fn finished(&self) -> bool {
        let inner = self.lock();
        inner.exhausted || inner.pipeline.is_finished()
    }

    /// Per-stage figures, keyed by stage name (source first, sink last).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let snaps = self.lock().pipeline.stats();
        let d = PyDict::new(py);
        for s in &snaps {
            d.set_item(&s.name, snapshot_dict(py, s)?)?;
        }
        Ok(d)
    }

    /// The per-stage figures as a printable table.
    fn stats_table(&self) -> String {
        format_table(&self.lock().pipeline.stats())
    }

    /// `with pipeline.auto_stop():` starts on entry, stops and joins on exit.
    fn auto_stop(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        slf.get().start(slf.py())?;
        Ok(slf)
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.shutdown(py)?;
        Ok(false)
    }
}

/// In a forked child: forgets the parent's feeder thread and event loop
/// rather than stop them. Their threads do not exist here (joining one would
/// wait on a thread id that names nothing), the feeder's channel may have
/// been locked at the fork, and the loop's self-pipe is the parent's.
fn forget_in_child(inner: &mut Inner) {
    std::mem::forget(inner.feeder.take());
    std::mem::forget(inner.runner.take());
}

impl Drop for PyPipeline {
    fn drop(&mut self) {
        let in_creator = self.generation == fork_generation()
            && self
                .inner
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .pipeline
                .is_in_creator_process();
        let inner = self.inner.get_mut().unwrap_or_else(PoisonError::into_inner);
        if !in_creator {
            // The engine forgets what is the parent's on its own.
            forget_in_child(inner);
            return;
        }
        // Joins happen detached when the GIL is held by this thread.
        let stop = |inner: &mut Inner| {
            inner.pipeline.stop();
            if let Some(mut f) = inner.feeder.take() {
                let t = f.thread.take();
                drop(f);
                if let Some(t) = t {
                    let _ = t.join();
                }
            }
        };
        let hooks = self.stage_hooks.take();
        Python::attach(|py| {
            if let Some(r) = inner.runner.take() {
                let _ = r.bind(py).call_method0("stop");
            }
            py.detach(|| stop(inner));
            if let Some(h) = hooks {
                let _ = h.bind(py).call_method0("exit");
            }
        });
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPipeline>()?;
    m.add_class::<PyNativeOp>()?;
    m.add_function(wrap_pyfunction!(_op_identity, m)?)?;
    m.add_function(wrap_pyfunction!(_after_fork_in_child, m)?)?;
    m.add_function(wrap_pyfunction!(_native_threads, m)?)?;
    m.add_function(wrap_pyfunction!(_cpu_pool_size, m)?)?;
    Ok(())
}
