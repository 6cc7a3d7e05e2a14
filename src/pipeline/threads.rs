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
//! lock, so the numbers follow input order. Each result goes into an
//! outbox as its call returns (a thread never keeps results while its next
//! call waits). Threads out of a session send them on, one thread at a time
//! (whichever finds nobody else at it): after each session, and when idle.
//! An ordered stage sends them in number order, an unordered one as they
//! come. The items a stage holds (numbered, not yet sent on) are bounded by
//! its window, so a slow item holds back at most a window of finished ones.
//! Finished results never keep the window full while they could go, so
//! calls that wait for each other (a barrier of `concurrency` calls) get
//! their threads.
//!
//! Idle threads wait for input in the channel's `recv`, or on one signal
//! that whatever they wait for bumps: items numbered or taken, a thread
//! that headed for an item and found none, results sent on.
//!
//! # Failures and shutdown
//!
//! Results are sent on, and the error policy applied, by the thread that
//! sends, in order; after a fatal one nothing more goes out. The function
//! is not wrapped in `catch_unwind` (see [`UnwindGuard`]): a panic ends its
//! thread and fails the stage. Threads
//! that wait (for an item, for room in the window) look at the stop flag at
//! least every [`POLL`].

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::error::{Failure, PipelineError};
use super::shared::{thread_name, Emitter, Handled, Msg, StageCtx, UnwindGuard, BATCH_SLICE};
use super::stage::{ErrorPolicy, ItemFn, MapStage, SessionFn, StageTimeout};
use super::stats::StageStats;

/// Smallest window of a stage: the most items it holds at once (taken, not
/// yet sent on) is `max(2 * concurrency, MIN_WINDOW)`. It bounds the items
/// one session runs, and so how often the GIL changes hands. Measured with
/// a no-op Python stage (alternating runs, 2 vCPUs, before results went to
/// the outbox call by call), µs per item with a window of 16 / 32 / 64:
/// 2.5 / 1.8 / 1.6 at concurrency 1, 3.9 / 3.4 / 2.7 at concurrency 4. 32
/// keeps most of the gain for half the memory.
const MIN_WINDOW: usize = 32;

/// Longest a waiting thread goes without looking at the stop flag.
const POLL: Duration = Duration::from_millis(10);

/// Times a thread in a session tries again for the intake lock that a
/// sibling holds for a moment (taking an item) before it ends the session.
const TAKE_SPINS: u32 = 100;

/// What one call of the stage function returned.
type Res<T, E> = Result<Option<T>, E>;

/// What an item left in the outbox.
enum Done<T, E> {
    /// The result of the call on it.
    Call(Res<T, E>),
    /// It was an upstream failure, to send on after what came before it.
    Upstream(Failure<E>),
}

/// The stage's input: the channel, and the numbering of what leaves it.
struct Intake<T, E> {
    rx: flume::Receiver<Msg<T, E>>,
    /// Items out of the channel, numbered, for whichever thread takes next
    /// (any thread in a session: none keeps items to itself).
    pending: VecDeque<(u64, Msg<T, E>)>,
    /// The number of the next item taken out of the channel.
    next_seq: u64,
    /// The channel is empty and every sender gone, or an upstream failure
    /// came (nothing follows it).
    closed: bool,
}

impl<T, E> Intake<T, E> {
    /// Numbers `first` (if any, received after waiting `waited`) and what
    /// waits in the channel, up to `room` items in all, into `pending`: one
    /// pass over the channel's lock rather than one per item.
    fn refill(&mut self, first: Option<(Msg<T, E>, Duration)>, room: u64, stats: &StageStats) {
        if self.closed {
            return;
        }
        let room = usize::try_from(room).unwrap_or(usize::MAX);
        let Intake {
            rx,
            pending,
            next_seq,
            closed,
        } = self;
        let more = rx
            .try_iter()
            .take(room.saturating_sub(usize::from(first.is_some())));
        let more = more.map(|item| (item, Duration::ZERO));
        for (msg, waited) in first.into_iter().chain(more) {
            let failure = matches!(msg, Msg::Fail(_));
            if !failure {
                stats.received(waited);
            }
            pending.push_back((*next_seq, msg));
            *next_seq += 1;
            if failure {
                *closed = true;
                return;
            }
        }
    }
}

