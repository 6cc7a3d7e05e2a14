use super::*;
use crate::plan::Group;
use std::collections::BTreeSet;

fn config(counts: &[u64], batch: u64, window: u64, world: u64, rank: u64) -> ShardPlanConfig {
    ShardPlanConfig {
        counts: counts.to_vec(),
        batch_size: batch,
        shuffle: true,
        seed: 7,
        rank,
        world_size: world,
        drop_last: false,
        window,
    }
}

fn all_batches(c: &ShardPlanConfig, epoch: u64, history: &[Segment], start: u64) -> Vec<Vec<u64>> {
    ShardPlan::new(c, epoch, history, start)
        .unwrap()
        .groups()
        .map(|g| g.ids)
        .collect()
}

/// `c` for each rank of a world of `world` ranks.
fn ranks(c: &ShardPlanConfig, world: u64) -> impl Iterator<Item = ShardPlanConfig> + '_ {
    (0..world).map(move |rank| ShardPlanConfig {
        rank,
        world_size: world,
        ..c.clone()
    })
}

/// Every rank's batches of one world, from `start`.
fn world(c: &ShardPlanConfig, world: u64, history: &[Segment], start: u64) -> Vec<Vec<Vec<u64>>> {
    ranks(c, world)
        .map(|c| all_batches(&c, 3, history, start))
        .collect()
}

#[test]
fn every_sample_once_and_ranks_in_lockstep() {
    for counts in [
        vec![5, 9, 1, 13, 7],
        vec![3],
        vec![100],
        vec![2, 2, 2, 2, 2, 2, 2],
    ] {
        for world in 1..=5 {
            for batch in 2..=4 {
                for window in [1, 4, 8, 64] {
                    let c = config(&counts, batch, window, world, 0);
                    let total = c.total();
                    let ranks = world_ids(&c, world);
                    let Some(ranks) = ranks else {
                        // Refused: fewer samples than batches on a rank.
                        assert!(total / world < total.div_ceil(world).div_ceil(batch));
                        continue;
                    };
                    let n = ranks[0].len();
                    assert!(ranks.iter().all(|r| r.len() == n), "lockstep");
                    let mut seen: Vec<u64> = ranks.iter().flatten().flatten().copied().collect();
                    seen.sort_unstable();
                    assert_eq!(seen, (0..total).collect::<Vec<_>>());
                    for b in ranks.iter().flatten() {
                        assert!(!b.is_empty() && b.len() as u64 <= batch);
                    }
                }
            }
        }
    }
}

fn world_ids(c: &ShardPlanConfig, world: u64) -> Option<Vec<Vec<Vec<u64>>>> {
    ranks(c, world)
        .map(|c| match ShardPlan::new(&c, 0, &[], 0) {
            Ok(p) => Some(p.groups().map(|g| g.ids).collect()),
            Err(ShardPlanError::Uneven { .. }) => None,
            Err(e) => panic!("{e}"),
        })
        .collect()
}

#[test]
fn drop_last_gives_full_batches() {
    let c = ShardPlanConfig {
        drop_last: true,
        ..config(&[5, 9, 1, 13, 7], 4, 8, 3, 0)
    };
    let ranks = world(&c, 3, &[], 0);
    for r in &ranks {
        assert_eq!(r.len(), (35 / 3) / 4);
        assert!(r.iter().all(|b| b.len() == 4));
    }
    let seen: BTreeSet<u64> = ranks.iter().flatten().flatten().copied().collect();
    assert_eq!(seen.len(), 3 * 2 * 4);
}

#[test]
fn resume_at_every_batch_is_the_rest() {
    let c = config(&[5, 9, 1, 13, 7, 20], 3, 6, 2, 1);
    let full = all_batches(&c, 1, &[], 0);
    for start in 0..=full.len() as u64 {
        assert_eq!(all_batches(&c, 1, &[], start), full[start as usize..]);
    }
}

#[test]
fn elastic_resume_reads_every_remaining_sample_once() {
    let counts = [5, 9, 1, 13, 7, 20, 11, 4];
    let total: u64 = counts.iter().sum();
    for (w1, w2, w3) in [(2, 3, 1), (4, 1, 2), (3, 3, 5), (1, 4, 4)] {
        for batch in [2, 3] {
            for window in [3, 10] {
                let c = config(&counts, batch, window, 1, 0);
                let first = world(&c, w1, &[], 0);
                let n1 = first[0].len() as u64;
                for done1 in [0, 1, n1 / 2, n1] {
                    let h1 = [Segment::new(w1, done1)];
                    let second = world(&c, w2, &h1, 0);
                    let n2 = second[0].len() as u64;
                    let done2 = n2 / 3;
                    let h2 = [h1[0], Segment::new(w2, done2)];
                    let third = world(&c, w3, &h2, 0);
                    let mut seen: Vec<u64> = Vec::new();
                    for r in &first {
                        seen.extend(r[..done1 as usize].iter().flatten());
                    }
                    for r in &second {
                        seen.extend(r[..done2 as usize].iter().flatten());
                    }
                    for r in &third {
                        seen.extend(r.iter().flatten());
                        assert_eq!(r.len(), third[0].len(), "lockstep");
                    }
                    seen.sort_unstable();
                    assert_eq!(
                        seen,
                        (0..total).collect::<Vec<_>>(),
                        "{w1} {w2} {w3} {batch} {window} {done1}"
                    );
                }
            }
        }
    }
}

