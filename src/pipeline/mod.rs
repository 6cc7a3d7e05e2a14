//! The pipeline engine: a source, stages linked by bounded channels, a sink.
//!
//! A [`Pipeline`] pulls items from a [`Source`] on a thread of its own and
//! passes them through [`Stage`]s, each a task on the process's one tokio
//! runtime ([`crate::runtime`], shared by every pipeline), linked by bounded
//! `flume` channels; the consumer takes finished
//! items from the sink with [`Pipeline::next_timeout`].
//!
//! # Where work runs
//!
//! A map stage's [`Work`] says where its function runs: inline in the
//! stage's task (cheap native work), on the runtime's blocking pool
//! (CPU-heavy native work; at most `num_threads` calls of one pipeline at
//! once), on OS threads the stage owns (functions that
//! take the GIL: a slow Python call never stalls a runtime worker), or as a
//! future (async callables). Up to `concurrency` items are in flight per
//! stage; with `ordered` the stage emits them in input order (like
//! `buffered`), else as they complete (like `buffer_unordered`).
//!
//! # Thread stages
//!
//! A [`Work::Dedicated`] stage of concurrency `k` runs on `k` threads of
//! its own that take items from the stage's input channel themselves (no
//! task, job channel or per-item reply in between): items leave the channel
//! in bulk, numbered in input order, into a queue the threads share. A
//! thread with work enters one session (for a Python stage, one GIL
//! acquisition) and takes items from that queue one at a time, calling the
//! function on each, until none is left, 1 ms has passed, or the stage
//! holds its window of items (`max(2k, 32)`, taken and not yet sent on);
//! then it leaves the session and sends the results on. So cheap Python
//! calls run many per GIL acquisition whatever `k` (a no-op item costs
//! about 4 µs with `k` = 4 and 2 with `k` = 1, where it cost 35–47 µs
//! with `k` = 4 when every item was handed to a thread: BENCHMARKS.md),
//! while calls that release the GIL (sleep, I/O, `NumPy`) overlap on the `k`
//! threads: a sibling takes the next item as soon as the GIL is free. One
//! thread at a time sends results on, in input order for an ordered stage;
//! the window bounds what a slow item holds back. `threads.rs` has the
//! details.
//!
//! # Back-pressure
//!
//! Every channel is bounded: a slow consumer fills the sink, each stage
//! then waits to send, and finally the source waits. Memory stays bounded
//! by the capacities, whatever the source's length.
//!
//! # Errors and shutdown
//!
//! A failing item is either fatal ([`ErrorPolicy::Raise`]: the pipeline
//! stops and [`Pipeline::next_timeout`] returns the [`Failure`], naming
//! the stage) or skipped and counted ([`ErrorPolicy::Skip`], with an
//! optional bound). A panic in a stage function is a failure, never a
//! crash or a hang. Stopping aborts every task at its next await point,
//! closes every channel (so threads blocked on them return) and joins the
//! threads; threads that wait (for input, or for room in a full channel)
//! look at the stop flag at least every 10 ms. Threads inside user code (a
//! stage function, the source's `next`) have [`STOP_GRACE`] in all to
//! return; those that do not are left to finish on their own (their results
//! are thrown away, they end when the call returns) and named by
//! [`Pipeline::take_left_running`]: no thread can interrupt a call that holds it
//! (a Python `time.sleep`). Every other thread is joined before `stop`
//! returns, so stopping takes about `STOP_GRACE` at most. A thread stage's
//! function is not wrapped in `catch_unwind`: a panic ends its thread and
//! fails the stage. (A thread left inside a Python call when the interpreter
//! exits is ended by `CPython` with a forced unwind; the bindings' calls into
//! Python park such a thread where the unwind starts, `src/py/hang.rs`, so it
//! never reaches the engine's frames.)

mod engine;
mod error;
mod shared;
mod source;
mod stage;
mod stats;
mod tasks;
mod threads;
mod watch;

pub use engine::{Next, Pipeline, PipelineConfig, STOP_GRACE};
pub use error::{Failure, FailureKind, PipelineError};
pub use stage::{
    AccumulateStage, AggregateStage, AsyncItemFn, BoxFuture, CombineFn, DisaggregateStage,
    ErrorPolicy, FlushFn, ItemFn, IterSource, MapStage, SessionFn, SkipHook, Source, SplitFn,
    Stage, StageTimeout, TimeoutErrorFn, UnskippableFn, Work,
};
pub use stats::{format_table, StageStats, StatsSnapshot};
pub use watch::{ReportFn, Stall, StallFn, StallWatch, StatsReporter};

#[cfg(test)]
mod tests;
