//! Writing shards: an image folder or any samples packed into `WebDataset`
//! tar shards or Hugging Face-layout Parquet files, in parallel, locally or
//! straight into object storage (`ferrofeed pack`, `write_shards`).
//!
//! - **What goes in**: [`Sample`]s, a key and named fields; an image
//!   folder's files are read by the workers ([`run::pack_files`]), other
//!   samples handed over in batches ([`run::pack_samples`]).
//! - **Checked**: every image field is checked whole without decoding
//!   ([`check`]), or decoded and re-encoded smaller ([`encode`]); a bad one
//!   stops the pack naming it, or is skipped and counted
//!   ([`OnError::Skip`]).
//! - **Written**: [`tar`] (`KEY.jpg` with the file's bytes unchanged,
//!   `KEY.cls`; fixed header fields) or [`parquet`] (`image` {bytes, path},
//!   `label`); shards cut in input order ([`writer`]), so the same input and
//!   options give the same bytes whatever the number of workers.
//! - **Safely**: a shard appears whole or not at all ([`dest`]: temporary
//!   name then rename, or a multipart upload completed at the end); a pack
//!   killed and run again keeps its finished shards and goes on after them
//!   ([`writer`]'s records); at the end, the sample index
//!   (`crate::shards::index`) is written next to the shards.
//!
//! # Example
//!
//! ```
//! use ferrofeed::pack::{run, Dest, OutputFormat, PackOptions, Packer, Sample, Value};
//!
//! let dir = tempfile::tempdir()?;
//! let out = dir.path().join("shards");
//! let dest = Dest::open(out.to_str().unwrap(), &Vec::new())?;
//! let options = PackOptions { samples_per_shard: Some(2), ..PackOptions::default() };
//! let mut packer = Packer::open(dest, options, &serde_json::json!({"example": 1}))?;
//! let samples = (0..3)
//!     .map(|i| Sample {
//!         key: None,
//!         path: None,
//!         fields: vec![("txt".into(), Value::Text(format!("sample {i}")))],
//!     })
//!     .collect();
//! run::pack_samples(samples, 0, &mut packer, 2)?;
//! let summary = packer.finish()?;
//! assert_eq!((summary.samples, summary.shards), (3, 2));
//! assert!(out.join("shard-000001.tar").is_file());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod check;
pub mod dest;
pub mod encode;
mod error;
pub mod parquet;
pub mod run;
pub mod sample;
pub mod shard;
pub mod tar;
#[cfg(test)]
mod testing;
pub mod writer;

use serde_json::{json, Value as Json};

pub use dest::{Dest, Stamp};
pub use encode::Reencode;
pub use error::{DestKind, PackError};
pub use sample::{Prepared, Sample, Value};
pub use writer::{Packer, Progress, Skip, Summary};

/// The shard size when neither a size nor a sample count is given.
pub const DEFAULT_SHARD_SIZE: u64 = 256 << 20;

/// The format of the shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputFormat {
    /// `WebDataset` tar shards.
    #[default]
    Tar,
    /// Parquet files in the Hugging Face image layout.
    Parquet,
}

/// What a sample that cannot be packed does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnError {
    /// Stops the pack with its error (the default).
    #[default]
    Raise,
    /// Leaves it out, counted in the summary.
    Skip,
}

/// How to pack.
#[derive(Debug, Clone, PartialEq)]
pub struct PackOptions {
    /// Tar or Parquet.
    pub format: OutputFormat,
    /// A shard takes samples until the next would take it past this many
    /// bytes (tar: the members' bytes with their headers; Parquet: the
    /// values' bytes). `None` with no `samples_per_shard`:
    /// [`DEFAULT_SHARD_SIZE`].
    pub shard_size: Option<u64>,
    /// A shard takes at most this many samples.
    pub samples_per_shard: Option<u64>,
    /// Threads that prepare samples (at least 1).
    pub workers: usize,
    /// Stop at a bad sample, or skip it.
    pub on_error: OnError,
    /// Re-encode the image field.
    pub reencode: Option<Reencode>,
    /// Shards are named `PREFIX-NNNNNN.tar` (or `.parquet`).
    pub prefix: String,
    /// The classes' names (the Parquet `label`'s `ClassLabel`).
    pub class_names: Option<Vec<String>>,
}

impl Default for PackOptions {
    fn default() -> Self {
        Self {
            format: OutputFormat::Tar,
            shard_size: None,
            samples_per_shard: None,
            workers: crate::runtime::cpu::machine_threads(),
            on_error: OnError::Raise,
            reencode: None,
            prefix: "shard".into(),
            class_names: None,
        }
    }
}

impl PackOptions {
    /// The options checked, with the default shard size filled in.
    ///
    /// # Errors
    ///
    /// [`PackError::Options`] naming the option out of range.
    pub fn validated(mut self) -> Result<Self, PackError> {
        let bad = |s: String| Err(PackError::Options(s));
        if self.shard_size == Some(0) {
            return bad("shard_size must be at least 1 byte".into());
        }
        if self.samples_per_shard == Some(0) {
            return bad("samples_per_shard must be at least 1".into());
        }
        if self.workers == 0 {
            return bad("workers must be at least 1".into());
        }
        if self.prefix.is_empty()
            || self.prefix.contains(['/', '\\', '\0'])
            || self.prefix.starts_with('.')
        {
            return bad(format!(
                "the shard name prefix {:?} must be a plain, visible file name",
                self.prefix
            ));
        }
        if let Some(r) = self.reencode {
            self.reencode = Some(r.validated().map_err(PackError::Options)?);
        }
        if self.shard_size.is_none() && self.samples_per_shard.is_none() {
            self.shard_size = Some(DEFAULT_SHARD_SIZE);
        }
        Ok(self)
    }

    /// The options that decide the shards' bytes, as JSON (part of the
    /// pack's fingerprint; `workers` and `on_error` are not: a pack that
    /// stopped at a bad file can be resumed with `OnError::Skip`).
    pub fn describe(&self) -> Json {
        json!({
            "format": match self.format {
                OutputFormat::Tar => "tar",
                OutputFormat::Parquet => "parquet",
            },
            "shard_size": self.shard_size,
            "samples_per_shard": self.samples_per_shard,
            "resize": self.reencode.map(|r| r.shorter),
            "quality": self.reencode.map(|r| r.quality),
            "prefix": self.prefix,
            "class_names": self.class_names,
        })
    }
}
