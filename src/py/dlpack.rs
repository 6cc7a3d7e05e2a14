//! `ferrofeed._core.Tensor`: a pooled host tensor that speaks `DLPack`.
//!
//! `__dlpack__` hands out a capsule that owns a managed tensor
//! ([`crate::staging::Tensor::export`]), named `"dltensor_versioned"` for a
//! consumer that passes `max_version >= (1, 0)`, `"dltensor"` otherwise. A
//! consumer takes the managed tensor by renaming the capsule to
//! `"used_dltensor_versioned"` / `"used_dltensor"`; from then on it, not
//! the capsule, calls the deleter. The capsule's destructor calls the deleter
//! only when the capsule still has its original name (it was never
//! consumed), so each managed tensor is deleted exactly once whichever way it
//! goes, and a consumed capsule cannot be consumed again (consumers check the
//! name).

use std::ffi::{c_void, CStr};
use std::ptr::NonNull;

use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyInt, PyTuple};

use crate::dlpack::{
    delete_managed_legacy, delete_managed_versioned, device_name, DLDevice, DLDeviceType,
    DLManagedTensor, DLManagedTensorVersioned, DType, ExportRequest, CAPSULE_NAME_LEGACY,
    CAPSULE_NAME_VERSIONED, MAX_NDIM,
};
use crate::staging::{ManagedPtr, Tensor};

/// Parses a dtype name (`"float32"`, `"bfloat16"`, ...).
pub(crate) fn parse_dtype(name: &str) -> PyResult<DType> {
    name.parse::<DType>()
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Parses a shape: an int or a sequence of non-negative ints.
pub(crate) fn parse_shape(shape: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    let dim = |v: &Bound<'_, PyAny>| -> PyResult<usize> {
        let d: i64 = v.extract().map_err(|_| {
            PyTypeError::new_err(format!(
                "a shape is an int or a sequence of ints, not {}",
                v.get_type()
                    .name()
                    .map_or_else(|_| "?".to_owned(), |n| n.to_string())
            ))
        })?;
        usize::try_from(d)
            .map_err(|_| PyValueError::new_err(format!("negative dimensions are not allowed: {d}")))
    };
    if shape.is_instance_of::<PyInt>() {
        return Ok(vec![dim(shape)?]);
    }
    let mut dims = Vec::new();
    for item in shape
        .try_iter()
        .map_err(|_| PyTypeError::new_err("a shape is an int or a sequence of ints"))?
    {
        dims.push(dim(&item?)?);
        if dims.len() > MAX_NDIM {
            return Err(PyValueError::new_err(format!(
                "a tensor has at most {MAX_NDIM} dimensions"
            )));
        }
    }
    Ok(dims)
}

/// A tensor in a pooled, 64-byte aligned host buffer, exported by `DLPack`.
#[pyclass(name = "Tensor", module = "ferrofeed._core", frozen)]
pub(crate) struct PyTensor {
    inner: Tensor,
}

impl PyTensor {
    pub(crate) fn new(inner: Tensor) -> Self {
        Self { inner }
    }
}

/// Destructor of `"dltensor_versioned"` capsules.
///
/// # Safety
///
/// Called by the interpreter with a live capsule.
unsafe extern "C" fn versioned_capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: `capsule` is live. IsValid sets no exception; when it says the
    // capsule still has our name, it was never consumed, so it still owns
    // the managed tensor it was created with, which is deleted here once.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, CAPSULE_NAME_VERSIONED.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(capsule, CAPSULE_NAME_VERSIONED.as_ptr());
            delete_managed_versioned(p.cast::<DLManagedTensorVersioned>());
        }
    }
}

/// Destructor of `"dltensor"` capsules; see [`versioned_capsule_destructor`].
///
/// # Safety
///
/// Called by the interpreter with a live capsule.
unsafe extern "C" fn legacy_capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: as in `versioned_capsule_destructor`.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, CAPSULE_NAME_LEGACY.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(capsule, CAPSULE_NAME_LEGACY.as_ptr());
            delete_managed_legacy(p.cast::<DLManagedTensor>());
        }
    }
}

