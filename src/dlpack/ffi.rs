//! The `DLPack` 1.x C ABI, transcribed from `dlpack.h` (v1.1).
//!
//! Every type here is `#[repr(C)]` with the field order, types and sizes of
//! the header; the unit tests check the sizes and offsets against the C
//! layout on 64-bit targets. Nothing here allocates or frees: see
//! [`super::export_versioned`] and [`super::export_legacy`] for building
//! managed tensors that own Rust memory.

use std::ffi::c_void;

/// The `DLPack` ABI version this crate implements (`DLPACK_MAJOR_VERSION`).
pub const DLPACK_MAJOR_VERSION: u32 = 1;
/// The highest minor version this crate implements (`DLPACK_MINOR_VERSION`).
///
/// 1.1 only added data type codes (`float8` and friends, `bool`'s
/// sub-byte flag); the structs are those of 1.0.
pub const DLPACK_MINOR_VERSION: u32 = 1;

/// Bit 0 of [`DLManagedTensorVersioned::flags`]: the consumer must not write
/// to the data.
pub const DLPACK_FLAG_BITMASK_READ_ONLY: u64 = 1 << 0;
/// Bit 1 of [`DLManagedTensorVersioned::flags`]: the producer made a copy
/// for this export, so the consumer owns the only view of the data.
pub const DLPACK_FLAG_BITMASK_IS_COPIED: u64 = 1 << 1;
/// Bit 2 of [`DLManagedTensorVersioned::flags`]: sub-byte types are padded
/// (`DLPack` 1.1; never set by ferrofeed, which has no sub-byte types).
pub const DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED: u64 = 1 << 2;

/// `DLPackVersion`: the ABI version of a [`DLManagedTensorVersioned`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DLPackVersion {
    /// Major version; a consumer must refuse a major version it does not know.
    pub major: u32,
    /// Minor version; ABI-compatible within one major version.
    pub minor: u32,
}

/// `DLDeviceType`, as the C enum's `int32_t` values.
///
/// A newtype rather than a Rust enum: a value received from C may be any
/// integer, and reading an out-of-range Rust enum is undefined behaviour.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DLDeviceType(pub i32);

impl DLDeviceType {
    /// `kDLCPU`: host memory.
    pub const CPU: Self = Self(1);
    /// `kDLCUDA`: CUDA device memory.
    pub const CUDA: Self = Self(2);
    /// `kDLCUDAHost`: page-locked host memory allocated by CUDA. ferrofeed
    /// exports pinned memory as [`Self::CPU`] (PyTorch refuses this type),
    /// and uses this value only when a consumer asks for it by `dl_device`.
    pub const CUDA_HOST: Self = Self(3);
    /// `kDLOpenCL`.
    pub const OPENCL: Self = Self(4);
    /// `kDLVulkan`.
    pub const VULKAN: Self = Self(7);
    /// `kDLMetal`.
    pub const METAL: Self = Self(8);
    /// `kDLVPI`.
    pub const VPI: Self = Self(9);
    /// `kDLROCM`: ROCm device memory.
    pub const ROCM: Self = Self(10);
    /// `kDLROCMHost`: pinned host memory allocated by ROCm.
    pub const ROCM_HOST: Self = Self(11);
    /// `kDLExtDev`: reserved for extensions.
    pub const EXT_DEV: Self = Self(12);
    /// `kDLCUDAManaged`: CUDA managed (unified) memory.
    pub const CUDA_MANAGED: Self = Self(13);
    /// `kDLOneAPI`: oneAPI unified shared memory.
    pub const ONE_API: Self = Self(14);
    /// `kDLWebGPU`.
    pub const WEBGPU: Self = Self(15);
    /// `kDLHexagon`.
    pub const HEXAGON: Self = Self(16);
    /// `kDLMAIA`.
    pub const MAIA: Self = Self(17);
}

/// `DLDevice`: where the data lives.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DLDevice {
    /// The kind of device.
    pub device_type: DLDeviceType,
    /// The device's ordinal (0 for the host).
    pub device_id: i32,
}

impl DLDevice {
    /// The host: `(kDLCPU, 0)`.
    pub const CPU: Self = Self {
        device_type: DLDeviceType::CPU,
        device_id: 0,
    };
}

/// `DLDataTypeCode`, as the `uint8_t` stored in [`DLDataType::code`].
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DLDataTypeCode(pub u8);

