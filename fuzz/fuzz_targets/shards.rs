//! Counts and reads arbitrary bytes as a tar, JSON lines and Parquet shard,
//! from a file and from memory.
//!
//! Every input must give samples or a `ShardError`: never a panic, never a
//! read that delivers samples out of order or disagrees with the count, and
//! the same from a file as from memory.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // One directory per process, for the file each input is also read from.
    thread_local! {
        static DIR: tempfile::TempDir = tempfile::tempdir().expect("a temporary directory");
    }
    DIR.with(|dir| {
        if let Err(e) = ferrofeed::shards::fuzz_every_format(data, dir.path()) {
            panic!("{e}");
        }
    });
});
