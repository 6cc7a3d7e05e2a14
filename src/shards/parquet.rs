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
    not_fetched, Each, MemoryReader, Sample, Shard, ShardError, ShardFormat, ShardInfo,
    ShardReader, Value,
};

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
mod tests {
    use std::fs::{self, OpenOptions};
    use std::io::{Seek, SeekFrom, Write};
    use std::path::PathBuf;

    use ::parquet::basic::{Compression, Repetition, ZstdLevel};
    use ::parquet::data_type::{
        BoolType, ByteArray, ByteArrayType, DoubleType, FixedLenByteArray, FixedLenByteArrayType,
        FloatType, Int32Type, Int64Type,
    };
    use ::parquet::file::properties::WriterProperties;
    use ::parquet::file::writer::{SerializedColumnWriter, SerializedFileWriter};
    use ::parquet::schema::parser::parse_message_type;

    use super::*;

    /// One leaf column's values and levels for one row group.
    enum Col {
        Bool(Vec<bool>),
        I32(Vec<i32>, Option<Vec<i16>>, Option<Vec<i16>>),
        I64(Vec<i64>, Option<Vec<i16>>),
        F32(Vec<f32>),
        F64(Vec<f64>, Option<Vec<i16>>),
        Bin(Vec<&'static [u8]>, Option<Vec<i16>>, Option<Vec<i16>>),
        Str(Vec<String>, Option<Vec<i16>>, Option<Vec<i16>>),
        Fixed(Vec<Vec<u8>>),
    }

    fn write_col(writer: &mut SerializedColumnWriter<'_>, col: Col) {
        match col {
            Col::Bool(v) => writer.typed::<BoolType>().write_batch(&v, None, None),
            Col::I32(v, d, r) => {
                writer
                    .typed::<Int32Type>()
                    .write_batch(&v, d.as_deref(), r.as_deref())
            }
            Col::I64(v, d) => writer
                .typed::<Int64Type>()
                .write_batch(&v, d.as_deref(), None),
            Col::F32(v) => writer.typed::<FloatType>().write_batch(&v, None, None),
            Col::F64(v, d) => writer
                .typed::<DoubleType>()
                .write_batch(&v, d.as_deref(), None),
            Col::Bin(v, d, r) => {
                let v: Vec<ByteArray> = v.into_iter().map(ByteArray::from).collect();
                writer
                    .typed::<ByteArrayType>()
                    .write_batch(&v, d.as_deref(), r.as_deref())
            }
            Col::Str(v, d, r) => {
                let v: Vec<ByteArray> = v.iter().map(|s| ByteArray::from(s.as_str())).collect();
                writer
                    .typed::<ByteArrayType>()
                    .write_batch(&v, d.as_deref(), r.as_deref())
            }
            Col::Fixed(v) => {
                let v: Vec<FixedLenByteArray> =
                    v.into_iter().map(FixedLenByteArray::from).collect();
                writer
                    .typed::<FixedLenByteArrayType>()
                    .write_batch(&v, None, None)
            }
        }
        .unwrap();
    }

    /// Writes a Parquet file of `schema`, one row group per item of `groups`
    /// (its leaf columns in schema order).
    fn write(path: &Path, schema: Type, compression: Compression, groups: Vec<Vec<Col>>) {
        let props = WriterProperties::builder()
            .set_compression(compression)
            .build();
        let file = File::create(path).unwrap();
        let mut writer =
            SerializedFileWriter::new(file, Arc::new(schema), Arc::new(props)).unwrap();
        for cols in groups {
            let mut group = writer.next_row_group().unwrap();
            for col in cols {
                let mut column = group.next_column().unwrap().unwrap();
                write_col(&mut column, col);
                column.close().unwrap();
            }
            assert!(group.next_column().unwrap().is_none(), "a column unwritten");
            group.close().unwrap();
        }
        writer.close().unwrap();
    }

    const BASIC: &str = "
        message schema {
          required int64 id;
          optional binary name (STRING);
          optional double score;
          optional group image {
            optional binary bytes;
            optional binary path (STRING);
          }
        }";

    const ROWS: u64 = 21;
    const PER_GROUP: u64 = 7;

