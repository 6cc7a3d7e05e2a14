//! `ferrofeed._core.decode_image` / `load_images`: the Python face of
//! [`crate::image`], surfaced as `ferrofeed.io`.
//!
//! Arguments are parsed with the GIL held; files are read and images decoded
//! with it released. `load_images` is [`decode_batch`] into one pooled
//! batch buffer; the first failing item (lowest index) is raised and the
//! buffer goes back to the pool, so a partly filled batch is never handed
//! out.

use std::path::PathBuf;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

use super::dlpack::PyTensor;
use super::spec::ImageArgs;
use super::staging::{acquire, pool_or_default, PyBufferPool};
use crate::dlpack::DType;
use crate::image::batch::{decode_batch, BatchItem, BatchOptions, Layout, OnError, Source};
use crate::image::spec::ImageSpec;
use crate::image::{self, ImageError};
use crate::seed::{crop_seed, fresh_seed};
use crate::staging::Tensor;

/// The name of source `index` in errors: its path, or `item {index}`
/// (`<bytes>` for a lone image).
fn source_name(source: &Source<'_>, index: Option<usize>) -> String {
    match (source, index) {
        (Source::Path(p), _) => p.display().to_string(),
        (_, Some(i)) => format!("item {i}"),
        (_, None) => "<bytes>".to_owned(),
    }
}

/// `bytes` are borrowed (immutable); other buffers are copied, since they
/// could change while the GIL is released; `str` and `os.PathLike` are
/// paths.
fn parse_source<'py>(obj: &'py Bound<'py, PyAny>) -> PyResult<Source<'py>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(Source::Borrowed(b.as_bytes()));
    }
    if obj.is_instance_of::<PyString>() || obj.hasattr("__fspath__")? {
        return Ok(Source::Path(obj.extract::<PathBuf>()?));
    }
    match PyBuffer::<u8>::get(obj) {
        Ok(buf) => Ok(Source::Owned(buf.to_vec(obj.py())?)),
        Err(_) => Err(PyTypeError::new_err(format!(
            "an image source is bytes, a bytes-like object, a path str or an os.PathLike, not {}",
            obj.get_type().name()?
        ))),
    }
}

/// The seed of a call's random draws: `seed=`, or a fresh one when the
/// spec draws anything at random and none was given.
fn call_seed(spec: &ImageSpec, seed: Option<u64>) -> u64 {
    seed.unwrap_or_else(|| if spec.is_random() { fresh_seed() } else { 0 })
}

/// A sample a `DataLoader` loads: the loader's seed, the epoch, the
/// sample's dataset index.
type Sample = (u64, u64, u64);

thread_local! {
    /// The sample a `DataLoader` is loading on this thread, if it is loading
    /// one: set by `ferrofeed._sample.sample_scope` (through
    /// `_swap_sample`), read by `decode_image` without `seed=`. A Python
    /// thread is one OS thread.
    static SAMPLE: std::cell::Cell<Option<Sample>> = const { std::cell::Cell::new(None) };
}

/// The seed of the random crop and flip of the sample a `DataLoader` is
/// loading on this thread ([`crop_seed`], as the native chain's), or `None`.
fn sample_image_seed() -> Option<u64> {
    SAMPLE
        .with(std::cell::Cell::get)
        .map(|(seed, epoch, index)| crop_seed(seed, epoch, index))
}

/// Sets the sample this thread loads, `(seed, epoch, index)` (`None`: no
/// sample), and returns the one it replaces, for `sample_scope` to restore.
#[pyfunction]
#[pyo3(name = "_swap_sample")]
fn swap_sample(sample: Option<Sample>) -> Option<Sample> {
    SAMPLE.with(|s| s.replace(sample))
}

/// Decodes one image into a new tensor of shape `(H, W, C)`.
#[pyfunction]
#[pyo3(signature = (
    src, /, *, size=None, mode="RGB", resize_shorter=None, crop=None, flip=None,
    scale=(0.08, 1.0), ratio=(0.75, 4.0 / 3.0), seed=None, dct_scaling=true, crop_decode=true,
    pool=None
), text_signature = "(src, /, *, size=None, mode='RGB', resize_shorter=None, crop=None, \
    flip=False, scale=(0.08, 1.0), ratio=(0.75, 1.3333333333333333), seed=None, \
    dct_scaling=True, crop_decode=True, pool=None)")]
#[allow(clippy::too_many_arguments)]
fn decode_image(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    size: Option<&Bound<'_, PyAny>>,
    mode: &str,
    resize_shorter: Option<usize>,
    crop: Option<&Bound<'_, PyAny>>,
    flip: Option<&Bound<'_, PyAny>>,
    scale: (f64, f64),
    ratio: (f64, f64),
    seed: Option<u64>,
    dct_scaling: bool,
    crop_decode: bool,
    pool: Option<&Bound<'_, PyBufferPool>>,
) -> PyResult<PyTensor> {
    let spec = ImageArgs {
        size,
        resize_shorter,
        crop,
        flip,
        scale,
        ratio,
        mode,
        dct_scaling,
        crop_decode,
    }
    .parse()?;
    // Without a seed, inside a DataLoader's dataset[i] or transform: the sample's own seed
    // (the one sample-seed rule), so the crop and flip are the native chain's.
    let seed = match seed {
        None if spec.is_random() => sample_image_seed(),
        given => given,
    };
    let transform = spec.transform(call_seed(&spec, seed));
    let source = parse_source(src)?;
    let pool = pool_or_default(py, pool)?;
    let name = source_name(&source, None);
    let (data, shape) = py.detach(|| -> Result<_, ImageError> {
        let data = source.bytes(&name)?;
        let (_, shape) = image::output_shape(&data, &name, &transform)?;
        Ok((data, shape))
    })?;
    let nbytes = shape.0 * shape.1 * shape.2;
    let mut buffer = acquire(py, &pool, nbytes)?;
    py.detach(|| image::decode_into(&data, &name, &transform, &mut buffer[..nbytes]))?;
    Ok(PyTensor::new(Tensor::from_buffer(
        buffer,
        &[shape.0, shape.1, shape.2],
        DType::U8,
    )?))
}

