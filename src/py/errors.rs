//! The one mapping from core errors to the Python exception hierarchy
//! defined in `ferrofeed/_errors.py`.

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use crate::arena::ArenaError;
use crate::image::{ImageError, SpecError};
use crate::plan::{PlanError, ShardPlanError};
use crate::remote::RemoteError;
use crate::shards::ShardError;
use crate::staging::StagingError;

/// Looks up (once) an exception class of `ferrofeed._errors`.
fn class<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Py<PyType>>,
    name: &str,
) -> PyResult<&'py Bound<'py, PyType>> {
    cell.import(py, "ferrofeed._errors", name)
}

macro_rules! exception_classes {
    ($($fn_name:ident => $py_name:literal),* $(,)?) => {
        $(
            pub(crate) fn $fn_name(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
                static CELL: PyOnceLock<Py<PyType>> = PyOnceLock::new();
                class(py, &CELL, $py_name)
            }
        )*
    };
}

exception_classes! {
    not_found => "ArenaNotFoundError",
    exists => "ArenaExistsError",
    corrupt => "ArenaCorruptError",
    full => "ArenaFullError",
    io_error => "ArenaIOError",
    closed => "ArenaClosedError",
    pool_exhausted => "PoolExhaustedError",
    pinned_unavailable => "PinnedMemoryError",
    allocation => "BufferAllocationError",
    dlpack_request => "DLPackError",
    image_decode => "ImageDecodeError",
    image_read => "ImageReadError",
    shard_read => "ShardReadError",
    shard_corrupt => "ShardCorruptError",
    shard_field => "ShardFieldError",
    shard_not_found => "ShardNotFoundError",
    shard_denied => "ShardPermissionError",
    collate_type => "CollateTypeError",
    collate_value => "CollateValueError",
}

/// Builds an exception of `cls` whose `str()` is `msg`; for `OSError`
/// subclasses, `errno` and `filename` are set as attributes so that the
/// message is not decorated with them.
fn make(
    cls: PyResult<&Bound<'_, PyType>>,
    msg: &str,
    errno: Option<i32>,
    filename: Option<String>,
) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let exc = cls?.call1((msg,))?;
        if let Some(errno) = errno {
            exc.setattr("errno", errno)?;
        }
        if let Some(f) = filename {
            exc.setattr("filename", f)?;
        }
        Ok(PyErr::from_value(exc))
    };
    build().unwrap_or_else(|e| {
        PyRuntimeError::new_err(format!("{msg} (and the exception class failed: {e})"))
    })
}

/// The error raised when an arena is used after `close()`.
#[cold]
pub(crate) fn closed_error(py: Python<'_>, path: &str) -> PyErr {
    make(closed(py), &format!("arena {path:?} is closed"), None, None)
}

/// A `CollateValueError` with the given message: the items of a batch do not
/// collate (images of different shapes, labels on some only).
#[cold]
pub(crate) fn collate_value_error(py: Python<'_>, msg: &str) -> PyErr {
    make(collate_value(py), msg, None, None)
}

/// A `CollateTypeError` with the given message: an item that the native
/// collate does not take.
#[cold]
pub(crate) fn collate_type_error(py: Python<'_>, msg: &str) -> PyErr {
    make(collate_type(py), msg, None, None)
}

/// An `ArenaCorruptError` with the given message.
#[cold]
pub(crate) fn corrupt_error(py: Python<'_>, msg: &str) -> PyErr {
    make(corrupt(py), msg, None, None)
}

impl From<ArenaError> for PyErr {
    #[cold]
    fn from(err: ArenaError) -> PyErr {
        Python::attach(|py| {
            let msg = err.to_string();
            let errno = err.raw_os_error();
            let path = match &err {
                ArenaError::NotFound { path }
                | ArenaError::AlreadyExists { path }
                | ArenaError::NoSpace { path, .. }
                | ArenaError::Io { path, .. } => Some(path.display().to_string()),
                _ => None,
            };
            let cls = match &err {
                ArenaError::NotFound { .. } => not_found(py),
                ArenaError::AlreadyExists { .. } => exists(py),
                ArenaError::NoSpace { .. } => full(py),
                e if e.is_corrupt() => corrupt(py),
                _ => io_error(py),
            };
            make(cls, &msg, errno, path)
        })
    }
}

impl From<StagingError> for PyErr {
    /// Pool and tensor errors: `PoolExhaustedError` (a `TimeoutError`),
    /// `PinnedMemoryError` (a `RuntimeError`), `BufferAllocationError` (a
    /// `MemoryError`), `DLPackError` (a `BufferError`, as the array API wants
    /// for a `__dlpack__` request that cannot be met); invalid arguments are
    /// plain `ValueError`s.
    #[cold]
    fn from(err: StagingError) -> PyErr {
        Python::attach(|py| {
            let msg = err.to_string();
            let cls = match &err {
                StagingError::Exhausted { .. } => pool_exhausted(py),
                StagingError::PinnedUnavailable { .. } => pinned_unavailable(py),
                StagingError::OutOfMemory { .. } => allocation(py),
                StagingError::Dlpack(e) if e.is_request_error() => dlpack_request(py),
                _ => return PyValueError::new_err(msg),
            };
            make(cls, &msg, None, None)
        })
    }
}

