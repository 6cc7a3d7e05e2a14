//! `ferrofeed._core.Arena`: the Python face of [`crate::arena`].
//!
//! Items are pickled with protocol 5. An item without out-of-band buffers is
//! stored as its pickle stream (which starts with the PROTO opcode, 0x80).
//! An item with out-of-band buffers (`NumPy` arrays, for instance) is stored
//! as a frame, so that each buffer lands 64-byte aligned in the arena and is
//! handed back on load as a zero-copy, read-only view of the mapping:
//!
//! ```text
//! "FFOB"  u32 count  count × (u64 offset, u64 length)   offsets from the item start
//! entry 0: the pickle stream; entries 1..: the out-of-band buffers, in order
//! ```

use std::ffi::{c_int, c_void};
use std::path::PathBuf;
use std::sync::{Arc, RwLock, RwLockReadGuard};

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyBufferError, PyIndexError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyInt, PyList, PySlice, PyTuple, PyType};

use super::convert::fill_byte_buffer;
use super::errors::{closed_error, corrupt_error};
use crate::arena::format::{align_up, ITEM_ALIGN};
use crate::arena::{sweep_orphans, Arena, ArenaWriter};

/// First bytes of a framed item.
const FRAME_MAGIC: &[u8; 4] = b"FFOB";
/// The pickle PROTO opcode that starts every protocol >= 2 stream.
const PICKLE_PROTO: u8 = 0x80;

fn pickle_fn<'py>(py: Python<'py>, name: &'static str) -> PyResult<&'py Bound<'py, PyAny>> {
    static LOADS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    static DUMPS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let cell = if name == "loads" { &LOADS } else { &DUMPS };
    cell.get_or_try_init(py, || {
        Ok::<_, PyErr>(py.import("pickle")?.getattr(name)?.unbind())
    })
    .map(|f| f.bind(py))
}

/// `view[start:end]`, a new memoryview sharing `view`'s buffer.
///
/// Not `PySlice::new` + `get_item`: pyo3 0.30.1's `PySlice::new` leaks the
/// three ints it builds (`PySlice_New` takes its own references to them), a
/// few dozen bytes per call, which on an arena read item by item is a leak
/// of the order of the arena's size per pass.
fn view_slice<'py>(
    view: &Bound<'py, PyAny>,
    start: usize,
    end: usize,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: `view` is a valid object for the duration of the call;
    // PySequence_GetSlice returns a new reference or null with an exception
    // set, which `from_owned_ptr_or_err` turns into an Err.
    unsafe {
        Bound::from_owned_ptr_or_err(
            view.py(),
            ffi::PySequence_GetSlice(
                view.as_ptr(),
                start as ffi::Py_ssize_t,
                end as ffi::Py_ssize_t,
            ),
        )
    }
}

/// The whole mapping, exported through the buffer protocol (read-only,
/// bytes). Every view of the arena handed to Python is a slice of a
/// `memoryview` of one of these, and each keeps it, and so the mapping,
/// alive: closing the arena never invalidates a view.
#[pyclass(name = "_ArenaBuffer", module = "ferrofeed._core", frozen)]
struct ArenaBuffer {
    arena: Arc<Arena>,
}

#[pymethods]
impl ArenaBuffer {
    /// # Safety
    ///
    /// Called by the interpreter with a valid, writable `view`.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let bytes = slf.get().arena.as_bytes();
        let (buf, len) = (bytes.as_ptr().cast_mut().cast::<c_void>(), bytes.len());
        // SAFETY: the interpreter gives a valid `view`. `buf` points into the
        // read-only mapping, which lives as long as `slf.arena`: `slf` is the
        // owner, so the mapping outlives every use of `buf`.
        unsafe {
            fill_byte_buffer(
                view,
                flags,
                slf.into_any(),
                buf,
                len,
                Some("an arena is read-only"),
            )
        }
    }
}

/// An open arena: the mapping and a memoryview over all of it.
struct Open {
    arena: Arc<Arena>,
    view: Py<PyAny>,
}

/// A memory-mapped arena of pickled items (the engine behind
/// `ferrofeed.SharedList`).
#[pyclass(name = "Arena", module = "ferrofeed._core", frozen, weakref, subclass)]
pub(crate) struct PyArena {
    state: RwLock<Option<Open>>,
    path: String,
    nbytes: u64,
    len: usize,
}

