//! `ferrofeed._core._SlotRing`: the shared batch slots of the `DataLoader`'s
//! worker processes ([`crate::staging::SlotRing`]), and `_SlotLease`, the
//! consumer's view of one slot through the buffer protocol.

use std::ffi::c_int;
use std::os::raw::c_void;

use pyo3::exceptions::{PyOSError, PyRuntimeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::convert::{fields_dict, fill_byte_buffer};
use crate::staging::{SlotError, SlotLease, SlotRing};

impl From<SlotError> for PyErr {
    #[cold]
    fn from(err: SlotError) -> PyErr {
        let message = err.to_string();
        match err {
            SlotError::Io { source, .. } => {
                PyOSError::new_err((source.raw_os_error().unwrap_or(0), message))
            }
            _ => PyRuntimeError::new_err(message),
        }
    }
}

/// A growable set of shared-memory batch slots (memfd), owned by the main
/// process; workers get a slot's descriptor and write batches into it.
#[pyclass(name = "_SlotRing", module = "ferrofeed._core", frozen)]
struct PySlotRing {
    ring: SlotRing,
}

#[pymethods]
impl PySlotRing {
    #[new]
    fn new() -> Self {
        Self {
            ring: SlotRing::new(),
        }
    }

    /// Creates a new free slot; returns its number.
    fn create(&self) -> PyResult<usize> {
        Ok(self.ring.create()?)
    }

    /// Takes the lowest free slot for a worker (it becomes dispatched), or
    /// returns None when all are in use.
    fn acquire(&self) -> Option<usize> {
        self.ring.acquire()
    }

    /// Gives back a dispatched slot that came back without a batch to lease.
    fn release(&self, id: usize) -> PyResult<()> {
        Ok(self.ring.release(id)?)
    }

    /// The slot's descriptor, owned by the ring (do not close it).
    fn fd(&self, id: usize) -> PyResult<i32> {
        Ok(self.ring.raw_fd(id)?)
    }

    /// Leases the first `nbytes` of dispatched slot `id` to the consumer.
    fn lease(&self, py: Python<'_>, id: usize, nbytes: usize) -> PyResult<PySlotLease> {
        // Mapping a grown slot is a system call: no need to hold the GIL.
        let lease = py.detach(|| self.ring.lease(id, nbytes))?;
        Ok(PySlotLease { lease })
    }

    /// Page-locks the slots for CUDA from now on (best effort); returns None,
    /// or why pinned memory is unavailable in this process.
    fn pin_for_cuda(&self, py: Python<'_>) -> Option<String> {
        // The first call probes the driver (cuInit): not under the GIL.
        py.detach(|| self.ring.pin_for_cuda()).err()
    }

    /// The ring's counters: slots, free, dispatched, leased, bytes, leases,
    /// pinned (slots page-locked for CUDA), `pin_error` (why the last slot
    /// could not be, or None).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.ring.stats();
        let d = fields_dict!(py, s => slots, free, dispatched, leased, bytes, leases, pinned);
        d.set_item("pin_error", self.ring.pin_error())?;
        Ok(d)
    }
}

/// The consumer's view of one slot's batch bytes (writable, through the
/// buffer protocol). Arrays made over it keep it alive; the slot is free
/// again when the last of them is gone.
#[pyclass(name = "_SlotLease", module = "ferrofeed._core", frozen)]
struct PySlotLease {
    lease: SlotLease,
}

#[pymethods]
impl PySlotLease {
    /// Whether the bytes are page-locked for CUDA.
    #[getter]
    fn pinned(&self) -> bool {
        self.lease.is_pinned()
    }

    /// The slot's number.
    #[getter]
    fn slot(&self) -> usize {
        self.lease.id()
    }

    fn __len__(&self) -> usize {
        self.lease.len()
    }

    /// # Safety
    ///
    /// Called by the interpreter with a valid, writable `view`.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let lease = &slf.get().lease;
        let (buf, len) = (lease.as_ptr().cast::<c_void>(), lease.len());
        // SAFETY: the interpreter gives a valid `view`. `buf` points to `len`
        // mapped bytes that stay mapped while the lease lives (`SlotLease`'s
        // Safety note), and `slf`, which holds the lease, is the owner. While
        // leased, the slot is not dispatched to any worker, so the consumer
        // is its only writer.
        unsafe { fill_byte_buffer(view, flags, slf.into_any(), buf, len, None) }
    }

    fn __repr__(&self) -> String {
        format!(
            "<_SlotLease slot={} nbytes={}>",
            self.lease.id(),
            self.lease.len()
        )
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySlotRing>()?;
    m.add_class::<PySlotLease>()
}
