//! The bridge to the event loop of a pipeline's `async def` stages.

use std::sync::{Mutex, PoisonError};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use super::{logger, Item};
use crate::py::hang;

/// The bridge to the pipeline's event loop for `async def` stages: each
/// call submits a coroutine (through the Python-side runner, on a feeder
/// thread of its own) and completes when the loop finishes it.
#[pyclass(module = "ferrofeed._core", frozen)]
struct Completion {
    /// What was called (to tell a failed call from a failure inside it).
    op: Py<PyAny>,
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
                e => {
                    let e = PyErr::from_value(e);
                    super::calls::mark_if_call_failed(task.py(), &e, self.op.bind(task.py()));
                    Err(e)
                }
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

pub(super) type AsyncJob = (
    Py<PyAny>,
    Item,
    tokio::sync::oneshot::Sender<PyResult<Option<Item>>>,
);

/// Feeds coroutines to the runner from a thread of its own, many per GIL
/// acquisition.
pub(super) struct AsyncFeeder {
    pub(super) jobs: flume::Sender<AsyncJob>,
    pub(super) thread: Option<std::thread::JoinHandle<()>>,
}

impl AsyncFeeder {
    pub(super) fn start(runner: Py<PyAny>) -> PyResult<Self> {
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
                                op: op.clone_ref(py),
                                reply: Mutex::new(Some(reply)),
                            };
                            let submitted = item.into_py(py).and_then(|arg| {
                                hang::call_method(runner.bind(py), "submit", (op, arg, done))
                            });
                            if let Err(e) = submitted {
                                // The runner refused (it is stopping): the
                                // pipeline is going away; say why in the log.
                                let _ = logger(py).and_then(|l| {
                                    hang::call_method(
                                        l,
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
