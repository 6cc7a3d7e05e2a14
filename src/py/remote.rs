//! The Python face of remote shards ([`crate::remote`]).
//!
//! - `_core._RemoteShards`: a source's remote shards, with their prefetch
//!   and cache; `_core._ShardReader` reads through it.
//! - `_core._remote_objects`: the objects URLs and globs name (one listing
//!   per directory, one HEAD per plain URL); `_core._remote_defaults`: a
//!   source's remote defaults.
//! - `_core._remote_get`: one small object whole (a dataset's index).
//! - `_core._remote_stats`: the process's counters.
//!
//! Every call that waits on the network releases the GIL.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::remote::store::{client, retry_config, runtime, store_environment};
use crate::remote::{list, stats, Object, ObjectUrl, RemoteError, RemoteOptions, RemoteShards};

use super::convert::fields_dict;
use super::errors::remote_error;

/// `(url, size, etag)` of an object, as Python sees it.
type Listed = (String, u64, Option<String>);

fn listed(o: &Object) -> Listed {
    (o.url.url.clone(), o.size, o.etag.clone())
}

/// Sorted storage options, so that equal options share a client.
fn sorted(mut options: Vec<(String, String)>) -> Vec<(String, String)> {
    options.sort();
    options
}

/// A source's remote shards.
#[pyclass(name = "_RemoteShards", module = "ferrofeed._core", frozen)]
pub(crate) struct PyRemoteShards {
    pub(crate) inner: Arc<RemoteShards>,
}

#[pymethods]
impl PyRemoteShards {
    #[new]
    #[allow(clippy::too_many_arguments)] // the source's options, as Python passes them
    #[pyo3(signature = (objects, storage_options, prefetch_bytes, part_size, concurrency, cache_dir=None, cache_limit=0))]
    fn new(
        py: Python<'_>,
        objects: Vec<Listed>,
        storage_options: Vec<(String, String)>,
        prefetch_bytes: u64,
        part_size: u64,
        concurrency: usize,
        cache_dir: Option<PathBuf>,
        cache_limit: u64,
    ) -> PyResult<Self> {
        if part_size == 0 || concurrency == 0 {
            return Err(PyValueError::new_err(
                "part_size and concurrency must be at least 1",
            ));
        }
        let mut parsed = Vec::with_capacity(objects.len());
        for (url, size, etag) in objects {
            let url = ObjectUrl::parse(&url).map_err(|e| remote_error(py, &e))?;
            parsed.push(Object { url, size, etag });
        }
        let options = RemoteOptions {
            storage: sorted(storage_options),
            prefetch_bytes,
            part_size,
            concurrency,
            cache: cache_dir.map(|d| (d, cache_limit)),
        };
        let inner = py
            .detach(|| RemoteShards::new(parsed, options))
            .map_err(|e| remote_error(py, &e))?;
        Ok(Self { inner })
    }

    /// Sets the shards (by index) the reader will want next, in order, and
    /// starts fetching ahead; `append` adds them after those queued.
    #[pyo3(signature = (order, append=false))]
    fn prefetch(&self, py: Python<'_>, order: Vec<usize>, append: bool) -> PyResult<()> {
        let inner = Arc::clone(&self.inner);
        py.detach(move || inner.prefetch(&order, append))
            .map_err(|e| remote_error(py, &e))
    }

    /// `(url, size, etag)` of every shard.
    #[getter]
    fn objects(&self) -> Vec<Listed> {
        self.inner.objects().iter().map(listed).collect()
    }
}

/// The objects `patterns` name, in order, as `(url, size, etag)`: one
/// listing per directory of the globs, one HEAD per other URL (see
/// [`crate::remote::list`]).
#[pyfunction]
#[pyo3(name = "_remote_objects")]
#[allow(clippy::needless_pass_by_value)] // pyo3 extracts arguments by value
fn remote_objects(
    py: Python<'_>,
    patterns: Vec<String>,
    storage_options: Vec<(String, String)>,
) -> PyResult<Vec<Listed>> {
    let options = sorted(storage_options);
    let result = py.detach(|| -> Result<Vec<Object>, RemoteError> {
        let Some(first) = patterns.first() else {
            return Ok(Vec::new());
        };
        runtime(first)?.block_on(list::objects(&patterns, &options))
    });
    match result {
        Ok(objects) => Ok(objects.iter().map(listed).collect()),
        Err(e) => Err(remote_error(py, &e)),
    }
}

/// The remote defaults of a source: `prefetch_bytes`, `part_size` (bytes
/// of one ranged GET) and `concurrency` (requests in flight), as
/// `RemoteOptions::default()` has them.
#[pyfunction]
#[pyo3(name = "_remote_defaults")]
fn remote_defaults() -> (u64, u64, usize) {
    let d = RemoteOptions::default();
    (d.prefetch_bytes, d.part_size, d.concurrency)
}

/// The bytes of the object `url`, whole (one HEAD, then ranged GETs of 8
/// MiB, or one GET from a server without ranges), retried as shards are.
#[pyfunction]
#[pyo3(name = "_remote_get")]
fn remote_get<'py>(
    py: Python<'py>,
    url: &str,
    storage_options: Vec<(String, String)>,
) -> PyResult<Bound<'py, PyBytes>> {
    let options = sorted(storage_options);
    let result = py.detach(|| -> Result<bytes::Bytes, RemoteError> {
        let parsed = ObjectUrl::parse(url)?;
        let runtime = runtime(url)?;
        let store = client(&parsed, &options)?;
        let retry = retry_config(url, &options)?;
        runtime.block_on(async {
            let object = Object::head(&*store, parsed).await?;
            let requests = tokio::sync::Semaphore::new(4);
            object
                .get(
                    &*store,
                    0..object.size,
                    RemoteOptions::default().part_size,
                    &requests,
                    &retry,
                )
                .await
        })
    });
    match result {
        Ok(bytes) => Ok(PyBytes::new(py, &bytes)),
        Err(e) => Err(remote_error(py, &e)),
    }
}

/// The variables of the environment that locate `url`'s store (its
/// endpoint, region, account; no secrets), as `(env:NAME, value)`: what
/// keys the process's clients, and a node's index of a source.
#[pyfunction]
#[pyo3(name = "_remote_environment")]
fn remote_environment(py: Python<'_>, url: &str) -> PyResult<Vec<(String, String)>> {
    let url = ObjectUrl::parse_prefix(url).map_err(|e| remote_error(py, &e))?;
    Ok(store_environment(url.scheme))
}

/// This process's counters of remote reads: `requests`, `retries`, `bytes`
/// (received), `fetched` (shards), `cache_hits` (shards), `wait_s` (time
/// readers waited for a shard's bytes).
#[pyfunction]
#[pyo3(name = "_remote_stats")]
fn remote_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let s = stats().snapshot();
    let d = fields_dict!(py, s => requests, retries, bytes, fetched, cache_hits);
    #[allow(clippy::cast_precision_loss)] // nanoseconds to seconds
    d.set_item("wait_s", s.wait_ns as f64 / 1e9)?;
    Ok(d)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyRemoteShards>()?;
    m.add_function(wrap_pyfunction!(remote_objects, m)?)?;
    m.add_function(wrap_pyfunction!(remote_defaults, m)?)?;
    m.add_function(wrap_pyfunction!(remote_get, m)?)?;
    m.add_function(wrap_pyfunction!(remote_stats, m)?)?;
    m.add_function(wrap_pyfunction!(remote_environment, m)?)?;
    Ok(())
}
