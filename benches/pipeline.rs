//! Criterion benches of the pipeline engine: items/s through native no-op
//! stages, and the cost of one channel hop.
//!
//! Run with `cargo bench --bench pipeline`; results and method in BENCHMARKS.md.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ferrofeed::pipeline::{
    ErrorPolicy, ItemFn, IterSource, MapStage, Next, Pipeline, PipelineConfig, Stage, Work,
};

const N: u64 = 200_000;

fn noop_stage(i: usize) -> Stage<u64, String> {
    let f: ItemFn<u64, String> = Arc::new(|x| Ok(Some(black_box(x))));
    Stage::Map(MapStage {
        name: format!("noop{i}"),
        work: Work::Inline(f),
        concurrency: 1,
        ordered: true,
        on_error: ErrorPolicy::Raise,
        timeout: None,
    })
}

fn run(stages: usize, sink_buffer: usize) -> u64 {
    let config = PipelineConfig {
        num_threads: 2,
        sink_buffer,
    };
    let stages = (0..stages).map(noop_stage).collect();
    let mut p = Pipeline::new(IterSource((0..N).map(Ok)), stages, config, None).unwrap();
    let mut sum = 0u64;
    loop {
        if let Some(x) = p.try_next() {
            sum = sum.wrapping_add(x);
            continue;
        }
        match p.next_timeout(Duration::from_secs(10)) {
            Next::Item(x) => sum = sum.wrapping_add(x),
            Next::Finished => return sum,
            Next::Timeout => panic!("stalled"),
            Next::Failed(f) => panic!("{f:?}"),
        }
    }
}

fn bench_noop_stages(c: &mut Criterion) {
    let mut g = c.benchmark_group("pipeline");
    g.throughput(Throughput::Elements(N));
    g.sample_size(20);
    g.bench_function("3_native_noop_stages", |b| {
        b.iter(|| black_box(run(3, 64)));
    });
    g.bench_function("0_stages_source_to_sink", |b| {
        b.iter(|| black_box(run(0, 64)));
    });
    g.finish();
}

fn bench_channel_hop(c: &mut Criterion) {
    // One item through a bounded flume channel between two threads, as
    // between a pipeline's source thread and its first stage.
    let mut g = c.benchmark_group("channel_hop");
    g.throughput(Throughput::Elements(N));
    g.sample_size(20);
    g.bench_function("flume_bounded_64_thread_to_thread", |b| {
        b.iter(|| {
            let (tx, rx) = flume::bounded::<u64>(64);
            let producer = std::thread::spawn(move || {
                for i in 0..N {
                    tx.send(i).unwrap();
                }
            });
            let mut sum = 0u64;
            while let Ok(x) = rx.recv() {
                sum = sum.wrapping_add(x);
            }
            producer.join().unwrap();
            black_box(sum)
        });
    });
    g.finish();
}

criterion_group!(benches, bench_noop_stages, bench_channel_hop);
criterion_main!(benches);