    fn has_name(i: u64) -> bool {
        i % 5 != 3
    }
    fn has_score(i: u64) -> bool {
        i % 4 != 1
    }
    fn has_image(i: u64) -> bool {
        i % 6 != 5
    }
    /// Row 20's image has a path and no bytes.
    fn has_bytes(i: u64) -> bool {
        has_image(i) && i != 20
    }
    fn image_bytes(i: u64) -> &'static [u8] {
        // Distinct per row, leaked to get 'static slices for the writer.
        Box::leak(vec![0xff, 0xd8, i as u8, 0xd9].into_boxed_slice())
    }

    /// The sample row `i` of a basic file must be read as.
    fn expected(i: u64) -> Sample {
        let image = if !has_image(i) {
            Value::Null
        } else if has_bytes(i) {
            Value::Bytes(image_bytes(i).to_vec())
        } else {
            Value::Map(vec![
                ("bytes".into(), Value::Null),
                ("path".into(), Value::Str(format!("img{i}.jpg"))),
            ])
        };
        Sample {
            key: format!("row {i}"),
            fields: vec![
                ("id".into(), Value::Int(id_of(i))),
                (
                    "name".into(),
                    if has_name(i) {
                        Value::Str(format!("name {i}"))
                    } else {
                        Value::Null
                    },
                ),
                (
                    "score".into(),
                    if has_score(i) {
                        Value::Float(score_of(i))
                    } else {
                        Value::Null
                    },
                ),
                ("image".into(), image),
            ],
        }
    }

    fn id_of(i: u64) -> i64 {
        i64::try_from(i).unwrap() * 10
    }
    fn score_of(i: u64) -> f64 {
        f64::from(u32::try_from(i).unwrap()) * 0.5
    }

    /// The definition levels of an optional top-level column.
    fn def(rows: &[u64], present: impl Fn(u64) -> bool) -> Vec<i16> {
        rows.iter().map(|&i| i16::from(present(i))).collect()
    }

    /// A file of 3 row groups of 7 rows of [`BASIC`].
    fn basic(dir: &Path, compression: Compression) -> PathBuf {
        let path = dir.join("basic.parquet");
        let groups = (0..ROWS / PER_GROUP)
            .map(|g| {
                let rows: Vec<u64> = (g * PER_GROUP..(g + 1) * PER_GROUP).collect();
                let image_def = |present: &dyn Fn(u64) -> bool| -> Option<Vec<i16>> {
                    Some(
                        rows.iter()
                            .map(|&i| match (has_image(i), present(i)) {
                                (false, _) => 0,
                                (true, false) => 1,
                                (true, true) => 2,
                            })
                            .collect(),
                    )
                };
                vec![
                    Col::I64(rows.iter().map(|&i| id_of(i)).collect(), None),
                    Col::Str(
                        rows.iter()
                            .filter(|&&i| has_name(i))
                            .map(|i| format!("name {i}"))
                            .collect(),
                        Some(def(&rows, has_name)),
                        None,
                    ),
                    Col::F64(
                        rows.iter()
                            .filter(|&&i| has_score(i))
                            .map(|&i| score_of(i))
                            .collect(),
                        Some(def(&rows, has_score)),
                    ),
                    Col::Bin(
                        rows.iter()
                            .filter(|&&i| has_bytes(i))
                            .map(|&i| image_bytes(i))
                            .collect(),
                        image_def(&has_bytes),
                        None,
                    ),
                    Col::Str(
                        rows.iter()
                            .filter(|&&i| has_image(i))
                            .map(|i| format!("img{i}.jpg"))
                            .collect(),
                        image_def(&has_image),
                        None,
                    ),
                ]
            })
            .collect();
        write(
            &path,
            parse_message_type(BASIC).unwrap(),
            compression,
            groups,
        );
        path
    }

    fn compressions() -> [Compression; 2] {
        [
            Compression::SNAPPY,
            Compression::ZSTD(ZstdLevel::try_new(3).unwrap()),
        ]
    }

    /// Reads `lo..hi`, checking the numbers passed with the samples.
    fn read(
        format: &ParquetFormat,
        path: &Path,
        lo: u64,
        hi: u64,
    ) -> (Vec<Sample>, Result<(), ShardError>) {
        read_shard(format, &Shard::file(path), lo, hi)
    }

