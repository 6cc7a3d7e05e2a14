//! The stages the Python builder hands over, as typed, frozen classes
//! (`MapSpec`, `AggregateSpec`, `AccumulateSpec`, `DisaggregateSpec`), and
//! the engine stages they become.

use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyList;

use super::bridge::AsyncFeeder;
use super::calls::mark_if_call_failed;
use super::{Item, PyNativeOp};
use crate::pipeline::{
    AccumulateStage, AggregateStage, AsyncItemFn, CombineFn, DisaggregateStage, ErrorPolicy,
    FlushFn, MapStage, SessionFn, SplitFn, Stage, StageTimeout, TimeoutErrorFn, Work,
};
use crate::py::hang;

/// Calls a Python callable on an item, with the GIL, on the caller's thread.
fn call_python(callable: &Py<PyAny>, item: Item) -> PyResult<Option<Item>> {
    Python::attach(|py| {
        let arg = item.into_py(py)?;
        let f = callable.bind(py);
        match hang::call(f, (arg,)) {
            Ok(out) => Ok((!out.is_none()).then(|| Item::Py(out.unbind()))),
            Err(e) => {
                mark_if_call_failed(py, &e, f);
                Err(e)
            }
        }
    })
}

/// Where a map stage's function runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum MapKind {
    /// A Python callable, on the stage's own threads.
    Sync,
    /// A Python callable returning a coroutine, on the pipeline's event loop.
    Async,
    /// A native op, without the GIL.
    Native,
}

impl MapKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Sync => "sync",
            Self::Async => "async",
            Self::Native => "native",
        }
    }
}

/// `repr` of an optional value: `None` or the value's own.
fn opt_repr<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "None".to_owned(), |v| v.to_string())
}

/// `repr` of a Python bool.
fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// A map stage: `op` applied to each item.
#[pyclass(name = "MapSpec", module = "ferrofeed._core", frozen)]
pub(crate) struct MapSpec {
    name: String,
    op: Py<PyAny>,
    kind: MapKind,
    concurrency: usize,
    on_error: ErrorPolicy,
    ordered: bool,
    timeout: Option<f64>,
}

#[pymethods]
impl MapSpec {
    /// `MapSpec(name, op, *, kind="sync", concurrency=1, on_error="raise",
    /// max_failures=None, ordered=True, timeout=None)`. `kind` is `"sync"`
    /// (a callable, on the stage's threads), `"async"` (a callable returning
    /// a coroutine, on the pipeline's event loop) or `"native"` (a
    /// `NativeOp`).
    #[new]
    #[pyo3(signature = (name, op, *, kind="sync", concurrency=1, on_error="raise", max_failures=None, ordered=true, timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        name: String,
        op: Bound<'_, PyAny>,
        kind: &str,
        concurrency: usize,
        on_error: &str,
        max_failures: Option<u64>,
        ordered: bool,
        timeout: Option<f64>,
    ) -> PyResult<Self> {
        let kind = match kind {
            "sync" => MapKind::Sync,
            "async" => MapKind::Async,
            "native" => MapKind::Native,
            other => {
                return Err(PyValueError::new_err(format!(
                    "kind must be 'sync', 'async' or 'native', not {other:?}"
                )))
            }
        };
        let native = op.cast::<PyNativeOp>().ok();
        match (kind, native) {
            (MapKind::Native, None) => {
                return Err(PyTypeError::new_err(format!(
                    "kind='native' takes a NativeOp, not {}",
                    op.get_type().name()?
                )))
            }
            (MapKind::Native, Some(n)) if n.get().group.is_some() => {
                return Err(PyValueError::new_err(format!(
                    "{} is a grouping op: an AggregateSpec's combine",
                    n.get().name
                )))
            }
            (MapKind::Sync | MapKind::Async, Some(_)) => {
                return Err(PyTypeError::new_err("a NativeOp is a map of kind='native'"))
            }
            (MapKind::Sync | MapKind::Async, None) if !op.is_callable() => {
                return Err(PyTypeError::new_err(format!(
                    "op must be callable, not {}",
                    op.get_type().name()?
                )))
            }
            _ => {}
        }
        if concurrency == 0 {
            return Err(PyValueError::new_err("concurrency must be at least 1"));
        }
        let on_error = match (on_error, max_failures) {
            ("raise", None) => ErrorPolicy::Raise,
            ("raise", Some(_)) => {
                return Err(PyValueError::new_err(
                    "max_failures applies to on_error='skip'",
                ))
            }
            ("skip", max_failures) => ErrorPolicy::Skip { max_failures },
            (other, _) => {
                return Err(PyValueError::new_err(format!(
                    "on_error must be 'raise' or 'skip', not {other:?}"
                )))
            }
        };
        if let Some(secs) = timeout {
            parse_timeout(secs)?;
        }
        Ok(Self {
            name,
            op: op.unbind(),
            kind,
            concurrency,
            on_error,
            ordered,
            timeout,
        })
    }

    /// The stage's name (in stats and errors).
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// What is called on each item.
    #[getter]
    fn op(&self, py: Python<'_>) -> Py<PyAny> {
        self.op.clone_ref(py)
    }

    /// `"sync"`, `"async"` or `"native"`.
    #[getter]
    fn kind(&self) -> &'static str {
        self.kind.as_str()
    }

    /// Items processed at once.
    #[getter]
    fn concurrency(&self) -> usize {
        self.concurrency
    }

    /// `"raise"` or `"skip"`.
    #[getter]
    fn on_error(&self) -> &'static str {
        match self.on_error {
            ErrorPolicy::Raise => "raise",
            ErrorPolicy::Skip { .. } => "skip",
        }
    }

    /// Under `"skip"`, the failures tolerated (`None`: any number).
    #[getter]
    fn max_failures(&self) -> Option<u64> {
        match self.on_error {
            ErrorPolicy::Raise => None,
            ErrorPolicy::Skip { max_failures } => max_failures,
        }
    }

    /// Whether output order equals input order.
    #[getter]
    fn ordered(&self) -> bool {
        self.ordered
    }

    /// Seconds one call may run (`None`: no limit).
    #[getter]
    fn timeout(&self) -> Option<f64> {
        self.timeout
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "MapSpec({:?}, {}, kind='{}', concurrency={}, on_error='{}', max_failures={}, \
             ordered={}, timeout={})",
            self.name,
            self.op.bind(py).repr()?,
            self.kind.as_str(),
            self.concurrency,
            self.on_error(),
            opt_repr(self.max_failures()),
            py_bool(self.ordered),
            opt_repr(self.timeout),
        ))
    }
}

