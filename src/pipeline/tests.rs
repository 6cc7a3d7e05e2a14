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
        timeout: None,
    })
}

fn with_policy(stage: Stage<u64, String>, policy: ErrorPolicy) -> Stage<u64, String> {
    match stage {
        Stage::Map(mut m) => {
            m.on_error = policy;
            Stage::Map(m)
        }
        s => s,
    }
}

/// `stage` under the skip policy, failing the pipeline past 3 failures.
fn at_most_3_failures(stage: Stage<u64, String>) -> Stage<u64, String> {
    with_policy(
        stage,
        ErrorPolicy::Skip {
            max_failures: Some(3),
        },
    )
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

/// Drains `p`, which must fail at stage `stage`, and gives what failed.
#[track_caller]
fn failed_at(p: &mut P, stage: &str) -> FailureKind<String> {
    let err = drain(p).unwrap_err();
    assert_eq!(err.stage, stage, "{err:?}");
    err.kind
}

/// Whether `kind` is the item error `message`.
fn is_item(kind: &FailureKind<String>, message: &str) -> bool {
    matches!(kind, FailureKind::Item(m) if m == message)
}

/// The numbers `0..n` through `stages`, into a sink of `sink` items, with
/// no reporter: a started pipeline.
fn pipeline(n: u64, stages: Vec<Stage<u64, String>>, sink: usize) -> P {
    P::new(source(n), stages, config(sink), None).unwrap()
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
    let mut p = pipeline(300, stages, 3);
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
    let mut p = pipeline(20, vec![map("f", Work::Dedicated(f, None), 4, false)], 32);
    let out = drain(&mut p).unwrap();
    assert_eq!(out.len(), 20);
    assert_ne!(out[0], 0);
    assert_eq!(*out.last().unwrap(), 0);
}

#[test]
fn none_drops_items_and_inline_fast_path() {
    let evens: ItemFn<u64, String> = Arc::new(|x| Ok((x % 2 == 0).then_some(x)));
    let mut p = pipeline(10, vec![map("evens", Work::Inline(evens), 1, true)], 2);
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
    let mut p = pipeline(
        1_000_000,
        vec![map("check", Work::Dedicated(f, None), 2, true)],
        2,
    );
    let kind = failed_at(&mut p, "check");
    assert!(is_item(&kind, "bad 7"), "{kind:?}");
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

    let stage = at_most_3_failures(map("flaky", Work::Inline(f), 1, true));
    let mut p = pipeline(10_000, vec![stage], 4);
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
fn an_unskippable_error_fails_the_pipeline_under_skip_on_every_kind_of_work() {
    // "bad" items are skipped; a "bug" is a programming error that fails the
    // pipeline whatever the policy, after the items before it.
    let f: ItemFn<u64, String> = Arc::new(|x| match x {
        7 => Err("bug".into()),
        x if x % 3 == 0 => Err("bad".into()),
        x => Ok(Some(x)),
    });
    let af: AsyncItemFn<u64, String> = {
        let f = Arc::clone(&f);
        Arc::new(move |x| {
            let out = f(x);
            Box::pin(async move { out })
        })
    };
    let works = [
        Work::Inline(Arc::clone(&f)),
        Work::Blocking(Arc::clone(&f)),
        Work::Dedicated(Arc::clone(&f), None),
        Work::Async(af),
    ];
    for work in works {
        for concurrency in [1, 4] {
            let stage = with_policy(
                map("m", work.clone(), concurrency, true),
                ErrorPolicy::Skip { max_failures: None },
            );
            let mut p = pipeline(20, vec![stage], 4);
            p.set_unskippable(Arc::new(|e: &String| e == "bug"));
            let mut got = Vec::new();
            let failure = loop {
                match p.next_timeout(Duration::from_secs(10)) {
                    Next::Item(x) => got.push(x),
                    Next::Failed(f) => break f,
                    Next::Finished => panic!("the bug was skipped"),
                    Next::Timeout => panic!("pipeline stalled"),
                }
            };
            assert_eq!(got, vec![1, 2, 4, 5]);
            assert_eq!(failure.stage, "m");
            assert!(matches!(failure.kind, FailureKind::Item(ref e) if e == "bug"));
        }
    }
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
    failed_at(&mut p, "source");

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
        let mut p = pipeline(10, vec![map("p", work, conc, true)], 2);
        let kind = failed_at(&mut p, "p");
        assert!(
            matches!(kind, FailureKind::Panicked(ref m) if m.contains(message)),
            "{kind:?}"
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
        let mut p = pipeline(10, vec![stage], 2);
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

/// A pipeline over an endless source through one thread stage of
/// `concurrency` calls that each take `ms`, with its first item taken.
fn running_slow_stage(ms: u64, concurrency: usize) -> P {
    let slow: ItemFn<u64, String> = Arc::new(move |x| {
        std::thread::sleep(Duration::from_millis(ms));
        Ok(Some(x))
    });
    running_stage(Work::Dedicated(slow, None), concurrency)
}

/// A pipeline over an endless source through one stage `work` of
/// `concurrency`, with its first item taken.
fn running_stage(work: Work<u64, String>, concurrency: usize) -> P {
    let mut p = pipeline(u64::MAX, vec![map("slow", work, concurrency, true)], 2);
    assert!(matches!(
        p.next_timeout(Duration::from_secs(5)),
        Next::Item(0)
    ));
    p
}

#[test]
fn stop_is_prompt_and_joins_threads() {
    let mut p = running_slow_stage(20, 4);
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

/// A gate that calls wait at, until the test opens it.
struct Gate {
    open: std::sync::Mutex<bool>,
    changed: std::sync::Condvar,
}

impl Gate {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            open: std::sync::Mutex::new(false),
            changed: std::sync::Condvar::new(),
        })
    }

    fn wait(&self) {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.changed.wait(open).unwrap();
        }
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.changed.notify_all();
    }
}

#[test]
fn stop_leaves_calls_stuck_in_user_code_and_joins_every_other_thread() {
    // source -> "fast" (2 threads) -> "stuck" (1 thread, its call never returns until the
    // gate opens): the source and "fast" block sending into full channels that the stuck
    // stage keeps open; stopping must still join them, within the grace period.
    let gate = Gate::new();
    let entered = Arc::new(AtomicUsize::new(0));
    let stuck: ItemFn<u64, String> = {
        let (gate, entered) = (Arc::clone(&gate), Arc::clone(&entered));
        Arc::new(move |x| {
            entered.fetch_add(1, Ordering::SeqCst);
            gate.wait();
            Ok(Some(x))
        })
    };
    let alive = Arc::downgrade(&stuck);
    let fast: ItemFn<u64, String> = Arc::new(|x| Ok(Some(x)));
    let mut p = pipeline(
        u64::MAX,
        vec![
            map("fast", Work::Dedicated(fast, None), 2, true),
            map("stuck", Work::Dedicated(stuck, None), 1, true),
        ],
        2,
    );
    p.start().unwrap();
    let t = Instant::now();
    while entered.load(Ordering::SeqCst) == 0 {
        assert!(t.elapsed() < Duration::from_secs(5), "the stage never ran");
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(100)); // the channels fill up behind it
    assert!(matches!(p.next_timeout(Duration::ZERO), Next::Timeout));
    let t = Instant::now();
    p.stop();
    let took = t.elapsed();
    assert!(took >= STOP_GRACE, "did not wait for the call: {took:?}");
    assert!(took < Duration::from_secs(1), "stop took {took:?}");
    // Only the thread inside the call was left; every other one was joined.
    assert_eq!(p.take_left_running(), vec!["ff-stuck-0".to_owned()]);
    assert!(p.take_left_running().is_empty());
    assert!(
        alive.upgrade().is_some(),
        "the stuck thread still holds its function"
    );
    gate.open();
    let t = Instant::now();
    while alive.upgrade().is_some() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the left thread did not end after its call returned"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        entered.load(Ordering::SeqCst),
        1,
        "a call started after the stop"
    );
}

