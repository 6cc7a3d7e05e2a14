//! The bounded buffer pool and its buffers.

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::host::{round_capacity, HostAlloc};
use super::{Pinning, StagingError};

/// How a [`BufferPool`] behaves. See the module docs for the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// The most buffers that exist at once, in use and idle together;
    /// `None` for no bound. When every one is in use, [`BufferPool::acquire`]
    /// waits up to [`PoolConfig::timeout`] for one to come back.
    pub max_buffers: Option<usize>,
    /// The most idle buffers kept for reuse; a buffer returned past that is
    /// freed. `None`: as many as `max_buffers` (16 when that is unbounded).
    pub max_idle: Option<usize>,
    /// How long [`BufferPool::acquire`] waits for a buffer when the pool is
    /// at `max_buffers`; `None` waits for ever.
    pub timeout: Option<Duration>,
    /// Whether to pin new buffers.
    pub pinning: Pinning,
}

impl Default for PoolConfig {
    /// 64 buffers at most, kept idle for reuse, a 30 s wait when all are in
    /// use, pinned when a CUDA driver is present.
    fn default() -> Self {
        Self {
            max_buffers: Some(64),
            max_idle: None,
            timeout: Some(Duration::from_secs(30)),
            pinning: Pinning::Auto,
        }
    }
}

impl PoolConfig {
    /// The idle bound in effect.
    pub fn effective_max_idle(&self) -> usize {
        self.max_idle.unwrap_or(self.max_buffers.unwrap_or(16))
    }
}

/// Counters and gauges of a [`BufferPool`], from [`BufferPool::stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Buffers that exist now (`in_use + idle`).
    pub allocated: usize,
    /// Buffers handed out and not yet returned.
    pub in_use: usize,
    /// Buffers kept for reuse.
    pub idle: usize,
    /// Bytes of all buffers that exist now.
    pub bytes: usize,
    /// Of the buffers that exist now, how many are pinned.
    pub pinned: usize,
    /// Buffers allocated fresh since the pool was made.
    pub allocations: u64,
    /// Acquisitions served by an idle buffer.
    pub reuses: u64,
    /// Buffers returned to the pool (each buffer handed out is returned
    /// exactly once).
    pub releases: u64,
    /// Buffers freed: idle ones dropped to make room for a different size,
    /// and returned ones past `max_idle`.
    pub evictions: u64,
}

#[derive(Debug, Default)]
struct State {
    idle: Vec<HostAlloc>,
    stats: PoolStats,
}

impl State {
    fn live(&self) -> usize {
        self.stats.in_use + self.idle.len()
    }

    /// Index of the smallest idle buffer that holds `capacity` bytes without
    /// wasting more than half of itself.
    fn best_fit(&self, capacity: usize) -> Option<usize> {
        self.idle
            .iter()
            .enumerate()
            .filter(|(_, a)| a.capacity() >= capacity && a.capacity() / 2 <= capacity)
            .min_by_key(|(_, a)| a.capacity())
            .map(|(i, _)| i)
    }

    fn sync_gauges(&mut self) {
        self.stats.idle = self.idle.len();
        self.stats.allocated = self.live();
    }

    fn forget(&mut self, a: &HostAlloc) {
        self.stats.bytes -= a.capacity();
        self.stats.pinned -= usize::from(a.pinned());
    }
}

