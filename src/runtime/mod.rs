//! What a process keeps for native work: one of each, made on first use and
//! kept for the life of the process, made again in a forked child.
//!
//! - The async runtime ([`current`]): one tokio runtime per process, shared
//!   by every pipeline's stage tasks and stats reporter
//!   ([`crate::pipeline`]), every remote source's fetches and the storage
//!   clients' requests ([`crate::remote`]). Its workers only move items and
//!   bytes (stage tasks await channels and calls, fetches await the
//!   network); CPU work runs on its blocking pool (native ops, a cache's
//!   writes), on a stage's own threads (Python functions) or on the CPU
//!   pools.
//! - The CPU pools ([`cpu`]): batch decodes, one `rayon` pool per thread
//!   count.
//! - The storage clients: one per store and options, kept by
//!   `remote::store` as a [`PerProcess`] map (a client is built from
//!   `remote`'s URL and options, which this module, below `remote`, does
//!   not name). They send their requests on the async runtime.
//!
//! # Fork
//!
//! All three follow one rule, [`PerProcess`]: each is tagged with the pid
//! that made it, a forked child makes its own on first use, and the parent's
//! are leaked there (never dropped: their threads do not exist in the
//! child). So a `DataLoader`'s worker processes under fork, spawn or
//! forkserver each get their own runtime, pools and clients.
//!
//! # Tasks and threads, counted
//!
//! [`threads`] counts the runtime's live threads (workers and blocking-pool
//! threads) and [`alive_tasks`] the tasks started through
//! [`Runtime::spawn`] and [`Runtime::spawn_blocking`] that have not ended,
//! so that a test can tell the process's threads from threads a pipeline
//! left behind, and see that no pipeline's or remote source's task (nor a
//! sharded source's window read) outlives it. The storage clients'
//! own tasks (one per pooled HTTP connection, ending when the connection
//! has been idle a while) are the clients', like the runtime's threads, and
//! not counted.

pub mod cpu;
mod process;

pub use process::PerProcess;

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

/// How long a blocking-pool thread stays idle before it ends.
pub const BLOCKING_KEEP_ALIVE: Duration = Duration::from_secs(10);

/// Most blocking-pool threads alive at once; each pipeline also bounds its
/// own blocking calls (`PipelineConfig::num_threads`).
const MAX_BLOCKING_THREADS: usize = 128;

/// The process's async runtime, with its counts of live threads and tasks.
pub struct Runtime {
    tokio: tokio::runtime::Runtime,
    threads: Arc<AtomicUsize>,
    tasks: Arc<AtomicUsize>,
}

static RUNTIME: PerProcess<Runtime> = PerProcess::new();

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
pub fn current() -> std::io::Result<Arc<Runtime>> {
    RUNTIME.get_or_try_init(|| {
        let threads = Arc::new(AtomicUsize::new(0));
        let (up, down) = (Arc::clone(&threads), Arc::clone(&threads));
        let tokio = tokio::runtime::Builder::new_multi_thread()
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
            // Time for stage timeouts and stats, I/O for the storage clients.
            .enable_all()
            .build()?;
        Ok(Runtime {
            tokio,
            threads,
            tasks: Arc::new(AtomicUsize::new(0)),
        })
    })
}

/// Threads of this process's runtime now alive (workers and blocking-pool
/// threads); 0 before its first use in this process.
pub fn threads() -> usize {
    RUNTIME
        .get()
        .map_or(0, |rt| rt.threads.load(Ordering::Relaxed))
}

/// Tasks started with [`Runtime::spawn`] or [`Runtime::spawn_blocking`] in
/// this process that have not ended (0 before the runtime's first use):
/// once every pipeline is stopped and every remote source dropped, none.
pub fn alive_tasks() -> usize {
    RUNTIME
        .get()
        .map_or(0, |rt| rt.tasks.load(Ordering::Acquire))
}

/// Counts a task out when its future is dropped: when it ends, is aborted,
/// or is dropped unpolled.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

impl Runtime {
    /// Starts `future` as a task, counted in [`alive_tasks`] until it ends.
    /// The count drops before the task's handle reports it finished.
    pub fn spawn<F>(&self, future: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tasks.fetch_add(1, Ordering::AcqRel);
        let counted = Counted(Arc::clone(&self.tasks));
        self.tokio.spawn(async move {
            let _counted = counted;
            future.await
        })
    }

    /// Runs `f` on the runtime's blocking pool (work that blocks on files
    /// and fetches: a sharded source's window reads), counted in
    /// [`alive_tasks`] until it ends. Aborting the handle cancels it if it
    /// has not started.
    pub fn spawn_blocking<F, R>(&self, f: F) -> JoinHandle<R>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        self.tasks.fetch_add(1, Ordering::AcqRel);
        let counted = Counted(Arc::clone(&self.tasks));
        self.tokio.spawn_blocking(move || {
            let _counted = counted;
            f()
        })
    }

    /// Runs `future` to its end on the calling thread (which must not be
    /// one of the runtime's), its I/O and timers driven by the runtime.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.tokio.block_on(future)
    }

    /// Enters the runtime's context on this thread (for as long as the
    /// guard lives): what builds a storage client needs.
    pub fn enter(&self) -> tokio::runtime::EnterGuard<'_> {
        self.tokio.enter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// The runtime, once its workers have all started (each counts itself
    /// as it starts, just after the runtime is built).
    fn started() -> Arc<Runtime> {
        let rt = current().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while threads() < workers() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        rt
    }

    #[test]
    fn one_runtime_per_process() {
        let a = started();
        let b = current().unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert!(threads() >= workers());
    }

    #[test]
    fn blocking_threads_are_counted() {
        let rt = started();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (seen_tx, seen_rx) = std::sync::mpsc::channel::<usize>();
        let h = rt.spawn(async move {
            tokio::task::spawn_blocking(move || {
                seen_tx.send(threads()).unwrap();
                rx.recv().unwrap();
            })
            .await
        });
        // While the call runs, its thread is alive beside the workers.
        assert!(seen_rx.recv().unwrap() > workers());
        tx.send(()).unwrap();
        rt.block_on(h).unwrap().unwrap();
    }

    #[test]
    fn spawned_tasks_are_counted_until_they_end_or_are_aborted() {
        // The process's count is shared with the other tests running at
        // once: a runtime of the test's own is counted instead.
        let own = Runtime {
            tokio: tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap(),
            threads: Arc::new(AtomicUsize::new(0)),
            tasks: Arc::new(AtomicUsize::new(0)),
        };
        let pending = own.spawn(std::future::pending::<()>());
        let done = own.spawn(async {});
        assert_eq!(own.tasks.load(Ordering::Acquire), 2);
        own.block_on(done).unwrap();
        assert_eq!(own.tasks.load(Ordering::Acquire), 1);
        pending.abort();
        assert!(own.block_on(pending).unwrap_err().is_cancelled());
        assert_eq!(own.tasks.load(Ordering::Acquire), 0);
        // Dropped unpolled (the runtime shut down first): counted out too.
        let unpolled = own.spawn(async {});
        drop(unpolled);
        drop(own.tokio);
        assert_eq!(own.tasks.load(Ordering::Acquire), 0);
    }
}