#[test]
fn stop_waits_for_calls_that_end_within_the_grace_period() {
    let mut p = running_slow_stage(50, 3);
    p.stop();
    assert!(
        p.take_left_running().is_empty(),
        "a 50 ms call was not waited for"
    );
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
    let mut p = pipeline(
        60,
        vec![map("slow", Work::Dedicated(slow, None), 1, true)],
        2,
    );
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
    let mut p = pipeline(100, stages, 4);
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
    let mut p = pipeline(2000, vec![stage], 64);
    p.start().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let out = drain(&mut p).unwrap();
    assert_eq!(out, (0..2000).collect::<Vec<_>>());
    let n = sessions.load(Ordering::Relaxed);
    assert!(n < 2000, "one session per item: {n}");
}

/// A lock that works like the GIL: a session holds it, and a call may let
/// go of it while it waits (as `time.sleep` or I/O does).
#[derive(Default)]
struct FakeGil {
    held: std::sync::Mutex<bool>,
    free: std::sync::Condvar,
}

impl FakeGil {
    fn acquire(&self) {
        let mut held = self.held.lock().unwrap();
        while *held {
            held = self.free.wait(held).unwrap();
        }
        *held = true;
    }

    fn release(&self) {
        let mut held = self.held.lock().unwrap();
        assert!(*held, "released a lock nobody holds");
        *held = false;
        drop(held);
        self.free.notify_one();
    }

    fn is_held(&self) -> bool {
        *self.held.lock().unwrap()
    }

