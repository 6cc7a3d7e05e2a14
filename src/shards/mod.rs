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
//! A [`Shard`] is a local file or bytes in memory ([`ShardData`]): shards
//! fetched from object storage go through the same readers as local ones,
//! which read either through [`ShardReader`] (a [`Read`] + [`Seek`] over the
//! shard's bytes, and the parquet crate's `ChunkReader`).
//!
//! Which shards, which ranges of them and in what order is the sharded plan's
//! business (`crate::plan::sharded`); turning a [`Sample`] into a Python dict is
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

mod error;
mod feed;
pub mod index;
pub mod jsonl;
mod kept;
pub mod marks;
pub mod mds;
pub(crate) mod parallel;
pub mod parquet;
pub mod registry;
mod set;
pub mod tar;
mod window;

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use marks::Marks;

pub use error::{FeedError, ShardError, ShardSetError};
pub use feed::{EpochWindows, FedBatch, WindowFeed};
pub use set::{ShardSet, LOCATE_MIN};
pub use window::{lock_entry, Entry, Window};

/// Where a shard's bytes are.
#[derive(Debug, Clone)]
pub enum ShardData {
    /// A local file (opened with [`crate::fs::open_regular`]: a FIFO or
    /// directory is refused).
    File(PathBuf),
    /// Bytes in memory: the shard's bytes from `offset` on, of a shard of
    /// `len` bytes in all. A whole shard has offset 0 and `len ==
    /// bytes.len()`; counting a remote Parquet file fetches only its tail
    /// (the footer). A read of a byte outside them is an I/O error
    /// (`UnexpectedEof`, saying the range was not fetched), never a panic;
    /// reading at or past `len` finds the end of the shard, as in a file (and
    /// bytes past `len`, if any, are not part of the shard).
    Memory {
        /// The bytes fetched.
        bytes: Bytes,
        /// Where in the shard they start.
        offset: u64,
        /// The shard's length.
        len: u64,
    },
}

/// A shard to count or read.
#[derive(Debug, Clone)]
pub struct Shard {
    /// What errors name: the shard's path, or the URL it was fetched from.
    pub name: PathBuf,
    /// Where its bytes are.
    pub data: ShardData,
}

impl Shard {
    /// The local file at `path` (also its name).
    pub fn file(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        Self {
            name: path.clone(),
            data: ShardData::File(path),
        }
    }

    /// A whole shard in memory, named `name`.
    pub fn memory(name: impl Into<PathBuf>, bytes: impl Into<Bytes>) -> Self {
        let bytes = bytes.into();
        Self {
            name: name.into(),
            data: ShardData::Memory {
                len: bytes.len() as u64,
                bytes,
                offset: 0,
            },
        }
    }

    /// The last `bytes.len()` bytes of a shard of `len` bytes, named `name`
    /// (a `len` below `bytes.len()` is taken as `bytes.len()`: the bytes are
    /// then the whole shard).
    pub fn tail(name: impl Into<PathBuf>, bytes: impl Into<Bytes>, len: u64) -> Self {
        let bytes = bytes.into();
        let len = len.max(bytes.len() as u64);
        Self {
            name: name.into(),
            data: ShardData::Memory {
                offset: len - bytes.len() as u64,
                bytes,
                len,
            },
        }
    }

    /// Opens the shard for reading, at its start.
    ///
    /// # Errors
    ///
    /// [`ShardError::Io`] naming the shard when its file cannot be opened
    /// (or is not a regular file).
    pub fn open(&self) -> Result<ShardReader, ShardError> {
        match &self.data {
            ShardData::File(path) => {
                let (file, len) =
                    crate::fs::open_regular(path).map_err(|e| ShardError::io(&self.name, e))?;
                Ok(ShardReader::File { file, len })
            }
            ShardData::Memory { bytes, offset, len } => Ok(ShardReader::Memory(MemoryReader {
                bytes: bytes.clone(),
                offset: *offset,
                len: *len,
                pos: 0,
            })),
        }
    }
}

/// A shard opened for reading ([`Shard::open`]): [`Read`] + [`Seek`] at
/// absolute positions in the shard, and the parquet crate's `ChunkReader`
/// (`shards::parquet`).
#[derive(Debug)]
pub enum ShardReader {
    /// An open file.
    File {
        /// The file.
        file: File,
        /// Its length when it was opened.
        len: u64,
    },
    /// Bytes in memory.
    Memory(MemoryReader),
}