#[test]
fn same_world_resume_through_history_is_not_exact_but_complete() {
    // The loader resumes a same-world run at its batch (exact); the
    // history is only for a change of world. Check the batch count.
    let c = config(&[10, 10], 2, 4, 1, 0);
    let p = ShardPlan::new(&c, 0, &[Segment::new(1, 4)], 0).unwrap();
    assert_eq!(p.batches(), 6);
    assert_eq!(p.remaining_samples(), 12);
}

#[test]
fn a_history_past_its_end_is_refused() {
    let c = config(&[10, 10], 2, 4, 1, 0);
    let e = ShardPlan::new(&c, 0, &[Segment::new(2, 6)], 0).unwrap_err();
    assert!(
        matches!(e, ShardPlanError::BadHistory { len: 5, .. }),
        "{e}"
    );
}

#[test]
fn windows_hold_the_batches_and_pieces_cover_them() {
    let c = config(&[5, 9, 1, 13, 7, 20], 4, 8, 2, 1);
    let p = ShardPlan::new(&c, 2, &[], 0).unwrap();
    let offsets: Vec<u64> = c
        .counts
        .iter()
        .scan(0, |a, &n| {
            let o = *a;
            *a += n;
            Some(o)
        })
        .collect();
    for Group { batch_no: j, ids } in p.groups() {
        let w = p.window_of(j);
        let pieces = p.window_pieces(w);
        let held: usize = pieces.iter().map(|x| (x.hi - x.lo) as usize).sum();
        assert!(held as u64 <= p.window());
        for id in ids {
            assert!(
                pieces
                    .iter()
                    .any(|x| (offsets[x.shard] + x.lo..offsets[x.shard] + x.hi).contains(&id)),
                "batch {j}: {id} not in window {w}'s pieces {pieces:?}"
            );
        }
    }
}

#[test]
fn ranks_read_contiguous_ranges_of_the_stream() {
    // Each rank's pieces together are at most two partial shards plus
    // whole ones: it reads about its share of the bytes.
    let counts = vec![10; 12];
    for world in [2, 3, 5] {
        let mut pieces_total = 0;
        for rank in 0..world {
            let c = config(&counts, 4, 1000, world, rank);
            let p = ShardPlan::new(&c, 0, &[], 0).unwrap();
            let pieces: Vec<Piece> = (0..p.windows()).flat_map(|w| p.window_pieces(w)).collect();
            let partial = pieces.iter().filter(|x| x.hi - x.lo != 10).count();
            assert!(partial <= 2, "{pieces:?}");
            pieces_total += pieces.iter().map(|x| x.hi - x.lo).sum::<u64>();
        }
        assert_eq!(pieces_total, 120);
    }
}

#[test]
fn a_batch_mixes_shards_and_the_order_follows_the_epoch() {
    let c = config(&[16; 8], 8, 64, 1, 0);
    let e0 = all_batches(&c, 0, &[], 0);
    let e1 = all_batches(&c, 1, &[], 0);
    assert_ne!(e0, e1);
    assert_eq!(e0, all_batches(&c, 0, &[], 0));
    let shards: BTreeSet<u64> = e0[0].iter().map(|id| id / 16).collect();
    assert!(shards.len() >= 3, "{shards:?}");
}

#[test]
fn without_shuffle_the_order_is_stored_order() {
    let c = ShardPlanConfig {
        shuffle: false,
        ..config(&[3, 4, 5], 2, 4, 1, 0)
    };
    let flat: Vec<u64> = all_batches(&c, 9, &[], 0).into_iter().flatten().collect();
    assert_eq!(flat, (0..12).collect::<Vec<_>>());
}

#[test]
fn refusals() {
    let c = config(&[5], 1, 4, 2, 0);
    assert!(matches!(
        ShardPlan::new(&c, 0, &[], 0),
        Err(ShardPlanError::Uneven { .. })
    ));
    let c = ShardPlanConfig {
        drop_last: true,
        ..c
    };
    assert_eq!(ShardPlan::new(&c, 0, &[], 0).unwrap().batches(), 2);
    let c = config(&[5], 2, 4, 2, 2);
    assert!(matches!(
        ShardPlan::new(&c, 0, &[], 0),
        Err(ShardPlanError::Plan(PlanError::RankOutOfRange { .. }))
    ));
    let c = config(&[5], 2, 4, 1, 0);
    assert!(matches!(
        ShardPlan::new(&c, 0, &[], 4),
        Err(ShardPlanError::Plan(PlanError::StartPastEnd { .. }))
    ));
    let empty = config(&[], 2, 4, 3, 1);
    assert_eq!(ShardPlan::new(&empty, 0, &[], 0).unwrap().batches(), 0);
}
