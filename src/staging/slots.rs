//! Shared-memory batch slots for worker processes.
//!
//! A [`SlotRing`] is a growable set of *slots*, each an anonymous shared
//! memory file (`memfd`) that the owning process maps once and hands to
//! worker processes as a file descriptor. A worker writes a collated batch
//! into a slot and sends back only the slot number and a small header; the
//! owner then [leases](SlotRing::lease) the slot's bytes to the consumer
//! without a copy. When the last view of a lease is gone the slot is free
//! again, and the next batch reuses it (and its already-mapped pages).
//!
//! # Lifecycle of a slot
//!
//! ```text
//!   create ──> Free ──acquire──> Dispatched ──lease──> Leased ──(last drop)──┐
//!                ^                   │                                       │
//!                └──────release──────┘<──────────────────────────────────────┘
//! ```
//!
//! A slot is *dispatched* while a worker may write to it, and *leased* while
//! the consumer may read it; the two never overlap, which is what makes the
//! lease's view of the bytes sound (see [`SlotLease`]).
//!
//! # Why memfd
//!
//! A `memfd` has no name in any file system: nothing is left in `/dev/shm`
//! whatever happens to the processes, and the memory is freed when the last
//! process that holds the descriptor or a mapping exits. Each slot is
//! created with `F_SEAL_SHRINK`, so no process can shrink it under a mapping
//! (which would turn a read into `SIGBUS`); workers can only grow it.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use memmap2::{MmapOptions, MmapRaw};
use rustix::fs::{MemfdFlags, SealFlags};

use super::{SlotError, BUFFER_ALIGN};

fn io_err(what: &'static str) -> impl FnOnce(std::io::Error) -> SlotError {
    move |source| SlotError::Io { what, source }
}

/// Where a slot is in its lifecycle (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Free,
    Dispatched,
    Leased,
}

impl Status {
    fn name(self) -> &'static str {
        match self {
            Status::Free => "free",
            Status::Dispatched => "dispatched",
            Status::Leased => "leased",
        }
    }
}

/// A slot's mapping in the owner, page-locked for CUDA when the ring asks.
#[derive(Debug)]
struct Mapping {
    /// Declared before `map`, so dropped first: the range is unregistered
    /// while it is still mapped (what `cuda::register` requires).
    pinned: Option<super::cuda::Registration>,
    map: MmapRaw,
}

#[derive(Debug)]
struct Slot {
    file: File,
    /// The current mapping (the whole file when it was made); replaced when
    /// the file has grown past it, only while no lease exists.
    map: Option<Arc<Mapping>>,
    status: Status,
}

#[derive(Debug, Default)]
struct State {
    slots: Vec<Slot>,
    leases: u64,
    /// Page-lock each new mapping for CUDA ([`SlotRing::pin_for_cuda`]).
    pin_cuda: bool,
    /// Why the last registration failed, if it did.
    pin_error: Option<String>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves only plain data behind.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A growable set of shared-memory batch slots (see the module docs).
///
/// # Examples
///
/// ```
/// use ferrofeed::staging::SlotRing;
///
/// let ring = SlotRing::new();
/// let id = ring.create()?;
/// assert_eq!(ring.acquire(), Some(id)); // dispatched to a worker...
/// // ...which grows the file and writes a batch through its fd.
/// let file = std::fs::File::from(ring.dup_fd(id)?);
/// file.set_len(4096)?;
/// let lease = ring.lease(id, 100)?; // the consumer's view of 100 bytes
/// assert_eq!(ring.acquire(), None); // in use until the lease is dropped
/// drop(lease);
/// assert_eq!(ring.acquire(), Some(id));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Default)]
pub struct SlotRing {
    shared: Arc<Shared>,
}

/// Counters of a [`SlotRing`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlotStats {
    /// Slots created.
    pub slots: usize,
    /// Slots free for the next batch.
    pub free: usize,
    /// Slots a worker may be writing.
    pub dispatched: usize,
    /// Slots the consumer holds.
    pub leased: usize,
    /// Bytes in all slots' files.
    pub bytes: usize,
    /// Leases handed out so far.
    pub leases: u64,
    /// Slots whose mapping is page-locked for CUDA.
    pub pinned: usize,
}

