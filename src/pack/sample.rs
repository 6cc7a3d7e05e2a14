//! A sample to pack, and the checks and conversions it goes through before
//! it is written ([`prepare`]).
//!
//! A sample is a key and named fields, as `WebDataset` stores it: `jpg`,
//! `cls`, `json`, `seg.png`. Two names have a role:
//!
//! - **the image**: the first field named `jpg`, `jpeg`, `png`, `webp`,
//!   `bmp` or `image` (any case). In a tar shard it is named by its format,
//!   sniffed from its bytes (`jpg`, `png`, `webp`, `bmp`); in a Parquet
//!   file it is the `image` column. Re-encoding applies to it alone.
//! - **the label**: the field named `cls` or `label`, an integer (or its
//!   decimal text). In a tar shard it is `cls`; in a Parquet file, `label`.
//!
//! Every field whose name ends in an image extension (the image, and
//! fields such as `seg.png`) is checked whole ([`super::check`]); the rest
//! are written as they are.

use std::borrow::Cow;

use super::check::{check_image, extension};
use super::{OnError, PackError, Reencode};

/// A field's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Bytes, written as they are.
    Bytes(Vec<u8>),
    /// Text, written as UTF-8 (a Parquet `STRING` column).
    Text(String),
    /// An integer, written in decimal in a tar member (as webdataset's
    /// encoder writes `str(x)`), as `INT64` in Parquet.
    Int(i64),
    /// A float, written as the shortest decimal that reads back the same
    /// in a tar member, as `DOUBLE` in Parquet.
    Float(f64),
}

impl Value {
    /// The bytes of this value in a tar member.
    pub fn tar_bytes(&self) -> Cow<'_, [u8]> {
        match self {
            Value::Bytes(b) => Cow::Borrowed(b),
            Value::Text(t) => Cow::Borrowed(t.as_bytes()),
            Value::Int(i) => Cow::Owned(i.to_string().into_bytes()),
            Value::Float(f) => Cow::Owned(float_text(*f).into_bytes()),
        }
    }

    /// How many bytes the value takes (what shard sizes are counted in).
    pub fn len(&self) -> usize {
        match self {
            Value::Bytes(b) => b.len(),
            Value::Text(t) => t.len(),
            Value::Int(_) | Value::Float(_) => 8,
        }
    }

    /// Whether the value has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `f` as Python's `repr` writes it for the common values (`1.0`, `0.1`,
/// `nan`, `inf`): Rust's shortest round-trip form, with `.0` added to a
/// whole number.
fn float_text(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    let text = format!("{f}");
    if text.contains(['.', 'e']) {
        text
    } else {
        text + ".0"
    }
}

/// A sample as given: its key (`None`: its position, zero-padded), the
/// path it came from (a file of an image folder), and its fields in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The `WebDataset` key, or `None` for the position in the input.
    pub key: Option<String>,
    /// Where the sample came from (the Parquet image's `path`).
    pub path: Option<String>,
    /// `(name, value)` in the order they are written.
    pub fields: Vec<(String, Value)>,
}

/// A sample checked and ready to write: names normalized, the image
/// checked (and re-encoded, if asked), the label an integer.
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    /// The key.
    pub key: String,
    /// Where the sample came from.
    pub path: Option<String>,
    /// The fields, as a tar shard names them (the image by its format,
    /// the label `cls`).
    pub fields: Vec<(String, Value)>,
    /// Which field is the image, if any.
    pub image: Option<usize>,
    /// Which field is the label, if any.
    pub label: Option<usize>,
}

impl Prepared {
    /// The bytes of the sample's values (what a shard's size counts).
    pub fn data_len(&self) -> u64 {
        self.fields.iter().map(|(_, v)| v.len() as u64).sum()
    }

    /// The label, if the sample has one.
    pub fn label(&self) -> Option<i64> {
        match self.label.map(|i| &self.fields[i].1) {
            Some(Value::Int(i)) => Some(*i),
            _ => None,
        }
    }
}

/// Names of the image field (the first of them a sample has).
const IMAGE_NAMES: [&str; 6] = ["jpg", "jpeg", "png", "webp", "bmp", "image"];
/// Extensions whose fields are checked as images.
const IMAGE_EXTENSIONS: [&str; 5] = ["jpg", "jpeg", "png", "webp", "bmp"];
/// Names of the label field.
const LABEL_NAMES: [&str; 2] = ["cls", "label"];

/// The key of the sample at `position` when it has none: zero-padded to 8
/// digits, so that keys sort as the samples are ordered.
pub fn default_key(position: u64) -> String {
    format!("{position:08}")
}

