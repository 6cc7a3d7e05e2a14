//! A pooled buffer with a shape and a dtype, exported by `DLPack`.

use std::ptr::NonNull;
use std::sync::Arc;

use super::{BufferPool, Pinning, PooledBuffer, StagingError};
use crate::dlpack::{
    self, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DType,
    ExportRequest, TensorDesc, DLPACK_FLAG_BITMASK_IS_COPIED,
};

/// A row-major tensor in a [`PooledBuffer`] on the host.
///
/// Cloning is cheap (the buffer is shared). Every `DLPack` export holds its
/// own reference to the buffer, so the memory stays valid while any consumer
/// holds a view, after the `Tensor` and the pool are gone; the buffer goes
/// back to its pool when the last of them lets go.
///
/// # Soundness
///
/// An export hands the buffer's address to a consumer that may write to it
/// at any time, so safe code must never get a slice of a buffer that is or
/// may be exported: the buffer itself (whose `Deref` gives a `&[u8]`) is not
/// reachable from outside the crate, and [`Tensor::bytes_mut`] gives the
/// bytes only while the buffer is not shared (never exported, never cloned).
///
/// ```compile_fail
/// # use ferrofeed::dlpack::DType;
/// # use ferrofeed::staging::{BufferPool, PoolConfig, Tensor};
/// let pool = BufferPool::new(PoolConfig::default()).unwrap();
/// let t = Tensor::zeros(&pool, &[4], DType::U8).unwrap();
/// let bytes: &[u8] = &t.buffer()[..]; // not public: would alias an export
/// ```
#[derive(Debug, Clone)]
pub struct Tensor {
    buffer: Arc<PooledBuffer>,
    desc: TensorDesc,
}

/// A raw pointer to a managed tensor of either ABI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManagedPtr {
    /// A `DLManagedTensorVersioned`.
    Versioned(NonNull<DLManagedTensorVersioned>),
    /// A legacy `DLManagedTensor`.
    Legacy(NonNull<DLManagedTensor>),
}

/// A managed tensor made by [`Tensor::export`], owned: dropping it calls the
/// deleter, [`Exported::into_raw`] hands it over to a consumer instead.
#[derive(Debug)]
pub struct Exported(ManagedPtr);

// SAFETY: an `Exported` exclusively owns its managed tensor, whose heap block
// holds only plain data and an `Arc<PooledBuffer>` (Send + Sync); the
// deleter may run on any thread.
unsafe impl Send for Exported {}

impl Exported {
    /// Gives up ownership: the caller now has to have the deleter called
    /// exactly once.
    pub fn into_raw(self) -> ManagedPtr {
        std::mem::ManuallyDrop::new(self).0
    }

    /// The pointer, still owned by `self`.
    pub fn as_raw(&self) -> ManagedPtr {
        self.0
    }

    /// The `DLPack` version, `None` for a legacy tensor.
    pub fn version(&self) -> Option<DLPackVersion> {
        match self.0 {
            // SAFETY: the managed tensor is live until `self` is dropped.
            ManagedPtr::Versioned(p) => Some(unsafe { p.as_ref() }.version),
            ManagedPtr::Legacy(_) => None,
        }
    }

    /// The flags (always 0 for a legacy tensor, which has none).
    pub fn flags(&self) -> u64 {
        match self.0 {
            // SAFETY: the managed tensor is live until `self` is dropped.
            ManagedPtr::Versioned(p) => unsafe { p.as_ref() }.flags,
            ManagedPtr::Legacy(_) => 0,
        }
    }

    /// The `DLTensor` inside.
    pub fn dl_tensor(&self) -> &dlpack::DLTensor {
        // SAFETY: the managed tensor is live until `self` is dropped, and
        // nothing writes to it meanwhile.
        unsafe {
            match &self.0 {
                ManagedPtr::Versioned(p) => &p.as_ref().dl_tensor,
                ManagedPtr::Legacy(p) => &p.as_ref().dl_tensor,
            }
        }
    }
}

impl Drop for Exported {
    fn drop(&mut self) {
        // SAFETY: an `Exported` that was not `into_raw`'d still owns its
        // managed tensor, which nobody else has seen.
        unsafe {
            match self.0 {
                ManagedPtr::Versioned(p) => dlpack::delete_managed_versioned(p.as_ptr()),
                ManagedPtr::Legacy(p) => dlpack::delete_managed_legacy(p.as_ptr()),
            }
        }
    }
}

