//! JSON lines shards: one JSON value per line.
//!
//! A shard is plain text, or gzip or zstd compressed text, told apart by the
//! file's first bytes (gzip `1f 8b`, zstd `28 b5 2f fd`), not by its name, and
//! decompressed on the fly: a shard file is never held in memory whole (a
//! shard in memory, [`Shard::memory`], is read the same way).
//!
//! - **Samples.** Every line that holds something other than JSON whitespace
//!   (space, tab, CR, LF) is one sample; blank lines are skipped and not
//!   counted. Lines end at LF; a CR before it is whitespace to JSON.
//! - **Keys.** A sample's key is `"line N"`, N the 1-based physical line
//!   number in the (decompressed) file, blank lines included, so the line can
//!   be found in an editor.
//! - **Fields.** A line holding an object gives its top-level keys, in the
//!   order they are written, as the sample's fields (a key written twice keeps
//!   its first place and its last value, as Python's `json` does). Any other
//!   value is one field named `""`.
//! - **Values.** `null`, booleans, strings, arrays and objects map onto
//!   [`Value`] as their names say (objects keep their key order). An integer
//!   is [`Value::Int`] when it fits an `i64`; one that does not (above
//!   `i64::MAX` or below `i64::MIN`) is [`Value::Float`], rounded to the
//!   nearest `f64`, as `serde_json` reads it. A number with a fraction or an
//!   exponent is [`Value::Float`].
//!
//! # Errors
//!
//! A line that is not valid UTF-8 or not one JSON value is that sample's
//! [`ShardError::Corrupt`] at `"line N"`, and reading goes on with the next
//! line. A gzip or zstd stream that cannot be decompressed (corrupt or
//! truncated) ends [`ShardFormat::read`] (and fails [`ShardFormat::count`])
//! with [`ShardError::Corrupt`] at the line being read when it broke.
//! [`ShardFormat::count`] does not parse JSON: a malformed line counts as a
//! sample (it is one, whose read gives an error).

use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufRead, BufReader};
use std::path::Path;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use super::{not_fetched, Each, Sample, Shard, ShardError, ShardFormat, ShardInfo, Value};

/// Buffer size for reading a shard and its decompressed text.
const BUFFER: usize = 64 * 1024;

/// The JSON lines reader (`.jsonl`, `.jsonl.gz`, `.jsonl.zst`); see the
/// [module docs](self) for the layout and the values.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonLinesFormat;

/// How a shard file is compressed, from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Codec {
    /// Not compressed (or compressed in a way not recognised).
    Plain,
    /// gzip (`1f 8b`), one member or several concatenated.
    Gzip,
    /// zstd (`28 b5 2f fd`), one frame or several.
    Zstd,
    /// A compression recognised but not read: bzip2 (`BZh`), xz (`fd 37 7a
    /// 58 5a 00`). Its name.
    Unsupported(&'static str),
}

impl Codec {
    /// The codec's name, for messages.
    pub(super) fn name(self) -> &'static str {
        match self {
            Codec::Plain => "file",
            Codec::Gzip => "gzip stream",
            Codec::Zstd => "zstd stream",
            Codec::Unsupported(name) => name,
        }
    }

    /// The error of a shard compressed with an [`Codec::Unsupported`] codec.
    pub(super) fn refused(shard: &Path, name: &str) -> ShardError {
        ShardError::corrupt(
            shard,
            "start of file",
            format!(
                "{name}-compressed: not read (compress shards with gzip or zstd, or leave them \
                 plain)"
            ),
        )
    }
}

/// Tells the codec of the stream `reader` is at the start of, from its first
/// bytes, without consuming them.
///
/// # Errors
///
/// The error of the first read.
pub(super) fn sniff(reader: &mut impl BufRead) -> io::Result<Codec> {
    let head = loop {
        match reader.fill_buf() {
            Ok(head) => break head,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    };
    Ok(if head.starts_with(&[0x1f, 0x8b]) {
        Codec::Gzip
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Codec::Zstd
    } else if head.len() >= 4 && head.starts_with(b"BZh") && (b'1'..=b'9').contains(&head[3]) {
        Codec::Unsupported("bzip2")
    } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0x00]) {
        Codec::Unsupported("xz")
    } else {
        Codec::Plain
    })
}

/// Opens `shard` as decompressed text.
fn open(shard: &Shard) -> Result<(Codec, Box<dyn BufRead>), ShardError> {
    let reader = shard.open()?;
    let mut reader = BufReader::with_capacity(BUFFER, reader);
    let shard = shard.name.as_path();
    let codec = sniff(&mut reader).map_err(|e| ShardError::io(shard, e))?;
    let text: Box<dyn BufRead> = match codec {
        Codec::Plain => Box::new(reader),
        Codec::Gzip => Box::new(BufReader::with_capacity(
            BUFFER,
            flate2::bufread::MultiGzDecoder::new(reader),
        )),
        Codec::Zstd => Box::new(BufReader::with_capacity(
            BUFFER,
            zstd::stream::read::Decoder::with_buffer(reader)
                .map_err(|e| ShardError::io(shard, e))?,
        )),
        Codec::Unsupported(name) => return Err(Codec::refused(shard, name)),
    };
    Ok((codec, text))
}

