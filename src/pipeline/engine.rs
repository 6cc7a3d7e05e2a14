//! Running a pipeline: its life from `new` to `stop` (the channels, the
//! stage tasks and threads started, the sink read, everything joined).
//!
//! The stage tasks' bodies are in `tasks`, the source's thread in `source`,
//! the stats reporter and the stall watch in `watch`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::error::{Failure, FailureKind, PipelineError};
use super::shared::{Chain, Emitter, Link, Msg, Shared, StageCtx};
use super::source::spawn_source;
use super::stage::{BoxFuture, MapStage, SkipHook, Source, Stage, UnskippableFn, Work};
use super::stats::{StageStats, StatsSnapshot};
use super::tasks::{run_accumulate, run_aggregate, run_disaggregate, run_map, TaskWork};
use super::watch::{spawn_reporter, spawn_stall_watch, StallWatch, StatsReporter};

/// Smallest capacity of a channel between stages (in items): enough for
/// batches to form, so that a busy pipeline wakes each stage once per batch
/// rather than once per item.
const MIN_CAPACITY: usize = 16;

/// How long stopping waits, in all, for the stage tasks and for threads still
/// inside a call of user code (a stage function, the source's `next`, a
/// native op on the runtime's blocking pool) to return, before it leaves
/// such calls to finish on their own (their results are thrown away, their
/// threads end when they return). Threads outside
/// user code notice the stop within 10 ms (`SEND_POLL`, or their own poll)
/// and are always joined.
/// Short enough that Ctrl-C raises within half a second (issue 12), long
/// enough that a call of a few hundred milliseconds usually ends first.
pub const STOP_GRACE: Duration = Duration::from_millis(250);

/// Settings of a pipeline.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// Most of the pipeline's blocking calls ([`Work::Blocking`], native ops
    /// on the runtime's blocking pool) that run at once, over all its stages
    /// (at least 1). The stage tasks themselves run on the process's one
    /// runtime ([`crate::runtime`]), whose workers every pipeline (and every
    /// remote source's fetches) shares.
    pub num_threads: usize,
    /// Finished items buffered for the consumer (at least 1).
    pub sink_buffer: usize,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            num_threads: crate::runtime::workers(),
            sink_buffer: 3,
        }
    }
}

/// What [`Pipeline::next_timeout`] returns.
#[derive(Debug)]
pub enum Next<T, E> {
    /// The next item.
    Item(T),
    /// Nothing arrived within the timeout; ask again.
    Timeout,
    /// Every item was delivered (or the pipeline was stopped).
    Finished,
    /// The pipeline failed; it is stopped, and later calls return `Finished`.
    Failed(Failure<E>),
}

struct Plan<T, E> {
    source: Box<dyn Source<T, E>>,
    stages: Vec<Stage<T, E>>,
    hook: Option<SkipHook<E>>,
    reporter: Option<StatsReporter>,
    stall: Option<StallWatch>,
}

struct Running {
    /// The stage tasks (and the stats reporter) on the process's runtime.
    tasks: Vec<tokio::task::JoinHandle<()>>,
    threads: Vec<JoinHandle<()>>,
    /// The stall watch's thread: it parks between looks, and is woken to
    /// leave at once when the pipeline stops.
    watch: Option<JoinHandle<()>>,
}