    /// A session that holds the lock for all of its calls, counted.
    fn session(self: &Arc<Self>, count: &Arc<AtomicUsize>) -> SessionFn {
        let (gil, count) = (Arc::clone(self), Arc::clone(count));
        Arc::new(move |run: &mut dyn FnMut()| {
            gil.acquire();
            count.fetch_add(1, Ordering::Relaxed);
            run();
            gil.release();
        })
    }

    /// Runs `wait` without the lock, as a call that releases the GIL does.
    fn without(&self, wait: impl FnOnce()) {
        assert!(self.is_held(), "a stage function ran outside its session");
        self.release();
        wait();
        self.acquire();
    }
}

/// Counts calls running at once, and the most seen.
#[derive(Default)]
struct InFlight {
    now: AtomicUsize,
    most: AtomicUsize,
}

impl InFlight {
    fn enter(&self) {
        let now = self.now.fetch_add(1, Ordering::AcqRel) + 1;
        self.most.fetch_max(now, Ordering::AcqRel);
    }

    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::AcqRel);
    }
}

#[test]
fn thread_stage_calls_that_release_the_gil_overlap() {
    // 16 calls of 100 ms that let go of the GIL, on 4 threads: about 400 ms
    // if they overlap, 1.6 s if the GIL serialised them.
    let gil = Arc::new(FakeGil::default());
    let sessions = Arc::new(AtomicUsize::new(0));
    let track = Arc::new(InFlight::default());
    let (g, tr) = (Arc::clone(&gil), Arc::clone(&track));
    let nap: ItemFn<u64, String> = Arc::new(move |x| {
        tr.enter();
        g.without(|| std::thread::sleep(Duration::from_millis(100)));
        tr.leave();
        Ok(Some(x))
    });
    let work = Work::Dedicated(nap, Some(gil.session(&sessions)));
    let mut p = pipeline(16, vec![map("nap", work, 4, true)], 4);
    let t = Instant::now();
    assert_eq!(drain(&mut p).unwrap(), (0..16).collect::<Vec<_>>());
    let elapsed = t.elapsed();
    assert_eq!(track.most.load(Ordering::Relaxed), 4);
    assert!(elapsed < Duration::from_secs(1), "took {elapsed:?}");
    assert!(!gil.is_held());
}

#[test]
fn thread_stage_keeps_order_with_the_gil_and_random_delays() {
    for ordered in [true, false] {
        let gil = Arc::new(FakeGil::default());
        let sessions = Arc::new(AtomicUsize::new(0));
        let track = Arc::new(InFlight::default());
        let (g, tr) = (Arc::clone(&gil), Arc::clone(&track));
        // Every third call waits without the GIL; the others are cheap.
        let f: ItemFn<u64, String> = Arc::new(move |x| {
            if x % 3 == 0 {
                tr.enter();
                g.without(|| std::thread::sleep(jitter(x)));
                tr.leave();
            }
            Ok(Some(x * 2))
        });
        let work = Work::Dedicated(f, Some(gil.session(&sessions)));
        let stages = vec![map("f", work, 4, ordered)];
        let mut p = pipeline(600, stages, 3);
        let mut out = drain(&mut p).unwrap();
        let expected: Vec<u64> = (0..600).map(|x| x * 2).collect();
        if ordered {
            assert_eq!(out, expected);
        } else {
            assert_ne!(out, expected, "unordered output came in input order");
            out.sort_unstable();
            assert_eq!(out, expected);
        }
        assert!(track.most.load(Ordering::Relaxed) > 1);
        let s = p.stats();
        assert_eq!((s[1].items_in, s[1].items_out), (600, 600));
    }
}

#[test]
fn thread_stage_runs_cheap_calls_in_shared_sessions() {
    for concurrency in [1, 4] {
        let gil = Arc::new(FakeGil::default());
        let sessions = Arc::new(AtomicUsize::new(0));
        let g = Arc::clone(&gil);
        let id: ItemFn<u64, String> = Arc::new(move |x| {
            assert!(g.is_held());
            Ok(Some(x))
        });
        let work = Work::Dedicated(id, Some(gil.session(&sessions)));
        let stages = vec![map("py", work, concurrency, true)];
        let mut p = pipeline(20_000, stages, 64);
        assert_eq!(drain(&mut p).unwrap(), (0..20_000).collect::<Vec<_>>());
        let n = sessions.load(Ordering::Relaxed);
        assert!(
            n < 20_000 / 4,
            "concurrency {concurrency}: {n} sessions for 20000 items"
        );
    }
}