impl From<ImageError> for PyErr {
    /// `ImageReadError` (an `OSError`, with `errno` and `filename`) when a
    /// file cannot be read; a plain `ValueError` for an invalid transform;
    /// `ImageDecodeError` (a `ValueError`) for everything about the bytes.
    /// Every message starts with the file's path or the item's index.
    #[cold]
    fn from(err: ImageError) -> PyErr {
        Python::attach(|py| {
            let msg = err.to_string();
            match &err {
                ImageError::Io { name, source } => make(
                    image_read(py),
                    &msg,
                    source.raw_os_error(),
                    Some(name.clone()),
                ),
                ImageError::InvalidTransform { .. } | ImageError::Encode { .. } => {
                    PyValueError::new_err(msg)
                }
                _ => make(image_decode(py), &msg, None, None),
            }
        })
    }
}

impl From<PlanError> for PyErr {
    /// Every [`PlanError`] is an argument out of range: `ValueError`.
    #[cold]
    fn from(err: PlanError) -> PyErr {
        PyValueError::new_err(err.to_string())
    }
}

impl From<SpecError> for PyErr {
    /// An invalid image spec or batch layout: a `ValueError`.
    #[cold]
    fn from(err: SpecError) -> PyErr {
        PyValueError::new_err(err.to_string())
    }
}

impl From<ShardPlanError> for PyErr {
    /// Every [`ShardPlanError`] is an argument that does not fit: `ValueError`.
    #[cold]
    fn from(err: ShardPlanError) -> PyErr {
        PyValueError::new_err(err.to_string())
    }
}

/// Which `ferrofeed._errors` class a sharded source's error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShardClass {
    /// `ShardReadError` (an `OSError`): the shard cannot be opened or read.
    Read,
    /// `ShardCorruptError` (a `ValueError`): its content is not what it should be.
    Corrupt,
    /// `ShardFieldError` (a `LookupError`): a sample lacks a field.
    Field,
    /// `ShardNotFoundError` (a `ShardReadError` and `FileNotFoundError`): a
    /// remote object or its bucket does not exist.
    NotFound,
    /// `ShardPermissionError` (a `ShardReadError` and `PermissionError`):
    /// the store refused the credentials.
    Denied,
}

/// A shard exception of `class` whose `str()` is `msg`, with `shard` and
/// `at` (where in the shard) as attributes.
#[cold]
pub(crate) fn shard_exception(
    py: Python<'_>,
    class: ShardClass,
    msg: &str,
    shard: &str,
    at: Option<&str>,
) -> PyErr {
    let cls = match class {
        ShardClass::Read => shard_read(py),
        ShardClass::Corrupt => shard_corrupt(py),
        ShardClass::Field => shard_field(py),
        ShardClass::NotFound => shard_not_found(py),
        ShardClass::Denied => shard_denied(py),
    };
    let build = || -> PyResult<PyErr> { Ok(PyErr::from_value(cls?.call1((msg, shard, at))?)) };
    build().unwrap_or_else(|e| {
        PyRuntimeError::new_err(format!("{msg} (and the exception class failed: {e})"))
    })
}

/// A [`ShardError`] as its `ferrofeed` exception: `ShardReadError` for I/O,
/// `ShardCorruptError` for the rest, naming the shard (and where in it).
#[cold]
pub(crate) fn shard_error(py: Python<'_>, err: &ShardError) -> PyErr {
    let (class, shard, at) = match err {
        ShardError::Io { shard, .. } => (ShardClass::Read, shard, None),
        ShardError::Corrupt { shard, at, .. } => (ShardClass::Corrupt, shard, Some(at.as_str())),
        ShardError::Changed { shard, .. } => (ShardClass::Corrupt, shard, None),
        ShardError::Remote { shard, source } => (remote_class(source), shard, None),
    };
    shard_exception(
        py,
        class,
        &err.to_string(),
        &shard.display().to_string(),
        at,
    )
}

/// The class of a [`RemoteError`]: missing and denied objects as their own
/// classes, a changed object as corrupt, the rest as a read error.
fn remote_class(err: &RemoteError) -> ShardClass {
    match err {
        RemoteError::NotFound { .. } => ShardClass::NotFound,
        RemoteError::Denied { .. } => ShardClass::Denied,
        RemoteError::Changed { .. } => ShardClass::Corrupt,
        _ => ShardClass::Read,
    }
}

/// A [`RemoteError`] as its `ferrofeed` exception, naming the URL; a bad
/// URL or storage option is a plain `ValueError`.
#[cold]
pub(crate) fn remote_error(py: Python<'_>, err: &RemoteError) -> PyErr {
    match err {
        RemoteError::BadUrl { .. } | RemoteError::BadOption { .. } => {
            PyValueError::new_err(err.to_string())
        }
        _ => shard_exception(py, remote_class(err), &err.to_string(), &err.url(), None),
    }
}
