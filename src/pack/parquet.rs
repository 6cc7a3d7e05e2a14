//! Writing a Parquet shard in the Hugging Face image layout.
//!
//! The columns come from the shard's first sample:
//!
//! - `image`: a struct of `bytes` (binary: the image file, unchanged) and
//!   `path` (string: the file's path in the image folder, or null), what
//!   `datasets`' `Image` feature stores;
//! - `label`: `int64`, the sample's `cls`;
//! - every other field, under its name with `.` made `_` (`seg.png` is
//!   `seg_png`): binary for bytes, string for text, `int64`, `double`.
//!
//! Every column is optional (a later sample without a field has a null
//! there). The schema's `huggingface` metadata gives `datasets` the
//! features (`Image`, `ClassLabel` with the class names when they are
//! known, `Value` for the rest), so `datasets.load_dataset("parquet", ...)`
//! decodes the images. Row groups hold [`ROW_GROUP_ROWS`] rows (what
//! `datasets` writes for image datasets) or [`ROW_GROUP_BYTES`], whichever
//! comes first; nothing is compressed (the images are already) and no
//! statistics are kept (an image's bytes as a column minimum would bloat
//! the footer). The same samples give the same bytes.

use std::sync::Arc;

use parquet::basic::{Compression, LogicalType, Repetition, Type as Physical};
use parquet::data_type::{ByteArray, ByteArrayType, DoubleType, Int64Type};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::Type;
use serde_json::json;

use super::dest::ShardOut;
use super::error::DestKind;
use super::sample::{Prepared, Value};
use super::shard::{Finished, FormatWriter};
use super::PackError;

/// Rows of a row group at most.
pub const ROW_GROUP_ROWS: usize = 100;

/// Bytes of a row group's values at most (a larger row is a group alone).
pub const ROW_GROUP_BYTES: u64 = 64 << 20;

/// A column's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Image,
    Label,
    Binary,
    Text,
    Int,
    Float,
}

/// A column, and the field of a sample it takes.
#[derive(Debug, Clone)]
struct Column {
    /// The Parquet name.
    name: String,
    /// The sample's field (the tar name: `jpg`, `cls`, `seg.png`).
    field: Option<String>,
    kind: Kind,
}

/// A cell of the buffered rows.
#[derive(Debug)]
enum Cell {
    Null,
    Image(Vec<u8>, Option<String>),
    Bytes(Vec<u8>),
    Int(i64),
    Float(f64),
}

/// A Parquet shard being written.
pub struct ParquetWriter {
    /// The output, until the first sample fixes the schema.
    out: Option<ShardOut>,
    writer: Option<SerializedFileWriter<ShardOut>>,
    class_names: Option<Vec<String>>,
    columns: Vec<Column>,
    /// Buffered rows, column by column.
    cells: Vec<Vec<Cell>>,
    buffered_bytes: u64,
    samples: u64,
}

impl ParquetWriter {
    /// A shard written to `out`; `class_names` go into the `label`
    /// column's `ClassLabel` feature.
    pub fn new(out: ShardOut, class_names: Option<Vec<String>>) -> Self {
        Self {
            out: Some(out),
            writer: None,
            class_names,
            columns: Vec::new(),
            cells: Vec::new(),
            buffered_bytes: 0,
            samples: 0,
        }
    }

    /// The columns of `s`, as the module docs say.
    fn columns_of(s: &Prepared) -> Result<Vec<Column>, String> {
        let mut columns = Vec::new();
        for (i, (field, value)) in s.fields.iter().enumerate() {
            let (name, kind) = if Some(i) == s.image {
                ("image".to_string(), Kind::Image)
            } else if Some(i) == s.label {
                ("label".to_string(), Kind::Label)
            } else {
                let kind = match value {
                    Value::Bytes(_) => Kind::Binary,
                    Value::Text(_) => Kind::Text,
                    Value::Int(_) => Kind::Int,
                    Value::Float(_) => Kind::Float,
                };
                (field.replace('.', "_"), kind)
            };
            if columns.iter().any(|c: &Column| c.name == name) {
                return Err(format!(
                    "the field {field:?} would be a second column {name:?}"
                ));
            }
            columns.push(Column {
                name,
                field: Some(field.clone()),
                kind,
            });
        }
        Ok(columns)
    }

