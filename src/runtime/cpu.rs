//! The process's pools of CPU threads for native work that fans out
//! (decoding the images of a batch, [`crate::image::batch`]), and
//! [`Lanes`]: one user's share of them, with its busy time.
//!
//! A pool is made on first use, once per process and thread count, and
//! kept: [`pool`] is the one sized to the machine's parallelism, which
//! `ferrofeed.io.load_images` and the `ops.collate` op share; [`pool_of`]
//! is the one of `n` threads, which every `DataLoader` of `num_threads=n`
//! shares. A loader's decodes then run on exactly `n` threads however many
//! of its batches are in flight, and those threads go from one batch's
//! images to the next one's without waiting for the batch to be handed
//! over: the copies of the work of every batch in flight are queued, and
//! the copy that finishes a batch hands it on ([`Lanes::spawn`]). No call
//! spawns threads of its own.
//!
//! The pools are the process's by the rule of [`super::PerProcess`]: a
//! forked child inherits their memory but none of their threads, so it
//! makes its own on first use (the parent's are leaked there, not dropped).
//! The list of a process's pools sits behind a mutex, held only to find a
//! pool and clone its handle (or, once per process and size, to start one).
//!
//! The pools are `rayon-core`'s: work-stealing, and its scopes let jobs
//! borrow the caller's data (the batch buffer), which a hand-written pool
//! could only offer with `unsafe` lifetime erasure.
//!
//! # Examples
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! let done = AtomicUsize::new(0);
//! ferrofeed::runtime::cpu::fan_out(4, || {
//!     done.fetch_add(1, Ordering::Relaxed);
//! });
//! assert_eq!(done.load(Ordering::Relaxed), 4);
//!
//! // A share of the pool of 2 threads: two copies, then a hand-over.
//! let lanes = std::sync::Arc::new(ferrofeed::runtime::cpu::Lanes::new(2));
//! let (tx, rx) = std::sync::mpsc::channel();
//! lanes.spawn(2, || {}, move |panic| tx.send(panic).unwrap());
//! assert_eq!(rx.recv().unwrap(), None);
//! assert_eq!(lanes.threads(), 2);
//! ```

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rayon_core::{ThreadPool, ThreadPoolBuilder};

use super::PerProcess;

/// The pools of this process, one per thread count.
static POOLS: PerProcess<Mutex<Vec<Arc<ThreadPool>>>> = PerProcess::new();

/// Held while one [`fan_out`] call queues its copies.
static SPAWNING: Mutex<()> = Mutex::new(());

/// The machine's parallelism: the size of [`pool`].
pub fn machine_threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// This process's pool of `threads` threads (at least 1): made on first
/// use, and again in a forked child; kept for the life of the process.
///
/// # Panics
///
/// When the operating system refuses to start the pool's threads.
pub fn pool_of(threads: usize) -> Arc<ThreadPool> {
    let threads = threads.max(1);
    let pools = POOLS.get_or_init(Mutex::default);
    let mut pools = pools.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(pool) = pools.iter().find(|p| p.current_num_threads() == threads) {
        return Arc::clone(pool);
    }
    let pool = Arc::new(
        ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("ferrofeed-cpu-{i}"))
            .build()
            .expect("cannot start the CPU pool's threads"),
    );
    pools.push(Arc::clone(&pool));
    pool
}

/// This process's pool sized to the machine ([`machine_threads`]).
///
/// # Panics
///
/// When the operating system refuses to start the pool's threads.
pub fn pool() -> Arc<ThreadPool> {
    pool_of(machine_threads())
}

/// The number of threads of this process's pool sized to the machine.
pub fn pool_threads() -> usize {
    pool().current_num_threads()
}

