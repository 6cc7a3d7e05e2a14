//! The source's thread: it pulls items and sends them on.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use super::error::{panic_message, Failure, FailureKind, PipelineError};
use super::shared::{Emitter, Shared};
use super::stage::Source;
use super::tasks::MAX_BATCH;

/// Starts the thread that pulls `source` (the room in its output channel at
/// a time, but at least half the channel's capacity, at most [`MAX_BATCH`];
/// so the source runs at most half a channel ahead of its channel) and emits
/// every item, then the source's failure if it fails, until the source ends
/// or the pipeline stops.
pub(super) fn spawn_source<T: Send + 'static, E: Send + 'static>(
    mut source: Box<dyn Source<T, E>>,
    out: Emitter<T, E>,
    shared: Arc<Shared<E>>,
) -> Result<JoinHandle<()>, PipelineError> {
    std::thread::Builder::new()
        .name("ferrofeed-source".into())
        .spawn(move || {
            let cap = out.tx.capacity().unwrap_or(1);
            let mut batch = Vec::new();
            loop {
                if shared.stop.load(Ordering::Acquire) {
                    return;
                }
                // At least half a channel's worth a pull: a source that kept
                // its channel full would otherwise wake, and take the GIL, once
                // per item taken from it.
                let room = cap
                    .saturating_sub(out.tx.len())
                    .max(cap / 2)
                    .clamp(1, MAX_BATCH);
                let t = Instant::now();
                let pulled = catch_unwind(AssertUnwindSafe(|| {
                    source
                        .next_batch_offering(room, &mut batch, &mut |item| out.try_emit(item).err())
                }));
                out.own.worked(t.elapsed());
                // The items pulled before a failure go on, then the failure.
                for item in batch.drain(..) {
                    if !out.emit_blocking(item) {
                        return;
                    }
                }
                let kind = match pulled {
                    Ok(Ok(true)) => continue,
                    Ok(Ok(false)) => return,
                    Ok(Err(e)) => FailureKind::Item(e),
                    Err(p) => FailureKind::Panicked(panic_message(&*p)),
                };
                out.fail_blocking(Failure {
                    stage: "source".into(),
                    kind,
                });
                return;
            }
        })
        .map_err(PipelineError::Start)
}