    /// [`read`] of any shard.
    fn read_shard(
        format: &ParquetFormat,
        shard: &Shard,
        lo: u64,
        hi: u64,
    ) -> (Vec<Sample>, Result<(), ShardError>) {
        let mut got = Vec::new();
        let mut next = lo;
        let result = format.read(shard, lo, hi, &mut |n, sample| {
            assert_eq!(n, next, "samples out of order");
            next += 1;
            got.push(sample.unwrap());
        });
        (got, result)
    }

    fn corrupt_at(error: &ShardError) -> (&str, &str) {
        match error {
            ShardError::Corrupt { at, message, .. } => (at, message),
            other => panic!("not Corrupt: {other:?}"),
        }
    }

    #[test]
    fn counts_from_the_footer() {
        let dir = tempfile::tempdir().unwrap();
        for compression in compressions() {
            let path = basic(dir.path(), compression);
            let info = ParquetFormat::new(None).count(&Shard::file(&path)).unwrap();
            assert_eq!(info.samples, ROWS);
            assert_eq!((info.first_key, info.last_key), (None, None));
        }
    }

    #[test]
    fn reads_every_row_nulls_and_images() {
        let dir = tempfile::tempdir().unwrap();
        for compression in compressions() {
            let path = basic(dir.path(), compression);
            let (rows, result) = read(&ParquetFormat::new(None), &path, 0, ROWS);
            result.unwrap();
            let want: Vec<Sample> = (0..ROWS).map(expected).collect();
            assert_eq!(rows, want, "{compression:?}");
            assert!(rows.iter().any(|s| s.get("name") == Some(&Value::Null)));
            assert!(rows.iter().any(|s| s.get("score") == Some(&Value::Null)));
            assert!(rows.iter().any(|s| s.get("image") == Some(&Value::Null)));
            assert_eq!(
                rows[4].get("image"),
                Some(&Value::Bytes(vec![0xff, 0xd8, 4, 0xd9]))
            );
        }
    }

    #[test]
    fn a_range_is_the_same_slice_of_a_full_read() {
        let dir = tempfile::tempdir().unwrap();
        for compression in compressions() {
            let path = basic(dir.path(), compression);
            let format = ParquetFormat::new(None);
            let (all, result) = read(&format, &path, 0, ROWS);
            result.unwrap();
            for (lo, hi) in [
                (0, 1),
                (0, 7),
                (0, 10),
                (3, 5),
                (6, 8),
                (7, 14),
                (9, 13),
                (5, 19),
                (13, 21),
                (14, 21),
                (20, 21),
                (0, 21),
                (8, 8),
                (21, 21),
            ] {
                let (rows, result) = read(&format, &path, lo, hi);
                result.unwrap();
                assert_eq!(rows, all[lo as usize..hi as usize], "{lo}..{hi}");
            }
        }
    }

    #[test]
    fn projects_columns_in_the_order_given() {
        let dir = tempfile::tempdir().unwrap();
        let path = basic(dir.path(), Compression::SNAPPY);
        let format = ParquetFormat::new(Some(vec!["image".into(), "id".into(), "image".into()]));
        assert_eq!(format.columns(), Some(&["image".into(), "id".into()][..]));
        assert_eq!(format.count(&Shard::file(&path)).unwrap().samples, ROWS);
        let (rows, result) = read(&format, &path, 5, 12);
        result.unwrap();
        let want: Vec<Sample> = (5..12)
            .map(|i| {
                let full = expected(i);
                Sample {
                    key: full.key.clone(),
                    fields: vec![
                        ("image".into(), full.get("image").unwrap().clone()),
                        ("id".into(), full.get("id").unwrap().clone()),
                    ],
                }
            })
            .collect();
        assert_eq!(rows, want);
    }

    #[test]
    fn a_missing_column_is_named_with_the_columns_there_are() {
        let dir = tempfile::tempdir().unwrap();
        let path = basic(dir.path(), Compression::SNAPPY);
        let format = ParquetFormat::new(Some(vec!["id".into(), "label".into()]));
        let error = format.count(&Shard::file(&path)).unwrap_err();
        let (at, message) = corrupt_at(&error);
        assert_eq!(at, "schema");
        assert!(message.contains("\"label\""), "{message}");
        assert!(message.contains("id, name, score, image"), "{message}");
        assert!(error.to_string().contains("basic.parquet"), "{error}");
        let (rows, result) = read(&format, &path, 0, 3);
        assert!(rows.is_empty());
        assert_eq!(corrupt_at(&result.unwrap_err()).0, "schema");
        // A nested field is not a top-level column.
        let nested = ParquetFormat::new(Some(vec!["bytes".into()]));
        assert_eq!(
            corrupt_at(&nested.count(&Shard::file(&path)).unwrap_err()).0,
            "schema"
        );
    }

