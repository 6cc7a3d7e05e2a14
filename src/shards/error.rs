//! What goes wrong reading a shard: [`ShardError`], naming the shard and
//! where in it.

use std::path::{Path, PathBuf};

/// What went wrong reading a shard. Every variant names the shard.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    /// The shard could not be opened or read.
    #[error("{shard}: {source}")]
    Io {
        /// The shard.
        shard: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The shard's content is not what its format says, at `at` (`"member
    /// 000123.jpg"`, `"row group 3"`, `"line 17"`, `"footer"`, `"end of
    /// file"`).
    #[error("{shard}: {at}: {message}")]
    Corrupt {
        /// The shard.
        shard: PathBuf,
        /// Where in the shard.
        at: String,
        /// What is wrong there.
        message: String,
    },
    /// The shard holds fewer samples than when it was counted (it changed
    /// since the source was opened).
    #[error(
        "{shard}: has {found} samples, {expected} when the source was opened (did it change?)"
    )]
    Changed {
        /// The shard.
        shard: PathBuf,
        /// Samples counted when the source was opened.
        expected: u64,
        /// Samples found now.
        found: u64,
    },
    /// The shard could not be fetched from object storage (its message
    /// starts with the URL).
    #[error("{source}")]
    Remote {
        /// The shard's URL.
        shard: PathBuf,
        /// What went wrong.
        #[source]
        source: std::sync::Arc<crate::remote::RemoteError>,
    },
}

impl ShardError {
    /// An I/O error on `shard`.
    pub fn io(shard: &Path, source: std::io::Error) -> Self {
        Self::Io {
            shard: shard.to_path_buf(),
            source,
        }
    }

    /// Corrupt content of `shard` at `at`.
    pub fn corrupt(shard: &Path, at: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Corrupt {
            shard: shard.to_path_buf(),
            at: at.into(),
            message: message.into(),
        }
    }
}

/// A [`crate::shards::ShardSet`] made or asked for what it does not hold.
#[derive(Debug, thiserror::Error)]
pub enum ShardSetError {
    /// The remote fetcher's objects are not one per shard.
    #[error("{objects} remote shards for {shards} paths")]
    Remote {
        /// Objects of the fetcher.
        objects: usize,
        /// Shards of the set.
        shards: usize,
    },
    /// The sample offsets are not one entry per shard.
    #[error("{offsets} entries of offsets for {shards} shards: one entry per shard")]
    Offsets {
        /// Entries given.
        offsets: usize,
        /// Shards of the set.
        shards: usize,
    },
    /// A window's pieces and their first ids differ in number.
    #[error("{ids} first ids for {pieces} pieces: one first id per piece")]
    FirstIds {
        /// First ids given.
        ids: usize,
        /// Pieces given.
        pieces: usize,
    },
    /// A piece outside the shards (or with `lo > hi`).
    #[error("no piece {lo}..{hi} of shard {shard} (of {shards})")]
    Piece {
        /// The piece's shard.
        shard: usize,
        /// Its first sample.
        lo: u64,
        /// One past its last.
        hi: u64,
        /// Shards of the set.
        shards: usize,
    },
}

/// What can stop a [`crate::shards::WindowFeed`]'s epoch. A sample that
/// cannot be read is not one of these: it is kept in its window as its
/// [`ShardError`].
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    /// The plan counts another number of shards than the set holds.
    #[error("the plan has {counts} shards, the source {shards}")]
    Plan {
        /// Shards the plan counts.
        counts: usize,
        /// Shards of the set.
        shards: usize,
    },
    /// The process's runtime, which runs the reads, could not start.
    #[error("the async runtime could not start: {0}")]
    Runtime(#[source] std::io::Error),
    /// The shards could not be fetched ahead (a remote source).
    #[error(transparent)]
    Remote(#[from] crate::remote::RemoteError),
    /// A window's pieces are not the set's.
    #[error(transparent)]
    Set(#[from] ShardSetError),
    /// A window's read ended without a result: cancelled before it
    /// started (only a dropped epoch cancels reads, and it waits for none).
    #[error("a window's read was cancelled before it started")]
    Cancelled,
    /// Reading a window panicked (a bug: the readers turn bad data into
    /// errors).
    #[error("reading a window panicked: {0}")]
    Panicked(String),
}
