//! Native image ops for pipelines: `read_file`, `decode_image`, `collate`.
//!
//! They work on native [`Item`]s (paths, encoded bytes, decoded images,
//! batches) and never take the GIL; a chain source -> `read_file` ->
//! `decode_image` -> `collate` only meets Python at the sink, where a batch
//! becomes a `ferrofeed.Tensor` (and its labels another).

use std::sync::Arc;

use pyo3::exceptions::{PyOSError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;

use super::cpu::PyLanes;
use super::errors;
use super::pipeline::{Item, OpConfig, PerEpochFn, PyNativeOp};
use super::spec::{PyBatchLayout, PyImageSpec};
use super::staging::PyBufferPool;
use crate::dlpack::DType;
use crate::image::batch::{
    batch_shape, read_file, spawn_batch, write_slot, BatchItem, BatchOptions, Layout, OnError,
    Source, SpawnedOutcome,
};
use crate::image::{decode, ImageError, Transform};
use crate::pipeline::{BoxFuture, CombineFn};
use crate::runtime::cpu::Lanes;
use crate::seed::{crop_seed, hash_bytes};
use crate::staging::{BufferPool, Pinning, PoolConfig, PooledBuffer, Tensor};

/// `ops.read_file()`: a path (with its label) becomes the file's bytes.
#[pyfunction]
fn _op_read_file() -> PyNativeOp {
    PyNativeOp::new(
        "read_file",
        true,
        Arc::new(|item| match item {
            Item::Path { path, label, pos } => {
                let (data, name) = read_path(&path)?;
                Ok(Some(Item::Bytes {
                    data,
                    name,
                    label,
                    pos,
                }))
            }
            other => Err(wrong_item(
                "read_file",
                "paths (str or os.PathLike)",
                &other,
            )),
        }),
    )
}

/// A file's bytes and its name ([`read_file`]), or an `OSError` naming the
/// file.
fn read_path(path: &std::path::Path) -> PyResult<(Vec<u8>, String)> {
    let name = path.display().to_string();
    match read_file(path) {
        Ok(data) => Ok((data, name)),
        Err(ImageError::Io { source: e, .. }) => Err(PyOSError::new_err((
            e.raw_os_error().unwrap_or(0),
            format!("cannot read {name:?}: {e}"),
            name,
        ))),
        Err(other) => Err(other.into()),
    }
}

#[cold]
fn wrong_item(op: &str, wants: &str, item: &Item) -> PyErr {
    PyTypeError::new_err(wrong_item_text(op, wants, item))
}

/// What an op says of an item it does not take.
fn wrong_item_text(op: &str, wants: &str, item: &Item) -> String {
    format!(
        "ops.{op}() takes {wants}, or (item, label) pairs; got {}",
        item.kind()
    )
}

/// `ops.decode_image(...)`: encoded bytes (or a path) become an image, as
/// `spec` says.
#[pyfunction]
#[pyo3(signature = (spec, /, *, seed=None))]
fn _op_decode_image(spec: &PyImageSpec, seed: Option<u64>) -> PyNativeOp {
    let spec = spec.0;
    let base_seed = seed.unwrap_or_else(crate::seed::fresh_seed);
    let config = OpConfig::Decode { spec, seed };
    // In a pipeline of epoch `e`, an item's random crop and flip draw from
    // (seed, e, its position in the source): new ones every epoch, the same
    // ones for the same epoch, whatever the file's folder or the threads'
    // timing. An item without a position (a path inside a group) keys on
    // its name's hash instead. Both are the one rule, `seed::crop_seed`.
    let make: PerEpochFn = Arc::new(move |epoch| {
        Arc::new(move |item| {
            let (data, name, label, pos) = match item {
                Item::Bytes {
                    data,
                    name,
                    label,
                    pos,
                } => (data, name, label, pos),
                Item::Path { path, label, pos } => {
                    let (data, name) = read_path(&path)?;
                    (data, name, label, pos)
                }
                other => return Err(wrong_item("decode_image", "encoded bytes or paths", &other)),
            };
            let index = pos.unwrap_or_else(|| hash_bytes(name.as_bytes()));
            let seed = crop_seed(base_seed, epoch, index);
            let image = decode(&data, &name, &spec.transform(seed))?;
            Ok(Some(Item::Image { image, name, label }))
        })
    });
    PyNativeOp::per_epoch("decode_image", true, make).with_config(config)
}

/// `ops.collate`'s default `max_batches` (its pool holds twice as many buffers).
const COLLATE_MAX_BATCHES: usize = 16;
/// `ops.collate`'s default `timeout`, in seconds.
const COLLATE_TIMEOUT_S: f64 = 60.0;

/// `ops.collate(batch_size, ...)`: groups images into one batch tensor
/// (and their labels into an int64 tensor), from a bounded buffer pool.
/// Without a batch size (group size 0) it only says how to lay a batch out,
/// for a `DataLoader`, which brings its own batch size; a pipeline refuses it.
#[pyfunction]
#[pyo3(signature = (
    batch_size=None, /, *, layout=None, drop_last=false, max_batches=COLLATE_MAX_BATCHES,
    timeout=Some(COLLATE_TIMEOUT_S)
), text_signature = "(batch_size=None, /, *, layout=None, drop_last=False, max_batches=16, \
    timeout=60.0)")]
