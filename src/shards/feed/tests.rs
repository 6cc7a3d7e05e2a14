use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::*;
use crate::plan::ShardPlanConfig;
use crate::shards::jsonl::JsonLinesFormat;
use crate::shards::{lock_entry, Value};

/// JSON lines shards of `counts` samples under `dir`, sample `i` (by global
/// id) the number `i`.
fn shards(dir: &Path, counts: &[u64]) -> Vec<PathBuf> {
    let mut next = 0;
    counts
        .iter()
        .enumerate()
        .map(|(s, &n)| {
            let path = dir.join(format!("shard-{s}.jsonl"));
            let lines: Vec<String> = (next..next + n).map(|i| i.to_string()).collect();
            next += n;
            std::fs::write(&path, lines.join("\n") + "\n").unwrap();
            path
        })
        .collect()
}

fn feed(paths: Vec<PathBuf>) -> Arc<WindowFeed> {
    let set = ShardSet::new(Arc::new(JsonLinesFormat), paths, None, None).unwrap();
    Arc::new(WindowFeed::new(Arc::new(set)))
}

/// A feed of shards of `counts` samples in a folder of their own (kept as
/// long as the folder), and the plan of `epoch` over them from `start`.
fn fixture(
    counts: &[u64],
    epoch: u64,
    start: u64,
) -> (tempfile::TempDir, Arc<WindowFeed>, ShardPlan) {
    let dir = tempfile::tempdir().unwrap();
    let feed = feed(shards(dir.path(), counts));
    let plan = ShardPlan::new(&config(counts), epoch, &[], start).unwrap();
    (dir, feed, plan)
}

fn config(counts: &[u64]) -> ShardPlanConfig {
    ShardPlanConfig {
        counts: counts.to_vec(),
        batch_size: 4,
        shuffle: true,
        seed: 11,
        window: 8,
        ..ShardPlanConfig::default()
    }
}

/// The value of sample `id` of `window`.
fn value(window: &Window, id: u64) -> Result<i64, String> {
    let (_, entry) = window.entry(id).ok_or("not in the window")?;
    match &*lock_entry(entry) {
        Ok(sample) => match sample.fields.as_slice() {
            [(_, Value::Int(v))] => Ok(*v),
            other => Err(format!("{other:?}")),
        },
        Err(e) => Err(e.to_string()),
    }
}

/// Every batch of an epoch, checked against its plan: `(batch_no, ids)`.
fn run(epoch: EpochWindows) -> Vec<(u64, Vec<u64>)> {
    let plan = epoch.plan().clone();
    let mut got = Vec::new();
    for batch in epoch {
        let batch = batch.unwrap();
        assert_eq!(batch.ids, plan.batch(batch.batch_no));
        assert_eq!(batch.window_no, plan.window_of(batch.batch_no));
        for &id in &batch.ids {
            assert_eq!(value(&batch.window, id), Ok(id.cast_signed()));
        }
        got.push((batch.batch_no, batch.ids));
    }
    got
}

#[test]
fn an_epoch_yields_every_batch_of_its_plan_with_its_samples() {
    let (_dir, feed, plan) = fixture(&[5, 9, 3, 12], 0, 0);
    let batches = run(feed.epoch(plan.clone(), true).unwrap());
    let expected: Vec<(u64, Vec<u64>)> = (0..plan.batches()).map(|j| (j, plan.batch(j))).collect();
    assert_eq!(batches, expected);
    let mut ids: Vec<u64> = batches.into_iter().flat_map(|(_, ids)| ids).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..29).collect::<Vec<_>>());
}

#[test]
fn the_next_epochs_first_window_is_read_once_ahead_and_taken() {
    let dir = tempfile::tempdir().unwrap();
    let counts = [5, 9, 3, 12];
    let feed = feed(shards(dir.path(), &counts));
    let plan = |e| ShardPlan::new(&config(&counts), e, &[], 0).unwrap();
    run(feed.epoch(plan(0), true).unwrap());
    assert_eq!(feed.reads(), plan(0).windows() + 1);
    assert_eq!(feed.ahead(), Some(plan(1).window_pieces(0)));
    run(feed.epoch(plan(1), true).unwrap());
    // Epoch 1's first window was not read again; epoch 2's was read ahead.
    assert_eq!(feed.reads(), plan(0).windows() + plan(1).windows() + 1);
    assert_eq!(feed.ahead(), Some(plan(2).window_pieces(0)));
    // A pass that does not read ahead leaves none; an epoch whose first window is not
    // the one read ahead reads its own (and the one read ahead is dropped).
    let other = feed.epoch(plan(5), false).unwrap();
    assert_eq!(feed.ahead(), None);
    run(other);
    assert_eq!(feed.ahead(), None);
}