impl SlotRing {
    /// An empty ring.
    pub fn new() -> Self {
        Self::default()
    }

    /// Creates a new, empty, free slot (a sealed-against-shrinking memfd)
    /// and returns its number.
    ///
    /// # Errors
    ///
    /// [`SlotError::Io`] when the memfd cannot be made.
    pub fn create(&self) -> Result<usize, SlotError> {
        let fd: OwnedFd = rustix::fs::memfd_create(
            "ferrofeed-batch-slot",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )
        .map_err(|e| SlotError::Io {
            what: "memfd_create",
            source: e.into(),
        })?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::SEAL).map_err(|e| {
            SlotError::Io {
                what: "sealing the slot against shrinking",
                source: e.into(),
            }
        })?;
        let mut state = self.shared.lock();
        state.slots.push(Slot {
            file: File::from(fd),
            map: None,
            status: Status::Free,
        });
        Ok(state.slots.len() - 1)
    }

    /// Page-locks every slot's mapping from now on (`cuMemHostRegister`),
    /// so that batches leased from the ring are copied to a GPU
    /// asynchronously, as from a pinned buffer. Mappings that exist now are
    /// remade (and registered) at their next lease. Best effort: where
    /// pinned memory is unavailable (no CUDA driver, a forked child) or the
    /// driver refuses a slot, the slot stays plain memory, and
    /// [`SlotRing::pin_error`] says why.
    ///
    /// # Errors
    ///
    /// The reason pinned memory is unavailable in this process (then
    /// nothing changes).
    pub fn pin_for_cuda(&self) -> Result<(), String> {
        super::cuda::status()?;
        let mut state = self.shared.lock();
        state.pin_cuda = true;
        for slot in &mut state.slots {
            // A leased slot's mapping is shared with its lease: it is
            // remade at the first lease after this one is dropped.
            if slot.status != Status::Leased
                && slot.map.as_ref().is_some_and(|m| m.pinned.is_none())
            {
                slot.map = None;
            }
        }
        Ok(())
    }

    /// Why the last attempt to page-lock a slot failed (`None` if none did).
    pub fn pin_error(&self) -> Option<String> {
        self.shared.lock().pin_error.clone()
    }

    /// Takes a free slot (the lowest-numbered) for a worker to write,
    /// marking it dispatched; `None` when every slot is in use.
    pub fn acquire(&self) -> Option<usize> {
        let mut state = self.shared.lock();
        let id = state.slots.iter().position(|s| s.status == Status::Free)?;
        state.slots[id].status = Status::Dispatched;
        Some(id)
    }

    /// Gives back a dispatched slot that came back without a batch to lease
    /// (an error, an empty batch, a worker that died).
    ///
    /// # Errors
    ///
    /// [`SlotError::NoSuchSlot`], or [`SlotError::WrongState`] unless the slot
    /// is dispatched.
    pub fn release(&self, id: usize) -> Result<(), SlotError> {
        let mut state = self.shared.lock();
        let slot = slot_in(&mut state, id, Status::Dispatched)?;
        slot.status = Status::Free;
        Ok(())
    }

    /// The raw descriptor of slot `id`, owned by the ring (valid while the
    /// ring lives). Send it to a worker (`SCM_RIGHTS`) to let it write.
    ///
    /// # Errors
    ///
    /// [`SlotError::NoSuchSlot`].
    pub fn raw_fd(&self, id: usize) -> Result<RawFd, SlotError> {
        let state = self.shared.lock();
        let slot = state.slots.get(id).ok_or(SlotError::NoSuchSlot(id))?;
        Ok(slot.file.as_raw_fd())
    }

    /// A new descriptor of slot `id` (close-on-exec), owned by the caller.
    ///
    /// # Errors
    ///
    /// [`SlotError::NoSuchSlot`], [`SlotError::Io`] when `dup` fails.
    pub fn dup_fd(&self, id: usize) -> Result<OwnedFd, SlotError> {
        let state = self.shared.lock();
        let slot = state.slots.get(id).ok_or(SlotError::NoSuchSlot(id))?;
        slot.file
            .as_fd()
            .try_clone_to_owned()
            .map_err(io_err("dup of a slot's descriptor"))
    }

    /// Leases the first `len` bytes of dispatched slot `id` to the consumer:
    /// the slot stays out of use until the returned lease, and every clone
    /// of it, is dropped. Maps the slot (again, if the worker grew its file
    /// past the current mapping).
    ///
    /// # Errors
    ///
    /// [`SlotError::NoSuchSlot`]; [`SlotError::WrongState`] unless the slot
    /// is dispatched; [`SlotError::TooShort`] when the file holds fewer than
    /// `len` bytes; [`SlotError::Io`] when it cannot be mapped.
    pub fn lease(&self, id: usize, len: usize) -> Result<SlotLease, SlotError> {
        let mut state = self.shared.lock();
        let pin_cuda = state.pin_cuda;
        let mut pin_error = None;
        let slot = slot_in(&mut state, id, Status::Dispatched)?;
        let mapped = slot.map.as_ref().map_or(0, |m| m.map.len());
        if len > mapped || slot.map.is_none() {
            let size = slot
                .file
                .metadata()
                .map_err(io_err("fstat of a slot"))?
                .len();
            let size = usize::try_from(size).unwrap_or(usize::MAX);
            if size < len {
                return Err(SlotError::TooShort { id, size, len });
            }
            // Nothing else holds the old mapping: the slot was dispatched,
            // and every lease of it was dropped before it became free.
            slot.map = None;
            if size > 0 {
                let map = MmapOptions::new()
                    .len(size)
                    .map_raw(&slot.file)
                    .map_err(io_err("mmap of a slot"))?;
                let pinned = if pin_cuda {
                    register(&map).map_err(|e| pin_error = Some(e)).ok()
                } else {
                    None
                };
                slot.map = Some(Arc::new(Mapping { pinned, map }));
            }
        }
        slot.status = Status::Leased;
        let map = slot.map.clone();
        state.leases += 1;
        if pin_error.is_some() {
            state.pin_error = pin_error;
        }
        Ok(SlotLease {
            inner: Arc::new(LeaseInner {
                ring: Arc::downgrade(&self.shared),
                id,
                map,
                len,
            }),
        })
    }

    /// The ring's counters.
    pub fn stats(&self) -> SlotStats {
        let state = self.shared.lock();
        let mut counts = SlotStats {
            slots: state.slots.len(),
            leases: state.leases,
            ..SlotStats::default()
        };
        for slot in &state.slots {
            match slot.status {
                Status::Free => counts.free += 1,
                Status::Dispatched => counts.dispatched += 1,
                Status::Leased => counts.leased += 1,
            }
            let size = slot.file.metadata().map_or(0, |m| m.len());
            counts.bytes += usize::try_from(size).unwrap_or(usize::MAX);
            counts.pinned += usize::from(slot.map.as_ref().is_some_and(|m| m.pinned.is_some()));
        }
        counts
    }
}

