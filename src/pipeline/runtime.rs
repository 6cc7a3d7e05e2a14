//! The process's one async runtime, shared by every pipeline.
//!
//! Made on the first [`super::Pipeline::start`], once per process, and kept:
//! later pipelines (the next epoch, a second loader) start their stage
//! tasks on it rather than building and tearing down a runtime of their
//! own. Its workers only move items between stages (the stage tasks await
//! channels and calls); CPU work runs on its blocking pool (native ops), on
//! a stage's own threads (Python functions) or on the [`crate::cpu`] pool
//! (batch decodes). Blocking-pool threads that stay idle for
//! [`BLOCKING_KEEP_ALIVE`] end.
//!
//! Like the CPU pool, the runtime is tagged with the pid that made it: a
//! forked child inherits its memory but none of its threads, so the child
//! makes its own on first use, and leaks the parent's (dropping it would
//! signal threads that do not exist, through locks that a parent thread may
//! have held at the fork).
//!
//! [`threads`] counts the runtime's live threads (workers and blocking-pool
//! threads), so that a caller can tell the runtime's threads from threads a
//! pipeline left behind.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::runtime::Runtime;

/// How long a blocking-pool thread stays idle before it ends.
pub const BLOCKING_KEEP_ALIVE: Duration = Duration::from_secs(10);

/// Most blocking-pool threads alive at once, over all pipelines; each
/// pipeline also bounds its own blocking calls (`PipelineConfig::num_threads`).
const MAX_BLOCKING_THREADS: usize = 128;

/// The process's runtime and its live-thread count.
struct Process {
    pid: u32,
    runtime: Arc<Runtime>,
    live: Arc<AtomicUsize>,
}

static RUNTIME: Mutex<Option<Process>> = Mutex::new(None);

/// Worker threads of the runtime: the machine's parallelism, at most 8.
pub fn workers() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().min(8))
}

/// This process's runtime: made on first use, and again in a forked child.
///
/// # Errors
///
/// When the operating system refuses to start the runtime's threads (the
/// next call tries again).
pub fn runtime() -> std::io::Result<Arc<Runtime>> {
    let mut slot = RUNTIME.lock().unwrap_or_else(PoisonError::into_inner);
    let me = std::process::id();
    if let Some(p) = slot.as_ref().filter(|p| p.pid == me) {
        return Ok(Arc::clone(&p.runtime));
    }
    // A parent's runtime, in a forked child: its threads are gone.
    std::mem::forget(slot.take());
    let live = Arc::new(AtomicUsize::new(0));
    let (up, down) = (Arc::clone(&live), Arc::clone(&live));
    let runtime = Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers())
            .max_blocking_threads(MAX_BLOCKING_THREADS)
            .thread_keep_alive(BLOCKING_KEEP_ALIVE)
            .thread_name("ferrofeed-rt")
            .on_thread_start(move || {
                up.fetch_add(1, Ordering::Relaxed);
            })
            .on_thread_stop(move || {
                down.fetch_sub(1, Ordering::Relaxed);
            })
            .enable_time()
            .build()?,
    );
    *slot = Some(Process {
        pid: me,
        runtime: Arc::clone(&runtime),
        live,
    });
    Ok(runtime)
}

/// Threads of this process's runtime now alive (workers and blocking-pool
/// threads); 0 before its first use in this process.
pub fn threads() -> usize {
    of_this_process(|p| p.live.load(Ordering::Relaxed))
}

/// Tasks of this process's runtime not yet finished (0 before its first
/// use): once every pipeline is stopped, none.
pub fn alive_tasks() -> usize {
    of_this_process(|p| p.runtime.metrics().num_alive_tasks())
}

/// `count` of this process's runtime, or 0 when it has none (yet).
fn of_this_process(count: impl FnOnce(&Process) -> usize) -> usize {
    let slot = RUNTIME.lock().unwrap_or_else(PoisonError::into_inner);
    slot.as_ref()
        .filter(|p| p.pid == std::process::id())
        .map_or(0, count)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The runtime, once its workers have all started (each counts itself
    /// as it starts, just after the runtime is built).
    fn started() -> Arc<Runtime> {
        let rt = runtime().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while threads() < workers() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        rt
    }

    #[test]
    fn one_runtime_per_process() {
        let a = started();
        let b = runtime().unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert!(threads() >= workers());
    }

    #[test]
    fn blocking_threads_are_counted() {
        let rt = started();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (seen_tx, seen_rx) = std::sync::mpsc::channel::<usize>();
        let h = rt.spawn_blocking(move || {
            seen_tx.send(threads()).unwrap();
            rx.recv().unwrap();
        });
        // While the call runs, its thread is alive beside the workers.
        assert!(seen_rx.recv().unwrap() > workers());
        tx.send(()).unwrap();
        rt.block_on(h).unwrap();
    }
}
