//! Samples of sharded sources as Python objects: a [`Value`] as its Python
//! value, and a tar sample as a dict in the `WebDataset` layout, its fields
//! decoded as webdataset's default decoder does.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList};

use crate::shards::{Sample, Value};

use super::errors::{shard_exception, ShardClass};

/// A [`Value`] as Python objects: JSON text parsed by Python's `json.loads`,
/// an array as a (writable) numpy array.
pub(super) fn to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::UInt(u) => u.into_pyobject(py)?.into_any(),
        Value::Json(text) => json_loads(py, text)?,
        Value::Array(a) => {
            static FROMBUFFER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
            let values = PyByteArray::new(py, &a.data);
            let flat = FROMBUFFER
                .import(py, "numpy", "frombuffer")?
                .call1((values, a.dtype))?;
            flat.call_method1("reshape", (a.shape.clone(),))?
        }
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::Int(i) => i.into_pyobject(py)?.into_any(),
        Value::Float(f) => f.into_pyobject(py)?.into_any(),
        Value::Str(s) => s.into_pyobject(py)?.into_any(),
        Value::Bytes(b) => PyBytes::new(py, b).into_any(),
        // Read now: the bytes were left in the shard's file for the native chain.
        Value::Located(at) => PyBytes::new(py, &py.detach(|| at.read())?).into_any(),
        Value::List(items) => {
            let l = PyList::empty(py);
            for item in items {
                l.append(to_py(py, item)?)?;
            }
            l.into_any()
        }
        Value::Map(fields) => {
            let d = PyDict::new(py);
            for (k, v) in fields {
                d.set_item(k, to_py(py, v)?)?;
            }
            d.into_any()
        }
    })
}

/// How a tar member's bytes are decoded, by the last part of its field name
/// (`seg.json` decodes as `json`), as webdataset's default decoder does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decode {
    /// `txt`, `text`: `str` (UTF-8).
    Text,
    /// `cls`, `cls2`, `index`, `inx`, `id`: `int`, as Python's `int()` reads
    /// the bytes (surrounding whitespace allowed, any size).
    Int,
    /// `json`, `jsn`: Python's `json.loads` (key order, float round trips,
    /// `NaN`/`Infinity` and integers of any size as Python has them).
    Json,
    /// Anything else: `bytes`, unchanged (never unpickled or loaded: a
    /// shard's content is data, not code).
    Bytes,
}

impl Decode {
    fn of(field: &str) -> Self {
        match field.rsplit('.').next().unwrap_or(field) {
            "txt" | "text" => Self::Text,
            "cls" | "cls2" | "index" | "inx" | "id" => Self::Int,
            "json" | "jsn" => Self::Json,
            _ => Self::Bytes,
        }
    }
}

/// A tar sample in the `WebDataset` layout: `__key__`, `__shard__`, and one
/// entry per field, decoded by [`Decode`] (or, with `decode` false, every
/// field as its member's `bytes`).
///
/// # Errors
///
/// A field that does not decode is a `ShardCorruptError` at the member,
/// naming the shard.
pub(super) fn tar_sample<'py>(
    py: Python<'py>,
    sample: &Sample,
    shard: &str,
    decode: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let d = PyDict::new(py);
    d.set_item("__key__", &sample.key)?;
    d.set_item("__shard__", shard)?;
    for (field, v) in &sample.fields {
        let Value::Bytes(bytes) = v else {
            d.set_item(field, to_py(py, v)?)?;
            continue;
        };
        let how = if decode {
            Decode::of(field)
        } else {
            Decode::Bytes
        };
        let bad = |what: String| {
            let at = format!("member {}.{field}", sample.key);
            shard_exception(
                py,
                ShardClass::Corrupt,
                &format!("{shard}: {at}: {what}"),
                shard,
                Some(&at),
            )
        };
        let value = match how {
            Decode::Bytes => PyBytes::new(py, bytes).into_any(),
            Decode::Text => std::str::from_utf8(bytes)
                .map_err(|e| bad(format!("not UTF-8 text ({e})")))?
                .into_pyobject(py)?
                .into_any(),
            Decode::Int => {
                static INT: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
                INT.import(py, "builtins", "int")?
                    .call1((PyBytes::new(py, bytes),))
                    .map_err(|_| bad(format!("not an integer: {}", excerpt(bytes))))?
            }
            Decode::Json => {
                json_loads(py, bytes).map_err(|e| bad(format!("not JSON: {}", e.value(py))))?
            }
        };
        d.set_item(field, value)?;
    }
    Ok(d.into_any())
}

/// `json.loads(text)`.
fn json_loads<'py>(py: Python<'py>, text: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    static LOADS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    LOADS
        .import(py, "json", "loads")?
        .call1((PyBytes::new(py, text),))
}

/// The start of `bytes`, for a message: at most 40 bytes, escaped as Python
/// shows `bytes`.
fn excerpt(bytes: &[u8]) -> String {
    let head = &bytes[..bytes.len().min(40)];
    let more = if bytes.len() > head.len() { "..." } else { "" };
    format!("b\"{}\"{more}", head.escape_ascii())
}