impl ShardReader {
    /// The shard's length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            ShardReader::File { len, .. } => *len,
            ShardReader::Memory(m) => m.len,
        }
    }

    /// Whether the shard is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What marks found in this shard are for ([`marks::Stamp`]): its
    /// length and, for a file, its modification time.
    pub fn stamp(&self) -> marks::Stamp {
        match self {
            ShardReader::File { file, len } => marks::Stamp {
                len: *len,
                modified: file.metadata().and_then(|m| m.modified()).ok(),
            },
            ShardReader::Memory(m) => marks::Stamp {
                len: m.len,
                modified: None,
            },
        }
    }
}

impl Read for ShardReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ShardReader::File { file, .. } => file.read(buf),
            ShardReader::Memory(m) => m.read(buf),
        }
    }
}

impl Seek for ShardReader {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        match self {
            ShardReader::File { file, .. } => file.seek(to),
            ShardReader::Memory(m) => m.seek(to),
        }
    }
}

/// A cursor over a shard's bytes in memory ([`ShardData::Memory`]), at
/// absolute positions in the shard.
#[derive(Debug, Clone)]
pub struct MemoryReader {
    bytes: Bytes,
    /// Where `bytes` start in the shard.
    offset: u64,
    /// The shard's length.
    len: u64,
    /// The position of the next read.
    pos: u64,
}

impl MemoryReader {
    /// The end of the bytes held, in the shard (never past its end).
    fn end(&self) -> u64 {
        self.offset
            .saturating_add(self.bytes.len() as u64)
            .min(self.len)
    }

    /// The same bytes, with the next read at `pos`.
    #[must_use]
    pub fn at(&self, pos: u64) -> Self {
        Self {
            pos,
            ..self.clone()
        }
    }

