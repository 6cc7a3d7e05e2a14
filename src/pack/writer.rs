//! The pack's writer: samples in input order in, shards and their records
//! out, resumable.
//!
//! # Which sample goes in which shard
//!
//! Shards are cut in input order, by a rule that looks only at the samples
//! since the shard began: a shard takes samples until it holds
//! `samples_per_shard`, or until the next sample would take it past
//! `shard_size` (a sample larger than that gets a shard of its own).
//! Skipped samples take no room. So where shard `k + 1` begins depends only
//! on where shard `k` began and on the input, never on threads or timing.
//!
//! # Records, resume, the index
//!
//! Once a shard is whole and under its name, its record (its input range
//! `lo..hi`, the samples it skipped, its index entry) is written to
//! `.ferrofeed-pack/NNNNNN.json`; the pack's fingerprint (input and
//! options) to `.ferrofeed-pack/pack.json` before anything else. A pack run
//! again into the same destination with the same fingerprint keeps the
//! shards whose records follow each other from the first (and whose files
//! still have the recorded size and version) and starts at the input
//! position where the last one ended: it rewrites no finished shard and
//! duplicates no sample. At the end the index (`_ferrofeed-index.json`,
//! `crate::shards::index`) is written, with the pack's summary under
//! `pack`, and the records are removed; a pack run again after that finds
//! the index, with its fingerprint, and has nothing to do.

use std::fs::File;
use std::time::Instant;

use md5::Digest as _;
use serde_json::{json, Value as Json};

use super::dest::{Dest, Stamp};
use super::parquet::ParquetWriter;
use super::sample::{skippable, Prepared};
use super::shard::FormatWriter;
use super::tar::TarWriter;
use super::{OutputFormat, PackError, PackOptions};
use crate::shards::index::{Index, ShardEntry, INDEX_NAME};

/// The folder of a pack's records, in the destination.
pub const RECORDS: &str = ".ferrofeed-pack";

/// The version of the records' layout (a pack of another one is not
/// resumed: it is refused as another pack).
const RECORDS_VERSION: u64 = 1;

/// A sample left out under `OnError::Skip`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skip {
    /// Its position in the input.
    pub position: u64,
    /// Its file or key.
    pub name: String,
    /// Why.
    pub reason: String,
}

impl Skip {
    fn to_json(&self) -> Json {
        json!([self.position, self.name, self.reason])
    }

    fn from_json(v: &Json) -> Option<Self> {
        let a = v.as_array()?;
        Some(Self {
            position: a.first()?.as_u64()?,
            name: a.get(1)?.as_str()?.to_string(),
            reason: a.get(2)?.as_str()?.to_string(),
        })
    }
}

/// A finished shard.
#[derive(Debug, Clone)]
struct Record {
    /// The input positions it covers (its samples and the skipped ones).
    lo: u64,
    hi: u64,
    entry: ShardEntry,
    skipped: Vec<Skip>,
}

impl Record {
    fn to_json(&self, fingerprint: &str) -> Json {
        json!({
            "version": RECORDS_VERSION,
            "fingerprint": fingerprint,
            "lo": self.lo,
            "hi": self.hi,
            "skipped": self.skipped.iter().map(Skip::to_json).collect::<Vec<_>>(),
            "entry": self.entry.to_json(),
        })
    }

    fn from_json(v: &Json, fingerprint: &str) -> Option<Self> {
        if v.get("version")?.as_u64()? != RECORDS_VERSION
            || v.get("fingerprint")?.as_str()? != fingerprint
        {
            return None;
        }
        Some(Self {
            lo: v.get("lo")?.as_u64()?,
            hi: v.get("hi")?.as_u64()?,
            skipped: v
                .get("skipped")?
                .as_array()?
                .iter()
                .map(Skip::from_json)
                .collect::<Option<_>>()?,
            entry: ShardEntry::from_json(v.get("entry")?, "record").ok()?,
        })
    }
}

