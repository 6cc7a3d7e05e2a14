//! The sample index of a folder of shards: `_ferrofeed-index.json`.
//!
//! `ferrofeed pack` writes it next to the shards it makes, and `ferrofeed
//! index` writes it for shards made by other tools. A reader that finds it
//! knows every shard's samples without reading the shards, and where each
//! tar sample's bytes are, so it can fetch only those.
//!
//! # Format, version 1
//!
//! A JSON object (UTF-8):
//!
//! ```json
//! {"format": "ferrofeed-index", "version": 1,
//!  "shards": [{"name": "shard-000000.tar", "size": 1048576,
//!              "etag": "\"9b2c...\"", "mtime_ns": null,
//!              "samples": 3, "first_key": "00000000", "last_key": "00000002",
//!              "offsets": [0, 101376, 204800], "end": 306176}],
//!  "pack": {...}}
//! ```
//!
//! - `format` MUST be `"ferrofeed-index"` and `version` MUST be 1; a reader
//!   MUST refuse another version (a later one may change the meaning).
//! - `shards`: one entry per shard of the folder, in name order. `name` is
//!   the shard's path relative to the index's folder (no `..`, not
//!   absolute). `size` is its length in bytes; `etag` its store's `ETag`
//!   (or null) and `mtime_ns` a local file's modification time in
//!   nanoseconds (or null): a reader MUST treat a shard whose size differs,
//!   or whose `ETag` (or, locally, modification time) differs when both are
//!   known, as stale (the index no longer describes it).
//! - `samples`: the shard's number of samples; `first_key`, `last_key`: the
//!   keys of its first and last sample (null when it has none, or for
//!   Parquet).
//! - tar shards only: `offsets[i]` is where sample `i`'s first member
//!   header starts, and `end` where the last sample's bytes end (the
//!   end-of-archive blocks start there). Sample `i` is the bytes
//!   `offsets[i]..offsets[i + 1]` (`..end` for the last): its length is
//!   the difference. Offsets MUST be strictly increasing, multiples of 512,
//!   and `end <= size`; `len(offsets) == samples`.
//! - `pack` (optional): what `ferrofeed pack` records to finish or resume a
//!   pack (its options' fingerprint, skipped samples). Readers ignore it.
//!
//! Unknown keys are ignored, so that version 1 can gain optional ones.

use std::io::BufReader;

use serde_json::{json, Map, Value};

use super::jsonl::{sniff, Codec};
use super::tar::{is_member_file, is_meta, member_name, split_name, TarFormat};
use super::{Shard, ShardError, ShardFormat};

/// The index's file name, in the shards' folder.
pub const INDEX_NAME: &str = "_ferrofeed-index.json";

/// The format version written, and the only one read.
pub const INDEX_VERSION: u64 = 1;

/// One shard's entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardEntry {
    /// Its path relative to the index's folder.
    pub name: String,
    /// Its length in bytes.
    pub size: u64,
    /// Its store's `ETag`.
    pub etag: Option<String>,
    /// A local file's modification time (ns since the epoch).
    pub mtime_ns: Option<i64>,
    /// Its samples.
    pub samples: u64,
    /// The first sample's key (tar).
    pub first_key: Option<String>,
    /// The last sample's key (tar).
    pub last_key: Option<String>,
    /// Where each sample starts (tar).
    pub offsets: Option<Vec<u64>>,
    /// Where the last sample ends (tar).
    pub end: Option<u64>,
}

