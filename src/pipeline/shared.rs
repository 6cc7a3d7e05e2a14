//! What a pipeline's running parts share: the messages on the channels, the
//! pipeline's shared state ([`Shared`]), a stage's context ([`StageCtx`]),
//! the emit path through fused stages ([`Emitter`]). Both the stage tasks
//! ([`super::engine`]) and the stages on threads of their own
//! ([`super::threads`]) use them, so that `threads` never names `engine`
//! (the engine starts thread stages with [`super::threads::spawn`]).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::error::{panic_message, Failure, FailureKind};
use super::stage::{ErrorPolicy, ItemFn, SkipHook, UnskippableFn};
use super::stats::StageStats;

/// Longest a thread stage runs items in one session before it sends the
/// results on.
pub(super) const BATCH_SLICE: Duration = Duration::from_millis(1);

/// Longest a thread blocked sending into a full channel goes without looking
/// at the stop flag: a stage downstream may be stuck in a call, and keep its
/// input channel open, for as long as the call lasts.
pub(super) const SEND_POLL: Duration = Duration::from_millis(10);

/// The outcome of one call of a stage function: `Err` holds a panic message.
pub(super) type Outcome<T, E> = Result<Result<Option<T>, E>, String>;

/// What travels on the channels between stages: items, and at most one
/// failure, after the items that precede it in output order.
pub(super) enum Msg<T, E> {
    /// An item.
    Item(T),
    /// A fatal failure upstream: nothing follows it.
    Fail(Failure<E>),
}

/// What became of one outcome of a stage function.
pub(super) enum Handled<T, E> {
    /// An item to send on.
    Send(T),
    /// Nothing to send (dropped, or skipped under the skip policy).
    Nothing,
    /// A fatal failure: send it on after what came before, and stop.
    Fatal(Failure<E>),
}

pub(super) struct Shared<E> {
    pub(super) failure: Mutex<Option<Failure<E>>>,
    pub(super) failed: AtomicBool,
    pub(super) stop: AtomicBool,
    pub(super) aborts: Mutex<Vec<tokio::task::AbortHandle>>,
    /// Threads stuck in a call that ran past its stage's timeout: stopping
    /// does not wait for them.
    pub(super) abandoned: Mutex<std::collections::HashSet<std::thread::ThreadId>>,
    /// One permit per blocking call the pipeline may run at once
    /// (`PipelineConfig::num_threads`), held until the call returns.
    pub(super) blocking: Arc<tokio::sync::Semaphore>,
    /// Errors that fail the pipeline whatever the stage's policy (see
    /// [`UnskippableFn`]).
    pub(super) unskippable: std::sync::OnceLock<UnskippableFn<E>>,
}

impl<E> Shared<E> {
    /// Whether the pipeline is stopping (stopped, failed or finished).
    pub(super) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Marks (or, with `false`, unmarks) a thread as stuck in a call that
    /// ran past its timeout.
    pub(super) fn abandon(&self, thread: std::thread::ThreadId, stuck: bool) {
        let mut set = self
            .abandoned
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if stuck {
            set.insert(thread);
        } else {
            set.remove(&thread);
        }
    }

    pub(super) fn is_abandoned(&self, thread: std::thread::ThreadId) -> bool {
        self.abandoned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&thread)
    }

    pub(super) fn fail(&self, stage: &str, kind: FailureKind<E>) {
        {
            let mut f = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
            if f.is_none() {
                *f = Some(Failure {
                    stage: stage.to_owned(),
                    kind,
                });
            }
        }
        self.failed.store(true, Ordering::Release);
        self.stop.store(true, Ordering::Release);
        self.abort_all();
    }

    pub(super) fn abort_all(&self) {
        for h in self
            .aborts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            h.abort();
        }
    }

    pub(super) fn take_failure(&self) -> Option<Failure<E>> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

/// A thread name the OS accepts (15 bytes on Linux).
pub(super) fn thread_name(stage: &str, i: usize) -> String {
    let prefix: String = format!("ff-{stage}").chars().take(11).collect();
    format!("{prefix}-{i}")
}