/// The error of reading `shard`'s text at physical line `line`: an OS error
/// (or bytes of a shard in memory that were not fetched) is
/// [`ShardError::Io`]; anything else is the decompressor's, so the shard is
/// corrupt there.
fn stream_error(shard: &Path, codec: Codec, line: u64, e: io::Error) -> ShardError {
    if e.raw_os_error().is_some() || not_fetched(&e) {
        ShardError::io(shard, e)
    } else {
        let what = match (e.kind(), codec) {
            (io::ErrorKind::UnexpectedEof, _) => "ends early (truncated?)".to_owned(),
            (_, Codec::Plain) => format!("cannot be read: {e}"),
            _ => format!("cannot be decompressed: {e}"),
        };
        ShardError::corrupt(
            shard,
            format!("line {line}"),
            format!("{} {what}", codec.name()),
        )
    }
}

/// JSON whitespace (RFC 8259): a line of these only is blank.
fn is_blank_byte(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

/// Consumes the next line of `text` (up to and including its LF) without
/// keeping it: `Some(true)` if it is not blank, `Some(false)` if it is,
/// `None` at the end of the text.
fn skip_line(text: &mut dyn BufRead) -> io::Result<Option<bool>> {
    let mut any = false;
    let mut filled = false;
    loop {
        let buf = match text.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok(any.then_some(filled));
        }
        any = true;
        let (used, ended) = match buf.iter().position(|&b| b == b'\n') {
            Some(lf) => (lf + 1, true),
            None => (buf.len(), false),
        };
        if !filled {
            filled = buf[..used].iter().any(|&b| !is_blank_byte(b));
        }
        text.consume(used);
        if ended {
            return Ok(Some(filled));
        }
    }
}

/// Parses physical line `line` of `shard` (its bytes, LF included) into a
/// sample.
fn parse_line(shard: &Path, line: u64, bytes: &[u8]) -> Result<Sample, ShardError> {
    let key = format!("line {line}");
    // Without its LF, so that an error's column is on this line.
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let text = match std::str::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            return Err(ShardError::corrupt(
                shard,
                key,
                format!("not valid UTF-8 (at byte {})", e.valid_up_to() + 1),
            ));
        }
    };
    match serde_json::from_str::<Json>(text) {
        Ok(Json(Value::Map(fields))) => Ok(Sample { key, fields }),
        Ok(Json(value)) => Ok(Sample {
            key,
            fields: vec![(String::new(), value)],
        }),
        Err(e) => {
            // serde_json's message ends with " at line 1 column C": the line
            // is ours (the key), the column is worth keeping.
            let message = e.to_string();
            let message = match message.rfind(" at line ") {
                Some(cut) => format!("{} at column {}", &message[..cut], e.column()),
                None => message,
            };
            Err(ShardError::corrupt(
                shard,
                key,
                format!("not valid JSON: {message}"),
            ))
        }
    }
}

impl ShardFormat for JsonLinesFormat {
    fn count(&self, shard: &Shard) -> Result<ShardInfo, ShardError> {
        let (codec, mut text) = open(shard)?;
        let path = shard.name.as_path();
        let mut samples = 0u64;
        let mut line = 1u64;
        while let Some(filled) =
            skip_line(text.as_mut()).map_err(|e| stream_error(path, codec, line, e))?
        {
            samples += u64::from(filled);
            line += 1;
        }
        Ok(ShardInfo {
            samples,
            first_key: None,
            last_key: None,
            damage: None,
        })
    }

    fn read(&self, shard: &Shard, lo: u64, hi: u64, each: Each<'_>) -> Result<(), ShardError> {
        if lo >= hi {
            return Ok(());
        }
        let (codec, mut text) = open(shard)?;
        let path = shard.name.as_path();
        // `n`: samples (non-blank lines) before `line`, the physical line
        // about to be read.
        let mut n = 0u64;
        let mut line = 1u64;
        let mut bytes = Vec::new();
        while n < hi {
            if n < lo {
                match skip_line(text.as_mut()).map_err(|e| stream_error(path, codec, line, e))? {
                    Some(filled) => n += u64::from(filled),
                    None => break,
                }
            } else {
                bytes.clear();
                let got = text
                    .read_until(b'\n', &mut bytes)
                    .map_err(|e| stream_error(path, codec, line, e))?;
                if got == 0 {
                    break;
                }
                if bytes.iter().all(|&b| is_blank_byte(b)) {
                    line += 1;
                    continue;
                }
                each(n, parse_line(path, line, &bytes));
                n += 1;
            }
            line += 1;
        }
        if n < hi {
            return Err(ShardError::Changed {
                shard: path.to_path_buf(),
                expected: hi,
                found: n,
            });
        }
        Ok(())
    }
}