impl PyArena {
    fn wrap(py: Python<'_>, arena: Arena) -> PyResult<Self> {
        let arena = Arc::new(arena);
        let exporter = Bound::new(
            py,
            ArenaBuffer {
                arena: Arc::clone(&arena),
            },
        )?;
        // SAFETY: PyMemoryView_FromObject takes a new buffer export of a
        // valid object and returns a new reference (or null with an error
        // set, which `from_owned_ptr_or_err` turns into a PyErr).
        let view = unsafe {
            Bound::from_owned_ptr_or_err(py, ffi::PyMemoryView_FromObject(exporter.as_ptr()))?
        };
        Ok(Self {
            path: arena.path().display().to_string(),
            nbytes: arena.nbytes(),
            len: arena.len(),
            state: RwLock::new(Some(Open {
                arena,
                view: view.unbind(),
            })),
        })
    }

    /// The open mapping and view, `None` once closed. A poisoned lock is
    /// read as it stands: the state is only ever replaced whole.
    fn state(&self) -> RwLockReadGuard<'_, Option<Open>> {
        self.state
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The mapping and the full view, or `ArenaClosedError`.
    fn open_state(&self, py: Python<'_>) -> PyResult<(Arc<Arena>, Py<PyAny>)> {
        match self.state().as_ref() {
            Some(o) => Ok((Arc::clone(&o.arena), o.view.clone_ref(py))),
            None => Err(closed_error(py, &self.path)),
        }
    }

    fn normalize(&self, index: isize) -> PyResult<usize> {
        let len = self.len as isize;
        let i = if index < 0 { index + len } else { index };
        if i < 0 || i >= len {
            return Err(PyIndexError::new_err(format!(
                "index {index} out of range for an arena of {len} items"
            )));
        }
        Ok(i as usize)
    }

    /// Unpickles item `i`, its out-of-band buffers viewing the mapping.
    fn load_one<'py>(
        &self,
        py: Python<'py>,
        arena: &Arc<Arena>,
        view: &Bound<'py, PyAny>,
        i: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        let span = arena.span(i).expect("index checked against len");
        let bytes = &arena.as_bytes()[span.clone()];
        let slice = |a: usize, b: usize| view_slice(view, span.start + a, span.start + b);
        let loads = pickle_fn(py, "loads")?;
        if bytes.first() == Some(&PICKLE_PROTO) {
            return loads_transient(py, loads, bytes, arena);
        }
        let entries = parse_frame(bytes).ok_or_else(|| {
            corrupt_error(
                py,
                &format!(
                    "item {i} of arena {:?} is neither a pickle stream nor a valid frame",
                    self.path
                ),
            )
        })?;
        let buffers = PyList::empty(py);
        for &(off, len) in &entries[1..] {
            buffers.append(slice(off, off + len)?)?;
        }
        let (off, len) = entries[0];
        let kwargs = PyDict::new(py);
        kwargs.set_item("buffers", buffers)?;
        loads.call((slice(off, off + len)?,), Some(&kwargs))
    }
}

/// `pickle.loads` over a temporary view of `bytes`, which lie in `keep`'s
/// mapping: one allocation instead of a slice of the arena's memoryview
/// (a slice object, two ints and a view), a third of the cost of a small
/// item's load.
fn loads_transient<'py>(
    py: Python<'py>,
    loads: &Bound<'py, PyAny>,
    bytes: &[u8],
    keep: &Arc<Arena>,
) -> PyResult<Bound<'py, PyAny>> {
    let len = ffi::Py_ssize_t::try_from(bytes.len())
        .map_err(|_| PyBufferError::new_err("item too large for a memoryview"))?;
    // SAFETY: PyMemoryView_FromMemory makes a read-only view of `bytes`
    // without owning them (a new reference, or null with an exception set).
    // `bytes` lie in the mapping that `keep` holds alive for this whole call;
    // see below for what happens after it.
    let view = unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            ffi::PyMemoryView_FromMemory(bytes.as_ptr().cast_mut().cast(), len, ffi::PyBUF_READ),
        )?
    };
    // SAFETY: both are valid objects; the variadic argument list ends with
    // a null pointer, and the call returns a new reference or null with an
    // exception set. (`PyObject_CallFunctionObjArgs` passes the argument
    // without building a tuple, unlike a generic call under the limited API.)
    let result = unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            ffi::PyObject_CallFunctionObjArgs(
                loads.as_ptr(),
                view.as_ptr(),
                std::ptr::null_mut::<ffi::PyObject>(),
            ),
        )
    };
    // Our reference is the only one left unless the unpickler kept the view
    // (it never does): then nothing can reach the memory once it is dropped.
    // Otherwise the mapping is made immortal, so the view can never dangle.
    // SAFETY: `view` is a valid object; reading its reference count has no
    // side effect.
    if unsafe { ffi::Py_REFCNT(view.as_ptr()) } != 1 {
        std::mem::forget(Arc::clone(keep));
    }
    result
}