/// Checks a key: not empty, relative, no `.` or `..` part, no `.` in its
/// last part (`WebDataset` readers split a member's name at the first dot
/// of its base name), not hidden.
fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("the key is empty".into());
    }
    if key.starts_with('/') || key.contains('\0') || key.contains('\\') {
        return Err(format!(
            "the key {key:?} must be a relative path with '/' separators"
        ));
    }
    for part in key.split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return Err(format!("the key {key:?} has an empty, '.' or '..' part"));
        }
    }
    let base = key.rsplit('/').next().unwrap_or(key);
    if base.contains('.') {
        return Err(format!(
            "the key {key:?} has a '.' in its last part, where WebDataset readers split the \
             key from the field name"
        ));
    }
    Ok(())
}

/// Checks a field name: not empty, no `/`, not starting with `.` or `_`
/// (`__key__` and the like are the reader's own).
fn check_field(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.contains(['/', '\0'])
        || name.starts_with('.')
        || name.starts_with('_')
        || name.ends_with('.')
    {
        return Err(format!(
            "the field name {name:?} cannot be a member's extension (empty, with '/', or \
             starting with '.' or '_')"
        ));
    }
    Ok(())
}

/// The label of a `cls`/`label` field: an integer, or its decimal text.
fn label_value(value: &Value) -> Result<i64, String> {
    let text = match value {
        Value::Int(i) => return Ok(*i),
        Value::Text(t) => t.as_str(),
        Value::Bytes(b) => std::str::from_utf8(b).map_err(|_| "the label is not text")?,
        Value::Float(_) => return Err("the label is a float, not an integer".into()),
    };
    text.trim()
        .parse()
        .map_err(|_| format!("the label {text:?} is not an integer"))
}

/// Checks and converts `sample`, the one at `position` of the input, for
/// writing; `reencode` re-encodes its image.
///
/// # Errors
///
/// [`PackError::BadSample`] naming the sample's path (else its key): a bad
/// key or field name, two image or label fields, an image field that is
/// not bytes, not an image or not whole ([`check_image`]), a label that is
/// not an integer, or an image that fails to re-encode.
pub fn prepare(
    sample: Sample,
    position: u64,
    reencode: Option<&Reencode>,
) -> Result<Prepared, PackError> {
    let key = sample.key.unwrap_or_else(|| default_key(position));
    let name = sample.path.clone().unwrap_or_else(|| key.clone());
    let bad = |reason: String| PackError::bad(name.clone(), reason);
    check_key(&key).map_err(&bad)?;
    let mut image = None;
    let mut label = None;
    let mut fields = Vec::with_capacity(sample.fields.len());
    for (field, value) in sample.fields {
        check_field(&field).map_err(&bad)?;
        let lower = field.to_ascii_lowercase();
        if image.is_none() && IMAGE_NAMES.contains(&lower.as_str()) {
            let Value::Bytes(bytes) = value else {
                return Err(bad(format!("the image field {field:?} is not bytes")));
            };
            let (ext, bytes) = if let Some(r) = reencode {
                ("jpg", r.apply(&bytes, &name).map_err(&bad)?)
            } else {
                let info = check_image(&bytes, &name).map_err(&bad)?;
                (extension(info.format), bytes)
            };
            image = Some(fields.len());
            fields.push((ext.to_string(), Value::Bytes(bytes)));
        } else if label.is_none() && LABEL_NAMES.contains(&lower.as_str()) {
            let n = label_value(&value).map_err(&bad)?;
            label = Some(fields.len());
            fields.push(("cls".to_string(), Value::Int(n)));
        } else {
            let last = lower.rsplit('.').next().unwrap_or(&lower);
            if IMAGE_EXTENSIONS.contains(&last) || IMAGE_NAMES.contains(&lower.as_str()) {
                let Value::Bytes(bytes) = &value else {
                    return Err(bad(format!("the image field {field:?} is not bytes")));
                };
                check_image(bytes, &name).map_err(|why| bad(format!("{field}: {why}")))?;
            }
            fields.push((field, value));
        }
    }
    let mut seen = std::collections::HashSet::new();
    for (field, _) in &fields {
        if !seen.insert(field.as_str()) {
            return Err(bad(format!(
                "two fields are named {field:?} (an image is named by its format, a label \
                 'cls')"
            )));
        }
    }
    Ok(Prepared {
        key,
        path: sample.path,
        fields,
        image,
        label,
    })
}

/// What a pack does with a sample that cannot be packed.
pub(crate) fn skippable(on_error: OnError, e: &PackError) -> bool {
    on_error == OnError::Skip && matches!(e, PackError::BadSample { .. })
}

#[cfg(test)]
mod tests;