    /// The error for a read of the bytes from `at` that were not fetched.
    fn not_fetched(&self, at: u64) -> io::Error {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            NotFetched {
                at,
                held: self.offset..self.end(),
                len: self.len,
            },
        )
    }

    /// The `length` bytes from `start`, without a copy: `None` when they run
    /// past the shard's end (the shard then holds only `len - start` of
    /// them).
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::UnexpectedEof`], saying so, when a byte of them
    /// within the shard was not fetched.
    pub fn slice(&self, start: u64, length: usize) -> io::Result<Option<Bytes>> {
        if length == 0 {
            return Ok(Some(Bytes::new()));
        }
        let stop = start.saturating_add(length as u64);
        if start < self.len {
            if start < self.offset {
                return Err(self.not_fetched(start));
            }
            if stop.min(self.len) > self.end() {
                return Err(self.not_fetched(start.max(self.end())));
            }
        }
        if stop > self.len {
            return Ok(None);
        }
        let from = (start - self.offset) as usize;
        Ok(Some(self.bytes.slice(from..from + length)))
    }
}

impl Read for MemoryReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() || self.pos >= self.len {
            return Ok(0);
        }
        if self.pos < self.offset || self.pos >= self.end() {
            return Err(self.not_fetched(self.pos));
        }
        let from = (self.pos - self.offset) as usize;
        let n = buf.len().min((self.end() - self.pos) as usize);
        buf[..n].copy_from_slice(&self.bytes[from..from + n]);
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for MemoryReader {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let pos = match to {
            SeekFrom::Start(pos) => Some(pos),
            SeekFrom::End(by) => self.len.checked_add_signed(by),
            SeekFrom::Current(by) => self.pos.checked_add_signed(by),
        };
        let Some(pos) = pos else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "invalid seek to a negative or overflowing position",
            ));
        };
        self.pos = pos;
        Ok(pos)
    }
}

/// A read of bytes of a shard in memory that were not fetched (the
/// `UnexpectedEof` error of [`MemoryReader`]).
#[derive(Debug, thiserror::Error)]
#[error("byte {at} of the shard was not fetched (only bytes {}..{} of its {len})", held.start, held.end)]
struct NotFetched {
    /// The first byte asked for that is not held.
    at: u64,
    /// The bytes held.
    held: std::ops::Range<u64>,
    /// The shard's length.
    len: u64,
}

/// Whether `e` is a read of bytes of a shard in memory that were not
/// fetched (an I/O error of the source, not corruption of the shard).
fn not_fetched(e: &io::Error) -> bool {
    matches!(e.get_ref(), Some(inner) if inner.is::<NotFetched>())
}

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
    /// Raw bytes left in the shard's file: a plain local tar shard's member
    /// of a field a read was asked to locate ([`WholeRead::located`]: the
    /// native image chain's image, read by its decode threads). Bytes all
    /// the same to whoever reads them ([`crate::fs::FileRange::read`]).
    Located(crate::fs::FileRange),
    /// A list (a JSON array, a Parquet list).
    List(Vec<Value>),
    /// Named fields in stored order (a JSON object, a Parquet struct or map
    /// with string keys).
    Map(Vec<(String, Value)>),
    /// An unsigned integer beyond `i64` (an MDS `uint64`; those that fit are
    /// [`Value::Int`]).
    UInt(u64),
    /// JSON text, to be parsed by the bindings (Python's `json.loads` keeps
    /// key order, exact floats and integers of any size): an MDS `json`
    /// column.
    Json(Vec<u8>),
    /// A typed n-dimensional array (an MDS `ndarray` or `pil` column).
    Array(Array),
}

/// An n-dimensional array of numbers: numpy's dtype name, the shape and the
/// values, little-endian, in C order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Array {
    /// numpy's name of the element type (`"uint8"`, `"float32"`, `"bool"`).
    pub dtype: &'static str,
    /// The extent of each dimension.
    pub shape: Vec<usize>,
    /// The values' bytes.
    pub data: Vec<u8>,
}

impl Array {
    /// The array of `shape` of elements of `size` bytes in `data`.
    ///
    /// # Errors
    ///
    /// `data` does not hold exactly the shape's elements.
    pub fn new(
        dtype: &'static str,
        size: usize,
        shape: Vec<usize>,
        data: &[u8],
    ) -> Result<Self, String> {
        let want = shape
            .iter()
            .try_fold(size, |n, &d| n.checked_mul(d))
            .ok_or("its shape overflows")?;
        if data.len() != want {
            return Err(format!(
                "{} bytes of values for a {dtype} array of shape {shape:?} ({want} bytes)",
                data.len()
            ));
        }
        Ok(Self {
            dtype,
            shape,
            data: data.to_vec(),
        })
    }
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

/// Where [`ShardFormat::read`] delivers each sample: its number in the
/// shard, and the sample or the error that is that sample's alone.
pub type Each<'a> = &'a mut dyn FnMut(u64, Result<Sample, ShardError>);

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
    /// Where the shard is damaged, if it is: counting stopped there, and
    /// `samples` (and the keys) are those complete before it. A format that
    /// cannot tell the samples before the damage fails the count instead.
    pub damage: Option<Damage>,
}

/// Where a shard's content stops being readable ([`ShardInfo::damage`]):
/// a [`ShardError::Corrupt`] met while counting, kept as data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// Where in the shard (`"member 000123.jpg"`, `"end of file"`).
    pub at: String,
    /// The error's whole text, naming the shard, where, and what is wrong.
    pub message: String,
}

impl Damage {
    /// The damage `e` describes, if it is corruption of the shard (not an
    /// I/O error, a change or a fetch that failed).
    pub fn of(e: &ShardError) -> Option<Self> {
        match e {
            ShardError::Corrupt { at, .. } => Some(Self {
                at: at.clone(),
                message: e.to_string(),
            }),
            _ => None,
        }
    }
}

/// A shard file format: counts a shard's samples, reads a range of them.
///
/// Implementations are cheap to share between threads: every call opens the
/// shard itself.
pub trait ShardFormat: Send + Sync {
    /// Counts the samples of `shard` (and, for tar, the keys at its ends).
    ///
    /// # Errors
    ///
    /// [`ShardError`] when the shard cannot be opened or is corrupt where
    /// counting reads it.
    fn count(&self, shard: &Shard) -> Result<ShardInfo, ShardError>;

    /// Reads samples `lo..hi` (0-based, in stored order) of `shard`, calling
    /// `each(n, sample)` for each, in order, with `n` its number in the
    /// shard. A sample that cannot be parsed on its own comes as `Err` and
    /// reading goes on.
    ///
    /// # Errors
    ///
    /// [`ShardError`] when the rest of the shard cannot be read (the samples
    /// from the first one not delivered up to `hi` are then lost), or when
    /// the shard has fewer than `hi` samples ([`ShardError::Changed`]).
    fn read(&self, shard: &Shard, lo: u64, hi: u64, each: Each<'_>) -> Result<(), ShardError>;

    /// [`Self::count`], recording in `marks` where the shard's samples
    /// start, for a format whose reads can seek to a sample (plain tar); the
    /// default only counts.
    ///
    /// # Errors
    ///
    /// As [`Self::count`].
    fn count_marked(&self, shard: &Shard, marks: &Marks) -> Result<ShardInfo, ShardError> {
        let _ = marks;
        self.count(shard)
    }

    /// [`Self::read`] of samples `read.lo..read.hi` of the whole shard
    /// `shard`, with what [`WholeRead`] lets a format do faster: start at
    /// the last of its marks at or before `lo` (recording the marks it walks
    /// over), and leave the bytes of the fields it names to locate in the
    /// shard's file ([`Value::Located`]). Plain local tar shards do both;
    /// the default reads as [`Self::read`].
    ///
    /// # Errors
    ///
    /// As [`Self::read`].
    fn read_whole(&self, shard: &Shard, read: &WholeRead, each: Each) -> Result<(), ShardError> {
        self.read(shard, read.lo, read.hi, each)
    }

    /// How a sample of this format is laid out, for the bindings that turn
    /// it into Python objects and for messages.
    fn layout(&self) -> SampleLayout;

    /// Bytes at the end of a remote shard that counting it needs, when the
    /// end is all a count reads (a Parquet footer), so that counting fetches
    /// them alone; `None` (the default) when a count reads the whole shard.
    /// Asked first with `fetched` `None`; then with the tail fetched, whose
    /// answer, if larger, is fetched again (a footer larger than the first
    /// guess).
    fn count_tail(&self, fetched: Option<&[u8]>) -> Option<u64> {
        let _ = fetched;
        None
    }
}

/// A read of samples `lo..hi` of a whole shard, and what it may use
/// ([`ShardFormat::read_whole`]).
#[derive(Debug, Clone, Copy)]
pub struct WholeRead<'a> {
    /// The first sample read.
    pub lo: u64,
    /// One past the last.
    pub hi: u64,
    /// The shard's marks: where to start, and where to record those it
    /// walks over.
    pub marks: &'a Marks,
    /// Fields whose bytes may be left in the shard's file
    /// ([`Value::Located`]) instead of read: the native image chain's image
    /// fields.
    pub located: &'a [String],
}

/// How a format's samples are laid out ([`ShardFormat::layout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleLayout {
    /// A key and named members, one per extension (`WebDataset` tar): a
    /// sample is named by its key, its fields by `key.extension`.
    Members,
    /// A row of named columns (Parquet, MDS): a sample is named by its row.
    Columns,
    /// One value per sample (a JSON line): a single field with an empty
    /// name holds it.
    Value,
}

