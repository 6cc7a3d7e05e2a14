//! How a failed call of a stage's function is told from a failure inside
//! it: a `TypeError` raised by the call itself (wrong arity, a bad
//! `functools.partial`) is a programming error, which fails the pipeline
//! whatever the stage's `on_error`. Both the stages on threads (`spec`) and
//! the event loop of `async def` stages (`bridge`) mark such errors here;
//! `run` tells the engine which errors are marked.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::py::hang;

/// The attribute that marks an exception raised by the call of a stage
/// function itself (see [`mark_if_call_failed`]).
const CALL_FAILED: &str = "_ferrofeed_call_failed";

/// Whether `err` was marked by [`mark_if_call_failed`]: a programming error
/// that fails the pipeline whatever the stage's `on_error`.
pub(super) fn is_call_failure(py: Python<'_>, err: &PyErr) -> bool {
    err.value(py).hasattr(CALL_FAILED).unwrap_or(false)
}

/// Marks `err` if it is a `TypeError` from calling `op` itself (wrong
/// arity), raised before `op`'s body ran: `ferrofeed._pipeline_calls._call_failed`
/// tells (it sees through the builder's wrappers). Such an error is a
/// programming error, not a bad item, and a note says so.
pub(super) fn mark_if_call_failed(py: Python<'_>, err: &PyErr, op: &Bound<'_, PyAny>) {
    static CHECK: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    if !err.is_instance_of::<PyTypeError>(py) {
        return;
    }
    let value = err.value(py);
    let mark = || -> PyResult<()> {
        let check = CHECK.get_or_try_init(py, || {
            Ok::<_, PyErr>(
                py.import("ferrofeed._pipeline_calls")?
                    .getattr("_call_failed")?
                    .unbind(),
            )
        })?;
        // The traceback as pyo3 holds it: on Python 3.11 the value's own
        // `__traceback__` is set only when the error is raised again.
        let tb = err.traceback(py);
        if hang::call(check.bind(py), (value, op, tb))?.is_truthy()? {
            value.setattr(CALL_FAILED, true)?;
            hang::call_method(
                value.as_any(),
                "add_note",
                (
                    "the stage's function could not be called with the item (its body never \
                  ran): a programming error, which fails the pipeline even under \
                  on_error='skip'",
                ),
            )?;
        }
        Ok(())
    };
    // Telling fails only if the interpreter is going away: the error stays
    // what it is.
    let _ = mark();
}
