//! `DLPack`: the C structs, tensor descriptions, the `__dlpack__` request
//! rules of the array API standard, and managed tensors that own Rust memory.
//!
//! `DLPack` is how ferrofeed hands a batch to `NumPy`, PyTorch and JAX
//! without a copy: the producer gives the consumer a *managed tensor*, a C
//! struct that describes the data (pointer, device, dtype, shape, strides)
//! and carries a deleter. The consumer calls the deleter once, when its last
//! view of the data is gone. Here the deleter drops a Rust *owner*, typically
//! an `Arc` of the pooled buffer the data lives in, so the buffer goes back
//! to its pool exactly when the last consumer lets go (see
//! [`crate::staging`]).
//!
//! The structs are ours rather than a crate's (see `DESIGN.md`): they are
//! small, and we need our own deleters and our own stream handshake.
//!
//! # Two ABIs
//!
//! - [`ffi::DLManagedTensorVersioned`] (`DLPack` >= 1.0, capsule name
//!   `"dltensor_versioned"`) carries a version and flags (read-only,
//!   is-copied). `NumPy` >= 2.1 and PyTorch >= 2.4 ask for it with
//!   `max_version=(1, 0)`.
//! - [`ffi::DLManagedTensor`] (legacy, capsule name `"dltensor"`), which a
//!   consumer gets when it passes no `max_version`. JAX asks this way, and
//!   copies unless the data is 64-byte aligned: every buffer of
//!   [`crate::staging`] is.
//!
//! [`negotiate`] decides which one a `__dlpack__` call gets, whether it needs
//! a copy, and refuses what cannot be done; [`export_versioned`] and
//! [`export_legacy`] build the struct.
//!
//! # Example
//!
//! ```
//! use ferrofeed::dlpack::{export_versioned, delete_managed_versioned, negotiate};
//! use ferrofeed::dlpack::{DLDevice, DType, ExportRequest, TensorDesc};
//!
//! let mut data = vec![0f32; 6];
//! let desc = TensorDesc::contiguous(&[2, 3], DType::F32, DLDevice::CPU)?;
//! let request = ExportRequest { max_version: Some((1, 0)), ..ExportRequest::default() };
//! let plan = negotiate(&request, DLDevice::CPU, false)?;
//! let version = plan.version.expect("a 1.x consumer gets a versioned tensor");
//! // The owner (here a String) lives until the deleter runs.
//! let managed = export_versioned(data.as_mut_ptr().cast(), &desc, String::from("owner"), version, 0);
//! // ... a consumer would use it, then call its deleter once:
//! unsafe { delete_managed_versioned(managed.as_ptr()) };
//! # Ok::<(), ferrofeed::dlpack::DlpackError>(())
//! ```

mod dtype;
mod error;
mod export;
pub mod ffi;

pub use dtype::DType;
pub use error::DlpackError;
pub use export::{
    delete_managed_legacy, delete_managed_versioned, export_legacy, export_versioned,
};
pub use ffi::{
    DLDataType, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion,
    DLTensor, DLPACK_FLAG_BITMASK_IS_COPIED, DLPACK_FLAG_BITMASK_READ_ONLY,
};

/// Capsule name of a legacy [`DLManagedTensor`].
pub const CAPSULE_NAME_LEGACY: &std::ffi::CStr = c"dltensor";
/// Capsule name of a [`DLManagedTensorVersioned`].
pub const CAPSULE_NAME_VERSIONED: &std::ffi::CStr = c"dltensor_versioned";
/// What a consumer renames a legacy capsule to once it owns the tensor.
pub const CAPSULE_NAME_LEGACY_USED: &std::ffi::CStr = c"used_dltensor";
/// What a consumer renames a versioned capsule to once it owns the tensor.
pub const CAPSULE_NAME_VERSIONED_USED: &std::ffi::CStr = c"used_dltensor_versioned";

/// The most dimensions a tensor may have (`NumPy`'s limit).
pub const MAX_NDIM: usize = 64;

/// `(type, id)` as text: `cpu`, `cuda:0`, `cuda_host`, or `device_type=N:id`.
pub fn device_name(d: DLDevice) -> String {
    match d.device_type {
        DLDeviceType::CPU => "cpu".to_owned(),
        DLDeviceType::CUDA => format!("cuda:{}", d.device_id),
        DLDeviceType::CUDA_HOST => "cuda_host".to_owned(),
        DLDeviceType::ROCM => format!("rocm:{}", d.device_id),
        t => format!("device_type={}:{}", t.0, d.device_id),
    }
}

/// The description of a tensor: everything in a `DLTensor` but the pointer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorDesc {
    /// Extents.
    pub shape: Vec<i64>,
    /// Strides in elements (not bytes), one per dimension.
    pub strides: Vec<i64>,
    /// Element type.
    pub dtype: DType,
    /// Offset of the first element from the data pointer, in bytes.
    pub byte_offset: u64,
    /// Where the data lives.
    pub device: DLDevice,
}

