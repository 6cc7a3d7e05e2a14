//! Parquet shards, read row by row through the `parquet` crate's record API
//! (no arrow).
//!
//! [`ParquetFormat::count`] reads the footer only (of a shard in memory,
//! the footer is all it needs: [`Shard::tail`]). [`ParquetFormat::read`]
//! reads the row groups that overlap the requested range, one at a time (the
//! others are skipped by the footer's row counts), and decodes only the
//! projected top-level columns. A sample is a row: its key is `"row N"` (`N`
//! 0-based in the file), its fields the projected columns, in the order the
//! user gave them (the file's order when every column is read).
//!
//! # From Parquet to [`Value`]
//!
//! | Parquet | [`Value`] |
//! |---|---|
//! | null (at any depth) | [`Value::Null`] |
//! | `BOOLEAN` | [`Value::Bool`] |
//! | signed and unsigned integers of every width | [`Value::Int`]; a `UINT_64` above `i64::MAX` is [`Value::Float`] (the nearest `f64`: an `i64` cannot hold it) |
//! | `FLOAT`, `DOUBLE`, `FLOAT16` | [`Value::Float`] |
//! | `DECIMAL` | [`Value::Float`]: the nearest `f64` of `unscaled / 10^scale` (exact up to 2^53 unscaled) |
//! | `STRING`/`UTF8`, `ENUM`, `JSON` | [`Value::Str`] (JSON text is not parsed) |
//! | `BINARY`, `BSON`, `FIXED_LEN_BYTE_ARRAY` (`UUID` included) | [`Value::Bytes`] |
//! | `DATE` | [`Value::Int`]: days since 1970-01-01 |
//! | `TIME`, `TIMESTAMP` | [`Value::Int`]: the count of the column's unit (milli-, micro- or nanoseconds) since midnight or since the epoch, 1970-01-01 (UTC or local, as the column says); a legacy `INT96` timestamp is milliseconds since the epoch |
//! | `LIST` | [`Value::List`] |
//! | `MAP` with string keys | [`Value::Map`], entries in stored order |
//! | `MAP` with other keys | [`Value::List`] of two-element [`Value::List`]s `[key, value]` (an empty map is an empty [`Value::Map`] whatever its keys: the row API does not say) |
//! | struct (group) | [`Value::Map`], fields in schema order |
//! | Hugging Face image (or audio) struct: exactly the fields `bytes` and `path` | [`Value::Bytes`] of `bytes`; see below |
//!
//! A struct made of exactly a binary `bytes` and a string `path` field, at
//! any depth, is how Hugging Face `datasets` stores an `Image` (and `Audio`)
//! feature: it becomes the embedded bytes. When `bytes` is null and `path`
//! is set (an image referenced by a path, not embedded), the struct is kept
//! as a [`Value::Map`] `{"bytes": Null, "path": ...}`, so that the path is
//! not lost and a consumer that wants bytes sees that it has none; both null
//! is [`Value::Null`].
//!
//! Columns of a type the record API cannot convert (`INTERVAL`, and
//! integer annotations on the wrong physical type) are refused when the
//! shard is counted or read, as [`ShardError::Corrupt`] at `"schema"`.
//!
//! # Errors
//!
//! A file that is not Parquet or whose footer cannot be decoded is
//! [`ShardError::Corrupt`] at `"footer"`; a projected column that the file
//! lacks is [`ShardError::Corrupt`] at `"schema"`, naming the columns the
//! file has. A page that cannot be decoded ends [`ParquetFormat::read`] with
//! [`ShardError::Corrupt`] at `"row group G"` (0-based), after every row
//! before that group's first undecodable one was delivered. Reading rows
//! past the file's end delivers the rows there are, then returns
//! [`ShardError::Changed`]. Rows are never passed to the callback as `Err`:
//! the record reader cannot go on after a failure within a row group.
//!
//! # Cost
//!
//! The record API has no row-level skip: in the first row group read, the
//! rows before `lo` are decoded and dropped (not converted). Pages are read
//! one by one as the rows need them, and each leaf column decodes at most
//! [`READ_AHEAD`] values ahead of the row being assembled, so memory is
//! bounded by that many values per column (a few pages), not by the size of
//! a row group (pyarrow's default row group is a million rows). The decoder
//! itself may panic on some malformed input: that is caught and reported as
//! corruption of the row group (or footer).

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;