#[test]
fn a_slow_item_holds_back_at_most_a_window() {
    for stop_early in [false, true] {
        let pulled = Arc::new(AtomicUsize::new(0));
        let p2 = Arc::clone(&pulled);
        let src = IterSource((0..10_000u64).map(move |x| {
            p2.fetch_add(1, Ordering::Relaxed);
            Ok(x)
        }));
        let f: ItemFn<u64, String> = Arc::new(|x| {
            if x == 0 {
                std::thread::sleep(Duration::from_millis(400));
            }
            Ok(Some(x))
        });
        let stages = vec![map("f", Work::Dedicated(f, None), 4, true)];
        let mut p = P::new(src, stages, config(3), None).unwrap();
        p.start().unwrap();
        std::thread::sleep(Duration::from_millis(150));
        // Item 0 runs; the others wait behind it, within the window (32),
        // the input queue (16) and a source batch (16).
        assert!(matches!(
            p.next_timeout(Duration::from_millis(50)),
            Next::Timeout
        ));
        let n = pulled.load(Ordering::Relaxed);
        assert!(n <= 32 + 16 + 16, "the stage ran ahead: {n} items pulled");
        assert!(n >= 32, "the other threads stood idle: {n} items pulled");
        if stop_early {
            // The threads that wait for room see the stop.
            let t = Instant::now();
            p.stop();
            assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
            assert!(p.is_finished());
        } else {
            assert_eq!(drain(&mut p).unwrap(), (0..10_000).collect::<Vec<_>>());
        }
    }
}

#[test]
fn thread_stage_errors_follow_the_policy_in_order() {
    let skipped = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s2 = Arc::clone(&skipped);
    let hook: SkipHook<String> = Arc::new(move |_stage, e| s2.lock().unwrap().push(e.clone()));
    let f: ItemFn<u64, String> = Arc::new(|x| {
        if x % 100 == 7 {
            Err(format!("bad {x}"))
        } else {
            Ok((x % 10 != 0).then_some(x))
        }
    });
    let skip = with_policy(
        map("flaky", Work::Dedicated(f.clone(), None), 4, true),
        ErrorPolicy::Skip { max_failures: None },
    );
    let mut p = P::new(source(10_000), vec![skip], config(4), Some(hook)).unwrap();
    let expected: Vec<u64> = (0..10_000)
        .filter(|x| x % 100 != 7 && x % 10 != 0)
        .collect();
    assert_eq!(drain(&mut p).unwrap(), expected);
    let s = p.stats();
    assert_eq!((s[1].failures, s[1].dropped), (100, 1000));
    // The skip hook sees the failures in input order.
    let expected: Vec<String> = (0..100).map(|i| format!("bad {}", i * 100 + 7)).collect();
    assert_eq!(*skipped.lock().unwrap(), expected);

    let limited = at_most_3_failures(map("flaky", Work::Dedicated(f.clone(), None), 4, true));
    let mut p = pipeline(10_000, vec![limited], 4);
    let err = drain(&mut p).unwrap_err();
    assert!(
        matches!(
            err.kind,
            FailureKind::TooManyFailures { limit: 3, count: 4, ref last } if last == "bad 307"
        ),
        "{err:?}"
    );

    // Raise: the first failure in input order, with the stage's name.
    let mut p = pipeline(
        10_000,
        vec![map("flaky", Work::Dedicated(f, None), 4, true)],
        4,
    );
    let kind = failed_at(&mut p, "flaky");
    assert!(is_item(&kind, "bad 7"), "{kind:?}");
}

#[test]
fn nothing_after_a_fatal_item_comes_out_of_a_thread_stage() {
    // With a sink of one, results wait in the stage while the consumer takes
    // them one by one: none that follows the failing item may come out,
    // whichever thread sends results on after the failure.
    let f: ItemFn<u64, String> = Arc::new(|x| {
        if x == 21 {
            Err("bad".into())
        } else {
            Ok(Some(x))
        }
    });
    for _ in 0..50 {
        let stage = map("f", Work::Dedicated(f.clone(), None), 2, true);
        let mut p = pipeline(100, vec![stage], 1);
        let mut out = Vec::new();
        let failure = loop {
            match p.next_timeout(Duration::from_secs(10)) {
                Next::Item(x) => out.push(x),
                Next::Failed(f) => break f,
                other => panic!("{other:?}"),
            }
        };
        assert!(matches!(failure.kind, FailureKind::Item(_)));
        assert!(out.len() <= 21, "{out:?}");
        assert_eq!(out, (0..out.len() as u64).collect::<Vec<_>>());
    }
}

#[test]
fn a_one_thread_stage_calls_nothing_after_a_fatal_item() {
    // One thread runs several items per session: the session ends at a
    // failure, so no call follows the failing item (a policy that stops on
    // it, such as a failure budget, must not run more user code).
    use std::sync::atomic::AtomicU64;
    for _ in 0..20 {
        let calls = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&calls);
        let f: ItemFn<u64, String> = Arc::new(move |x| {
            counted.fetch_add(1, Ordering::SeqCst);
            if x == 5 {
                Err("bad".into())
            } else {
                Ok(Some(x))
            }
        });
        let stage = map("f", Work::Dedicated(f, None), 1, true);
        let mut p = pipeline(1000, vec![stage], 64);
        let err = drain(&mut p).unwrap_err();
        assert!(matches!(err.kind, FailureKind::Item(_)), "{err:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 6);
    }
}