impl ShardEntry {
    /// The entry as JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "size": self.size,
            "etag": self.etag,
            "mtime_ns": self.mtime_ns,
            "samples": self.samples,
            "first_key": self.first_key,
            "last_key": self.last_key,
            "offsets": self.offsets,
            "end": self.end,
        })
    }

    /// Reads and checks an entry (`what` names it in errors).
    ///
    /// # Errors
    ///
    /// A message for a missing or mistyped field, a bad name, or offsets
    /// that break the rules of the module docs.
    pub fn from_json(v: &Value, what: &str) -> Result<Self, String> {
        let o = v
            .as_object()
            .ok_or_else(|| format!("{what} is not an object"))?;
        let text = |k: &str| -> Result<Option<String>, String> {
            match o.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(format!("{what}: {k} is not a string")),
            }
        };
        let uint = |k: &str| -> Result<Option<u64>, String> {
            match o.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(n) => n
                    .as_u64()
                    .map(Some)
                    .ok_or_else(|| format!("{what}: {k} is not a non-negative integer")),
            }
        };
        let name = text("name")?.ok_or_else(|| format!("{what} has no name"))?;
        if name.is_empty()
            || name.starts_with('/')
            || name
                .split('/')
                .any(|p| p == ".." || p == "." || p.is_empty())
        {
            return Err(format!(
                "{what}: the name {name:?} is not a relative path in the folder"
            ));
        }
        let mtime_ns = match o.get("mtime_ns") {
            None | Some(Value::Null) => None,
            Some(n) => Some(
                n.as_i64()
                    .ok_or_else(|| format!("{what}: mtime_ns is not an integer"))?,
            ),
        };
        let offsets = match o.get("offsets") {
            None | Some(Value::Null) => None,
            Some(Value::Array(a)) => Some(
                a.iter()
                    .map(|n| n.as_u64().ok_or_else(|| format!("{what}: a bad offset")))
                    .collect::<Result<Vec<u64>, String>>()?,
            ),
            Some(_) => return Err(format!("{what}: offsets is not a list")),
        };
        let entry = Self {
            size: uint("size")?.ok_or_else(|| format!("{what} has no size"))?,
            etag: text("etag")?,
            mtime_ns,
            samples: uint("samples")?.ok_or_else(|| format!("{what} has no sample count"))?,
            first_key: text("first_key")?,
            last_key: text("last_key")?,
            offsets,
            end: uint("end")?,
            name,
        };
        entry.check().map_err(|why| format!("{what}: {why}"))?;
        Ok(entry)
    }

    /// The rules of the module docs for `offsets` and `end`.
    fn check(&self) -> Result<(), String> {
        let Some(offsets) = &self.offsets else {
            return if self.end.is_some() {
                Err("end without offsets".into())
            } else {
                Ok(())
            };
        };
        let end = self.end.ok_or("offsets without end")?;
        if offsets.len() as u64 != self.samples {
            return Err(format!(
                "{} offsets for {} samples",
                offsets.len(),
                self.samples
            ));
        }
        if end > self.size {
            return Err(format!("end {end} is past the size {}", self.size));
        }
        let mut last = None;
        for &o in offsets.iter().chain(std::iter::once(&end)) {
            if o % 512 != 0 {
                return Err(format!("offset {o} is not a multiple of 512"));
            }
            if last.is_some_and(|l| o <= l) {
                return Err(format!("offset {o} does not increase"));
            }
            last = Some(o);
        }
        Ok(())
    }

    /// The byte range of sample `i` (tar).
    pub fn sample_range(&self, i: usize) -> Option<std::ops::Range<u64>> {
        let offsets = self.offsets.as_ref()?;
        let start = *offsets.get(i)?;
        let end = offsets.get(i + 1).copied().or(self.end)?;
        Some(start..end)
    }
}

/// The index of a folder of shards.
#[derive(Debug, Clone, PartialEq)]
pub struct Index {
    /// Its shards, in name order.
    pub shards: Vec<ShardEntry>,
    /// What a pack recorded (`None` for an index of other tools' shards).
    pub pack: Option<Value>,
}

impl Index {
    /// The index as the bytes of its file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut o = Map::new();
        o.insert("format".into(), json!("ferrofeed-index"));
        o.insert("version".into(), json!(INDEX_VERSION));
        o.insert(
            "shards".into(),
            Value::Array(self.shards.iter().map(ShardEntry::to_json).collect()),
        );
        if let Some(p) = &self.pack {
            o.insert("pack".into(), p.clone());
        }
        let mut out = Value::Object(o).to_string().into_bytes();
        out.push(b'\n');
        out
    }

    /// Reads an index file's bytes (`what` names it in errors).
    ///
    /// # Errors
    ///
    /// A message: not JSON, not an index, another version, a bad entry.
    pub fn parse(bytes: &[u8], what: &str) -> Result<Self, String> {
        let v: Value =
            serde_json::from_slice(bytes).map_err(|e| format!("{what}: not JSON ({e})"))?;
        let o = v
            .as_object()
            .filter(|o| o.get("format") == Some(&json!("ferrofeed-index")))
            .ok_or_else(|| format!("{what}: not a ferrofeed index"))?;
        match o.get("version").and_then(Value::as_u64) {
            Some(INDEX_VERSION) => {}
            other => {
                return Err(format!(
                    "{what}: index version {other:?}, this ferrofeed reads version \
                     {INDEX_VERSION} (rebuild it with `ferrofeed index`)"
                ))
            }
        }
        let entries = o
            .get("shards")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("{what}: no list of shards"))?;
        let shards = entries
            .iter()
            .enumerate()
            .map(|(k, e)| ShardEntry::from_json(e, &format!("{what}: shard {k}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            shards,
            pack: o.get("pack").cloned(),
        })
    }
}

