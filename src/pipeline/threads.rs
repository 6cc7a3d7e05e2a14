//! Stages that run on threads of their own
//! ([`super::Work::Dedicated`]): functions that take the GIL run there,
//! never on the runtime's workers.
//!
//! # How the threads share the work
//!
//! A stage of concurrency `k` owns `k` threads. They take items from the
//! stage's input channel themselves: no task, job channel or reply channel
//! stands between the items and the threads. Items leave the channel in
//! bulk, numbered, into a queue the threads share ([`Intake::pending`]). A
//! thread with work to do enters one *session* (for a Python stage, one GIL
//! acquisition) and, inside it, takes items from that queue one at a time
//! and calls the function on each, until nothing is left to take, the
//! session has run for [`BATCH_SLICE`], or the stage holds a window's worth
//! of items. Then it leaves the session and hands its results on.
//!
//! Taking items one at a time, inside a session, from a shared queue gives
//! both:
//! - batching of cheap calls: while one thread holds the GIL, it runs item
//!   after item with no hand-off, as a single thread would;
//! - overlap of calls that release the GIL (`time.sleep`, I/O, `NumPy`): the
//!   moment a call releases it, a sibling that waits for it enters its own
//!   session and takes the next item. No thread keeps items to itself that
//!   it cannot run while its call waits.
//!
//! # Order and bounds
//!
//! Items are numbered as they leave the input channel, under the intake
//! lock, so the numbers follow input order. Results go into an outbox; one
//! thread at a time (whichever finds nobody else at it) sends them on: in
//! number order for an ordered stage, as they come for an unordered one.
//! The items a stage holds (taken, not yet sent on) are bounded by its
//! window, so a slow item holds back at most a window of finished ones.
//!
//! # Failures and shutdown
//!
//! Results are sent on, and the error policy applied, by the thread that
//! sends, in order. The function is not wrapped in `catch_unwind` (see
//! [`UnwindGuard`]): a panic ends its thread and fails the stage. Threads
//! that wait (for an item, for room in the window) look at the stop flag at
//! least every [`POLL`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::engine::{thread_name, Emitter, StageCtx, UnwindGuard, BATCH_SLICE, MAX_BATCH};
use super::error::PipelineError;
use super::stage::{ErrorPolicy, ItemFn, MapStage, SessionFn};
use super::stats::StageStats;

/// Smallest window of a stage: the most items it holds at once (taken, not
/// yet sent on) is `max(2 * concurrency, MIN_WINDOW)`. It bounds the items
/// one session runs, and so how often the GIL changes hands. Measured with
/// a no-op Python stage (interleaved runs, 2 vCPUs), µs per item with a
/// window of 16 / 32 / 64: 2.5 / 1.8 / 1.6 at concurrency 1, 3.9 / 3.4 /
/// 2.7 at concurrency 4. 32 keeps most of the gain for half the memory.
const MIN_WINDOW: usize = 32;

/// Longest a waiting thread goes without looking at the stop flag.
const POLL: Duration = Duration::from_millis(10);

/// Times a thread in a session tries again for the intake lock that a
/// sibling holds for a moment (taking an item) before it ends the session.
const TAKE_SPINS: u32 = 100;

/// What one call of the stage function returned.
type Res<T, E> = Result<Option<T>, E>;

/// The stage's input: the channel, and the numbering of what leaves it.
struct Intake<T> {
    rx: flume::Receiver<T>,
    /// Items out of the channel, numbered, for whichever thread takes next
    /// (any thread in a session: none keeps items to itself).
    pending: VecDeque<(u64, T)>,
    /// The number of the next item taken out of the channel.
    next_seq: u64,
    /// The channel is empty and every sender gone.
    closed: bool,
}

impl<T> Intake<T> {
    /// Numbers `first` (if any, received after waiting `waited`) and what
    /// waits in the channel, up to `room` items in all, into `pending`: one
    /// pass over the channel's lock rather than one per item.
    fn refill(
        &mut self,
        first: Option<(T, Duration)>,
        room: u64,
        stats: &StageStats,
        taken: &AtomicU64,
    ) {
        let room = usize::try_from(room).unwrap_or(usize::MAX);
        let Intake {
            rx,
            pending,
            next_seq,
            ..
        } = self;
        let more = rx
            .try_iter()
            .take(room.saturating_sub(usize::from(first.is_some())));
        let more = more.map(|item| (item, Duration::ZERO));
        for (item, waited) in first.into_iter().chain(more) {
            stats.received(waited);
            pending.push_back((*next_seq, item));
            *next_seq += 1;
        }
        taken.store(*next_seq, Ordering::Release);
    }
}

