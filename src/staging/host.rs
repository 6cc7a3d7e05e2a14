//! Raw 64-byte aligned host allocations, plain or pinned.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

use super::{cuda, Pinning, StagingError, BUFFER_ALIGN};

/// Where an allocation came from, which decides how it is freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The global allocator, with `Layout::from_size_align(capacity, 64)`.
    Plain,
    /// `cuMemHostAlloc` in process `pid`.
    Pinned { pid: i32 },
}

/// One zero-initialized, 64-byte aligned block of host memory that frees
/// itself on drop.
///
/// # Safety
///
/// The block is owned exclusively by this value: no other Rust value frees
/// or reallocates it. It is always initialized (zeroed at allocation), so
/// viewing it as `[u8]` is sound whenever no one writes to it concurrently.
#[derive(Debug)]
pub(crate) struct HostAlloc {
    ptr: NonNull<u8>,
    capacity: usize,
    kind: Kind,
}

// SAFETY: the block is plain memory with no thread affinity; pinned blocks
// may be used and freed from any thread (freeing pushes the context).
unsafe impl Send for HostAlloc {}
// SAFETY: shared references only read the pointer and the capacity.
unsafe impl Sync for HostAlloc {}

/// The capacity actually allocated for a request of `nbytes`: a non-zero
/// multiple of [`BUFFER_ALIGN`].
pub(crate) fn round_capacity(nbytes: usize) -> Result<usize, StagingError> {
    let cap = nbytes
        .max(1)
        .checked_next_multiple_of(BUFFER_ALIGN)
        .ok_or(StagingError::OutOfMemory { bytes: nbytes })?;
    Layout::from_size_align(cap, BUFFER_ALIGN)
        .map_err(|_| StagingError::OutOfMemory { bytes: nbytes })?;
    Ok(cap)
}

impl HostAlloc {
    /// Allocates `capacity` bytes (a value of [`round_capacity`]) following
    /// `pinning`: `Off` plain memory; `Auto` pinned when the driver allows,
    /// plain otherwise; `Required` pinned or an error.
    pub(crate) fn new(capacity: usize, pinning: Pinning) -> Result<Self, StagingError> {
        match pinning {
            Pinning::Off => Self::plain(capacity),
            Pinning::Auto => Self::page_locked(capacity).or_else(|_| Self::plain(capacity)),
            Pinning::Required => Self::page_locked(capacity)
                .map_err(|reason| StagingError::PinnedUnavailable { reason }),
        }
    }

    fn plain(capacity: usize) -> Result<Self, StagingError> {
        let layout = Layout::from_size_align(capacity, BUFFER_ALIGN)
            .map_err(|_| StagingError::OutOfMemory { bytes: capacity })?;
        assert!(layout.size() > 0, "capacity is never 0 (round_capacity)");
        // SAFETY: the layout has a non-zero size (asserted above).
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or(StagingError::OutOfMemory { bytes: capacity })?;
        Ok(Self {
            ptr,
            capacity,
            kind: Kind::Plain,
        })
    }

    fn page_locked(capacity: usize) -> Result<Self, String> {
        let ptr = cuda::host_alloc(capacity)?;
        let this = Self {
            ptr,
            capacity,
            kind: Kind::Pinned {
                pid: cuda::current_pid(),
            },
        };
        if ptr.as_ptr().align_offset(BUFFER_ALIGN) != 0 {
            // Never seen (the driver returns page-aligned blocks); dropping
            // `this` frees the block.
            return Err("cuMemHostAlloc returned a block that is not 64-byte aligned".to_owned());
        }
        // SAFETY: the block is `capacity` bytes, freshly allocated and ours.
        unsafe { ptr.as_ptr().write_bytes(0, capacity) };
        Ok(this)
    }

    /// Start of the block.
    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Size of the block in bytes.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Whether the block is page-locked.
    pub(crate) fn pinned(&self) -> bool {
        matches!(self.kind, Kind::Pinned { .. })
    }
}

impl Drop for HostAlloc {
    fn drop(&mut self) {
        match self.kind {
            Kind::Plain => {
                // SAFETY: allocated by `alloc_zeroed` with this very layout
                // (checked valid at allocation), and freed only here.
                unsafe {
                    alloc::dealloc(
                        self.ptr.as_ptr(),
                        Layout::from_size_align_unchecked(self.capacity, BUFFER_ALIGN),
                    );
                }
            }
            // A block pinned by the parent of a forked child cannot be freed
            // through the driver there; the child leaks its copy.
            Kind::Pinned { pid } if pid != cuda::current_pid() => {}
            Kind::Pinned { .. } => {
                // SAFETY: allocated by `cuda::host_alloc` in this process,
                // freed only here.
                unsafe { cuda::host_free(self.ptr) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacities_are_aligned_and_non_zero() {
        assert_eq!(round_capacity(0).unwrap(), 64);
        assert_eq!(round_capacity(1).unwrap(), 64);
        assert_eq!(round_capacity(64).unwrap(), 64);
        assert_eq!(round_capacity(65).unwrap(), 128);
        assert!(round_capacity(usize::MAX).is_err());
        assert!(round_capacity(isize::MAX as usize).is_err());
    }

    #[test]
    fn plain_blocks_are_aligned_and_zeroed() {
        for size in [64, 128, 4096, 1 << 20, 3 * 64] {
            let a = HostAlloc::new(size, Pinning::Off).unwrap();
            assert_eq!(a.ptr().as_ptr() as usize % BUFFER_ALIGN, 0);
            assert!(!a.pinned());
            // SAFETY: the block is `size` initialized bytes, not shared.
            let bytes = unsafe { std::slice::from_raw_parts(a.ptr().as_ptr(), size) };
            assert!(bytes.iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn auto_falls_back_to_plain_without_a_driver() {
        let a = HostAlloc::new(256, Pinning::Auto).unwrap();
        assert_eq!(a.pinned(), cuda::pinned_available());
        assert_eq!(a.ptr().as_ptr() as usize % BUFFER_ALIGN, 0);
    }

    #[test]
    fn required_errors_clearly_without_a_driver() {
        match HostAlloc::new(256, Pinning::Required) {
            Ok(a) => assert!(a.pinned()),
            Err(e) => {
                assert!(!cuda::pinned_available());
                assert!(matches!(e, StagingError::PinnedUnavailable { .. }), "{e}");
                assert!(e.to_string().contains("pinned"), "{e}");
            }
        }
    }
}
