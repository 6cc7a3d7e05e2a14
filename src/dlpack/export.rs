//! Managed tensors that own a Rust value, freed by their `DLPack` deleter.
//!
//! [`export_versioned`] and [`export_legacy`] move a [`TensorDesc`] and an
//! arbitrary `owner` (typically an `Arc` of the buffer the data lives in)
//! into one heap block whose first field is the C struct. The deleter turns
//! the pointer back into that `Box` and drops it, so the owner is dropped
//! exactly when the consumer calls the deleter, exactly once.

use std::ffi::c_void;
use std::ptr::NonNull;

use super::ffi::{DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor};
use super::TensorDesc;

/// The heap block behind one exported tensor. `repr(C)` with the managed
/// struct first, so a pointer to the block is a pointer to the struct.
#[repr(C)]
struct Holder<M, O> {
    managed: M,
    /// Backing store of `dl_tensor.shape`.
    shape: Box<[i64]>,
    /// Backing store of `dl_tensor.strides`.
    strides: Box<[i64]>,
    /// Keeps the data alive; dropped by the deleter.
    owner: O,
}

fn dl_tensor(
    data: *mut c_void,
    desc: &TensorDesc,
    shape: &mut [i64],
    strides: &mut [i64],
) -> DLTensor {
    DLTensor {
        data,
        device: desc.device,
        // At most `MAX_NDIM` dimensions (checked by `TensorDesc::new`).
        ndim: i32::try_from(shape.len()).expect("ndim fits in i32"),
        dtype: desc.dtype.to_dlpack(),
        shape: shape.as_mut_ptr(),
        strides: strides.as_mut_ptr(),
        byte_offset: desc.byte_offset,
    }
}

/// Exports `data` described by `desc` as a `DLManagedTensorVersioned` that
/// owns `owner`.
///
/// The returned pointer belongs to the caller, who must eventually pass it to
/// its `deleter` exactly once (normally by handing it to a consumer that
/// does so); until then `owner` stays alive. `data` must stay valid for as
/// long as `owner` lives; that is the caller's promise, not checked here.
pub fn export_versioned<O: Send + 'static>(
    data: *mut c_void,
    desc: &TensorDesc,
    owner: O,
    version: DLPackVersion,
    flags: u64,
) -> NonNull<DLManagedTensorVersioned> {
    let mut shape: Box<[i64]> = desc.shape.clone().into_boxed_slice();
    let mut strides: Box<[i64]> = desc.strides.clone().into_boxed_slice();
    let managed = DLManagedTensorVersioned {
        version,
        manager_ctx: std::ptr::null_mut(),
        deleter: Some(delete_versioned::<O>),
        flags,
        // The boxed slices keep their heap address when moved into the holder.
        dl_tensor: dl_tensor(data, desc, &mut shape, &mut strides),
    };
    let holder = Box::new(Holder {
        managed,
        shape,
        strides,
        owner,
    });
    let raw = Box::into_raw(holder);
    // SAFETY: `raw` comes from `Box::into_raw`, so it is non-null, aligned
    // and points to an initialized holder that nobody else references.
    unsafe {
        (*raw).managed.manager_ctx = raw.cast::<c_void>();
        NonNull::new_unchecked(raw.cast::<DLManagedTensorVersioned>())
    }
}

/// Exports `data` described by `desc` as a legacy `DLManagedTensor` that
/// owns `owner`. Same contract as [`export_versioned`]; the legacy struct has
/// no version and no flags (so no read-only marking).
pub fn export_legacy<O: Send + 'static>(
    data: *mut c_void,
    desc: &TensorDesc,
    owner: O,
) -> NonNull<DLManagedTensor> {
    let mut shape: Box<[i64]> = desc.shape.clone().into_boxed_slice();
    let mut strides: Box<[i64]> = desc.strides.clone().into_boxed_slice();
    let managed = DLManagedTensor {
        dl_tensor: dl_tensor(data, desc, &mut shape, &mut strides),
        manager_ctx: std::ptr::null_mut(),
        deleter: Some(delete_legacy::<O>),
    };
    let raw = Box::into_raw(Box::new(Holder {
        managed,
        shape,
        strides,
        owner,
    }));
    // SAFETY: as in `export_versioned`.
    unsafe {
        (*raw).managed.manager_ctx = raw.cast::<c_void>();
        NonNull::new_unchecked(raw.cast::<DLManagedTensor>())
    }
}

/// The deleter of [`export_versioned`] tensors: drops the holder, and so the
/// owner. A null pointer is ignored.
///
/// # Safety
///
/// `ptr` is null or was returned by `export_versioned::<O>` and not deleted
/// yet. After the call it dangles.
unsafe extern "C" fn delete_versioned<O: Send + 'static>(ptr: *mut DLManagedTensorVersioned) {
    if ptr.is_null() {
        return;
    }
    // SAFETY: by the contract above, `ptr` is the `Box<Holder<_, O>>` that
    // `export_versioned::<O>` leaked (the managed struct is its first field
    // of a repr(C) struct), deleted for the first and only time.
    drop(unsafe { Box::from_raw(ptr.cast::<Holder<DLManagedTensorVersioned, O>>()) });
}

