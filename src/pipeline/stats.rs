//! Per-stage counters, updated lock-free by the stage and read by anyone.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Live counters of one stage (the source and the sink are stages too).
#[derive(Debug, Default)]
pub struct StageStats {
    name: String,
    concurrency: usize,
    queue_capacity: usize,
    items_in: AtomicU64,
    items_out: AtomicU64,
    dropped: AtomicU64,
    failures: AtomicU64,
    busy_ns: AtomicU64,
    wait_up_ns: AtomicU64,
    wait_down_ns: AtomicU64,
    queue_samples: AtomicU64,
    queue_sum: AtomicU64,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl StageStats {
    /// Counters for a stage named `name` that runs `concurrency` items at
    /// once and writes into a queue of `queue_capacity` items.
    pub fn new(name: impl Into<String>, concurrency: usize, queue_capacity: usize) -> Self {
        Self {
            name: name.into(),
            concurrency,
            queue_capacity,
            ..Self::default()
        }
    }

    /// The stage's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Everything that counts as progress: items taken, passed on,
    /// dropped or failed.
    pub(crate) fn progress(&self) -> u64 {
        self.items_in.load(Relaxed)
            + self.items_out.load(Relaxed)
            + self.dropped.load(Relaxed)
            + self.failures.load(Relaxed)
    }

    /// Items taken and not yet passed on, dropped or failed (for a map
    /// stage: queued or running).
    pub(crate) fn in_flight(&self) -> u64 {
        self.items_in.load(Relaxed).saturating_sub(
            self.items_out.load(Relaxed) + self.dropped.load(Relaxed) + self.failures.load(Relaxed),
        )
    }

    pub(crate) fn items_in(&self) -> u64 {
        self.items_in.load(Relaxed)
    }

    pub(crate) fn items_out(&self) -> u64 {
        self.items_out.load(Relaxed)
    }

    pub(crate) fn received(&self, waited: Duration) {
        self.items_in.fetch_add(1, Relaxed);
        self.wait_up_ns.fetch_add(nanos(waited), Relaxed);
    }

    pub(crate) fn worked(&self, busy: Duration) {
        self.busy_ns.fetch_add(nanos(busy), Relaxed);
    }

    pub(crate) fn sent(&self, waited: Duration, queue_len: usize) {
        self.items_out.fetch_add(1, Relaxed);
        self.wait_down_ns.fetch_add(nanos(waited), Relaxed);
        self.queue_samples.fetch_add(1, Relaxed);
        self.queue_sum.fetch_add(queue_len as u64, Relaxed);
    }

    pub(crate) fn dropped(&self) {
        self.dropped.fetch_add(1, Relaxed);
    }

    pub(crate) fn failed(&self) -> u64 {
        self.failures.fetch_add(1, Relaxed) + 1
    }

    /// A consistent-enough copy of the counters (each read atomically).
    pub fn snapshot(&self) -> StatsSnapshot {
        let samples = self.queue_samples.load(Relaxed);
        #[allow(clippy::cast_precision_loss)] // a mean of small counts
        let queue_mean = if samples == 0 {
            0.0
        } else {
            self.queue_sum.load(Relaxed) as f64 / samples as f64
        };
        StatsSnapshot {
            name: self.name.clone(),
            concurrency: self.concurrency,
            items_in: self.items_in.load(Relaxed),
            items_out: self.items_out.load(Relaxed),
            dropped: self.dropped.load(Relaxed),
            failures: self.failures.load(Relaxed),
            busy: Duration::from_nanos(self.busy_ns.load(Relaxed)),
            wait_upstream: Duration::from_nanos(self.wait_up_ns.load(Relaxed)),
            wait_downstream: Duration::from_nanos(self.wait_down_ns.load(Relaxed)),
            queue_mean,
            queue_capacity: self.queue_capacity,
        }
    }
}

/// The counters of one stage at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct StatsSnapshot {
    /// Stage name.
    pub name: String,
    /// Items the stage works on at once.
    pub concurrency: usize,
    /// Items taken from upstream.
    pub items_in: u64,
    /// Items passed downstream.
    pub items_out: u64,
    /// Items the stage's function dropped (returned nothing for).
    pub dropped: u64,
    /// Items that failed (skipped or fatal).
    pub failures: u64,
    /// Time spent in the stage's function, summed over concurrent calls.
    pub busy: Duration,
    /// Time spent waiting for an item from upstream.
    pub wait_upstream: Duration,
    /// Time spent waiting for room downstream.
    pub wait_downstream: Duration,
    /// Mean length of the output queue, sampled at each send.
    pub queue_mean: f64,
    /// Capacity of the output queue.
    pub queue_capacity: usize,
}

impl StatsSnapshot {
    /// Mean busy time per item taken in (zero before the first).
    pub fn busy_per_item(&self) -> Duration {
        let n = self.items_in.max(self.items_out);
        if n == 0 {
            Duration::ZERO
        } else {
            self.busy / u32::try_from(n).unwrap_or(u32::MAX)
        }
    }
}

/// Renders snapshots as a fixed-width table, one line per stage.
pub fn format_table(stats: &[StatsSnapshot]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<24} {:>5} {:>10} {:>10} {:>7} {:>7} {:>10} {:>11} {:>10} {:>10} {:>9}",
        "stage",
        "conc",
        "in",
        "out",
        "drop",
        "fail",
        "busy s",
        "busy/item",
        "wait up s",
        "wait dn s",
        "queue"
    );
    for s in stats {
        let _ = writeln!(
            out,
            "{:<24} {:>5} {:>10} {:>10} {:>7} {:>7} {:>10.3} {:>9.1}us {:>10.3} {:>10.3} {:>4.1}/{:<4}",
            truncate(&s.name, 24),
            s.concurrency,
            s.items_in,
            s.items_out,
            s.dropped,
            s.failures,
            s.busy.as_secs_f64(),
            s.busy_per_item().as_secs_f64() * 1e6,
            s.wait_upstream.as_secs_f64(),
            s.wait_downstream.as_secs_f64(),
            s.queue_mean,
            s.queue_capacity,
        );
    }
    out
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_table() {
        let s = StageStats::new("decode", 4, 8);
        s.received(Duration::from_millis(2));
        s.received(Duration::from_millis(2));
        s.worked(Duration::from_millis(10));
        s.sent(Duration::from_millis(1), 3);
        s.sent(Duration::from_millis(1), 5);
        assert_eq!(s.failed(), 1);
        s.dropped();
        let snap = s.snapshot();
        assert_eq!(
            (snap.items_in, snap.items_out, snap.failures, snap.dropped),
            (2, 2, 1, 1)
        );
        assert_eq!(snap.busy_per_item(), Duration::from_millis(5));
        assert!((snap.queue_mean - 4.0).abs() < 1e-9);
        let table = format_table(&[snap]);
        assert!(table.lines().nth(1).unwrap().starts_with("decode"));
        assert_eq!(truncate("abcdef", 4), "abc…");
    }
}