impl TensorDesc {
    /// A compact row-major (C-contiguous) tensor starting at the data pointer.
    ///
    /// # Errors
    ///
    /// [`DlpackError::TooManyDimensions`] past [`MAX_NDIM`];
    /// [`DlpackError::TooLarge`] when the byte size overflows `isize`.
    pub fn contiguous(
        shape: &[usize],
        dtype: DType,
        device: DLDevice,
    ) -> Result<Self, DlpackError> {
        if shape.len() > MAX_NDIM {
            return Err(DlpackError::TooManyDimensions(shape.len()));
        }
        let too_large = || DlpackError::TooLarge {
            shape: shape.to_vec(),
            dtype: dtype.name(),
        };
        let numel = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(too_large)?;
        let nbytes = numel.checked_mul(dtype.itemsize()).ok_or_else(too_large)?;
        if isize::try_from(nbytes).is_err() {
            return Err(too_large());
        }
        let shape_i64 = shape
            .iter()
            .map(|&d| i64::try_from(d).map_err(|_| too_large()))
            .collect::<Result<Vec<i64>, _>>()?;
        let mut strides = vec![0i64; shape.len()];
        let mut step = 1i64;
        for (s, &d) in strides.iter_mut().zip(&shape_i64).rev() {
            *s = step;
            // Saturates only past a zero extent, where strides do not matter.
            step = step.saturating_mul(d);
        }
        Ok(Self {
            shape: shape_i64,
            strides,
            dtype,
            byte_offset: 0,
            device,
        })
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape
            .iter()
            .map(|&d| usize::try_from(d).unwrap_or(0))
            .product()
    }

    /// Size of the elements in bytes (for a contiguous tensor, its span).
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.itemsize()
    }

    /// The same tensor on another device (same memory, another label).
    #[must_use]
    pub fn with_device(&self, device: DLDevice) -> Self {
        Self {
            device,
            ..self.clone()
        }
    }
}

/// The arguments of `__dlpack__(*, stream, max_version, dl_device, copy)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportRequest {
    /// The stream the consumer will use the data on; `None` for none.
    pub stream: Option<i64>,
    /// The highest `DLPack` version the consumer understands; `None` means a
    /// legacy consumer.
    pub max_version: Option<(u32, u32)>,
    /// The device the consumer wants the data on; `None` for where it is.
    pub dl_device: Option<DLDevice>,
    /// `Some(true)`: always copy; `Some(false)`: never copy; `None`: copy only
    /// if needed.
    pub copy: Option<bool>,
}

/// How to satisfy an [`ExportRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportPlan {
    /// `Some(version)` for a versioned tensor, `None` for a legacy one.
    pub version: Option<DLPackVersion>,
    /// The device to label the exported tensor with.
    pub device: DLDevice,
    /// Whether to copy the data into a fresh buffer first.
    pub copy: bool,
}

