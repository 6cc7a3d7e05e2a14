//! Tests of the engine with plain Rust items.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;

type P = Pipeline<u64, String>;

fn map(
    name: &str,
    work: Work<u64, String>,
    concurrency: usize,
    ordered: bool,
) -> Stage<u64, String> {
    Stage::Map(MapStage {
        name: name.into(),
        work,
        concurrency,
        ordered,
        on_error: ErrorPolicy::Raise,
    })
}

fn with_policy(stage: Stage<u64, String>, policy: ErrorPolicy) -> Stage<u64, String> {
    match stage {
        Stage::Map(mut m) => {
            m.on_error = policy;
            Stage::Map(m)
        }
        s @ Stage::Aggregate(_) => s,
    }
}

fn source(n: u64) -> IterSource<impl Iterator<Item = Result<u64, String>> + Send> {
    IterSource((0..n).map(Ok))
}

fn drain(p: &mut P) -> Result<Vec<u64>, Failure<String>> {
    let mut out = Vec::new();
    loop {
        match p.next_timeout(Duration::from_secs(10)) {
            Next::Item(x) => out.push(x),
            Next::Finished => return Ok(out),
            Next::Failed(f) => return Err(f),
            Next::Timeout => panic!("pipeline stalled"),
        }
    }
}

/// A deterministic pseudo-random delay per item.
fn jitter(x: u64) -> Duration {
    Duration::from_micros((x.wrapping_mul(2_654_435_761) % 3000) + 10)
}

fn config(sink: usize) -> PipelineConfig {
    PipelineConfig {
        num_threads: 2,
        sink_buffer: sink,
    }
}

#[test]
fn ordered_output_under_random_delays_for_every_kind_of_work() {
    let sleepy: ItemFn<u64, String> = Arc::new(|x| {
        std::thread::sleep(jitter(x));
        Ok(Some(x + 1))
    });
    let async_sleepy: AsyncItemFn<u64, String> = Arc::new(|x| {
        Box::pin(async move {
            tokio::time::sleep(jitter(x)).await;
            Ok(Some(x * 10))
        })
    });
    let stages = vec![
        map("dedicated", Work::Dedicated(sleepy.clone(), None), 8, true),
        map("blocking", Work::Blocking(sleepy), 8, true),
        map("async", Work::Async(async_sleepy), 8, true),
    ];
    let mut p = P::new(source(300), stages, config(3), None).unwrap();
    let out = drain(&mut p).unwrap();
    let expected: Vec<u64> = (0..300).map(|x| (x + 2) * 10).collect();
    assert_eq!(out, expected);
    let stats = p.stats();
    assert_eq!(stats.len(), 5);
    assert_eq!(stats[1].items_in, 300);
    assert_eq!(stats[3].items_out, 300);
    assert_eq!(stats[4].items_in, 300);
    assert!(stats[1].busy > Duration::ZERO);
}

#[test]
fn unordered_yields_fast_items_first() {
    // Item 0 is slow; with ordered=false the others overtake it.
    let f: ItemFn<u64, String> = Arc::new(|x| {
        std::thread::sleep(if x == 0 {
            Duration::from_millis(300)
        } else {
            Duration::from_millis(1)
        });
        Ok(Some(x))
    });
    let mut p = P::new(
        source(20),
        vec![map("f", Work::Dedicated(f, None), 4, false)],
        config(32),
        None,
    )
    .unwrap();
    let out = drain(&mut p).unwrap();
    assert_eq!(out.len(), 20);
    assert_ne!(out[0], 0);
    assert_eq!(*out.last().unwrap(), 0);
}

#[test]
fn none_drops_items_and_inline_fast_path() {
    let evens: ItemFn<u64, String> = Arc::new(|x| Ok((x % 2 == 0).then_some(x)));
    let mut p = P::new(
        source(10),
        vec![map("evens", Work::Inline(evens), 1, true)],
        config(2),
        None,
    )
    .unwrap();
    assert_eq!(drain(&mut p).unwrap(), vec![0, 2, 4, 6, 8]);
    assert_eq!(p.stats()[1].dropped, 5);
}

#[test]
fn raise_stops_with_the_stage_and_error() {
    let f: ItemFn<u64, String> = Arc::new(|x| {
        if x == 7 {
            Err(format!("bad {x}"))
        } else {
            Ok(Some(x))
        }
    });
    let mut p = P::new(
        source(1_000_000),
        vec![map("check", Work::Dedicated(f, None), 2, true)],
        config(2),
        None,
    )
    .unwrap();
    let err = drain(&mut p).unwrap_err();
    assert_eq!(err.stage, "check");
    assert!(
        matches!(err.kind, FailureKind::Item(ref m) if m == "bad 7"),
        "{err:?}"
    );
    assert!(p.is_finished());
    assert!(matches!(
        p.next_timeout(Duration::from_millis(10)),
        Next::Finished
    ));
}