/// A barrier for `n` threads that gives up after a timeout.
struct TimedBarrier {
    n: usize,
    state: std::sync::Mutex<(usize, u64)>,
    cv: std::sync::Condvar,
}

impl TimedBarrier {
    fn new(n: usize) -> Self {
        Self {
            n,
            state: std::sync::Mutex::new((0, 0)),
            cv: std::sync::Condvar::new(),
        }
    }

    /// Whether all `n` arrived within `timeout`.
    fn wait(&self, timeout: Duration) -> bool {
        let mut state = self.state.lock().unwrap();
        let generation = state.1;
        state.0 += 1;
        if state.0 == self.n {
            *state = (0, generation + 1);
            self.cv.notify_all();
            return true;
        }
        let (state, result) = self
            .cv
            .wait_timeout_while(state, timeout, |s| s.1 == generation)
            .unwrap();
        drop(state);
        !result.timed_out()
    }
}

#[test]
fn thread_stage_runs_concurrency_calls_that_wait_for_each_other() {
    // Every call waits (without the GIL) until `concurrency` calls wait
    // together: the stage must let that many run at once, however the
    // items fall into sessions and whatever the window holds.
    for concurrency in [2, 8, 16] {
        for _ in 0..20 {
            let gil = Arc::new(FakeGil::default());
            let sessions = Arc::new(AtomicUsize::new(0));
            let barrier = Arc::new(TimedBarrier::new(concurrency));
            let (g, b) = (Arc::clone(&gil), Arc::clone(&barrier));
            let meet: ItemFn<u64, String> = Arc::new(move |x| {
                let mut met = false;
                g.without(|| met = b.wait(Duration::from_secs(5)));
                if met {
                    Ok(Some(x))
                } else {
                    Err(format!("item {x}: the others never came"))
                }
            });
            let work = Work::Dedicated(meet, Some(gil.session(&sessions)));
            let n = 4 * concurrency as u64;
            let stages = vec![map("meet", work, concurrency, true)];
            let mut p = pipeline(n, stages, 3);
            assert_eq!(drain(&mut p).unwrap(), (0..n).collect::<Vec<_>>());
        }
    }
}

/// Every kind of work, for the tests that run one stage of each.
fn every_work(f: &ItemFn<u64, String>) -> Vec<(&'static str, Work<u64, String>, usize)> {
    vec![
        ("inline-fused", Work::Inline(f.clone()), 1),
        ("inline", Work::Inline(f.clone()), 3),
        ("blocking", Work::Blocking(f.clone()), 3),
        ("dedicated-1", Work::Dedicated(f.clone(), None), 1),
        ("dedicated-4", Work::Dedicated(f.clone(), None), 4),
    ]
}

#[test]
fn a_failure_comes_after_every_item_before_it() {
    // The source fails after 10 items: they all come out, through every
    // kind of stage, then the source's failure.
    let id: ItemFn<u64, String> = Arc::new(|x| Ok(Some(x)));
    for (kind, work, conc) in every_work(&id) {
        for _ in 0..20 {
            let src = IterSource((0..20u64).map(|x| {
                if x == 10 {
                    Err("source broke".to_string())
                } else {
                    Ok(x)
                }
            }));
            let stages = vec![map("s", work.clone(), conc, true)];
            let mut p = P::new(src, stages, config(1), None).unwrap();
            let mut got = Vec::new();
            let err = loop {
                match p.next_timeout(Duration::from_secs(10)) {
                    Next::Item(x) => got.push(x),
                    Next::Failed(f) => break f,
                    other => panic!("{kind}: {other:?}"),
                }
            };
            assert_eq!(got, (0..10).collect::<Vec<_>>(), "{kind}");
            assert_eq!(err.stage, "source", "{kind}");
        }
    }
    // A stage fails on item 6 under max_failures: the items before it come
    // out, through a later stage, then the trip.
    let odd: ItemFn<u64, String> = Arc::new(|x| {
        if x % 2 == 1 {
            Err(format!("odd {x}"))
        } else {
            Ok(Some(x))
        }
    });
    for (kind, work, conc) in every_work(&odd) {
        for _ in 0..20 {
            let stages = vec![
                with_policy(
                    map("odd", work.clone(), conc, true),
                    ErrorPolicy::Skip {
                        max_failures: Some(2),
                    },
                ),
                map("then", Work::Dedicated(id.clone(), None), 2, true),
            ];
            let mut p = pipeline(100, stages, 1);
            let mut got = Vec::new();
            let err = loop {
                match p.next_timeout(Duration::from_secs(10)) {
                    Next::Item(x) => got.push(x),
                    Next::Failed(f) => break f,
                    other => panic!("{kind}: {other:?}"),
                }
            };
            assert_eq!(got, vec![0, 2, 4], "{kind}");
            assert!(
                matches!(err.kind, FailureKind::TooManyFailures { ref last, .. } if last == "odd 5"),
                "{kind}: {err:?}"
            );
        }
    }
}