/// A stage that groups every `size` consecutive items into one.
#[pyclass(name = "AggregateSpec", module = "ferrofeed._core", frozen)]
pub(crate) struct AggregateSpec {
    name: String,
    size: usize,
    drop_last: bool,
    combine: Option<Py<PyAny>>,
}

#[pymethods]
impl AggregateSpec {
    /// `AggregateSpec(name, size, *, drop_last=False, combine=None)`: a group
    /// becomes a list (`combine=None`), one item through a grouping
    /// `NativeOp` (`ops.collate`), or whatever a Python callable makes of
    /// the group's list. A grouping op made without a batch size (0: a
    /// `DataLoader`'s) is taken here and refused by the `Pipeline`.
    #[new]
    #[pyo3(signature = (name, size, *, drop_last=false, combine=None))]
    fn new(
        name: String,
        size: usize,
        drop_last: bool,
        combine: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        if let Some(c) = &combine {
            if let Ok(op) = c.cast::<PyNativeOp>() {
                let op = op.get();
                if op.group.is_none() {
                    return Err(PyValueError::new_err(format!(
                        "{} is not a grouping op",
                        op.name
                    )));
                }
            } else if !c.is_callable() {
                return Err(PyTypeError::new_err(format!(
                    "combine must be a grouping NativeOp or a callable, not {}",
                    c.get_type().name()?
                )));
            }
        }
        let native = combine
            .as_ref()
            .is_some_and(|c| c.cast::<PyNativeOp>().is_ok());
        if size == 0 && !native {
            return Err(PyValueError::new_err("the group size must be at least 1"));
        }
        Ok(Self {
            name,
            size,
            drop_last,
            combine: combine.map(Bound::unbind),
        })
    }

    /// The stage's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Items per group.
    #[getter]
    fn size(&self) -> usize {
        self.size
    }

    /// Whether a last, short group is dropped.
    #[getter]
    fn drop_last(&self) -> bool {
        self.drop_last
    }

    /// How a group becomes one item (`None`: a list).
    #[getter]
    fn combine(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.combine.as_ref().map(|c| c.clone_ref(py))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let combine = match &self.combine {
            Some(c) => c.bind(py).repr()?.to_string(),
            None => "None".into(),
        };
        Ok(format!(
            "AggregateSpec({:?}, {}, drop_last={}, combine={combine})",
            self.name,
            self.size,
            py_bool(self.drop_last)
        ))
    }
}

/// A custom aggregation (SPDL's `Aggregator`): `accumulate(item)` is fed
/// every item and returns a result or `None`; `flush()` (if given) ends it.
#[pyclass(name = "AccumulateSpec", module = "ferrofeed._core", frozen)]
pub(crate) struct AccumulateSpec {
    name: String,
    accumulate: Py<PyAny>,
    flush: Option<Py<PyAny>>,
}