/// The threads of all this process's pools, or 0 when no pool has been
/// made in this process yet (unlike [`pool_threads`], it makes none).
pub fn threads() -> usize {
    POOLS.get().map_or(0, |pools| {
        let pools = pools.lock().unwrap_or_else(PoisonError::into_inner);
        pools.iter().map(|p| p.current_num_threads()).sum()
    })
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
/// threads than the pool's on the cores.
pub fn fan_out<F>(copies: usize, work: F)
where
    F: Fn() + Sync,
{
    if copies <= 1 {
        work();
        return;
    }
    fan_out_on(&pool(), copies, work);
}

/// Runs `work` `copies` times as jobs of `pool`, even one copy (the caller
/// only waits), and returns when all have returned; a panic in any copy is
/// resumed here once all have finished.
///
/// A call's copies are queued together, so two calls at once run one after
/// the other, the one that queued first first; a thread whose copy finds
/// its queue empty goes on with the next call's at once, rather than idling
/// until the slowest item of its call is done. With several calls in flight
/// (batches, each a call), the pool's threads thus cross from one batch to
/// the next with no hand-over between them: the caller of each call wakes
/// when its batch is done, while the threads are already on the next.
pub fn fan_out_on<F>(pool: &ThreadPool, copies: usize, work: F)
where
    F: Fn() + Sync,
{
    let work = &work;
    pool.in_place_scope(|s| {
        // One call's copies go into the pool's queue together, so that two
        // calls at once run one after the other rather than side by side.
        let _spawning = SPAWNING.lock().unwrap_or_else(PoisonError::into_inner);
        for _ in 0..copies.max(1) {
            s.spawn(move |_| work());
        }
    });
}

/// One user's share of the CPU pools (a `DataLoader`'s decodes): the pool
/// of [`Lanes::threads`] threads, and the time its jobs kept those threads
/// busy, so that the time they were idle can be told too
/// ([`LanesReport`]).
///
/// It holds no pool, only the size: each call finds the pool of this
/// process, so `Lanes` made before a fork work in the child.
#[derive(Debug)]
pub struct Lanes {
    threads: usize,
    busy_ns: AtomicU64,
    calls: AtomicU64,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    since: Mutex<Span>,
}

/// The time span counted against: from the start of a pass to its end (or
/// to now while it runs).
#[derive(Debug, Clone, Copy)]
struct Span {
    start: Instant,
    end: Option<Instant>,
    busy_at_start: u64,
    calls_at_start: u64,
}

/// What a [`Lanes`] did over its current (or last) span.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LanesReport {
    /// The threads of its pool.
    pub threads: usize,
    /// Time from the start of the span to its end, or to now.
    pub wall: Duration,
    /// Thread time its jobs ran for, over all threads.
    pub busy: Duration,
    /// Thread time its threads had no job of it: `threads x wall - busy`.
    pub idle: Duration,
    /// Calls of [`Lanes::spawn`] (batches) in the span.
    pub calls: u64,
    /// Calls running now.
    pub in_flight: usize,
    /// The most calls that ran at once since the `Lanes` was made.
    pub max_in_flight: usize,
}

impl LanesReport {
    /// The share of the threads' time that was busy, 0 to 1 (0 for an
    /// empty span).
    pub fn busy_share(&self) -> f64 {
        // busy + idle is the threads' time in the span (busy alone when the
        // copies of a call begun before the span ran past it).
        let total = (self.busy + self.idle).as_secs_f64();
        if total > 0.0 {
            self.busy.as_secs_f64() / total
        } else {
            0.0
        }
    }
}

/// A call of [`Lanes::spawn`]: its work, the copies still running, and
/// what runs after the last.
struct Spawned<W, T> {
    lanes: Arc<Lanes>,
    /// Dropped before `then` runs, with whatever it holds.
    work: Mutex<Option<Arc<W>>>,
    left: AtomicUsize,
    then: Mutex<Option<T>>,
    panic: Mutex<Option<String>>,
}