#[test]
fn stop_leaves_the_sink_readable() {
    let id: ItemFn<u64, String> = Arc::new(|x| Ok(Some(x)));
    let stages = vec![map("s", Work::Dedicated(id, None), 2, true)];
    let mut p = pipeline(1000, stages, 4);
    assert!(matches!(
        p.next_timeout(Duration::from_secs(10)),
        Next::Item(0)
    ));
    let t = Instant::now();
    while p.stats()[1].items_out < 5 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(20));
    p.stop();
    assert!(p.has_leftovers());
    let rest = drain(&mut p).unwrap();
    assert!(rest.len() >= 4, "{rest:?}");
    assert_eq!(rest, (1..=rest.len() as u64).collect::<Vec<_>>());
    assert!(matches!(p.next_timeout(Duration::ZERO), Next::Finished));
}

#[test]
fn disaggregate_splits_items_and_fails_after_what_came_before() {
    let split: SplitFn<u64, String> = Arc::new(|x| {
        if x == 4 {
            Err("four".into())
        } else {
            Ok((0..x).map(|i| x * 10 + i).collect())
        }
    });
    let stages = vec![Stage::Disaggregate(DisaggregateStage {
        name: "split".into(),
        split,
    })];
    let mut p = pipeline(10, stages, 2);
    let mut got = Vec::new();
    let err = loop {
        match p.next_timeout(Duration::from_secs(10)) {
            Next::Item(x) => got.push(x),
            Next::Failed(f) => break f,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(got, vec![10, 20, 21, 30, 31, 32]);
    assert_eq!(err.stage, "split");
    assert!(matches!(err.kind, FailureKind::Item(ref e) if e == "four"));
}

fn timeout_error() -> StageTimeout<String> {
    StageTimeout {
        limit: Duration::from_millis(100),
        error: Arc::new(|stage, limit| format!("{stage}: over {limit:?}")),
    }
}

#[test]
fn a_call_past_the_timeout_fails_and_the_rest_goes_on() {
    let slow_at_3 = |long: Duration| -> ItemFn<u64, String> {
        Arc::new(move |x| {
            if x == 3 {
                std::thread::sleep(long);
            }
            Ok(Some(x))
        })
    };
    let long = Duration::from_millis(1500);
    let nap: AsyncItemFn<u64, String> = Arc::new(move |x| {
        Box::pin(async move {
            if x == 3 {
                tokio::time::sleep(long).await;
            }
            Ok(Some(x))
        })
    });
    let cases = [
        // Inline work is only checked when it returns.
        (
            "inline",
            Work::Inline(slow_at_3(Duration::from_millis(300))),
            1,
        ),
        ("blocking", Work::Blocking(slow_at_3(long)), 2),
        ("async", Work::Async(nap), 2),
        ("dedicated", Work::Dedicated(slow_at_3(long), None), 2),
    ];
    for (kind, work, conc) in cases {
        let stage = Stage::Map(MapStage {
            name: kind.into(),
            work,
            concurrency: conc,
            ordered: true,
            on_error: ErrorPolicy::Skip { max_failures: None },
            timeout: Some(timeout_error()),
        });
        let t = Instant::now();
        let mut p = pipeline(10, vec![stage], 2);
        let mut out = Vec::new();
        let mut last_at = Duration::ZERO;
        loop {
            match p.next_timeout(Duration::from_secs(10)) {
                Next::Item(x) => {
                    out.push(x);
                    last_at = t.elapsed();
                }
                Next::Finished => break,
                other => panic!("{kind}: {other:?}"),
            }
        }
        assert_eq!(out, vec![0, 1, 2, 4, 5, 6, 7, 8, 9], "{kind}");
        assert_eq!(p.stats()[1].failures, 1, "{kind}");
        // The items after it do not wait for the call (a blocking call may
        // still hold up the end: the runtime's shutdown waits for it a while).
        if kind != "inline" {
            assert!(last_at < Duration::from_millis(1200), "{kind}: {last_at:?}");
        }
    }
    // Under "raise", the items before it, then the timeout's error.
    let stage = Stage::Map(MapStage {
        name: "d".into(),
        work: Work::Dedicated(slow_at_3(long), None),
        concurrency: 1,
        ordered: true,
        on_error: ErrorPolicy::Raise,
        timeout: Some(timeout_error()),
    });
    let mut p = pipeline(10, vec![stage], 2);
    let mut got = Vec::new();
    let t = Instant::now();
    let err = loop {
        match p.next_timeout(Duration::from_secs(10)) {
            Next::Item(x) => got.push(x),
            Next::Failed(f) => break f,
            other => panic!("{other:?}"),
        }
    };
    assert!(t.elapsed() < Duration::from_millis(1200));
    assert_eq!(got, vec![0, 1, 2]);
    assert!(matches!(err.kind, FailureKind::Item(ref e) if e.starts_with("d: over")));
}

#[test]
fn a_stuck_call_leaves_the_stage_its_concurrency() {
    // One thread, and its call on item 3 never returns while the rest runs:
    // a new thread takes its place when the call times out, so items 4.. come
    // out at once (each of them also on one thread at a time), and item 10
    // gets stuck too and is replaced again.
    let (release, released) = std::sync::mpsc::channel::<()>();
    let released = Arc::new(std::sync::Mutex::new(released));
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (in_calls, most_seen) = (Arc::clone(&running), Arc::clone(&most));
    let f: ItemFn<u64, String> = Arc::new(move |x| {
        let now = in_calls.fetch_add(1, Ordering::SeqCst) + 1;
        most_seen.fetch_max(now, Ordering::SeqCst);
        if x == 3 || x == 10 {
            in_calls.fetch_sub(1, Ordering::SeqCst); // stuck: no longer the stage's
            let _ = released
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(30));
            return Ok(Some(x));
        }
        std::thread::sleep(Duration::from_millis(2));
        in_calls.fetch_sub(1, Ordering::SeqCst);
        Ok(Some(x))
    });
    let stage = Stage::Map(MapStage {
        name: "stuck".into(),
        work: Work::Dedicated(f, None),
        concurrency: 1,
        ordered: true,
        on_error: ErrorPolicy::Skip { max_failures: None },
        timeout: Some(timeout_error()),
    });
    let started = Instant::now();
    let mut p = pipeline(20, vec![stage], 2);
    let got = drain(&mut p).unwrap();
    let took = started.elapsed();
    let expected: Vec<u64> = (0..20).filter(|x| *x != 3 && *x != 10).collect();
    assert_eq!(got, expected);
    assert!(
        took < Duration::from_secs(10),
        "waited for the stuck calls: {took:?}"
    );
    assert_eq!(p.stats()[1].failures, 2);
    assert_eq!(
        most.load(Ordering::SeqCst),
        1,
        "more calls at once than the concurrency"
    );
    drop(p); // does not wait for the stuck threads
    release.send(()).unwrap();
    release.send(()).unwrap();
}

#[test]
fn the_stall_watch_names_the_stage_that_holds_the_pipeline() {
    let stalls = Arc::new(std::sync::Mutex::new(Vec::<Stall>::new()));
    let hang: ItemFn<u64, String> = Arc::new(|x| {
        if x == 2 {
            std::thread::sleep(Duration::from_millis(700));
        }
        Ok(Some(x))
    });
    let id: ItemFn<u64, String> = Arc::new(|x| Ok(Some(x)));
    let stages = vec![
        map("first", Work::Dedicated(id.clone(), None), 1, true),
        map("hangs", Work::Dedicated(hang, None), 2, true),
        map("last", Work::Inline(id), 2, true),
    ];
    let mut p = pipeline(5, stages, 8);
    let seen = Arc::clone(&stalls);
    p.set_stall_watch(StallWatch {
        after: Duration::from_millis(150),
        report: Arc::new(move |s| seen.lock().unwrap().push(s.clone())),
    });
    assert_eq!(drain(&mut p).unwrap(), vec![0, 1, 2, 3, 4]);
    let stalls = stalls.lock().unwrap();
    assert!(!stalls.is_empty());
    assert!(stalls.iter().all(|s| s.stage == "hangs"), "{stalls:?}");
    assert!(stalls[0].idle >= Duration::from_millis(150));
}

#[test]
fn an_accumulate_stage_emits_when_it_has_a_result_and_flushes_at_the_end() {
    // Sums items until they reach 10; the flush sends on what is left.
    let held = Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
    let stage = |held: &Arc<std::sync::Mutex<Vec<u64>>>, flush: bool| {
        let (h1, h2) = (Arc::clone(held), Arc::clone(held));
        let accumulate: ItemFn<u64, String> = Arc::new(move |x| {
            let mut held = h1.lock().unwrap();
            held.push(x);
            if held.iter().sum::<u64>() >= 10 {
                let sum = held.drain(..).sum();
                return Ok(Some(sum));
            }
            Ok(None)
        });
        let flush: Option<FlushFn<u64, String>> = flush.then(|| -> FlushFn<u64, String> {
            Arc::new(move || {
                let mut held = h2.lock().unwrap();
                Ok((!held.is_empty()).then(|| held.drain(..).sum()))
            })
        });
        Stage::Accumulate(AccumulateStage {
            name: "sum".into(),
            accumulate,
            flush,
        })
    };
    let src = || IterSource([3u64, 4, 5, 9, 2, 8, 1].into_iter().map(Ok));
    let mut p = P::new(src(), vec![stage(&held, true)], config(2), None).unwrap();
    assert_eq!(drain(&mut p).unwrap(), vec![12, 11, 9]);
    held.lock().unwrap().clear();
    let mut p = P::new(src(), vec![stage(&held, false)], config(2), None).unwrap();
    assert_eq!(drain(&mut p).unwrap(), vec![12, 11]);
}

/// A stage function that sleeps `ms` and records the most calls running at
/// once in `most` (and the calls running now in `running`).
fn counting(ms: u64, running: &Arc<AtomicUsize>, most: &Arc<AtomicUsize>) -> ItemFn<u64, String> {
    let (running, most) = (Arc::clone(running), Arc::clone(most));
    Arc::new(move |x| {
        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
        most.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(ms));
        running.fetch_sub(1, Ordering::SeqCst);
        Ok(Some(x))
    })
}