    #[test]
    fn reading_past_the_end_is_changed_after_the_rows_there_are() {
        let dir = tempfile::tempdir().unwrap();
        let path = basic(dir.path(), Compression::SNAPPY);
        let format = ParquetFormat::new(None);
        let (rows, result) = read(&format, &path, 18, 25);
        assert_eq!(rows, (18..21).map(expected).collect::<Vec<_>>());
        match result.unwrap_err() {
            ShardError::Changed {
                shard,
                expected,
                found,
            } => {
                assert_eq!(shard, path);
                assert_eq!((expected, found), (25, ROWS));
            }
            other => panic!("not Changed: {other:?}"),
        }
        let (rows, result) = read(&format, &path, 30, 31);
        assert!(rows.is_empty());
        assert!(matches!(result, Err(ShardError::Changed { found: 21, .. })));
    }

    #[test]
    fn a_cut_footer_or_another_format_is_corrupt_at_the_footer() {
        let dir = tempfile::tempdir().unwrap();
        let path = basic(dir.path(), Compression::SNAPPY);
        let len = fs::metadata(&path).unwrap().len();
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(len - 20).unwrap();
        drop(file);
        let format = ParquetFormat::new(None);
        let error = format.count(&Shard::file(&path)).unwrap_err();
        assert_eq!(corrupt_at(&error).0, "footer", "{error}");
        let (rows, result) = read(&format, &path, 0, 3);
        assert!(rows.is_empty());
        assert_eq!(corrupt_at(&result.unwrap_err()).0, "footer");

        let text = dir.path().join("text.parquet");
        fs::write(&text, "id,name\n1,a\n2,b\n".repeat(10)).unwrap();
        assert_eq!(
            corrupt_at(&format.count(&Shard::file(&text)).unwrap_err()).0,
            "footer"
        );
        let tiny = dir.path().join("tiny.parquet");
        fs::write(&tiny, b"PAR1").unwrap();
        assert_eq!(
            corrupt_at(&format.count(&Shard::file(&tiny)).unwrap_err()).0,
            "footer"
        );

        let missing = dir.path().join("missing.parquet");
        assert!(matches!(
            format.count(&Shard::file(&missing)),
            Err(ShardError::Io { .. })
        ));
    }

    /// The footer of the Parquet file `bytes` and the 8 bytes after it
    /// (its length and `PAR1`).
    fn footer(bytes: &[u8]) -> &[u8] {
        let len = bytes.len();
        assert_eq!(&bytes[len - 4..], b"PAR1");
        let meta = u32::from_le_bytes(bytes[len - 8..len - 4].try_into().unwrap()) as usize;
        &bytes[len - 8 - meta..]
    }

    #[test]
    fn a_shard_in_memory_reads_as_its_file() {
        let dir = tempfile::tempdir().unwrap();
        for compression in compressions() {
            let path = basic(dir.path(), compression);
            let memory = Shard::memory(&path, fs::read(&path).unwrap());
            let projected = ParquetFormat::new(Some(vec!["image".into(), "id".into()]));
            for format in [ParquetFormat::new(None), projected] {
                assert_eq!(
                    format.count(&memory).unwrap(),
                    format.count(&Shard::file(&path)).unwrap()
                );
                for (lo, hi) in [(0, ROWS), (3, 5), (6, 15), (20, 21), (18, 25)] {
                    let (rows, result) = read_shard(&format, &memory, lo, hi);
                    let (want, want_result) = read(&format, &path, lo, hi);
                    assert_eq!(rows, want, "{lo}..{hi}");
                    assert_eq!(
                        result.map_err(|e| e.to_string()),
                        want_result.map_err(|e| e.to_string())
                    );
                }
            }
            let (rows, result) = read_shard(&ParquetFormat::new(None), &memory, 0, ROWS);
            result.unwrap();
            assert_eq!(rows, (0..ROWS).map(expected).collect::<Vec<_>>());
        }
        // A cut footer, or no Parquet at all, is refused the same way.
        let path = basic(dir.path(), Compression::SNAPPY);
        let bytes = fs::read(&path).unwrap();
        let format = ParquetFormat::new(None);
        for data in [&bytes[..bytes.len() - 20], &bytes[..4], b"id,name\n1,a\n"] {
            fs::write(&path, data).unwrap();
            let from_file = format.count(&Shard::file(&path)).unwrap_err();
            let from_memory = format
                .count(&Shard::memory(&path, data.to_vec()))
                .unwrap_err();
            assert_eq!(corrupt_at(&from_memory).0, "footer");
            assert_eq!(from_memory.to_string(), from_file.to_string());
        }
    }

