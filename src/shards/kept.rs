//! [`Kept`]: the samples' bytes that windows of an indexed remote source
//! fetched, kept for later windows within a byte budget.
//!
//! A remote tar source with a sample index fetches each window's samples as
//! byte ranges (`index::fetch_pieces`), and nothing whole. Without keeping
//! them, every epoch fetches every one of its samples again, where a reader of
//! whole shards keeps the shards it fetched ahead. The store keeps each
//! fetched piece (samples `lo..hi` of a shard, as the bytes from sample
//! `lo`'s start) within the source's `prefetch_bytes`, the least recently
//! used first out, and serves any later piece whose samples kept pieces
//! hold: a slice of one piece's bytes (no copy), or the bytes of the
//! adjacent pieces it spans copied together (a piece's bytes count against
//! the budget as their length, although a slice keeps the whole buffer of
//! the fetch it came from alive until every slice of it is dropped).

use std::collections::VecDeque;

use bytes::Bytes;

use super::index::{piece_bytes, SampleOffsets};

/// A piece kept: samples `lo..hi` of `shard`, and their bytes.
struct Piece {
    shard: usize,
    lo: u64,
    hi: u64,
    bytes: Bytes,
}

/// Fetched pieces kept within a budget of bytes (see the [module
/// docs](self)).
pub(super) struct Kept {
    limit: u64,
    held: u64,
    /// The least recently used first.
    pieces: VecDeque<Piece>,
    hits: u64,
}

impl Kept {
    /// A store of at most `limit` bytes (0: nothing is kept).
    pub(super) fn new(limit: u64) -> Self {
        Self {
            limit,
            held: 0,
            pieces: VecDeque::new(),
            hits: 0,
        }
    }

    /// The bytes of samples `lo..hi` of `shard`, when kept pieces hold them
    /// all (those pieces become the most recently used), found by the
    /// shard's sample `offsets`: a slice of one piece's bytes, or, when the
    /// samples span several pieces (windows cut the shards elsewhere from
    /// one epoch to the next), the pieces' bytes copied together.
    pub(super) fn get(
        &mut self,
        offsets: &[SampleOffsets],
        (shard, lo, hi): (usize, u64, u64),
    ) -> Option<Bytes> {
        let want = piece_bytes(offsets, (shard, lo, hi))?;
        // The kept pieces that cover lo..hi, in sample order.
        let mut used = Vec::new();
        let mut at = lo;
        while at < hi {
            let i = self
                .pieces
                .iter()
                .position(|p| p.shard == shard && p.lo <= at && at < p.hi)?;
            used.push(i);
            at = self.pieces[i].hi;
        }
        let mut parts = Vec::with_capacity(used.len());
        for &i in &used {
            let p = &self.pieces[i];
            let base = piece_bytes(offsets, (shard, p.lo, p.hi))?.start;
            let start = want.start.max(base) - base;
            let stop = want.end.min(base + p.bytes.len() as u64) - base;
            if start > stop {
                return None;
            }
            parts.push(
                p.bytes
                    .slice(usize::try_from(start).ok()?..usize::try_from(stop).ok()?),
            );
        }
        let bytes = if parts.len() == 1 {
            parts.pop()?
        } else {
            let mut joined = Vec::with_capacity(parts.iter().map(Bytes::len).sum());
            for part in &parts {
                joined.extend_from_slice(part);
            }
            Bytes::from(joined)
        };
        if bytes.len() as u64 != want.end - want.start {
            return None; // a kept piece shorter than its samples: fetch them instead
        }
        // The pieces used are now the most recently used.
        used.sort_unstable();
        for i in used.into_iter().rev() {
            if let Some(p) = self.pieces.remove(i) {
                self.pieces.push_back(p);
            }
        }
        self.hits += 1;
        Some(bytes)
    }