/// The deleter of [`export_legacy`] tensors; see [`delete_versioned`].
///
/// # Safety
///
/// `ptr` is null or was returned by `export_legacy::<O>` and not deleted yet.
unsafe extern "C" fn delete_legacy<O: Send + 'static>(ptr: *mut DLManagedTensor) {
    if ptr.is_null() {
        return;
    }
    // SAFETY: as in `delete_versioned`, for `export_legacy::<O>`.
    drop(unsafe { Box::from_raw(ptr.cast::<Holder<DLManagedTensor, O>>()) });
}

/// Calls a versioned managed tensor's deleter, if it has one.
///
/// # Safety
///
/// `ptr` is null or points to a live managed tensor that nobody will use or
/// delete afterwards.
pub unsafe fn delete_managed_versioned(ptr: *mut DLManagedTensorVersioned) {
    if ptr.is_null() {
        return;
    }
    // SAFETY: `ptr` points to a live managed tensor (caller's promise).
    if let Some(deleter) = unsafe { (*ptr).deleter } {
        // SAFETY: the deleter is called once, with its own tensor.
        unsafe { deleter(ptr) };
    }
}

/// Calls a legacy managed tensor's deleter, if it has one.
///
/// # Safety
///
/// As [`delete_managed_versioned`].
pub unsafe fn delete_managed_legacy(ptr: *mut DLManagedTensor) {
    if ptr.is_null() {
        return;
    }
    // SAFETY: `ptr` points to a live managed tensor (caller's promise).
    if let Some(deleter) = unsafe { (*ptr).deleter } {
        // SAFETY: the deleter is called once, with its own tensor.
        unsafe { deleter(ptr) };
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::super::ffi::{DLDevice, DLPACK_FLAG_BITMASK_READ_ONLY};
    use super::super::DType;
    use super::*;

    /// Counts its drops.
    struct Tracked(Arc<AtomicUsize>);
    impl Drop for Tracked {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn versioned_deleter_drops_owner_once() {
        let drops = Arc::new(AtomicUsize::new(0));
        let mut data = vec![0f32; 6];
        let desc = TensorDesc::contiguous(&[2, 3], DType::F32, DLDevice::CPU).unwrap();
        let version = DLPackVersion { major: 1, minor: 1 };
        let p = export_versioned(
            data.as_mut_ptr().cast(),
            &desc,
            Tracked(Arc::clone(&drops)),
            version,
            DLPACK_FLAG_BITMASK_READ_ONLY,
        );
        // SAFETY: `p` is live until the deleter runs below.
        unsafe {
            let m = p.as_ref();
            assert_eq!(m.version, version);
            assert_eq!(m.flags, DLPACK_FLAG_BITMASK_READ_ONLY);
            assert_eq!(m.manager_ctx, p.as_ptr().cast());
            let t = &m.dl_tensor;
            assert_eq!(t.ndim, 2);
            assert_eq!(std::slice::from_raw_parts(t.shape, 2), &[2, 3]);
            assert_eq!(std::slice::from_raw_parts(t.strides, 2), &[3, 1]);
            assert_eq!(t.data, data.as_mut_ptr().cast());
            assert_eq!(t.dtype, DType::F32.to_dlpack());
            assert_eq!(t.device, DLDevice::CPU);
        }
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        // SAFETY: deleted once, never used again.
        unsafe { delete_managed_versioned(p.as_ptr()) };
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn legacy_deleter_drops_owner_once() {
        let drops = Arc::new(AtomicUsize::new(0));
        let desc = TensorDesc::contiguous(&[], DType::U8, DLDevice::CPU).unwrap();
        let mut byte = 7u8;
        let p = export_legacy((&raw mut byte).cast(), &desc, Tracked(Arc::clone(&drops)));
        // SAFETY: `p` is live until the deleter runs below.
        unsafe {
            assert_eq!(p.as_ref().dl_tensor.ndim, 0);
            assert_eq!(p.as_ref().manager_ctx, p.as_ptr().cast());
            delete_managed_legacy(p.as_ptr());
        }
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn deleters_ignore_null() {
        // SAFETY: null is explicitly allowed.
        unsafe {
            delete_managed_versioned(std::ptr::null_mut());
            delete_managed_legacy(std::ptr::null_mut());
            delete_versioned::<()>(std::ptr::null_mut());
            delete_legacy::<()>(std::ptr::null_mut());
        }
    }

    #[test]
    fn owner_may_be_dropped_on_another_thread() {
        let drops = Arc::new(AtomicUsize::new(0));
        let desc = TensorDesc::contiguous(&[4], DType::I64, DLDevice::CPU).unwrap();
        let mut data = [0i64; 4];
        let p = export_versioned(
            data.as_mut_ptr().cast(),
            &desc,
            Tracked(Arc::clone(&drops)),
            DLPackVersion { major: 1, minor: 0 },
            0,
        );
        let addr = p.as_ptr() as usize;
        std::thread::spawn(move || {
            // SAFETY: the only deletion of a live tensor.
            unsafe { delete_managed_versioned(addr as *mut DLManagedTensorVersioned) };
        })
        .join()
        .unwrap();
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }
}