/// What a pack did: the totals of the destination's shards (those kept
/// from an earlier run included).
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Samples in the shards.
    pub samples: u64,
    /// Shards.
    pub shards: u64,
    /// Bytes of the shards.
    pub bytes: u64,
    /// Samples left out (`OnError::Skip`), with why.
    pub skipped: Vec<Skip>,
    /// Shards kept from an earlier run of the same pack.
    pub resumed: u64,
    /// Seconds this run took.
    pub seconds: f64,
    /// Where the index is.
    pub index: String,
}

/// How far a pack is (for a progress bar).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// Input positions done (written or skipped), those of earlier runs
    /// included.
    pub done: u64,
    /// Samples written, earlier runs included.
    pub samples: u64,
    /// Bytes of the finished shards.
    pub bytes: u64,
    /// Samples skipped.
    pub skipped: u64,
    /// Finished shards.
    pub shards: u64,
}

/// The shard being written.
struct Open {
    writer: Box<dyn FormatWriter>,
    name: String,
    lo: u64,
    cost: u64,
    skipped: Vec<Skip>,
}

/// The pack's writer (see the module docs).
pub struct Packer {
    dest: Dest,
    options: PackOptions,
    fingerprint: String,
    description: Json,
    records: Vec<Record>,
    resumed: u64,
    open: Option<Open>,
    /// Skips since the last finished shard, while none is open.
    pending: Vec<Skip>,
    /// The input position expected next.
    next: u64,
    /// Samples in the shard being written.
    progress: Progress,
    started: Instant,
    complete: Option<Summary>,
    lock: Option<File>,
}

impl std::fmt::Debug for Packer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packer")
            .field("dest", &self.dest)
            .field("next", &self.next)
            .field("shards", &self.records.len())
            .finish_non_exhaustive()
    }
}

impl Packer {
    /// Opens the destination for a pack with `options` of an input whose
    /// identity is `input` (part of the fingerprint: its size, and a digest
    /// of what it holds), and finds where an earlier run of the same pack
    /// stopped.
    ///
    /// # Errors
    ///
    /// [`PackError::Conflict`]: the destination holds other files, or a
    /// pack of another input or options, or another pack writes it now;
    /// [`PackError::Dest`]: it cannot be listed or written (a missing
    /// bucket, a folder without write permission); [`PackError::Options`].
    pub fn open(dest: Dest, options: PackOptions, input: &Json) -> Result<Self, PackError> {
        let options = options.validated()?;
        let description = json!({"options": options.describe(), "input": input});
        let fingerprint = format!("{:x}", md5::Md5::digest(description.to_string().as_bytes()));
        let lock = dest.lock(RECORDS)?;
        let mut this = Self {
            dest,
            options,
            fingerprint,
            description,
            records: Vec::new(),
            resumed: 0,
            open: None,
            pending: Vec::new(),
            next: 0,
            progress: Progress::default(),
            started: Instant::now(),
            complete: None,
            lock,
        };
        this.find_earlier()?;
        Ok(this)
    }

