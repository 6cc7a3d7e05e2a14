//! The mixture plan's promises: proportions, the stop rules, no sample
//! twice, lockstep ranks, exact and elastic resume, pinned draws.

use std::collections::HashSet;

use super::*;
use crate::plan::Group;

fn map(len: u64) -> Part {
    Part::Map { len }
}

fn sharded(counts: &[u64], window: u64) -> Part {
    Part::Sharded {
        counts: counts.to_vec(),
        window,
    }
}

fn config(parts: Vec<Part>, weights: &[f64], stop: Stop, batch_size: u64) -> MixConfig {
    MixConfig {
        parts,
        weights: weights.to_vec(),
        stop,
        batch_size,
        shuffle: true,
        seed: 7,
        ..MixConfig::default()
    }
}

fn on(config: &MixConfig, rank: u64, world_size: u64) -> MixConfig {
    MixConfig {
        rank,
        world_size,
        ..config.clone()
    }
}

/// The parts drawn at positions `lo..hi` of the plan's current world.
fn parts_at(plan: &MixPlan, lo: u64, hi: u64) -> Vec<usize> {
    plan.draws(lo, hi)
        .unwrap()
        .into_iter()
        .map(|d| d.part)
        .collect()
}

/// The part an id belongs to, and its index there, with the pass.
fn decode(config: &MixConfig, id: u64) -> (usize, u64, u64) {
    let total = config.total();
    let (pass, mut rest) = (id / total, id % total);
    for (k, p) in config.parts.iter().enumerate() {
        if rest < p.len() {
            return (k, pass, rest);
        }
        rest -= p.len();
    }
    unreachable!()
}

#[test]
fn counts_at_agrees_with_walking_the_draws() {
    for (weights, seed) in [
        (vec![0.7, 0.3], 1),
        (vec![1.0, 1.0, 1.0], 2),
        (vec![0.01, 0.5, 0.49], 3),
        (vec![5.0, 0.0, 1.0], 4),
    ] {
        let parts = weights.iter().map(|_| map(10_000)).collect();
        let c = MixConfig {
            seed,
            stop: Stop::Samples(3000),
            ..config(parts, &weights, Stop::Shortest, 1)
        };
        let plan = MixPlan::new(&c, 0, &[], 0).unwrap();
        let parts = parts_at(&plan, 0, 3000);
        let mut counts = vec![0; weights.len()];
        for (p, &k) in parts.iter().enumerate() {
            assert_eq!(plan.counts_at(p as u64), counts, "{weights:?} at {p}");
            // The tick's position is where it was drawn.
            assert_eq!(plan.schedule.position(k, counts[k]), p as u64);
            counts[k] += 1;
        }
        assert_eq!(counts[1] == 0, weights[1] == 0.0);
        // Walking on from any position draws what the whole walk drew.
        for lo in [0, 1, 17, 1000, 2999] {
            assert_eq!(parts_at(&plan, lo, 3000), parts[lo as usize..].to_vec());
        }
    }
}

#[test]
fn proportions_hold_over_the_epoch_and_every_window() {
    let weights = [0.7, 0.2, 0.1];
    let c = config(
        vec![map(1_000_000), map(1_000_000), map(1_000_000)],
        &weights,
        Stop::Samples(100_000),
        32,
    );
    let plan = MixPlan::new(&c, 3, &[], 0).unwrap();
    let parts = parts_at(&plan, 0, 100_000);
    for (k, w) in weights.iter().enumerate() {
        let n = f64::from(u32::try_from(parts.iter().filter(|&&p| p == k).count()).unwrap());
        assert!((n / 100_000.0 - w).abs() < 0.005, "part {k}: {n}");
        // Any window of 2,000 positions: within 1 + parts of L w.
        for window in parts.windows(2000).step_by(997) {
            let n = f64::from(u32::try_from(window.iter().filter(|&&p| p == k).count()).unwrap());
            assert!((n - 2000.0 * w).abs() <= 4.0, "part {k}: {n} in a window");
        }
    }
}