fn _op_collate(
    batch_size: Option<usize>,
    layout: Option<&PyBatchLayout>,
    drop_last: bool,
    max_batches: usize,
    timeout: Option<f64>,
) -> PyResult<PyNativeOp> {
    if batch_size == Some(0) {
        return Err(PyValueError::new_err("batch_size must be at least 1"));
    }
    let batch_size = batch_size.unwrap_or(0);
    // (Compared by bits: the default is the one float the signature gives.)
    let own_pool = (max_batches != COLLATE_MAX_BATCHES
        || timeout.map(f64::to_bits) != Some(COLLATE_TIMEOUT_S.to_bits()))
    .then_some((max_batches, timeout));
    let timeout = match timeout {
        None => None,
        Some(t) if t.is_finite() && t > 0.0 => Some(std::time::Duration::from_secs_f64(t)),
        Some(t) => {
            return Err(PyValueError::new_err(format!(
                "timeout must be a number of seconds > 0 or None, not {t}"
            )))
        }
    };
    let layout = layout.map_or_else(Layout::default, |l| l.0);
    let pool = BufferPool::new(PoolConfig {
        max_buffers: Some(max_batches.max(2) * 2),
        max_idle: None,
        timeout,
        // Pinning would probe CUDA; a pipeline may be built before a fork.
        pinning: Pinning::Off,
    })
    .map_err(PyErr::from)?;
    let combine: CombineFn<Item, PyErr> =
        Arc::new(move |items: Vec<Item>| collate(&pool, layout, items));
    Ok(
        PyNativeOp::aggregate("collate", batch_size, drop_last, combine)
            .with_config(OpConfig::Collate { layout, own_pool }),
    )
}

#[allow(clippy::many_single_char_names)] // n, h, w, c: the batch's dimensions
fn collate(pool: &BufferPool, layout: Layout, items: Vec<Item>) -> PyResult<Item> {
    let n = items.len();
    let mut images = Vec::with_capacity(n);
    let mut labels = Vec::with_capacity(n);
    for item in items {
        match item {
            Item::Image { image, name, label } => {
                labels.push(label);
                images.push((image, name));
            }
            other => {
                let msg = wrong_item_text("collate", "decoded images (ops.decode_image())", &other);
                return Err(Python::attach(|py| errors::collate_type_error(py, &msg)));
            }
        }
    }
    let (h, w, c) = (images[0].0.height, images[0].0.width, images[0].0.channels);
    if let Some((img, name)) = images
        .iter()
        .find(|(i, _)| (i.height, i.width, i.channels) != (h, w, c))
    {
        let msg = format!(
            "cannot collate {name:?} ({}x{}x{}) with images of {h}x{w}x{c}: give \
             ops.decode_image() a size= or crop= so that all images have one shape",
            img.height, img.width, img.channels
        );
        return Err(Python::attach(|py| errors::collate_value_error(py, &msg)));
    }
    let mut tensor = Tensor::empty(pool, &layout.shape(n, (h, w, c)), dtype_of(layout))?;
    let slot_len = layout.slot_len((h, w, c));
    {
        let out = tensor_bytes(&mut tensor);
        for ((img, _), slot) in images.iter().zip(out.chunks_exact_mut(slot_len)) {
            write_slot(&img.data, (h, w, c), layout, slot);
        }
    }
    let labels = match labels.iter().filter(|l| l.is_some()).count() {
        0 => None,
        k if k == n => Some(label_tensor(pool, &labels)?),
        _ => {
            return Err(Python::attach(|py| {
                errors::collate_value_error(
                    py,
                    "cannot collate a batch in which some images have a label and some do not",
                )
            }))
        }
    };
    Ok(Item::Batch {
        images: tensor,
        labels,
    })
}

