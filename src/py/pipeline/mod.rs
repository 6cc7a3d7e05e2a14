//! `ferrofeed._core.Pipeline` and the native ops: the Python face of
//! [`crate::pipeline`].
//!
//! Items are [`Item`]s: a Python object, or a native value that native ops
//! produce and consume without the GIL and that becomes a Python object
//! only at the sink.
//!
//! - `item`: the [`Item`] and its conversions from and to Python;
//! - `native`: the [`PyNativeOp`] class (what `ferrofeed.ops` makes);
//! - `source`: the sources (a Python iterator, a native range);
//! - `spec`: the stage specifications the Python builder hands over, as
//!   typed classes, and the engine stages they become;
//! - `calls`: a stage's failed call told from a failure inside it (a
//!   programming error, which no `on_error="skip"` hides);
//! - `bridge`: the bridge to the event loop of `async def` stages;
//! - `run`: the `Pipeline` class, its life from start to stop, and how a
//!   failure reaches the consumer.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

mod bridge;
mod calls;
mod item;
mod native;
mod run;
mod source;
mod spec;

pub(crate) use item::{Item, PyPlanGroup};
pub(crate) use native::{OpConfig, PerEpochFn, PyNativeOp};

/// Bumped in every child right after a fork (see `_after_fork_in_child`):
/// a pipeline built in another generation belongs to the parent.
static FORK_GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub(super) fn fork_generation() -> u64 {
    FORK_GENERATION.load(std::sync::atomic::Ordering::Acquire)
}

/// Registered with `os.register_at_fork(after_in_child=...)` by the package.
#[pyfunction]
fn _after_fork_in_child() {
    FORK_GENERATION.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
}

/// The threads the process keeps for native work, which outlive every
/// pipeline: `(runtime threads, runtime tasks not finished, CPU pool
/// threads)` (see [`crate::runtime`]). The runtime's threads are its
/// workers and its blocking-pool threads (those idle for 10 s end); its
/// tasks are the stage tasks and stats reporters of the pipelines now
/// running and the fetches of the remote sources alive (none once every
/// pipeline is stopped and every remote source dropped; the storage
/// clients' connection tasks are not counted). Each count is 0 until the
/// runtime or pool is first used in this process. For tests that tell these
/// threads from threads a pipeline left behind.
#[pyfunction]
fn _native_threads() -> (usize, usize, usize) {
    (
        crate::runtime::threads(),
        crate::runtime::alive_tasks(),
        crate::runtime::cpu::threads(),
    )
}

/// The number of threads of the process's CPU pool (made now if it was
/// not yet): the most batch-decode jobs that run at once.
#[pyfunction]
fn _cpu_pool_size() -> usize {
    crate::runtime::cpu::pool_threads()
}

pub(super) fn logger(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static LOGGER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    LOGGER
        .get_or_try_init(py, || {
            Ok::<_, PyErr>(
                crate::py::hang::call_method(
                    py.import("logging")?.as_any(),
                    "getLogger",
                    ("ferrofeed.pipeline",),
                )?
                .unbind(),
            )
        })
        .map(|l| l.bind(py))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<run::PyPipeline>()?;
    m.add_class::<PyNativeOp>()?;
    m.add_class::<item::PyPlanGroup>()?;
    spec::register(m)?;
    m.add_function(wrap_pyfunction!(native::_op_identity, m)?)?;
    m.add_function(wrap_pyfunction!(_after_fork_in_child, m)?)?;
    m.add_function(wrap_pyfunction!(_native_threads, m)?)?;
    m.add_function(wrap_pyfunction!(_cpu_pool_size, m)?)?;
    Ok(())
}