#[test]
fn every_epoch_interleaves_anew_and_the_same_seed_the_same() {
    let c = config(vec![map(100), map(100)], &[0.5, 0.5], Stop::Shortest, 4);
    let ids = |epoch, c: &MixConfig| -> Vec<u64> {
        MixPlan::new(c, epoch, &[], 0)
            .unwrap()
            .groups()
            .flat_map(|g| g.ids)
            .collect()
    };
    assert_eq!(ids(0, &c), ids(0, &c));
    assert_ne!(ids(0, &c), ids(1, &c));
    let other = MixConfig {
        seed: 8,
        ..c.clone()
    };
    assert_ne!(ids(0, &c), ids(0, &other));
    // Without a shuffle: each part in order, the same interleave every epoch.
    let plain = MixConfig {
        shuffle: false,
        ..c.clone()
    };
    assert_eq!(ids(0, &plain), ids(5, &plain));
    let first: Vec<u64> = ids(0, &plain).into_iter().filter(|&i| i < 100).collect();
    assert_eq!(first, (0..first.len() as u64).collect::<Vec<_>>());
}

/// The ids of every rank of a world, by rank, walked whole.
fn world_ids(c: &MixConfig, world: u64) -> Vec<Vec<u64>> {
    let plans: Vec<MixPlan> = (0..world)
        .map(|r| MixPlan::new(&on(c, r, world), 0, &[], 0).unwrap())
        .collect();
    let batches = plans[0].batches();
    plans
        .iter()
        .map(|p| {
            assert_eq!(p.batches(), batches, "lockstep");
            p.groups().flat_map(|g| g.ids).collect()
        })
        .collect()
}

#[test]
fn shortest_ends_before_any_sample_repeats() {
    for parts in [
        vec![map(103), map(50)],
        vec![sharded(&[10, 20, 7, 13], 8), map(40)],
        vec![sharded(&[30, 30], 16), sharded(&[5, 9, 11], 4)],
    ] {
        let c = config(parts, &[0.6, 0.4], Stop::Shortest, 5);
        for world in [1, 2, 3] {
            let ranks = world_ids(&c, world);
            let all: Vec<u64> = ranks.iter().flatten().copied().collect();
            let set: HashSet<u64> = all.iter().copied().collect();
            assert_eq!(set.len(), all.len(), "no sample twice, world {world}");
            // Every id is pass 0 and one of its part's samples.
            assert!(all.iter().all(|&id| id < c.total()));
            // The epoch ran until some part's share on a rank was spent.
            let plan = MixPlan::new(&on(&c, 0, world), 0, &[], 0).unwrap();
            let drawn = plan.drawn(plan.samples());
            assert!(
                (0..2).any(|k| drawn[k] == c.parts[k].len() / world),
                "{drawn:?} of {world} ranks"
            );
        }
    }
}

#[test]
fn longest_reads_every_part_whole_and_repeats_the_others() {
    let c = config(
        vec![map(20), sharded(&[40, 40, 20], 16)],
        &[0.5, 0.5],
        Stop::Longest,
        4,
    );
    for world in [1, 2] {
        let ranks = world_ids(&c, world);
        let all: Vec<u64> = ranks.iter().flatten().copied().collect();
        assert_eq!(all.iter().collect::<HashSet<_>>().len(), all.len());
        for (k, part) in c.parts.iter().enumerate() {
            let first: HashSet<u64> = all
                .iter()
                .map(|&id| decode(&c, id))
                .filter(|&(p, pass, _)| p == k && pass == 0)
                .map(|(_, _, i)| i)
                .collect();
            // Every rank's share of the first pass, whole.
            assert_eq!(first.len() as u64, part.len() / world * world, "part {k}");
        }
        // The small part went round more than once.
        assert!(all
            .iter()
            .any(|&id| decode(&c, id) == (0, 1, decode(&c, id).2)));
    }
}