/// Results waiting to be sent on.
struct Outbox<T, E> {
    /// Ordered stage: the results of items `base..`, `None` where the item
    /// is still running.
    slots: VecDeque<Option<Done<T, E>>>,
    /// The number of the next item to send on (ordered stage).
    base: u64,
    /// Unordered stage: results as they came.
    ready: Vec<Done<T, E>>,
    /// Unordered stage: results moved out so far.
    taken: u64,
    /// Unordered stage: an upstream failure and its number, sent on once
    /// every item numbered before it is (they came before it).
    upstream: Option<(u64, Failure<E>)>,
    /// A thread is sending results on; others leave theirs here for it.
    emitting: bool,
    /// With a timeout: the call each thread runs (its item's number and
    /// when it started).
    running: Vec<Option<(u64, Instant, std::thread::ThreadId)>>,
    /// With a timeout: items whose call ran past it and failed; the call's
    /// own result is thrown away when it returns.
    expired: HashSet<u64>,
}

impl<T, E> Outbox<T, E> {
    fn put(&mut self, ordered: bool, seq: u64, result: Done<T, E>) {
        if !ordered {
            match result {
                Done::Upstream(f) => self.upstream = Some((seq, f)),
                call @ Done::Call(_) => self.ready.push(call),
            }
            return;
        }
        let i = usize::try_from(seq.saturating_sub(self.base)).unwrap_or(usize::MAX);
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, || None);
        }
        self.slots[i] = Some(result);
    }

    /// Moves the results that may be sent now into `into`.
    fn take_ready(&mut self, ordered: bool, into: &mut Vec<Done<T, E>>) {
        if !ordered {
            self.taken += self.ready.len() as u64;
            into.append(&mut self.ready);
            if matches!(self.upstream, Some((seq, _)) if seq == self.taken) {
                if let Some((_, f)) = self.upstream.take() {
                    into.push(Done::Upstream(f));
                }
            }
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
    timeout: Option<StageTimeout<E>>,
    /// Threads still running [`Pool::run`]: the watchdog (with a timeout)
    /// returns when none is.
    live: AtomicUsize,
    /// Most items the stage holds at once (taken, not yet sent on).
    window: u64,
    intake: Mutex<Intake<T, E>>,
    /// Items sent on, dropped or failed.
    done: AtomicU64,
    /// Threads that left waiting for a session and have not yet tried to
    /// take an item: an idle thread starts a session only for an item that
    /// none of them will take.
    heading: AtomicUsize,
    outbox: Mutex<Outbox<T, E>>,
    /// What idle threads wait on: bumped (and the condvar signalled) when
    /// what they wait for may have changed: items numbered or taken, a
    /// thread that headed for an item found none, results sent on (room in
    /// the window).
    signal: Mutex<u64>,
    changed: Condvar,
    /// Threads waiting on `changed`; nobody signals when there are none.
    waiters: AtomicUsize,
    /// A thread waits for input inside `recv`, holding the intake lock.
    receiving: AtomicBool,
    /// Where results go; `None` once the watchdog let go of it because every
    /// item was sent on while a thread was still stuck in a call that ran
    /// past the timeout (so the stages downstream see the end at once).
    out: Mutex<Option<Emitter<T, E>>>,
    ctx: StageCtx<E>,
    /// Sending on failed, or the policy said stop: every thread returns.
    dead: AtomicBool,
    /// Threads the watchdog started in place of ones stuck in a call that
    /// ran past the timeout (joined by the watchdog when the stage is over,
    /// unless stuck themselves).
    replacements: Mutex<Vec<JoinHandle<()>>>,
}

/// Starts the `concurrency` threads of a [`Work::Dedicated`] stage; they
/// take items from `rx` and send results through `out`.
///
/// [`Work::Dedicated`]: super::stage::Work::Dedicated
pub(super) fn spawn<T: Send + 'static, E: Send + 'static>(
    stage: MapStage<T, E>,
    f: ItemFn<T, E>,
    session: Option<SessionFn>,
    rx: flume::Receiver<Msg<T, E>>,
    out: Emitter<T, E>,
    ctx: StageCtx<E>,
    handles: &mut Vec<JoinHandle<()>>,
) -> Result<(), PipelineError> {
    let MapStage {
        name,
        concurrency,
        ordered,
        on_error,
        timeout,
        ..
    } = stage;
    let pool = Arc::new(Pool {
        name,
        f,
        session,
        on_error,
        ordered,
        timeout,
        live: AtomicUsize::new(0),
        window: concurrency.saturating_mul(2).max(MIN_WINDOW) as u64,
        intake: Mutex::new(Intake {
            rx,
            pending: VecDeque::new(),
            next_seq: 0,
            closed: false,
        }),
        done: AtomicU64::new(0),
        heading: AtomicUsize::new(0),
        outbox: Mutex::new(Outbox {
            slots: VecDeque::new(),
            base: 0,
            ready: Vec::new(),
            taken: 0,
            upstream: None,
            emitting: false,
            running: vec![None; concurrency],
            expired: HashSet::new(),
        }),
        signal: Mutex::new(0),
        changed: Condvar::new(),
        waiters: AtomicUsize::new(0),
        receiving: AtomicBool::new(false),
        out: Mutex::new(Some(out)),
        ctx,
        dead: AtomicBool::new(false),
        replacements: Mutex::new(Vec::new()),
    });
    for i in 0..concurrency {
        handles.push(pool.start_thread(i).map_err(PipelineError::Start)?);
    }
    if pool.timeout.is_some() {
        let pool = Arc::clone(&pool);
        let thread = std::thread::Builder::new()
            .name(thread_name(&pool.name, concurrency))
            .spawn(move || pool.watch())
            .map_err(PipelineError::Start)?;
        handles.push(thread);
    }
    Ok(())
}

/// Counts a thread out of [`Pool::live`] when it leaves, however it leaves.
struct Leaving<'a>(&'a AtomicUsize);

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl<T: Send + 'static, E: Send + 'static> Pool<T, E> {
    /// Starts thread `me` of the stage (counted in [`Pool::live`] while it
    /// runs).
    fn start_thread(self: &Arc<Self>, me: usize) -> std::io::Result<JoinHandle<()>> {
        let pool = Arc::clone(self);
        self.live.fetch_add(1, Ordering::AcqRel);
        std::thread::Builder::new()
            .name(thread_name(&self.name, me))
            .spawn(move || {
                let _guard = UnwindGuard {
                    shared: &pool.ctx.shared,
                    stage: &pool.name,
                };
                let _leaving = Leaving(&pool.live);
                pool.run(me);
            })
            .inspect_err(|_| {
                self.live.fetch_sub(1, Ordering::AcqRel);
            })
    }

    /// The watchdog of a stage with a timeout: fails the calls that run past
    /// it and sends their failures on (the stage's threads may all be stuck
    /// in calls, so none of them would). Returns when the stage is over.
    fn watch(self: &Arc<Self>) {
        self.watch_calls();
        // The stage is over: its replacement threads end with it (a stuck
        // one was abandoned like the thread it replaced).
        let replacements = std::mem::take(&mut *self.lock_replacements());
        for thread in replacements {
            if !self.ctx.shared.is_abandoned(thread.thread().id()) {
                let _ = thread.join();
            }
        }
    }

    /// The watchdog's loop; returns when the stage is over.
    fn watch_calls(self: &Arc<Self>) {
        let Some(timeout) = &self.timeout else {
            return;
        };
        let tick = (timeout.limit / 10).clamp(Duration::from_millis(1), POLL);
        let mut overdue = Vec::new();
        while !self.stopping() && self.live.load(Ordering::Acquire) > 0 {
            std::thread::sleep(tick);
            {
                let mut outbox = self.lock_outbox();
                for (me, slot) in outbox.running.iter_mut().enumerate() {
                    if let Some((seq, started, thread)) = *slot {
                        if started.elapsed() >= timeout.limit {
                            *slot = None;
                            overdue.push((seq, me));
                            self.ctx.shared.abandon(thread, true);
                        }
                    }
                }
                for &(seq, _) in &overdue {
                    outbox.expired.insert(seq);
                    let error = (timeout.error)(&self.name, timeout.limit);
                    outbox.put(self.ordered, seq, Done::Call(Err(error)));
                }
            }
            // The stuck threads leave when their calls return; new threads
            // take their places at once, so that the stage keeps its
            // concurrency and a call that never returns holds up nothing
            // but itself. (A thread that cannot be started leaves the stage
            // a thread short; the stall watch names a stage left with none.)
            for (_, me) in overdue.drain(..) {
                if let Ok(thread) = self.start_thread(me) {
                    self.lock_replacements().push(thread);
                }
            }
            if !self.emit() {
                return;
            }
            // Every item taken was sent on and no more will come, though a
            // thread may still be stuck in a call that ran past the timeout:
            // let go of the output, so that the stages downstream end now.
            let complete = {
                let intake = self.intake.lock().unwrap_or_else(PoisonError::into_inner);
                intake.closed
                    && intake.pending.is_empty()
                    && self.done.load(Ordering::Acquire) == intake.next_seq
            };
            if complete {
                drop(
                    self.out
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .take(),
                );
                return;
            }
        }
    }
}