/// Results waiting to be sent on.
struct Outbox<T, E> {
    /// Ordered stage: the results of items `base..`, `None` where the item
    /// is still running.
    slots: VecDeque<Option<Res<T, E>>>,
    /// The number of the next item to send on (ordered stage).
    base: u64,
    /// Unordered stage: results as they came.
    ready: Vec<Res<T, E>>,
    /// A thread is sending results on; others leave theirs here for it.
    emitting: bool,
}

impl<T, E> Outbox<T, E> {
    fn put(&mut self, ordered: bool, seq: u64, result: Res<T, E>) {
        if !ordered {
            self.ready.push(result);
            return;
        }
        let i = usize::try_from(seq.saturating_sub(self.base)).unwrap_or(usize::MAX);
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, || None);
        }
        self.slots[i] = Some(result);
    }

    /// Moves the results that may be sent now into `into`.
    fn take_ready(&mut self, ordered: bool, into: &mut Vec<Res<T, E>>) {
        if !ordered {
            into.append(&mut self.ready);
            return;
        }
        while let Some(Some(_)) = self.slots.front() {
            if let Some(Some(result)) = self.slots.pop_front() {
                into.push(result);
                self.base += 1;
            }
        }
    }
}

/// A [`Work::Dedicated`] stage: what its threads share.
///
/// [`Work::Dedicated`]: super::stage::Work::Dedicated
struct Pool<T, E> {
    name: String,
    f: ItemFn<T, E>,
    session: Option<SessionFn>,
    on_error: ErrorPolicy,
    ordered: bool,
    /// Most items the stage holds at once (taken, not yet sent on).
    window: u64,
    intake: Mutex<Intake<T>>,
    /// Items taken out of the channel (`Intake::next_seq`, readable
    /// without the lock).
    taken: AtomicU64,
    /// Items sent on, dropped or failed; changed only under the outbox
    /// lock, so that `room` waiters never miss a change.
    done: AtomicU64,
    /// Threads that left waiting for a session and have not yet tried to
    /// take an item: an idle thread starts a session only for an item that
    /// none of them will take.
    heading: AtomicUsize,
    outbox: Mutex<Outbox<T, E>>,
    /// Signalled when `done` grows (room in the window).
    room: Condvar,
    /// Signalled when an item leaves `pending`, or a thread that headed for
    /// one found none.
    pending_taken: Condvar,
    /// Threads waiting on `pending_taken` (changed under the intake lock).
    waiters: AtomicUsize,
    /// A thread waits for input inside `recv`, holding the intake lock.
    receiving: AtomicBool,
    out: Emitter<T, E>,
    ctx: StageCtx<E>,
    /// Sending on failed, or the policy said stop: every thread returns.
    dead: AtomicBool,
}

/// Starts the `concurrency` threads of a [`Work::Dedicated`] stage; they
/// take items from `rx` and send results through `out`.
///
/// [`Work::Dedicated`]: super::stage::Work::Dedicated
pub(super) fn spawn<T: Send + 'static, E: Send + 'static>(
    stage: MapStage<T, E>,
    f: ItemFn<T, E>,
    session: Option<SessionFn>,
    rx: flume::Receiver<T>,
    out: Emitter<T, E>,
    ctx: StageCtx<E>,
    handles: &mut Vec<JoinHandle<()>>,
) -> Result<(), PipelineError> {
    let MapStage {
        name,
        concurrency,
        ordered,
        on_error,
        ..
    } = stage;
    let pool = Arc::new(Pool {
        name,
        f,
        session,
        on_error,
        ordered,
        window: concurrency.saturating_mul(2).max(MIN_WINDOW) as u64,
        intake: Mutex::new(Intake {
            rx,
            pending: VecDeque::new(),
            next_seq: 0,
            closed: false,
        }),
        taken: AtomicU64::new(0),
        done: AtomicU64::new(0),
        heading: AtomicUsize::new(0),
        outbox: Mutex::new(Outbox {
            slots: VecDeque::new(),
            base: 0,
            ready: Vec::new(),
            emitting: false,
        }),
        room: Condvar::new(),
        pending_taken: Condvar::new(),
        waiters: AtomicUsize::new(0),
        receiving: AtomicBool::new(false),
        out,
        ctx,
        dead: AtomicBool::new(false),
    });
    for i in 0..concurrency {
        let pool = Arc::clone(&pool);
        let thread = std::thread::Builder::new()
            .name(thread_name(&pool.name, i))
            .spawn(move || {
                let _guard = UnwindGuard {
                    shared: &pool.ctx.shared,
                    stage: &pool.name,
                };
                pool.run();
            })
            .map_err(PipelineError::Start)?;
        handles.push(thread);
    }
    Ok(())
}