/// Counts and reads `data` as a shard of every format, for the fuzz target
/// `shards` (`fuzz/fuzz_targets/shards.rs`) and the unit test that replays
/// its committed inputs: once from a file under `dir` (the bytes are written
/// there) and once from memory. Every error is fine (the input is
/// arbitrary); a panic is a finding, and so is a read that disagrees with
/// the count, or a file and memory that give different samples or errors.
///
/// # Errors
///
/// A description of the first disagreement.
#[doc(hidden)]
pub fn fuzz_every_format(data: &[u8], dir: &Path) -> Result<(), String> {
    let formats: Vec<(String, std::sync::Arc<dyn ShardFormat>)> = registry::FORMATS
        .iter()
        .map(|&(name, make)| (format!("shard.{name}"), make(None)))
        .collect();
    let named: Vec<(&str, &dyn ShardFormat)> =
        formats.iter().map(|(n, f)| (n.as_str(), &**f)).collect();
    fuzz_formats(data, dir, &named)
}

/// [`fuzz_every_format`] of `formats`, a file name for each.
fn fuzz_formats(
    data: &[u8],
    dir: &Path,
    formats: &[(&str, &dyn ShardFormat)],
) -> Result<(), String> {
    let memory_data = Bytes::copy_from_slice(data);
    for &(name, format) in formats {
        let path = dir.join(name);
        std::fs::write(&path, data).map_err(|e| format!("{}: {e}", path.display()))?;
        let from_file = fuzz_one(name, format, &Shard::file(&path))?;
        // Named as the file, so that their errors read the same.
        let memory = Shard::memory(&path, memory_data.clone());
        let from_memory = fuzz_one(&format!("{name} from memory"), format, &memory)?;
        if let Some((file, memory)) = from_file
            .iter()
            .zip(&from_memory)
            .find(|(file, memory)| file != memory)
        {
            return Err(format!(
                "{name}: a file and memory disagree: {file} from the file, {memory} from memory"
            ));
        }
        if from_file.len() != from_memory.len() {
            return Err(format!(
                "{name}: a file and memory disagree: {} results from the file, {} from memory",
                from_file.len(),
                from_memory.len()
            ));
        }
    }
    Ok(())
}