/// What scanning a tar shard finds: its samples, the keys at its ends, and,
/// for a plain (uncompressed) tar, where each sample starts and the last
/// ends (`None` for a compressed shard: positions in its decompressed
/// stream cannot be fetched as ranges).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scanned {
    /// Samples.
    pub samples: u64,
    /// The first sample's key.
    pub first_key: Option<String>,
    /// The last sample's key.
    pub last_key: Option<String>,
    /// Where each sample starts, and where the last ends.
    pub offsets: Option<(Vec<u64>, u64)>,
}

/// Scans a tar shard for its index entry: the samples as
/// [`TarFormat::count`] finds them (the same grouping rules and refusals),
/// and, for a plain tar, each sample's first byte: where its first member's
/// headers start (a GNU long-name or PAX header included), which is where
/// the data of the member before it, padded, ends.
///
/// # Errors
///
/// The shard's [`ShardError`]: it cannot be read, a sample is split within
/// it, or it is damaged (an index of a shard read only up to its damage
/// would be wrong for its writer).
pub fn scan_tar(shard: &Shard) -> Result<Scanned, ShardError> {
    let info = TarFormat.count(shard)?;
    if let Some(d) = info.damage {
        return Err(ShardError::corrupt(&shard.name, d.at, d.message));
    }
    let mut reader = BufReader::new(shard.open()?);
    let codec = sniff(&mut reader).map_err(|e| ShardError::io(&shard.name, e))?;
    let offsets = if codec == Codec::Plain {
        Some(plain_offsets(shard, reader)?)
    } else {
        None
    };
    if let Some((starts, _)) = &offsets {
        if starts.len() as u64 != info.samples {
            return Err(ShardError::corrupt(
                &shard.name,
                "index",
                format!(
                    "{} sample starts found for {} samples",
                    starts.len(),
                    info.samples
                ),
            ));
        }
    }
    Ok(Scanned {
        samples: info.samples,
        first_key: info.first_key,
        last_key: info.last_key,
        offsets,
    })
}

/// Where each sample of a plain tar starts, and where the last one ends.
fn plain_offsets<R: std::io::Read + std::io::Seek>(
    shard: &Shard,
    reader: R,
) -> Result<(Vec<u64>, u64), ShardError> {
    let bad = |e: std::io::Error| ShardError::corrupt(&shard.name, "index", e.to_string());
    let mut archive = ::tar::Archive::new(reader);
    let mut starts = Vec::new();
    let mut key: Option<String> = None;
    // The end of the last entry's data, padded: where the next entry's
    // headers start.
    let mut previous_end = 0u64;
    let mut end = 0u64;
    for entry in archive.entries_with_seek().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        let data_end = (entry.raw_file_position() + entry.size()).next_multiple_of(512);
        let (name, _) = member_name(&mut entry);
        let sample = is_member_file(entry.header().entry_type()) && !is_meta(&name);
        if let Some((k, _)) = split_name(&name).filter(|_| sample) {
            if key.as_deref() != Some(k) {
                starts.push(previous_end);
                key = Some(k.to_string());
            }
            end = data_end;
        }
        previous_end = data_end;
    }
    Ok((starts, end))
}

/// A shard's sample offsets, if known: where each sample starts, and where
/// the last ends (as in [`ShardEntry`]).
pub type SampleOffsets = Option<(Vec<u64>, u64)>;