use ::parquet::basic::{ConvertedType, Type as PhysicalType};
use ::parquet::errors::ParquetError;
use ::parquet::file::metadata::ParquetMetaData;
use ::parquet::file::reader::{ChunkReader, FileReader, Length, SerializedFileReader};
use ::parquet::record::reader::RowIter;
use ::parquet::record::{Field, Row};
use ::parquet::schema::types::{SchemaDescriptor, Type};
use bytes::Bytes;

use super::{
    not_fetched, Each, MemoryReader, Sample, SampleLayout, Shard, ShardError, ShardFormat,
    ShardInfo, ShardReader, Value,
};

/// Bytes of a remote Parquet file's tail fetched to count it: its footer, in
/// one GET for most files (a second one fetches a larger footer whole).
const COUNT_TAIL: u64 = 64 << 10;

/// Values each leaf column decodes ahead of the row being assembled (the
/// record API's batch size, 1024 by default): 64 images of a Hugging Face
/// image column are megabytes, not the gigabytes of 1024 large ones, while a batch of scalars this size
/// costs little more per row than a larger one.
pub const READ_AHEAD: usize = 64;

/// The Parquet shard format: rows of a projection of the top-level columns.
#[derive(Debug, Clone, Default)]
pub struct ParquetFormat {
    /// The top-level columns to read, in the order of a sample's fields
    /// (every column in file order when `None`).
    columns: Option<Vec<String>>,
}

impl ParquetFormat {
    /// A reader of the top-level `columns` (in that order; a repeated name
    /// is read once, at its first place), or of every column when `None`.
    pub fn new(columns: Option<Vec<String>>) -> Self {
        let columns = columns.map(|names| {
            let mut unique: Vec<String> = Vec::with_capacity(names.len());
            for name in names {
                if !unique.contains(&name) {
                    unique.push(name);
                }
            }
            unique
        });
        Self { columns }
    }

    /// The projected columns, `None` for all of them.
    pub fn columns(&self) -> Option<&[String]> {
        self.columns.as_deref()
    }

    /// The projection of the file's schema onto `self.columns` (`None`: the
    /// whole schema), checked for missing columns and unconvertible types.
    fn projection(
        &self,
        path: &Path,
        schema: &SchemaDescriptor,
    ) -> Result<Option<Type>, ShardError> {
        let root = schema.root_schema();
        let fields = root.get_fields();
        let Some(columns) = &self.columns else {
            check_types(path, root)?;
            return Ok(None);
        };
        let missing: Vec<&str> = columns
            .iter()
            .filter(|name| !fields.iter().any(|f| f.name() == name.as_str()))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            let have: Vec<&str> = fields.iter().map(|f| f.name()).collect();
            return Err(ShardError::corrupt(
                path,
                "schema",
                format!(
                    "no column {} (the file has: {})",
                    missing
                        .iter()
                        .map(|m| format!("{m:?}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    have.join(", ")
                ),
            ));
        }
        let projected: Vec<Arc<Type>> = columns
            .iter()
            .filter_map(|name| fields.iter().find(|f| f.name() == name.as_str()))
            .cloned()
            .collect();
        let projection = Type::group_type_builder(root.name())
            .with_fields(projected)
            .build()
            .map_err(|e| ShardError::corrupt(path, "schema", e.to_string()))?;
        check_types(path, &projection)?;
        Ok(Some(projection))
    }
}

impl ShardFormat for ParquetFormat {
    fn count(&self, shard: &Shard) -> Result<ShardInfo, ShardError> {
        let (reader, len) = open(shard)?;
        let path = shard.name.as_path();
        let groups = group_rows(path, reader.metadata(), len)?;
        self.projection(path, reader.metadata().file_metadata().schema_descr())?;
        Ok(ShardInfo {
            samples: groups.iter().sum(),
            first_key: None,
            last_key: None,
            damage: None,
        })
    }

