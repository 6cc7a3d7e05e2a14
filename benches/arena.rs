//! Criterion benches of the arena: build throughput and random `get` latency.
//!
//! Run with `cargo bench --bench arena`; results and method in BENCHMARKS.md.

#![allow(clippy::many_single_char_names)]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use ferrofeed::arena::{Arena, ArenaWriter};

/// Items the size of a pickled COCO annotation (a few hundred bytes), with
/// deterministic varied lengths.
fn items(n: usize) -> Vec<Vec<u8>> {
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    (0..n)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let len = 200 + (state % 600) as usize;
            vec![(i % 251) as u8; len]
        })
        .collect()
}

fn shm_dir() -> tempfile::TempDir {
    let base = std::path::Path::new("/dev/shm");
    if base.is_dir() {
        tempfile::tempdir_in(base).expect("tempdir in /dev/shm")
    } else {
        tempfile::tempdir().expect("tempdir")
    }
}

fn bench_build(c: &mut Criterion) {
    let dir = shm_dir();
    let data = items(100_000);
    let bytes: u64 = data.iter().map(|v| v.len() as u64).sum();
    let mut g = c.benchmark_group("arena_build");
    g.throughput(Throughput::Bytes(bytes));
    g.sample_size(20);
    g.bench_function("100k_items_~500B", |b| {
        b.iter_batched(
            || (),
            |()| {
                let mut w = ArenaWriter::create_in(dir.path()).unwrap();
                for item in &data {
                    w.push(item).unwrap();
                }
                // Dropping the owned arena removes the file.
                black_box(w.finish().unwrap());
            },
            BatchSize::PerIteration,
        );
    });
    g.finish();
}

fn bench_get(c: &mut Criterion) {
    let dir = shm_dir();
    let n = 1_000_000;
    let mut w = ArenaWriter::create_in(dir.path()).unwrap();
    for item in items(n) {
        w.push(&item).unwrap();
    }
    let owned = w.finish().unwrap();
    let arena = Arena::open(owned.path()).unwrap();
    // A fixed pseudo-random visiting order over all items.
    let order: Vec<usize> = (0..n).map(|i| (i * 7_919 + 13) % n).collect();
    let mut g = c.benchmark_group("arena_get");
    g.throughput(Throughput::Elements(1));
    let mut k = 0usize;
    g.bench_function("random_get_1M_items", |b| {
        b.iter(|| {
            k = (k + 1) % n;
            black_box(arena.get(order[k]).map(<[u8]>::len))
        });
    });
    g.bench_function("random_get_and_sum_bytes", |b| {
        b.iter(|| {
            k = (k + 1) % n;
            let item = arena.get(order[k]).unwrap_or_default();
            black_box(item.iter().map(|&x| u64::from(x)).sum::<u64>())
        });
    });
    g.finish();
}

criterion_group!(benches, bench_build, bench_get);
criterion_main!(benches);