#[test]
fn samples_per_epoch_fixes_the_length_and_parts_start_over() {
    let c = config(
        vec![map(10), map(1000)],
        &[0.5, 0.5],
        Stop::Samples(400),
        16,
    );
    for world in [1, 2, 4] {
        let plan = MixPlan::new(&on(&c, 0, world), 0, &[], 0).unwrap();
        assert_eq!(plan.samples(), 400 / world);
        assert_eq!(plan.batches(), (400 / world).div_ceil(16));
        let ids = world_ids(&c, world);
        let all: Vec<u64> = ids.iter().flatten().copied().collect();
        assert_eq!(all.len() as u64, 400 / world * world);
        assert_eq!(all.iter().collect::<HashSet<_>>().len(), all.len());
        // Each pass of the small part is every rank's share, in a new order.
        let passes: Vec<Vec<u64>> = (0..3)
            .map(|q| {
                ids[0]
                    .iter()
                    .map(|&id| decode(&c, id))
                    .filter(|&(k, pass, _)| k == 0 && pass == q)
                    .map(|(_, _, i)| i)
                    .collect()
            })
            .collect();
        assert_eq!(passes[0].len() as u64, 10 / world);
        if world == 1 {
            assert_ne!(passes[0], passes[1], "each pass reshuffled");
        }
    }
    let drop = MixConfig {
        drop_last: true,
        ..c.clone()
    };
    let plan = MixPlan::new(&drop, 0, &[], 0).unwrap();
    assert_eq!((plan.batches(), plan.batch_len(24)), (25, 16));
    let plan = MixPlan::new(&c, 0, &[], 0).unwrap();
    assert_eq!((plan.batches(), plan.batch_len(24)), (25, 16));
    let c = MixConfig {
        stop: Stop::Samples(390),
        ..c
    };
    let plan = MixPlan::new(&c, 0, &[], 0).unwrap();
    assert_eq!((plan.batches(), plan.batch_len(24)), (25, 6));
    let plan = MixPlan::new(
        &MixConfig {
            drop_last: true,
            ..c
        },
        0,
        &[],
        0,
    )
    .unwrap();
    assert_eq!(plan.batches(), 24);
}

#[test]
fn a_resumed_plan_yields_what_the_whole_one_yields_from_there() {
    let c = config(
        vec![sharded(&[31, 17, 40], 12), map(77)],
        &[0.3, 0.7],
        Stop::Longest,
        6,
    );
    let plan = MixPlan::new(&on(&c, 1, 2), 2, &[], 0).unwrap();
    let whole: Vec<Group> = plan.groups().collect();
    for start in [1, 5, whole.len() as u64 - 1, whole.len() as u64] {
        let resumed = MixPlan::new(&on(&c, 1, 2), 2, &[], start).unwrap();
        assert_eq!(
            resumed.groups().collect::<Vec<_>>(),
            whole[start as usize..]
        );
        let again = plan.resumed(start).unwrap();
        assert_eq!(again.groups().collect::<Vec<_>>(), whole[start as usize..]);
    }
    assert!(MixPlan::new(&on(&c, 1, 2), 2, &[], whole.len() as u64 + 1).is_err());
}

/// An epoch run `done` batches on each world of `worlds` in turn (the
/// last one to the end): every id drawn, by world.
fn elastic(c: &MixConfig, worlds: &[(u64, u64)]) -> Vec<Vec<u64>> {
    let mut history = Vec::new();
    let mut out = Vec::new();
    for (i, &(world, done)) in worlds.iter().enumerate() {
        let last = i + 1 == worlds.len();
        let mut ids = Vec::new();
        for rank in 0..world {
            let plan = MixPlan::new(&on(c, rank, world), 1, &history, 0).unwrap();
            let end = if last { plan.batches() } else { done };
            assert!(end <= plan.batches());
            ids.extend((0..end).flat_map(|b| plan.batch(b)));
        }
        out.push(ids);
        history.push(Segment {
            world_size: world,
            batches_done: done,
        });
    }
    out
}