/// Parses a frame's table; `None` when it is malformed or out of bounds.
fn parse_frame(bytes: &[u8]) -> Option<Vec<(usize, usize)>> {
    let rest = bytes.strip_prefix(FRAME_MAGIC)?;
    let count = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
    let table = rest.get(4..4 + count.checked_mul(16)?)?;
    if count == 0 {
        return None;
    }
    table
        .chunks_exact(16)
        .map(|e| {
            let off = usize::try_from(u64::from_le_bytes(e[..8].try_into().ok()?)).ok()?;
            let len = usize::try_from(u64::from_le_bytes(e[8..].try_into().ok()?)).ok()?;
            (off.checked_add(len)? <= bytes.len()).then_some((off, len))
        })
        .collect()
}

/// The frame table for a pickle stream of `lens[0]` bytes and buffers of
/// `lens[1..]` bytes, laid out as `ArenaWriter::push_parts` places parts.
fn frame_table(lens: &[usize]) -> Vec<u8> {
    let count = lens.len();
    let mut table = Vec::with_capacity(8 + 16 * count);
    table.extend_from_slice(FRAME_MAGIC);
    table.extend_from_slice(&(count as u32).to_le_bytes());
    let mut rel = (8 + 16 * count) as u64;
    for &len in lens {
        rel = align_up(rel, ITEM_ALIGN).expect("a frame is far below u64::MAX");
        table.extend_from_slice(&rel.to_le_bytes());
        table.extend_from_slice(&(len as u64).to_le_bytes());
        rel += len as u64;
    }
    table
}

/// Adds a note naming the item to an exception raised while pickling it.
fn note_item(py: Python<'_>, err: PyErr, k: usize) -> PyErr {
    let _ = err.value(py).call_method1(
        "add_note",
        (format!("while pickling item {k} into an arena"),),
    );
    err
}

/// Pickles every item of `items` into `writer` and publishes the arena.
fn build_arena(
    py: Python<'_>,
    mut writer: ArenaWriter,
    items: &Bound<'_, PyAny>,
) -> PyResult<Arena> {
    let dumps = pickle_fn(py, "dumps")?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("protocol", 5)?;
    for (k, obj) in items.try_iter()?.enumerate() {
        let obj = obj?;
        let oob = PyList::empty(py);
        kwargs.set_item("buffer_callback", oob.getattr("append")?)?;
        let payload = dumps
            .call((obj,), Some(&kwargs))
            .map_err(|e| note_item(py, e, k))?;
        let payload = payload.cast::<PyBytes>()?.as_bytes();
        if oob.is_empty() {
            writer.push(payload)?;
            continue;
        }
        let raws = oob
            .iter()
            .map(|pb| PyBuffer::<u8>::get(&pb.call_method0("raw")?))
            .collect::<PyResult<Vec<_>>>()
            .map_err(|e| note_item(py, e, k))?;
        let mut parts: Vec<&[u8]> = Vec::with_capacity(raws.len() + 2);
        let lens: Vec<usize> = std::iter::once(payload.len())
            .chain(raws.iter().map(|r| r.len_bytes()))
            .collect();
        let table = frame_table(&lens);
        parts.push(&table);
        parts.push(payload);
        for raw in &raws {
            // SAFETY: `PickleBuffer.raw()` returns a C-contiguous byte
            // view (it raises for anything else), and `raw` holds that
            // buffer export until the end of this loop iteration, so
            // `buf_ptr()..+len_bytes()` is valid, initialised memory for
            // as long as `parts` is used. We hold the GIL throughout, so
            // no Python code can resize or free the exporter meanwhile.
            parts.push(unsafe {
                std::slice::from_raw_parts(raw.buf_ptr().cast::<u8>(), raw.len_bytes())
            });
        }
        writer.push_parts(&parts)?;
    }
    Ok(py.detach(move || writer.finish())?)
}