    /// Keeps the bytes of samples `lo..hi` of `shard` (fetched), dropping
    /// the least recently used pieces past the budget. A piece larger than
    /// the whole budget is not kept.
    pub(super) fn keep(&mut self, (shard, lo, hi): (usize, u64, u64), bytes: Bytes) {
        let len = bytes.len() as u64;
        if len == 0 || len > self.limit {
            return;
        }
        self.held += len;
        self.pieces.push_back(Piece {
            shard,
            lo,
            hi,
            bytes,
        });
        while self.held > self.limit {
            let Some(old) = self.pieces.pop_front() else {
                break;
            };
            self.held -= old.bytes.len() as u64;
        }
    }

    /// Pieces served from the store so far.
    pub(super) fn hits(&self) -> u64 {
        self.hits
    }

    /// Bytes held.
    pub(super) fn held(&self) -> u64 {
        self.held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One shard of 4 samples of 10 bytes each, bytes `0..40`.
    fn offsets() -> Vec<SampleOffsets> {
        vec![Some((vec![0, 10, 20, 30], 40))]
    }

    fn shard_bytes(range: std::ops::Range<u8>) -> Bytes {
        Bytes::from(range.collect::<Vec<u8>>())
    }

    #[test]
    fn a_piece_inside_a_kept_one_is_a_slice_of_it() {
        let o = offsets();
        let mut kept = Kept::new(1 << 20);
        kept.keep((0, 1, 4), shard_bytes(10..40));
        assert_eq!(kept.held(), 30);
        assert_eq!(kept.get(&o, (0, 2, 3)), Some(shard_bytes(20..30)));
        assert_eq!(kept.get(&o, (0, 1, 4)), Some(shard_bytes(10..40)));
        assert_eq!(kept.hits(), 2);
        // Not held: sample 0, a piece reaching past the kept one, another shard.
        assert_eq!(kept.get(&o, (0, 0, 2)), None);
        assert_eq!(kept.get(&o, (1, 1, 2)), None);
        assert_eq!(kept.hits(), 2);
    }

    #[test]
    fn a_piece_across_kept_ones_is_their_bytes_together() {
        let o = offsets();
        let mut kept = Kept::new(1 << 20);
        kept.keep((0, 2, 4), shard_bytes(20..40));
        kept.keep((0, 0, 2), shard_bytes(0..20));
        assert_eq!(kept.get(&o, (0, 1, 3)), Some(shard_bytes(10..30)));
        assert_eq!(kept.get(&o, (0, 0, 4)), Some(shard_bytes(0..40)));
        // A gap (sample 1 not kept) is not served.
        let mut gap = Kept::new(1 << 20);
        gap.keep((0, 0, 1), shard_bytes(0..10));
        gap.keep((0, 2, 4), shard_bytes(20..40));
        assert_eq!(gap.get(&o, (0, 0, 3)), None);
        assert_eq!(gap.hits(), 0);
    }

    #[test]
    fn the_least_recently_used_goes_first_past_the_budget() {
        let o = offsets();
        let mut kept = Kept::new(25);
        kept.keep((0, 0, 1), shard_bytes(0..10));
        kept.keep((0, 1, 2), shard_bytes(10..20));
        assert!(kept.get(&o, (0, 0, 1)).is_some()); // now the most recent
        kept.keep((0, 2, 3), shard_bytes(20..30));
        assert_eq!(kept.held(), 20);
        assert!(
            kept.get(&o, (0, 1, 2)).is_none(),
            "the least recently used left"
        );
        assert!(kept.get(&o, (0, 0, 1)).is_some());
        assert!(kept.get(&o, (0, 2, 3)).is_some());
        // Larger than the budget, or a budget of 0: not kept.
        kept.keep((0, 0, 4), shard_bytes(0..40));
        assert!(kept.get(&o, (0, 3, 4)).is_none());
        let mut none = Kept::new(0);
        none.keep((0, 0, 1), shard_bytes(0..10));
        assert_eq!(none.held(), 0);
    }
}