/// A pipeline: a source, stages linked by bounded channels, and a sink the
/// consumer takes finished items from.
///
/// Built stopped; [`Pipeline::start`] (or the first
/// [`Pipeline::next_timeout`]) starts it. Its stage tasks run on the
/// process's one async runtime ([`crate::runtime`], shared by every
/// pipeline and kept between them); its source, thread stages and stall
/// watch on threads of its own. [`Pipeline::stop`], dropping it, a failure
/// or the end of the items ends its tasks and joins its threads. A pipeline
/// is one pass over its source: build another for the next epoch.
///
/// # Back-pressure
///
/// Every channel is bounded, so a slow consumer fills the sink, then each
/// stage's output channel in turn, and finally blocks the source: memory is
/// bounded by the channel capacities and concurrencies, however long the
/// source.
///
/// # Fork
///
/// A pipeline must be used in the process that built it. In a forked child
/// its tasks and threads do not exist: dropping it there forgets them
/// rather than joining them.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use ferrofeed::pipeline::*;
///
/// let double: ItemFn<u64, String> = Arc::new(|x| Ok(Some(x * 2)));
/// let stages = vec![Stage::Map(MapStage {
///     name: "double".into(),
///     work: Work::Inline(double),
///     concurrency: 1,
///     ordered: true,
///     on_error: ErrorPolicy::Raise,
///     timeout: None,
/// })];
/// let source = IterSource((0..5u64).map(Ok));
/// let mut p = Pipeline::new(source, stages, PipelineConfig::default(), None)?;
/// let mut out = Vec::new();
/// loop {
///     match p.next_timeout(std::time::Duration::from_secs(1)) {
///         Next::Item(x) => out.push(x),
///         Next::Finished => break,
///         Next::Timeout => continue,
///         Next::Failed(f) => panic!("{f:?}"),
///     }
/// }
/// assert_eq!(out, vec![0, 2, 4, 6, 8]);
/// # Ok::<(), ferrofeed::pipeline::PipelineError>(())
/// ```
pub struct Pipeline<T: Send + 'static, E: Send + 'static> {
    config: PipelineConfig,
    plan: Option<Plan<T, E>>,
    running: Option<Running>,
    sink: Option<flume::Receiver<Msg<T, E>>>,
    /// A failure taken from the sink by [`Pipeline::try_next`], for the next
    /// [`Pipeline::next_timeout`].
    stashed: Option<Failure<E>>,
    /// Finished items the consumer had not taken when the pipeline was
    /// stopped: still handed out, then [`Next::Finished`].
    leftovers: std::collections::VecDeque<T>,
    shared: Arc<Shared<E>>,
    /// source, stages..., sink
    stats: Vec<Arc<StageStats>>,
    capacities: Vec<usize>,
    creator_pid: u32,
    /// See [`Pipeline::take_left_running`].
    left_running: Vec<String>,
}

impl<T: Send + 'static, E: Send + 'static> Pipeline<T, E> {
    /// Assembles a pipeline (not started).
    ///
    /// # Errors
    ///
    /// [`PipelineError::Invalid`] for a stage with zero concurrency or an
    /// aggregate of size zero, or a zero `num_threads` or `sink_buffer`.
    pub fn new(
        source: impl Source<T, E>,
        stages: Vec<Stage<T, E>>,
        config: PipelineConfig,
        on_skip: Option<SkipHook<E>>,
    ) -> Result<Self, PipelineError> {
        if config.num_threads == 0 || config.sink_buffer == 0 {
            return Err(PipelineError::Invalid(
                "num_threads and the sink's buffer size must be at least 1".into(),
            ));
        }
        for s in &stages {
            match s {
                Stage::Map(m) if m.concurrency == 0 => {
                    return Err(PipelineError::Invalid(format!(
                        "stage {:?}: concurrency must be at least 1",
                        m.name
                    )))
                }
                Stage::Aggregate(a) if a.size == 0 => {
                    return Err(PipelineError::Invalid(format!(
                        "stage {:?}: the group size must be at least 1",
                        a.name
                    )))
                }
                _ => {}
            }
        }
        // feed[i] is the capacity of the channel that feeds stage i (feed[n]
        // feeds the sink): room for what the stage works on at once, twice,
        // so that producer and consumer overlap and batches form; groups
        // (after an aggregate) are large, so two of them suffice. A fusable
        // stage has no channel in front (0): it runs inside its upstream
        // stage's emit path (see `Chain`).
        let permits = config.num_threads;
        let n = stages.len();
        let mut feed = vec![0usize; n + 1];
        for (j, s) in stages.iter().enumerate() {
            if !is_fusable(s) {
                let after_group = j > 0 && matches!(stages[j - 1], Stage::Aggregate(_));
                feed[j] = if after_group {
                    2
                } else {
                    (2 * s.concurrency()).max(MIN_CAPACITY)
                };
            }
        }
        feed[n] = config.sink_buffer;
        // What each producer (source = 0, stage i = i + 1) writes into: the
        // next channel if the next stage has one, else 0 (it hands items to
        // a fused stage directly).
        let out_cap = |next: usize| feed[next];
        let mut stats = vec![Arc::new(StageStats::new("source", 1, out_cap(0)))];
        for (i, s) in stages.iter().enumerate() {
            stats.push(Arc::new(StageStats::new(
                s.name(),
                s.concurrency(),
                out_cap(i + 1),
            )));
        }
        stats.push(Arc::new(StageStats::new("sink", 1, 0)));
        let capacities = feed;
        Ok(Self {
            config,
            plan: Some(Plan {
                source: Box::new(source),
                stages,
                hook: on_skip,
                reporter: None,
                stall: None,
            }),
            running: None,
            sink: None,
            stashed: None,
            leftovers: std::collections::VecDeque::new(),
            shared: Arc::new(Shared {
                failure: Mutex::new(None),
                failed: AtomicBool::new(false),
                stop: AtomicBool::new(false),
                aborts: Mutex::new(Vec::new()),
                abandoned: Mutex::new(std::collections::HashSet::new()),
                blocking: Arc::new(tokio::sync::Semaphore::new(permits)),
                unskippable: std::sync::OnceLock::new(),
            }),
            stats,
            capacities,
            creator_pid: std::process::id(),
            left_running: Vec::new(),
        })
    }

