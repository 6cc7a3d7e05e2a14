use std::io::Write;

use super::*;
use crate::shards::testing::{assert_not_fetched, format_test_reads, Delivered};

fn shard(bytes: &[u8]) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(bytes).unwrap();
    file.flush().unwrap();
    file
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

fn zstd(bytes: &[u8]) -> Vec<u8> {
    zstd::encode_all(bytes, 3).unwrap()
}

/// zstd with the frame checksum (as the `zstd` tool writes it), so that
/// corruption is always found.
fn zstd_checked(bytes: &[u8]) -> Vec<u8> {
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    enc.include_checksum(true).unwrap();
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

type Got = Delivered;

format_test_reads!(JsonLinesFormat);

/// The samples `file` counts.
fn samples_in(file: &Path) -> u64 {
    JsonLinesFormat.count(&Shard::file(file)).unwrap().samples
}

/// Samples `lo..hi` of `file`, all of them read without an error.
fn read_ok(file: &Path, lo: u64, hi: u64) -> Vec<(u64, Sample)> {
    let (got, end) = read(file, lo, hi);
    end.unwrap();
    ok_samples(got)
}

fn ok_samples(got: Got) -> Vec<(u64, Sample)> {
    got.into_iter().map(|(n, s)| (n, s.unwrap())).collect()
}

fn field(name: &str, value: Value) -> (String, Value) {
    (name.to_owned(), value)
}

const TEXT: &[u8] = b"{\"text\": \"a\", \"n\": 1}\n\
    \n\
    {\"text\": \"b\", \"n\": 2}\n   \t\r\n\
    {\"text\": \"c\", \"n\": 3}\r\n\
    {\"text\": \"d\", \"n\": 4}\n\
    \n\n\
    {\"text\": \"e\", \"n\": 5}";

#[test]
fn counts_non_blank_lines() {
    let file = shard(TEXT);
    let info = JsonLinesFormat.count(&Shard::file(file.path())).unwrap();
    assert_eq!(info.samples, 5);
    assert_eq!(info.first_key, None);
    for (text, n) in [
        (&b""[..], 0),
        (b"\n\n \n", 0),
        (b"1", 1),
        (b"1\n", 1),
        (b"1\n\n2\n\n", 2),
        (b"  {}  ", 1),
        (b"not json\n", 1),
    ] {
        let file = shard(text);
        assert_eq!(samples_in(file.path()), n);
    }
}

#[test]
fn keys_are_physical_line_numbers() {
    let file = shard(TEXT);
    let got = read_ok(file.path(), 0, 5);
    let keys: Vec<_> = got.iter().map(|(n, s)| (*n, s.key.as_str())).collect();
    assert_eq!(
        keys,
        [
            (0, "line 1"),
            (1, "line 3"),
            (2, "line 5"),
            (3, "line 6"),
            (4, "line 9")
        ]
    );
    assert_eq!(
        got[1].1.fields,
        [
            field("text", Value::Str("b".into())),
            field("n", Value::Int(2))
        ]
    );
    assert_eq!(got[4].1.get("n"), Some(&Value::Int(5)));
}

#[test]
fn ranges_are_slices_of_the_whole() {
    let file = shard(TEXT);
    let all = read_ok(file.path(), 0, 5);
    for lo in 0..=5 {
        for hi in lo..=5 {
            assert_eq!(
                read_ok(file.path(), lo, hi),
                all[lo as usize..hi as usize],
                "{lo}..{hi}"
            );
        }
    }
}

#[test]
fn too_few_lines_is_changed() {
    let file = shard(TEXT);
    let (got, end) = read(file.path(), 3, 7);
    assert_eq!(got.len(), 2);
    match end {
        Err(ShardError::Changed {
            shard,
            expected,
            found,
        }) => {
            assert_eq!(shard, file.path());
            assert_eq!((expected, found), (7, 5));
        }
        other => panic!("{other:?}"),
    }
    let (got, end) = read(file.path(), 6, 7);
    assert!(got.is_empty());
    assert!(matches!(end, Err(ShardError::Changed { found: 5, .. })));
}

#[test]
fn values_map_onto_value() {
    let file = shard(
        br#"{"z": null, "b": true, "a": [1, -2, 2.5, "x", {"y": {}, "c": []}], "big": 9223372036854775808, "min": -9223372036854775808, "e": 1e3, "s": "\u00e9\n"}
[1, 2]
"just a string"
42
{"k": 1, "j": 2, "k": 3}"#,
    );
    let got = read_ok(file.path(), 0, 5);
    assert_eq!(
        got[0].1.fields,
        [
            field("z", Value::Null),
            field("b", Value::Bool(true)),
            field(
                "a",
                Value::List(vec![
                    Value::Int(1),
                    Value::Int(-2),
                    Value::Float(2.5),
                    Value::Str("x".into()),
                    Value::Map(vec![
                        field("y", Value::Map(vec![])),
                        field("c", Value::List(vec![]))
                    ]),
                ])
            ),
            field("big", Value::Float(9_223_372_036_854_775_808.0)),
            field("min", Value::Int(i64::MIN)),
            field("e", Value::Float(1000.0)),
            field("s", Value::Str("é\n".into())),
        ]
    );
    assert_eq!(
        got[1].1.fields,
        [field("", Value::List(vec![Value::Int(1), Value::Int(2)]))]
    );
    assert_eq!(
        got[2].1.fields,
        [field("", Value::Str("just a string".into()))]
    );
    assert_eq!(got[3].1.fields, [field("", Value::Int(42))]);
    // A repeated key keeps its first place and its last value.
    assert_eq!(
        got[4].1.fields,
        [field("k", Value::Int(3)), field("j", Value::Int(2))]
    );
}

#[test]
fn many_keys_keep_order_and_last_value() {
    use std::fmt::Write as _;

    let mut line = String::from("{");
    for i in 0..40 {
        write!(line, "\"k{}\": {i}, ", 39 - i).unwrap();
    }
    line.push_str("\"k5\": -1, \"k39\": -2, \"new\": 0}\n");
    let file = shard(line.as_bytes());
    let (got, end) = read(file.path(), 0, 1);
    end.unwrap();
    let fields = &ok_samples(got)[0].1.fields;
    assert_eq!(fields.len(), 41);
    assert_eq!(fields[0], field("k39", Value::Int(-2)));
    assert_eq!(fields[34], field("k5", Value::Int(-1)));
    assert_eq!(fields[40], field("new", Value::Int(0)));
}

#[test]
fn malformed_lines_are_per_sample_errors() {
    let file = shard(b"{\"a\": 1}\n{\"a\": \n\n[1, 2] 3\n{\"a\": \"\xff\"}\n{\"a\": 5}\n");
    assert_eq!(samples_in(file.path()), 5);
    let (got, end) = read(file.path(), 0, 5);
    end.unwrap();
    assert_eq!(got.len(), 5);
    assert_eq!(got[0].1.as_ref().unwrap().key, "line 1");
    for (i, (n, line)) in [(1, 2), (2, 4), (3, 5)].into_iter().enumerate() {
        assert_eq!(got[n].0, n as u64);
        match &got[n].1 {
            Err(ShardError::Corrupt { shard, at, message }) => {
                assert_eq!(shard, file.path());
                assert_eq!(*at, format!("line {line}"));
                match i {
                    0 => assert!(
                        message.contains("EOF while parsing a value at column 6"),
                        "{message}"
                    ),
                    1 => assert!(message.contains("trailing characters"), "{message}"),
                    _ => assert!(message.contains("UTF-8"), "{message}"),
                }
                assert!(!message.contains("line 1"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
    // Reading goes on after the bad lines.
    let last = got[4].1.as_ref().unwrap();
    assert_eq!(last.key, "line 6");
    assert_eq!(last.fields, [field("a", Value::Int(5))]);
    // The numbering of a range does not depend on where it starts.
    let (got, end) = read(file.path(), 2, 4);
    end.unwrap();
    assert_eq!(got.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [2, 3]);
    assert!(matches!(&got[0].1, Err(ShardError::Corrupt { at, .. }) if at == "line 4"));
}

#[test]
fn deep_nesting_is_a_sample_error_not_a_crash() {
    let mut text = "[".repeat(100_000);
    text.push_str("\n{\"ok\": true}\n");
    let file = shard(text.as_bytes());
    let (got, end) = read(file.path(), 0, 2);
    end.unwrap();
    assert!(
        matches!(&got[0].1, Err(ShardError::Corrupt { at, message, .. })
            if at == "line 1" && message.contains("recursion limit")),
        "{:?}",
        got[0].1
    );
    assert_eq!(
        got[1].1.as_ref().unwrap().get("ok"),
        Some(&Value::Bool(true))
    );
}

#[test]
fn gzip_and_zstd_read_as_plain() {
    let plain = shard(TEXT);
    let want = read_ok(plain.path(), 0, 5);
    // Two gzip members and two zstd frames, as concatenating tools write.
    let cut = TEXT.len() / 2;
    let mut gz = gzip(&TEXT[..cut]);
    gz.extend(gzip(&TEXT[cut..]));
    let mut zst = zstd(&TEXT[..cut]);
    zst.extend(zstd(&TEXT[cut..]));
    for bytes in [gzip(TEXT), gz, zstd(TEXT), zst] {
        let file = shard(&bytes);
        assert_eq!(samples_in(file.path()), 5);
        assert_eq!(read_ok(file.path(), 0, 5), want);
        assert_eq!(read_ok(file.path(), 2, 4), want[2..4]);
    }
}

/// Many lines, so that a stream broken half-way is broken after some of
/// them were delivered.
fn long_text() -> Vec<u8> {
    let mut text = Vec::new();
    for i in 0..20_000 {
        writeln!(text, "{{\"i\": {i}, \"pad\": \"{:x}\"}}", i * 7919).unwrap();
    }
    text
}

/// Checks that `path` fails to count and read with an error of `codec`
/// (the start of the message). With `whole`, checks that every sample
/// delivered before the break is the one written (not so for corrupt
/// data, which may decompress into garbage before it is found out).
fn expect_stream_error(path: &Path, codec: &str, whole: bool) {
    let err = JsonLinesFormat.count(&Shard::file(path)).unwrap_err();
    assert!(
        matches!(&err, ShardError::Corrupt { message, .. } if message.starts_with(codec)),
        "{err:?}"
    );
    let (got, end) = read(path, 0, 20_000);
    for (i, (n, sample)) in got.iter().enumerate() {
        assert_eq!(*n, i as u64);
        if whole {
            let sample = sample.as_ref().unwrap();
            assert_eq!(
                sample.get("i"),
                Some(&Value::Int(i64::try_from(i).unwrap()))
            );
        }
    }
    assert!(got.len() < 20_000);
    match end {
        Err(ShardError::Corrupt { shard, at, message }) => {
            assert_eq!(shard, path);
            assert!(message.starts_with(codec), "{message}");
            let line: u64 = at.strip_prefix("line ").unwrap().parse().unwrap();
            assert!(
                line >= got.len() as u64 && line <= got.len() as u64 + 1,
                "{at}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn corrupt_or_truncated_streams_end_the_read() {
    let text = long_text();
    let gz = gzip(&text);
    let zst = zstd_checked(&text);

    let file = shard(&gz[..gz.len() * 2 / 3]);
    expect_stream_error(file.path(), "gzip stream ends early", true);
    let file = shard(&zst[..zst.len() * 2 / 3]);
    expect_stream_error(file.path(), "zstd stream ends early", true);

    for (bytes, codec) in [(gz, "gzip stream"), (zst, "zstd stream")] {
        let mut bad = bytes.clone();
        let mid = bad.len() / 2;
        for b in &mut bad[mid..mid + 64] {
            *b = !*b;
        }
        let file = shard(&bad);
        expect_stream_error(file.path(), codec, false);
    }
}

#[test]
fn a_shard_in_memory_reads_as_its_file_plain_gzip_and_zstd() {
    let text = long_text();
    let mut with_errors = TEXT.to_vec();
    with_errors.extend_from_slice(b"\n{\"a\": \n[1] 2\n{\"b\": \"\xff\"}\n{\"c\": 3}\n");
    for plain in [&with_errors[..], &text[..]] {
        for data in [plain.to_vec(), gzip(plain), zstd(plain)] {
            let file = shard(&data);
            let memory = Shard::memory(file.path(), data.clone());
            let lines = JsonLinesFormat.count(&memory).unwrap().samples;
            assert!(lines == 9 || lines == 20_000, "{lines}");
            let (got, end) = read_shard(&memory, 0, lines);
            end.unwrap();
            assert_eq!(got.len() as u64, lines);
            for (lo, hi) in [(0, lines), (0, 1), (4, 8), (lines - 1, lines + 2)] {
                assert_eq!(
                    outcome(&memory, lo, hi),
                    outcome(&Shard::file(file.path()), lo, hi),
                    "{lo}..{hi}"
                );
            }
        }
    }
    // Broken streams break the same way.
    let gz = gzip(&text);
    let zst = zstd_checked(&text);
    let mut bad = zst.clone();
    let mid = bad.len() / 2;
    for b in &mut bad[mid..mid + 64] {
        *b = !*b;
    }
    for data in [
        gz[..gz.len() / 2].to_vec(),
        zst[..zst.len() / 3].to_vec(),
        bad,
    ] {
        let file = shard(&data);
        let memory = Shard::memory(file.path(), data);
        let from_memory = outcome(&memory, 0, 20_000);
        assert!(from_memory.contains("stream"), "{from_memory}");
        assert_eq!(from_memory, outcome(&Shard::file(file.path()), 0, 20_000));
    }
}

#[test]
fn a_shard_in_memory_without_its_start_is_an_io_error() {
    let text = long_text();
    let name = Path::new("gs://bucket/shard.jsonl.gz");
    let gz = gzip(&text);
    let tail = Shard::tail(name, gz[100..].to_vec(), gz.len() as u64);
    assert_not_fetched(JsonLinesFormat.count(&tail), name);
    // Its start only: the lines past it are not fetched, not cut.
    let head = Shard {
        name: name.to_path_buf(),
        data: super::super::ShardData::Memory {
            bytes: bytes::Bytes::from(gz[..gz.len() / 2].to_vec()),
            offset: 0,
            len: gz.len() as u64,
        },
    };
    let (got, end) = read_shard(&head, 0, 20_000);
    assert!(!got.is_empty() && got.len() < 20_000, "{}", got.len());
    assert_not_fetched(end, name);
}

#[test]
fn missing_shard_is_io() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.jsonl");
    assert!(matches!(
        JsonLinesFormat.count(&Shard::file(&path)),
        Err(ShardError::Io { shard, .. }) if shard == path
    ));
    assert!(matches!(read(&path, 0, 1).1, Err(ShardError::Io { .. })));
}
