//! Native image ops for pipelines: `read_file`, `decode_image`, `collate`.
//!
//! They work on native [`Item`]s (paths, encoded bytes, decoded images,
//! batches) and never take the GIL; a chain source -> `read_file` ->
//! `decode_image` -> `collate` only meets Python at the sink, where a batch
//! becomes a `ferrofeed.Tensor` (and its labels another).

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use pyo3::exceptions::{PyOSError, PyTypeError, PyValueError};
use pyo3::prelude::*;

use super::image::parse_transform;
use super::pipeline::{Item, PyNativeOp};
use crate::dlpack::DType;
use crate::image::{decode, Crop, Transform};
use crate::pipeline::CombineFn;
use crate::staging::{BufferPool, Pinning, PoolConfig, Tensor};

/// `ops.read_file()`: a path (with its label) becomes the file's bytes.
#[pyfunction]
fn _op_read_file() -> PyNativeOp {
    PyNativeOp::new(
        "read_file",
        true,
        Arc::new(|item| match item {
            Item::Path { path, label } => {
                let (data, name) = read_path(&path)?;
                Ok(Some(Item::Bytes { data, name, label }))
            }
            other => Err(wrong_item(
                "read_file",
                "paths (str or os.PathLike)",
                &other,
            )),
        }),
    )
}

/// A file's bytes and its name, or an `OSError` naming the file.
fn read_path(path: &std::path::Path) -> PyResult<(Vec<u8>, String)> {
    let name = path.display().to_string();
    match std::fs::read(path) {
        Ok(data) => Ok((data, name)),
        Err(e) => Err(PyOSError::new_err((
            e.raw_os_error().unwrap_or(0),
            format!("cannot read {name:?}: {e}"),
            name,
        ))),
    }
}

#[cold]
fn wrong_item(op: &str, wants: &str, item: &Item) -> PyErr {
    PyTypeError::new_err(format!(
        "ops.{op}() takes {wants}, or (item, label) pairs; got {}",
        item.kind()
    ))
}

/// A seed per image for random crops: the op's seed and the image's name,
/// so that the crop of a file does not depend on thread timing.
fn seed_for(base: u64, name: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    base.hash(&mut h);
    name.hash(&mut h);
    h.finish()
}

/// `ops.decode_image(...)`: encoded bytes (or a path) become an image.
#[pyfunction]
#[pyo3(signature = (
    *, size=None, mode="RGB", resize_shorter=None, crop=None, flip=false,
    scale=(0.08, 1.0), ratio=(0.75, 1.333_333_333_333_333_3), seed=None, dct_scaling=true
))]
#[allow(clippy::too_many_arguments)]
fn _op_decode_image(
    size: Option<&Bound<'_, PyAny>>,
    mode: &str,
    resize_shorter: Option<usize>,
    crop: Option<&Bound<'_, PyAny>>,
    flip: bool,
    scale: (f64, f64),
    ratio: (f64, f64),
    seed: Option<u64>,
    dct_scaling: bool,
) -> PyResult<PyNativeOp> {
    let base_seed = seed.unwrap_or_else(super::image::fresh_seed);
    let transform = parse_transform(
        size,
        mode,
        resize_shorter,
        crop,
        flip,
        scale,
        ratio,
        Some(base_seed),
        dct_scaling,
    )?;
    let for_item = move |name: &str| -> Transform {
        let mut t = transform;
        if let Some(Crop::RandomResized { scale, ratio, .. }) = t.crop {
            t.crop = Some(Crop::RandomResized {
                scale,
                ratio,
                seed: seed_for(base_seed, name),
            });
        }
        t
    };
    Ok(PyNativeOp::new(
        "decode_image",
        true,
        Arc::new(move |item| {
            let (data, name, label) = match item {
                Item::Bytes { data, name, label } => (data, name, label),
                Item::Path { path, label } => {
                    let (data, name) = read_path(&path)?;
                    (data, name, label)
                }
                other => return Err(wrong_item("decode_image", "encoded bytes or paths", &other)),
            };
            let image = decode(&data, &name, &for_item(&name))?;
            Ok(Some(Item::Image { image, name, label }))
        }),
    ))
}

/// How `collate` lays out and converts a batch.
#[derive(Clone, Copy)]
struct Layout {
    chw: bool,
    float: bool,
    /// Per-channel (mean, std) on the 0..1 scale, for float output.
    normalize: Option<([f32; 3], [f32; 3])>,
}

