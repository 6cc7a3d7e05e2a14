//! The stages the Python builder hands over, and the engine stages they
//! become.

use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use super::bridge::AsyncFeeder;
use super::{Item, PyNativeOp};
use crate::pipeline::{
    AccumulateStage, AggregateStage, AsyncItemFn, CombineFn, DisaggregateStage, ErrorPolicy,
    FlushFn, MapStage, SessionFn, SplitFn, Stage, StageTimeout, TimeoutErrorFn, Work,
};

/// Calls a Python callable on an item, with the GIL, on the caller's thread.
fn call_python(callable: &Py<PyAny>, item: Item) -> PyResult<Option<Item>> {
    Python::attach(|py| {
        let arg = item.into_py(py)?;
        let out = callable.bind(py).call1((arg,))?;
        Ok((!out.is_none()).then(|| Item::Py(out.unbind())))
    })
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
pub(super) fn parse_stage(
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