    fn layout(&self) -> SampleLayout {
        SampleLayout::Columns
    }

    /// The footer: a first guess of [`COUNT_TAIL`] bytes, then, if the
    /// footer's length (the 4 bytes before the closing `PAR1`) says it is
    /// larger, the footer and those 8 bytes.
    fn count_tail(&self, fetched: Option<&[u8]>) -> Option<u64> {
        let Some(tail) = fetched else {
            return Some(COUNT_TAIL);
        };
        let at = tail.len().checked_sub(8)?;
        let footer = u32::from_le_bytes(tail[at..at + 4].try_into().expect("4 bytes"));
        Some(u64::from(footer) + 8)
    }

    fn read(&self, shard: &Shard, lo: u64, hi: u64, each: Each<'_>) -> Result<(), ShardError> {
        let (reader, len) = open(shard)?;
        let path = shard.name.as_path();
        let groups = group_rows(path, reader.metadata(), len)?;
        let projection = self.projection(path, reader.metadata().file_metadata().schema_descr())?;
        let total: u64 = groups.iter().sum();
        let end = hi.min(total);
        let mut first = 0u64;
        for (g, &rows) in groups.iter().enumerate() {
            let (g_lo, g_hi) = (first, first + rows);
            first = g_hi;
            if g_lo >= end || lo >= end {
                break;
            }
            if g_hi <= lo || rows == 0 {
                continue;
            }
            let at = format!("row group {g}");
            let group = guarded(path, &at, || reader.get_row_group(g))?;
            let mut rows_of = guarded(path, &at, || {
                RowIter::from_row_group(projection.clone(), &*group)
                    .map(|rows| rows.with_batch_size(READ_AHEAD))
            })?;
            for n in g_lo..g_hi.min(end) {
                let row = guarded(path, &at, || rows_of.next().transpose())?.ok_or_else(|| {
                    ShardError::corrupt(
                        path,
                        &at,
                        format!("ended at row {n}, the footer says {rows} rows from row {g_lo}"),
                    )
                })?;
                if n >= lo {
                    each(
                        n,
                        Ok(Sample {
                            key: format!("row {n}"),
                            fields: row_fields(row),
                        }),
                    );
                }
            }
        }
        if hi > total {
            return Err(ShardError::Changed {
                shard: path.to_path_buf(),
                expected: hi,
                found: total,
            });
        }
        Ok(())
    }
}

/// Opens the shard and decodes its footer; returns the reader and the
/// shard's length.
fn open(shard: &Shard) -> Result<(SerializedFileReader<ShardReader>, u64), ShardError> {
    let reader = shard.open()?;
    let len = reader.len();
    Ok((
        guarded(&shard.name, "footer", || SerializedFileReader::new(reader))?,
        len,
    ))
}

impl Length for ShardReader {
    fn len(&self) -> u64 {
        ShardReader::len(self)
    }
}

/// The parquet crate's reads of a shard: for a file, what the crate does for
/// a [`File`] (a clone of the handle, sought, buffered; the bytes copied
/// out); for a shard in memory, a cursor and slices of its bytes, without a
/// copy. A byte of a shard in memory that was not fetched is an I/O error
/// (and so a [`ShardError::Io`]), never a panic.
impl ChunkReader for ShardReader {
    type T = ChunkRead;

    fn get_read(&self, start: u64) -> ::parquet::errors::Result<ChunkRead> {
        match self {
            ShardReader::File { file, .. } => file.get_read(start).map(ChunkRead::File),
            ShardReader::Memory(memory) => Ok(ChunkRead::Memory(memory.at(start))),
        }
    }

