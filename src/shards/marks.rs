//! [`Marks`]: where a shard's samples start, as walks over it found, so
//! that a read of samples deep in the shard seeks to the nearest one before
//! them instead of walking every header from the shard's start.
//!
//! A plain tar shard has no table of contents: reading its samples
//! `lo..hi` walks the headers of the `lo` samples before them. A window
//! reads a piece of a shard, so reading a shard of `n` samples by windows of
//! `w` walked about `n² / 2w` headers: with shards of 8,000 samples and
//! windows of 256, about 100 µs a sample on one thread, which capped a
//! 16-core node (BENCHMARKS.md, "Every core busy"). Counting a shard walks
//! it whole and records a mark every [`STRIDE`] samples; a read records the
//! marks it walks over (a source restored in a worker process reads before
//! it counts); a read then starts at most `STRIDE - 1` samples early.

use std::sync::{Mutex, PoisonError};
use std::time::SystemTime;

/// Every how many samples a mark is kept: a read starts at most this many
/// samples before its first one (a header each, and a seek over its data),
/// and a shard of `n` samples keeps `n / STRIDE` offsets (8 bytes each).
pub const STRIDE: u64 = 128;

/// What the shard's marks were found in: its length and, for a file, its
/// modification time. Marks found in another version of the shard are
/// forgotten, not used (they would point into the middle of members).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// The shard's length in bytes.
    pub len: u64,
    /// A file's modification time (`None` for a shard in memory, which does
    /// not change).
    pub modified: Option<SystemTime>,
}

/// One shard's marks: where its samples `0, STRIDE, 2 * STRIDE, ...` start
/// (the first header of the sample's first member, extension headers such
/// as long names included), as far as walks found them. Shared by the
/// threads that read the shard's pieces.
#[derive(Debug)]
pub struct Marks {
    stride: u64,
    inner: Mutex<Known>,
}

impl Default for Marks {
    fn default() -> Self {
        Self::every(STRIDE)
    }
}

#[derive(Debug, Default)]
struct Known {
    stamp: Option<Stamp>,
    /// `at[i]`: where sample `i * stride` starts. Walks start at a mark (or
    /// the shard's start) and go forward, so what is known is a prefix.
    at: Vec<u64>,
}

impl Known {
    /// The marks of the shard as `stamp` describes it: those of another
    /// version are dropped.
    fn of(&mut self, stamp: Stamp) -> &mut Vec<u64> {
        if self.stamp != Some(stamp) {
            self.stamp = Some(stamp);
            self.at.clear();
        }
        &mut self.at
    }
}

impl Marks {
    /// No marks yet; one will be kept every [`STRIDE`] samples.
    pub fn new() -> Self {
        Self::default()
    }

    /// No marks yet; one will be kept every `stride` samples (at least 1:
    /// the fuzz target marks every sample, so that every read starts at a
    /// mark).
    pub fn every(stride: u64) -> Self {
        Self {
            stride: stride.max(1),
            inner: Mutex::default(),
        }
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        // Only whole values are stored under the lock: a panic elsewhere
        // cannot leave them half-written.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The last mark at or before sample `lo` of the shard as `stamp`
    /// describes it: `(sample, offset)`; `None` when there is none past the
    /// shard's start.
    pub fn before(&self, stamp: Stamp, lo: u64) -> Option<(u64, u64)> {
        let mut known = self.known();
        let at = known.of(stamp);
        let i = usize::try_from(lo / self.stride)
            .ok()?
            .min(at.len().checked_sub(1)?);
        (i > 0).then(|| (i as u64 * self.stride, at[i]))
    }

    /// Records that sample `n` starts at `offset` in the shard as `stamp`
    /// describes it. Kept when `n` is a multiple of the stride and the next
    /// mark not yet known (walks go forward from a known one).
    pub fn record(&self, stamp: Stamp, n: u64, offset: u64) {
        if !n.is_multiple_of(self.stride) {
            return;
        }
        let mut known = self.known();
        let at = known.of(stamp);
        if usize::try_from(n / self.stride).is_ok_and(|i| i == at.len()) {
            at.push(offset);
        }
    }

    /// How many marks are known (for tests and counters).
    pub fn len(&self) -> usize {
        self.known().at.len()
    }

    /// Whether no mark is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Stamp = Stamp {
        len: 1000,
        modified: None,
    };

    #[test]
    fn a_read_starts_at_the_last_mark_at_or_before_its_first_sample() {
        let marks = Marks::new();
        assert_eq!(marks.before(A, 5 * STRIDE), None);
        for i in 0..4 {
            marks.record(A, i * STRIDE, 100 * i);
        }
        assert_eq!(marks.len(), 4);
        assert_eq!(marks.before(A, 0), None, "sample 0 is the shard's start");
        assert_eq!(marks.before(A, STRIDE - 1), None);
        assert_eq!(marks.before(A, STRIDE), Some((STRIDE, 100)));
        assert_eq!(marks.before(A, 2 * STRIDE + 5), Some((2 * STRIDE, 200)));
        assert_eq!(marks.before(A, 50 * STRIDE), Some((3 * STRIDE, 300)));
    }

    #[test]
    fn only_the_next_mark_of_a_stride_is_kept() {
        let marks = Marks::new();
        marks.record(A, 0, 0);
        marks.record(A, 5, 50);
        marks.record(A, 2 * STRIDE, 999);
        assert_eq!(marks.len(), 1, "not a stride, then a gap");
        marks.record(A, STRIDE, 70);
        marks.record(A, STRIDE, 71);
        assert_eq!(marks.before(A, STRIDE), Some((STRIDE, 70)), "kept once");
    }

    #[test]
    fn a_stride_of_one_marks_every_sample() {
        let marks = Marks::every(0);
        for n in 0..5 {
            marks.record(A, n, 10 * n);
        }
        assert_eq!(marks.len(), 5);
        assert_eq!(marks.before(A, 3), Some((3, 30)));
        assert_eq!(marks.before(A, 9), Some((4, 40)));
    }

    #[test]
    fn marks_of_another_version_of_the_shard_are_forgotten() {
        let marks = Marks::new();
        marks.record(A, 0, 0);
        marks.record(A, STRIDE, 70);
        let longer = Stamp { len: 1001, ..A };
        assert_eq!(marks.before(longer, STRIDE), None);
        assert!(marks.is_empty());
        let touched = Stamp {
            modified: Some(SystemTime::UNIX_EPOCH),
            ..A
        };
        marks.record(touched, 0, 0);
        assert_eq!(marks.before(A, 0), None);
        assert!(marks.is_empty());
    }
}