/// The reason an item was skipped, as `DataLoader.stats()` lists it:
/// the Python exception's class name and message.
fn skip_reason(e: &ImageError) -> String {
    let class = match e {
        ImageError::Io { .. } => "ImageReadError",
        ImageError::InvalidTransform { .. } | ImageError::Encode { .. } => "ValueError",
        _ => "ImageDecodeError",
    };
    format!("{class}: {e}")
}

/// The dtype of a batch laid out as `layout`.
fn dtype_of(layout: Layout) -> DType {
    if layout.float {
        DType::F32
    } else {
        DType::U8
    }
}

/// `DataLoader`'s batch op: a group of files decodes, in parallel, straight
/// into the slots of one pooled batch tensor ([`decode_batch`]).
struct LoadBatch {
    transform: Transform,
    /// The loader's seed: each sample's crop and flip draw from it, the
    /// epoch and the sample's dataset index ([`crop_seed`]: neither the
    /// file's path nor thread timing nor the batch it falls in changes it;
    /// `io.decode_image` without `seed=` in a transform draws the same).
    seed: u64,
    epoch: u64,
    /// `(height, width, channels)` of every image.
    shape: (usize, usize, usize),
    options: BatchOptions,
    pool: BufferPool,
    /// The loader's threads: every batch in flight decodes on them.
    lanes: Arc<Lanes>,
}

impl LoadBatch {
    /// Starts the group `(batch_no, indices, items)` of the epoch plan
    /// decoding on the loader's threads ([`spawn_batch`]): the batch comes
    /// out of the future once the last of its images is done, handed over
    /// by the thread that did it (nobody waits for it meanwhile).
    fn start(
        self: &Arc<Self>,
        batch_no: u64,
        indices: Vec<u64>,
        items: Vec<Item>,
    ) -> BoxFuture<PyResult<Option<Item>>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        match self.prepare(batch_no, indices, items) {
            Err(e) => return Box::pin(std::future::ready(Err(e))),
            Ok(Prepared::Empty(item)) => return Box::pin(std::future::ready(Ok(Some(item)))),
            Ok(Prepared::Batch(batch, buffer, group)) => {
                let op = Arc::clone(self);
                spawn_batch(
                    batch,
                    &self.transform,
                    &self.options,
                    buffer,
                    &self.lanes,
                    move |done| {
                        // Nobody may wait any more (the pipeline stopped).
                        let _ = tx.send(op.finish(group, done));
                    },
                );
            }
        }
        Box::pin(async move {
            rx.await.map_or_else(
                |_| {
                    Err(PyRuntimeError::new_err(
                        "decode_batch: the batch's decode ended without handing it over",
                    ))
                },
                |batch| batch.map(Some),
            )
        })
    }

    /// The group's images as batch items (with their seeds) and its buffer;
    /// or, for a group with no images, its (empty) batch.
    fn prepare(&self, batch_no: u64, indices: Vec<u64>, items: Vec<Item>) -> PyResult<Prepared> {
        let mut batch = Vec::with_capacity(items.len());
        let mut labels = Vec::with_capacity(items.len());
        for (item, &index) in items.into_iter().zip(&indices) {
            let (source, name, label) = match item {
                Item::Path { path, label, .. } => {
                    let name = path.display().to_string();
                    (Source::Path(path), name, label)
                }
                Item::Bytes {
                    data, name, label, ..
                } => (Source::Owned(data), name, label),
                Item::Located { at, name, label } => (Source::Located(at), name, label),
                other => return Err(wrong_item("decode_batch", "paths or bytes", &other)),
            };
            let seed = crop_seed(self.seed, self.epoch, index);
            batch.push(BatchItem::new(source, name).with_seed(seed));
            labels.push(label);
        }
        let with_labels = labels.iter().filter(|l| l.is_some()).count();
        if with_labels != 0 && with_labels != labels.len() {
            return Err(PyValueError::new_err(
                "some items of the batch have a label and some do not",
            ));
        }
        let group = Group {
            batch_no,
            indices,
            labels: (with_labels != 0).then_some(labels),
        };
        if batch.is_empty() {
            return Ok(Prepared::Empty(group.loaded(None, None, Vec::new())));
        }
        let nbytes = batch.len() * self.options.layout.slot_len(self.shape);
        // On the stage's task: the loader's pool has no bound on its buffers (the batches in
        // flight and the sink bound them), so taking one never waits; nor does taking the
        // labels' in `finish`, on a decode thread.
        let buffer = self.pool.acquire(nbytes).map_err(PyErr::from)?;
        Ok(Prepared::Batch(batch, buffer, group))
    }

    /// The batch of a group once its images are decoded: the images that
    /// decoded, their labels, and the samples left out with the reason.
    fn finish(&self, group: Group, (outcome, buffer, items): SpawnedOutcome) -> PyResult<Item> {
        // Bytes a sharded source read are given back for its next reads.
        for item in items {
            if let Source::Owned(data) = item.source {
                crate::recycle::give(data);
            }
        }
        let report = outcome?;
        let skipped = report
            .failures
            .iter()
            .map(|(i, e)| (group.indices[*i], skip_reason(e)))
            .collect();
        if report.kept == 0 {
            return Ok(group.loaded(None, None, skipped));
        }
        let layout = self.options.layout;
        let images = Tensor::from_buffer(
            buffer,
            &layout.shape(report.kept, self.shape),
            dtype_of(layout),
        )?;
        let labels = match &group.labels {
            None => None,
            Some(labels) => {
                let mut failed = report.failures.iter().map(|(i, _)| *i).peekable();
                let mut kept = Vec::with_capacity(report.kept);
                for (i, label) in labels.iter().enumerate() {
                    if failed.peek() == Some(&i) {
                        failed.next();
                    } else {
                        kept.push(*label);
                    }
                }
                Some(label_tensor(&self.pool, &kept)?)
            }
        };
        Ok(group.loaded(Some(images), labels, skipped))
    }
}