/// A JSON value read straight into a [`Value`], keeping the key order of
/// objects (`serde_json`'s own map sorts them).
struct Json(Value);

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(JsonVisitor).map(Json)
    }
}

/// Builds a [`Value`] from serde's calls.
struct JsonVisitor;

/// Objects with more keys than this find repeated keys through a hash map
/// rather than by a scan of the keys so far.
const SCAN_KEYS: usize = 16;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(v))
    }

    // An integer above i64::MAX is read as the nearest f64 (documented).
    #[allow(clippy::cast_precision_loss)]
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(i64::try_from(v).map_or(Value::Float(v as f64), Value::Int))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Float(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::Str(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::Str(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Json(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::List(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut fields: Vec<(String, Value)> = Vec::new();
        // Built once the object has more than SCAN_KEYS keys: key -> place.
        let mut places: Option<HashMap<String, usize>> = None;
        while let Some(key) = map.next_key::<String>()? {
            let Json(value) = map.next_value()?;
            let seen = match &places {
                Some(places) => places.get(&key).copied(),
                None => fields.iter().position(|(k, _)| *k == key),
            };
            if let Some(at) = seen {
                fields[at].1 = value;
                continue;
            }
            if let Some(places) = &mut places {
                places.insert(key.clone(), fields.len());
            } else if fields.len() == SCAN_KEYS {
                let mut all: HashMap<String, usize> = fields
                    .iter()
                    .enumerate()
                    .map(|(i, (k, _))| (k.clone(), i))
                    .collect();
                all.insert(key.clone(), fields.len());
                places = Some(all);
            }
            fields.push((key, value));
        }
        Ok(Value::Map(fields))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

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

    type Got = Vec<(u64, Result<Sample, ShardError>)>;

    /// Everything `read(lo, hi)` delivers, and how it ended.
    fn read(path: &Path, lo: u64, hi: u64) -> (Got, Result<(), ShardError>) {
        read_shard(&Shard::file(path), lo, hi)
    }

    fn read_shard(shard: &Shard, lo: u64, hi: u64) -> (Got, Result<(), ShardError>) {
        let mut got = Vec::new();
        let end = JsonLinesFormat.read(shard, lo, hi, &mut |n, s| got.push((n, s)));
        (got, end)
    }

    /// [`crate::shards::outcome`] of this format.
    fn outcome(shard: &Shard, lo: u64, hi: u64) -> String {
        crate::shards::outcome(&JsonLinesFormat, shard, lo, hi)
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
            assert_eq!(
                JsonLinesFormat
                    .count(&Shard::file(file.path()))
                    .unwrap()
                    .samples,
                n
            );
        }
    }

    #[test]
    fn keys_are_physical_line_numbers() {
        let file = shard(TEXT);
        let (got, end) = read(file.path(), 0, 5);
        end.unwrap();
        let got = ok_samples(got);
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
        let (all, end) = read(file.path(), 0, 5);
        end.unwrap();
        let all = ok_samples(all);
        for lo in 0..=5 {
            for hi in lo..=5 {
                let (got, end) = read(file.path(), lo, hi);
                end.unwrap();
                assert_eq!(ok_samples(got), all[lo as usize..hi as usize], "{lo}..{hi}");
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
        let (got, end) = read(file.path(), 0, 5);
        end.unwrap();
        let got = ok_samples(got);
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
        assert_eq!(
            JsonLinesFormat
                .count(&Shard::file(file.path()))
                .unwrap()
                .samples,
            5
        );
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
        let (want, end) = read(plain.path(), 0, 5);
        end.unwrap();
        let want = ok_samples(want);
        // Two gzip members and two zstd frames, as concatenating tools write.
        let cut = TEXT.len() / 2;
        let mut gz = gzip(&TEXT[..cut]);
        gz.extend(gzip(&TEXT[cut..]));
        let mut zst = zstd(&TEXT[..cut]);
        zst.extend(zstd(&TEXT[cut..]));
        for bytes in [gzip(TEXT), gz, zstd(TEXT), zst] {
            let file = shard(&bytes);
            assert_eq!(
                JsonLinesFormat
                    .count(&Shard::file(file.path()))
                    .unwrap()
                    .samples,
                5
            );
            let (got, end) = read(file.path(), 0, 5);
            end.unwrap();
            assert_eq!(ok_samples(got), want);
            let (got, end) = read(file.path(), 2, 4);
            end.unwrap();
            assert_eq!(ok_samples(got), want[2..4]);
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
        match JsonLinesFormat.count(&tail) {
            Err(ShardError::Io { shard, source }) => {
                assert_eq!(shard, name);
                assert!(source.to_string().contains("not fetched"), "{source}");
            }
            other => panic!("{other:?}"),
        }
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
        match end {
            Err(ShardError::Io { shard, source }) => {
                assert_eq!(shard, name);
                assert!(source.to_string().contains("not fetched"), "{source}");
            }
            other => panic!("{other:?}"),
        }
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
}
