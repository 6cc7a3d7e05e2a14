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
//! The calls here call the two C functions as `extern "C-unwind"` and hold a
//! guard whose drop, run only by that unwind, parks the thread for good, as
//! pyo3's own guard does and as CPython 3.14 does itself: the thread holds no
//! GIL (CPython let it go before ending the thread) and no engine lock (none
//! is held across a call into Python), and the process exits around it.
//! Written here because pyo3 offers no unwinding call (its guard is private
//! to pyo3-ffi).

use pyo3::ffi::PyObject;
use pyo3::prelude::*;
use pyo3::types::{PyIterator, PyTuple};
use pyo3::BoundObject;

/// `PyObject_Call`, as a function that may unwind.
type CallFn =
    unsafe extern "C-unwind" fn(*mut PyObject, *mut PyObject, *mut PyObject) -> *mut PyObject;
/// `PyObject_Call` as pyo3-ffi declares it.
type DeclaredCallFn =
    unsafe extern "C" fn(*mut PyObject, *mut PyObject, *mut PyObject) -> *mut PyObject;
/// `PyIter_Next`, as a function that may unwind.
type NextFn = unsafe extern "C-unwind" fn(*mut PyObject) -> *mut PyObject;
/// `PyIter_Next` as pyo3-ffi declares it.
type DeclaredNextFn = unsafe extern "C" fn(*mut PyObject) -> *mut PyObject;

/// pyo3-ffi's `PyObject_Call` called as one that may unwind. Not a second
/// `extern "C-unwind"` declaration of the symbol: LLVM keeps one declaration
/// per symbol, and pyo3-ffi's (`extern "C"`, so `nounwind`) can win, which
/// drops the landing pad that parks the thread. The pointer goes through
/// `black_box` so that the call stays indirect, typed by its pointer.
fn py_object_call() -> CallFn {
    let declared: DeclaredCallFn = pyo3::ffi::PyObject_Call;
    // SAFETY: the same function, signature and calling convention; "C-unwind"
    // only says that an unwind may leave it, which CPython's `pthread_exit`
    // does (see the module docs).
    std::hint::black_box(unsafe { std::mem::transmute::<DeclaredCallFn, CallFn>(declared) })
}

/// `PyIter_Next` called as one that may unwind (see [`py_object_call`]).
fn py_iter_next() -> NextFn {
    let declared: DeclaredNextFn = pyo3::ffi::PyIter_Next;
    // SAFETY: as in `py_object_call`.
    std::hint::black_box(unsafe { std::mem::transmute::<DeclaredNextFn, NextFn>(declared) })
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
    let call = py_object_call();
    let guard = ParkOnExit;
    // SAFETY: the GIL is held (`py`); `f` and `args` are live objects that
    // outlive the call (borrowed here, the call takes its own references if
    // it keeps them); NULL keyword arguments are allowed. Called as
    // `C-unwind`, so a forced unwind out of it reaches `guard`.
    let out = unsafe { call(f.as_ptr(), args.as_ptr(), std::ptr::null_mut()) };
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
    let next = py_iter_next();
    let guard = ParkOnExit;
    // SAFETY: the GIL is held (`py`) and `it` is a live iterator (a
    // `PyIterator` is one by its type's check); called as `C-unwind` (see
    // `py_iter_next`).
    let out = unsafe { next(it.as_ptr()) };
    std::mem::forget(guard);
    // SAFETY: `PyIter_Next` returns a new reference, or NULL at the end (no
    // error set) or on an error (set).
    match unsafe { Bound::from_owned_ptr_or_opt(py, out) } {
        Some(v) => Some(Ok(v)),
        None => PyErr::take(py).map(Err),
    }
}