#[test]
fn num_threads_bounds_the_blocking_calls_of_all_stages() {
    for (threads, stages) in [(2, 1), (3, 2)] {
        let (running, most) = (Arc::default(), Arc::default());
        let work: Vec<_> = (0..stages)
            .map(|i| {
                let f = counting(5, &running, &most);
                map(&format!("blocking-{i}"), Work::Blocking(f), 8, true)
            })
            .collect();
        let config = PipelineConfig {
            num_threads: threads,
            sink_buffer: 4,
        };
        let mut p = P::new(source(60), work, config, None).unwrap();
        assert_eq!(drain(&mut p).unwrap(), (0..60).collect::<Vec<_>>());
        // The bound is reached (8 calls are wanted at once) and never passed.
        assert_eq!(most.load(Ordering::SeqCst), threads, "{stages} stage(s)");
    }
}

#[test]
fn a_blocking_call_past_its_timeout_gives_its_permit_back() {
    // One permit; item 1's call is stuck: once it times out, the others run.
    let (release, released) = std::sync::mpsc::channel::<()>();
    let released = Arc::new(std::sync::Mutex::new(released));
    let f: ItemFn<u64, String> = Arc::new(move |x| {
        if x == 1 {
            let _ = released
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(30));
        }
        Ok(Some(x))
    });
    let stage = Stage::Map(MapStage {
        name: "stuck".into(),
        work: Work::Blocking(f),
        concurrency: 2,
        ordered: true,
        on_error: ErrorPolicy::Skip { max_failures: None },
        timeout: Some(timeout_error()),
    });
    let config = PipelineConfig {
        num_threads: 1,
        sink_buffer: 2,
    };
    let started = Instant::now();
    let mut p = P::new(source(10), vec![stage], config, None).unwrap();
    let got = drain(&mut p).unwrap();
    assert_eq!(got, vec![0, 2, 3, 4, 5, 6, 7, 8, 9]);
    assert!(started.elapsed() < Duration::from_secs(10));
    drop(p); // does not wait for the stuck call
    release.send(()).unwrap();
}

