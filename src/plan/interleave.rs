//! The interleave of a mixture's parts ([`super::mix`]): part `k` of
//! weight `w_k` ticks at times `(j + φ_k) / w_k`, and position `p` of an
//! epoch draws from the part of the `p`-th tick in time order (ties to the
//! lower part). Times are compared exactly, in integers: a weight is a
//! count of `2^-40`ths of the weights' sum, a phase a 32-bit fraction, so
//! the draws are the same on every machine.
//!
//! Hand-written: the rule is a few lines of integer arithmetic whose
//! values ferrofeed pins (the same draws in every release), which no crate
//! offers.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// A phase is a 32-bit fraction of a part's tick.
const PHASE_BITS: u32 = 32;

/// A tick of the interleave: the `j`-th draw of part `part`, at time
/// `num / unit` (`num = j * 2^32 + phase`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tick {
    num: u128,
    unit: u64,
    part: usize,
}

impl Ord for Tick {
    fn cmp(&self, other: &Self) -> Ordering {
        // num < 2^80 and unit <= 2^40 (MAX_SAMPLES): the products fit in 120 bits.
        (self.num * u128::from(other.unit))
            .cmp(&(other.num * u128::from(self.unit)))
            .then(self.part.cmp(&other.part))
    }
}

impl PartialOrd for Tick {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The interleave of one world: every part's weight and phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Schedule {
    units: Vec<u64>,
    phases: Vec<u64>,
}

impl Schedule {
    /// The interleave of parts of weights `units` (fixed point, 0 for a
    /// part never drawn), each phase the top 32 bits of its `seeds`' one.
    pub(super) fn new(units: Vec<u64>, seeds: &[u64]) -> Self {
        let phases = seeds.iter().map(|s| s >> (64 - PHASE_BITS)).collect();
        Self { units, phases }
    }

    /// Part `k`'s weight in fixed point.
    pub(super) fn unit(&self, k: usize) -> u64 {
        self.units[k]
    }

    fn tick(&self, part: usize, j: u64) -> Tick {
        Tick {
            num: (u128::from(j) << PHASE_BITS) | u128::from(self.phases[part]),
            unit: self.units[part],
            part,
        }
    }

    /// Ticks of part `other` before tick `j` of part `part`
    /// (`units[part] > 0`).
    fn before(&self, other: usize, part: usize, j: u64) -> u64 {
        if other == part {
            return j;
        }
        let (u_other, u_part) = (self.units[other], self.units[part]);
        if u_other == 0 {
            return 0;
        }
        // Tick i of `other` is before it when (i 2^32 + φo) up < (j 2^32 +
        // φp) uo, or equal and other < part: i 2^32 up < time - offset.
        let time = self.tick(part, j).num * u128::from(u_other);
        let offset = u128::from(self.phases[other]) * u128::from(u_part);
        let step = u128::from(u_part) << PHASE_BITS;
        let count = if other < part {
            // i step <= time - offset: floor(../step) + 1 when time >= offset.
            if time >= offset {
                (time - offset) / step + 1
            } else {
                0
            }
        } else if time > offset {
            // i step < time - offset: ceil(../step).
            (time - offset).div_ceil(step)
        } else {
            0
        };
        u64::try_from(count).unwrap_or(u64::MAX)
    }

    /// The position of tick `j` of part `k` among all ticks.
    pub(super) fn position(&self, k: usize, j: u64) -> u64 {
        (0..self.units.len()).map(|m| self.before(m, k, j)).sum()
    }

    /// How many of the first `p` positions each part draws.
    pub(super) fn counts_at(&self, p: u64) -> Vec<u64> {
        (0..self.units.len())
            .map(|k| {
                if self.units[k] == 0 {
                    return 0;
                }
                // The first tick of k at position >= p (position(k, p) >= p).
                let (mut lo, mut hi) = (0, p);
                while lo < hi {
                    let mid = lo + (hi - lo) / 2;
                    if self.position(k, mid) >= p {
                        hi = mid;
                    } else {
                        lo = mid + 1;
                    }
                }
                lo
            })
            .collect()
    }

    /// The parts drawn at positions `p..p + n`, `counts` being
    /// [`Schedule::counts_at`]`(p)`.
    pub(super) fn draws(&self, counts: &[u64], n: u64) -> Vec<usize> {
        let mut heap: BinaryHeap<std::cmp::Reverse<Tick>> = (0..self.units.len())
            .filter(|&k| self.units[k] > 0)
            .map(|k| std::cmp::Reverse(self.tick(k, counts[k])))
            .collect();
        let mut next = counts.to_vec();
        let mut out = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
        for _ in 0..n {
            let std::cmp::Reverse(t) = heap.pop().expect("a part with a weight above 0");
            out.push(t.part);
            next[t.part] += 1;
            heap.push(std::cmp::Reverse(self.tick(t.part, next[t.part])));
        }
        out
    }
}