/// Page-locks a slot's new mapping for CUDA.
fn register(map: &MmapRaw) -> Result<super::cuda::Registration, String> {
    let ptr = std::ptr::NonNull::new(map.as_mut_ptr()).ok_or("an empty mapping")?;
    // SAFETY: the registration lives in the same `Mapping` as `map`, in the
    // field declared first, so it is dropped (unregistered) before the
    // mapping is unmapped.
    unsafe { super::cuda::register(ptr, map.len()) }
}

fn slot_in(state: &mut State, id: usize, expected: Status) -> Result<&mut Slot, SlotError> {
    let slot = state.slots.get_mut(id).ok_or(SlotError::NoSuchSlot(id))?;
    if slot.status != expected {
        return Err(SlotError::WrongState {
            id,
            state: slot.status.name(),
            expected: expected.name(),
        });
    }
    Ok(slot)
}

/// A type with the alignment of a staging buffer, for a dangling pointer.
#[repr(C, align(64))]
struct AlignedBlock([u8; BUFFER_ALIGN]);

#[derive(Debug)]
struct LeaseInner {
    ring: Weak<Shared>,
    id: usize,
    map: Option<Arc<Mapping>>,
    len: usize,
}

impl Drop for LeaseInner {
    fn drop(&mut self) {
        // A ring already gone has nobody left to hand the slot to.
        if let Some(ring) = self.ring.upgrade() {
            let mut state = ring.lock();
            if let Some(slot) = state.slots.get_mut(self.id) {
                debug_assert_eq!(slot.status, Status::Leased);
                slot.status = Status::Free;
            }
        }
    }
}