impl Tensor {
    /// A tensor of `shape` and `dtype` over `buffer`, row-major from its
    /// start.
    ///
    /// # Errors
    ///
    /// [`StagingError::Dlpack`] for a shape that is too large, and
    /// [`StagingError::BufferTooSmall`] when it does not fit in `buffer`.
    pub fn from_buffer(
        buffer: PooledBuffer,
        shape: &[usize],
        dtype: DType,
    ) -> Result<Self, StagingError> {
        let desc = TensorDesc::contiguous(shape, dtype, DLDevice::CPU)?;
        if desc.nbytes() > buffer.len() {
            return Err(StagingError::BufferTooSmall {
                needed: desc.nbytes(),
                len: buffer.len(),
            });
        }
        Ok(Self {
            buffer: Arc::new(buffer),
            desc,
        })
    }

    /// A tensor from `pool` whose contents are unspecified (a reused buffer
    /// keeps what its last user wrote).
    ///
    /// # Errors
    ///
    /// As [`BufferPool::acquire`] and [`Tensor::from_buffer`].
    pub fn empty(pool: &BufferPool, shape: &[usize], dtype: DType) -> Result<Self, StagingError> {
        let desc = TensorDesc::contiguous(shape, dtype, DLDevice::CPU)?;
        Self::from_buffer(pool.acquire(desc.nbytes())?, shape, dtype)
    }

    /// A tensor from `pool` filled with zeros.
    ///
    /// # Errors
    ///
    /// As [`Tensor::empty`].
    pub fn zeros(pool: &BufferPool, shape: &[usize], dtype: DType) -> Result<Self, StagingError> {
        let desc = TensorDesc::contiguous(shape, dtype, DLDevice::CPU)?;
        let mut buffer = pool.acquire(desc.nbytes())?;
        buffer.fill(0);
        Self::from_buffer(buffer, shape, dtype)
    }

