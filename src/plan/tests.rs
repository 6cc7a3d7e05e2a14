//! Both plans through the one trait: what every [`Plan`] promises.

use super::*;

/// The plans of every rank of one world (`ranks[r]` is rank `r`'s), with
/// `drop_last` off: ranks step in lockstep, batches are numbered in order
/// and as long as [`Plan::batch_len`] says, each rank's batches hold its
/// [`Plan::samples_per_rank`], and together they cover `0..n`: each sample
/// exactly once when the shares add up to `n`, else (the map-style plan's
/// padding) at least once, the padding's samples twice or more.
fn covers_every_sample<P: Plan>(ranks: &[P], n: u64, what: &str) {
    let batches = ranks[0].batches();
    let mut seen = vec![0_u64; usize::try_from(n).unwrap()];
    let mut held = 0;
    for plan in ranks {
        assert_eq!(plan.batches(), batches, "{what}: lockstep");
        assert_eq!(plan.batches_per_pass(), batches, "{what}: one pass");
        let mut yielded = 0;
        for (k, group) in plan.groups().enumerate() {
            assert_eq!(group.batch_no, k as u64, "{what}");
            assert_eq!(group.ids.len() as u64, plan.batch_len(group.batch_no));
            assert_eq!(plan.group(group.batch_no), group, "{what}");
            for id in group.ids {
                seen[usize::try_from(id).unwrap()] += 1;
                yielded += 1;
            }
        }
        assert_eq!(yielded, plan.samples_per_rank(), "{what}");
        held += plan.samples_per_rank();
    }
    if held == n {
        assert!(seen.iter().all(|&s| s == 1), "{what}: {seen:?}");
    } else {
        assert!(held > n, "{what}: {held} of {n}");
        assert!(seen.iter().all(|&s| s >= 1), "{what}: {seen:?}");
        assert_eq!(seen.iter().sum::<u64>(), held, "{what}");
    }
}

/// Resuming `plan` at each of its batches yields the tail of the whole
/// epoch's groups, and no further than its end.
fn resumes_to_the_tail<P: Plan>(plan: &P, what: &str) {
    let batches = plan.batches();
    let whole: Vec<Group> = plan.resumed(0).unwrap().groups().collect();
    assert_eq!(whole.len() as u64, batches, "{what}");
    for k in 0..=batches {
        let from = plan.resumed(k).unwrap();
        assert_eq!(
            (from.epoch(), from.batches(), from.start()),
            (plan.epoch(), batches, k),
            "{what}"
        );
        assert_eq!(from.remaining(), batches - k, "{what}");
        let rest: Vec<Group> = from.groups().collect();
        assert_eq!(from.groups().len(), rest.len(), "{what}");
        assert_eq!(
            rest,
            whole[usize::try_from(k).unwrap()..],
            "{what} from {k}"
        );
    }
    assert_eq!(
        plan.resumed(batches + 1).err(),
        Some(PlanError::StartPastEnd {
            start: batches + 1,
            len: batches
        }),
        "{what}"
    );
}

fn map_plans(
    len: u64,
    batch_size: u64,
    world_size: u64,
    shuffle: bool,
    epoch: u64,
) -> Vec<EpochPlan> {
    (0..world_size)
        .map(|rank| {
            let config = PlanConfig {
                len,
                batch_size,
                shuffle,
                seed: 3,
                rank,
                world_size,
                ..PlanConfig::default()
            };
            EpochPlan::new(config, epoch, 0).unwrap()
        })
        .collect()
}

/// Every rank's sharded plan, or `None` where the split is refused (fewer
/// samples on a rank than batches).
fn sharded_plans(
    counts: &[u64],
    batch_size: u64,
    world_size: u64,
    window: u64,
    shuffle: bool,
    history: &[Segment],
) -> Option<Vec<ShardPlan>> {
    (0..world_size)
        .map(|rank| {
            let config = ShardPlanConfig {
                counts: counts.to_vec(),
                batch_size,
                shuffle,
                seed: 3,
                rank,
                world_size,
                drop_last: false,
                window,
            };
            match ShardPlan::new(&config, 1, history, 0) {
                Ok(plan) => Some(plan),
                Err(ShardPlanError::Uneven { .. }) => None,
                Err(e) => panic!("{e}"),
            }
        })
        .collect()
}