    /// Reports stats periodically while the pipeline runs (set before start).
    pub fn set_reporter(&mut self, reporter: StatsReporter) {
        if let Some(plan) = &mut self.plan {
            plan.reporter = Some(reporter);
        }
    }

    /// Watches for stalls while the pipeline runs (set before start).
    pub fn set_stall_watch(&mut self, watch: StallWatch) {
        if let Some(plan) = &mut self.plan {
            plan.stall = Some(watch);
        }
    }

    /// Errors that fail the pipeline even under
    /// [`ErrorPolicy::Skip`](super::ErrorPolicy::Skip) (set
    /// before start; the first setting holds): a programming error, such as a
    /// stage function called with the wrong arguments, is not a bad item.
    pub fn set_unskippable(&mut self, unskippable: UnskippableFn<E>) {
        let _ = self.shared.unskippable.set(unskippable);
    }

    /// Whether the pipeline was started (and possibly already finished).
    pub fn is_started(&self) -> bool {
        self.plan.is_none()
    }

    /// Whether every item was delivered, or the pipeline stopped or failed.
    pub fn is_finished(&self) -> bool {
        self.plan.is_none() && self.sink.is_none()
    }

    /// Whether this process built the pipeline (false in a forked child).
    pub fn is_in_creator_process(&self) -> bool {
        std::process::id() == self.creator_pid
    }