#[pymethods]
impl AccumulateSpec {
    /// `AccumulateSpec(name, accumulate, flush=None)`; without `flush` what
    /// is held at the end is dropped (`drop_last`).
    #[new]
    #[pyo3(signature = (name, accumulate, flush=None))]
    fn new(
        name: String,
        accumulate: Bound<'_, PyAny>,
        flush: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        if !accumulate.is_callable() || flush.as_ref().is_some_and(|f| !f.is_callable()) {
            return Err(PyTypeError::new_err(
                "accumulate and flush must be callable",
            ));
        }
        Ok(Self {
            name,
            accumulate: accumulate.unbind(),
            flush: flush.map(Bound::unbind),
        })
    }

    /// The stage's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Called with every item, in order.
    #[getter]
    fn accumulate(&self, py: Python<'_>) -> Py<PyAny> {
        self.accumulate.clone_ref(py)
    }

    /// Called once at the end of the input (`None`: what is held is dropped).
    #[getter]
    fn flush(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.flush.as_ref().map(|f| f.clone_ref(py))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let flush = match &self.flush {
            Some(f) => f.bind(py).repr()?.to_string(),
            None => "None".into(),
        };
        Ok(format!(
            "AccumulateSpec({:?}, {}, flush={flush})",
            self.name,
            self.accumulate.bind(py).repr()?
        ))
    }
}

/// A stage that sends on, one by one, the elements of each item.
#[pyclass(name = "DisaggregateSpec", module = "ferrofeed._core", frozen)]
pub(crate) struct DisaggregateSpec {
    name: String,
}

#[pymethods]
impl DisaggregateSpec {
    /// `DisaggregateSpec(name)`.
    #[new]
    fn new(name: String) -> Self {
        Self { name }
    }

    /// The stage's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    fn __repr__(&self) -> String {
        format!("DisaggregateSpec({:?})", self.name)
    }
}

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

/// What a pipeline's stages need from it when they become engine stages.
pub(super) struct StageEnv<'a> {
    /// The pipeline's epoch (native ops with random draws key on it).
    pub(super) epoch: u64,
    /// The event loop's runner, for `async` stages.
    pub(super) runner: Option<&'a Py<PyAny>>,
    /// The feeder of the event loop, started by the first `async` stage.
    pub(super) feeder: Option<AsyncFeeder>,
}