#[test]
fn skip_counts_exactly_and_max_failures_trips() {
    let skipped = Arc::new(AtomicUsize::new(0));
    let s2 = Arc::clone(&skipped);
    let hook: SkipHook<String> = Arc::new(move |stage, _e| {
        assert_eq!(stage, "flaky");
        s2.fetch_add(1, Ordering::Relaxed);
    });
    let f: ItemFn<u64, String> = Arc::new(|x| {
        if x % 100 == 0 {
            Err("boom".into())
        } else {
            Ok(Some(x))
        }
    });
    let stage = with_policy(
        map("flaky", Work::Inline(f.clone()), 4, true),
        ErrorPolicy::Skip { max_failures: None },
    );
    let mut p = P::new(source(10_000), vec![stage], config(4), Some(hook)).unwrap();
    let out = drain(&mut p).unwrap();
    assert_eq!(out.len(), 9_900);
    assert_eq!(p.stats()[1].failures, 100);
    assert_eq!(skipped.load(Ordering::Relaxed), 100);

    let stage = with_policy(
        map("flaky", Work::Inline(f), 1, true),
        ErrorPolicy::Skip {
            max_failures: Some(3),
        },
    );
    let mut p = P::new(source(10_000), vec![stage], config(4), None).unwrap();
    let err = drain(&mut p).unwrap_err();
    assert!(
        matches!(
            err.kind,
            FailureKind::TooManyFailures {
                limit: 3,
                count: 4,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn source_errors_and_panics_are_failures() {
    let src = IterSource((0..10u64).map(|x| {
        if x == 5 {
            Err("source broke".to_string())
        } else {
            Ok(x)
        }
    }));
    let mut p = P::new(src, vec![], config(2), None).unwrap();
    let err = drain(&mut p).unwrap_err();
    assert_eq!(err.stage, "source");

    let f: ItemFn<u64, String> = Arc::new(|x| {
        assert!(x != 3, "three is right out");
        Ok(Some(x))
    });
    // Inline and blocking work catch the panic and keep its message; a
    // dedicated thread (one or several) dies with it, which fails the stage.
    for (work, conc, message) in [
        (Work::Inline(f.clone()), 2, "right out"),
        (Work::Blocking(f.clone()), 2, "right out"),
        (Work::Dedicated(f.clone(), None), 2, "panicked"),
        (Work::Dedicated(f, None), 1, "panicked"),
    ] {
        let mut p = P::new(
            source(10),
            vec![map("p", work, conc, true)],
            config(2),
            None,
        )
        .unwrap();
        let err = drain(&mut p).unwrap_err();
        assert_eq!(err.stage, "p");
        assert!(
            matches!(err.kind, FailureKind::Panicked(ref m) if m.contains(message)),
            "{err:?}"
        );
    }
}

#[test]
fn aggregate_groups_with_and_without_drop_last() {
    let combine: CombineFn<u64, String> =
        Arc::new(|v: Vec<u64>| Ok(v.iter().sum::<u64>() * 1000 + v.len() as u64));
    for (drop_last, expected) in [
        (false, vec![3003, 12003, 21003, 9001]),
        (true, vec![3003, 12003, 21003]),
    ] {
        let stage = Stage::Aggregate(AggregateStage {
            name: "batch".into(),
            size: 3,
            drop_last,
            combine: combine.clone(),
        });
        let mut p = P::new(source(10), vec![stage], config(2), None).unwrap();
        assert_eq!(drain(&mut p).unwrap(), expected);
    }
}

#[test]
fn a_slow_consumer_bounds_what_the_source_pulls() {
    let pulled = Arc::new(AtomicUsize::new(0));
    let p2 = Arc::clone(&pulled);
    let src = IterSource((0..1_000_000u64).map(move |x| {
        p2.fetch_add(1, Ordering::Relaxed);
        Ok(x)
    }));
    let id: ItemFn<u64, String> = Arc::new(|x| Ok(Some(x)));
    let stages = vec![
        map("a", Work::Inline(id.clone()), 1, true),
        map("b", Work::Dedicated(id, None), 4, true),
    ];
    let mut p = P::new(src, stages, config(3), None).unwrap();
    for _ in 0..5 {
        assert!(matches!(
            p.next_timeout(Duration::from_secs(5)),
            Next::Item(_)
        ));
    }
    std::thread::sleep(Duration::from_millis(200));
    // Channels: 2 + 4 + 3 items, plus what each stage and the source hold
    // (a batch of at most 64 in the source).
    let n = pulled.load(Ordering::Relaxed);
    assert!(n < 100, "the source ran ahead: {n} items pulled");
    p.stop();
}

#[test]
fn stop_is_prompt_and_joins_threads() {
    let slow: ItemFn<u64, String> = Arc::new(|x| {
        std::thread::sleep(Duration::from_millis(20));
        Ok(Some(x))
    });
    let mut p = P::new(
        source(u64::MAX),
        vec![map("slow", Work::Dedicated(slow, None), 4, true)],
        config(2),
        None,
    )
    .unwrap();
    assert!(matches!(
        p.next_timeout(Duration::from_secs(5)),
        Next::Item(0)
    ));
    let t = Instant::now();
    p.stop();
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "stop took {:?}",
        t.elapsed()
    );
    assert!(p.is_finished());
    p.stop(); // idempotent
}

#[test]
fn invalid_configurations_are_refused() {
    let id: ItemFn<u64, String> = Arc::new(|x| Ok(Some(x)));
    assert!(P::new(
        source(1),
        vec![map("z", Work::Inline(id), 0, true)],
        config(2),
        None
    )
    .is_err());
    assert!(P::new(source(1), vec![], config(0), None).is_err());
}

#[test]
fn the_reporter_runs_periodically() {
    let reports = Arc::new(AtomicUsize::new(0));
    let r2 = Arc::clone(&reports);
    let slow: ItemFn<u64, String> = Arc::new(|x| {
        std::thread::sleep(Duration::from_millis(5));
        Ok(Some(x))
    });
    let mut p = P::new(
        source(60),
        vec![map("slow", Work::Dedicated(slow, None), 1, true)],
        config(2),
        None,
    )
    .unwrap();
    p.set_reporter(StatsReporter {
        interval: Duration::from_millis(50),
        report: Arc::new(move |snaps| {
            assert_eq!(snaps.len(), 3);
            r2.fetch_add(1, Ordering::Relaxed);
        }),
    });
    assert_eq!(drain(&mut p).unwrap().len(), 60);
    assert!(reports.load(Ordering::Relaxed) >= 2);
}

#[test]
fn fused_inline_stages_keep_their_own_stats_and_policies() {
    let add: ItemFn<u64, String> = Arc::new(|x| Ok(Some(x + 1)));
    let evens: ItemFn<u64, String> = Arc::new(|x| Ok((x % 2 == 0).then_some(x)));
    let no_tens: ItemFn<u64, String> = Arc::new(|x| {
        if x % 10 == 0 {
            Err(format!("ten {x}"))
        } else {
            Ok(Some(x))
        }
    });
    let stages = vec![
        map("add", Work::Inline(add), 1, true),
        map("evens", Work::Inline(evens), 1, true),
        with_policy(
            map("no_tens", Work::Inline(no_tens), 1, true),
            ErrorPolicy::Skip { max_failures: None },
        ),
    ];
    let mut p = P::new(source(100), stages, config(4), None).unwrap();
    let out = drain(&mut p).unwrap();
    let expected: Vec<u64> = (1..=100).filter(|x| x % 2 == 0 && x % 10 != 0).collect();
    assert_eq!(out, expected);
    let s = p.stats();
    assert_eq!((s[1].items_in, s[1].items_out), (100, 100));
    assert_eq!((s[2].items_in, s[2].items_out, s[2].dropped), (100, 50, 50));
    assert_eq!((s[3].items_in, s[3].items_out, s[3].failures), (50, 40, 10));
    // Fused: no channel between them.
    assert_eq!((s[1].queue_capacity, s[2].queue_capacity), (0, 0));
    assert!(s[3].queue_capacity > 0);
}

#[test]
fn a_single_thread_stage_shares_sessions_across_batches() {
    let sessions = Arc::new(AtomicUsize::new(0));
    let s2 = Arc::clone(&sessions);
    let session: SessionFn = Arc::new(move |run: &mut dyn FnMut()| {
        s2.fetch_add(1, Ordering::Relaxed);
        run();
    });
    let id: ItemFn<u64, String> = Arc::new(|x| Ok(Some(x)));
    // A slow consumer lets items pile up in front of the stage.
    let stage = map("py", Work::Dedicated(id, Some(session)), 1, true);
    let mut p = P::new(source(2000), vec![stage], config(64), None).unwrap();
    p.start().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let out = drain(&mut p).unwrap();
    assert_eq!(out, (0..2000).collect::<Vec<_>>());
    let n = sessions.load(Ordering::Relaxed);
    assert!(n < 2000, "one session per item: {n}");
}
