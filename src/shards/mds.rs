//! `MosaicML` Streaming's MDS shards (`MDSWriter`'s `shard.NNNNN.mds`), plain
//! or compressed (`.mds.zstd`, `.mds.gz`).
//!
//! A dataset is an `index.json` naming its shards (read by the Python class,
//! `MDSShards`) and the shards themselves. A shard, once decompressed, is:
//!
//! - `u32` (little-endian, as every number here): `n`, its samples;
//! - `n + 1` `u32`: where each sample starts in the shard, and where the
//!   last one ends;
//! - the writer's configuration as JSON: `column_names`, `column_encodings`
//!   and `column_sizes` (`null` for a column whose size varies);
//! - the samples: first a `u32` size for each column of varying size, in
//!   column order, then each column's bytes, in column order.
//!
//! The compression is told from the file's first bytes (zstd, gzip), as for
//! tar shards; a plain shard is read with seeks (its header, then the bytes
//! of `lo..hi`), a compressed one decompressed from its start up to `hi`'s
//! end. Other compressions `MDSWriter` offers (`br`, `bz2`, `snappy`) are
//! refused naming the compression.
//!
//! # Columns
//!
//! Each column is decoded by its encoding, as `streaming`'s own reader
//! decodes it, to a [`Value`]:
//!
//! | encoding | value |
//! |---|---|
//! | `bytes`, `jpeg`, `png` | [`Value::Bytes`]: the stored bytes (an image's encoded file, for the native image chain) |
//! | `str` | [`Value::Str`] (UTF-8) |
//! | `int`, `int8`..`int64`, `uint8`..`uint32` | [`Value::Int`] |
//! | `uint64` | [`Value::UInt`] |
//! | `float16`, `float32`, `float64`, `str_float` | [`Value::Float`] |
//! | `str_int` | [`Value::Int`], or [`Value::Json`] of its digits when it does not fit 64 bits |
//! | `json` | [`Value::Json`]: the text, parsed by the bindings with Python's `json.loads` |
//! | `ndarray[:dtype[:shape]]` | [`Value::Array`] |
//! | `pil` | [`Value::Array`] of the image's pixels (`H x W` or `H x W x C`, as `numpy.asarray(image)` gives them) |
//! | `str_decimal` | [`Value::Str`]: the decimal's text |
//! | `pkl`, `jpeg_array`, `list[...]` | [`Value::Bytes`], never unpickled or split (a shard is data, not code) |
//!
//! # Errors
//!
//! A shard whose header does not check out (too short for its offsets,
//! offsets that run backwards or past its end, a configuration that is not
//! MDS's) is [`ShardError::Corrupt`] at `"header"`: counting fails with it
//! and no sample is read. A sample whose columns do not fit its bytes, or
//! whose `str` is not UTF-8, is that sample's `Err` at `"sample N"`, and
//! reading goes on.

use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use super::jsonl::{sniff, Codec};
use super::{
    not_fetched, Array, Each, Sample, SampleLayout, Shard, ShardError, ShardFormat, ShardInfo,
    Value,
};

/// Buffer for reading a shard's header.
const BUFFER: usize = 64 * 1024;

/// The MDS shard reader; see the [module docs](self).
#[derive(Debug, Clone, Copy, Default)]
pub struct MdsFormat;

impl ShardFormat for MdsFormat {
    fn count(&self, shard: &Shard) -> Result<ShardInfo, ShardError> {
        let mut opened = Opened::new(shard)?;
        let header = opened.header()?;
        Ok(ShardInfo {
            samples: header.samples(),
            ..ShardInfo::default()
        })
    }

    fn layout(&self) -> SampleLayout {
        SampleLayout::Columns
    }

    fn read(&self, shard: &Shard, lo: u64, hi: u64, each: Each<'_>) -> Result<(), ShardError> {
        if lo >= hi {
            return Ok(());
        }
        let mut opened = Opened::new(shard)?;
        let header = opened.header()?;
        if hi > header.samples() {
            return Err(ShardError::Changed {
                shard: shard.name.clone(),
                expected: hi,
                found: header.samples(),
            });
        }
        let (lo_i, hi_i) = (lo as usize, hi as usize);
        let start = u64::from(header.offsets[lo_i]);
        let end = u64::from(header.offsets[hi_i]);
        let bytes = opened.range(start, end)?;
        for k in lo_i..hi_i {
            let a = (u64::from(header.offsets[k]) - start) as usize;
            let b = (u64::from(header.offsets[k + 1]) - start) as usize;
            let sample = header
                .columns
                .decode(&bytes[a..b])
                .map(|fields| Sample {
                    key: format!("sample {k}"),
                    fields,
                })
                .map_err(|why| ShardError::corrupt(&shard.name, format!("sample {k}"), why));
            each(k as u64, sample);
        }
        Ok(())
    }
}

