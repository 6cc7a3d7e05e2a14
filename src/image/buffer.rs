//! Fallible buffers for decoded pixels, used by the codecs and the pixel
//! operations alike (kept apart from both so neither imports the other for it).

use std::alloc::{self, Layout};

use super::ImageError;

/// A zeroed buffer of `len` bytes, or [`ImageError::OutOfMemory`] when the
/// allocator cannot give it, where `vec![0; len]` would abort the process.
///
/// Hand-written because std has no fallible zeroed `Vec` on stable
/// (`Vec::try_reserve` then `resize` would write every byte, touching memory
/// that `alloc_zeroed` gets from the kernel already zeroed and untouched: a
/// tiny file claiming a huge size then costs address space, not RAM).
pub(crate) fn zeroed(len: usize) -> Result<Vec<u8>, ImageError> {
    let oom = || ImageError::OutOfMemory {
        name: String::new(),
        bytes: len,
    };
    if len == 0 {
        return Ok(Vec::new());
    }
    let layout = Layout::array::<u8>(len).map_err(|_| oom())?;
    // SAFETY: `layout` has a non-zero size (`len > 0`), as `alloc_zeroed`
    // requires.
    let ptr = unsafe { alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return Err(oom());
    }
    // SAFETY: `ptr` comes from the global allocator with `layout`, which is
    // the layout of a `[u8]` of `len` elements (so the box frees it with the
    // same layout); all `len` bytes are initialized (zeroed); `len <=
    // isize::MAX` (checked by `Layout::array`); nothing else owns the block.
    let boxed = unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len)) };
    Ok(boxed.into_vec())
}
