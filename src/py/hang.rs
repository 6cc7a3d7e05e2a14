//! Calls into Python from the engine's own threads that survive the
//! interpreter's exit.
//!
//! On Python before 3.14, a thread that wants the GIL back once the
//! interpreter is finalizing is ended with `pthread_exit`, which on Linux
//! unwinds its stack (a "forced unwind"). pyo3 declares the C API `extern
//! "C"`: an unwind out of such a call cannot pass the Rust frame that made it,
//! and the process aborts (SIGABRT at exit, with a stage thread left inside a
//! user's function by `stop()`'s grace). pyo3 guards its own ways in
//! (`Python::attach`), but a call that runs Python code (a stage's function,
//! a generator, a logging handler) lets the GIL go and takes it back inside
//! the call, where no pyo3 guard is.
//!
//! The calls here declare the two C functions `extern "C-unwind"` and hold a
//! guard whose drop, run only by that unwind, parks the thread for good, as
//! pyo3's own guard does and as CPython 3.14 does itself: the thread holds no
//! GIL (CPython let it go before ending the thread) and no engine lock (none
//! is held across a call into Python), and the process exits around it.
//! Written here because pyo3 offers no unwinding call (its guard is private
//! to pyo3-ffi).

use pyo3::prelude::*;
use pyo3::types::{PyIterator, PyTuple};
use pyo3::BoundObject;

/// The C API's calls that run Python code, declared so that a forced unwind
/// may leave them (pyo3-ffi declares the same symbols `extern "C"`).
#[allow(clashing_extern_declarations)]
mod unwinding {
    use pyo3::ffi::PyObject;

    unsafe extern "C-unwind" {
        pub(super) fn PyObject_Call(
            callable: *mut PyObject,
            args: *mut PyObject,
            kwargs: *mut PyObject,
        ) -> *mut PyObject;
        pub(super) fn PyIter_Next(iter: *mut PyObject) -> *mut PyObject;
    }
}

/// Held across a call into Python; forgotten when the call returns. Dropped
/// only by an unwind out of the call: a forced unwind (`pthread_exit`) parks
/// the thread forever; a Rust panic (which pyo3 never lets out of Python,
/// but should one come) goes on.
struct ParkOnExit;

impl Drop for ParkOnExit {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        loop {
            std::thread::park();
        }
    }
}

/// `f(*args)`, as `Bound::call1` does, safe at the interpreter's exit (see
/// the module docs).
///
/// # Errors
///
/// What `f` raised.
pub(crate) fn call<'py, A>(f: &Bound<'py, PyAny>, args: A) -> PyResult<Bound<'py, PyAny>>
where
    A: IntoPyObject<'py, Target = PyTuple>,
    A::Error: Into<PyErr>,
{
    let py = f.py();
    let args = args.into_pyobject(py).map_err(Into::into)?.into_bound();
    let guard = ParkOnExit;
    // SAFETY: the GIL is held (`py`); `f` and `args` are live objects that
    // outlive the call (borrowed here, the call takes its own references if
    // it keeps them); NULL keyword arguments are allowed. The declaration
    // matches CPython's `PyObject_Call` but for the unwind ABI, which is what
    // lets a forced unwind reach `guard`.
    let out = unsafe { unwinding::PyObject_Call(f.as_ptr(), args.as_ptr(), std::ptr::null_mut()) };
    std::mem::forget(guard);
    // SAFETY: `PyObject_Call` returns a new reference, or NULL with the error
    // set, which is what `from_owned_ptr_or_err` takes.
    unsafe { Bound::from_owned_ptr_or_err(py, out) }
}

/// `obj.name(*args)`, as `Bound::call_method1` does, safe at the
/// interpreter's exit.
///
/// # Errors
///
/// `obj` has no `name`, or what the call raised.
pub(crate) fn call_method<'py, A>(
    obj: &Bound<'py, PyAny>,
    name: &str,
    args: A,
) -> PyResult<Bound<'py, PyAny>>
where
    A: IntoPyObject<'py, Target = PyTuple>,
    A::Error: Into<PyErr>,
{
    call(&obj.getattr(name)?, args)
}

/// The iterator's next item (`None` at its end), as `Iterator::next` on a
/// `Bound<PyIterator>` gives it, safe at the interpreter's exit.
pub(crate) fn next<'py>(it: &Bound<'py, PyIterator>) -> Option<PyResult<Bound<'py, PyAny>>> {
    let py = it.py();
    let guard = ParkOnExit;
    // SAFETY: the GIL is held (`py`) and `it` is a live iterator (a
    // `PyIterator` is one by its type's check). The declaration matches
    // CPython's `PyIter_Next` but for the unwind ABI.
    let out = unsafe { unwinding::PyIter_Next(it.as_ptr()) };
    std::mem::forget(guard);
    // SAFETY: `PyIter_Next` returns a new reference, or NULL at the end (no
    // error set) or on an error (set).
    match unsafe { Bound::from_owned_ptr_or_opt(py, out) } {
        Some(v) => Some(Ok(v)),
        None => PyErr::take(py).map(Err),
    }
}