/// Decodes many images into one `(N, H, W, C)` batch, in parallel.
#[pyfunction]
#[pyo3(signature = (
    sources, /, *, size, mode="RGB", resize_shorter=None, crop=None, flip=None,
    scale=(0.08, 1.0), ratio=(0.75, 4.0 / 3.0), seed=None, dct_scaling=true, crop_decode=true,
    threads=None, pool=None
), text_signature = "(sources, /, *, size, mode='RGB', resize_shorter=None, crop=None, \
    flip=False, scale=(0.08, 1.0), ratio=(0.75, 1.3333333333333333), seed=None, \
    dct_scaling=True, crop_decode=True, threads=None, pool=None)")]
#[allow(clippy::too_many_arguments)]
fn load_images(
    py: Python<'_>,
    sources: &Bound<'_, PyAny>,
    size: &Bound<'_, PyAny>,
    mode: &str,
    resize_shorter: Option<usize>,
    crop: Option<&Bound<'_, PyAny>>,
    flip: Option<&Bound<'_, PyAny>>,
    scale: (f64, f64),
    ratio: (f64, f64),
    seed: Option<u64>,
    dct_scaling: bool,
    crop_decode: bool,
    threads: Option<usize>,
    pool: Option<&Bound<'_, PyBufferPool>>,
) -> PyResult<PyTensor> {
    let spec = ImageArgs {
        size: Some(size),
        resize_shorter,
        crop,
        flip,
        scale,
        ratio,
        mode,
        dct_scaling,
        crop_decode,
    }
    .parse()?;
    let (height, width) = spec
        .size
        .ok_or_else(|| PyValueError::new_err("load_images needs size="))?;
    let channels = spec.mode.channels();
    if threads == Some(0) {
        return Err(PyValueError::new_err("threads must be positive"));
    }
    let items: Vec<Bound<'_, PyAny>> = sources
        .try_iter()
        .map_err(|_| PyTypeError::new_err("sources is an iterable of paths or bytes"))?
        .collect::<PyResult<_>>()?;
    let parsed: Vec<Source<'_>> = items.iter().map(parse_source).collect::<PyResult<_>>()?;
    let n = parsed.len();
    let batch_seed = call_seed(&spec, seed);
    let batch: Vec<BatchItem<'_>> = parsed
        .into_iter()
        .enumerate()
        .map(|(i, source)| {
            let name = source_name(&source, Some(i));
            // The one crop-seed rule, epoch 0, the image's position in the batch.
            BatchItem::new(source, name).with_seed(crop_seed(batch_seed, 0, i as u64))
        })
        .collect();
    let options = BatchOptions {
        layout: Layout::default(),
        threads: threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from)),
        on_error: OnError::Stop,
    };
    let nbytes = options.layout.slot_len((height, width, channels)) * n;
    let pool = pool_or_default(py, pool)?;
    let mut buffer = acquire(py, &pool, nbytes)?;
    let transform = spec.transform(batch_seed);
    py.detach(|| decode_batch(&batch, &transform, &options, &mut buffer[..nbytes]))?;
    Ok(PyTensor::new(Tensor::from_buffer(
        buffer,
        &[n, height, width, channels],
        DType::U8,
    )?))
}

/// A synthetic photo-like JPEG (see [`crate::image::synth`]), made without
/// the GIL.
#[pyfunction]
#[pyo3(signature = (width, height, *, seed, quality=85))]
fn _synthetic_jpeg(
    py: Python<'_>,
    width: usize,
    height: usize,
    seed: u64,
    quality: u8,
) -> PyResult<Py<pyo3::types::PyBytes>> {
    if width == 0 || height == 0 || width * height > image::MAX_PIXELS {
        return Err(PyValueError::new_err(format!(
            "a synthetic image is 1 to {} pixels, not {width}x{height}",
            image::MAX_PIXELS
        )));
    }
    let jpeg = py.detach(|| {
        let pixels = image::synth::photo(width, height, seed);
        image::synth::encode_jpeg(
            &pixels,
            width,
            height,
            quality,
            image::synth::Chroma::Subsampled,
        )
    })?;
    Ok(pyo3::types::PyBytes::new(py, &jpeg).unbind())
}

/// Sets the pixel budget per image for every later decode in this process
/// (see [`image::set_max_pixels`]); returns the previous budget.
#[pyfunction]
fn set_max_image_pixels(pixels: usize) -> PyResult<usize> {
    image::set_max_pixels(pixels).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The pixel budget per image (see [`image::max_pixels`]).
#[pyfunction]
fn get_max_image_pixels() -> usize {
    image::max_pixels()
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(set_max_image_pixels, m)?)?;
    m.add_function(wrap_pyfunction!(swap_sample, m)?)?;
    m.add_function(wrap_pyfunction!(get_max_image_pixels, m)?)?;
    m.add_function(wrap_pyfunction!(_synthetic_jpeg, m)?)?;
    m.add_function(wrap_pyfunction!(decode_image, m)?)?;
    m.add_function(wrap_pyfunction!(load_images, m)?)?;
    Ok(())
}
