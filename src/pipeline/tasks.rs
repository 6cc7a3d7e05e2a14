//! The bodies of the stage tasks: map (with `invoke`, where a call runs),
//! aggregate, disaggregate and accumulate. Thread stages are in `threads`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt};
use futures_util::FutureExt;

use super::error::{panic_message, Failure, FailureKind};
use super::shared::{timed, Emitter, Handled, Msg, Outcome, StageCtx};
use super::stage::{
    AccumulateStage, AggregateStage, AsyncItemFn, BoxFuture, DisaggregateStage, ErrorPolicy,
    ItemFn, MapStage, StageTimeout,
};
use super::stats::StageStats;

/// Most items a stage takes from its input at once (when they are there).
pub(super) const MAX_BATCH: usize = 64;

/// What a stage that takes its input one item at a time gets next.
enum Next<T> {
    /// An item (its wait counted in the stage's figures).
    Item(T),
    /// An upstream failure, already sent on downstream.
    Failed,
    /// The input ended.
    Ended,
}

/// The next item of `rx`, for a stage that takes one at a time: an
/// upstream failure is sent on downstream at once.
async fn next_item<T, E>(
    rx: &flume::Receiver<Msg<T, E>>,
    out: &Emitter<T, E>,
    stats: &StageStats,
) -> Next<T> {
    let t = Instant::now();
    match rx.recv_async().await {
        Ok(Msg::Item(item)) => {
            stats.received(t.elapsed());
            Next::Item(item)
        }
        Ok(Msg::Fail(f)) => {
            out.fail(f).await;
            Next::Failed
        }
        Err(_) => Next::Ended,
    }
}

/// The [`Work`] a stage task runs (dedicated work has threads of its own).
pub(super) enum TaskWork<T, E> {
    Inline(ItemFn<T, E>),
    Blocking(ItemFn<T, E>),
    Async(AsyncItemFn<T, E>),
}

pub(super) async fn run_map<T: Send + 'static, E: Send + 'static>(
    stage: MapStage<T, E>,
    work: TaskWork<T, E>,
    rx: flume::Receiver<Msg<T, E>>,
    out: Emitter<T, E>,
    ctx: StageCtx<E>,
) {
    let MapStage {
        name,
        concurrency,
        ordered,
        on_error,
        timeout,
        ..
    } = stage;
    let timeout = timeout.map(|t| (t, name.clone()));
    // Handles one outcome; false when the stage must stop.
    let handle = |outcome: Outcome<T, E>| {
        let (ctx, out, name) = (&ctx, &out, &name);
        async move {
            match ctx.handle(name, on_error, outcome) {
                Handled::Send(v) => out.emit(v).await,
                Handled::Nothing => true,
                Handled::Fatal(f) => {
                    out.fail(f).await;
                    false
                }
            }
        }
    };
    // The input ends after an upstream failure: nothing follows it.
    let stats = Arc::clone(&ctx.stats);
    let inputs = stream::unfold(Some(rx), move |rx| {
        let stats = Arc::clone(&stats);
        async move {
            let rx = rx?;
            let t = Instant::now();
            match rx.recv_async().await.ok()? {
                Msg::Item(item) => {
                    stats.received(t.elapsed());
                    Some((Msg::Item(item), Some(rx)))
                }
                fail @ Msg::Fail(_) => Some((fail, None)),
            }
        }
    });
    let stats = Arc::clone(&ctx.stats);
    let gate = Arc::clone(&ctx.shared.blocking);
    let calls = inputs.map(move |msg| -> BoxFuture<Result<Outcome<T, E>, Failure<E>>> {
        match msg {
            Msg::Item(item) => {
                let call = invoke(&work, item, &stats, timeout.as_ref(), &gate);
                Box::pin(async move { Ok(call.await) })
            }
            Msg::Fail(f) => Box::pin(std::future::ready(Err(f))),
        }
    });
    // An upstream failure goes on after every item that came before it
    // (an unordered stage lets those in flight finish first).
    let mut upstream = None;
    if ordered {
        let mut outs = std::pin::pin!(calls.buffered(concurrency));
        while let Some(o) = outs.next().await {
            match o {
                Ok(o) => {
                    if !handle(o).await {
                        return;
                    }
                }
                Err(f) => upstream = Some(f),
            }
        }
    } else {
        let mut outs = std::pin::pin!(calls.buffer_unordered(concurrency));
        while let Some(o) = outs.next().await {
            match o {
                Ok(o) => {
                    if !handle(o).await {
                        return;
                    }
                }
                Err(f) => upstream = Some(f),
            }
        }
    }
    if let Some(f) = upstream {
        out.fail(f).await;
    }
}