impl DLDataTypeCode {
    /// `kDLInt`: signed integer.
    pub const INT: Self = Self(0);
    /// `kDLUInt`: unsigned integer.
    pub const UINT: Self = Self(1);
    /// `kDLFloat`: IEEE floating point.
    pub const FLOAT: Self = Self(2);
    /// `kDLOpaqueHandle`.
    pub const OPAQUE_HANDLE: Self = Self(3);
    /// `kDLBfloat`: bfloat16.
    pub const BFLOAT: Self = Self(4);
    /// `kDLComplex`.
    pub const COMPLEX: Self = Self(5);
    /// `kDLBool`.
    pub const BOOL: Self = Self(6);
}

/// `DLDataType`: element type as (code, bits, lanes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DLDataType {
    /// The type code.
    pub code: DLDataTypeCode,
    /// Bits per lane (8, 16, 32, 64).
    pub bits: u8,
    /// Lanes per element; 1 for scalars.
    pub lanes: u16,
}

/// `DLTensor`: a borrowed view (pointer, device, shape, strides, offset).
#[repr(C)]
#[derive(Debug)]
pub struct DLTensor {
    /// Start of the allocation (or the opaque device handle).
    pub data: *mut c_void,
    /// Where `data` lives.
    pub device: DLDevice,
    /// Number of dimensions.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` extents.
    pub shape: *mut i64,
    /// `ndim` strides in elements, or null for a compact row-major tensor.
    pub strides: *mut i64,
    /// Offset in bytes from `data` to the first element.
    pub byte_offset: u64,
}

/// `DLManagedTensor`: the legacy (pre-1.0, unversioned) managed tensor,
/// carried by capsules named `"dltensor"`.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The view.
    pub dl_tensor: DLTensor,
    /// The producer's context, for its deleter.
    pub manager_ctx: *mut c_void,
    /// Frees the managed tensor; the consumer calls it exactly once, when it
    /// is done with the data. May be null.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLManagedTensorVersioned`: the `DLPack` >= 1.0 managed tensor, carried by
/// capsules named `"dltensor_versioned"`.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// The ABI version of this struct.
    pub version: DLPackVersion,
    /// The producer's context, for its deleter.
    pub manager_ctx: *mut c_void,
    /// Frees the managed tensor; the consumer calls it exactly once, when it
    /// is done with the data. May be null.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// `DLPACK_FLAG_BITMASK_*` bits.
    pub flags: u64,
    /// The view.
    pub dl_tensor: DLTensor,
}

#[cfg(all(test, target_pointer_width = "64"))]
mod tests {
    use std::mem::{align_of, offset_of, size_of};

    use super::*;

    /// Sizes and offsets as a C compiler lays out `dlpack.h` on LP64.
    #[test]
    fn layouts_match_dlpack_h() {
        assert_eq!(size_of::<DLPackVersion>(), 8);
        assert_eq!(size_of::<DLDevice>(), 8);
        assert_eq!(align_of::<DLDevice>(), 4);
        assert_eq!(size_of::<DLDataType>(), 4);
        assert_eq!(offset_of!(DLDataType, bits), 1);
        assert_eq!(offset_of!(DLDataType, lanes), 2);

        assert_eq!(size_of::<DLTensor>(), 48);
        assert_eq!(offset_of!(DLTensor, data), 0);
        assert_eq!(offset_of!(DLTensor, device), 8);
        assert_eq!(offset_of!(DLTensor, ndim), 16);
        assert_eq!(offset_of!(DLTensor, dtype), 20);
        assert_eq!(offset_of!(DLTensor, shape), 24);
        assert_eq!(offset_of!(DLTensor, strides), 32);
        assert_eq!(offset_of!(DLTensor, byte_offset), 40);

        assert_eq!(size_of::<DLManagedTensor>(), 64);
        assert_eq!(offset_of!(DLManagedTensor, manager_ctx), 48);
        assert_eq!(offset_of!(DLManagedTensor, deleter), 56);

        assert_eq!(size_of::<DLManagedTensorVersioned>(), 80);
        assert_eq!(offset_of!(DLManagedTensorVersioned, version), 0);
        assert_eq!(offset_of!(DLManagedTensorVersioned, manager_ctx), 8);
        assert_eq!(offset_of!(DLManagedTensorVersioned, deleter), 16);
        assert_eq!(offset_of!(DLManagedTensorVersioned, flags), 24);
        assert_eq!(offset_of!(DLManagedTensorVersioned, dl_tensor), 32);
    }

    #[test]
    fn option_fn_pointer_is_a_nullable_pointer() {
        assert_eq!(
            size_of::<Option<unsafe extern "C" fn(*mut DLManagedTensor)>>(),
            size_of::<*mut c_void>()
        );
    }
}
