//! Byte buffers handed back and reused: a sharded source's member buffers.
//!
//! A sharded source reads each window's samples into fresh buffers on its
//! reading thread; the native chain moves them into a batch and frees them
//! on a decoding thread once decoded. The allocator returns that memory to
//! the kernel between windows, and the next window faults it back in, page
//! by zeroed page: 4% of the CPU of the shards job went to the kernel's page
//! zeroing (`clear_page_erms`; BENCHMARKS.md, "Sharded sources"). Buffers
//! given back here after decoding are taken again by the next reads, still
//! mapped. No crate offers a process-wide pool of plain `Vec<u8>`s (the
//! buffer pools of the ecosystem hand out their own types), hence this one.
//!
//! The pool keeps at most [`MAX_BYTES`] of capacity and [`MAX_BUFFERS`]
//! buffers; a buffer outside [`MIN_LEN`]..=[`MAX_LEN`] is freed as usual.

use std::sync::Mutex;

/// The most capacity the pool keeps, in bytes.
pub const MAX_BYTES: usize = 256 << 20;
/// The most buffers the pool keeps.
pub const MAX_BUFFERS: usize = 8192;
/// Smaller buffers are not worth keeping.
pub const MIN_LEN: usize = 4 << 10;
/// Larger buffers are not kept (a window's members are images, not files of
/// hundreds of megabytes).
pub const MAX_LEN: usize = 64 << 20;
/// How many of the most recently given buffers `take` looks through.
const LOOK: usize = 32;

#[derive(Default)]
struct Pool {
    buffers: Vec<Vec<u8>>,
    bytes: usize,
}

impl Pool {
    const fn new() -> Self {
        Self {
            buffers: Vec::new(),
            bytes: 0,
        }
    }

    fn take(&mut self, len: usize) -> Option<Vec<u8>> {
        if !(MIN_LEN..=MAX_LEN).contains(&len) {
            return None;
        }
        let from = self.buffers.len().saturating_sub(LOOK);
        let k = self.buffers[from..]
            .iter()
            .rposition(|b| b.capacity() >= len && b.capacity() <= 2 * len)?;
        let buffer = self.buffers.swap_remove(from + k);
        self.bytes -= buffer.capacity();
        Some(buffer)
    }

    fn give(&mut self, mut buffer: Vec<u8>) {
        let cap = buffer.capacity();
        if !(MIN_LEN..=MAX_LEN).contains(&cap)
            || self.buffers.len() >= MAX_BUFFERS
            || self.bytes + cap > MAX_BYTES
        {
            return;
        }
        buffer.clear();
        self.bytes += cap;
        self.buffers.push(buffer);
    }
}

static POOL: Mutex<Pool> = Mutex::new(Pool::new());

fn pool() -> std::sync::MutexGuard<'static, Pool> {
    // The pool holds only whole buffers: a panic elsewhere cannot leave it
    // half-updated.
    POOL.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An empty buffer with room for at least `len` bytes: one given back, if
/// one of the last few has room (and not more than twice as much), else a
/// new one.
pub fn take(len: usize) -> Vec<u8> {
    pool().take(len).unwrap_or_else(|| Vec::with_capacity(len))
}

/// Gives `buffer` back for a later [`take`] (its content is dropped), or
/// frees it when the pool is full or the buffer too small or too large.
pub fn give(buffer: Vec<u8>) {
    pool().give(buffer);
}

/// Bytes of capacity the pool holds now.
pub fn held() -> usize {
    pool().bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_taken_again_and_the_caps_hold() {
        let mut pool = Pool::new();
        let mut b = Vec::with_capacity(100_000);
        b.resize(100_000, 7u8);
        let ptr = b.as_ptr();
        pool.give(b);
        assert_eq!(pool.bytes, 100_000);
        let again = pool.take(90_000).expect("the buffer given");
        assert_eq!(again.as_ptr(), ptr, "the same buffer, still mapped");
        assert!(again.is_empty() && again.capacity() >= 90_000);
        assert_eq!(pool.bytes, 0);
        // Not for a request of less than half its size, nor of more.
        pool.give(again);
        assert!(pool.take(10_000).is_none());
        assert!(pool.take(100_001).is_none());
        // Not a tiny buffer nor a huge one.
        pool.give(Vec::with_capacity(100));
        pool.give(Vec::with_capacity(MAX_LEN + 1));
        assert_eq!((pool.buffers.len(), pool.bytes), (1, 100_000));
        // Never more than MAX_BYTES.
        for _ in 0..(MAX_BYTES / MAX_LEN + 2) {
            pool.give(Vec::with_capacity(MAX_LEN));
        }
        assert!(pool.bytes <= MAX_BYTES);
        // The process-wide pool works the same way.
        give(Vec::with_capacity(MIN_LEN));
        let _ = take(MIN_LEN);
    }
}
