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
use crate::shards::testing::assert_not_fetched;

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
            let v: Vec<FixedLenByteArray> = v.into_iter().map(FixedLenByteArray::from).collect();
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
    let mut writer = SerializedFileWriter::new(file, Arc::new(schema), Arc::new(props)).unwrap();
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
        assert_not_fetched(result, name);
    }
    // A tail one byte short of the footer cannot be counted.
    let short = Shard::tail(name, footer(&bytes)[1..].to_vec(), len);
    assert_not_fetched(format.count(&short), name);
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
        let want: Vec<(String, Value)> = want.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
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