    /// Starts the source thread and the stages (making the process's
    /// runtime first, if no pipeline has yet). Does nothing if already
    /// started.
    ///
    /// # Errors
    ///
    /// [`PipelineError::Start`] if the runtime or a thread cannot be started.
    pub fn start(&mut self) -> Result<(), PipelineError> {
        let Some(plan) = self.plan.take() else {
            return Ok(());
        };
        let runtime = crate::runtime::current().map_err(PipelineError::Start)?;
        let mut threads = Vec::new();
        let mut tasks = Vec::new();
        let maps: Vec<bool> = plan
            .stages
            .iter()
            .map(|s| matches!(s, Stage::Map(_)))
            .collect();
        let mut stages = plan.stages.into_iter().enumerate().peekable();
        let hook = plan.hook;
        // Takes the fusable stages that follow, as the chain of their
        // upstream producer; returns it and the index of the channel after it.
        let (chain, next) = take_chain(&mut stages, 0, &self.shared, &self.stats, hook.as_ref());
        let (tx, mut rx) = flume::bounded::<Msg<T, E>>(self.capacities[next]);
        let emitter = Emitter {
            chain,
            tx,
            own: Arc::clone(&self.stats[0]),
            shared: Arc::clone(&self.shared),
        };
        threads.push(spawn_source(
            plan.source,
            emitter,
            Arc::clone(&self.shared),
        )?);
        while let Some((i, stage)) = stages.next() {
            let ctx = StageCtx {
                shared: Arc::clone(&self.shared),
                stats: Arc::clone(&self.stats[i + 1]),
                hook: hook.clone(),
            };
            let (chain, next) =
                take_chain(&mut stages, i + 1, &self.shared, &self.stats, hook.as_ref());
            let (tx, next_rx) = flume::bounded::<Msg<T, E>>(self.capacities[next]);
            let out = Emitter {
                chain,
                tx,
                own: Arc::clone(&ctx.stats),
                shared: Arc::clone(&self.shared),
            };
            let task: BoxFuture<()> = match stage {
                Stage::Map(m) => {
                    let work = match &m.work {
                        Work::Dedicated(f, session) => {
                            // The stage's threads take items from `rx`
                            // themselves: no task in between.
                            let (f, session) = (Arc::clone(f), session.clone());
                            super::threads::spawn(m, f, session, rx, out, ctx, &mut threads)?;
                            rx = next_rx;
                            continue;
                        }
                        Work::Inline(f) => TaskWork::Inline(Arc::clone(f)),
                        Work::Blocking(f) => TaskWork::Blocking(Arc::clone(f)),
                        Work::Async(f) => TaskWork::Async(Arc::clone(f)),
                    };
                    Box::pin(run_map(m, work, rx, out, ctx))
                }
                Stage::Aggregate(a) => Box::pin(run_aggregate(a, rx, out, ctx)),
                Stage::Disaggregate(d) => Box::pin(run_disaggregate(d, rx, out, ctx)),
                Stage::Accumulate(a) => Box::pin(run_accumulate(a, rx, out, ctx)),
            };
            tasks.push(runtime.spawn(task));
            rx = next_rx;
        }
        if let Some(rep) = plan.reporter {
            tasks.push(spawn_reporter(&runtime, self.stats.clone(), rep));
        }
        *self
            .shared
            .aborts
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = tasks
            .iter()
            .map(tokio::task::JoinHandle::abort_handle)
            .collect();
        let watch = match plan.stall {
            Some(w) => Some(spawn_stall_watch(
                Arc::clone(&self.shared),
                self.stats.clone(),
                maps,
                self.config.sink_buffer,
                w,
            )?),
            None => None,
        };
        self.sink = Some(rx);
        self.running = Some(Running {
            tasks,
            threads,
            watch,
        });
        Ok(())
    }

