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
///
/// `dl_tensor.shape` and `dl_tensor.strides` point into `shape` and
/// `strides`. They are taken only once the holder sits at its final heap
/// address, through the raw pointer to it: nothing moves the holder or its
/// vectors afterwards (a `Box<[i64]>` moved into the holder after its
/// pointer was taken would, under Rust's aliasing rules, invalidate that
/// pointer; `Vec`s also make no uniqueness claim when the holder is moved
/// into its box).
#[repr(C)]
struct Holder<M, O> {
    managed: M,
    /// Backing store of `dl_tensor.shape`.
    shape: Vec<i64>,
    /// Backing store of `dl_tensor.strides`.
    strides: Vec<i64>,
    /// Keeps the data alive; dropped by the deleter.
    owner: O,
}

/// The `DLTensor` of `desc` over `data`, with null shape and strides (set
/// by [`point_into`] once the holder is in place).
fn dl_tensor(data: *mut c_void, desc: &TensorDesc) -> DLTensor {
    DLTensor {
        data,
        device: desc.device,
        // At most `MAX_NDIM` dimensions (checked by `TensorDesc::new`).
        ndim: i32::try_from(desc.shape.len()).expect("ndim fits in i32"),
        dtype: desc.dtype.to_dlpack(),
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: desc.byte_offset,
    }
}

/// Boxes `holder`, points its tensor's shape and strides into its own
/// vectors (`tensor` picks the `DLTensor` out of the managed struct), sets
/// `manager_ctx`, and leaks the box.
fn leak<M, O>(
    holder: Holder<M, O>,
    tensor: impl FnOnce(*mut M) -> (*mut DLTensor, *mut *mut c_void),
) -> NonNull<M> {
    let raw = Box::into_raw(Box::new(holder));
    // SAFETY: `raw` comes from `Box::into_raw`: non-null, aligned, pointing
    // to an initialized holder that nothing else references. Every access
    // below goes through `raw` (no reference to the holder outlives its
    // statement), and the holder stays at this address until the deleter
    // frees it, so the shape and strides pointers, derived from `raw` after
    // the last move, stay valid for as long as the tensor lives.
    unsafe {
        let shape = (*raw).shape.as_mut_ptr();
        let strides = (*raw).strides.as_mut_ptr();
        let (dl, ctx) = tensor(&raw mut (*raw).managed);
        (*dl).shape = shape;
        (*dl).strides = strides;
        *ctx = raw.cast::<c_void>();
        NonNull::new_unchecked(raw.cast::<M>())
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
    let holder = Holder {
        managed: DLManagedTensorVersioned {
            version,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_versioned::<O>),
            flags,
            dl_tensor: dl_tensor(data, desc),
        },
        shape: desc.shape.clone(),
        strides: desc.strides.clone(),
        owner,
    };
    // SAFETY (of the closure's place projections): `m` points to the
    // managed struct inside the live, leaked holder (see `leak`).
    leak(holder, |m| unsafe {
        (&raw mut (*m).dl_tensor, &raw mut (*m).manager_ctx)
    })
}

/// Exports `data` described by `desc` as a legacy `DLManagedTensor` that
/// owns `owner`. Same contract as [`export_versioned`]; the legacy struct has
/// no version and no flags (so no read-only marking).
pub fn export_legacy<O: Send + 'static>(
    data: *mut c_void,
    desc: &TensorDesc,
    owner: O,
) -> NonNull<DLManagedTensor> {
    let holder = Holder {
        managed: DLManagedTensor {
            dl_tensor: dl_tensor(data, desc),
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_legacy::<O>),
        },
        shape: desc.shape.clone(),
        strides: desc.strides.clone(),
        owner,
    };
    // SAFETY: as in `export_versioned`.
    leak(holder, |m| unsafe {
        (&raw mut (*m).dl_tensor, &raw mut (*m).manager_ctx)
    })
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