#[test]
fn an_epoch_from_a_resume_point_starts_there() {
    let (_dir, feed, plan) = fixture(&[5, 9, 3, 12], 3, 4);
    let batches = run(feed.epoch(plan.clone(), true).unwrap());
    assert_eq!(batches.first().map(|b| b.0), Some(4));
    assert_eq!(batches.len() as u64, plan.batches() - 4);
}

#[test]
fn an_epoch_dropped_early_cancels_its_reads_and_the_feed_goes_on() {
    let (_dir, feed, plan) = fixture(&[40, 40], 0, 0);
    let mut epoch = feed.epoch(plan.clone(), true).unwrap();
    epoch.next().unwrap().unwrap();
    drop(epoch);
    // Not read ahead: the epoch ended before its last window.
    assert_eq!(feed.ahead(), None);
    assert_eq!(
        run(feed.epoch(plan.clone(), true).unwrap()).len() as u64,
        plan.batches()
    );
}

#[test]
fn a_missing_shard_is_its_samples_errors_and_the_epoch_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let counts = [4, 4];
    let paths = shards(dir.path(), &counts);
    std::fs::remove_file(&paths[1]).unwrap();
    let feed = feed(paths);
    let plan = ShardPlan::new(
        &ShardPlanConfig {
            shuffle: false,
            ..config(&counts)
        },
        0,
        &[],
        0,
    )
    .unwrap();
    let mut seen = Vec::new();
    for batch in feed.epoch(plan, true).unwrap() {
        let batch = batch.unwrap();
        for id in batch.ids {
            seen.push((id, value(&batch.window, id)));
        }
    }
    assert_eq!(seen.len(), 8);
    for (id, v) in seen {
        if id < 4 {
            assert_eq!(v, Ok(id.cast_signed()));
        } else {
            let e = v.unwrap_err();
            assert!(e.contains("shard-1.jsonl"), "{e}");
        }
    }
}

#[test]
fn a_plan_of_other_shards_and_bad_pieces_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let feed = feed(shards(dir.path(), &[4, 4]));
    let plan = ShardPlan::new(&config(&[4, 4, 4]), 0, &[], 0).unwrap();
    let e = feed.epoch(plan, true).err().unwrap();
    assert!(
        matches!(
            e,
            FeedError::Plan {
                counts: 3,
                shards: 2
            }
        ),
        "{e}"
    );
    let piece = Piece {
        shard: 2,
        lo: 0,
        hi: 1,
    };
    let e = feed.set().read(&[piece], &[0]).err().unwrap();
    assert_eq!(e.to_string(), "no piece 0..1 of shard 2 (of 2)");
    let e = feed.set().read(&[], &[0]).err().unwrap();
    assert!(
        matches!(e, ShardSetError::FirstIds { ids: 1, pieces: 0 }),
        "{e}"
    );
    let e = ShardSet::new(
        Arc::new(JsonLinesFormat),
        vec![PathBuf::from("a")],
        None,
        Some(vec![None, None]),
    )
    .err()
    .unwrap();
    assert!(
        matches!(
            e,
            ShardSetError::Offsets {
                offsets: 2,
                shards: 1
            }
        ),
        "{e}"
    );
}

#[test]
fn a_window_says_which_samples_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let feed = feed(shards(dir.path(), &[4, 4]));
    let pieces = [
        Piece {
            shard: 1,
            lo: 1,
            hi: 3,
        },
        Piece {
            shard: 0,
            lo: 0,
            hi: 2,
        },
    ];
    let window = feed.set().read(&pieces, &[5, 0]).unwrap();
    assert_eq!(window.len(), 4);
    assert!(!window.is_empty());
    let held: Vec<Result<i64, String>> =
        [5, 6, 0, 1].iter().map(|&id| value(&window, id)).collect();
    assert_eq!(held, [Ok(5), Ok(6), Ok(0), Ok(1)]);
    for id in [2, 4, 7] {
        assert!(window.entry(id).is_none(), "{id}");
    }
    let (path, _) = window.entry(5).unwrap();
    assert!(path.ends_with("shard-1.jsonl"));
}