    /// Reads what the destination holds: nothing (a new pack), this pack
    /// finished (its index), or this pack's records (a resume).
    fn find_earlier(&mut self) -> Result<(), PackError> {
        let names = self.dest.list(RECORDS)?;
        let conflict = |reason: String| PackError::Conflict {
            dest: self.dest.shown(),
            reason,
        };
        let marker = format!("{RECORDS}/pack.json");
        if names.iter().any(|(n, _)| n == INDEX_NAME) {
            let bytes = self.dest.read(INDEX_NAME)?.unwrap_or_default();
            let index = Index::parse(&bytes, &self.dest.url_of(INDEX_NAME))
                .map_err(|e| conflict(format!("it holds an index that cannot be read: {e}")))?;
            let same = index
                .pack
                .as_ref()
                .and_then(|p| p.get("fingerprint"))
                .and_then(Json::as_str)
                == Some(self.fingerprint.as_str());
            if !same {
                return Err(conflict(
                    "it holds shards and an index of another pack (other input or options, or \
                     not made by `ferrofeed pack`); pack into an empty folder or prefix"
                        .into(),
                ));
            }
            let skipped = index
                .pack
                .as_ref()
                .and_then(|p| p.get("skipped"))
                .and_then(Json::as_array)
                .map(|a| a.iter().filter_map(Skip::from_json).collect())
                .unwrap_or_default();
            self.complete = Some(Summary {
                samples: index.shards.iter().map(|e| e.samples).sum(),
                shards: index.shards.len() as u64,
                bytes: index.shards.iter().map(|e| e.size).sum(),
                skipped,
                resumed: index.shards.len() as u64,
                seconds: 0.0,
                index: self.dest.url_of(INDEX_NAME),
            });
            self.remove_records(&names)?;
            return Ok(());
        }
        if names.iter().any(|(n, _)| *n == marker) {
            let bytes = self.dest.read(&marker)?.unwrap_or_default();
            let theirs: Option<Json> = serde_json::from_slice(&bytes).ok();
            let same = theirs
                .as_ref()
                .and_then(|t| t.get("fingerprint"))
                .and_then(Json::as_str)
                == Some(self.fingerprint.as_str());
            if !same {
                return Err(conflict(format!(
                    "it holds an unfinished pack of other input or options ({RECORDS}/pack.json); \
                     run that pack again to finish it, or pack into an empty folder or prefix"
                )));
            }
            self.resume(&names)?;
            return Ok(());
        }
        let foreign: Vec<&str> = names
            .iter()
            .map(|(n, _)| n.as_str())
            .filter(|n| !n.starts_with('.'))
            .collect();
        if let Some(first) = foreign.first() {
            return Err(conflict(format!(
                "it is not empty ({} entries, such as {first:?}); pack into an empty folder or \
                 prefix",
                foreign.len()
            )));
        }
        let mut marker_json = self.description.clone();
        marker_json["version"] = json!(RECORDS_VERSION);
        marker_json["fingerprint"] = json!(self.fingerprint);
        self.dest
            .write(&marker, marker_json.to_string().as_bytes())?;
        Ok(())
    }

    /// Keeps the records that follow each other from shard 0 and whose
    /// shards are as recorded; the pack goes on after the last.
    fn resume(&mut self, names: &[(String, Stamp)]) -> Result<(), PackError> {
        for k in 0.. {
            let record_name = format!("{RECORDS}/{k:06}.json");
            if !names.iter().any(|(n, _)| *n == record_name) {
                break;
            }
            let Some(bytes) = self.dest.read(&record_name)? else {
                break;
            };
            let Some(record) = serde_json::from_slice(&bytes)
                .ok()
                .and_then(|v: Json| Record::from_json(&v, &self.fingerprint))
            else {
                break;
            };
            let expected_lo = self.records.last().map_or(0, |r| r.hi);
            let expected_name = self.shard_name(k);
            let stamp = names
                .iter()
                .find(|(n, _)| *n == record.entry.name)
                .map(|(_, s)| s);
            let intact = stamp.is_some_and(|s| {
                s.size == record.entry.size
                    && (s.etag.is_none()
                        || record.entry.etag.is_none()
                        || s.etag == record.entry.etag)
                    && (s.mtime_ns.is_none()
                        || record.entry.mtime_ns.is_none()
                        || s.mtime_ns == record.entry.mtime_ns)
            });
            if record.lo != expected_lo || record.entry.name != expected_name || !intact {
                break;
            }
            self.records.push(record);
        }
        self.resumed = self.records.len() as u64;
        self.next = self.records.last().map_or(0, |r| r.hi);
        self.progress = Progress {
            done: self.next,
            samples: self.records.iter().map(|r| r.entry.samples).sum(),
            bytes: self.records.iter().map(|r| r.entry.size).sum(),
            skipped: self.records.iter().map(|r| r.skipped.len() as u64).sum(),
            shards: self.resumed,
        };
        Ok(())
    }