/// A shard opened for reading: its (decompressed) bytes from the start, and
/// how far they have been read.
struct Opened<'s> {
    name: &'s Path,
    codec: Codec,
    reader: Box<dyn Read + 's>,
    /// Seeks for a plain shard (`reader` is then the same file).
    seekable: Option<BufReader<super::ShardReader>>,
    /// Bytes of the decompressed stream read so far.
    pos: u64,
}

impl<'s> Opened<'s> {
    fn new(shard: &'s Shard) -> Result<Self, ShardError> {
        let name = shard.name.as_path();
        let mut reader = BufReader::with_capacity(BUFFER, shard.open()?);
        let codec = sniff(&mut reader).map_err(|e| ShardError::io(name, e))?;
        let (stream, seekable): (Box<dyn Read + 's>, _) = match codec {
            Codec::Plain => (Box::new(io::empty()), Some(reader)),
            Codec::Gzip => (Box::new(flate2::bufread::MultiGzDecoder::new(reader)), None),
            Codec::Zstd => (
                Box::new(
                    zstd::stream::read::Decoder::with_buffer(reader)
                        .map_err(|e| ShardError::io(name, e))?,
                ),
                None,
            ),
            Codec::Unsupported(what) => return Err(Codec::refused(name, what)),
        };
        Ok(Self {
            name,
            codec,
            reader: stream,
            seekable,
            pos: 0,
        })
    }

    /// The next `n` bytes. The buffer grows as they arrive: a header's word
    /// is not trusted with an allocation.
    fn take(&mut self, n: u64, at: &str) -> Result<Vec<u8>, ShardError> {
        let mut out = Vec::with_capacity(usize::try_from(n.min(BUFFER as u64)).unwrap_or(0));
        let result = match &mut self.seekable {
            Some(file) => file.take(n).read_to_end(&mut out),
            None => (&mut self.reader).take(n).read_to_end(&mut out),
        };
        result.map_err(|e| self.error(e, at))?;
        if (out.len() as u64) < n {
            return Err(self.error(io::ErrorKind::UnexpectedEof.into(), at));
        }
        self.pos += n;
        Ok(out)
    }

    /// The error of a read at `at`: an OS error (or bytes not fetched) is
    /// [`ShardError::Io`]; the end of the data or a broken stream, corruption.
    fn error(&self, e: io::Error, at: &str) -> ShardError {
        if e.raw_os_error().is_some() || not_fetched(&e) {
            return ShardError::io(self.name, e);
        }
        let what = match e.kind() {
            io::ErrorKind::UnexpectedEof => format!("the {} ends early", self.codec.name()),
            _ => format!("the {} cannot be read: {e}", self.codec.name()),
        };
        ShardError::corrupt(self.name, at, what)
    }

    /// The shard's header: its offsets and columns.
    fn header(&mut self) -> Result<Header, ShardError> {
        let corrupt = |why: String| ShardError::corrupt(self.name, "header", why);
        let word = self.take(4, "header")?;
        let n = u32::from_le_bytes(word[..].try_into().expect("4 bytes")) as usize;
        let len = self.seekable.as_ref().map(|f| f.get_ref().len());
        let table = (n as u64 + 1) * 4;
        if len.is_some_and(|len| 4 + table > len) {
            return Err(corrupt(format!(
                "{n} samples' offsets do not fit a file of {} bytes",
                len.unwrap_or(0)
            )));
        }
        let raw = self.take(table, "header")?;
        let offsets: Vec<u32> = raw
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes")))
            .collect();
        let config_end = u64::from(offsets[0]);
        if config_end < self.pos || offsets.windows(2).any(|w| w[1] < w[0]) {
            return Err(corrupt("its sample offsets run backwards".into()));
        }
        let last = u64::from(offsets[n]);
        if let Some(len) = len.filter(|&len| last > len) {
            return Err(corrupt(format!(
                "its samples end at byte {last}, past the file's {len}"
            )));
        }
        let config = self.take(config_end - self.pos, "header")?;
        let columns = Columns::parse(&config).map_err(corrupt)?;
        Ok(Header { offsets, columns })
    }