#[test]
fn both_plans_cover_every_sample_and_resume_to_the_tail() {
    let mut planned = [0, 0];
    for shuffle in [false, true] {
        for world_size in [1, 2, 3, 5] {
            for batch_size in [1, 3, 4] {
                for len in [0, 1, 7, 10, 30, 33] {
                    for epoch in [0, 2] {
                        let what = format!("map {len} {batch_size} {world_size} {shuffle}");
                        let ranks = map_plans(len, batch_size, world_size, shuffle, epoch);
                        covers_every_sample(&ranks, len, &what);
                        for plan in &ranks {
                            resumes_to_the_tail(plan, &what);
                        }
                        planned[0] += 1;
                    }
                }
                for counts in [&[5, 9, 1, 13, 7][..], &[3], &[2; 7], &[]] {
                    for window in [1, 4, 64] {
                        let n = counts.iter().sum();
                        let what = format!("sharded {counts:?} {batch_size} {world_size} {window}");
                        let Some(ranks) =
                            sharded_plans(counts, batch_size, world_size, window, shuffle, &[])
                        else {
                            continue;
                        };
                        covers_every_sample(&ranks, n, &what);
                        for plan in &ranks {
                            resumes_to_the_tail(plan, &what);
                        }
                        planned[1] += 1;
                    }
                }
            }
        }
    }
    // Enough of each kind got past the refusals to mean something.
    assert!(planned.iter().all(|&k| k > 100), "{planned:?}");
}

#[test]
fn the_map_plans_shares_are_exact_when_the_world_divides_the_data() {
    // No padding: the one case where the map-style plan reads each sample
    // once without drop_last, as the sharded plan always does.
    for world_size in [1, 2, 3, 5] {
        let ranks = map_plans(30, 4, world_size, true, 1);
        let held: u64 = ranks.iter().map(Plan::samples_per_rank).sum();
        assert_eq!(held, 30);
        covers_every_sample(&ranks, 30, "exact");
    }
}

#[test]
fn an_elastic_resume_resumes_to_the_tail_too() {
    let history = [Segment::new(2, 3)];
    let ranks = sharded_plans(&[5, 9, 1, 13, 7], 2, 3, 4, true, &history).unwrap();
    for plan in &ranks {
        resumes_to_the_tail(plan, "elastic");
    }
    // The resumed plan keeps its history: it is the plan made at that start.
    let config = ShardPlanConfig {
        counts: vec![5, 9, 1, 13, 7],
        batch_size: 2,
        shuffle: true,
        seed: 3,
        rank: 2,
        world_size: 3,
        drop_last: false,
        window: 4,
    };
    assert_eq!(
        ranks[2].resumed(2),
        ShardPlan::new(&config, 1, &history, 2).map_err(|e| match e {
            ShardPlanError::Plan(e) => e,
            e => panic!("{e}"),
        })
    );
}

#[test]
fn resumed_is_the_plan_made_at_that_start() {
    let config = PlanConfig {
        len: 33,
        batch_size: 4,
        shuffle: true,
        seed: 9,
        rank: 1,
        world_size: 2,
        drop_last: false,
        batches_per_epoch: Some(7),
    };
    let plan = EpochPlan::new(config, 3, 0).unwrap();
    for k in 0..=7 {
        assert_eq!(plan.resumed(k), EpochPlan::new(config, 3, k));
    }
}

#[test]
fn one_generic_function_reads_either_plan() {
    fn tail(plan: &impl Plan) -> (u64, u64, Vec<Vec<u64>>) {
        let ids = plan.groups().map(|g| g.ids).collect();
        (plan.batches(), plan.remaining(), ids)
    }
    let map = EpochPlan::new(
        PlanConfig {
            len: 5,
            batch_size: 2,
            ..PlanConfig::default()
        },
        0,
        1,
    )
    .unwrap();
    let config = ShardPlanConfig {
        counts: vec![2, 3],
        batch_size: 2,
        ..ShardPlanConfig::default()
    };
    let sharded = ShardPlan::new(&config, 0, &[], 1).unwrap();
    let expected = (3, 2, vec![vec![2, 3], vec![4]]);
    assert_eq!(tail(&map), expected);
    assert_eq!(tail(&sharded), expected);
}

#[test]
fn split_is_the_one_rank_arithmetic() {
    for samples in 0..40 {
        for world_size in 1..6 {
            for batch_size in 1..5 {
                for drop_last in [false, true] {
                    let split = Split {
                        samples,
                        batch_size,
                        world_size,
                        drop_last,
                    };
                    assert!(split.least() <= split.most());
                    assert!(split.most() - split.least() <= 1);
                    assert!(split.least() * world_size <= samples);
                    assert!(split.most() * world_size >= samples);
                    let full = split.per_rank() / batch_size;
                    assert_eq!(
                        split.batches(),
                        full + u64::from(
                            !drop_last && !split.per_rank().is_multiple_of(batch_size)
                        )
                    );
                }
            }
        }
    }
}