    /// Waits up to `timeout` for the next finished item, starting the
    /// pipeline first if needed.
    ///
    /// When a stage (or the source) fails, the items that precede the
    /// failing one in output order come first, then [`Next::Failed`]. Once
    /// it returns [`Next::Finished`] or [`Next::Failed`], the pipeline is
    /// stopped and its threads joined. After [`Pipeline::stop`], it hands
    /// out the finished items the consumer had not taken, then
    /// [`Next::Finished`].
    pub fn next_timeout(&mut self, timeout: Duration) -> Next<T, E> {
        if self.plan.is_some() {
            if let Err(e) = self.start() {
                // Surfaced as a panic-free failure of the "start" stage.
                return Next::Failed(Failure {
                    stage: "start".into(),
                    kind: FailureKind::Panicked(e.to_string()),
                });
            }
        }
        if let Some(item) = self.leftovers.pop_front() {
            return Next::Item(item);
        }
        if let Some(f) = self.stashed.take() {
            self.halt();
            return Next::Failed(f);
        }
        let Some(rx) = &self.sink else {
            return Next::Finished;
        };
        let t = Instant::now();
        let received = if self.shared.failed.load(Ordering::Acquire) {
            // A thread failed the pipeline abruptly (a panic): what reached
            // the sink still goes out, then the failure, without waiting.
            rx.try_recv()
                .map_err(|_| flume::RecvTimeoutError::Disconnected)
        } else {
            rx.recv_timeout(timeout)
        };
        match received {
            Ok(Msg::Item(item)) => {
                self.stats[self.stats.len() - 1].received(t.elapsed());
                Next::Item(item)
            }
            Ok(Msg::Fail(f)) => {
                self.halt();
                Next::Failed(f)
            }
            Err(flume::RecvTimeoutError::Timeout) => Next::Timeout,
            Err(flume::RecvTimeoutError::Disconnected) => {
                let failure = self.shared.take_failure();
                self.halt();
                failure.map_or(Next::Finished, Next::Failed)
            }
        }
    }

    /// The next item if one is ready now, without waiting; `None` when the
    /// consumer should wait with [`Pipeline::next_timeout`] (which also
    /// reports a failure found here).
    pub fn try_next(&mut self) -> Option<T> {
        if let Some(item) = self.leftovers.pop_front() {
            return Some(item);
        }
        if self.stashed.is_some() || self.shared.failed.load(Ordering::Acquire) {
            return None;
        }
        match self.sink.as_ref()?.try_recv().ok()? {
            Msg::Item(item) => {
                self.stats[self.stats.len() - 1].received(Duration::ZERO);
                Some(item)
            }
            Msg::Fail(f) => {
                self.stashed = Some(f);
                None
            }
        }
    }

    /// Whether finished items are still to be handed out after a stop.
    pub fn has_leftovers(&self) -> bool {
        !self.leftovers.is_empty()
    }

    /// Stops every stage and joins every thread, except those still inside
    /// a call of user code after [`STOP_GRACE`]: they are left to finish on
    /// their own (see [`Pipeline::take_left_running`]), so `stop` returns within
    /// about `STOP_GRACE`. The finished items the consumer has not taken yet (those in the sink) stay readable through
    /// [`Pipeline::next_timeout`] and [`Pipeline::try_next`]; a failure
    /// among them is dropped (the consumer asked to stop). Idempotent.
    ///
    /// In a forked child (see [`Pipeline::is_in_creator_process`]) it
    /// touches nothing the parent's threads shared: the channels and the
    /// task handles are forgotten, not dropped, since a
    /// lock among them may have been held by a thread that does not exist
    /// in the child.
    pub fn stop(&mut self) {
        if self.is_in_creator_process() {
            if let Some(rx) = &self.sink {
                for msg in rx.try_iter() {
                    if let Msg::Item(item) = msg {
                        self.leftovers.push_back(item);
                    }
                }
            }
        }
        self.halt();
    }