    /// The shard's bytes `start..end` (at or after the header).
    fn range(&mut self, start: u64, end: u64) -> Result<Vec<u8>, ShardError> {
        let at = "samples";
        if let Some(file) = &mut self.seekable {
            file.seek(SeekFrom::Start(start))
                .map_err(|e| ShardError::io(self.name, e))?;
        } else {
            let skip = start - self.pos;
            let skipped = io::copy(&mut (&mut self.reader).take(skip), &mut io::sink())
                .map_err(|e| self.error(e, at))?;
            if skipped < skip {
                return Err(self.error(io::ErrorKind::UnexpectedEof.into(), at));
            }
        }
        self.pos = start;
        self.take(end - start, at)
    }
}

/// A shard's header.
struct Header {
    /// Where each sample starts, and where the last ends (`samples + 1`).
    offsets: Vec<u32>,
    columns: Columns,
}

impl Header {
    fn samples(&self) -> u64 {
        self.offsets.len() as u64 - 1
    }
}

/// A shard's columns: names, how each is decoded, and fixed sizes.
struct Columns {
    names: Vec<String>,
    kinds: Vec<Kind>,
    /// The size of a column of fixed size; `None` when it is stored per
    /// sample.
    sizes: Vec<Option<usize>>,
}

/// The writer's configuration, as far as reading needs it.
#[derive(serde::Deserialize)]
#[allow(clippy::struct_field_names)] // MDS's own keys
struct Config {
    column_names: Vec<String>,
    column_encodings: Vec<String>,
    column_sizes: Vec<Option<u64>>,
}

impl Columns {
    fn parse(text: &[u8]) -> Result<Self, String> {
        let config: Config = serde_json::from_slice(text)
            .map_err(|e| format!("its configuration is not MDS's: {e}"))?;
        let n = config.column_names.len();
        if config.column_encodings.len() != n || config.column_sizes.len() != n {
            return Err(format!(
                "{n} column names, {} encodings and {} sizes",
                config.column_encodings.len(),
                config.column_sizes.len()
            ));
        }
        let kinds = config
            .column_encodings
            .iter()
            .map(|e| Kind::parse(e))
            .collect::<Result<Vec<_>, _>>()?;
        let sizes = config
            .column_sizes
            .iter()
            .map(|s| s.map(|s| usize::try_from(s).unwrap_or(usize::MAX)))
            .collect();
        Ok(Self {
            names: config.column_names,
            kinds,
            sizes,
        })
    }

    /// The fields of one sample's bytes.
    fn decode(&self, bytes: &[u8]) -> Result<Vec<(String, Value)>, String> {
        let varying = self.sizes.iter().filter(|s| s.is_none()).count();
        let head = varying * 4;
        if bytes.len() < head {
            return Err(format!(
                "{} bytes, too few for its {varying} column sizes",
                bytes.len()
            ));
        }
        let mut stored = bytes[..head]
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes")) as usize);
        let mut at = head;
        let mut fields = Vec::with_capacity(self.names.len());
        for ((name, kind), size) in self.names.iter().zip(&self.kinds).zip(&self.sizes) {
            let size = size.unwrap_or_else(|| stored.next().expect("one size per varying column"));
            let Some(data) = at.checked_add(size).and_then(|end| bytes.get(at..end)) else {
                return Err(format!(
                    "column {name:?} ({size} bytes from byte {at}) runs past the sample's {} bytes",
                    bytes.len()
                ));
            };
            at += size;
            let value = kind
                .decode(data)
                .map_err(|why| format!("column {name:?}: {why}"))?;
            fields.push((name.clone(), value));
        }
        Ok(fields)
    }
}

/// A fixed-size number type, as `MDSWriter`'s scalar encodings and numpy
/// dtypes name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scalar {
    U8,
    U16,
    U32,
    U64,
    I8,
    I16,
    I32,
    I64,
    F16,
    F32,
    F64,
}

impl Scalar {
    fn named(name: &str) -> Option<Self> {
        Some(match name {
            "uint8" => Self::U8,
            "uint16" => Self::U16,
            "uint32" => Self::U32,
            "uint64" => Self::U64,
            "int8" => Self::I8,
            "int16" => Self::I16,
            "int32" => Self::I32,
            "int64" => Self::I64,
            "float16" => Self::F16,
            "float32" => Self::F32,
            "float64" => Self::F64,
            _ => return None,
        })
    }