/// What [`LoadBatch::prepare`] makes of a group.
enum Prepared {
    /// A group without images: its batch.
    Empty(Item),
    /// The images to decode, the buffer they decode into, and the group.
    Batch(Vec<BatchItem<'static>>, PooledBuffer, Group),
}

/// A group of the epoch plan while its images decode: its number, its
/// samples' dataset indices, and their labels (all or none).
struct Group {
    batch_no: u64,
    indices: Vec<u64>,
    labels: Option<Vec<Option<i64>>>,
}

impl Group {
    /// The group's batch.
    fn loaded(
        self,
        images: Option<Tensor>,
        labels: Option<Tensor>,
        skipped: Vec<(u64, String)>,
    ) -> Item {
        Item::Loaded {
            batch_no: self.batch_no,
            indices: self.indices,
            images,
            labels,
            skipped,
        }
    }
}

/// `DataLoader`'s batch op, made from its `decode_image` op and (optional)
/// `collate` op: each item is a group of the epoch plan, a
/// `_core._PlanGroup(batch_no, indices, files)` (paths or bytes, with
/// labels, made native on the source's thread), that becomes one batch,
/// `(batch_no, indices, images, labels, skipped)` with `skipped` as
/// `(dataset index, reason)`.
///
/// The ops the user gave are the ops that run: what the loader cannot honour
/// is refused here, at the loader's construction: a `decode_image` seed
/// (the loader's `seed` seeds every sample), a `collate` batch size other
/// than the loader's, or a `collate` `drop_last` that disagrees with it.
#[pyfunction]
#[pyo3(signature = (decode, collate=None, *, seed, epoch, lanes, skip, pool, batch_size, drop_last))]
#[allow(clippy::too_many_arguments)]
fn _op_load_batch(
    decode: &PyNativeOp,
    collate: Option<&PyNativeOp>,
    seed: u64,
    epoch: u64,
    lanes: &PyLanes,
    skip: bool,
    pool: &Bound<'_, PyBufferPool>,
    batch_size: usize,
    drop_last: bool,
) -> PyResult<PyNativeOp> {
    let Some(OpConfig::Decode {
        spec,
        seed: op_seed,
    }) = decode.config()
    else {
        return Err(PyTypeError::new_err(
            "the image transform is ops.decode_image(...)",
        ));
    };
    if let Some(op_seed) = op_seed {
        return Err(PyValueError::new_err(format!(
            "ops.decode_image(seed={op_seed}) in a DataLoader: the DataLoader's seed= seeds \
             every sample's random crop and flip (from the seed, the epoch and the sample's \
             index), so an op's own seed would not be used; pass seed={op_seed} to the \
             DataLoader instead"
        )));
    }
    let layout = match collate.map(|c| (c.config(), c.grouping())) {
        None => Layout::default(),
        Some((Some(OpConfig::Collate { layout, own_pool }), Some((size, op_drop_last)))) => {
            if let Some((max_batches, timeout)) = own_pool {
                return Err(PyValueError::new_err(format!(
                    "collate=ops.collate(max_batches={max_batches}, timeout={}) in a \
                     DataLoader: those size a pipeline's own batch buffers and bound its wait \
                     for one, and a DataLoader has buffers of its own (as many batches in \
                     flight as its threads need, plus prefetch=; its timeout= bounds a stuck \
                     batch): leave them out of ops.collate",
                    timeout.map_or_else(|| "None".to_owned(), |t| format!("{t:?}"))
                )));
            }
            if size != 0 && size != batch_size {
                return Err(PyValueError::new_err(format!(
                    "collate=ops.collate({size}, ...) but batch_size={batch_size}: give both \
                     the same batch size (or none to ops.collate)"
                )));
            }
            if size != 0 && op_drop_last != drop_last {
                return Err(PyValueError::new_err(format!(
                    "collate=ops.collate({size}, drop_last={}) but the DataLoader has \
                     drop_last={}: give the DataLoader the drop_last you want (ops.collate's \
                     is not used by a DataLoader)",
                    py_bool(op_drop_last),
                    py_bool(drop_last)
                )));
            }
            layout
        }
        Some(_) => {
            return Err(PyTypeError::new_err(
                "the image collate is ops.collate(...)",
            ))
        }
    };
    let transform = spec.transform(0);
    let shape = batch_shape(&transform).ok_or_else(|| {
        PyValueError::new_err(
            "images of a batch need one shape: give ops.decode_image() a size= or crop=",
        )
    })?;
    let op = LoadBatch {
        transform,
        seed,
        epoch,
        shape,
        options: BatchOptions {
            layout,
            // A copy of the batch's work per thread, up to one per image.
            threads: lanes.lanes.threads().min(batch_size.max(1)),
            on_error: if skip { OnError::Skip } else { OnError::Stop },
        },
        pool: super::staging::pool_or_default(pool.py(), Some(pool))?,
        lanes: Arc::clone(&lanes.lanes),
    };
    let op = Arc::new(op);
    Ok(PyNativeOp::spawning(
        "decode_batch",
        Arc::new(move |item| match item {
            Item::Group {
                batch_no,
                indices,
                items,
            } => op.start(batch_no, indices, items),
            other => Box::pin(std::future::ready(Err(wrong_item(
                "decode_batch",
                "_PlanGroup(batch_no, indices, files) groups",
                &other,
            )))),
        }),
    ))
}

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// The labels of a batch as an int64 tensor from `pool` (callers make sure
/// every item has one).
fn label_tensor(pool: &BufferPool, labels: &[Option<i64>]) -> PyResult<Tensor> {
    let mut t = Tensor::empty(pool, &[labels.len()], DType::I64)?;
    let out = tensor_bytes(&mut t);
    for (k, l) in labels.iter().enumerate() {
        out[k * 8..k * 8 + 8].copy_from_slice(&l.unwrap_or(0).to_ne_bytes());
    }
    Ok(t)
}

/// The tensor's bytes, writable: the collate op just made it and holds its
/// only reference.
fn tensor_bytes(t: &mut Tensor) -> &mut [u8] {
    t.bytes_mut()
        .expect("a tensor made here has no other owner")
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_op_read_file, m)?)?;
    m.add_function(wrap_pyfunction!(_op_decode_image, m)?)?;
    m.add_function(wrap_pyfunction!(_op_collate, m)?)?;
    m.add_function(wrap_pyfunction!(_op_load_batch, m)?)?;
    Ok(())
}