/// Wraps an owned managed tensor in a capsule that owns it.
fn capsule(py: Python<'_>, managed: ManagedPtr) -> PyResult<Bound<'_, PyAny>> {
    let (ptr, name, destructor): (*mut c_void, &'static CStr, ffi::PyCapsule_Destructor) =
        match managed {
            ManagedPtr::Versioned(p) => (
                p.as_ptr().cast(),
                CAPSULE_NAME_VERSIONED,
                versioned_capsule_destructor,
            ),
            ManagedPtr::Legacy(p) => (
                p.as_ptr().cast(),
                CAPSULE_NAME_LEGACY,
                legacy_capsule_destructor,
            ),
        };
    // SAFETY: `ptr` is non-null; `name` is a static C string, so it outlives
    // the capsule as the C API requires. On success the capsule owns the
    // managed tensor (its destructor deletes it unless consumed); on failure
    // nobody does, so it is deleted here.
    unsafe {
        let cap = ffi::PyCapsule_New(ptr, name.as_ptr(), Some(destructor));
        if let Some(cap) = NonNull::new(cap) {
            return Ok(Bound::from_owned_ptr(py, cap.as_ptr()));
        }
        match managed {
            ManagedPtr::Versioned(p) => delete_managed_versioned(p.as_ptr()),
            ManagedPtr::Legacy(p) => delete_managed_legacy(p.as_ptr()),
        }
        Err(PyErr::fetch(py))
    }
}

/// `stream`: `None` or an int (anything else is refused).
fn parse_stream(stream: Option<&Bound<'_, PyAny>>) -> PyResult<Option<i64>> {
    match stream {
        None => Ok(None),
        Some(s) if s.is_none() => Ok(None),
        Some(s) => s.extract::<i64>().map(Some).map_err(|_| {
            PyBufferError::new_err(
                "stream must be None or an int; a tensor in host memory has no stream",
            )
        }),
    }
}

fn numpy_from_dlpack(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static FROM_DLPACK: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    FROM_DLPACK.import(py, "numpy", "from_dlpack")
}

fn numpy_asarray(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static ASARRAY: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    ASARRAY.import(py, "numpy", "asarray")
}

#[pymethods]
impl PyTensor {
    /// Extents.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.inner.desc().shape)
    }

    /// Strides in elements (as in `DLPack` and PyTorch, not bytes as in `NumPy`).
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.inner.desc().strides)
    }

    #[getter]
    fn dtype(&self) -> &'static str {
        self.inner.desc().dtype.name()
    }

    #[getter]
    fn device(&self) -> String {
        device_name(self.inner.desc().device)
    }

    #[getter]
    fn ndim(&self) -> usize {
        self.inner.desc().shape.len()
    }

    #[getter]
    fn size(&self) -> usize {
        self.inner.desc().numel()
    }

    #[getter]
    fn itemsize(&self) -> usize {
        self.inner.desc().dtype.itemsize()
    }

    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.nbytes()
    }

    #[getter]
    fn pinned(&self) -> bool {
        self.inner.pinned()
    }

    #[getter]
    fn data_ptr(&self) -> usize {
        self.inner.data_ptr() as usize
    }

    fn __len__(&self) -> PyResult<usize> {
        match self.inner.desc().shape.first() {
            Some(&d) => Ok(usize::try_from(d).unwrap_or(0)),
            None => Err(PyTypeError::new_err("len() of a 0-d tensor")),
        }
    }

    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let request = ExportRequest {
            stream: parse_stream(stream)?,
            max_version,
            dl_device: dl_device.map(|(t, id)| DLDevice {
                device_type: DLDeviceType(t),
                device_id: id,
            }),
            copy,
        };
        let exported = if copy == Some(true) && self.inner.nbytes() >= 1 << 20 {
            py.detach(|| self.inner.export(&request))?
        } else {
            self.inner.export(&request)?
        };
        capsule(py, exported.into_raw())
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        let d = self.inner.desc().device;
        (d.device_type.0, d.device_id)
    }

    /// A `numpy.ndarray` view of the same memory (imports `NumPy`).
    fn numpy<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        numpy_from_dlpack(py)?.call1((slf,))
    }

    /// `NumPy`'s array protocol (`np.asarray(t)`, `np.array(t)`): a view of the
    /// same memory where `NumPy` allows one, with `NumPy` 2's `copy`: None copies only
    /// to convert to `dtype`, True always, False never (a `ValueError` when `dtype`
    /// would need one).
    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__<'py>(
        slf: &Bound<'py, Self>,
        dtype: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        if slf.get().inner.desc().dtype == DType::BF16 {
            return Err(PyTypeError::new_err(
                "a bfloat16 tensor has no NumPy array (NumPy has no bfloat16): take it with \
                 torch.from_dlpack(t) or ferrofeed.to_jax(t)",
            ));
        }
        let view = numpy_from_dlpack(py)?.call1((slf,))?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("dtype", dtype)?;
        kwargs.set_item("copy", copy)?;
        numpy_asarray(py)?.call((view,), Some(&kwargs))
    }

    fn __repr__(&self) -> String {
        let d = self.inner.desc();
        let shape = match d.shape.as_slice() {
            [one] => format!("({one},)"),
            dims => format!(
                "({})",
                dims.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        format!(
            "ferrofeed.Tensor(shape={shape}, dtype={}, device={}, pinned={})",
            d.dtype,
            device_name(d.device),
            if self.inner.pinned() { "True" } else { "False" }
        )
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTensor>()?;
    Ok(())
}
