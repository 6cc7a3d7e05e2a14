//! Fallible buffers for decoded pixels, used by the codecs and the pixel
//! operations alike (kept apart from both so neither imports the other for it).

use std::alloc::{self, Layout};
use std::cell::RefCell;

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

/// The largest buffer a thread keeps for its next decodes (1 MiB: the
/// whole RGBX window of a 500 x 500 image, so `ImageNet`'s usual sizes
/// fit); larger ones are freed after use, so that large images do not pin
/// their memory to every pool thread.
pub(crate) const SPARE_MAX: usize = 1 << 20;

/// How many spare buffers a thread keeps: what one decode usually holds at
/// once (the decoded window and the resized pixels; an EXIF-rotated image
/// also has an oriented copy, which then takes a new buffer). So a
/// decoding thread keeps at most 2 MiB: measured on the training job with
/// 2 threads, the process's peak PSS grew by 3.5 MiB with these buffers.
const SPARES: usize = 2;

thread_local! {
    /// This thread's spare pixel buffers (at most [`SPARES`], each at most
    /// [`SPARE_MAX`] bytes), freed when the thread ends.
    static SPARE: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// A buffer for one decode's pixels, taken from the thread's spares when
/// one is large enough, and given back when dropped: a batch's images, one
/// after the other on a pool thread, reuse the same few buffers instead of
/// each allocating (and the allocator zeroing) new ones.
///
/// Its bytes are those of an earlier image, or zero: every user writes all
/// of its bytes before reading any (a decoder that fails part way returns
/// an error, and the buffer is only given back).
#[derive(Debug)]
pub(crate) struct Scratch {
    buf: Vec<u8>,
    len: usize,
}

/// A [`Scratch`] of `len` bytes, or [`ImageError::OutOfMemory`] when a new
/// one is needed and cannot be allocated.
pub(crate) fn scratch(len: usize) -> Result<Scratch, ImageError> {
    let buf = match take_spare(len) {
        Some(buf) => buf,
        None => zeroed(len)?,
    };
    Ok(Scratch { buf, len })
}

/// The smallest of the thread's spares that holds `len` bytes (none above
/// the cap, or during the thread's teardown).
fn take_spare(len: usize) -> Option<Vec<u8>> {
    if len > SPARE_MAX {
        return None;
    }
    let take = |spares: &RefCell<Vec<Vec<u8>>>| {
        let mut spares = spares.borrow_mut();
        let best = (0..spares.len())
            .filter(|&i| spares[i].len() >= len)
            .min_by_key(|&i| spares[i].len())?;
        Some(spares.swap_remove(best))
    };
    SPARE.try_with(take).ok().flatten()
}

impl std::ops::Deref for Scratch {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl std::ops::DerefMut for Scratch {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len]
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        if buf.is_empty() || buf.len() > SPARE_MAX {
            return;
        }
        // Keep the largest few; in the thread's teardown, keep none.
        let _ = SPARE.try_with(|spares| {
            let mut spares = spares.borrow_mut();
            spares.push(buf);
            if spares.len() > SPARES {
                let smallest = spares
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, b)| b.len())
                    .map_or(0, |(i, _)| i);
                spares.swap_remove(smallest);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spare_lens() -> Vec<usize> {
        let mut v: Vec<usize> = SPARE.with(|s| s.borrow().iter().map(Vec::len).collect());
        v.sort_unstable();
        v
    }

    #[test]
    fn a_scratch_reuses_the_smallest_spare_that_fits() {
        std::thread::spawn(|| {
            let mut small = scratch(1000).unwrap();
            assert_eq!(small.len(), 1000);
            assert!(small.iter().all(|&b| b == 0), "a new buffer is zeroed");
            small.fill(7);
            let ptr = small.as_ptr();
            let large = scratch(3000).unwrap();
            drop(small);
            drop(large);
            assert_eq!(spare_lens(), [1000, 3000]);
            // The 1000-byte one, with the earlier bytes.
            let reused = scratch(10).unwrap();
            assert_eq!((reused.as_ptr(), reused.len()), (ptr, 10));
            assert_eq!(&reused[..], &[7u8; 10]);
            // Larger than both spares left: new memory.
            let new = scratch(5000).unwrap();
            assert_eq!(spare_lens(), [3000]);
            drop(reused);
            assert_eq!(spare_lens(), [1000, 3000]);
            // A third: the smallest goes.
            drop(new);
            assert_eq!(spare_lens(), [3000, 5000]);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn buffers_above_the_cap_are_not_kept() {
        std::thread::spawn(|| {
            drop(scratch(64).unwrap());
            let big = scratch(SPARE_MAX + 1).unwrap();
            assert_eq!(big.len(), SPARE_MAX + 1);
            drop(big);
            assert_eq!(spare_lens(), [64]);
            drop(scratch(SPARE_MAX).unwrap());
            assert_eq!(spare_lens(), [64, SPARE_MAX]);
        })
        .join()
        .unwrap();
    }
}