    /// The tensor's bytes, writable, when nothing else shares its buffer
    /// (it was never exported or cloned); `None` otherwise.
    pub fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        let n = self.desc.nbytes();
        Arc::get_mut(&mut self.buffer).map(|b| &mut b[..n])
    }

    /// The description (shape, strides in elements, dtype, device).
    pub fn desc(&self) -> &TensorDesc {
        &self.desc
    }

    /// Whether the memory is pinned.
    pub fn pinned(&self) -> bool {
        self.buffer.pinned()
    }

    /// Size in bytes.
    pub fn nbytes(&self) -> usize {
        self.desc.nbytes()
    }

    /// Address of the first element.
    pub fn data_ptr(&self) -> *mut u8 {
        self.buffer.as_ptr()
    }

    /// Exports the tensor as a `DLPack` managed tensor, following the array
    /// API rules of [`dlpack::negotiate`]. Without a copy, the export shares
    /// the buffer (it holds an `Arc` of it); with one, it owns a fresh
    /// standalone buffer, pinned if the source is.
    ///
    /// # Errors
    ///
    /// [`StagingError::Dlpack`] when the request cannot be met; allocation
    /// errors for a copy.
    pub fn export(&self, request: &ExportRequest) -> Result<Exported, StagingError> {
        let plan = dlpack::negotiate(request, self.desc.device, self.pinned())?;
        let (owner, copied) = if plan.copy {
            (Arc::new(self.copy_buffer(plan.device)?), true)
        } else {
            (Arc::clone(&self.buffer), false)
        };
        let desc = self.desc.with_device(plan.device);
        let data = owner.as_ptr().cast();
        Ok(match plan.version {
            Some(version) => {
                let flags = if copied {
                    DLPACK_FLAG_BITMASK_IS_COPIED
                } else {
                    0
                };
                Exported(ManagedPtr::Versioned(dlpack::export_versioned(
                    data, &desc, owner, version, flags,
                )))
            }
            None => Exported(ManagedPtr::Legacy(dlpack::export_legacy(
                data, &desc, owner,
            ))),
        })
    }

    /// A copy of the bytes in a new standalone buffer (pinned if the source
    /// is pinned, or if `device` is CUDA host memory).
    fn copy_buffer(&self, device: DLDevice) -> Result<PooledBuffer, StagingError> {
        let wants_pinned = device.device_type == DLDeviceType::CUDA_HOST;
        let pinning = if wants_pinned {
            Pinning::Required
        } else if self.pinned() {
            Pinning::Auto
        } else {
            Pinning::Off
        };
        let n = self.nbytes();
        let copy = PooledBuffer::standalone(n, pinning)?;
        // SAFETY: both blocks hold at least `n` bytes (`from_buffer` checked
        // the source, the copy was made that size) and are distinct
        // allocations. The source is read through a raw pointer because a
        // consumer may hold a view of it (see `PooledBuffer`'s Safety note).
        unsafe { std::ptr::copy_nonoverlapping(self.buffer.as_ptr(), copy.as_ptr(), n) };
        Ok(copy)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::dlpack::ffi::DLDataTypeCode;
    use crate::staging::PoolConfig;

    fn pool() -> BufferPool {
        BufferPool::new(PoolConfig {
            max_buffers: Some(4),
            timeout: Some(Duration::from_millis(10)),
            pinning: Pinning::Off,
            ..PoolConfig::default()
        })
        .unwrap()
    }

    fn versioned() -> ExportRequest {
        ExportRequest {
            max_version: Some((1, 0)),
            ..ExportRequest::default()
        }
    }

    #[test]
    fn export_shares_the_buffer_and_returns_it_once() {
        let p = pool();
        let t = Tensor::zeros(&p, &[2, 3], DType::F32).unwrap();
        let ptr = t.data_ptr();
        let e = t.export(&versioned()).unwrap();
        let dl = e.dl_tensor();
        assert_eq!(dl.data.cast::<u8>(), ptr);
        assert_eq!(dl.dtype.code, DLDataTypeCode::FLOAT);
        assert_eq!(e.version(), Some(DLPackVersion { major: 1, minor: 0 }));
        let legacy = t.export(&ExportRequest::default()).unwrap();
        assert!(matches!(legacy.as_raw(), ManagedPtr::Legacy(_)));
        drop(t);
        assert_eq!(p.stats().in_use, 1, "the exports keep the buffer");
        drop(e);
        assert_eq!(p.stats().in_use, 1);
        drop(legacy);
        let s = p.stats();
        assert_eq!((s.in_use, s.releases, s.idle), (0, 1, 1));
    }

    #[test]
    fn copy_exports_a_fresh_buffer() {
        let p = pool();
        let t = Tensor::empty(&p, &[4], DType::I32).unwrap();
        // SAFETY: nothing else views the buffer yet; it is 64-byte aligned.
        #[allow(clippy::cast_ptr_alignment)]
        unsafe {
            t.data_ptr().cast::<i32>().write(42);
        }
        let e = t
            .export(&ExportRequest {
                copy: Some(true),
                ..versioned()
            })
            .unwrap();
        let dl = e.dl_tensor();
        assert_ne!(dl.data.cast::<u8>(), t.data_ptr());
        assert_eq!(dl.data as usize % 64, 0);
        // SAFETY: the copy holds 4 initialized i32.
        assert_eq!(unsafe { dl.data.cast::<i32>().read() }, 42);
        assert_eq!(e.flags(), DLPACK_FLAG_BITMASK_IS_COPIED);
        assert_eq!(p.stats().allocated, 1, "copies do not come from the pool");
    }

    #[test]
    fn impossible_requests_are_refused() {
        let p = pool();
        let t = Tensor::empty(&p, &[1], DType::U8).unwrap();
        let cuda = ExportRequest {
            dl_device: Some(DLDevice {
                device_type: DLDeviceType::CUDA,
                device_id: 0,
            }),
            ..ExportRequest::default()
        };
        let e = t.export(&cuda).unwrap_err();
        assert!(
            matches!(e, StagingError::Dlpack(ref d) if d.is_request_error()),
            "{e}"
        );
    }

    #[test]
    fn a_buffer_too_small_is_refused() {
        let p = pool();
        let b = p.acquire(10).unwrap();
        assert!(matches!(
            Tensor::from_buffer(b, &[3], DType::F32),
            Err(StagingError::BufferTooSmall {
                needed: 12,
                len: 10
            })
        ));
    }
}