    fn get_bytes(&self, start: u64, length: usize) -> ::parquet::errors::Result<Bytes> {
        match self {
            ShardReader::File { file, .. } => file.get_bytes(start, length),
            ShardReader::Memory(memory) => match memory.slice(start, length)? {
                Some(bytes) => Ok(bytes),
                // As the crate says it of a file.
                None => Err(ParquetError::EOF(format!(
                    "Expected to read {length} bytes, read only {}",
                    ShardReader::len(self)
                        .saturating_sub(start)
                        .min(length as u64)
                ))),
            },
        }
    }
}

/// A reader of a shard from a byte on, as the parquet crate asks for one
/// ([`ChunkReader::get_read`]).
#[derive(Debug)]
pub enum ChunkRead {
    /// A file's.
    File(BufReader<File>),
    /// A shard in memory's.
    Memory(MemoryReader),
}

impl Read for ChunkRead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ChunkRead::File(file) => file.read(buf),
            ChunkRead::Memory(memory) => memory.read(buf),
        }
    }
}

/// The rows of each row group, checked against the file's row count (so
/// that their sum, and every partial sum, fits a `u64`), and every column
/// chunk's bytes checked to lie inside the file (the parquet crate asserts
/// that they are not negative: a corrupt footer would panic it).
fn group_rows(path: &Path, meta: &ParquetMetaData, len: u64) -> Result<Vec<u64>, ShardError> {
    for (g, group) in meta.row_groups().iter().enumerate() {
        for column in group.columns() {
            let start = column
                .dictionary_page_offset()
                .unwrap_or_else(|| column.data_page_offset());
            let size = column.compressed_size();
            let inside = u64::try_from(start)
                .ok()
                .zip(u64::try_from(size).ok())
                .and_then(|(start, size)| start.checked_add(size))
                .is_some_and(|end| end <= len);
            if !inside {
                return Err(ShardError::corrupt(
                    path,
                    "footer",
                    format!(
                        "row group {g}: column {} says its {size} bytes start at {start}, \
                         not inside the file of {len} bytes",
                        column.column_path()
                    ),
                ));
            }
        }
    }
    let groups = meta
        .row_groups()
        .iter()
        .enumerate()
        .map(|(g, group)| {
            u64::try_from(group.num_rows()).map_err(|_| {
                ShardError::corrupt(
                    path,
                    "footer",
                    format!("row group {g} has {} rows", group.num_rows()),
                )
            })
        })
        .collect::<Result<Vec<u64>, _>>()?;
    let sum = groups
        .iter()
        .try_fold(0u64, |sum, &rows| sum.checked_add(rows));
    let stated = meta.file_metadata().num_rows();
    if sum.is_none() || u64::try_from(stated).ok() != sum {
        return Err(ShardError::corrupt(
            path,
            "footer",
            match sum {
                Some(sum) => format!(
                    "the file says {stated} rows, its {} row groups {sum}",
                    groups.len()
                ),
                None => format!("the file says {stated} rows, its row groups more than 2^64"),
            },
        ));
    }
    Ok(groups)
}

/// How an error caught as a panic of the parquet crate begins (a bug of the
/// crate on corrupt input; the fuzz target counts it as a finding).
pub(crate) const DECODER_PANIC: &str = "the Parquet decoder failed";

/// Runs a step of the parquet decoder, turning its errors and panics into a
/// [`ShardError`] at `at`.
fn guarded<T>(
    path: &Path,
    at: &str,
    step: impl FnOnce() -> Result<T, ParquetError>,
) -> Result<T, ShardError> {
    // The decoder's state is dropped on failure (the read ends), so a panic
    // leaves nothing half-updated behind that is used again.
    match panic::catch_unwind(AssertUnwindSafe(step)) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(shard_error(path, at, error)),
        Err(payload) => Err(ShardError::corrupt(
            path,
            at,
            format!("{DECODER_PANIC}: {}", crate::panic::message(&*payload)),
        )),
    }
}

/// A parquet error as a [`ShardError`]: an OS error (or bytes of a shard in
/// memory that were not fetched) is [`ShardError::Io`], anything else (an
/// early end of file included) is corruption at `at`.
fn shard_error(path: &Path, at: &str, error: ParquetError) -> ShardError {
    match error {
        ParquetError::External(inner) => match inner.downcast::<std::io::Error>() {
            Ok(io) if io.kind() != std::io::ErrorKind::UnexpectedEof || not_fetched(&io) => {
                ShardError::io(path, *io)
            }
            Ok(io) => ShardError::corrupt(path, at, io.to_string()),
            Err(other) => ShardError::corrupt(path, at, other.to_string()),
        },
        other => ShardError::corrupt(path, at, other.to_string()),
    }
}

