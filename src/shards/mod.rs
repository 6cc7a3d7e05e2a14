//! Sharded sources: samples stored many to a file, read in order, whole.
//!
//! Most public datasets come in shards: `WebDataset` tar files ([`tar`]),
//! Parquet files ([`parquet`]) and JSON lines ([`jsonl`]). A shard is read
//! front to back (a random read per sample is slow on disk and ruinous on
//! object storage), so a reader here does two things only:
//!
//! - [`ShardFormat::count`]: the number of samples of a shard, read once when
//!   a source is opened (from the tar headers, the Parquet footer, the lines);
//! - [`ShardFormat::read`]: the samples `lo..hi` of a shard, in stored order.
//!
//! Which shards, which ranges of them and in what order is the sharded plan's
//! business (`crate::shard_plan`); turning a [`Sample`] into a Python dict is
//! the bindings' (`src/py/shards.rs`).
//!
//! # Errors
//!
//! Every error names the shard and where in it (a member, a row group, a
//! line). A reader tells a sample that cannot be parsed on its own (a
//! malformed JSON line) from a shard whose rest cannot be read (a truncated
//! tar, a corrupt Parquet page): the first is passed to the callback as that
//! sample's `Err` and reading goes on; the second ends [`ShardFormat::read`]
//! with an `Err`, and the samples not yet delivered are lost with it.

pub mod jsonl;
pub mod parquet;
pub mod tar;

use std::path::{Path, PathBuf};

/// A value of a sample's field, as read from a shard.
///
/// Tar members are [`Value::Bytes`] (the bindings decode `cls`, `txt`,
/// `json`, ... by extension); JSON lines and Parquet rows map onto the rest.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// JSON `null`, a Parquet null.
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer (every Parquet integer type that fits; JSON integers).
    Int(i64),
    /// A floating-point number.
    Float(f64),
    /// Text.
    Str(String),
    /// Raw bytes (a tar member's content, a Parquet binary column, a
    /// Hugging Face image column's `bytes`).
    Bytes(Vec<u8>),
    /// A list (a JSON array, a Parquet list).
    List(Vec<Value>),
    /// Named fields in stored order (a JSON object, a Parquet struct or map
    /// with string keys).
    Map(Vec<(String, Value)>),
}

/// One sample of a shard.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Its name within the shard: a tar sample's key (the member path up to
    /// the first dot of its base name), `"row N"` of a Parquet file, `"line
    /// N"` (1-based) of a JSON lines file.
    pub key: String,
    /// Its fields in stored order: a tar sample's members by extension (the
    /// base name after the key's dot: `"jpg"`, `"cls"`, `"seg.png"`); a
    /// Parquet row's projected columns; a JSON line's top-level object keys
    /// (a line that is not an object is one field named `""`).
    pub fields: Vec<(String, Value)>,
}

impl Sample {
    /// The value of the field `name`, if the sample has it.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.fields.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }
}

/// What a shard's count found, beyond the number of samples.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShardInfo {
    /// Samples in the shard.
    pub samples: u64,
    /// The key of its first and last sample (tar shards only: a sample whose
    /// members straddle two shards shows as the last key of one shard equal
    /// to the first key of the next).
    pub first_key: Option<String>,
    /// See `first_key`.
    pub last_key: Option<String>,
}

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

/// A shard file format: counts a shard's samples, reads a range of them.
///
/// Implementations are cheap to share between threads: every call opens the
/// shard itself.
pub trait ShardFormat: Send + Sync {
    /// Counts the samples of the shard at `path` (and, for tar, the keys at
    /// its ends).
    ///
    /// # Errors
    ///
    /// [`ShardError`] when the shard cannot be opened or is corrupt where
    /// counting reads it.
    fn count(&self, path: &Path) -> Result<ShardInfo, ShardError>;

    /// Reads samples `lo..hi` (0-based, in stored order) of the shard at
    /// `path`, calling `each(n, sample)` for each, in order, with `n` its
    /// number in the shard. A sample that cannot be parsed on its own comes
    /// as `Err` and reading goes on.
    ///
    /// # Errors
    ///
    /// [`ShardError`] when the rest of the shard cannot be read (the samples
    /// from the first one not delivered up to `hi` are then lost), or when
    /// the shard has fewer than `hi` samples ([`ShardError::Changed`]).
    fn read(
        &self,
        path: &Path,
        lo: u64,
        hi: u64,
        each: &mut dyn FnMut(u64, Result<Sample, ShardError>),
    ) -> Result<(), ShardError>;
}

/// Counts and reads `data` as a shard of every format, for the fuzz target
/// `shards` (`fuzz/fuzz_targets/shards.rs`) and the unit test that replays
/// its committed inputs. The bytes are written to a file under `dir` (the
/// readers take paths). Every error is fine (the input is arbitrary); a panic
/// is a finding, and so is a read that disagrees with the count.
///
/// # Errors
///
/// A description of the first disagreement between `count` and `read`.
#[doc(hidden)]
pub fn fuzz_every_format(data: &[u8], dir: &Path) -> Result<(), String> {
    let formats: [(&str, Box<dyn ShardFormat>); 3] = [
        ("shard.tar", Box::new(tar::TarFormat)),
        ("shard.jsonl", Box::new(jsonl::JsonLinesFormat)),
        ("shard.parquet", Box::new(parquet::ParquetFormat::new(None))),
    ];
    for (name, format) in formats {
        let path = dir.join(name);
        std::fs::write(&path, data).map_err(|e| format!("{}: {e}", path.display()))?;
        let info = match format.count(&path) {
            Ok(info) => info,
            Err(e) => {
                caught_panic(name, &e)?;
                continue;
            }
        };
        // Read everything, then the second half: what a rank reading from a
        // member on gets. Delivered numbers must be in order and in range.
        for lo in [0, info.samples / 2] {
            let mut next = lo;
            let mut bad = None;
            let result = format.read(&path, lo, info.samples, &mut |n, _| {
                if n != next && bad.is_none() {
                    bad = Some(format!("{name}: sample {n} delivered where {next} was due"));
                }
                next = n + 1;
            });
            if let Some(bad) = bad {
                return Err(bad);
            }
            if let Err(e) = &result {
                caught_panic(name, e)?;
            }
            // A shard that counted must read to the end, or fail saying where.
            if result.is_ok() && next != info.samples {
                return Err(format!(
                    "{name}: counted {} samples, read {} from {lo} without an error",
                    info.samples,
                    next - lo
                ));
            }
        }
    }
    Ok(())
}

/// A panic of a decoder crate, caught and turned into an error by the
/// reader's guard, is a finding all the same.
fn caught_panic(name: &str, error: &ShardError) -> Result<(), String> {
    let text = error.to_string();
    if text.contains(parquet::DECODER_PANIC) {
        return Err(format!("{name}: {text}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The fuzz target's committed inputs (seeds and regressions) replay
    /// without a panic or a disagreement.
    #[test]
    fn committed_fuzz_inputs_replay() {
        let dir = tempfile::tempdir().unwrap();
        let inputs = crate::fuzz_inputs::committed("shards");
        assert!(inputs.len() >= 5, "seeds are committed: {}", inputs.len());
        for (path, data) in inputs {
            if let Err(e) = super::fuzz_every_format(&data, dir.path()) {
                panic!("{}: {e}", path.display());
            }
        }
    }
}