#[test]
fn stop_waits_for_the_blocking_calls_that_end_within_the_grace_period() {
    let (started, ended) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (s, e) = (Arc::clone(&started), Arc::clone(&ended));
    let f: ItemFn<u64, String> = Arc::new(move |x| {
        s.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(40));
        e.fetch_add(1, Ordering::SeqCst);
        Ok(Some(x))
    });
    let mut p = running_stage(Work::Blocking(f), 3);
    p.stop();
    // Every call that had started has returned: none runs on after stop.
    assert_eq!(started.load(Ordering::SeqCst), ended.load(Ordering::SeqCst));
    assert!(started.load(Ordering::SeqCst) >= 1);
}

#[test]
fn pipelines_run_on_one_runtime_kept_between_them() {
    // Which threads ran an async stage's calls: with a runtime per
    // pipeline, the second pipeline's threads would all be new ones.
    let seen = |p_items: u64| {
        let ids = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
        let record = Arc::clone(&ids);
        let f: AsyncItemFn<u64, String> = Arc::new(move |x| {
            let record = Arc::clone(&record);
            Box::pin(async move {
                record.lock().unwrap().insert(std::thread::current().id());
                tokio::task::yield_now().await;
                Ok(Some(x))
            })
        });
        let mut p = pipeline(p_items, vec![map("async", Work::Async(f), 4, true)], 2);
        assert_eq!(drain(&mut p).unwrap().len(), p_items as usize);
        drop(p);
        let ids = ids.lock().unwrap().clone();
        ids
    };
    let first = seen(200);
    let second = seen(200);
    assert!(
        !first.is_disjoint(&second),
        "the second pipeline ran on threads of its own"
    );
    assert!(crate::runtime::threads() >= crate::runtime::workers());
}