/// Records a failure if a stage thread unwinds out of its function (a
/// panic). Functions run on dedicated threads are not wrapped in
/// `catch_unwind`; a panic ends the thread. (The forced unwind with which
/// `CPython` ends a thread at exit never gets here: the bindings park such a
/// thread inside their call into Python, `src/py/hang.rs`.)
pub(super) struct UnwindGuard<'a, E> {
    pub(super) shared: &'a Shared<E>,
    pub(super) stage: &'a str,
}

impl<E> Drop for UnwindGuard<'_, E> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.shared.fail(
                self.stage,
                FailureKind::Panicked(format!("a thread of stage {:?} panicked", self.stage)),
            );
        }
    }
}

pub(super) struct StageCtx<E> {
    pub(super) shared: Arc<Shared<E>>,
    pub(super) stats: Arc<StageStats>,
    pub(super) hook: Option<SkipHook<E>>,
}

impl<E> StageCtx<E> {
    /// Applies the error policy to a failed item: `Some` when it is fatal.
    pub(super) fn on_error(&self, stage: &str, policy: ErrorPolicy, e: E) -> Option<Failure<E>> {
        let count = self.stats.failed();
        let kind = match policy {
            ErrorPolicy::Raise => FailureKind::Item(e),
            ErrorPolicy::Skip { .. } if self.shared.unskippable.get().is_some_and(|f| f(&e)) => {
                FailureKind::Item(e)
            }
            ErrorPolicy::Skip { max_failures } => {
                if let Some(hook) = &self.hook {
                    hook(stage, &e);
                }
                match max_failures {
                    Some(limit) if count > limit => FailureKind::TooManyFailures {
                        limit,
                        count,
                        last: e,
                    },
                    _ => return None,
                }
            }
        };
        Some(Failure {
            stage: stage.to_owned(),
            kind,
        })
    }

    /// What to do with one outcome of the stage's function.
    pub(super) fn handle<T>(
        &self,
        stage: &str,
        policy: ErrorPolicy,
        outcome: Outcome<T, E>,
    ) -> Handled<T, E> {
        match outcome {
            Ok(Ok(Some(v))) => Handled::Send(v),
            Ok(Ok(None)) => {
                self.stats.dropped();
                Handled::Nothing
            }
            Ok(Err(e)) => self
                .on_error(stage, policy, e)
                .map_or(Handled::Nothing, Handled::Fatal),
            Err(msg) => {
                self.stats.failed();
                Handled::Fatal(Failure {
                    stage: stage.to_owned(),
                    kind: FailureKind::Panicked(msg),
                })
            }
        }
    }
}

pub(super) fn timed<T, E>(
    stats: &StageStats,
    f: impl FnOnce() -> Result<Option<T>, E>,
) -> Outcome<T, E> {
    let t = Instant::now();
    let out = catch_unwind(AssertUnwindSafe(f)).map_err(|p| panic_message(&*p));
    stats.worked(t.elapsed());
    out
}

/// A fused stage: it runs inside its upstream stage's emit path.
pub(super) struct Link<T, E> {
    pub(super) name: String,
    pub(super) f: ItemFn<T, E>,
    pub(super) policy: ErrorPolicy,
    pub(super) ctx: StageCtx<E>,
}

/// The fused stages after a stage, applied to each item it emits, in order.
pub(super) struct Chain<T, E> {
    pub(super) links: Vec<Link<T, E>>,
}

/// What became of an item passed through a [`Chain`].
pub(super) enum Passed<T, E> {
    /// It came out: send it on.
    Out(T),
    /// A stage dropped or skipped it.
    Gone,
    /// A stage failed it fatally: send the failure on, and stop.
    Fatal(Failure<E>),
}

impl<T, E> Chain<T, E> {
    pub(super) fn pass(&self, mut item: T) -> Passed<T, E> {
        let last = self.links.len().saturating_sub(1);
        for (li, link) in self.links.iter().enumerate() {
            link.ctx.stats.received(Duration::ZERO);
            let outcome = timed(&link.ctx.stats, || (link.f)(item));
            match link.ctx.handle(&link.name, link.policy, outcome) {
                Handled::Send(v) => item = v,
                Handled::Nothing => return Passed::Gone,
                Handled::Fatal(f) => return Passed::Fatal(f),
            }
            if li < last {
                link.ctx.stats.sent(Duration::ZERO, 0);
            }
        }
        Passed::Out(item)
    }
}