    /// The input position the pack goes on from (0 for a new pack).
    pub fn resume_at(&self) -> u64 {
        self.next
    }

    /// The summary, if the destination holds this whole pack already.
    pub fn complete(&self) -> Option<&Summary> {
        self.complete.as_ref()
    }

    /// How far the pack is.
    pub fn progress(&self) -> Progress {
        self.progress
    }

    /// The options (validated).
    pub fn options(&self) -> &PackOptions {
        &self.options
    }

    /// The name of shard `k`.
    fn shard_name(&self, k: usize) -> String {
        let ext = match self.options.format {
            OutputFormat::Tar => "tar",
            OutputFormat::Parquet => "parquet",
        };
        format!("{}-{k:06}.{ext}", self.options.prefix)
    }

    /// Takes the outcome of the sample at input position `position` (the
    /// next one: positions come in order from [`Self::resume_at`]).
    ///
    /// # Errors
    ///
    /// The sample's own error when it cannot be packed and is not skipped
    /// (the shard being written is then dropped, nothing of it left); a
    /// write's [`PackError::Dest`].
    ///
    /// # Panics
    ///
    /// When `position` is not the next one (a bug of the caller).
    pub fn push(
        &mut self,
        position: u64,
        outcome: Result<Prepared, PackError>,
    ) -> Result<(), PackError> {
        assert_eq!(position, self.next, "samples are pushed in input order");
        if self.complete.is_some() {
            return Ok(());
        }
        self.next += 1;
        self.progress.done = self.next;
        let sample = match outcome {
            Ok(s) => s,
            Err(e) if skippable(self.options.on_error, &e) => {
                let PackError::BadSample { name, reason } = e else {
                    unreachable!("skippable errors are bad samples")
                };
                let skip = Skip {
                    position,
                    name,
                    reason,
                };
                match &mut self.open {
                    Some(open) => open.skipped.push(skip),
                    None => self.pending.push(skip),
                }
                self.progress.skipped += 1;
                return Ok(());
            }
            Err(e) => {
                self.open = None;
                return Err(e);
            }
        };
        if let Some(open) = &self.open {
            let full = self.options.shard_size.is_some_and(|max| {
                open.writer.samples() > 0 && open.cost + open.writer.cost(&sample) > max
            });
            if full {
                self.close(position)?;
            }
        }
        if self.open.is_none() {
            self.open_shard()?;
        }
        let open = self.open.as_mut().expect("opened above");
        open.cost += open.writer.cost(&sample);
        if let Err(e) = open.writer.append(&sample) {
            let name = open.name.clone();
            self.open = None;
            return Err(self.named(e, &name));
        }
        self.progress.samples += 1;
        if self
            .options
            .samples_per_shard
            .is_some_and(|n| open.writer.samples() >= n)
        {
            self.close(position + 1)?;
        }
        Ok(())
    }

    /// Starts the next shard.
    fn open_shard(&mut self) -> Result<(), PackError> {
        let name = self.shard_name(self.records.len());
        let out = self.dest.create(&name)?;
        let writer: Box<dyn FormatWriter> = match self.options.format {
            OutputFormat::Tar => Box::new(TarWriter::new(out)),
            OutputFormat::Parquet => {
                Box::new(ParquetWriter::new(out, self.options.class_names.clone()))
            }
        };
        self.open = Some(Open {
            writer,
            name,
            lo: self.records.last().map_or(0, |r| r.hi),
            cost: 0,
            skipped: std::mem::take(&mut self.pending),
        });
        Ok(())
    }

