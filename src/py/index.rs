//! The Python face of the sample index ([`crate::shards::index`]).
//!
//! - `_core._read_index`: an index file's entries, checked (the format is
//!   read in one place, Rust's).
//! - `_core._write_index`: writes an index into a folder or prefix, whole or
//!   not at all (`crate::pack::dest`).
//! - `_core._scan_shards`: each tar shard of a `_ShardReader` scanned for its
//!   entry (`ferrofeed index`), on a few threads, without the GIL.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::pack::Dest;
use crate::shards::index::{scan_tar, Index, ShardEntry, INDEX_NAME};

use super::errors::{pack_error, shard_error};
use super::shards::PyShardReader;

/// An index entry as Python sees it: `(name, size, etag, mtime_ns, samples,
/// first_key, last_key, offsets, end)`.
type PyEntry = (
    String,
    u64,
    Option<String>,
    Option<i64>,
    u64,
    Option<String>,
    Option<String>,
    Option<Vec<u64>>,
    Option<u64>,
);

fn to_py(e: ShardEntry) -> PyEntry {
    (
        e.name,
        e.size,
        e.etag,
        e.mtime_ns,
        e.samples,
        e.first_key,
        e.last_key,
        e.offsets,
        e.end,
    )
}

/// The entries of an index file's bytes (`what` names it in errors), and
/// whether a pack wrote it.
#[pyfunction]
fn _read_index(data: &[u8], what: &str) -> PyResult<(Vec<PyEntry>, bool)> {
    let index = Index::parse(data, what).map_err(PyValueError::new_err)?;
    let packed = index.pack.is_some();
    Ok((index.shards.into_iter().map(to_py).collect(), packed))
}

/// Writes the index of `entries` into the folder or prefix `dest`; returns
/// its path or URL.
#[pyfunction]
#[pyo3(signature = (dest, entries, storage_options=Vec::new()))]
fn _write_index(
    py: Python<'_>,
    dest: &str,
    entries: Vec<PyEntry>,
    mut storage_options: Vec<(String, String)>,
) -> PyResult<String> {
    let shards: Vec<ShardEntry> = entries
        .into_iter()
        .map(
            |(name, size, etag, mtime_ns, samples, first_key, last_key, offsets, end)| ShardEntry {
                name,
                size,
                etag,
                mtime_ns,
                samples,
                first_key,
                last_key,
                offsets,
                end,
            },
        )
        .collect();
    let bytes = Index { shards, pack: None }.to_bytes();
    // Checked as a reader will check it.
    Index::parse(&bytes, "the index").map_err(PyValueError::new_err)?;
    storage_options.sort();
    py.detach(|| {
        let dest = Dest::open(dest, &storage_options)?;
        dest.write(INDEX_NAME, &bytes)?;
        Ok(dest.url_of(INDEX_NAME))
    })
    .map_err(|e| pack_error(py, &e))
}

/// `(samples, first_key, last_key, offsets, end)` of each tar shard of
/// `reader`, scanned on up to `threads` threads (a remote shard fetched
/// whole); the first error, in shard order, is raised.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn _scan_shards(
    py: Python<'_>,
    reader: &Bound<'_, PyShardReader>,
    threads: usize,
) -> PyResult<
    Vec<(
        u64,
        Option<String>,
        Option<String>,
        Option<Vec<u64>>,
        Option<u64>,
    )>,
> {
    let set = std::sync::Arc::clone(&reader.get().set);
    let results = py.detach(move || set.scan(threads, |_, shard| scan_tar(shard)));
    let mut out = Vec::with_capacity(results.len());
    for r in results {
        let s = r.map_err(|e| shard_error(py, &e))?;
        let (offsets, end) = s.offsets.map_or((None, None), |(o, e)| (Some(o), Some(e)));
        out.push((s.samples, s.first_key, s.last_key, offsets, end));
    }
    Ok(out)
}

/// Adds the index's functions to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_read_index, m)?)?;
    m.add_function(wrap_pyfunction!(_write_index, m)?)?;
    m.add_function(wrap_pyfunction!(_scan_shards, m)?)?;
    Ok(())
}