/// Where a stage's results go: through its chain of fused stages, then into
/// its output channel.
pub(super) struct Emitter<T, E> {
    pub(super) chain: Chain<T, E>,
    pub(super) tx: flume::Sender<Msg<T, E>>,
    /// The emitting stage's counters.
    pub(super) own: Arc<StageStats>,
    /// For the stop flag: a blocking send gives up once the pipeline stops.
    pub(super) shared: Arc<Shared<E>>,
}

impl<T, E> Emitter<T, E> {
    /// Runs the chain: the item to send and the counters of the stage that
    /// sends it, or `Err` with what to do instead.
    fn through_chain(&self, item: T) -> Result<(T, &StageStats), Passed<T, E>> {
        let Some(last) = self.chain.links.last() else {
            return Ok((item, &self.own));
        };
        self.own.sent(Duration::ZERO, 0);
        match self.chain.pass(item) {
            Passed::Out(v) => Ok((v, &last.ctx.stats)),
            other => Err(other),
        }
    }

    /// Emits one result from a task; `false` when the stage must stop.
    pub(super) async fn emit(&self, item: T) -> bool {
        let (item, stats) = match self.through_chain(item) {
            Ok(x) => x,
            Err(Passed::Fatal(f)) => {
                self.fail(f).await;
                return false;
            }
            Err(_) => return true,
        };
        let t = Instant::now();
        if self.tx.send_async(Msg::Item(item)).await.is_err() {
            return false;
        }
        stats.sent(t.elapsed(), self.tx.len());
        true
    }

    /// Emits one result from a thread (sending blocks); `false` when the
    /// stage must stop.
    pub(super) fn emit_blocking(&self, item: T) -> bool {
        let (item, stats) = match self.through_chain(item) {
            Ok(x) => x,
            Err(Passed::Fatal(f)) => {
                self.fail_blocking(f);
                return false;
            }
            Err(_) => return true,
        };
        let t = Instant::now();
        if !self.send_blocking(Msg::Item(item)) {
            return false;
        }
        stats.sent(t.elapsed(), self.tx.len());
        true
    }

    /// Sends `msg`, waiting for room; `false` when nobody receives any more
    /// or the pipeline stops meanwhile. (A plain blocking send would wait
    /// for as long as a stuck call downstream keeps the channel open.)
    fn send_blocking(&self, mut msg: Msg<T, E>) -> bool {
        loop {
            match self.tx.send_timeout(msg, SEND_POLL) {
                Ok(()) => return true,
                Err(flume::SendTimeoutError::Disconnected(_)) => return false,
                Err(flume::SendTimeoutError::Timeout(back)) => {
                    if self.shared.stopping() {
                        return false;
                    }
                    msg = back;
                }
            }
        }
    }

    /// Sends an item on if that takes no waiting and no work (no fused
    /// stages after it); else hands it back.
    pub(super) fn try_emit(&self, item: T) -> Result<(), T> {
        if !self.chain.links.is_empty() {
            return Err(item);
        }
        match self.tx.try_send(Msg::Item(item)) {
            Ok(()) => {
                self.own.sent(Duration::ZERO, self.tx.len());
                Ok(())
            }
            Err(
                flume::TrySendError::Full(Msg::Item(item))
                | flume::TrySendError::Disconnected(Msg::Item(item)),
            ) => Err(item),
            Err(_) => unreachable!("only items are offered"),
        }
    }

    /// Sends a fatal failure on, after what was sent before it. Nobody may
    /// be left to receive it (the consumer stopped, or a stage downstream
    /// failed first, on an earlier item): then it is dropped.
    pub(super) async fn fail(&self, failure: Failure<E>) {
        let _ = self.tx.send_async(Msg::Fail(failure)).await;
    }

    /// [`Emitter::fail`] from a thread.
    pub(super) fn fail_blocking(&self, failure: Failure<E>) {
        let _ = self.send_blocking(Msg::Fail(failure));
    }
}