    /// The code `streaming`'s `NDArray` stores for a dtype it does not fix.
    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            8 => Self::U8,
            9 => Self::I8,
            16 => Self::U16,
            17 => Self::I16,
            18 => Self::F16,
            32 => Self::U32,
            33 => Self::I32,
            34 => Self::F32,
            64 => Self::U64,
            65 => Self::I64,
            66 => Self::F64,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Self::U8 => "uint8",
            Self::U16 => "uint16",
            Self::U32 => "uint32",
            Self::U64 => "uint64",
            Self::I8 => "int8",
            Self::I16 => "int16",
            Self::I32 => "int32",
            Self::I64 => "int64",
            Self::F16 => "float16",
            Self::F32 => "float32",
            Self::F64 => "float64",
        }
    }

    fn size(self) -> usize {
        match self {
            Self::U8 | Self::I8 => 1,
            Self::U16 | Self::I16 | Self::F16 => 2,
            Self::U32 | Self::I32 | Self::F32 => 4,
            Self::U64 | Self::I64 | Self::F64 => 8,
        }
    }

    /// The number in `data` (exactly `size()` bytes, little-endian).
    fn value(self, data: &[u8]) -> Value {
        fn le<const N: usize>(data: &[u8]) -> [u8; N] {
            data.try_into().expect("checked against size()")
        }
        match self {
            Self::U8 => Value::Int(i64::from(data[0])),
            Self::U16 => Value::Int(i64::from(u16::from_le_bytes(le(data)))),
            Self::U32 => Value::Int(i64::from(u32::from_le_bytes(le(data)))),
            Self::U64 => {
                let u = u64::from_le_bytes(le(data));
                i64::try_from(u).map_or(Value::UInt(u), Value::Int)
            }
            Self::I8 => Value::Int(i64::from(i8::from_le_bytes(le(data)))),
            Self::I16 => Value::Int(i64::from(i16::from_le_bytes(le(data)))),
            Self::I32 => Value::Int(i64::from(i32::from_le_bytes(le(data)))),
            Self::I64 => Value::Int(i64::from_le_bytes(le(data))),
            Self::F16 => Value::Float(f64::from(half::f16::from_le_bytes(le(data)))),
            Self::F32 => Value::Float(f64::from(f32::from_le_bytes(le(data)))),
            Self::F64 => Value::Float(f64::from_le_bytes(le(data))),
        }
    }
}

/// How a column is decoded (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Bytes,
    Str,
    Scalar(Scalar),
    StrInt,
    StrFloat,
    Json,
    /// `ndarray`, with the dtype and shape the encoding fixes, if any.
    NdArray {
        dtype: Option<Scalar>,
        shape: Option<Vec<usize>>,
    },
    Pil,
}

impl Kind {
    fn parse(encoding: &str) -> Result<Self, String> {
        let (name, config) = encoding.split_once(':').unwrap_or((encoding, ""));
        Ok(match name {
            "bytes" | "jpeg" | "png" | "pkl" | "jpeg_array" | "jpegarray" | "list[pil]"
            | "list[jpeg]" | "list[png]" => Self::Bytes,
            "str" | "str_decimal" => Self::Str,
            "int" => Self::Scalar(Scalar::I64),
            "str_int" => Self::StrInt,
            "str_float" => Self::StrFloat,
            "json" => Self::Json,
            "pil" => Self::Pil,
            "ndarray" => {
                let mut parts = config.split(':').filter(|p| !p.is_empty());
                let dtype = parts
                    .next()
                    .map(|d| Scalar::named(d).ok_or_else(|| format!("ndarray dtype {d:?}")))
                    .transpose()?;
                let shape = parts
                    .next()
                    .map(|s| {
                        s.split(',')
                            .map(|d| d.trim().parse::<usize>())
                            .collect::<Result<Vec<_>, _>>()
                            .map_err(|_| format!("ndarray shape {s:?}"))
                    })
                    .transpose()?;
                Self::NdArray { dtype, shape }
            }
            other => match Scalar::named(other) {
                Some(s) => Self::Scalar(s),
                None => return Err(format!("unknown column encoding {encoding:?}")),
            },
        })
    }