impl<T, E> Pool<T, E> {
    fn stopping(&self) -> bool {
        self.dead.load(Ordering::Acquire) || self.ctx.shared.stopping()
    }

    /// Items the stage may take out of its channel now (with the intake
    /// lock held, so that nobody else takes any meanwhile).
    fn room(&self, intake: &Intake<T>) -> u64 {
        let done = self.done.load(Ordering::Acquire);
        self.window
            .saturating_sub(intake.next_seq.saturating_sub(done))
    }

    /// Items the stage holds now.
    fn held(&self) -> u64 {
        // `done` first: it never passes a `taken` read after it.
        let done = self.done.load(Ordering::Acquire);
        self.taken.load(Ordering::Acquire).saturating_sub(done)
    }

    fn lock_outbox(&self) -> MutexGuard<'_, Outbox<T, E>> {
        self.outbox.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One thread's life: wait for work, run a session, hand the results on.
    fn run(&self) {
        let mut results = Vec::with_capacity(MAX_BATCH);
        let mut sending = Vec::with_capacity(MAX_BATCH);
        while self.wait_for_work() {
            let started = Instant::now();
            let mut session = || {
                let mut next = self.take();
                self.heading.fetch_sub(1, Ordering::AcqRel);
                if next.is_none() && self.waiters.load(Ordering::Acquire) > 0 {
                    // The item this thread headed for is another's now, or
                    // still there: let a waiting thread look again.
                    self.pending_taken.notify_one();
                }
                while let Some((seq, item)) = next {
                    let t = Instant::now();
                    results.push((seq, (self.f)(item)));
                    self.ctx.stats.worked(t.elapsed());
                    if started.elapsed() >= BATCH_SLICE || self.stopping() {
                        break;
                    }
                    next = self.take();
                }
            };
            match &self.session {
                Some(s) => s(&mut session),
                None => session(),
            }
            if !results.is_empty() && !self.deposit(&mut results, &mut sending) {
                return;
            }
        }
    }

    /// The next item for a thread in its session, if there is one it may
    /// take now. Never blocks: the thread may hold the GIL, which whoever
    /// holds the intake lock may be waiting for (a Python source).
    fn take(&self) -> Option<(u64, T)> {
        let mut spins = 0;
        let mut intake = loop {
            match self.intake.try_lock() {
                Ok(g) => break g,
                Err(TryLockError::Poisoned(p)) => break p.into_inner(),
                // A thread waits inside `recv` (the channel was empty): end
                // the session; this thread comes back through
                // `wait_for_work`. Else a sibling holds the lock for a
                // moment: try again, a few times.
                Err(TryLockError::WouldBlock) => {
                    if self.receiving.load(Ordering::Acquire) || spins == TAKE_SPINS {
                        return None;
                    }
                    spins += 1;
                    std::hint::spin_loop();
                }
            }
        };
        if intake.pending.is_empty() {
            // Any thread takes them from there.
            let room = self.room(&intake);
            intake.refill(None, room, &self.ctx.stats, &self.taken);
        }
        let numbered = intake.pending.pop_front()?;
        // Read under the lock, which waiters take before they wait.
        let waiting = self.waiters.load(Ordering::Acquire) > 0;
        drop(intake);
        if waiting {
            // It waits for this item to be taken (`wait_for_work`).
            self.pending_taken.notify_one();
        }
        Some(numbered)
    }

