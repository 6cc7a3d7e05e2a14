//! `ferrofeed._core.BufferPool`: the Python face of [`crate::staging`], and
//! `empty` / `zeros` on the default pool.

use std::time::{Duration, Instant};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;

use super::convert::fields_dict;
use super::dlpack::{parse_dtype, parse_shape, PyTensor};
use crate::staging::{self, BufferPool, Pinning, PoolConfig, PooledBuffer, StagingError, Tensor};

/// How long one detached wait for a buffer lasts before Ctrl-C is checked.
const WAIT_SLICE: Duration = Duration::from_millis(50);

/// A bounded pool of 64-byte aligned host buffers for tensors.
#[pyclass(name = "BufferPool", module = "ferrofeed._core", frozen)]
pub(crate) struct PyBufferPool {
    pool: BufferPool,
}

fn pinning_from(pinned: Option<bool>) -> Pinning {
    match pinned {
        None => Pinning::Auto,
        Some(true) => Pinning::Required,
        Some(false) => Pinning::Off,
    }
}

fn pinning_to(p: Pinning) -> Option<bool> {
    match p {
        Pinning::Auto => None,
        Pinning::Required => Some(true),
        Pinning::Off => Some(false),
    }
}

/// A buffer of `nbytes` from `pool`, waiting (detached, in short slices
/// that check for Ctrl-C) up to the pool's timeout when it is exhausted.
pub(crate) fn acquire(py: Python<'_>, pool: &BufferPool, nbytes: usize) -> PyResult<PooledBuffer> {
    let timeout = pool.config().timeout;
    let start = Instant::now();
    loop {
        let slice = timeout.map_or(WAIT_SLICE, |t| {
            t.saturating_sub(start.elapsed()).min(WAIT_SLICE)
        });
        match py.detach(|| pool.acquire_timeout(nbytes, Some(slice))) {
            Err(StagingError::Exhausted { max_buffers, .. }) => {
                let waited = start.elapsed();
                if timeout.is_some_and(|t| waited >= t) {
                    return Err(StagingError::Exhausted {
                        max_buffers,
                        waited,
                    }
                    .into());
                }
                py.check_signals()?;
            }
            r => return r.map_err(PyErr::from),
        }
    }
}

/// `empty`/`zeros` on `pool`.
fn new_tensor(
    py: Python<'_>,
    pool: &BufferPool,
    shape: &Bound<'_, PyAny>,
    dtype: &str,
    zero: bool,
) -> PyResult<PyTensor> {
    let shape = parse_shape(shape)?;
    let dtype = parse_dtype(dtype)?;
    let desc = crate::dlpack::TensorDesc::contiguous(&shape, dtype, crate::dlpack::DLDevice::CPU)
        .map_err(StagingError::from)?;
    let mut buffer = acquire(py, pool, desc.nbytes())?;
    if zero {
        if buffer.len() >= 1 << 20 {
            py.detach(|| buffer.fill(0));
        } else {
            buffer.fill(0);
        }
    }
    Ok(PyTensor::new(Tensor::from_buffer(buffer, &shape, dtype)?))
}

fn stats_dict<'py>(py: Python<'py>, pool: &BufferPool) -> PyResult<Bound<'py, PyDict>> {
    let s = pool.stats();
    let d = fields_dict!(py, s => allocated, in_use, idle, bytes, pinned, allocations, reuses,
        releases, evictions);
    Ok(d)
}

#[pymethods]
impl PyBufferPool {
    #[new]
    #[pyo3(signature = (max_buffers=64, *, max_idle=None, pinned=None, timeout=30.0))]
    fn new(
        max_buffers: Option<usize>,
        max_idle: Option<usize>,
        pinned: Option<bool>,
        timeout: Option<f64>,
    ) -> PyResult<Self> {
        let timeout = timeout
            .map(|t| {
                Duration::try_from_secs_f64(t).map_err(|_| {
                    PyValueError::new_err(format!(
                        "timeout must be a non-negative number of seconds or None, not {t}"
                    ))
                })
            })
            .transpose()?;
        let pool = BufferPool::new(PoolConfig {
            max_buffers,
            max_idle,
            timeout,
            pinning: pinning_from(pinned),
        })?;
        Ok(Self { pool })
    }

    /// An uninitialized tensor (a reused buffer keeps its old bytes).
    #[pyo3(signature = (shape, dtype="float32"))]
    fn empty(&self, py: Python<'_>, shape: &Bound<'_, PyAny>, dtype: &str) -> PyResult<PyTensor> {
        new_tensor(py, &self.pool, shape, dtype, false)
    }