/// Where arenas go by default: `$FERROFEED_ARENA_DIR`, else `/dev/shm` when
/// it is a writable directory, else the system's temporary directory.
fn default_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("FERROFEED_ARENA_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() && rustix::fs::access(&shm, rustix::fs::Access::WRITE_OK).is_ok() {
        return shm;
    }
    std::env::temp_dir()
}

/// The directory new arenas go to when no path is given.
#[pyfunction]
fn default_arena_dir() -> PathBuf {
    default_dir()
}

/// A request to map an existing arena, passed to `Arena(...)` by `open`.
#[pyclass(name = "_OpenRequest", module = "ferrofeed._core", frozen)]
struct OpenRequest {
    path: PathBuf,
}

#[pymethods]
impl PyArena {
    /// Builds an arena from `items` (see `ferrofeed.SharedList`), or maps
    /// an existing one when `items` is an `_OpenRequest` (what `open` does).
    #[new]
    #[pyo3(signature = (items, /, *, path=None))]
    fn new(py: Python<'_>, items: &Bound<'_, PyAny>, path: Option<PathBuf>) -> PyResult<Self> {
        if let Ok(req) = items.cast::<OpenRequest>() {
            let path = req.get().path.clone();
            let arena = py.detach(move || Arena::open(path))?;
            return Self::wrap(py, arena);
        }
        let writer = match path {
            None => ArenaWriter::create_in(default_dir())?,
            Some(p) if p.is_dir() => ArenaWriter::create_in(p)?,
            Some(p) => ArenaWriter::create(p)?,
        };
        let arena = build_arena(py, writer, items)?;
        Self::wrap(py, arena)
    }

