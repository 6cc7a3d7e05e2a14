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

use super::{
    not_fetched, Each, Sample, SampleLayout, Shard, ShardError, ShardFormat, ShardInfo, Value,
};

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

    fn layout(&self) -> SampleLayout {
        SampleLayout::Value
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
mod tests;