    /// A tensor of zeros.
    #[pyo3(signature = (shape, dtype="float32"))]
    fn zeros(&self, py: Python<'_>, shape: &Bound<'_, PyAny>, dtype: &str) -> PyResult<PyTensor> {
        new_tensor(py, &self.pool, shape, dtype, true)
    }

    /// Counters and gauges, as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        stats_dict(py, &self.pool)
    }

    /// Frees every idle buffer.
    fn clear(&self) {
        self.pool.clear();
    }

    #[getter]
    fn max_buffers(&self) -> Option<usize> {
        self.pool.config().max_buffers
    }

    #[getter]
    fn max_idle(&self) -> usize {
        self.pool.config().effective_max_idle()
    }

    #[getter]
    fn timeout(&self) -> Option<f64> {
        self.pool.config().timeout.map(|t| t.as_secs_f64())
    }

    #[getter]
    fn pinned(&self) -> Option<bool> {
        pinning_to(self.pool.config().pinning)
    }

    fn __repr__(&self) -> String {
        let c = self.pool.config();
        let s = self.pool.stats();
        let opt = |v: Option<usize>| v.map_or_else(|| "None".to_owned(), |v| v.to_string());
        format!(
            "ferrofeed.BufferPool(max_buffers={}, max_idle={}, pinned={}, timeout={}) \
             <{} in use, {} idle, {} bytes>",
            opt(c.max_buffers),
            c.effective_max_idle(),
            match c.pinning {
                Pinning::Auto => "None",
                Pinning::Required => "True",
                Pinning::Off => "False",
            },
            c.timeout
                .map_or_else(|| "None".to_owned(), |t| t.as_secs_f64().to_string()),
            s.in_use,
            s.idle,
            s.bytes
        )
    }
}

/// The pool behind `ferrofeed.empty` and `ferrofeed.zeros`: unbounded (so
/// never a wait), 16 idle buffers kept, plain memory (never touches CUDA).
#[pyfunction]
fn default_pool(py: Python<'_>) -> PyResult<Py<PyBufferPool>> {
    static POOL: PyOnceLock<Py<PyBufferPool>> = PyOnceLock::new();
    POOL.get_or_try_init(py, || {
        let pool = BufferPool::new(PoolConfig {
            max_buffers: None,
            max_idle: Some(16),
            timeout: None,
            pinning: Pinning::Off,
        })?;
        Py::new(py, PyBufferPool { pool })
    })
    .map(|p| p.clone_ref(py))
}

pub(crate) fn pool_or_default(
    py: Python<'_>,
    pool: Option<&Bound<'_, PyBufferPool>>,
) -> PyResult<BufferPool> {
    Ok(match pool {
        Some(p) => p.get().pool.clone(),
        None => default_pool(py)?.bind(py).get().pool.clone(),
    })
}

/// An uninitialized tensor from `pool` (default: the default pool).
#[pyfunction]
#[pyo3(signature = (shape, dtype="float32", *, pool=None))]
fn empty(
    py: Python<'_>,
    shape: &Bound<'_, PyAny>,
    dtype: &str,
    pool: Option<&Bound<'_, PyBufferPool>>,
) -> PyResult<PyTensor> {
    new_tensor(py, &pool_or_default(py, pool)?, shape, dtype, false)
}

/// A tensor of zeros from `pool` (default: the default pool).
#[pyfunction]
#[pyo3(signature = (shape, dtype="float32", *, pool=None))]
fn zeros(
    py: Python<'_>,
    shape: &Bound<'_, PyAny>,
    dtype: &str,
    pool: Option<&Bound<'_, PyBufferPool>>,
) -> PyResult<PyTensor> {
    new_tensor(py, &pool_or_default(py, pool)?, shape, dtype, true)
}

/// Whether pinned memory can be allocated in this process; `None` if that
/// is not known yet (nothing has asked for pinned memory, and asking would
/// initialize CUDA).
#[pyfunction]
fn pinned_memory_status() -> (Option<bool>, Option<String>) {
    if !staging::cuda_probed() {
        return (None, None);
    }
    match staging::pinned_status() {
        Ok(()) => (Some(true), None),
        Err(why) => (Some(false), Some(why)),
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyBufferPool>()?;
    m.add_function(wrap_pyfunction!(default_pool, m)?)?;
    m.add_function(wrap_pyfunction!(empty, m)?)?;
    m.add_function(wrap_pyfunction!(zeros, m)?)?;
    m.add_function(wrap_pyfunction!(pinned_memory_status, m)?)?;
    Ok(())
}