impl MapSpec {
    fn stage(&self, py: Python<'_>, env: &mut StageEnv<'_>) -> PyResult<Stage<Item, PyErr>> {
        let work = match self.kind {
            MapKind::Native => {
                let native = self.op.bind(py).cast::<PyNativeOp>()?.get();
                if let Some(start) = &native.spawned {
                    Work::Async(Arc::clone(start))
                } else if native.blocking {
                    Work::Blocking(native.item_fn(env.epoch))
                } else {
                    Work::Inline(native.item_fn(env.epoch))
                }
            }
            MapKind::Sync => {
                // One GIL acquisition for all the items a thread has at hand;
                // `call_python`'s own `attach` is then a cheap re-entry.
                let session: SessionFn = Arc::new(|run: &mut dyn FnMut()| {
                    Python::attach(|_| run());
                });
                let op = self.op.clone_ref(py);
                Work::Dedicated(Arc::new(move |item| call_python(&op, item)), Some(session))
            }
            MapKind::Async => {
                let runner = env.runner.ok_or_else(|| {
                    PyRuntimeError::new_err("an async stage needs the pipeline's event loop")
                })?;
                if env.feeder.is_none() {
                    env.feeder = Some(AsyncFeeder::start(runner.clone_ref(py))?);
                }
                let jobs = env
                    .feeder
                    .as_ref()
                    .map(|f| f.jobs.clone())
                    .expect("just set");
                let op = self.op.clone_ref(py);
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
        };
        Ok(Stage::Map(MapStage {
            name: self.name.clone(),
            work,
            concurrency: self.concurrency,
            ordered: self.ordered,
            on_error: self.on_error,
            timeout: self.timeout.map(parse_timeout).transpose()?,
        }))
    }
}

impl AggregateSpec {
    fn stage(&self, py: Python<'_>) -> PyResult<Stage<Item, PyErr>> {
        if self.size == 0 {
            let op = self.combine.as_ref().map_or_else(String::new, |c| {
                c.bind(py)
                    .cast::<PyNativeOp>()
                    .map(|op| op.get().name.clone())
                    .unwrap_or_default()
            });
            return Err(PyValueError::new_err(format!(
                "ops.{op}() without a batch size takes the DataLoader's; in a pipeline, give \
                 one: ops.{op}(batch_size, ...)"
            )));
        }
        let combine: CombineFn<Item, PyErr> = match &self.combine {
            None => Arc::new(|items: Vec<Item>| {
                if items.iter().all(|i| !matches!(i, Item::Py(_))) {
                    return Ok(Item::List(items));
                }
                Python::attach(|py| Ok(Item::Py(py_list(py, items)?.into_any().unbind())))
            }),
            Some(c) => {
                if let Ok(op) = c.bind(py).cast::<PyNativeOp>() {
                    let (_, _, combine) = op.get().group.clone().expect("checked at new");
                    combine
                } else {
                    let f = c.clone_ref(py);
                    Arc::new(move |items: Vec<Item>| {
                        Python::attach(|py| {
                            let list = py_list(py, items)?;
                            let out = hang::call(f.bind(py), (list,))?;
                            Ok(Item::Py(out.unbind()))
                        })
                    })
                }
            }
        };
        Ok(Stage::Aggregate(AggregateStage {
            name: self.name.clone(),
            size: self.size,
            drop_last: self.drop_last,
            combine,
        }))
    }
}

/// Items as a Python list.
fn py_list(py: Python<'_>, items: Vec<Item>) -> PyResult<Bound<'_, PyList>> {
    let list = PyList::empty(py);
    for it in items {
        list.append(it.into_py(py)?)?;
    }
    Ok(list)
}

impl AccumulateSpec {
    fn stage(&self, py: Python<'_>) -> Stage<Item, PyErr> {
        let flush = self.flush.as_ref().map(|flush| -> FlushFn<Item, PyErr> {
            let flush = flush.clone_ref(py);
            Arc::new(move || {
                Python::attach(|py| {
                    let out = hang::call(flush.bind(py), ())?;
                    Ok((!out.is_none()).then(|| Item::Py(out.unbind())))
                })
            })
        });
        let accumulate = self.accumulate.clone_ref(py);
        Stage::Accumulate(AccumulateStage {
            name: self.name.clone(),
            accumulate: Arc::new(move |item| call_python(&accumulate, item)),
            flush,
        })
    }
}

impl DisaggregateSpec {
    /// A native group splits without the GIL; a Python object is iterated (a
    /// list, a tuple, any iterable) with it.
    fn stage(&self) -> Stage<Item, PyErr> {
        let split: SplitFn<Item, PyErr> = Arc::new(|item| match item {
            Item::List(items) => Ok(items),
            other => Python::attach(|py| {
                let obj = other.into_py(py)?;
                let it = obj.bind(py).try_iter()?;
                std::iter::from_fn(|| hang::next(&it))
                    .map(|v| v.map(|v| Item::Py(v.unbind())))
                    .collect()
            }),
        });
        Stage::Disaggregate(DisaggregateStage {
            name: self.name.clone(),
            split,
        })
    }
}

/// The engine stage a stage specification from the Python builder becomes.
pub(super) fn to_stage(
    spec: &Bound<'_, PyAny>,
    env: &mut StageEnv<'_>,
) -> PyResult<Stage<Item, PyErr>> {
    let py = spec.py();
    if let Ok(m) = spec.cast::<MapSpec>() {
        m.get().stage(py, env)
    } else if let Ok(a) = spec.cast::<AggregateSpec>() {
        a.get().stage(py)
    } else if let Ok(a) = spec.cast::<AccumulateSpec>() {
        Ok(a.get().stage(py))
    } else if let Ok(d) = spec.cast::<DisaggregateSpec>() {
        Ok(d.get().stage())
    } else {
        Err(PyTypeError::new_err(format!(
            "a stage is a MapSpec, AggregateSpec, AccumulateSpec or DisaggregateSpec, not {}",
            spec.get_type().name()?
        )))
    }
}

/// Whether the first stage takes native items (a native map, or a native
/// grouping op): then the source turns paths and bytes into native items.
pub(super) fn takes_native_items(spec: &Bound<'_, PyAny>) -> bool {
    if let Ok(m) = spec.cast::<MapSpec>() {
        m.get().kind == MapKind::Native
    } else if let Ok(a) = spec.cast::<AggregateSpec>() {
        a.get()
            .combine
            .as_ref()
            .is_some_and(|c| c.bind(spec.py()).cast::<PyNativeOp>().is_ok())
    } else {
        false
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<MapSpec>()?;
    m.add_class::<AggregateSpec>()?;
    m.add_class::<AccumulateSpec>()?;
    m.add_class::<DisaggregateSpec>()?;
    Ok(())
}
