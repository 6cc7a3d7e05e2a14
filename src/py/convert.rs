//! Conversions the wrappers share: counters as a `dict`, bytes as a buffer.

use std::ffi::{c_int, c_void};

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

/// A new `dict` of the named fields of a stats snapshot, each under its own
/// name and in the order given: `fields_dict!(py, s => slots, free)` is
/// `{"slots": s.slots, "free": s.free}`. Keys that are not field names
/// (converted values) are set on the result afterwards.
///
/// It uses `?` on each `set_item`, so it goes in a function returning
/// `PyResult`.
macro_rules! fields_dict {
    ($py:expr, $s:expr => $($field:ident),+ $(,)?) => {{
        let d = ::pyo3::types::PyDict::new($py);
        $(d.set_item(stringify!($field), $s.$field)?;)+
        d
    }};
}
pub(crate) use fields_dict;

/// Fills `view` (for `__getbuffer__`) as a one-dimensional buffer of the
/// `len` unsigned bytes at `buf`, exported by `owner`: what
/// `PyBuffer_FillInfo` does, with the format, shape and strides given only
/// when `flags` asks for them. `read_only` is `Some(why)` for a buffer the
/// consumer must not write (a writable request fails with `why`), `None`
/// for one it may.
///
/// # Errors
///
/// `BufferError` for a null `view`, or for a writable request of a
/// read-only buffer.
///
/// # Safety
///
/// `view` is null or points to a `Py_buffer` the caller gives us to fill.
/// The `len` bytes at `buf` stay valid for as long as `owner` lives (the
/// interpreter holds the strong reference taken here until the buffer is
/// released); a writable buffer's bytes have no other writer meanwhile.
pub(crate) unsafe fn fill_byte_buffer(
    view: *mut ffi::Py_buffer,
    flags: c_int,
    owner: Bound<'_, PyAny>,
    buf: *mut c_void,
    len: usize,
    read_only: Option<&str>,
) -> PyResult<()> {
    if view.is_null() {
        return Err(PyBufferError::new_err("no Py_buffer to fill"));
    }
    if let Some(why) = read_only {
        if flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err(why.to_owned()));
        }
    }
    // SAFETY: `view` is non-null and points to a Py_buffer the caller gives
    // us to fill; `buf` and `len` are valid while `owner` lives (this
    // function's contract), and `obj` takes `owner`'s strong reference.
    // `shape` and `strides` point into the Py_buffer itself (its `len` and
    // `itemsize`), which lives as long as the export.
    unsafe {
        (*view).obj = owner.into_ptr();
        (*view).buf = buf;
        (*view).len = len as ffi::Py_ssize_t;
        (*view).readonly = c_int::from(read_only.is_some());
        (*view).itemsize = 1;
        (*view).format = if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT {
            c"B".as_ptr().cast_mut()
        } else {
            std::ptr::null_mut()
        };
        (*view).ndim = 1;
        (*view).shape = if flags & ffi::PyBUF_ND == ffi::PyBUF_ND {
            &raw mut (*view).len
        } else {
            std::ptr::null_mut()
        };
        (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
            &raw mut (*view).itemsize
        } else {
            std::ptr::null_mut()
        };
        (*view).suboffsets = std::ptr::null_mut();
        (*view).internal = std::ptr::null_mut();
    }
    Ok(())
}