/// Refuses a schema with a leaf the record API cannot convert (it would
/// panic on the first value).
fn check_types(path: &Path, root: &Type) -> Result<(), ShardError> {
    fn walk(t: &Type, trail: &mut Vec<String>, path: &Path) -> Result<(), ShardError> {
        trail.push(t.name().to_owned());
        if t.is_primitive() {
            let converted = t.get_basic_info().converted_type();
            let physical = t.get_physical_type();
            let supported = match physical {
                PhysicalType::INT32 => matches!(
                    converted,
                    ConvertedType::NONE
                        | ConvertedType::INT_8
                        | ConvertedType::INT_16
                        | ConvertedType::INT_32
                        | ConvertedType::UINT_8
                        | ConvertedType::UINT_16
                        | ConvertedType::UINT_32
                        | ConvertedType::DATE
                        | ConvertedType::TIME_MILLIS
                        | ConvertedType::DECIMAL
                ),
                PhysicalType::INT64 => matches!(
                    converted,
                    ConvertedType::NONE
                        | ConvertedType::INT_64
                        | ConvertedType::UINT_64
                        | ConvertedType::TIME_MICROS
                        | ConvertedType::TIMESTAMP_MILLIS
                        | ConvertedType::TIMESTAMP_MICROS
                        | ConvertedType::DECIMAL
                ),
                PhysicalType::BYTE_ARRAY => matches!(
                    converted,
                    ConvertedType::NONE
                        | ConvertedType::UTF8
                        | ConvertedType::ENUM
                        | ConvertedType::JSON
                        | ConvertedType::BSON
                        | ConvertedType::DECIMAL
                ),
                PhysicalType::FIXED_LEN_BYTE_ARRAY => {
                    matches!(converted, ConvertedType::NONE | ConvertedType::DECIMAL)
                }
                PhysicalType::BOOLEAN
                | PhysicalType::INT96
                | PhysicalType::FLOAT
                | PhysicalType::DOUBLE => true,
            };
            if !supported {
                return Err(ShardError::corrupt(
                    path,
                    "schema",
                    format!(
                        "column {}: {physical} annotated {converted} cannot be read",
                        trail[1..].join(".")
                    ),
                ));
            }
        } else {
            for field in t.get_fields() {
                walk(field, trail, path)?;
            }
        }
        trail.pop();
        Ok(())
    }
    walk(root, &mut Vec::new(), path)
}

/// A row's columns as a sample's fields.
fn row_fields(row: Row) -> Vec<(String, Value)> {
    row.into_columns()
        .into_iter()
        .map(|(name, field)| {
            let value = value(&field);
            (name, value)
        })
        .collect()
}

/// A Parquet field as a [`Value`] (the table in the module's docs).
/// A binary value's bytes, in a buffer the native chain gave back when one
/// fits (see `crate::recycle`).
fn owned_bytes(data: &[u8]) -> Vec<u8> {
    let mut out = crate::recycle::take(data.len());
    out.extend_from_slice(data);
    out
}

