//! Watching a running pipeline: the periodic stats report and the stall
//! watch.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::error::PipelineError;
use super::shared::Shared;
use super::stats::{StageStats, StatsSnapshot};

/// Receives stats snapshots (source, stages, sink).
pub type ReportFn = Arc<dyn Fn(&[StatsSnapshot]) + Send + Sync>;

/// Periodic stats reporting: every `interval`, `report` gets a snapshot.
pub struct StatsReporter {
    /// Time between reports.
    pub interval: Duration,
    /// Receives the snapshots.
    pub report: ReportFn,
}

/// A pipeline that made no progress for a while: what the watch says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stall {
    /// The stage that holds the pipeline: the furthest downstream map stage
    /// with items in flight, or `"source"` when none has (the source is
    /// waiting for its next item).
    pub stage: String,
    /// Items that stage has taken and not passed on (queued or running).
    pub in_flight: u64,
    /// How long nothing has moved.
    pub idle: Duration,
}

/// Receives [`Stall`] reports.
pub type StallFn = Arc<dyn Fn(&Stall) + Send + Sync>;

/// Watching for stalls: when no stage takes, passes on, drops or fails an
/// item for `after` while the consumer is not the one holding things up
/// (the sink is not full), `report` hears which stage holds the pipeline;
/// again every `after` while it stays stuck.
pub struct StallWatch {
    /// How long without progress makes a stall.
    pub after: Duration,
    /// Receives the reports (on the watch's own thread).
    pub report: StallFn,
}

/// Reports `stats` every `rep.interval` until aborted.
pub(super) fn spawn_reporter(
    runtime: &crate::runtime::Runtime,
    stats: Vec<Arc<StageStats>>,
    rep: StatsReporter,
) -> tokio::task::JoinHandle<()> {
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(rep.interval);
        tick.tick().await;
        loop {
            tick.tick().await;
            let snaps: Vec<_> = stats.iter().map(|s| s.snapshot()).collect();
            (rep.report)(&snaps);
        }
    })
}

/// Starts the stall watch: it looks every quarter of `watch.after` (at most
/// every 250 ms) until the pipeline stops. `maps[j]` tells whether stage `j`
/// is a map stage (an aggregate legitimately holds a partial group).
pub(super) fn spawn_stall_watch<E: Send + 'static>(
    shared: Arc<Shared<E>>,
    stats: Vec<Arc<StageStats>>,
    maps: Vec<bool>,
    sink_capacity: usize,
    watch: StallWatch,
) -> Result<JoinHandle<()>, PipelineError> {
    let tick = (watch.after / 4).clamp(Duration::from_millis(5), Duration::from_millis(250));
    std::thread::Builder::new()
        .name("ff-stall-watch".into())
        .spawn(move || {
            let n = stats.len();
            let progress = || stats.iter().map(|s| s.progress()).sum::<u64>();
            let mut last = progress();
            let mut since = Instant::now();
            let mut reported: Option<Instant> = None;
            loop {
                std::thread::park_timeout(tick);
                if shared.stopping() {
                    return;
                }
                let now = progress();
                // Items in the sink: sent by the last stage (or the source),
                // not yet taken by the consumer.
                let in_sink = stats[n - 2]
                    .items_out()
                    .saturating_sub(stats[n - 1].items_in());
                if now != last || in_sink >= sink_capacity as u64 {
                    last = now;
                    since = Instant::now();
                    reported = None;
                    continue;
                }
                let idle = since.elapsed();
                if idle < watch.after || reported.is_some_and(|r| r.elapsed() < watch.after) {
                    continue;
                }
                let holder = (0..maps.len())
                    .rev()
                    .filter(|&j| maps[j])
                    .map(|j| &stats[j + 1])
                    .find(|s| s.in_flight() > 0);
                let stall = match holder {
                    Some(s) => Stall {
                        stage: s.name().to_owned(),
                        in_flight: s.in_flight(),
                        idle,
                    },
                    None => Stall {
                        stage: "source".into(),
                        in_flight: 0,
                        idle,
                    },
                };
                (watch.report)(&stall);
                reported = Some(Instant::now());
            }
        })
        .map_err(PipelineError::Start)
}
