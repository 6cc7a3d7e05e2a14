//! `in_parallel`: a few scoped threads over indices, for the blocking
//! work (counting and reading shards, scanning them for an index).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// `f(0..n)` on up to `threads` scoped threads, each taking the next index;
/// the results in index order. Hand-written over `std::thread::scope`: the
/// shards are read by blocking calls (files, a fetch's wait) that must not
/// hold the decode pool's threads, and a scope of a few threads per count or
/// window is all it takes.
pub(crate) fn in_parallel<R: Send>(
    n: usize,
    threads: usize,
    f: impl Fn(usize) -> R + Sync,
) -> Vec<R> {
    if threads <= 1 || n <= 1 {
        return (0..n).map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<R>>> = (0..n).map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..threads.min(n) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let r = f(i);
                *results[i]
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(r);
            });
        }
    });
    results
        .into_iter()
        .map(|m| {
            m.into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .expect("every index was run")
        })
        .collect()
}