/// Starts one call of a stage function on `item`, where its [`Work`] says,
/// bounded by the stage's timeout (with the stage's name) if it has one. A
/// blocking call first takes one of the pipeline's `gate` permits (see
/// [`PipelineConfig::num_threads`]) and holds it until it returns; its
/// timeout counts from then.
fn invoke<T: Send + 'static, E: Send + 'static>(
    work: &TaskWork<T, E>,
    item: T,
    stats: &Arc<StageStats>,
    timeout: Option<&(StageTimeout<E>, String)>,
    gate: &Arc<tokio::sync::Semaphore>,
) -> BoxFuture<Outcome<T, E>> {
    let stats = Arc::clone(stats);
    match work {
        TaskWork::Inline(f) => {
            let t = Instant::now();
            let out = timed(&stats, || f(item));
            // Inline work cannot be interrupted: checked when it returns.
            Box::pin(std::future::ready(match timeout {
                Some((to, name)) if t.elapsed() > to.limit => Ok(Err((to.error)(name, to.limit))),
                _ => out,
            }))
        }
        TaskWork::Blocking(f) => {
            let (f, gate) = (Arc::clone(f), Arc::clone(gate));
            let timeout = timeout.cloned();
            Box::pin(async move {
                let Ok(permit) = gate.acquire_owned().await else {
                    return Err("the pipeline's blocking calls are closed".into());
                };
                // Given back when the call returns, or when it runs past the
                // stage's timeout: a stuck call is no longer the pipeline's
                // (as a thread stage's stuck thread is not), and stopping does
                // not wait for it. A stopped pipeline's calls keep theirs.
                let permit = Arc::new(Mutex::new(Some(permit)));
                let in_call = Arc::clone(&permit);
                let call: BoxFuture<Outcome<T, E>> = Box::pin(async move {
                    let call = tokio::task::spawn_blocking(move || {
                        let out = timed(&stats, || f(item));
                        in_call
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .take();
                        out
                    });
                    call.await
                        .unwrap_or_else(|e| Err(format!("the blocking task failed: {e}")))
                });
                let out = limited(call, timeout.as_ref()).await;
                permit.lock().unwrap_or_else(PoisonError::into_inner).take();
                out
            })
        }
        TaskWork::Async(f) => {
            let fut = f(item);
            limited(
                Box::pin(async move {
                    let t = Instant::now();
                    let out = AssertUnwindSafe(fut)
                        .catch_unwind()
                        .await
                        .map_err(|p| panic_message(&*p));
                    stats.worked(t.elapsed());
                    out
                }),
                timeout,
            )
        }
    }
}

/// `call`, bounded by the stage's timeout if it has one. Past the limit,
/// the call's future is dropped: async work is cancelled, a blocking call
/// runs on and its result is lost.
fn limited<T: Send + 'static, E: Send + 'static>(
    call: BoxFuture<Outcome<T, E>>,
    timeout: Option<&(StageTimeout<E>, String)>,
) -> BoxFuture<Outcome<T, E>> {
    match timeout {
        None => call,
        Some((to, name)) => {
            let (limit, error, name) = (to.limit, Arc::clone(&to.error), name.clone());
            Box::pin(async move {
                tokio::time::timeout(limit, call)
                    .await
                    .unwrap_or_else(|_| Ok(Err(error(&name, limit))))
            })
        }
    }
}