    /// Stops every stage and joins every thread (but those left inside user
    /// code, as for [`Pipeline::stop`]); what the sink holds is dropped.
    fn halt(&mut self) {
        self.plan = None;
        if !self.is_in_creator_process() {
            // Forked child: the threads, the tasks and the channels are
            // the parent's. Dropping the sink would lock the channel, aborting
            // a task would lock the runtime's scheduler, and either lock may
            // have been held at the fork by a thread that is gone: forget
            // them. (`Shared` outlives this pipeline: the tasks and threads
            // that hold it never end in the child.)
            self.shared.stop.store(true, Ordering::Release);
            std::mem::forget(self.sink.take());
            std::mem::forget(self.running.take());
            self.stashed = None;
            return;
        }
        self.shared.stop.store(true, Ordering::Release);
        self.shared.abort_all();
        self.sink = None;
        let Some(running) = self.running.take() else {
            return;
        };
        // One grace period for everything: stopping takes at most about
        // STOP_GRACE, however many threads are stuck in user code.
        let deadline = Instant::now() + STOP_GRACE;
        if let Some(w) = running.watch {
            w.thread().unpark();
            let _ = w.join();
        }
        // Aborted tasks end at their next await point; a task inside inline
        // work ends when the work returns. Blocking calls (each holds one of
        // the pipeline's permits until it returns) cannot be interrupted:
        // those still running at the deadline finish on their own on the
        // runtime's blocking pool, their results thrown away, as the
        // pipeline's threads stuck in user code do. On a thread of the
        // runtime itself (a pipeline dropped by one of its tasks) nothing is
        // waited for: the wait could be for the very task doing it.
        if tokio::runtime::Handle::try_current().is_err() {
            let permits = self.config.num_threads;
            while Instant::now() < deadline
                && (running.tasks.iter().any(|t| !t.is_finished())
                    || self.shared.blocking.available_permits() < permits)
            {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        drop(running.tasks);
        self.left_running.clear();
        for t in running.threads {
            // A thread stuck in a call that ran past its timeout is not
            // waited for: it returns when the call does.
            while !t.is_finished()
                && Instant::now() < deadline
                && !self.shared.is_abandoned(t.thread().id())
            {
                std::thread::sleep(Duration::from_millis(1));
            }
            if t.is_finished() {
                let _ = t.join();
            } else {
                // Still inside user code (every other wait looks at the stop
                // flag within SEND_POLL): it is left to finish on its own,
                // its result thrown away; it ends when the call returns.
                self.left_running
                    .push(t.thread().name().unwrap_or("?").to_owned());
            }
        }
    }

    /// Takes the names of the threads that stopping left behind, still
    /// inside a call of user code that did not return within [`STOP_GRACE`]
    /// (or that ran past its stage's timeout). Each ends when its call
    /// returns; its result is thrown away. Empty when every thread was
    /// joined (or when they were taken already).
    pub fn take_left_running(&mut self) -> Vec<String> {
        std::mem::take(&mut self.left_running)
    }

    /// Snapshots of every stage's counters: the source, the stages, the sink.
    pub fn stats(&self) -> Vec<StatsSnapshot> {
        self.stats.iter().map(|s| s.snapshot()).collect()
    }
}

impl<T: Send + 'static, E: Send + 'static> Drop for Pipeline<T, E> {
    fn drop(&mut self) {
        self.halt();
    }
}

type StageIter<T, E> = std::iter::Peekable<std::iter::Enumerate<std::vec::IntoIter<Stage<T, E>>>>;

/// Takes the fusable stages that come next, as the chain of their upstream
/// producer (which writes to position `after`); returns the chain and the
/// position of the channel after it.
fn take_chain<T, E>(
    stages: &mut StageIter<T, E>,
    after: usize,
    shared: &Arc<Shared<E>>,
    stats: &[Arc<StageStats>],
    hook: Option<&SkipHook<E>>,
) -> (Chain<T, E>, usize) {
    let mut links = Vec::new();
    let mut next = after;
    while let Some((j, stage)) = stages.next_if(|(_, s)| is_fusable(s)) {
        if let Stage::Map(MapStage {
            name,
            work: Work::Inline(f),
            on_error,
            ..
        }) = stage
        {
            links.push(Link {
                name,
                f,
                policy: on_error,
                ctx: StageCtx {
                    shared: Arc::clone(shared),
                    stats: Arc::clone(&stats[j + 1]),
                    hook: hook.cloned(),
                },
            });
        }
        next = j + 1;
    }
    (Chain { links }, next)
}

/// Whether a stage is fused into its upstream stage's emit path (see
/// [`Chain`]): cheap native work ([`Work::Inline`]) on one item at a time.
fn is_fusable<T, E>(stage: &Stage<T, E>) -> bool {
    matches!(stage, Stage::Map(m) if m.concurrency == 1
        && m.timeout.is_none()
        && matches!(m.work, Work::Inline(_)))
}