    fn decode(&self, data: &[u8]) -> Result<Value, String> {
        let text = || std::str::from_utf8(data).map_err(|e| format!("not UTF-8 text ({e})"));
        Ok(match self {
            Self::Bytes => Value::Bytes(data.to_vec()),
            Self::Str => Value::Str(text()?.to_owned()),
            Self::Json => Value::Json(data.to_vec()),
            Self::Scalar(s) => {
                if data.len() != s.size() {
                    return Err(format!("{} bytes for a {}", data.len(), s.name()));
                }
                s.value(data)
            }
            Self::StrInt => {
                let t = text()?;
                let digits = t.strip_prefix('-').unwrap_or(t);
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(format!("not an integer: {t:?}"));
                }
                // Beyond 64 bits: JSON's integer, which Python reads whole.
                t.parse()
                    .map_or_else(|_| Value::Json(data.to_vec()), Value::Int)
            }
            Self::StrFloat => {
                let t = text()?;
                Value::Float(t.parse().map_err(|_| format!("not a float: {t:?}"))?)
            }
            Self::NdArray { dtype, shape } => {
                Value::Array(ndarray(data, *dtype, shape.as_deref())?)
            }
            Self::Pil => Value::Array(pil(data)?),
        })
    }
}

/// An `ndarray` column: `[dtype code]` unless fixed, `[ndim << 2 | shape
/// width, shape]` unless fixed, then the values.
fn ndarray(data: &[u8], dtype: Option<Scalar>, shape: Option<&[usize]>) -> Result<Array, String> {
    let mut at = 0;
    let mut byte = || -> Result<u8, String> {
        let b = *data.get(at).ok_or("ends inside its header")?;
        at += 1;
        Ok(b)
    };
    let dtype = if let Some(d) = dtype {
        d
    } else {
        let code = byte()?;
        Scalar::from_code(code).ok_or_else(|| format!("unknown dtype code {code}"))?
    };
    let shape = if let Some(s) = shape {
        s.to_vec()
    } else {
        let b = byte()?;
        let ndim = usize::from(b >> 2);
        let width = 1usize << (b & 3);
        let end = at + ndim * width;
        let dims = data.get(at..end).ok_or("ends inside its shape")?;
        at = end;
        dims.chunks_exact(width)
            .map(|d| {
                let mut w = [0u8; 8];
                w[..width].copy_from_slice(d);
                usize::try_from(u64::from_le_bytes(w)).map_err(|_| "a dimension too large")
            })
            .collect::<Result<Vec<_>, _>>()?
    };
    Array::new(dtype.name(), dtype.size(), shape, &data[at..])
}

/// A `pil` column: `[width u32][height u32][mode length u32][mode][pixels]`,
/// as the array `numpy.asarray` makes of the image.
fn pil(data: &[u8]) -> Result<Array, String> {
    let word = |k: usize| -> Result<usize, String> {
        let w = data.get(4 * k..4 * k + 4).ok_or("ends inside its header")?;
        Ok(u32::from_le_bytes(w.try_into().expect("4 bytes")) as usize)
    };
    let (width, height, mode_len) = (word(0)?, word(1)?, word(2)?);
    let mode = data
        .get(12..12 + mode_len)
        .and_then(|m| std::str::from_utf8(m).ok())
        .ok_or("its mode is cut or not text")?;
    let pixels = &data[12 + mode_len..];
    let (dtype, size, channels) = match mode {
        "L" | "P" => ("uint8", 1, 1),
        "LA" | "PA" => ("uint8", 1, 2),
        "RGB" | "YCbCr" | "LAB" | "HSV" => ("uint8", 1, 3),
        "RGBA" | "RGBX" | "CMYK" | "RGBa" => ("uint8", 1, 4),
        "I" => ("int32", 4, 1),
        "F" => ("float32", 4, 1),
        "I;16" => ("uint16", 2, 1),
        "1" => return bilevel(width, height, pixels),
        other => return Err(format!("PIL mode {other:?} is not read")),
    };
    let shape = if channels == 1 {
        vec![height, width]
    } else {
        vec![height, width, channels]
    };
    Array::new(dtype, size, shape, pixels)
}

/// A PIL mode `"1"` image: rows of bits, 8 pixels a byte (the first in the
/// high bit), each row padded to a byte; `numpy.asarray` gives `bool`s.
fn bilevel(width: usize, height: usize, bits: &[u8]) -> Result<Array, String> {
    let row = width.div_ceil(8);
    if bits.len() != row * height {
        return Err(format!(
            "{} bytes of pixels for a {width} x {height} mode \"1\" image",
            bits.len()
        ));
    }
    let data = (0..height)
        .flat_map(|y| (0..width).map(move |x| (y, x)))
        .map(|(y, x)| (bits[y * row + x / 8] >> (7 - x % 8)) & 1)
        .collect::<Vec<u8>>();
    Array::new("bool", 1, vec![height, width], &data)
}

#[cfg(test)]
mod tests;