pub(super) async fn run_aggregate<T: Send + 'static, E: Send + 'static>(
    stage: AggregateStage<T, E>,
    rx: flume::Receiver<Msg<T, E>>,
    out: Emitter<T, E>,
    ctx: StageCtx<E>,
) {
    let AggregateStage {
        name,
        size,
        drop_last,
        combine,
    } = stage;
    let emit = |group: Vec<T>| {
        let (ctx, out, name, combine) = (&ctx, &out, &name, &combine);
        async move {
            let outcome = timed(&ctx.stats, || combine(group).map(Some));
            match ctx.handle(name, ErrorPolicy::Raise, outcome) {
                Handled::Send(v) => out.emit(v).await,
                Handled::Nothing => true,
                Handled::Fatal(f) => {
                    out.fail(f).await;
                    false
                }
            }
        }
    };
    let mut group = Vec::with_capacity(size);
    let mut ready = Vec::with_capacity(MAX_BATCH);
    let mut upstream = None;
    'recv: loop {
        let t = Instant::now();
        let Ok(first) = rx.recv_async().await else {
            break;
        };
        let waited = t.elapsed();
        for (k, msg) in std::iter::once(first)
            .chain(rx.try_iter().take(MAX_BATCH - 1))
            .enumerate()
        {
            match msg {
                Msg::Item(item) => {
                    ctx.stats
                        .received(if k == 0 { waited } else { Duration::ZERO });
                    ready.push(item);
                }
                Msg::Fail(f) => {
                    upstream = Some(f);
                    break;
                }
            }
        }
        for item in ready.drain(..) {
            group.push(item);
            if group.len() == size
                && !emit(std::mem::replace(&mut group, Vec::with_capacity(size))).await
            {
                return;
            }
        }
        if upstream.is_some() {
            break 'recv;
        }
    }
    // After a failure upstream, the groups completed before it go on, then
    // the failure; the partial group does not (its items did not end).
    if let Some(f) = upstream {
        out.fail(f).await;
        return;
    }
    if !group.is_empty() && !drop_last && !ctx.shared.failed.load(Ordering::Acquire) {
        emit(group).await;
    }
}

pub(super) async fn run_disaggregate<T: Send + 'static, E: Send + 'static>(
    stage: DisaggregateStage<T, E>,
    rx: flume::Receiver<Msg<T, E>>,
    out: Emitter<T, E>,
    ctx: StageCtx<E>,
) {
    let DisaggregateStage { name, split } = stage;
    loop {
        let Next::Item(item) = next_item(&rx, &out, &ctx.stats).await else {
            return;
        };
        let t = Instant::now();
        let parts = catch_unwind(AssertUnwindSafe(|| split(item)));
        ctx.stats.worked(t.elapsed());
        let parts = match parts {
            Ok(Ok(parts)) => parts,
            Ok(Err(e)) => {
                ctx.stats.failed();
                let kind = FailureKind::Item(e);
                out.fail(Failure { stage: name, kind }).await;
                return;
            }
            Err(p) => {
                ctx.stats.failed();
                let kind = FailureKind::Panicked(panic_message(&*p));
                out.fail(Failure { stage: name, kind }).await;
                return;
            }
        };
        if parts.is_empty() {
            ctx.stats.dropped();
        }
        for part in parts {
            if !out.emit(part).await {
                return;
            }
        }
    }
}

pub(super) async fn run_accumulate<T: Send + 'static, E: Send + 'static>(
    stage: AccumulateStage<T, E>,
    rx: flume::Receiver<Msg<T, E>>,
    out: Emitter<T, E>,
    ctx: StageCtx<E>,
) {
    let AccumulateStage {
        name,
        accumulate,
        flush,
    } = stage;
    // Sends on what one call gave; false when the stage must stop.
    let handle = |outcome: Outcome<T, E>| {
        let (ctx, out, name) = (&ctx, &out, &name);
        async move {
            match outcome {
                Ok(Ok(Some(v))) => out.emit(v).await,
                Ok(Ok(None)) => true,
                failed => match ctx.handle(name, ErrorPolicy::Raise, failed) {
                    Handled::Fatal(f) => {
                        out.fail(f).await;
                        false
                    }
                    _ => true,
                },
            }
        }
    };
    loop {
        let item = match next_item(&rx, &out, &ctx.stats).await {
            Next::Item(item) => item,
            // What the aggregator holds did not end: no flush.
            Next::Failed => return,
            Next::Ended => break,
        };
        let outcome = tokio::task::block_in_place(|| timed(&ctx.stats, || accumulate(item)));
        if !handle(outcome).await {
            return;
        }
    }
    if let Some(flush) = flush {
        if !ctx.shared.failed.load(Ordering::Acquire) {
            let outcome = tokio::task::block_in_place(|| timed(&ctx.stats, || flush()));
            handle(outcome).await;
        }
    }
}