    /// The schema and properties of `self.columns`.
    fn start(&mut self) -> Result<(), PackError> {
        let fail = |e: parquet::errors::ParquetError| PackError::Options(e.to_string());
        let optional = |name: &str, physical: Physical, logical: Option<LogicalType>| {
            Type::primitive_type_builder(name, physical)
                .with_repetition(Repetition::OPTIONAL)
                .with_logical_type(logical)
                .build()
                .map(Arc::new)
        };
        let mut fields = Vec::new();
        let mut features = serde_json::Map::new();
        for c in &self.columns {
            let (t, feature) = match c.kind {
                Kind::Image => (
                    Type::group_type_builder("image")
                        .with_repetition(Repetition::OPTIONAL)
                        .with_fields(vec![
                            optional("bytes", Physical::BYTE_ARRAY, None).map_err(fail)?,
                            optional("path", Physical::BYTE_ARRAY, Some(LogicalType::String))
                                .map_err(fail)?,
                        ])
                        .build()
                        .map(Arc::new)
                        .map_err(fail)?,
                    json!({"_type": "Image"}),
                ),
                Kind::Label => (
                    optional(&c.name, Physical::INT64, None).map_err(fail)?,
                    match &self.class_names {
                        Some(names) => json!({"names": names, "_type": "ClassLabel"}),
                        None => json!({"dtype": "int64", "_type": "Value"}),
                    },
                ),
                Kind::Binary => (
                    optional(&c.name, Physical::BYTE_ARRAY, None).map_err(fail)?,
                    json!({"dtype": "binary", "_type": "Value"}),
                ),
                Kind::Text => (
                    optional(&c.name, Physical::BYTE_ARRAY, Some(LogicalType::String))
                        .map_err(fail)?,
                    json!({"dtype": "string", "_type": "Value"}),
                ),
                Kind::Int => (
                    optional(&c.name, Physical::INT64, None).map_err(fail)?,
                    json!({"dtype": "int64", "_type": "Value"}),
                ),
                Kind::Float => (
                    optional(&c.name, Physical::DOUBLE, None).map_err(fail)?,
                    json!({"dtype": "float64", "_type": "Value"}),
                ),
            };
            fields.push(t);
            features.insert(c.name.clone(), feature);
        }
        let schema = Type::group_type_builder("schema")
            .with_fields(fields)
            .build()
            .map_err(fail)?;
        let hf = json!({"info": {"features": features}}).to_string();
        let props = WriterProperties::builder()
            .set_compression(Compression::UNCOMPRESSED)
            .set_dictionary_enabled(false)
            .set_statistics_enabled(EnabledStatistics::None)
            .set_created_by(format!("ferrofeed {}", env!("CARGO_PKG_VERSION")))
            .set_key_value_metadata(Some(vec![KeyValue::new("huggingface".into(), hf)]))
            .build();
        let out = self.out.take().expect("started once");
        let writer = SerializedFileWriter::new(out, Arc::new(schema), Arc::new(props))
            .map_err(|e| dest_error(&e))?;
        self.writer = Some(writer);
        self.cells = self.columns.iter().map(|_| Vec::new()).collect();
        Ok(())
    }

    /// Writes the buffered rows as a row group.
    fn flush(&mut self) -> Result<(), PackError> {
        if self.cells.first().is_none_or(Vec::is_empty) {
            return Ok(());
        }
        let writer = self.writer.as_mut().expect("started before rows");
        let mut group = writer.next_row_group().map_err(|e| dest_error(&e))?;
        for (column, cells) in self.columns.iter().zip(&mut self.cells) {
            let cells = std::mem::take(cells);
            match column.kind {
                Kind::Image => {
                    let ((bytes, bytes_def), (paths, paths_def)) = image_leaves(cells);
                    write_leaf::<ByteArrayType>(&mut group, &bytes, &bytes_def)?;
                    write_leaf::<ByteArrayType>(&mut group, &paths, &paths_def)?;
                }
                Kind::Label | Kind::Int => {
                    let (v, def) =
                        leaf(cells, |c| if let Cell::Int(i) = c { Some(i) } else { None });
                    write_leaf::<Int64Type>(&mut group, &v, &def)?;
                }
                Kind::Float => {
                    let (v, def) = leaf(cells, |c| {
                        if let Cell::Float(f) = c {
                            Some(f)
                        } else {
                            None
                        }
                    });
                    write_leaf::<DoubleType>(&mut group, &v, &def)?;
                }
                Kind::Binary | Kind::Text => {
                    let (v, def) = leaf(cells, |c| {
                        if let Cell::Bytes(b) = c {
                            Some(ByteArray::from(b))
                        } else {
                            None
                        }
                    });
                    write_leaf::<ByteArrayType>(&mut group, &v, &def)?;
                }
            }
        }
        group.close().map_err(|e| dest_error(&e))?;
        self.buffered_bytes = 0;
        Ok(())
    }