    /// Waits (never in a session) until there is an item for this thread to
    /// start a session for; `false` once the stage is over for it.
    fn wait_for_work(&self) -> bool {
        loop {
            if !self.wait_for_room() {
                return false;
            }
            let mut intake = self.intake.lock().unwrap_or_else(PoisonError::into_inner);
            let t = Instant::now();
            loop {
                if self.stopping() {
                    return false;
                }
                // Start a session if there are more items than threads
                // heading for them. (With none heading, `recv` below tells,
                // and takes the item: `len` costs the channel's lock too.)
                let heading = self.heading.load(Ordering::Acquire);
                let pending = intake.pending.len();
                if pending > heading || (heading > 0 && pending + intake.rx.len() > heading) {
                    self.heading.fetch_add(1, Ordering::AcqRel);
                    return true;
                }
                if intake.closed {
                    return false;
                }
                if !intake.pending.is_empty() {
                    // Items another thread will take: wait for that rather
                    // than hold the lock in `recv`, which would keep the
                    // taker from them.
                    self.waiters.fetch_add(1, Ordering::AcqRel);
                    intake = self
                        .pending_taken
                        .wait_timeout(intake, POLL)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                    self.waiters.fetch_sub(1, Ordering::AcqRel);
                    continue;
                }
                if self.room(&intake) == 0 {
                    break; // full again: wait for room without the lock
                }
                self.receiving.store(true, Ordering::Release);
                let received = intake.rx.recv_timeout(POLL);
                self.receiving.store(false, Ordering::Release);
                match received {
                    Ok(item) => {
                        // What came with it too, before the session.
                        let room = self.room(&intake);
                        let first = Some((item, t.elapsed()));
                        intake.refill(first, room, &self.ctx.stats, &self.taken);
                        self.heading.fetch_add(1, Ordering::AcqRel);
                        return true;
                    }
                    Err(flume::RecvTimeoutError::Timeout) => {}
                    Err(flume::RecvTimeoutError::Disconnected) => intake.closed = true,
                }
            }
        }
    }

    /// Waits until the stage holds fewer items than its window; `false` if
    /// it is stopping.
    fn wait_for_room(&self) -> bool {
        if self.held() < self.window {
            return !self.stopping();
        }
        let mut outbox = self.lock_outbox();
        while self.held() >= self.window {
            if self.stopping() {
                return false;
            }
            outbox = self
                .room
                .wait_timeout(outbox, POLL)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        drop(outbox);
        !self.stopping()
    }

    /// Leaves a session's results in the outbox and, unless another thread
    /// is at it, sends on whatever may go (looping while others leave
    /// more). `false` when the stage must stop.
    fn deposit(&self, results: &mut Vec<(u64, Res<T, E>)>, sending: &mut Vec<Res<T, E>>) -> bool {
        let mut outbox = self.lock_outbox();
        for (seq, result) in results.drain(..) {
            outbox.put(self.ordered, seq, result);
        }
        if outbox.emitting {
            return true;
        }
        outbox.emitting = true;
        loop {
            // Nothing goes out after a failure, not even what follows it
            // (a sending thread marks `dead` before it lets go of `emitting`).
            if self.stopping() {
                outbox.emitting = false;
                return false;
            }
            outbox.take_ready(self.ordered, sending);
            if sending.is_empty() {
                outbox.emitting = false;
                return true;
            }
            drop(outbox);
            let mut handled = 0;
            let mut go_on = true;
            for result in sending.drain(..) {
                if !go_on {
                    continue; // dropped: the stage is stopping
                }
                go_on = match result {
                    Ok(Some(v)) => self.out.emit_blocking(v),
                    other => self
                        .ctx
                        .handle_no_send(&self.name, self.on_error, Ok(other))
                        .unwrap_or(true),
                };
                handled += 1;
            }
            outbox = self.lock_outbox();
            self.done.fetch_add(handled, Ordering::AcqRel);
            if !go_on {
                self.dead.store(true, Ordering::Release);
                outbox.emitting = false;
            }
            self.room.notify_all();
            if !go_on {
                return false;
            }
        }
    }
}
