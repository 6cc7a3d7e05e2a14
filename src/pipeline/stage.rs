//! What a pipeline is made of: a source, stages and their policies.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// A boxed, sendable future.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// A synchronous stage function: `Ok(None)` drops the item.
pub type ItemFn<T, E> = Arc<dyn Fn(T) -> Result<Option<T>, E> + Send + Sync>;

/// Runs its argument once, inside whatever context several consecutive calls
/// of a stage function should share (for Python stages: one GIL
/// acquisition). The argument must be called exactly once.
pub type SessionFn = Arc<dyn Fn(&mut dyn FnMut()) + Send + Sync>;

/// An asynchronous stage function.
pub type AsyncItemFn<T, E> = Arc<dyn Fn(T) -> BoxFuture<Result<Option<T>, E>> + Send + Sync>;

/// Where a stage's function runs.
pub enum Work<T, E> {
    /// In the stage's own task, item after item: for cheap native work,
    /// where a hop to another thread would cost more than the work.
    Inline(ItemFn<T, E>),
    /// On the runtime's blocking pool: CPU-heavy or blocking native work
    /// that never takes the GIL.
    Blocking(ItemFn<T, E>),
    /// On `concurrency` OS threads owned by the stage: functions that take
    /// the GIL (Python callables) run there, never on the runtime's workers,
    /// so a slow Python call never stalls other stages. Each thread runs the
    /// items it takes in a row inside one `session` (e.g. one GIL acquisition
    /// for several calls), taking them one at a time so that while a call
    /// waits without the GIL, a sibling thread takes the next item.
    Dedicated(ItemFn<T, E>, Option<SessionFn>),
    /// A function returning a future, awaited on the runtime (async
    /// callables bridged to an event loop, async I/O).
    Async(AsyncItemFn<T, E>),
}

impl<T, E> Clone for Work<T, E> {
    fn clone(&self) -> Self {
        match self {
            Self::Inline(f) => Self::Inline(Arc::clone(f)),
            Self::Blocking(f) => Self::Blocking(Arc::clone(f)),
            Self::Dedicated(f, s) => Self::Dedicated(Arc::clone(f), s.clone()),
            Self::Async(f) => Self::Async(Arc::clone(f)),
        }
    }
}

/// What a stage does when its function fails on an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorPolicy {
    /// Stop the pipeline; the consumer gets the error.
    Raise,
    /// Drop the item, count it, tell the skip hook; past `max_failures`
    /// failures (if set), stop the pipeline as `Raise` would.
    Skip {
        /// Failures tolerated; one more is fatal.
        max_failures: Option<u64>,
    },
}

/// Makes the error of a call that ran past its stage's timeout, from the
/// stage's name and the limit.
pub type TimeoutErrorFn<E> = Arc<dyn Fn(&str, Duration) -> E + Send + Sync>;

/// How long one call of a stage's function may run.
///
/// A call that runs longer fails with `error(stage, limit)`, under the
/// stage's [`ErrorPolicy`], as soon as the limit passes, and the items after
/// it go on. What happens to the call itself depends on the [`Work`]:
/// async work is dropped (cancelled at its next await point); a call on the
/// blocking pool or on a stage thread cannot be interrupted, so it runs on
/// and its result is thrown away (the thread is busy meanwhile: a stage
/// whose every thread is stuck in a call stalls); inline work is checked
/// when the call returns.
pub struct StageTimeout<E> {
    /// The longest a call may run.
    pub limit: Duration,
    /// The error of a call that ran longer.
    pub error: TimeoutErrorFn<E>,
}

impl<E> Clone for StageTimeout<E> {
    fn clone(&self) -> Self {
        Self {
            limit: self.limit,
            error: Arc::clone(&self.error),
        }
    }
}

/// A stage that maps each item to zero or one item.
pub struct MapStage<T, E> {
    /// Name shown in stats and errors.
    pub name: String,
    /// The function and where it runs.
    pub work: Work<T, E>,
    /// Items in flight at once (at least 1).
    pub concurrency: usize,
    /// Whether output order equals input order.
    pub ordered: bool,
    /// What to do with a failing item.
    pub on_error: ErrorPolicy,
    /// How long one call may run (none: no limit).
    pub timeout: Option<StageTimeout<E>>,
}

/// Turns a group of items into one (a list, a batch).
pub type CombineFn<T, E> = Arc<dyn Fn(Vec<T>) -> Result<T, E> + Send + Sync>;

/// A stage that groups consecutive items.
pub struct AggregateStage<T, E> {
    /// Name shown in stats and errors.
    pub name: String,
    /// Items per group (at least 1).
    pub size: usize,
    /// Whether a last, smaller group is dropped rather than emitted.
    pub drop_last: bool,
    /// Builds the group's item; runs inline in the stage's task.
    pub combine: CombineFn<T, E>,
}