    /// Maps an existing arena read-only (this process does not own it).
    #[classmethod]
    fn open<'py>(cls: &Bound<'py, PyType>, path: PathBuf) -> PyResult<Bound<'py, PyAny>> {
        let req = Bound::new(cls.py(), OpenRequest { path })?;
        cls.call1((req,))
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        if self.closed() {
            return Err(closed_error(py, &self.path));
        }
        Ok(self.len)
    }

    /// Item `index` (negative counts from the end) unpickled, or a list of
    /// items for a slice.
    fn __getitem__<'py>(
        &self,
        py: Python<'py>,
        index: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (arena, view) = self.open_state(py)?;
        let view = view.bind(py);
        if let Ok(i) = index.cast::<PyInt>() {
            let Ok(i) = i.extract::<isize>() else {
                return Err(PyIndexError::new_err(format!(
                    "index {i} out of range for an arena of {} items",
                    self.len
                )));
            };
            return self.load_one(py, &arena, view, self.normalize(i)?);
        }
        if let Ok(i) = index.call_method0("__index__") {
            return self.__getitem__(py, &i);
        }
        if let Ok(s) = index.cast::<PySlice>() {
            let ind = s.indices(self.len as isize)?;
            let out = PyList::empty(py);
            let mut i = ind.start;
            for _ in 0..ind.slicelength {
                out.append(self.load_one(py, &arena, view, i as usize)?)?;
                i += ind.step;
            }
            return Ok(out.into_any());
        }
        Err(PyTypeError::new_err(format!(
            "arena indices must be integers or slices, not {}",
            index.get_type().name()?
        )))
    }

    /// A zero-copy, read-only memoryview of item `index`'s stored bytes.
    fn raw<'py>(&self, py: Python<'py>, index: isize) -> PyResult<Bound<'py, PyAny>> {
        let (arena, view) = self.open_state(py)?;
        let span = arena
            .span(self.normalize(index)?)
            .expect("index checked against len");
        view_slice(view.bind(py), span.start, span.end)
    }

    /// `(start, end)` of item `index` within `memoryview()`.
    fn span(&self, py: Python<'_>, index: isize) -> PyResult<(usize, usize)> {
        let (arena, _) = self.open_state(py)?;
        let span = arena
            .span(self.normalize(index)?)
            .expect("index checked against len");
        Ok((span.start, span.end))
    }

    /// A read-only memoryview of the whole file.
    fn memoryview(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(self.open_state(py)?.1)
    }

    fn __iter__(slf: Bound<'_, Self>) -> ArenaIter {
        ArenaIter {
            arena: slf.unbind(),
            next: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The file's path.
    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    /// Size of the file in bytes.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.nbytes
    }

    /// Whether this process created the arena (and removes its file).
    #[getter]
    fn owner(&self) -> bool {
        self.state().as_ref().is_some_and(|o| o.arena.is_owner())
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.state().is_none()
    }

    /// The header fields and layout, for inspection.
    fn header<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (arena, _) = self.open_state(py)?;
        let layout = arena.layout();
        let d = PyDict::new(py);
        d.set_item("format_version", crate::arena::format::FORMAT_VERSION)?;
        d.set_item("item_count", layout.item_count)?;
        d.set_item("data_offset", layout.data_offset)?;
        d.set_item("index_offset", layout.index_offset)?;
        d.set_item("file_len", arena.nbytes())?;
        Ok(d)
    }

    /// Unmaps the arena (once every view handed out is gone) and, in the
    /// owning process, removes its file. Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let open = {
            let mut guard = self
                .state
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            guard.take()
        };
        if let Some(open) = open {
            let Open { arena, view } = open;
            drop(view);
            py.detach(|| arena.remove_file())?;
        }
        Ok(())
    }

    /// Removes the file now if this process owns it (and it is still the
    /// file at the path), keeping the mapping: every view and item stays
    /// readable, only new `open`s of the path fail. For the SIGTERM handler
    /// of `SharedList`. Idempotent; a no-op once closed.
    fn _unlink(&self, py: Python<'_>) -> PyResult<()> {
        let arena = self.state().as_ref().map(|o| Arc::clone(&o.arena));
        if let Some(arena) = arena {
            py.detach(|| arena.remove_file())?;
        }
        Ok(())
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let this = slf.get();
        if this.closed() {
            return Err(closed_error(py, &this.path));
        }
        let open = slf.get_type().getattr("open")?;
        PyTuple::new(
            py,
            [open, PyTuple::new(py, [this.path.as_str()])?.into_any()],
        )
    }

    fn __repr__(&self) -> String {
        format!(
            "<ferrofeed._core.Arena {:?}, {} items, {} bytes{}>",
            self.path,
            self.len,
            self.nbytes,
            if self.closed() { ", closed" } else { "" }
        )
    }
}

/// Iterator over an arena's items, unpickled in order.
#[pyclass(module = "ferrofeed._core", frozen)]
struct ArenaIter {
    arena: Py<PyArena>,
    next: std::sync::atomic::AtomicUsize,
}

#[pymethods]
impl ArenaIter {
    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let arena = self.arena.get();
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if i >= arena.len {
            self.next
                .store(arena.len, std::sync::atomic::Ordering::Relaxed);
            return Ok(None);
        }
        let (a, view) = arena.open_state(py)?;
        arena.load_one(py, &a, view.bind(py), i).map(Some)
    }
}

/// Removes the arenas in `dir` that no process holds any more; returns
/// their paths.
#[pyfunction]
fn sweep(py: Python<'_>, dir: PathBuf) -> Vec<String> {
    py.detach(move || {
        sweep_orphans(dir)
            .into_iter()
            .map(|p| p.display().to_string())
            .collect()
    })
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyArena>()?;
    m.add_class::<ArenaBuffer>()?;
    m.add_class::<OpenRequest>()?;
    m.add_function(wrap_pyfunction!(default_arena_dir, m)?)?;
    m.add_function(wrap_pyfunction!(sweep, m)?)?;
    m.add("FORMAT_VERSION", crate::arena::format::FORMAT_VERSION)?;
    Ok(())
}
