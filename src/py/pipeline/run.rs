//! `ferrofeed._core.Pipeline`: a pipeline's life from start to stop, and
//! how a failure reaches the consumer.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyRange, PyRangeMethods, PyTuple};

use super::bridge::AsyncFeeder;
use super::calls::is_call_failure;
use super::source::{PySource, RangeSource};
use super::spec::{takes_native_items, to_stage, StageEnv};
use super::{fork_generation, logger, Item};
use crate::pipeline::{
    format_table, Failure, FailureKind, Next, Pipeline, PipelineConfig, ReportFn, SkipHook, Stall,
    StallFn, StallWatch, StatsReporter, StatsSnapshot,
};
use crate::py::convert::fields_dict;
use crate::py::hang;

/// How long `__next__` waits without the GIL before checking for signals.
const WAIT_SLICE: Duration = Duration::from_millis(50);

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
        group.call_method1("add_note", (format!("raised in pipeline stage {stage:?}"),))?;
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
                hang::call_method(
                    l,
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
    let d = fields_dict!(py, s => concurrency, items_in, items_out, dropped, failures);
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
pub(super) struct PyPipeline {
    inner: Mutex<Inner>,
    /// The fork generation the pipeline was built in.
    generation: u64,
    /// The stages' task hooks, as one object whose `enter()` the start calls
    /// (their `stage_hook()`s) and whose `exit()` the stop calls.
    stage_hooks: Option<Py<PyAny>>,
    /// The epoch it was built for.
    epoch: u64,
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

    /// Starts the pipeline unless it was started already (iterating, or
    /// entering `auto_stop()`, starts it this way).
    fn ensure_started(&self, py: Python<'_>) -> PyResult<()> {
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
            // Before any item moves (once: `enter` does nothing the second
            // time). A hook that fails raises `PipelineError` naming its
            // stage, and the pipeline is over: nothing runs.
            if let Err(e) = h.bind(py).call_method0("enter") {
                self.lock().exhausted = true;
                let _ = self.shutdown(py);
                return Err(e);
            }
        }
        if let Some(r) = runner {
            r.bind(py).call_method0("start")?;
        }
        py.detach(|| self.lock().pipeline.start())
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))
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
                hang::call_method(
                    l,
                    "info",
                    (
                        "pipeline stopped; %d thread(s) still inside a call of user code (%s) are left to \
                         finish on their own, their results discarded",
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
    #[pyo3(signature = (source, stages, *, sink_buffer=3, num_threads=None, runner=None, report_interval=None, stall_warning=None, stage_hooks=None, epoch=0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        source: &Bound<'_, PyAny>,
        stages: &Bound<'_, PyAny>,
        sink_buffer: usize,
        num_threads: Option<usize>,
        runner: Option<Py<PyAny>>,
        report_interval: Option<f64>,
        stall_warning: Option<f64>,
        stage_hooks: Option<Py<PyAny>>,
        epoch: u64,
    ) -> PyResult<Self> {
        let specs: Vec<Bound<'_, PyAny>> = stages.try_iter()?.collect::<PyResult<_>>()?;
        // A native first stage takes native items: the source converts paths
        // and bytes.
        let native_source = specs.first().is_some_and(takes_native_items);
        let mut env = StageEnv {
            epoch,
            runner: runner.as_ref(),
            feeder: None,
        };
        let stages = specs
            .iter()
            .map(|s| to_stage(s, &mut env))
            .collect::<PyResult<Vec<_>>>()?;
        let feeder = env.feeder;
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
                    hang::call_method(
                        l,
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
                    next_pos: 0,
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
                        .and_then(|l| hang::call_method(l, "info", ("pipeline stats\n%s", table)));
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
        // A stage function that could not be called with the item is a
        // programming error: no `on_error="skip"` hides it.
        pipeline.set_unskippable(Arc::new(|e: &PyErr| {
            Python::attach(|py| is_call_failure(py, e))
        }));
        Ok(Self {
            inner: Mutex::new(Inner {
                pipeline,
                feeder,
                runner,
                exhausted: false,
            }),
            generation: fork_generation(),
            stage_hooks,
            epoch,
        })
    }

    /// Starts the pipeline's threads (iteration starts it too); a pipeline
    /// runs once: starting it again raises `RuntimeError`.
    fn start(&self, py: Python<'_>) -> PyResult<()> {
        let started = {
            let inner = self.lock();
            self.in_creator(&inner) && inner.pipeline.is_started()
        };
        if started {
            return Err(PyRuntimeError::new_err(
                "this pipeline was started already: a pipeline is one pass over its source; \
                 build a new one (PipelineBuilder.build()) for the next epoch",
            ));
        }
        self.ensure_started(py)
    }

    /// The epoch the pipeline was built for (see `PipelineBuilder.build`).
    #[getter]
    fn epoch(&self) -> u64 {
        self.epoch
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
        self.ensure_started(py)?;
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
        slf.get().ensure_started(slf.py())?;
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