/// Splits an item into the items it holds, in order.
pub type SplitFn<T, E> = Arc<dyn Fn(T) -> Result<Vec<T>, E> + Send + Sync>;

/// A stage that sends on, one by one, the items each item holds (the
/// inverse of an aggregate; a flat map after a map).
pub struct DisaggregateStage<T, E> {
    /// Name shown in stats and errors.
    pub name: String,
    /// Splits an item; runs inline in the stage's task. An error is fatal.
    pub split: SplitFn<T, E>,
}

/// Ends a custom aggregation: the last result, if there is one.
pub type FlushFn<T, E> = Arc<dyn Fn() -> Result<Option<T>, E> + Send + Sync>;

/// A custom aggregation: a stateful function fed every item in order,
/// which emits a result whenever it has one (SPDL's `Aggregator`).
pub struct AccumulateStage<T, E> {
    /// Name shown in stats and errors.
    pub name: String,
    /// Takes the next item; `Some` is a result to send on, `None` means
    /// "nothing yet". Runs on the stage's task, one item at a time (inside
    /// `block_in_place`, so it may block, or wait for a lock such as the GIL,
    /// without holding up other tasks). An error is fatal.
    pub accumulate: ItemFn<T, E>,
    /// Called once at the end of the input (never after a failure), for
    /// what is still held; `None` drops it.
    pub flush: Option<FlushFn<T, E>>,
}

/// One step of a pipeline.
pub enum Stage<T, E> {
    /// Map each item.
    Map(MapStage<T, E>),
    /// Group items.
    Aggregate(AggregateStage<T, E>),
    /// Split items.
    Disaggregate(DisaggregateStage<T, E>),
    /// Aggregate items with a stateful function.
    Accumulate(AccumulateStage<T, E>),
}

impl<T, E> Stage<T, E> {
    /// The stage's name.
    pub fn name(&self) -> &str {
        match self {
            Self::Map(m) => &m.name,
            Self::Aggregate(a) => &a.name,
            Self::Disaggregate(d) => &d.name,
            Self::Accumulate(a) => &a.name,
        }
    }

    pub(crate) fn concurrency(&self) -> usize {
        match self {
            Self::Map(m) => m.concurrency,
            Self::Aggregate(_) | Self::Disaggregate(_) | Self::Accumulate(_) => 1,
        }
    }
}

/// Produces the pipeline's items, pulled on a thread of its own.
pub trait Source<T, E>: Send + 'static {
    /// Appends up to `max` (at least 1) items to `out`; returns `Ok(false)`
    /// once the source is exhausted (possibly after appending the last
    /// items), `Ok(true)` while more may come. Taking several items per call
    /// lets a source amortise a lock (such as the GIL) over them.
    ///
    /// # Errors
    ///
    /// The source's own error; it stops the pipeline.
    fn next_batch(&mut self, max: usize, out: &mut Vec<T>) -> Result<bool, E>;

    /// [`Source::next_batch`], for a source that may take long between
    /// items (one that waits on a stream or a queue): each item may be
    /// offered to `offer` as soon as it is pulled, which sends it on at once
    /// if it can without waiting and else hands it back (`Some`), to go into
    /// `out` like every item after it (order is kept). So an item already
    /// pulled never waits for the next one. The default pulls a batch.
    ///
    /// # Errors
    ///
    /// The source's own error; it stops the pipeline after the items pulled
    /// before it.
    fn next_batch_offering(
        &mut self,
        max: usize,
        out: &mut Vec<T>,
        offer: &mut dyn FnMut(T) -> Option<T>,
    ) -> Result<bool, E> {
        let _ = offer;
        self.next_batch(max, out)
    }
}

/// A [`Source`] over any iterator of results.
pub struct IterSource<I>(pub I);

impl<T, E, I> Source<T, E> for IterSource<I>
where
    I: Iterator<Item = Result<T, E>> + Send + 'static,
{
    fn next_batch(&mut self, max: usize, out: &mut Vec<T>) -> Result<bool, E> {
        for _ in 0..max {
            match self.0.next() {
                Some(item) => out.push(item?),
                None => return Ok(false),
            }
        }
        Ok(true)
    }
}

/// Called with the stage name and the error of each item a stage skips.
pub type SkipHook<E> = Arc<dyn Fn(&str, &E) + Send + Sync>;

/// Tells an error that no skip policy may skip: a programming error (a stage
/// function called with the wrong arguments), not a bad item. Such an error
/// fails the pipeline under [`ErrorPolicy::Skip`] as under
/// [`ErrorPolicy::Raise`].
pub type UnskippableFn<E> = Arc<dyn Fn(&E) -> bool + Send + Sync>;