/// `ops.collate(batch_size, ...)`: groups images into one batch tensor
/// (and their labels into an int64 tensor), from a bounded buffer pool.
#[pyfunction]
#[pyo3(signature = (
    batch_size, /, *, drop_last=false, layout="NHWC", dtype="uint8", normalize=None,
    max_batches=16
))]
fn _op_collate(
    batch_size: usize,
    drop_last: bool,
    layout: &str,
    dtype: &str,
    normalize: Option<(Vec<f32>, Vec<f32>)>,
    max_batches: usize,
) -> PyResult<PyNativeOp> {
    if batch_size == 0 {
        return Err(PyValueError::new_err("batch_size must be at least 1"));
    }
    let chw = match layout {
        "NHWC" => false,
        "NCHW" => true,
        other => {
            return Err(PyValueError::new_err(format!(
                "layout is \"NHWC\" or \"NCHW\", not {other:?}"
            )))
        }
    };
    let float = match dtype {
        "uint8" => false,
        "float32" => true,
        other => {
            return Err(PyValueError::new_err(format!(
                "dtype is \"uint8\" or \"float32\", not {other:?}"
            )))
        }
    };
    let normalize = match normalize {
        None => None,
        Some(_) if !float => {
            return Err(PyValueError::new_err("normalize= needs dtype=\"float32\""));
        }
        Some((mean, std)) => {
            let three = |v: &[f32], what: &str| -> PyResult<[f32; 3]> {
                match *v {
                    [a] => Ok([a, a, a]),
                    [a, b, c] => Ok([a, b, c]),
                    _ => Err(PyValueError::new_err(format!(
                        "normalize {what} has 1 or 3 values"
                    ))),
                }
            };
            let (mean, std) = (three(&mean, "mean")?, three(&std, "std")?);
            if std.contains(&0.0) {
                return Err(PyValueError::new_err("normalize std must not be 0"));
            }
            Some((mean, std))
        }
    };
    let pool = BufferPool::new(PoolConfig {
        max_buffers: Some(max_batches.max(2) * 2),
        max_idle: None,
        timeout: Some(std::time::Duration::from_secs(60)),
        // Pinning would probe CUDA; a pipeline may be built before a fork.
        pinning: Pinning::Off,
    })
    .map_err(PyErr::from)?;
    let layout = Layout {
        chw,
        float,
        normalize,
    };
    let combine: CombineFn<Item, PyErr> =
        Arc::new(move |items: Vec<Item>| collate(&pool, layout, items));
    Ok(PyNativeOp::aggregate(
        "collate", batch_size, drop_last, combine,
    ))
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
                return Err(wrong_item(
                    "collate",
                    "decoded images (ops.decode_image())",
                    &other,
                ))
            }
        }
    }
    let (h, w, c) = (images[0].0.height, images[0].0.width, images[0].0.channels);
    if let Some((img, name)) = images
        .iter()
        .find(|(i, _)| (i.height, i.width, i.channels) != (h, w, c))
    {
        return Err(PyValueError::new_err(format!(
            "cannot collate {name:?} ({}x{}x{}) with images of {h}x{w}x{c}: give \
             ops.decode_image() a size= or crop= so that all images have one shape",
            img.height, img.width, img.channels
        )));
    }
    let shape = if layout.chw {
        [n, c, h, w]
    } else {
        [n, h, w, c]
    };
    let dtype = if layout.float { DType::F32 } else { DType::U8 };
    let mut tensor = Tensor::empty(pool, &shape, dtype)?;
    let per = h * w * c;
    {
        let out = tensor_bytes(&mut tensor);
        for (k, (img, _)) in images.iter().enumerate() {
            write_image(
                &img.data,
                (h, w, c),
                layout,
                &mut out[k * per * dtype.itemsize()..(k + 1) * per * dtype.itemsize()],
            );
        }
    }
    let labels = match labels.iter().filter(|l| l.is_some()).count() {
        0 => None,
        k if k == n => {
            let mut t = Tensor::empty(pool, &[n], DType::I64)?;
            let out = tensor_bytes(&mut t);
            for (k, l) in labels.iter().enumerate() {
                out[k * 8..k * 8 + 8].copy_from_slice(&l.unwrap_or(0).to_ne_bytes());
            }
            Some(t)
        }
        _ => {
            return Err(PyValueError::new_err(
                "some images of the batch have a label and some do not",
            ))
        }
    };
    Ok(Item::Batch {
        images: tensor,
        labels,
    })
}

/// The tensor's bytes, writable: the collate op just made it and holds its
/// only reference.
fn tensor_bytes(t: &mut Tensor) -> &mut [u8] {
    t.bytes_mut()
        .expect("a tensor made here has no other owner")
}

/// Writes one HWC u8 image into its slot of the batch, converting.
#[allow(clippy::many_single_char_names)] // h, w, c, x, y: image coordinates
fn write_image(src: &[u8], (h, w, c): (usize, usize, usize), layout: Layout, slot: &mut [u8]) {
    if !layout.float && !layout.chw {
        slot.copy_from_slice(src);
        return;
    }
    let value = |ch: usize, v: u8| -> f32 {
        let x = f32::from(v) / 255.0;
        match layout.normalize {
            Some((mean, std)) => (x - mean[ch.min(2)]) / std[ch.min(2)],
            None => x,
        }
    };
    for y in 0..h {
        for x in 0..w {
            for ch in 0..c {
                let v = src[(y * w + x) * c + ch];
                let at = if layout.chw {
                    (ch * h + y) * w + x
                } else {
                    (y * w + x) * c + ch
                };
                if layout.float {
                    slot[at * 4..at * 4 + 4].copy_from_slice(&value(ch, v).to_ne_bytes());
                } else {
                    slot[at] = v;
                }
            }
        }
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_op_read_file, m)?)?;
    m.add_function(wrap_pyfunction!(_op_decode_image, m)?)?;
    m.add_function(wrap_pyfunction!(_op_collate, m)?)?;
    Ok(())
}