#[derive(Debug)]
struct Shared {
    config: PoolConfig,
    state: Mutex<State>,
    /// Signalled whenever a buffer comes back or a reserved slot is given up.
    returned: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is consistent at every unlock (nothing in the critical
        // sections panics), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes back a buffer handed out by this pool.
    fn release(&self, alloc: HostAlloc) {
        let mut st = self.lock();
        st.stats.in_use -= 1;
        st.stats.releases += 1;
        let evicted = if st.idle.len() < self.config.effective_max_idle() {
            st.idle.push(alloc);
            None
        } else {
            st.stats.evictions += 1;
            st.forget(&alloc);
            Some(alloc)
        };
        st.sync_gauges();
        drop(st);
        self.returned.notify_one();
        // Freed outside the lock.
        drop(evicted);
    }
}

/// A bounded pool of 64-byte aligned host buffers, pinned when possible.
///
/// Cloning gives another handle to the same pool. The pool's memory lives
/// until the last handle and the last [`PooledBuffer`] are gone: a buffer
/// outliving every handle is simply freed when dropped.
///
/// # Examples
///
/// ```
/// use ferrofeed::staging::{BufferPool, Pinning, PoolConfig};
/// let pool = BufferPool::new(PoolConfig { max_buffers: Some(2), pinning: Pinning::Off, ..PoolConfig::default() })?;
/// let a = pool.acquire(1000)?;
/// assert_eq!(a.as_ptr() as usize % 64, 0);
/// let first = a.as_ptr();
/// drop(a); // back to the pool...
/// let b = pool.acquire(1000)?; // ...and handed out again, not reallocated
/// assert_eq!(b.as_ptr(), first);
/// assert_eq!((pool.stats().allocations, pool.stats().reuses), (1, 1));
/// # Ok::<(), ferrofeed::staging::StagingError>(())
/// ```
#[derive(Debug, Clone)]
pub struct BufferPool {
    shared: Arc<Shared>,
}

impl BufferPool {
    /// A new, empty pool.
    ///
    /// # Errors
    ///
    /// [`StagingError::InvalidConfig`] for `max_buffers == Some(0)`.
    pub fn new(config: PoolConfig) -> Result<Self, StagingError> {
        if config.max_buffers == Some(0) {
            return Err(StagingError::InvalidConfig(
                "max_buffers must be at least 1 (or None for no bound)".to_owned(),
            ));
        }
        Ok(Self {
            shared: Arc::new(Shared {
                config,
                state: Mutex::new(State::default()),
                returned: Condvar::new(),
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &PoolConfig {
        &self.shared.config
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PoolStats {
        self.shared.lock().stats
    }

    /// Frees every idle buffer (buffers in use are not affected).
    pub fn clear(&self) {
        let mut st = self.shared.lock();
        let idle = std::mem::take(&mut st.idle);
        for a in &idle {
            st.forget(a);
        }
        st.stats.evictions += idle.len() as u64;
        st.sync_gauges();
        drop(st);
        drop(idle);
    }

    /// A buffer of `nbytes` bytes, waiting up to the configured timeout when
    /// the pool is at its bound.
    ///
    /// # Errors
    ///
    /// See [`BufferPool::acquire_timeout`].
    pub fn acquire(&self, nbytes: usize) -> Result<PooledBuffer, StagingError> {
        self.acquire_timeout(nbytes, self.shared.config.timeout)
    }

    /// A buffer of `nbytes` bytes if one can be had without waiting.
    ///
    /// # Errors
    ///
    /// See [`BufferPool::acquire_timeout`].
    pub fn try_acquire(&self, nbytes: usize) -> Result<PooledBuffer, StagingError> {
        self.acquire_timeout(nbytes, Some(Duration::ZERO))
    }

    /// A buffer of `nbytes` bytes: an idle one of a fitting size if there is
    /// one; else a new one if the pool is below `max_buffers` (first freeing
    /// an idle buffer of another size if the pool is at its bound); else,
    /// once one is returned, waiting at most `timeout` (`None`: for ever).
    ///
    /// The contents of a reused buffer are what its last user left there;
    /// a new buffer is zeroed.
    ///
    /// # Errors
    ///
    /// - [`StagingError::Exhausted`]: every buffer stayed in use for `timeout`.
    /// - [`StagingError::PinnedUnavailable`]: the pool requires pinned memory
    ///   and the driver cannot give it.
    /// - [`StagingError::OutOfMemory`]: the allocation failed.
    pub fn acquire_timeout(
        &self,
        nbytes: usize,
        timeout: Option<Duration>,
    ) -> Result<PooledBuffer, StagingError> {
        let capacity = round_capacity(nbytes)?;
        let start = Instant::now();
        let deadline = timeout.and_then(|t| start.checked_add(t));
        let cfg = &self.shared.config;
        let mut st = self.shared.lock();
        loop {
            if let Some(i) = st.best_fit(capacity) {
                let alloc = st.idle.swap_remove(i);
                st.stats.in_use += 1;
                st.stats.reuses += 1;
                st.sync_gauges();
                return Ok(self.wrap(alloc, nbytes));
            }
            let at_bound = cfg.max_buffers.is_some_and(|m| st.live() >= m);
            if at_bound && !st.idle.is_empty() {
                // Make room: free the largest idle buffer (of another size).
                let i = (0..st.idle.len())
                    .max_by_key(|&i| st.idle[i].capacity())
                    .unwrap_or(0);
                let old = st.idle.swap_remove(i);
                st.forget(&old);
                st.stats.evictions += 1;
                st.sync_gauges();
                drop(st);
                drop(old);
                st = self.shared.lock();
                continue;
            }
            if !at_bound {
                // Reserve the slot, allocate outside the lock.
                st.stats.in_use += 1;
                st.sync_gauges();
                drop(st);
                return match HostAlloc::new(capacity, cfg.pinning) {
                    Ok(alloc) => {
                        let mut st = self.shared.lock();
                        st.stats.allocations += 1;
                        st.stats.bytes += alloc.capacity();
                        st.stats.pinned += usize::from(alloc.pinned());
                        drop(st);
                        Ok(self.wrap(alloc, nbytes))
                    }
                    Err(e) => {
                        let mut st = self.shared.lock();
                        st.stats.in_use -= 1;
                        st.sync_gauges();
                        drop(st);
                        self.shared.returned.notify_one();
                        Err(e)
                    }
                };
            }
            // Every buffer is in use: wait for one to come back.
            let now = Instant::now();
            let wait = match deadline {
                Some(d) if now >= d => {
                    return Err(StagingError::Exhausted {
                        max_buffers: cfg.max_buffers.unwrap_or(usize::MAX),
                        waited: now - start,
                    })
                }
                Some(d) => d - now,
                None => Duration::from_secs(3600),
            };
            st = self
                .shared
                .returned
                .wait_timeout(st, wait)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn wrap(&self, alloc: HostAlloc, len: usize) -> PooledBuffer {
        PooledBuffer {
            alloc: Some(alloc),
            len,
            pool: Some(Arc::clone(&self.shared)),
        }
    }
}

/// A 64-byte aligned host buffer that goes back to its [`BufferPool`] when
/// dropped (or is freed, for a [`PooledBuffer::standalone`] one).
///
/// It dereferences to its `len()` bytes. To share it with a `DLPack`
/// consumer, put it in an `Arc` (see [`super::Tensor`]): the buffer returns to
/// the pool when the last clone is dropped, exactly once.
///
/// # Safety
///
/// [`PooledBuffer::as_ptr`] exposes the memory to code outside Rust's
/// borrow rules (a consumer's array may write to it). Rust code that has
/// exported the pointer must not hold a slice of the buffer while such a
/// consumer may write; ferrofeed's own code only reads an exported buffer
/// through raw pointers.
#[derive(Debug)]
pub struct PooledBuffer {
    /// `Some` until dropped.
    alloc: Option<HostAlloc>,
    len: usize,
    pool: Option<Arc<Shared>>,
}

impl PooledBuffer {
    /// A buffer that belongs to no pool: freed when dropped.
    ///
    /// # Errors
    ///
    /// As [`BufferPool::acquire_timeout`] for pinning and allocation.
    pub fn standalone(nbytes: usize, pinning: Pinning) -> Result<Self, StagingError> {
        Ok(Self {
            alloc: Some(HostAlloc::new(round_capacity(nbytes)?, pinning)?),
            len: nbytes,
            pool: None,
        })
    }

    fn alloc(&self) -> &HostAlloc {
        self.alloc
            .as_ref()
            .expect("a live buffer has its allocation")
    }

    /// The usable length in bytes (as asked for).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether `len() == 0`.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The allocated size: `len()` rounded up to a non-zero multiple of 64.
    pub fn capacity(&self) -> usize {
        self.alloc().capacity()
    }

    /// Whether the memory is page-locked (CUDA pinned).
    pub fn pinned(&self) -> bool {
        self.alloc().pinned()
    }

    /// Whether the buffer goes back to a pool when dropped.
    pub fn is_pooled(&self) -> bool {
        self.pool.is_some()
    }

    /// Start of the memory; 64-byte aligned, never null, valid for
    /// `capacity()` bytes for as long as `self` lives.
    pub fn as_ptr(&self) -> *mut u8 {
        self.non_null().as_ptr()
    }

    /// [`PooledBuffer::as_ptr`] as a `NonNull`.
    pub fn non_null(&self) -> NonNull<u8> {
        self.alloc().ptr()
    }
}

impl Deref for PooledBuffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: the block holds at least `len` initialized bytes (zeroed at
        // allocation), lives as long as `self`, and is not written through
        // Rust while this shared borrow lives (see the type's Safety note).
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len) }
    }
}

impl DerefMut for PooledBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes the borrow exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), self.len) }
    }
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        if let Some(alloc) = self.alloc.take() {
            match &self.pool {
                Some(pool) => pool.release(alloc),
                None => drop(alloc),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    fn pool(max: Option<usize>) -> BufferPool {
        BufferPool::new(PoolConfig {
            max_buffers: max,
            max_idle: None,
            timeout: Some(Duration::from_millis(50)),
            pinning: Pinning::Off,
        })
        .unwrap()
    }

    #[test]
    fn buffers_are_64_byte_aligned() {
        let p = pool(None);
        let bufs: Vec<_> = [0, 1, 63, 64, 65, 1000, 4096, 1 << 20]
            .into_iter()
            .map(|n| p.acquire(n).unwrap())
            .collect();
        for b in &bufs {
            assert_eq!(b.as_ptr() as usize % 64, 0);
            assert!(b.capacity() >= b.len() && b.capacity() % 64 == 0);
            assert!(b.is_pooled() && !b.pinned());
        }
    }

    #[test]
    fn returned_buffers_are_reused_exactly_once() {
        let p = pool(Some(4));
        let a = p.acquire(1000).unwrap();
        let ptr = a.as_ptr();
        assert_eq!(p.stats().in_use, 1);
        drop(a);
        let s = p.stats();
        assert_eq!((s.in_use, s.idle, s.releases, s.allocated), (0, 1, 1, 1));
        let b = p.acquire(1000).unwrap();
        assert_eq!(b.as_ptr(), ptr);
        let s = p.stats();
        assert_eq!((s.allocations, s.reuses, s.idle, s.in_use), (1, 1, 0, 1));
        drop(b);
        assert_eq!(p.stats().releases, 2);
    }

    #[test]
    fn pool_does_not_grow_while_the_consumer_keeps_up() {
        let p = pool(Some(8));
        for _ in 0..1000 {
            let a = p.acquire(4096).unwrap();
            let b = p.acquire(4096).unwrap();
            drop((a, b));
        }
        let s = p.stats();
        assert_eq!(s.allocations, 2);
        assert_eq!(s.allocated, 2);
        assert_eq!(s.releases, 2000);
        assert_eq!(s.bytes, 2 * 4096);
    }

    #[test]
    fn exhausted_pool_errors_after_the_timeout() {
        let p = pool(Some(2));
        let _a = p.acquire(10).unwrap();
        let _b = p.acquire(10).unwrap();
        let t = Instant::now();
        let e = p.acquire(10).unwrap_err();
        assert!(t.elapsed() >= Duration::from_millis(50));
        assert!(
            matches!(e, StagingError::Exhausted { max_buffers: 2, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("all 2 buffers"), "{e}");
        assert!(p.try_acquire(10).is_err());
        assert_eq!(p.stats().allocated, 2);
    }

    #[test]
    fn waiting_acquire_gets_a_returned_buffer() {
        let p = pool(Some(1));
        let a = p.acquire(100).unwrap();
        let ptr = a.as_ptr() as usize;
        let got = Arc::new(AtomicBool::new(false));
        let t = {
            let (p, got) = (p.clone(), Arc::clone(&got));
            std::thread::spawn(move || {
                let b = p
                    .acquire_timeout(100, Some(Duration::from_secs(10)))
                    .unwrap();
                got.store(true, Ordering::SeqCst);
                b.as_ptr() as usize
            })
        };
        std::thread::sleep(Duration::from_millis(30));
        assert!(!got.load(Ordering::SeqCst));
        drop(a);
        assert_eq!(t.join().unwrap(), ptr);
        assert_eq!(p.stats().allocations, 1);
    }

    #[test]
    fn other_sizes_evict_idle_buffers_at_the_bound() {
        let p = pool(Some(2));
        drop((p.acquire(64).unwrap(), p.acquire(64).unwrap()));
        assert_eq!(p.stats().idle, 2);
        let big = p.acquire(1 << 16).unwrap();
        let s = p.stats();
        assert_eq!((s.allocated, s.evictions, s.idle), (2, 1, 1));
        assert_eq!(s.bytes, 64 + (1 << 16));
        drop(big);
        // A small request does not take the big buffer (more than 2x waste).
        let small = p.acquire(64).unwrap();
        assert_eq!(small.capacity(), 64);
    }

    #[test]
    fn idle_buffers_are_capped() {
        let p = BufferPool::new(PoolConfig {
            max_buffers: None,
            max_idle: Some(1),
            timeout: None,
            pinning: Pinning::Off,
        })
        .unwrap();
        let bufs: Vec<_> = (0..5).map(|_| p.acquire(128).unwrap()).collect();
        drop(bufs);
        let s = p.stats();
        assert_eq!((s.idle, s.allocated, s.evictions, s.releases), (1, 1, 4, 5));
        p.clear();
        assert_eq!((p.stats().allocated, p.stats().bytes), (0, 0));
    }

    #[test]
    fn buffers_outlive_the_pool_handle() {
        let p = pool(Some(2));
        let mut a = p.acquire(16).unwrap();
        drop(p);
        a.copy_from_slice(&[7; 16]);
        assert_eq!(a[15], 7);
        drop(a); // returns into the orphaned pool, which is then freed
    }

    #[test]
    fn new_buffers_are_zeroed_and_writable() {
        let p = pool(None);
        let mut a = p.acquire(100).unwrap();
        assert!(a.iter().all(|&b| b == 0));
        a.fill(0xAB);
        assert_eq!(a.len(), 100);
        assert!(a.iter().all(|&b| b == 0xAB));
    }

    #[test]
    fn standalone_buffers_belong_to_no_pool() {
        let b = PooledBuffer::standalone(10, Pinning::Auto).unwrap();
        assert!(!b.is_pooled());
        assert_eq!(b.as_ptr() as usize % 64, 0);
        assert_eq!(b.pinned(), super::super::pinned_available());
    }

    #[test]
    fn zero_max_buffers_is_refused() {
        let e = BufferPool::new(PoolConfig {
            max_buffers: Some(0),
            ..PoolConfig::default()
        })
        .unwrap_err();
        assert!(matches!(e, StagingError::InvalidConfig(_)));
    }

    #[test]
    fn many_threads_return_every_buffer_once() {
        let p = pool(Some(4));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let p = p.clone();
                std::thread::spawn(move || {
                    for _ in 0..500 {
                        let b = p
                            .acquire_timeout(256, Some(Duration::from_secs(10)))
                            .unwrap();
                        drop(b);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = p.stats();
        assert_eq!(s.releases, 2000);
        assert_eq!(s.reuses + s.allocations, 2000);
        assert!(s.allocated <= 4 && s.in_use == 0);
    }
}
