//! The process's one pool of CPU threads for native work that fans out
//! (decoding the images of a batch, [`crate::image::batch`]).
//!
//! Created on first use, once per process, sized to the machine's
//! parallelism, and shared by every caller: no call spawns threads of its
//! own. A forked child inherits the pool's memory but none of its threads,
//! so the pool is tagged with the pid that made it, and a child makes its
//! own on first use (the parent's is leaked there, not dropped: dropping it
//! would signal threads that do not exist, through locks that a parent
//! thread may have held at the fork).
//!
//! The pid and the pool sit behind one mutex, held only to compare the pid
//! and clone the handle (or, once per process, to start the pool): a fork
//! at that very moment, from another thread, would leave the child's copy
//! locked (the same holds for any lock of the process, the allocator's
//! included; Python warns against forking a process with threads).
//!
//! The pool is `rayon-core`'s: work-stealing, and its scopes let jobs borrow
//! the caller's data (the batch buffer), which a hand-written pool could
//! only offer with `unsafe` lifetime erasure.
//!
//! # Examples
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! let done = AtomicUsize::new(0);
//! ferrofeed::cpu::fan_out(4, || {
//!     done.fetch_add(1, Ordering::Relaxed);
//! });
//! assert_eq!(done.load(Ordering::Relaxed), 4);
//! ```

use std::sync::{Arc, Mutex, PoisonError};

use rayon_core::{ThreadPool, ThreadPoolBuilder};

/// The pool and the pid of the process that made it.
static POOL: Mutex<Option<(u32, Arc<ThreadPool>)>> = Mutex::new(None);

/// Held while one [`fan_out`] call queues its copies.
static SPAWNING: Mutex<()> = Mutex::new(());

fn pid() -> u32 {
    std::process::id()
}

/// This process's pool: made on first use, and again in a forked child.
///
/// # Panics
///
/// When the operating system refuses to start the pool's threads.
pub fn pool() -> Arc<ThreadPool> {
    let mut slot = POOL.lock().unwrap_or_else(PoisonError::into_inner);
    let me = pid();
    match slot.take() {
        Some((owner, pool)) if owner == me => {
            *slot = Some((owner, Arc::clone(&pool)));
            pool
        }
        stale => {
            // A parent's pool, in a forked child: its threads are gone.
            std::mem::forget(stale);
            let threads = std::thread::available_parallelism().map_or(1, usize::from);
            let pool = Arc::new(
                ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("ferrofeed-cpu-{i}"))
                    .build()
                    .expect("cannot start the CPU pool's threads"),
            );
            *slot = Some((me, Arc::clone(&pool)));
            pool
        }
    }
}

/// The number of threads of this process's pool.
pub fn pool_threads() -> usize {
    pool().current_num_threads()
}

/// The threads of this process's pool, or 0 when no pool has been made in
/// this process yet (unlike [`pool_threads`], it makes none).
pub fn threads() -> usize {
    let slot = POOL.lock().unwrap_or_else(PoisonError::into_inner);
    slot.as_ref()
        .filter(|(owner, _)| *owner == pid())
        .map_or(0, |(_, pool)| pool.current_num_threads())
}

/// Runs `work` `copies` times at once (at most): as jobs of the shared
/// [`pool`] (or, for one copy, on the calling thread); returns when all
/// have returned. `work` is typically a loop that takes the next item of a
/// shared queue until none is left. A panic in any copy is resumed here
/// once all have finished.
///
/// The caller only waits (it is not one of the copies): so the pool's
/// threads, which take jobs first come first served, are the only ones
/// working, and two calls at once (two batches in flight) do not put more
/// threads than the pool's on the cores. A call's copies are queued
/// together, so two calls run one after the other, the one that queued
/// first first (when two batches start at the same moment, that may be the
/// second: the first batch then waits for it); a thread whose copy finds
/// the queue empty goes on with the next call's at once, rather than
/// idling until the slowest item of its call is done (BENCHMARKS.md: the
/// training job ran 1.14x faster on 2 cores with two batches in flight).
pub fn fan_out<F>(copies: usize, work: F)
where
    F: Fn() + Sync,
{
    if copies <= 1 {
        work();
        return;
    }
    let pool = pool();
    let work = &work;
    pool.in_place_scope(|s| {
        // One call's copies go into the pool's queue together, so that two
        // calls at once run one after the other rather than side by side.
        let _spawning = SPAWNING.lock().unwrap_or_else(PoisonError::into_inner);
        for _ in 0..copies {
            s.spawn(move |_| work());
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn one_pool_per_process() {
        let a = pool();
        let b = pool();
        assert!(Arc::ptr_eq(&a, &b));
        assert!(pool_threads() >= 1);
        assert_eq!(threads(), pool_threads());
    }

    #[test]
    fn fan_out_runs_every_copy_and_borrows() {
        let mut out = vec![0usize; 64];
        {
            let slots = Mutex::new(out.iter_mut().enumerate());
            let copies = AtomicUsize::new(0);
            fan_out(3, || {
                copies.fetch_add(1, Ordering::Relaxed);
                loop {
                    let next = slots.lock().unwrap().next();
                    let Some((i, slot)) = next else { return };
                    *slot = i * 2;
                }
            });
            assert_eq!(copies.load(Ordering::Relaxed), 3);
        }
        assert!(out.iter().enumerate().all(|(i, v)| *v == i * 2));
    }

    #[test]
    fn copies_run_on_the_pool_and_the_caller_only_waits() {
        let caller = std::thread::current().id();
        let seen = Mutex::new(Vec::new());
        fan_out(4, || seen.lock().unwrap().push(std::thread::current().id()));
        let seen = seen.into_inner().unwrap();
        assert_eq!(seen.len(), 4);
        assert!(
            seen.iter().all(|t| *t != caller),
            "a copy ran on the caller"
        );
        // One copy runs on the caller: no hop to the pool for it.
        let one = Mutex::new(None);
        fan_out(1, || {
            *one.lock().unwrap() = Some(std::thread::current().id());
        });
        assert_eq!(one.into_inner().unwrap(), Some(caller));
    }

    #[test]
    fn a_panicking_copy_panics_the_caller() {
        let r = std::panic::catch_unwind(|| {
            fan_out(2, || panic!("boom"));
        });
        assert!(r.is_err());
        // The pool still works.
        let n = AtomicUsize::new(0);
        fan_out(2, || {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 2);
    }
}