    /// `e` naming `name` in the destination when it names nothing.
    fn named(&self, e: PackError, name: &str) -> PackError {
        match e {
            PackError::Dest {
                dest,
                reason,
                kind,
                errno,
            } if dest.is_empty() => PackError::Dest {
                dest: self.dest.url_of(name),
                reason,
                kind,
                errno,
            },
            e => e,
        }
    }

    /// Finishes the open shard, covering the input up to `hi`: its end
    /// written, committed under its name, its record written.
    fn close(&mut self, hi: u64) -> Result<(), PackError> {
        let Some(open) = self.open.take() else {
            return Ok(());
        };
        let name = open.name;
        let finished = open.writer.finish().map_err(|e| self.named(e, &name))?;
        let stamp = finished.out.commit().map_err(|e| self.named(e, &name))?;
        let record = Record {
            lo: open.lo,
            hi,
            entry: ShardEntry {
                name: name.clone(),
                size: stamp.size,
                etag: stamp.etag,
                mtime_ns: stamp.mtime_ns,
                samples: finished.samples,
                first_key: finished.first_key,
                last_key: finished.last_key,
                offsets: finished.offsets,
                end: finished.end,
            },
            skipped: open.skipped,
        };
        let k = self.records.len();
        self.dest.write(
            &format!("{RECORDS}/{k:06}.json"),
            record.to_json(&self.fingerprint).to_string().as_bytes(),
        )?;
        self.progress.bytes += record.entry.size;
        self.progress.shards += 1;
        self.records.push(record);
        Ok(())
    }

    /// Finishes the pack: the last shard, the index, the records removed.
    ///
    /// # Errors
    ///
    /// A write's [`PackError::Dest`].
    pub fn finish(mut self) -> Result<Summary, PackError> {
        if let Some(done) = self.complete.take() {
            self.release();
            return Ok(Summary {
                seconds: self.started.elapsed().as_secs_f64(),
                ..done
            });
        }
        self.close(self.next)?;
        let mut skipped: Vec<Skip> = self
            .records
            .iter()
            .flat_map(|r| r.skipped.iter().cloned())
            .collect();
        skipped.append(&mut self.pending);
        let samples: u64 = self.records.iter().map(|r| r.entry.samples).sum();
        let mut pack = self.description.clone();
        pack["fingerprint"] = json!(self.fingerprint);
        pack["samples"] = json!(samples);
        pack["positions"] = json!(self.next);
        pack["skipped"] = Json::Array(skipped.iter().map(Skip::to_json).collect());
        pack["ranges"] = Json::Array(self.records.iter().map(|r| json!([r.lo, r.hi])).collect());
        let index = Index {
            shards: self.records.iter().map(|r| r.entry.clone()).collect(),
            pack: Some(pack),
        };
        self.dest.write(INDEX_NAME, &index.to_bytes())?;
        let names = self.dest.list(RECORDS)?;
        self.remove_records(&names)?;
        self.release();
        Ok(Summary {
            samples,
            shards: self.records.len() as u64,
            bytes: self.records.iter().map(|r| r.entry.size).sum(),
            skipped,
            resumed: self.resumed,
            seconds: self.started.elapsed().as_secs_f64(),
            index: self.dest.url_of(INDEX_NAME),
        })
    }

    /// Removes the lock file and the records' folder (a local pack) once
    /// the pack is whole: the next pack finds the index.
    fn release(&mut self) {
        if let Some(lock) = self.lock.take() {
            let _ = self.dest.remove(&format!("{RECORDS}/lock"));
            self.dest.remove_empty_folder(RECORDS);
            drop(lock);
        }
    }

    /// Removes the records (the lock file stays: it is held).
    fn remove_records(&self, names: &[(String, Stamp)]) -> Result<(), PackError> {
        let prefix = format!("{RECORDS}/");
        for (name, _) in names {
            if name.starts_with(&prefix) && !name.ends_with("/lock") {
                self.dest.remove(name)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