impl<T, E> Pool<T, E> {
    fn stopping(&self) -> bool {
        self.dead.load(Ordering::Acquire) || self.ctx.shared.stopping()
    }

    /// Items the stage may take out of its channel now (with the intake
    /// lock held, so that nobody else takes any meanwhile).
    fn room(&self, intake: &Intake<T, E>) -> u64 {
        let held = intake
            .next_seq
            .saturating_sub(self.done.load(Ordering::Acquire));
        self.window.saturating_sub(held)
    }

    fn lock_outbox(&self) -> MutexGuard<'_, Outbox<T, E>> {
        self.outbox.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_replacements(&self) -> MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.replacements
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_signal(&self) -> MutexGuard<'_, u64> {
        self.signal.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes the idle threads, if any, to look again. Never blocks for
    /// long: the signal lock is only ever held for a moment.
    fn wake_idle(&self) {
        // Pairs with the fence in `wait_for_work`: either that thread sees
        // the change, or this one sees it waiting.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.waiters.load(Ordering::SeqCst) > 0 {
            *self.lock_signal() += 1;
            self.changed.notify_all();
        }
    }

    /// One thread's life (thread `me` of the stage): wait for work, run a
    /// session, send results on.
    fn run(&self, me: usize) {
        let mut retired = false;
        while !retired && self.wait_for_work() {
            let started = Instant::now();
            let mut session = || {
                let mut next = self.take();
                self.heading.fetch_sub(1, Ordering::AcqRel);
                if next.is_none() {
                    // The item this thread headed for is another's, or
                    // still there: let idle threads look again.
                    self.wake_idle();
                }
                while let Some((seq, msg)) = next {
                    let result = match msg {
                        Msg::Item(item) => {
                            let t = Instant::now();
                            if self.timeout.is_some() {
                                self.lock_outbox().running[me] =
                                    Some((seq, t, std::thread::current().id()));
                            }
                            let result = (self.f)(item);
                            self.ctx.stats.worked(t.elapsed());
                            Done::Call(result)
                        }
                        Msg::Fail(f) => Done::Upstream(f),
                    };
                    // A failure may stop the stage (the policy decides when
                    // it is sent on): no further call in this session before
                    // that is known, so nothing runs past a fatal failure.
                    let failed = matches!(result, Done::Call(Err(_)) | Done::Upstream(_));
                    // Into the outbox at once, not kept by this thread: its
                    // next call may wait (without the GIL) for other calls
                    // or for the consumer, and must not hold back what is
                    // done meanwhile. A call the watchdog failed (it ran past
                    // the timeout) has its failure there already.
                    {
                        let mut outbox = self.lock_outbox();
                        if self.timeout.is_some() && outbox.expired.remove(&seq) {
                            // The watchdog failed this call and started a
                            // thread in this one's place (slot `me` is the
                            // new thread's now): leave.
                            self.ctx.shared.abandon(std::thread::current().id(), false);
                            retired = true;
                            break;
                        }
                        if self.timeout.is_some() {
                            outbox.running[me] = None;
                        }
                        outbox.put(self.ordered, seq, result);
                    }
                    if failed || started.elapsed() >= BATCH_SLICE || self.stopping() {
                        break;
                    }
                    next = self.take();
                }
            };
            match &self.session {
                Some(s) => s(&mut session),
                None => session(),
            }
            if !self.emit() {
                return;
            }
        }
    }

    /// The next item for a thread in its session, if there is one it may
    /// take now. Never blocks: the thread may hold the GIL, which whoever
    /// holds the intake lock may be waiting for (a Python source).
    fn take(&self) -> Option<(u64, Msg<T, E>)> {
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
            intake.refill(None, room, &self.ctx.stats);
        }
        let numbered = intake.pending.pop_front()?;
        drop(intake);
        // Idle threads may start sessions for the others, or wait for this
        // one to be taken.
        self.wake_idle();
        Some(numbered)
    }

    /// Waits (never in a session) until there is an item for this thread to
    /// start a session for; `false` once the stage is over for it.
    fn wait_for_work(&self) -> bool {
        let mut t = Instant::now();
        loop {
            if self.stopping() {
                return false;
            }
            let mut intake = self.intake.lock().unwrap_or_else(PoisonError::into_inner);
            // Registered before looking, so that a change made after the
            // look bumps the signal (changes of `pending` wait for the lock).
            self.waiters.fetch_add(1, Ordering::SeqCst);
            std::sync::atomic::fence(Ordering::SeqCst);
            let seen = *self.lock_signal();
            // Start a session if there are more items than threads heading
            // for them: numbered ones, or, with room in the window, ones in
            // the channel. (With none heading, `recv` below tells, and
            // takes the item: `len` costs the channel's lock too.)
            let heading = self.heading.load(Ordering::Acquire);
            let pending = intake.pending.len();
            let room = self.room(&intake);
            if pending > heading || (room > 0 && heading > 0 && pending + intake.rx.len() > heading)
            {
                self.heading.fetch_add(1, Ordering::AcqRel);
                self.waiters.fetch_sub(1, Ordering::SeqCst);
                return true;
            }
            if intake.closed && pending == 0 {
                self.waiters.fetch_sub(1, Ordering::SeqCst);
                return false;
            }
            if pending == 0 && room > 0 && !intake.closed {
                // Wait for input, in `recv`: not a waiter on the signal.
                self.waiters.fetch_sub(1, Ordering::SeqCst);
                self.receiving.store(true, Ordering::Release);
                let received = intake.rx.recv_timeout(POLL);
                self.receiving.store(false, Ordering::Release);
                match received {
                    Ok(item) => {
                        // What came with it too, before the session.
                        let room = self.room(&intake);
                        intake.refill(Some((item, t.elapsed())), room, &self.ctx.stats);
                        self.heading.fetch_add(1, Ordering::AcqRel);
                        drop(intake);
                        self.wake_idle();
                        return true;
                    }
                    Err(flume::RecvTimeoutError::Timeout) => {
                        // Idle: send on what threads in long calls left.
                        drop(intake);
                        if !self.emit() {
                            return false;
                        }
                    }
                    Err(flume::RecvTimeoutError::Disconnected) => intake.closed = true,
                }
                continue;
            }
            // Numbered items that threads heading for them will take, or a
            // full window: send on what may go (threads in long calls may
            // have left results), then wait for a change.
            drop(intake);
            if room == 0 && !self.emit() {
                self.waiters.fetch_sub(1, Ordering::SeqCst);
                return false;
            }
            let mut signal = self.lock_signal();
            if *signal == seen {
                signal = self
                    .changed
                    .wait_timeout(signal, POLL)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            drop(signal);
            self.waiters.fetch_sub(1, Ordering::SeqCst);
            t = Instant::now();
        }
    }

    /// Lets go of the input channel once the stage is over, so that the
    /// stages upstream stop sending at once (rather than when the last of
    /// this stage's threads returns from a long call).
    fn close_input(&self) {
        let mut intake = self.intake.lock().unwrap_or_else(PoisonError::into_inner);
        intake.rx = flume::bounded(1).1; // a channel whose sender is gone
        intake.closed = true;
        intake.pending.clear();
    }

    /// Unless another thread is at it, sends on whatever results may go
    /// (looping while others leave more); called out of a session. `false`
    /// when the stage must stop.
    fn emit(&self) -> bool {
        let mut sending = Vec::new();
        let mut outbox = self.lock_outbox();
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
            outbox.take_ready(self.ordered, &mut sending);
            if sending.is_empty() {
                outbox.emitting = false;
                return true;
            }
            drop(outbox);
            // Uncontended: one thread emits at a time, and the watchdog takes
            // it only when nothing is left to send.
            let out_guard = self.out.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(out) = out_guard.as_ref() else {
                self.lock_outbox().emitting = false;
                return false;
            };
            let mut go_on = true;
            for result in sending.drain(..) {
                if !go_on {
                    continue; // dropped: the stage is stopping
                }
                let fatal = match result {
                    Done::Call(result) => {
                        match self.ctx.handle(&self.name, self.on_error, Ok(result)) {
                            Handled::Send(v) => {
                                go_on = out.emit_blocking(v);
                                None
                            }
                            Handled::Nothing => None,
                            Handled::Fatal(f) => Some(f),
                        }
                    }
                    Done::Upstream(f) => Some(f),
                };
                if let Some(f) = fatal {
                    // After everything before it, and nothing after it.
                    out.fail_blocking(f);
                    go_on = false;
                }
                // Room in the window for each item as it goes.
                self.done.fetch_add(1, Ordering::AcqRel);
            }
            drop(out_guard);
            self.wake_idle();
            if !go_on {
                self.dead.store(true, Ordering::Release);
                self.close_input();
            }
            outbox = self.lock_outbox();
            if !go_on {
                outbox.emitting = false;
                return false;
            }
        }
    }
}