    /// The cell of `column` for `s`.
    fn cell(column: &Column, s: &Prepared) -> Result<Cell, String> {
        let found = match column.kind {
            Kind::Image => s.image.map(|i| &s.fields[i]),
            Kind::Label => s.label.map(|i| &s.fields[i]),
            _ => s
                .fields
                .iter()
                .enumerate()
                .find(|(i, (f, _))| {
                    Some(*i) != s.image && Some(*i) != s.label && Some(f) == column.field.as_ref()
                })
                .map(|(_, f)| f),
        };
        let Some((field, value)) = found else {
            return Ok(Cell::Null);
        };
        let mismatch = || {
            format!(
                "the field {field:?} does not fit the column {:?} of this shard (its columns \
                 and their types come from the shard's first sample)",
                column.name
            )
        };
        Ok(match (column.kind, value) {
            (Kind::Image, Value::Bytes(b)) => Cell::Image(b.clone(), s.path.clone()),
            (Kind::Label | Kind::Int, Value::Int(i)) => Cell::Int(*i),
            (Kind::Float, Value::Float(f)) => Cell::Float(*f),
            #[allow(clippy::cast_precision_loss)]
            (Kind::Float, Value::Int(i)) => Cell::Float(*i as f64),
            (Kind::Binary, Value::Bytes(b)) => Cell::Bytes(b.clone()),
            (Kind::Text, Value::Text(t)) => Cell::Bytes(t.clone().into_bytes()),
            _ => return Err(mismatch()),
        })
    }
}

/// The values and definition levels of an optional top-level column (1:
/// present, 0: null).
fn leaf<T>(cells: Vec<Cell>, take: impl Fn(Cell) -> Option<T>) -> (Vec<T>, Vec<i16>) {
    let mut values = Vec::with_capacity(cells.len());
    let mut def = Vec::with_capacity(cells.len());
    for cell in cells {
        match take(cell) {
            Some(v) => {
                values.push(v);
                def.push(1);
            }
            None => def.push(0),
        }
    }
    (values, def)
}

/// Values and definition levels of the image struct's two leaves (2:
/// present; 1: the struct present, the path null; 0: the struct null).
type Leaf = (Vec<ByteArray>, Vec<i16>);
fn image_leaves(cells: Vec<Cell>) -> (Leaf, Leaf) {
    let (mut bytes, mut paths): (Leaf, Leaf) = Default::default();
    for cell in cells {
        if let Cell::Image(b, p) = cell {
            bytes.0.push(ByteArray::from(b));
            bytes.1.push(2);
            if let Some(p) = p {
                paths.0.push(ByteArray::from(p.into_bytes()));
                paths.1.push(2);
            } else {
                paths.1.push(1);
            }
        } else {
            bytes.1.push(0);
            paths.1.push(0);
        }
    }
    (bytes, paths)
}

/// Writes the next leaf column of `group`.
fn write_leaf<T: parquet::data_type::DataType>(
    group: &mut parquet::file::writer::SerializedRowGroupWriter<'_, ShardOut>,
    values: &[T::T],
    def: &[i16],
) -> Result<(), PackError> {
    let Some(mut column) = group.next_column().map_err(|e| dest_error(&e))? else {
        return Err(PackError::Panic("a Parquet column without its leaf".into()));
    };
    column
        .typed::<T>()
        .write_batch(values, Some(def), None)
        .map_err(|e| dest_error(&e))?;
    column.close().map_err(|e| dest_error(&e))
}

/// A Parquet writer's failure: the sink's I/O error, or the crate's.
fn dest_error(e: &parquet::errors::ParquetError) -> PackError {
    PackError::Dest {
        dest: String::new(),
        reason: format!("cannot write the Parquet file: {e}"),
        kind: DestKind::Other,
        errno: None,
    }
}

impl FormatWriter for ParquetWriter {
    fn cost(&self, s: &Prepared) -> u64 {
        s.data_len() + 16
    }

    fn append(&mut self, s: &Prepared) -> Result<(), PackError> {
        let bad = |why: String| PackError::bad(s.path.clone().unwrap_or(s.key.clone()), why);
        if self.writer.is_none() {
            self.columns = Self::columns_of(s).map_err(bad)?;
            self.start()?;
        }
        let known = |f: &String| self.columns.iter().any(|c| c.field.as_ref() == Some(f));
        if let Some((f, _)) = s
            .fields
            .iter()
            .enumerate()
            .find(|(i, (f, _))| Some(*i) != s.image && Some(*i) != s.label && !known(f))
            .map(|(_, f)| f)
        {
            return Err(bad(format!(
                "the field {f:?} is not a column of this shard (its columns come from the \
                 shard's first sample)"
            )));
        }
        let row = self
            .columns
            .iter()
            .map(|c| Self::cell(c, s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(bad)?;
        for (cells, cell) in self.cells.iter_mut().zip(row) {
            cells.push(cell);
        }
        self.samples += 1;
        self.buffered_bytes += s.data_len();
        if self.cells[0].len() >= ROW_GROUP_ROWS || self.buffered_bytes >= ROW_GROUP_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    fn samples(&self) -> u64 {
        self.samples
    }

    fn finish(mut self: Box<Self>) -> Result<Finished, PackError> {
        self.flush()?;
        let writer = self.writer.take().expect("a shard has a sample");
        let out = writer.into_inner().map_err(|e| dest_error(&e))?;
        Ok(Finished {
            out,
            samples: self.samples,
            first_key: None,
            last_key: None,
            offsets: None,
            end: None,
        })
    }
}