#[test]
fn an_elastic_resume_repeats_nothing_and_loses_little() {
    let parts = vec![map(500), sharded(&[100, 60, 140, 100], 32), map(300)];
    let c = config(parts, &[0.5, 0.3, 0.2], Stop::Shortest, 8);
    let whole: usize = elastic(&c, &[(4, 0)]).concat().len();
    for worlds in [
        vec![(4, 5), (3, 0)],
        vec![(2, 7), (5, 2), (3, 0)],
        vec![(1, 20), (4, 0)],
    ] {
        let ids = elastic(&c, &worlds).concat();
        let set: HashSet<u64> = ids.iter().copied().collect();
        assert_eq!(set.len(), ids.len(), "{worlds:?}: a sample twice");
        assert!(
            ids.iter().all(|&id| id < c.total()),
            "{worlds:?}: a second pass"
        );
        // What a world leaves at the end of a pass (fewer than its ranks,
        // per part) and its last partial batch are all that may be lost.
        let slack = worlds.iter().map(|&(w, _)| 3 * w + 8 * w).sum::<u64>() as usize;
        assert!(
            ids.len() + slack >= whole,
            "{worlds:?}: {} of {whole}",
            ids.len()
        );
    }
}

#[test]
fn an_elastic_resume_with_passes_keeps_every_part_whole() {
    let c = config(
        vec![map(30), sharded(&[50, 50, 50, 50], 20)],
        &[0.5, 0.5],
        Stop::Longest,
        4,
    );
    let ids = elastic(&c, &[(2, 9), (3, 0)]).concat();
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), ids.len());
    // The long part's first pass: nothing twice, nothing lost but what the
    // worlds' remainders leave.
    let long: Vec<u64> = ids
        .iter()
        .map(|&id| decode(&c, id))
        .filter(|&(k, pass, _)| k == 1 && pass == 0)
        .map(|(_, _, i)| i)
        .collect();
    assert!(long.len() >= 200 - 2 - 3, "{}", long.len());
}

#[test]
fn a_history_that_does_not_fit_is_refused() {
    let c = config(vec![map(40), map(40)], &[1.0, 1.0], Stop::Shortest, 4);
    let plan = MixPlan::new(&on(&c, 0, 2), 0, &[], 0).unwrap();
    let past = Segment {
        world_size: 2,
        batches_done: plan.batches() + 1,
    };
    assert!(matches!(
        MixPlan::new(&c, 0, &[past], 0),
        Err(MixError::BadHistory { segment: 0, .. })
    ));
    let zero = Segment {
        world_size: 0,
        batches_done: 1,
    };
    assert!(matches!(
        MixPlan::new(&c, 0, &[zero], 0),
        Err(MixError::Plan(PlanError::ZeroWorldSize))
    ));
    // The whole epoch done on one world: nothing left on the next.
    let all = Segment {
        world_size: 2,
        batches_done: plan.batches(),
    };
    let after = MixPlan::new(&on(&c, 0, 3), 0, &[all], 0).unwrap();
    assert_eq!(after.batches(), 0);
}