/// Counts and reads `shard` for [`fuzz_every_format`]; returns what it
/// found, one line a result (the count, each sample or error delivered, how
/// each read ended), to compare the same bytes read from a file and from
/// memory.
fn fuzz_one(name: &str, format: &dyn ShardFormat, shard: &Shard) -> Result<Vec<String>, String> {
    let mut found = Vec::new();
    let info = match format.count(shard) {
        Ok(info) => info,
        Err(e) => {
            caught_panic(name, &e)?;
            found.push(format!("count: {e}"));
            return Ok(found);
        }
    };
    found.push(format!("count: {info:?}"));
    // Read everything, then the second half: what a rank reading from a
    // member on gets. Delivered numbers must be in order and in range.
    // Every sample marked (by a count, then by the first read), so that the
    // second read starts at a mark, and the usual fields located (left in a
    // file, read when described): reads of a whole shard must deliver what
    // reads from the start do.
    let marks = marks::Marks::every(1);
    let recount = format.count_marked(shard, &marks);
    if recount.as_ref().ok() != Some(&info) {
        return Err(format!(
            "{name}: counted {info:?}, then {recount:?} with marks"
        ));
    }
    for lo in [0, info.samples / 2] {
        let mut next = lo;
        let mut bad = None;
        let mut delivered = Vec::new();
        let result = format.read(shard, lo, info.samples, &mut |n, sample| {
            if n != next && bad.is_none() {
                bad = Some(format!("{name}: sample {n} delivered where {next} was due"));
            }
            next = n + 1;
            delivered.push(described(n, sample));
        });
        if let Some(bad) = bad {
            return Err(bad);
        }
        let mut again = Vec::new();
        let whole = WholeRead {
            lo,
            hi: info.samples,
            marks: &marks,
            located: &FUZZ_LOCATED.map(str::to_owned),
        };
        let marked = format.read_whole(shard, &whole, &mut |n, sample| {
            again.push(described(n, sample));
        });
        let ended = |r: &Result<(), ShardError>| r.as_ref().map_err(ToString::to_string).err();
        if again != delivered || ended(&marked) != ended(&result) {
            return Err(format!(
                "{name}: a read of {lo}.. from marks differs from one from the start: \
                 {again:?} {marked:?} against {delivered:?} {result:?}"
            ));
        }
        found.extend(delivered);
        if let Err(e) = &result {
            caught_panic(name, e)?;
            found.push(format!("read {lo}..: {e}"));
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
    Ok(found)
}

/// The fields a fuzzed read of a whole shard leaves in its file.
const FUZZ_LOCATED: [&str; 6] = ["jpg", "png", "cls", "txt", "json", "bin"];

/// A sample delivered to a fuzzed read, as text: a value left in the file
/// as the bytes read from it.
fn described(n: u64, sample: Result<Sample, ShardError>) -> String {
    match sample {
        Ok(mut sample) => {
            for (_, v) in &mut sample.fields {
                if let Value::Located(at) = v {
                    *v = match at.read() {
                        Ok(bytes) => Value::Bytes(bytes),
                        Err(e) => Value::Str(format!("not read: {e}")),
                    };
                }
            }
            format!("sample {n}: {sample:?}")
        }
        Err(e) => format!("sample {n}: {e}"),
    }
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
pub(crate) mod testing;
#[cfg(test)]
mod tests;