    #[test]
    fn a_tail_in_memory_counts_from_the_footer_and_reads_no_row() {
        let dir = tempfile::tempdir().unwrap();
        let path = basic(dir.path(), Compression::SNAPPY);
        let bytes = fs::read(&path).unwrap();
        let len = bytes.len() as u64;
        let name = Path::new("s3://bucket/basic.parquet");
        let tail = Shard::tail(name, footer(&bytes).to_vec(), len);
        let format = ParquetFormat::new(None);
        let info = format.count(&tail).unwrap();
        assert_eq!(info.samples, ROWS);
        // The schema is in the footer: a missing column is found from it.
        let label = ParquetFormat::new(Some(vec!["label".into()]));
        assert_eq!(corrupt_at(&label.count(&tail).unwrap_err()).0, "schema");
        // Rows are not in it: their read is an I/O error naming the shard.
        for (lo, hi) in [(0, ROWS), (15, 16)] {
            let (rows, result) = read_shard(&format, &tail, lo, hi);
            assert!(rows.is_empty());
            match result {
                Err(ShardError::Io { shard, source }) => {
                    assert_eq!(shard, name);
                    assert!(source.to_string().contains("not fetched"), "{source}");
                }
                other => panic!("{other:?}"),
            }
        }
        // A tail one byte short of the footer cannot be counted.
        let short = Shard::tail(name, footer(&bytes)[1..].to_vec(), len);
        match format.count(&short) {
            Err(ShardError::Io { shard, source }) => {
                assert_eq!(shard, name);
                assert!(source.to_string().contains("not fetched"), "{source}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn chunk_reads_of_memory_are_slices_and_end_as_a_file_does() {
        let data: Vec<u8> = (0..100).collect();
        let bytes = Bytes::from(data.clone());
        let reader = Shard::tail("t", bytes.slice(60..), 100).open().unwrap();
        assert_eq!(Length::len(&reader), 100);
        let got = reader.get_bytes(70, 10).unwrap();
        assert_eq!(&got[..], &data[70..80]);
        assert_eq!(got.as_ptr(), bytes[70..].as_ptr(), "a slice, not a copy");
        let mut rest = Vec::new();
        reader.get_read(90).unwrap().read_to_end(&mut rest).unwrap();
        assert_eq!(rest, &data[90..]);
        let not_fetched = |e: ParquetError| match e {
            ParquetError::External(e) => e.to_string().contains("not fetched"),
            _ => false,
        };
        assert!(not_fetched(reader.get_bytes(50, 20).unwrap_err()));
        let mut start = reader.get_read(10).unwrap();
        assert!(start
            .read(&mut [0; 4])
            .unwrap_err()
            .to_string()
            .contains("not fetched"));
        // Past the end: the error a file gives.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        fs::write(&path, &data).unwrap();
        let file = Shard::file(&path).open().unwrap();
        assert_eq!(Length::len(&file), 100);
        assert_eq!(&file.get_bytes(70, 10).unwrap()[..], &data[70..80]);
        for (start, length) in [(95, 10), (100, 1), (150, 3)] {
            assert_eq!(
                reader.get_bytes(start, length).unwrap_err().to_string(),
                file.get_bytes(start, length).unwrap_err().to_string(),
            );
        }
        let mut end = Vec::new();
        reader.get_read(100).unwrap().read_to_end(&mut end).unwrap();
        assert!(end.is_empty());
    }

    #[test]
    fn a_corrupt_page_names_its_row_group_after_the_rows_before_it() {
        let dir = tempfile::tempdir().unwrap();
        for compression in compressions() {
            let path = basic(dir.path(), compression);
            // Garbage over the pages of row group 1's `score` column chunk.
            let (reader, _) = open(&Shard::file(&path)).unwrap();
            let (start, len) = reader.metadata().row_group(1).column(2).byte_range();
            drop(reader);
            let mut file = OpenOptions::new().write(true).open(&path).unwrap();
            file.seek(SeekFrom::Start(start)).unwrap();
            file.write_all(&vec![0xa5; len as usize]).unwrap();
            drop(file);

            let format = ParquetFormat::new(None);
            // The footer is intact: counting does not read pages.
            assert_eq!(format.count(&Shard::file(&path)).unwrap().samples, ROWS);
            let (rows, result) = read(&format, &path, 2, ROWS);
            assert_eq!(rows, (2..7).map(expected).collect::<Vec<_>>());
            let error = result.unwrap_err();
            assert_eq!(corrupt_at(&error).0, "row group 1", "{error}");
            // Row groups that do not overlap the range are not read.
            let (rows, result) = read(&format, &path, 14, ROWS);
            result.unwrap();
            assert_eq!(rows, (14..ROWS).map(expected).collect::<Vec<_>>());
            // Nor are columns out of the projection.
            let ids = ParquetFormat::new(Some(vec!["id".into()]));
            let (rows, result) = read(&ids, &path, 0, ROWS);
            result.unwrap();
            assert_eq!(rows.len(), ROWS as usize);
        }
    }

    #[test]
    fn rows_span_read_ahead_batches() {
        // Row groups longer than READ_AHEAD, with a list column whose values
        // outnumber its rows: batch boundaries fall inside rows.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("long.parquet");
        let schema = "
            message schema {
              required int64 id;
              optional group tags (LIST) {
                repeated group list {
                  required int32 element;
                }
              }
            }";
        let tags = |i: u64| -> Option<Vec<i32>> {
            let i = i32::try_from(i).unwrap();
            (i % 5 != 4).then(|| (0..i % 4).map(|k| i * 10 + k).collect())
        };
        let sizes = [150u64, 3 * READ_AHEAD as u64 + 1];
        let mut first = 0;
        let mut groups = Vec::new();
        for size in sizes {
            let rows = first..first + size;
            first += size;
            let (mut values, mut defs, mut reps) = (Vec::new(), Vec::new(), Vec::new());
            for i in rows.clone() {
                match tags(i) {
                    None => {
                        defs.push(0);
                        reps.push(0);
                    }
                    Some(t) if t.is_empty() => {
                        defs.push(1);
                        reps.push(0);
                    }
                    Some(t) => {
                        for (k, v) in t.into_iter().enumerate() {
                            values.push(v);
                            defs.push(2);
                            reps.push(i16::from(k > 0));
                        }
                    }
                }
            }
            groups.push(vec![
                Col::I64(rows.map(id_of).collect(), None),
                Col::I32(values, Some(defs), Some(reps)),
            ]);
        }
        write(
            &path,
            parse_message_type(schema).unwrap(),
            Compression::SNAPPY,
            groups,
        );
        let total = sizes.iter().sum::<u64>();
        let want: Vec<Sample> = (0..total)
            .map(|i| Sample {
                key: format!("row {i}"),
                fields: vec![
                    ("id".into(), Value::Int(id_of(i))),
                    (
                        "tags".into(),
                        tags(i).map_or(Value::Null, |t| {
                            Value::List(t.into_iter().map(|v| Value::Int(v.into())).collect())
                        }),
                    ),
                ],
            })
            .collect();
        let format = ParquetFormat::new(None);
        assert_eq!(format.count(&Shard::file(&path)).unwrap().samples, total);
        for (lo, hi) in [(0, total), (63, 65), (100, 250), (149, 151), (200, total)] {
            let (rows, result) = read(&format, &path, lo, hi);
            result.unwrap();
            assert_eq!(rows, want[lo as usize..hi as usize], "{lo}..{hi}");
        }
    }

    const TYPES: &str = "
        message schema {
          required boolean flag;
          required int32 small (INT_8);
          required int32 u16 (UINT_16);
          required int64 big (UINT_64);
          required float f;
          required fixed_len_byte_array(2) half (FLOAT16);
          required int32 dec (DECIMAL(9,2));
          required fixed_len_byte_array(16) wide (DECIMAL(38,3));
          required int32 day (DATE);
          required int64 ts (TIMESTAMP(MICROS,true));
          required int64 tn (TIMESTAMP(NANOS,true));
          required binary tag (ENUM);
          required fixed_len_byte_array(4) fx;
          optional group tags (LIST) {
            repeated group list {
              optional binary element (STRING);
            }
          }
          optional group attrs (MAP) {
            repeated group key_value {
              required binary key (STRING);
              optional int32 value;
            }
          }
          required group ids (MAP) {
            repeated group key_value {
              required int32 key;
              required binary value (STRING);
            }
          }
          required group point {
            required double x;
            required double y;
          }
        }";

    /// A file of [`TYPES`] with two rows.
    fn types(path: &Path) {
        let wide = |v: i128| v.to_be_bytes().to_vec();
        write(
            path,
            parse_message_type(TYPES).unwrap(),
            Compression::ZSTD(ZstdLevel::default()),
            vec![vec![
                Col::Bool(vec![true, false]),
                Col::I32(vec![-5, 7], None, None),
                Col::I32(vec![65535, 0], None, None),
                Col::I64(vec![-1, 42], None),
                Col::F32(vec![1.5, -0.25]),
                Col::Fixed(vec![vec![0x00, 0x3c], vec![0x00, 0xc0]]),
                Col::I32(vec![12345, -1], None, None),
                Col::Fixed(vec![wide(-1_234_567), wide(0)]),
                Col::I32(vec![19_000, -1], None, None),
                Col::I64(vec![1_700_000_000_000_000, -1], None),
                Col::I64(vec![1_700_000_000_000_000_123, 0], None),
                Col::Str(vec!["RED".into(), "BLUE".into()], None, None),
                Col::Fixed(vec![vec![1, 2, 3, 4], vec![0; 4]]),
                // tags: ["a", null, "b"], then null.
                Col::Str(
                    vec!["a".into(), "b".into()],
                    Some(vec![3, 2, 3, 0]),
                    Some(vec![0, 1, 1, 0]),
                ),
                // attrs: {"x": 1, "y": null}, then {}.
                Col::Str(
                    vec!["x".into(), "y".into()],
                    Some(vec![2, 2, 1]),
                    Some(vec![0, 1, 0]),
                ),
                Col::I32(vec![1], Some(vec![3, 2, 1]), Some(vec![0, 1, 0])),
                // ids: {7: "seven"}, then {}.
                Col::I32(vec![7], Some(vec![1, 0]), Some(vec![0, 0])),
                Col::Str(vec!["seven".into()], Some(vec![1, 0]), Some(vec![0, 0])),
                Col::F64(vec![1.0, -1.0], None),
                Col::F64(vec![2.0, 0.5], None),
            ]],
        );
    }

    #[test]
    fn maps_every_kind_of_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("types.parquet");
        types(&path);
        let (rows, result) = read(&ParquetFormat::new(None), &path, 0, 2);
        result.unwrap();
        let s = |v: &str| Value::Str(v.into());
        let first = vec![
            ("flag", Value::Bool(true)),
            ("small", Value::Int(-5)),
            ("u16", Value::Int(65535)),
            ("big", Value::Float(2f64.powi(64))),
            ("f", Value::Float(1.5)),
            ("half", Value::Float(1.0)),
            ("dec", Value::Float(123.45)),
            ("wide", Value::Float(-1234.567)),
            ("day", Value::Int(19_000)),
            ("ts", Value::Int(1_700_000_000_000_000)),
            ("tn", Value::Int(1_700_000_000_000_000_123)),
            ("tag", s("RED")),
            ("fx", Value::Bytes(vec![1, 2, 3, 4])),
            ("tags", Value::List(vec![s("a"), Value::Null, s("b")])),
            (
                "attrs",
                Value::Map(vec![("x".into(), Value::Int(1)), ("y".into(), Value::Null)]),
            ),
            (
                "ids",
                Value::List(vec![Value::List(vec![Value::Int(7), s("seven")])]),
            ),
            (
                "point",
                Value::Map(vec![
                    ("x".into(), Value::Float(1.0)),
                    ("y".into(), Value::Float(2.0)),
                ]),
            ),
        ];
        let second = vec![
            ("flag", Value::Bool(false)),
            ("small", Value::Int(7)),
            ("u16", Value::Int(0)),
            ("big", Value::Int(42)),
            ("f", Value::Float(-0.25)),
            ("half", Value::Float(-2.0)),
            ("dec", Value::Float(-0.01)),
            ("wide", Value::Float(0.0)),
            ("day", Value::Int(-1)),
            ("ts", Value::Int(-1)),
            ("tn", Value::Int(0)),
            ("tag", s("BLUE")),
            ("fx", Value::Bytes(vec![0; 4])),
            ("tags", Value::Null),
            ("attrs", Value::Map(vec![])),
            ("ids", Value::Map(vec![])),
            (
                "point",
                Value::Map(vec![
                    ("x".into(), Value::Float(-1.0)),
                    ("y".into(), Value::Float(0.5)),
                ]),
            ),
        ];
        for (row, want) in rows.iter().zip([first, second]) {
            let want: Vec<(String, Value)> =
                want.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            assert_eq!(row.fields, want, "{}", row.key);
        }
        assert_eq!(rows.len(), 2);
    }

    #[test]
    fn a_column_the_record_api_cannot_convert_is_refused_up_front() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("interval.parquet");
        let interval = Type::primitive_type_builder("span", PhysicalType::FIXED_LEN_BYTE_ARRAY)
            .with_length(12)
            .with_repetition(Repetition::REQUIRED)
            .with_converted_type(ConvertedType::INTERVAL)
            .build()
            .unwrap();
        let id = Type::primitive_type_builder("id", PhysicalType::INT64)
            .with_repetition(Repetition::REQUIRED)
            .build()
            .unwrap();
        let schema = Type::group_type_builder("schema")
            .with_fields(vec![Arc::new(id), Arc::new(interval)])
            .build()
            .unwrap();
        write(
            &path,
            schema,
            Compression::UNCOMPRESSED,
            vec![vec![Col::I64(vec![1], None), Col::Fixed(vec![vec![0; 12]])]],
        );
        let all = ParquetFormat::new(None);
        let error = all.count(&Shard::file(&path)).unwrap_err();
        let (at, message) = corrupt_at(&error);
        assert_eq!(at, "schema");
        assert!(
            message.contains("span") && message.contains("INTERVAL"),
            "{message}"
        );
        let (rows, result) = read(&all, &path, 0, 1);
        assert!(rows.is_empty());
        assert_eq!(corrupt_at(&result.unwrap_err()).0, "schema");
        // Projected away, it is no obstacle.
        let ids = ParquetFormat::new(Some(vec!["id".into()]));
        assert_eq!(ids.count(&Shard::file(&path)).unwrap().samples, 1);
        let (rows, result) = read(&ids, &path, 0, 1);
        result.unwrap();
        assert_eq!(rows[0].fields, vec![("id".to_owned(), Value::Int(1))]);
    }

    #[test]
    fn a_decoder_panic_is_corruption_where_it_happened() {
        // Some malformed files make the parquet crate panic (a dictionary
        // page offset garbled in the footer, say): the guard reports it.
        let path = Path::new("shard.parquet");
        let error = guarded(path, "row group 3", || -> Result<(), ParquetError> {
            panic!("Decoder for dict should have been set")
        })
        .unwrap_err();
        let (at, message) = corrupt_at(&error);
        assert_eq!(at, "row group 3");
        assert!(message.contains("Decoder for dict"), "{message}");
        let error = guarded(path, "footer", || -> Result<(), ParquetError> {
            Err(ParquetError::EOF("cut".into()))
        })
        .unwrap_err();
        assert_eq!(corrupt_at(&error), ("footer", "EOF: cut"));
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let error = guarded(path, "row group 0", || -> Result<(), ParquetError> {
            Err(denied.into())
        })
        .unwrap_err();
        assert!(matches!(error, ShardError::Io { .. }), "{error:?}");
        assert_eq!(guarded(path, "footer", || Ok(7)).unwrap(), 7);
    }

    #[test]
    #[allow(clippy::float_cmp)] // exact values, or the same rounding of one division
    fn decimals_of_any_width() {
        assert_eq!(decimal(&[], 0), 0.0);
        assert_eq!(decimal(&[0xff], 0), -1.0);
        assert_eq!(decimal(&[0x01, 0x00], 2), 2.56);
        let mut long = vec![0xff; 20];
        long[19] = 0xfe;
        assert_eq!(decimal(&long, 0), -2.0);
        let mut big = vec![0; 20];
        big[2] = 1;
        assert_eq!(decimal(&big, 0), 2f64.powi(136));
    }
}

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
