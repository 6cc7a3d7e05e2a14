//! What the shard formats' tests share: reading a range of a shard and
//! what it delivers ([`read_range`]), the outcome of counting and reading as
//! text ([`outcome`]), a format's read helpers ([`format_test_reads!`]), and
//! the error for bytes a shard in memory does not hold
//! ([`assert_not_fetched`]).

use std::path::Path;

use super::{Sample, Shard, ShardError, ShardFormat};

/// Every sample a read delivers, numbered.
pub(crate) type Delivered = Vec<(u64, Result<Sample, ShardError>)>;

/// What `format` delivers reading samples `lo..hi` of `shard`, and how the
/// read ended.
pub(crate) fn read_range(
    format: &dyn ShardFormat,
    shard: &Shard,
    lo: u64,
    hi: u64,
) -> (Delivered, Result<(), ShardError>) {
    let mut got = Vec::new();
    let end = format.read(shard, lo, hi, &mut |n, s| got.push((n, s)));
    (got, end)
}

/// What counting `shard` with `format` and reading `lo..hi` of it give,
/// errors as text (which names the shard): the readers' tests compare it
/// for the same bytes from a file and from memory.
pub(crate) fn outcome(format: &dyn ShardFormat, shard: &Shard, lo: u64, hi: u64) -> String {
    let count = format.count(shard).map_err(|e| e.to_string());
    let mut got = Vec::new();
    let end = format.read(shard, lo, hi, &mut |n, s| {
        got.push((n, s.map_err(|e| e.to_string())));
    });
    format!("{count:?} {got:?} {:?}", end.map_err(|e| e.to_string()))
}

/// The read helpers of a format's tests, for the format `$format`: `read`
/// (samples `lo..hi` of a file) and `read_shard` (of any shard), each giving
/// what the read delivered ([`Delivered`]) and how it ended, and `outcome`
/// (counting and reading, as text).
macro_rules! format_test_reads {
    ($format:expr) => {
        fn read(
            path: &std::path::Path,
            lo: u64,
            hi: u64,
        ) -> ($crate::shards::testing::Delivered, Result<(), ShardError>) {
            $crate::shards::testing::read_range(&$format, &Shard::file(path), lo, hi)
        }

        fn read_shard(
            shard: &Shard,
            lo: u64,
            hi: u64,
        ) -> ($crate::shards::testing::Delivered, Result<(), ShardError>) {
            $crate::shards::testing::read_range(&$format, shard, lo, hi)
        }

        fn outcome(shard: &Shard, lo: u64, hi: u64) -> String {
            $crate::shards::testing::outcome(&$format, shard, lo, hi)
        }
    };
}
pub(crate) use format_test_reads;

/// Asserts that `result` is the I/O error of shard `name` for bytes a shard
/// in memory does not hold (a tail, a head: "not fetched").
#[track_caller]
pub(crate) fn assert_not_fetched<T: std::fmt::Debug>(result: Result<T, ShardError>, name: &Path) {
    match result {
        Err(ShardError::Io { shard, source }) => {
            assert_eq!(shard, name);
            assert!(source.to_string().contains("not fetched"), "{source}");
        }
        other => panic!("{other:?}"),
    }
}