/// A piece of a window (`(shard, lo, hi)`) as fetched from an index: which
/// fetch holds its bytes, and where in that fetch they are.
pub type PieceBytes = Option<(usize, std::ops::Range<usize>)>;

/// Where the samples `lo..hi` of `shard` lie in it, by its sample offsets
/// (`offsets[shard]`); `None` when its offsets are not known, or for an
/// empty or out-of-range piece.
pub fn piece_bytes(
    offsets: &[SampleOffsets],
    (shard, lo, hi): (usize, u64, u64),
) -> Option<std::ops::Range<u64>> {
    let (starts, end) = offsets.get(shard)?.as_ref()?;
    let n = starts.len() as u64;
    if lo >= hi || hi > n {
        return None;
    }
    let start = starts[usize::try_from(lo).ok()?];
    let stop = if hi == n {
        *end
    } else {
        starts[usize::try_from(hi).ok()?]
    };
    Some(start..stop)
}

/// The byte ranges to fetch for `pieces` (`(shard, lo, hi)` each) of shards
/// whose sample offsets are known (`offsets[shard]`: starts and end, as in
/// [`ShardEntry`]), touching or overlapping ranges of one shard merged into
/// one fetch. Returns the fetches (`(shard, range)`) and, for each piece,
/// [`PieceBytes`]: `None` for a piece whose shard has no offsets (or an
/// empty or out-of-range piece), which is then read some other way.
pub fn plan_fetches(
    offsets: &[SampleOffsets],
    pieces: &[(usize, u64, u64)],
) -> (Vec<(usize, std::ops::Range<u64>)>, Vec<PieceBytes>) {
    let ranges: Vec<Option<std::ops::Range<u64>>> =
        pieces.iter().map(|&p| piece_bytes(offsets, p)).collect();
    // Merge per shard, in byte order.
    let mut order: Vec<(usize, std::ops::Range<u64>)> = ranges
        .iter()
        .enumerate()
        .filter_map(|(i, r)| Some((i, r.clone()?)))
        .collect();
    order.sort_by_key(|(i, r)| (pieces[*i].0, r.start));
    let mut fetches: Vec<(usize, std::ops::Range<u64>)> = Vec::new();
    let mut fetch_of = vec![usize::MAX; pieces.len()];
    for (i, r) in order {
        let shard = pieces[i].0;
        match fetches.last_mut() {
            Some((s, f)) if *s == shard && r.start <= f.end => f.end = f.end.max(r.end),
            _ => fetches.push((shard, r)),
        }
        fetch_of[i] = fetches.len() - 1;
    }
    let placed = ranges
        .iter()
        .zip(&fetch_of)
        .map(|(r, &f)| {
            let r = r.as_ref()?;
            let base = fetches[f].1.start;
            Some((f, (r.start - base) as usize..(r.end - base) as usize))
        })
        .collect();
    (fetches, placed)
}

/// The samples of each of `pieces` (`(shard, lo, hi)`) of `remote`'s shards
/// whose sample offsets are known, fetched at once by [`plan_fetches`]'
/// ranges (`RemoteShards::fetch_ranges`): only the samples' bytes, each
/// piece a [`Shard`] of its own (named as its shard, `names[shard]`) whose
/// sample 0 is the piece's `lo`. `None` for a piece whose shard has no
/// offsets; a failed fetch is its pieces' [`ShardError::Remote`].
pub fn fetch_pieces(
    remote: &crate::remote::RemoteShards,
    offsets: &[SampleOffsets],
    names: &[std::path::PathBuf],
    pieces: &[(usize, u64, u64)],
) -> Vec<Option<Result<Shard, ShardError>>> {
    let (fetches, placed) = plan_fetches(offsets, pieces);
    let got: Vec<_> = remote
        .fetch_ranges(&fetches)
        .into_iter()
        .map(|r| r.map_err(std::sync::Arc::new))
        .collect();
    placed
        .into_iter()
        .zip(pieces)
        .map(|(place, &(shard, _, _))| {
            let (f, within) = place?;
            Some(match &got[f] {
                Ok(bytes) => Ok(Shard::memory(&names[shard], bytes.slice(within))),
                Err(e) => Err(ShardError::Remote {
                    shard: names[shard].clone(),
                    source: std::sync::Arc::clone(e),
                }),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