fn value(field: &Field) -> Value {
    match field {
        Field::Null => Value::Null,
        Field::Bool(b) => Value::Bool(*b),
        Field::Byte(v) => Value::Int(i64::from(*v)),
        Field::Short(v) => Value::Int(i64::from(*v)),
        Field::Int(v) | Field::Date(v) | Field::TimeMillis(v) => Value::Int(i64::from(*v)),
        Field::Long(v) => Value::Int(*v),
        Field::UByte(v) => Value::Int(i64::from(*v)),
        Field::UShort(v) => Value::Int(i64::from(*v)),
        Field::UInt(v) => Value::Int(i64::from(*v)),
        Field::ULong(v) => match i64::try_from(*v) {
            Ok(v) => Value::Int(v),
            // Past i64::MAX: the nearest f64 rather than a wrapped integer.
            #[allow(clippy::cast_precision_loss)]
            Err(_) => Value::Float(*v as f64),
        },
        Field::Float16(v) => Value::Float(v.to_f64()),
        Field::Float(v) => Value::Float(f64::from(*v)),
        Field::Double(v) => Value::Float(*v),
        Field::Decimal(d) => Value::Float(decimal(d.data(), d.scale())),
        Field::Str(s) => Value::Str(s.clone()),
        Field::Bytes(b) => Value::Bytes(owned_bytes(b.data())),
        Field::TimeMicros(v) | Field::TimestampMillis(v) | Field::TimestampMicros(v) => {
            Value::Int(*v)
        }
        Field::Group(row) => group(row),
        Field::ListInternal(list) => Value::List(list.elements().iter().map(value).collect()),
        Field::MapInternal(map) => {
            let entries = map.entries();
            if entries.iter().all(|(k, _)| matches!(k, Field::Str(_))) {
                Value::Map(
                    entries
                        .iter()
                        .map(|(k, v)| match k {
                            Field::Str(k) => (k.clone(), value(v)),
                            _ => unreachable!("every key was checked to be a string"),
                        })
                        .collect(),
                )
            } else {
                Value::List(
                    entries
                        .iter()
                        .map(|(k, v)| Value::List(vec![value(k), value(v)]))
                        .collect(),
                )
            }
        }
    }
}

/// A struct as a [`Value::Map`], or a Hugging Face image struct as its bytes.
fn group(row: &Row) -> Value {
    let mut bytes = None;
    let mut path = None;
    let mut others = 0;
    for (name, field) in row.get_column_iter() {
        match name.as_str() {
            "bytes" => bytes = Some(field),
            "path" => path = Some(field),
            _ => others += 1,
        }
    }
    if others == 0 {
        match (bytes, path) {
            (Some(Field::Bytes(b)), Some(Field::Str(_) | Field::Null)) => {
                return Value::Bytes(owned_bytes(b.data()))
            }
            (Some(Field::Null), Some(Field::Null)) => return Value::Null,
            _ => {}
        }
    }
    Value::Map(
        row.get_column_iter()
            .map(|(name, field)| (name.clone(), value(field)))
            .collect(),
    )
}

/// A decimal's unscaled big-endian two's-complement `data` over
/// `10^scale`, as the nearest `f64` (or close to it past 16 bytes).
fn decimal(data: &[u8], scale: i32) -> f64 {
    let unscaled = if data.len() <= 16 {
        let fill = if data.first().is_some_and(|b| b & 0x80 != 0) {
            0xff
        } else {
            0
        };
        let mut wide = [fill; 16];
        wide[16 - data.len()..].copy_from_slice(data);
        #[allow(clippy::cast_precision_loss)]
        let v = i128::from_be_bytes(wide) as f64;
        v
    } else {
        let (head, rest) = data.split_at(1);
        let first = f64::from(i8::from_be_bytes([head[0]]));
        rest.iter()
            .fold(first, |acc, &b| acc * 256.0 + f64::from(b))
    };
    unscaled / 10f64.powi(scale)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod caught {
    use super::*;

    /// A fuzz input (`fuzz/caught/shards/`) on which the parquet crate
    /// panics ("Decoder for dict should have been set": a data page that
    /// says it is dictionary-encoded in a column chunk without a dictionary
    /// page). The reader's guard catches it: the read ends with a
    /// `ShardError` at its row group, never a panic out of the reader.
    #[test]
    fn a_known_decoder_panic_is_a_corrupt_shard() {
        let input = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/caught/shards/parquet-dict-decoder-not-set");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard.parquet");
        std::fs::copy(&input, &path).unwrap();
        let format = ParquetFormat::new(None);
        let Ok(info) = format.count(&Shard::file(&path)) else {
            return; // refused from the footer: no panic either
        };
        let result = format.read(&Shard::file(&path), 0, info.samples, &mut |_, _| {});
        let error = result.expect_err("the corrupt page ends the read");
        assert!(matches!(error, ShardError::Corrupt { .. }), "{error}");
        assert!(error.to_string().contains(DECODER_PANIC), "{error}");
    }
}