impl<W: Fn(), T: FnOnce(Option<String>)> Spawned<W, T> {
    /// One copy: the work, timed; then, for the copy that returns last,
    /// `then`, once the work (and what it holds) is dropped.
    fn run_copy(&self) {
        let t = Instant::now();
        let work = self
            .work
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if let Some(work) = &work {
                work();
            }
        }));
        // This copy's handle goes before it counts itself out, so the last
        // copy's drop below is the work's last.
        drop(work);
        self.lanes
            .busy_ns
            .fetch_add(nanos(t.elapsed()), Ordering::Relaxed);
        if let Err(payload) = ran {
            self.panic
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_or_insert_with(|| crate::panic::message(&*payload));
        }
        // AcqRel: the last copy sees every other copy's writes.
        if self.left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        drop(
            self.work
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        let then = self
            .then
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let panic = self
            .panic
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        self.lanes.in_flight.fetch_sub(1, Ordering::AcqRel);
        if let Some(then) = then {
            // A panic in `then` must not reach the pool either; it has no
            // one to report to but the log.
            if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                then(panic);
            })) {
                eprintln!(
                    "ferrofeed: a finished batch's hand-over panicked: {}",
                    crate::panic::message(&*payload)
                );
            }
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Lanes {
    /// A share of the pool of `threads` threads (at least 1); its span
    /// starts now.
    pub fn new(threads: usize) -> Self {
        Self {
            threads: threads.max(1),
            busy_ns: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            since: Mutex::new(Span {
                start: Instant::now(),
                end: None,
                busy_at_start: 0,
                calls_at_start: 0,
            }),
        }
    }

    /// The threads of its pool.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `work` `copies` times (at least once) as jobs of the pool of
    /// [`Lanes::threads`] threads, without waiting for them: the copy that
    /// returns last then runs `then` on its thread, given the message of a
    /// copy's panic, if one panicked (caught here: a panic must not reach
    /// the pool, which would abort the process). Each copy's run counts as
    /// busy time, and the call is in flight until `then` has run.
    ///
    /// Where a caller would only wait for [`fan_out_on`], this saves the
    /// two thread hand-overs of waiting: being woken when the copies are
    /// done, and waking whoever waits for the caller. With several calls
    /// made one after the other, their copies run in that order.
    pub fn spawn<W, T>(self: &Arc<Self>, copies: usize, work: W, then: T)
    where
        W: Fn() + Send + Sync + 'static,
        T: FnOnce(Option<String>) + Send + 'static,
    {
        let now = self.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        self.max_in_flight.fetch_max(now, Ordering::AcqRel);
        self.calls.fetch_add(1, Ordering::Relaxed);
        let copies = copies.max(1);
        let call = Arc::new(Spawned {
            lanes: Arc::clone(self),
            work: Mutex::new(Some(Arc::new(work))),
            left: AtomicUsize::new(copies),
            then: Mutex::new(Some(then)),
            panic: Mutex::new(None),
        });
        let pool = pool_of(self.threads);
        // One call's copies go into the pool's queue together (see `fan_out_on`).
        let _spawning = SPAWNING.lock().unwrap_or_else(PoisonError::into_inner);
        for _ in 0..copies {
            let call = Arc::clone(&call);
            pool.spawn(move || call.run_copy());
        }
    }

    /// Starts a new span (a loader's pass) now.
    pub fn start_span(&self) {
        let mut span = self.since.lock().unwrap_or_else(PoisonError::into_inner);
        *span = Span {
            start: Instant::now(),
            end: None,
            busy_at_start: self.busy_ns.load(Ordering::Relaxed),
            calls_at_start: self.calls.load(Ordering::Relaxed),
        };
    }

    /// Ends the current span now (its figures stop growing); a no-op when
    /// it has ended.
    pub fn end_span(&self) {
        let mut span = self.since.lock().unwrap_or_else(PoisonError::into_inner);
        span.end.get_or_insert_with(Instant::now);
    }

    /// What it did over its current (or last) span.
    pub fn report(&self) -> LanesReport {
        let span = *self.since.lock().unwrap_or_else(PoisonError::into_inner);
        let wall = span.end.unwrap_or_else(Instant::now) - span.start;
        let busy = Duration::from_nanos(
            self.busy_ns
                .load(Ordering::Relaxed)
                .saturating_sub(span.busy_at_start),
        );
        let capacity = wall.saturating_mul(u32::try_from(self.threads).unwrap_or(u32::MAX));
        LanesReport {
            threads: self.threads,
            wall,
            busy,
            idle: capacity.saturating_sub(busy),
            calls: self
                .calls
                .load(Ordering::Relaxed)
                .saturating_sub(span.calls_at_start),
            in_flight: self.in_flight.load(Ordering::Acquire),
            max_in_flight: self.max_in_flight.load(Ordering::Acquire),
        }
    }
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
        // Other tests make pools of other sizes meanwhile.
        assert!(threads() >= pool_threads());
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
    fn one_pool_per_size_and_the_machine_pool_among_them() {
        let one = pool_of(1);
        let three = pool_of(3);
        assert_eq!(one.current_num_threads(), 1);
        assert_eq!(three.current_num_threads(), 3);
        assert!(Arc::ptr_eq(&one, &pool_of(1)));
        assert!(Arc::ptr_eq(&pool(), &pool_of(machine_threads())));
        assert!(Arc::ptr_eq(&pool_of(0), &one), "0 threads is 1");
        assert!(threads() >= 4, "the pools of 1 and 3 threads at least");
    }

    #[test]
    fn one_copy_on_a_pool_runs_there_not_on_the_caller() {
        let caller = std::thread::current().id();
        let ran = Mutex::new(None);
        fan_out_on(&pool_of(1), 1, || {
            *ran.lock().unwrap() = Some(std::thread::current().id());
        });
        let ran = ran.into_inner().unwrap().unwrap();
        assert_ne!(ran, caller);
    }

    /// Spawns `copies` copies of `work` on `lanes` and waits for the hand-over.
    fn spawn_and_wait(lanes: &Arc<Lanes>, copies: usize, work: impl Fn() + Send + Sync + 'static) {
        let (tx, rx) = std::sync::mpsc::channel();
        lanes.spawn(copies, work, move |panic| tx.send(panic).unwrap());
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), None);
    }

    #[test]
    fn lanes_run_on_their_own_threads_and_count_busy_time() {
        let lanes = Arc::new(Lanes::new(2));
        let names = Arc::new(Mutex::new(std::collections::BTreeSet::new()));
        let started = Instant::now();
        let seen = Arc::clone(&names);
        spawn_and_wait(&lanes, 2, move || {
            seen.lock()
                .unwrap()
                .insert(std::thread::current().name().map(str::to_owned));
            std::thread::sleep(Duration::from_millis(20));
        });
        let elapsed = started.elapsed();
        let names = names.lock().unwrap();
        assert!(
            names.iter().all(|n| n
                .as_deref()
                .is_some_and(|n| n.starts_with("ferrofeed-cpu-"))),
            "{names:?}"
        );
        let r = lanes.report();
        assert_eq!(
            (r.threads, r.calls, r.in_flight, r.max_in_flight),
            (2, 1, 0, 1)
        );
        // Two copies of at least 20 ms each, and never more than the threads could give.
        assert!(r.busy >= Duration::from_millis(40), "{r:?}");
        assert!(r.busy <= elapsed * 2 + Duration::from_millis(5), "{r:?}");
        assert_eq!(r.idle, (r.wall * 2).saturating_sub(r.busy));
        assert!(r.busy_share() > 0.0 && r.busy_share() <= 1.0);
        // A new span starts from zero, and an ended one stops growing.
        lanes.start_span();
        lanes.end_span();
        let a = lanes.report();
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(lanes.report(), a);
        assert_eq!((a.busy, a.calls), (Duration::ZERO, 0));
    }

    #[test]
    fn lanes_count_calls_in_flight_at_once() {
        let lanes = Arc::new(Lanes::new(4));
        let barrier = Arc::new(std::sync::Barrier::new(3));
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..3 {
            let (barrier, tx) = (Arc::clone(&barrier), tx.clone());
            // Every call is running before any ends.
            lanes.spawn(
                1,
                move || {
                    barrier.wait();
                },
                move |_| tx.send(()).unwrap(),
            );
        }
        for _ in 0..3 {
            rx.recv_timeout(Duration::from_secs(10)).unwrap();
        }
        let r = lanes.report();
        assert_eq!((r.calls, r.in_flight, r.max_in_flight), (3, 0, 3));
    }

    #[test]
    fn spawned_copies_run_on_the_pool_and_the_last_hands_over() {
        let lanes = Arc::new(Lanes::new(3));
        let (tx, rx) = std::sync::mpsc::channel();
        let ran = Arc::new(AtomicUsize::new(0));
        let caller = std::thread::current().id();
        let seen = Arc::new(Mutex::new(Vec::new()));
        {
            let (ran, seen, ran2) = (Arc::clone(&ran), Arc::clone(&seen), Arc::clone(&ran));
            lanes.spawn(
                3,
                move || {
                    ran.fetch_add(1, Ordering::Relaxed);
                    seen.lock().unwrap().push(std::thread::current().id());
                    std::thread::sleep(Duration::from_millis(5));
                },
                move |panic| {
                    // Every copy has returned before the hand-over.
                    tx.send((ran2.load(Ordering::Relaxed), panic)).unwrap();
                },
            );
        }
        let (copies, panic) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!((copies, panic), (3, None));
        assert!(seen.lock().unwrap().iter().all(|t| *t != caller));
        let r = lanes.report();
        assert_eq!((r.calls, r.in_flight, r.max_in_flight), (1, 0, 1));
        assert!(r.busy >= Duration::from_millis(15), "{r:?}");
    }

    #[test]
    fn a_spawned_calls_work_is_dropped_before_the_hand_over() {
        let lanes = Arc::new(Lanes::new(2));
        let held = Arc::new(());
        let (tx, rx) = std::sync::mpsc::channel();
        let (in_work, in_then) = (Arc::clone(&held), Arc::clone(&held));
        lanes.spawn(
            4,
            move || {
                let _ = &in_work;
            },
            move |_| {
                // Only this closure's handle and the test's are left.
                tx.send(Arc::strong_count(&in_then)).unwrap();
            },
        );
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 2);
    }

    #[test]
    fn a_spawned_copys_panic_reaches_the_hand_over_not_the_pool() {
        let lanes = Arc::new(Lanes::new(2));
        let (tx, rx) = std::sync::mpsc::channel();
        lanes.spawn(
            2,
            || panic!("copy failed"),
            move |panic| tx.send(panic).unwrap(),
        );
        let panic = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(panic.as_deref(), Some("copy failed"));
        // The pool lives on, and a panicking hand-over is caught too.
        let (tx, rx) = std::sync::mpsc::channel();
        lanes.spawn(1, || {}, |_| panic!("hand-over failed"));
        lanes.spawn(1, || {}, move |panic| tx.send(panic).unwrap());
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), None);
        // (The call before may still be in its hand-over on the other thread.)
        let deadline = Instant::now() + Duration::from_secs(10);
        while lanes.report().in_flight != 0 {
            assert!(Instant::now() < deadline, "a call never left");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(lanes.report().calls, 3);
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
