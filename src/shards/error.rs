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