/// Decides how to answer a `__dlpack__` request for host memory on `current`
/// (`pinned`: whether it is page-locked), following the array API standard:
///
/// - `max_version` of 1.x or later: a versioned tensor of version
///   `(1, min(minor, 1))` (any 1.x minor when the consumer's major is
///   higher); absent or 0.x: a legacy tensor.
/// - `dl_device`: the tensor's own device, or `kDLCPU` (host memory is host
///   memory), or `kDLCUDAHost` when the memory is pinned: no copy needed.
///   Any other device would need a device copy, which this path cannot do.
/// - `copy=True` copies into a fresh buffer; `copy=False` never copies; no
///   request here ever needs a copy, so `copy=None` never copies either.
/// - `stream`: host memory has no stream; only `None` (and `-1`, "do not
///   synchronize") are accepted.
///
/// # Errors
///
/// [`DlpackError::UnsupportedStream`] and [`DlpackError::UnsupportedDevice`]
/// (a `BufferError` in Python).
pub fn negotiate(
    request: &ExportRequest,
    current: DLDevice,
    pinned: bool,
) -> Result<ExportPlan, DlpackError> {
    if let Some(stream) = request.stream {
        if stream != -1 {
            return Err(DlpackError::UnsupportedStream {
                stream,
                device: device_name(current),
            });
        }
    }
    let version = match request.max_version {
        Some((major, minor)) if major >= ffi::DLPACK_MAJOR_VERSION => Some(DLPackVersion {
            major: ffi::DLPACK_MAJOR_VERSION,
            minor: if major > ffi::DLPACK_MAJOR_VERSION {
                ffi::DLPACK_MINOR_VERSION
            } else {
                minor.min(ffi::DLPACK_MINOR_VERSION)
            },
        }),
        _ => None,
    };
    let device = match request.dl_device {
        None => current,
        Some(d) if d == current => d,
        Some(d)
            if d == DLDevice::CPU
                && (current.device_type == DLDeviceType::CPU
                    || current.device_type == DLDeviceType::CUDA_HOST) =>
        {
            d
        }
        Some(d) if d.device_type == DLDeviceType::CUDA_HOST && d.device_id == 0 && pinned => d,
        Some(d) => {
            return Err(DlpackError::UnsupportedDevice {
                requested: device_name(d),
                current: device_name(current),
                copy_requested: request.copy == Some(true),
            })
        }
    };
    Ok(ExportPlan {
        version,
        device,
        copy: request.copy == Some(true),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> ExportRequest {
        ExportRequest::default()
    }

    #[test]
    fn contiguous_strides_are_row_major_in_elements() {
        let d = TensorDesc::contiguous(&[2, 3, 4], DType::F16, DLDevice::CPU).unwrap();
        assert_eq!(d.strides, vec![12, 4, 1]);
        assert_eq!(d.nbytes(), 48);
        let scalar = TensorDesc::contiguous(&[], DType::I64, DLDevice::CPU).unwrap();
        assert_eq!((scalar.numel(), scalar.nbytes()), (1, 8));
        let empty = TensorDesc::contiguous(&[0, 5], DType::U8, DLDevice::CPU).unwrap();
        assert_eq!((empty.numel(), empty.strides.clone()), (0, vec![5, 1]));
    }

    #[test]
    fn contiguous_refuses_overflow_and_too_many_dims() {
        assert!(matches!(
            TensorDesc::contiguous(&[usize::MAX, 2], DType::U8, DLDevice::CPU),
            Err(DlpackError::TooLarge { .. })
        ));
        assert!(matches!(
            TensorDesc::contiguous(&[1 << 62], DType::F32, DLDevice::CPU),
            Err(DlpackError::TooLarge { .. })
        ));
        assert_eq!(
            TensorDesc::contiguous(&[1; 65], DType::U8, DLDevice::CPU),
            Err(DlpackError::TooManyDimensions(65))
        );
    }

    #[test]
    fn version_follows_max_version() {
        let cpu = DLDevice::CPU;
        let plan = |mv| {
            negotiate(
                &ExportRequest {
                    max_version: mv,
                    ..req()
                },
                cpu,
                false,
            )
            .unwrap()
            .version
        };
        assert_eq!(plan(None), None);
        assert_eq!(plan(Some((0, 8))), None);
        assert_eq!(
            plan(Some((1, 0))),
            Some(DLPackVersion { major: 1, minor: 0 })
        );
        assert_eq!(
            plan(Some((1, 5))),
            Some(DLPackVersion { major: 1, minor: 1 })
        );
        assert_eq!(
            plan(Some((2, 0))),
            Some(DLPackVersion { major: 1, minor: 1 })
        );
    }

    #[test]
    fn devices_and_copies() {
        let cpu = DLDevice::CPU;
        let cuda_host = DLDevice {
            device_type: DLDeviceType::CUDA_HOST,
            device_id: 0,
        };
        let cuda0 = DLDevice {
            device_type: DLDeviceType::CUDA,
            device_id: 0,
        };
        let with = |dl_device, copy| ExportRequest {
            dl_device,
            copy,
            ..req()
        };
        let p = negotiate(&with(Some(cpu), None), cpu, false).unwrap();
        assert_eq!((p.device, p.copy), (cpu, false));
        let p = negotiate(&with(None, Some(true)), cpu, false).unwrap();
        assert!(p.copy);
        assert!(
            !negotiate(&with(None, Some(false)), cpu, false)
                .unwrap()
                .copy
        );
        // Pinned memory may be labelled as CUDA host memory on request.
        assert_eq!(
            negotiate(&with(Some(cuda_host), None), cpu, true)
                .unwrap()
                .device,
            cuda_host
        );
        let e = negotiate(&with(Some(cuda_host), None), cpu, false).unwrap_err();
        assert!(e.is_request_error());
        for copy in [None, Some(false), Some(true)] {
            let e = negotiate(&with(Some(cuda0), copy), cpu, true).unwrap_err();
            assert!(matches!(e, DlpackError::UnsupportedDevice { .. }), "{e}");
        }
    }

    #[test]
    fn host_memory_has_no_stream() {
        let cpu = DLDevice::CPU;
        let with = |stream| ExportRequest { stream, ..req() };
        assert!(negotiate(&with(None), cpu, false).is_ok());
        assert!(negotiate(&with(Some(-1)), cpu, false).is_ok());
        let e = negotiate(&with(Some(1)), cpu, false).unwrap_err();
        assert!(e.is_request_error());
        assert!(e.to_string().contains("stream=1"), "{e}");
    }
}