#[test]
fn bad_weights_and_parts_are_refused() {
    let c = |weights: &[f64], parts: Vec<Part>| {
        MixPlan::new(&config(parts, weights, Stop::Shortest, 2), 0, &[], 0)
    };
    assert!(matches!(c(&[], vec![]), Err(MixError::NoParts)));
    assert!(matches!(
        c(&[1.0], vec![map(3), map(3)]),
        Err(MixError::WeightCount {
            weights: 1,
            parts: 2
        })
    ));
    assert!(matches!(
        c(&[1.0, -0.5], vec![map(3), map(3)]),
        Err(MixError::BadWeight { part: 1, .. })
    ));
    assert!(matches!(
        c(&[f64::NAN, 1.0], vec![map(3), map(3)]),
        Err(MixError::BadWeight { part: 0, .. })
    ));
    assert!(matches!(
        c(&[f64::INFINITY, 1.0], vec![map(3), map(3)]),
        Err(MixError::BadWeight { part: 0, .. })
    ));
    assert!(matches!(
        c(&[0.0, 0.0], vec![map(3), map(3)]),
        Err(MixError::AllZero)
    ));
    assert!(matches!(
        c(&[1e-15, 1.0], vec![map(3), map(3)]),
        Err(MixError::WeightTooSmall { part: 0, .. })
    ));
    assert!(matches!(
        c(&[1.0, 1.0], vec![map(3), map(0)]),
        Err(MixError::EmptyPart { part: 1 })
    ));
    // An empty part left out by its weight is no trouble.
    assert!(c(&[1.0, 0.0], vec![map(3), map(0)]).is_ok());
    // A part that must start over with fewer samples than ranks.
    let small = MixConfig {
        world_size: 4,
        ..config(vec![map(3), map(100)], &[1.0, 1.0], Stop::Longest, 2)
    };
    assert!(matches!(
        MixPlan::new(&small, 0, &[], 0),
        Err(MixError::TooFewSamples { part: 0, .. })
    ));
    let zero = config(vec![map(3)], &[1.0], Stop::Samples(0), 2);
    assert!(matches!(
        MixPlan::new(&zero, 0, &[], 0),
        Err(MixError::ZeroSamples)
    ));
    let huge = config(vec![map(1 << 49)], &[1.0], Stop::Shortest, 2);
    assert!(matches!(
        MixPlan::new(&huge, 0, &[], 0),
        Err(MixError::TooLarge { .. })
    ));
}

#[test]
fn huge_parts_resume_anywhere_without_a_replay() {
    // 10^8 and 10^12 samples: the plan is arithmetic, resumed near the end.
    for len in [100_000_000, 1_000_000_000_000] {
        let c = config(
            vec![map(len), map(len / 3)],
            &[0.5, 0.5],
            Stop::Shortest,
            256,
        );
        let plan = MixPlan::new(&on(&c, 3, 8), 9, &[], 0).unwrap();
        let last = plan.batches() - 1;
        let resumed = MixPlan::new(&on(&c, 3, 8), 9, &[], last).unwrap();
        let ids: Vec<u64> = resumed.groups().flat_map(|g| g.ids).collect();
        assert_eq!(ids, plan.batch(last));
        assert!(ids.iter().all(|&id| id < c.total()));
        // Elastic too: half the epoch on 8 ranks, the rest on 5.
        let history = [Segment {
            world_size: 8,
            batches_done: plan.batches() / 2,
        }];
        let after = MixPlan::new(&on(&c, 4, 5), 9, &history, 0).unwrap();
        assert!(after.batches() > 0);
        assert_eq!(
            after.batch(after.batches() - 1).len() as u64,
            after.batch_len(after.batches() - 1)
        );
    }
}

#[test]
fn the_draws_are_pinned() {
    // Part of ferrofeed's reproducibility promise: changing these values
    // changes every mixture's order.
    let c = config(vec![map(1000), map(1000)], &[0.7, 0.3], Stop::Shortest, 8);
    let plan = MixPlan::new(&c, 0, &[], 0).unwrap();
    assert_eq!(
        parts_at(&plan, 0, 20),
        vec![0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0]
    );
    assert_eq!(plan.batch(0), vec![635, 1801, 432, 464, 1656, 7, 62, 1799]);
    let other = MixPlan::new(&MixConfig { seed: 1, ..c }, 3, &[], 0).unwrap();
    assert_eq!(
        parts_at(&other, 0, 12),
        vec![0, 0, 1, 0, 0, 0, 1, 0, 0, 1, 0, 0]
    );
}
