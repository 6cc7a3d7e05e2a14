//! What a shard writer of any format does: the one trait the pack's
//! writer drives ([`super::tar`], [`super::parquet`]).

use super::dest::ShardOut;
use super::sample::Prepared;
use super::PackError;

/// A shard written to its end, not yet committed.
pub struct Finished {
    /// The file or upload, to commit.
    pub out: ShardOut,
    /// Its samples.
    pub samples: u64,
    /// The first sample's key.
    pub first_key: Option<String>,
    /// The last sample's key.
    pub last_key: Option<String>,
    /// Where each sample starts (tar).
    pub offsets: Option<Vec<u64>>,
    /// Where the last sample ends (tar).
    pub end: Option<u64>,
}

/// A shard being written, one sample at a time, in order.
pub trait FormatWriter: Send {
    /// The bytes `s` would add to the shard (what `shard_size` counts).
    fn cost(&self, s: &Prepared) -> u64;

    /// Writes `s`.
    ///
    /// # Errors
    ///
    /// [`PackError::Dest`] when the write fails; [`PackError::BadSample`]
    /// when the sample does not fit the shard (a Parquet file's columns).
    fn append(&mut self, s: &Prepared) -> Result<(), PackError>;

    /// Samples written so far.
    fn samples(&self) -> u64;

    /// Writes the shard's end (tar's zero blocks, Parquet's footer).
    ///
    /// # Errors
    ///
    /// [`PackError::Dest`] when the write fails.
    fn finish(self: Box<Self>) -> Result<Finished, PackError>;
}