/// The consumer's view of the first [`len`](SlotLease::len) bytes of a
/// slot. Clones share one lease; the slot is free again when the last clone
/// is dropped.
///
/// # Safety
///
/// [`SlotLease::as_ptr`] points into a shared mapping that stays mapped as
/// long as the lease lives (the lease holds it). While the lease lives the
/// slot is not dispatched, so no worker the ring's owner follows the
/// protocol with writes to it; the consumer may read and write the bytes
/// (its batch) freely. The file is sealed against shrinking, so the pages
/// cannot disappear under the mapping.
#[derive(Debug, Clone)]
pub struct SlotLease {
    inner: Arc<LeaseInner>,
}

impl SlotLease {
    /// The slot's number.
    pub fn id(&self) -> usize {
        self.inner.id
    }

    /// The number of bytes leased.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Whether the lease covers no bytes.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// Whether the leased bytes are page-locked for CUDA (see
    /// [`SlotRing::pin_for_cuda`]).
    pub fn is_pinned(&self) -> bool {
        self.inner.map.as_ref().is_some_and(|m| m.pinned.is_some())
    }

    /// The first leased byte: page-aligned (so [`BUFFER_ALIGN`]-aligned), or
    /// dangling but aligned for an empty lease of a never-grown slot.
    pub fn as_ptr(&self) -> *mut u8 {
        match &self.inner.map {
            Some(m) => m.map.as_mut_ptr(),
            None => std::ptr::dangling_mut::<AlignedBlock>().cast(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Seek, SeekFrom, Write};

    use super::*;

    fn worker_writes(ring: &SlotRing, id: usize, bytes: &[u8]) {
        let mut file = File::from(ring.dup_fd(id).unwrap());
        let len = file.metadata().unwrap().len();
        if len < bytes.len() as u64 {
            file.set_len(bytes.len() as u64).unwrap();
        }
        file.seek(SeekFrom::Start(0)).unwrap();
        file.write_all(bytes).unwrap();
    }

    fn read(lease: &SlotLease) -> Vec<u8> {
        // SAFETY: the lease maps `len` bytes and nothing writes to them here.
        unsafe { std::slice::from_raw_parts(lease.as_ptr(), lease.len()) }.to_vec()
    }

    #[test]
    fn a_slot_goes_round_its_lifecycle() {
        let ring = SlotRing::new();
        let a = ring.create().unwrap();
        let b = ring.create().unwrap();
        assert_eq!((a, b), (0, 1));
        assert_eq!(ring.acquire(), Some(0));
        assert_eq!(ring.acquire(), Some(1));
        assert_eq!(ring.acquire(), None);
        ring.release(1).unwrap();
        worker_writes(&ring, 0, b"hello");
        let lease = ring.lease(0, 5).unwrap();
        assert_eq!(read(&lease), b"hello");
        let clone = lease.clone();
        drop(lease);
        let s = ring.stats();
        assert_eq!((s.slots, s.free, s.dispatched, s.leased), (2, 1, 0, 1));
        assert_eq!(ring.acquire(), Some(1), "slot 0 is still leased");
        drop(clone);
        assert_eq!(ring.acquire(), Some(0), "free once the last clone is gone");
        assert_eq!(ring.stats().leases, 1);
    }

    #[test]
    fn a_grown_slot_is_mapped_again() {
        let ring = SlotRing::new();
        let id = ring.create().unwrap();
        ring.acquire().unwrap();
        worker_writes(&ring, id, &[1; 10]);
        drop(ring.lease(id, 10).unwrap());
        ring.acquire().unwrap();
        let big = vec![7u8; 3 * 4096 + 5];
        worker_writes(&ring, id, &big);
        let lease = ring.lease(id, big.len()).unwrap();
        assert_eq!(read(&lease), big);
        assert_eq!(lease.as_ptr() as usize % BUFFER_ALIGN, 0);
    }

    /// With a CUDA driver, every slot mapped after `pin_for_cuda` is
    /// page-locked, a grown slot's new mapping too, and dropping the ring
    /// unregisters them; without one (CI) it says why and the slots work
    /// as plain memory.
    #[test]
    fn pinning_for_cuda_registers_new_mappings_or_explains() {
        let ring = SlotRing::new();
        let id = ring.create().unwrap();
        ring.acquire().unwrap();
        worker_writes(&ring, id, &[3; 100]);
        drop(ring.lease(id, 100).unwrap()); // mapped before pinning was asked
        assert_eq!(ring.stats().pinned, 0);
        let pinned = match ring.pin_for_cuda() {
            Ok(()) => true,
            Err(why) => {
                assert_eq!(Err(why), super::super::cuda::status());
                false
            }
        };
        for size in [100, 5 * 4096 + 1] {
            ring.acquire().unwrap();
            worker_writes(&ring, id, &vec![9; size]);
            let lease = ring.lease(id, size).unwrap();
            assert_eq!(read(&lease), vec![9; size]);
            assert_eq!(lease.is_pinned(), pinned, "size {size}");
            assert_eq!(ring.stats().pinned, usize::from(pinned));
        }
        assert_eq!(ring.pin_error(), None);
        drop(ring);
    }

    #[test]
    fn consumer_writes_reach_the_worker_side() {
        let ring = SlotRing::new();
        let id = ring.create().unwrap();
        ring.acquire().unwrap();
        worker_writes(&ring, id, &[0; 8]);
        let lease = ring.lease(id, 8).unwrap();
        // SAFETY: the lease maps 8 bytes; nothing else touches them now.
        unsafe { lease.as_ptr().write(42) };
        let mut file = File::from(ring.dup_fd(id).unwrap());
        file.seek(SeekFrom::Start(0)).unwrap();
        let mut first = [0u8; 1];
        file.read_exact(&mut first).unwrap();
        assert_eq!(first[0], 42, "one shared copy of the bytes");
    }

    #[test]
    fn protocol_errors_are_refused() {
        let ring = SlotRing::new();
        let id = ring.create().unwrap();
        assert!(matches!(
            ring.lease(id, 0),
            Err(SlotError::WrongState {
                state: "free",
                expected: "dispatched",
                ..
            })
        ));
        assert!(matches!(
            ring.release(id),
            Err(SlotError::WrongState { .. })
        ));
        assert!(matches!(ring.lease(9, 0), Err(SlotError::NoSuchSlot(9))));
        ring.acquire().unwrap();
        assert!(matches!(
            ring.lease(id, 1),
            Err(SlotError::TooShort {
                size: 0,
                len: 1,
                ..
            })
        ));
        // Still dispatched after a refused lease; an empty one is fine.
        let empty = ring.lease(id, 0).unwrap();
        assert!(empty.is_empty());
        assert_eq!(empty.as_ptr() as usize % BUFFER_ALIGN, 0);
    }

    #[test]
    fn slots_cannot_be_shrunk() {
        let ring = SlotRing::new();
        let id = ring.create().unwrap();
        ring.acquire().unwrap();
        worker_writes(&ring, id, &[5; 100]);
        let lease = ring.lease(id, 100).unwrap();
        let file = File::from(ring.dup_fd(id).unwrap());
        assert!(file.set_len(10).is_err(), "F_SEAL_SHRINK refuses");
        assert_eq!(read(&lease), vec![5; 100]);
    }

    #[test]
    fn a_lease_outliving_its_ring_stays_readable() {
        let ring = SlotRing::new();
        let id = ring.create().unwrap();
        ring.acquire().unwrap();
        worker_writes(&ring, id, b"kept");
        let lease = ring.lease(id, 4).unwrap();
        drop(ring);
        assert_eq!(read(&lease), b"kept");
    }
}
