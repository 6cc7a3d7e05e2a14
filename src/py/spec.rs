//! `ferrofeed._core.ImageSpec` and `BatchLayout`: the Python face of
//! [`crate::image::spec`], and the one parser of the image keywords.
//!
//! `io.decode_image`, `io.load_images` and `ImageSpec(...)` (which
//! `ops.decode_image` builds) turn their keywords into an [`ImageSpec`]
//! through [`ImageArgs::parse`]; `BatchLayout(...)` (which `ops.collate`
//! builds) turns its own into a [`Layout`]. Only the Python types are
//! checked here; the values are checked by the core
//! ([`ImageSpec::validated`], [`Layout::from_names`]), whose
//! [`crate::image::SpecError`] becomes a `ValueError`.

use std::hash::{Hash, Hasher};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};
use pyo3::IntoPyObjectExt;

use crate::image::batch::Layout;
use crate::image::spec::{CropSpec, FlipSpec, ImageSpec};
use crate::image::ColorMode;
use crate::image::SpecError;

/// The image keywords as a Python call gave them (the names are the
/// keywords'), before [`ImageArgs::parse`].
pub(crate) struct ImageArgs<'a, 'py> {
    pub(crate) size: Option<&'a Bound<'py, PyAny>>,
    pub(crate) resize_shorter: Option<usize>,
    pub(crate) crop: Option<&'a Bound<'py, PyAny>>,
    pub(crate) flip: Option<&'a Bound<'py, PyAny>>,
    pub(crate) scale: (f64, f64),
    pub(crate) ratio: (f64, f64),
    pub(crate) mode: &'a str,
    pub(crate) dct_scaling: bool,
    pub(crate) crop_decode: bool,
}

impl ImageArgs<'_, '_> {
    /// The validated spec: `TypeError` when `size` is not an int or a pair
    /// of ints, `ValueError` for everything else that is wrong.
    pub(crate) fn parse(&self) -> PyResult<ImageSpec> {
        let spec = ImageSpec {
            size: parse_size(self.size, "size")?,
            resize_shorter: self.resize_shorter,
            crop: parse_crop(self.crop)?,
            flip: parse_flip(self.flip)?,
            scale: self.scale,
            ratio: self.ratio,
            mode: ColorMode::from_name(self.mode)?,
            dct_scaling: self.dct_scaling,
            crop_decode: self.crop_decode,
        };
        Ok(spec.validated()?)
    }
}

/// `size` (or a center `crop`): an int (square) or `(height, width)`;
/// `None` is no size. A negative side is a `ValueError` (zero ones are
/// refused by [`ImageSpec::validated`]); anything else a `TypeError`.
fn parse_size(
    obj: Option<&Bound<'_, PyAny>>,
    what: &'static str,
) -> PyResult<Option<(usize, usize)>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    // An int, or anything with `__index__` (NumPy's integers).
    let (h, w, text) = if let Ok(n) = obj.extract::<i64>() {
        (n, n, n.to_string())
    } else {
        let (h, w) = obj.extract::<(i64, i64)>().map_err(|_| {
            PyTypeError::new_err(format!(
                "{what} is an int or a (height, width) pair of ints, not {}",
                obj.repr()
                    .map_or_else(|_| "?".to_owned(), |r| r.to_string())
            ))
        })?;
        (h, w, format!("({h}, {w})"))
    };
    match (usize::try_from(h), usize::try_from(w)) {
        (Ok(h), Ok(w)) => Ok(Some((h, w))),
        _ => Err(SpecError::NotPositive { what, value: text }.into()),
    }
}

/// `crop=`: `None`, `"random"`, or a center crop's size (an int or a pair;
/// anything else is a `ValueError`, as it always was).
fn parse_crop(crop: Option<&Bound<'_, PyAny>>) -> PyResult<Option<CropSpec>> {
    let Some(crop) = crop.filter(|c| !c.is_none()) else {
        return Ok(None);
    };
    if crop.is_instance_of::<PyString>() {
        if crop.extract::<&str>()? == "random" {
            return Ok(Some(CropSpec::Random));
        }
    } else {
        match parse_size(Some(crop), "crop") {
            Ok(Some((height, width))) => return Ok(Some(CropSpec::Center { height, width })),
            Err(e) if !e.is_instance_of::<PyTypeError>(crop.py()) => return Err(e),
            _ => {}
        }
    }
    Err(PyValueError::new_err(format!(
        "crop is an int or (height, width) for a center crop, or \"random\", not {}",
        crop.repr()?
    )))
}

/// `flip=`: `False`/`None` (never), `True` (always) or `"random"`
/// (torchvision's `RandomHorizontalFlip()`).
fn parse_flip(flip: Option<&Bound<'_, PyAny>>) -> PyResult<FlipSpec> {
    let Some(flip) = flip.filter(|f| !f.is_none()) else {
        return Ok(FlipSpec::Never);
    };
    // `bool` also takes NumPy's `bool_`, as the argument did when it was a bool.
    if let Ok(b) = flip.extract::<bool>() {
        return Ok(if b { FlipSpec::Always } else { FlipSpec::Never });
    }
    if flip.extract::<&str>().is_ok_and(|s| s == "random") {
        return Ok(FlipSpec::Random);
    }
    Err(PyValueError::new_err(format!(
        "flip is True, False or \"random\" (a random horizontal flip), not {}",
        flip.repr()?
    )))
}

/// An `f32` as the Python float it was written as (`0.485`, not
/// `0.48500001430511475`): its shortest decimal form, read as an `f64`.
fn f32_as_written(v: f32) -> f64 {
    v.to_string().parse().unwrap_or(f64::from(v))
}

/// Hashes an `f64` that is not NaN and not `-0.0` (what a validated spec
/// holds), so that equal values hash equally.
fn hash_f64<H: Hasher>(v: f64, state: &mut H) {
    (v + 0.0).to_bits().hash(state);
}

/// One description of what is done to every decoded image.
#[pyclass(name = "ImageSpec", module = "ferrofeed._core", frozen, eq, hash)]
#[derive(Clone, Copy, PartialEq)]
pub(crate) struct PyImageSpec(pub(crate) ImageSpec);

impl Hash for PyImageSpec {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let s = &self.0;
        (s.size, s.resize_shorter, s.crop, s.flip).hash(state);
        for v in [s.scale.0, s.scale.1, s.ratio.0, s.ratio.1] {
            hash_f64(v, state);
        }
        (s.mode.name(), s.dct_scaling, s.crop_decode).hash(state);
    }
}

#[pymethods]
impl PyImageSpec {
    #[new]
    #[pyo3(signature = (
        *, size=None, resize_shorter=None, crop=None, flip=None, scale=(0.08, 1.0),
        ratio=(0.75, 4.0 / 3.0), mode="RGB", dct_scaling=true, crop_decode=true
    ), text_signature = "(*, size=None, resize_shorter=None, crop=None, flip=False, \
        scale=(0.08, 1.0), ratio=(0.75, 1.3333333333333333), mode='RGB', dct_scaling=True, \
        crop_decode=True)")]
    #[allow(clippy::too_many_arguments)] // the image keywords
    fn new(
        size: Option<&Bound<'_, PyAny>>,
        resize_shorter: Option<usize>,
        crop: Option<&Bound<'_, PyAny>>,
        flip: Option<&Bound<'_, PyAny>>,
        scale: (f64, f64),
        ratio: (f64, f64),
        mode: &str,
        dct_scaling: bool,
        crop_decode: bool,
    ) -> PyResult<Self> {
        let args = ImageArgs {
            size,
            resize_shorter,
            crop,
            flip,
            scale,
            ratio,
            mode,
            dct_scaling,
            crop_decode,
        };
        Ok(Self(args.parse()?))
    }

    /// The output `(height, width)`, or `None` (the size after the crop).
    #[getter]
    fn size(&self) -> Option<(usize, usize)> {
        self.0.size
    }

    /// The length of the shorter side after the first resize, or `None`.
    #[getter]
    fn resize_shorter(&self) -> Option<usize> {
        self.0.resize_shorter
    }

    /// `(height, width)` of a center crop, `"random"`, or `None`.
    #[getter]
    fn crop<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self.0.crop {
            None => Ok(py.None().into_bound(py)),
            Some(CropSpec::Random) => "random".into_bound_py_any(py),
            Some(CropSpec::Center { height, width }) => (height, width).into_bound_py_any(py),
        }
    }

    /// `False`, `True` or `"random"`.
    #[getter]
    fn flip<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self.0.flip {
            FlipSpec::Never => false.into_bound_py_any(py),
            FlipSpec::Always => true.into_bound_py_any(py),
            FlipSpec::Random => "random".into_bound_py_any(py),
        }
    }

    /// Area fraction bounds of a random crop.
    #[getter]
    fn scale(&self) -> (f64, f64) {
        self.0.scale
    }

    /// Aspect ratio bounds of a random crop.
    #[getter]
    fn ratio(&self) -> (f64, f64) {
        self.0.ratio
    }

    /// `"RGB"` or `"L"`.
    #[getter]
    fn mode(&self) -> &'static str {
        self.0.mode.name()
    }

    /// Whether a JPEG may be decoded at a reduced n/8 scale.
    #[getter]
    fn dct_scaling(&self) -> bool {
        self.0.dct_scaling
    }

    /// Whether only the part of an image the output reads is decoded.
    #[getter]
    fn crop_decode(&self) -> bool {
        self.0.crop_decode
    }

    /// The keywords that rebuild the spec (`pickle` and `copy` use them).
    fn __getnewargs_ex__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyTuple>, Bound<'py, PyDict>)> {
        let py = slf.py();
        let kwargs = PyDict::new(py);
        for name in [
            "size",
            "resize_shorter",
            "crop",
            "flip",
            "scale",
            "ratio",
            "mode",
            "dct_scaling",
            "crop_decode",
        ] {
            kwargs.set_item(name, slf.getattr(name)?)?;
        }
        Ok((PyTuple::empty(py), kwargs))
    }

    fn __repr__(&self) -> String {
        format!("ImageSpec({})", self.0.keywords())
    }
}

/// How a batch of images is laid out: `NHWC`/`NCHW`, `uint8`/`float32`,
/// and an optional per-channel normalization.
#[pyclass(name = "BatchLayout", module = "ferrofeed._core", frozen, eq, hash)]
#[derive(Clone, Copy, PartialEq)]
pub(crate) struct PyBatchLayout(pub(crate) Layout);

impl Hash for PyBatchLayout {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (self.0.chw, self.0.float).hash(state);
        if let Some((mean, std)) = self.0.normalize {
            for v in mean.into_iter().chain(std) {
                hash_f64(f64::from(v), state);
            }
        }
    }
}

#[pymethods]
impl PyBatchLayout {
    #[new]
    #[pyo3(signature = (*, layout="NHWC", dtype="uint8", normalize=None))]
    #[allow(clippy::needless_pass_by_value)] // pyo3 extracts the lists as owned
    fn new(layout: &str, dtype: &str, normalize: Option<(Vec<f32>, Vec<f32>)>) -> PyResult<Self> {
        let normalize = normalize
            .as_ref()
            .map(|(mean, std)| (mean.as_slice(), std.as_slice()));
        Ok(Self(Layout::from_names(layout, dtype, normalize)?))
    }

    /// `"NHWC"` or `"NCHW"`.
    #[getter]
    fn layout(&self) -> &'static str {
        self.0.layout_name()
    }

    /// `"uint8"` or `"float32"`.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.0.dtype_name()
    }

    /// `(mean, std)`, three values each, or `None`.
    #[getter]
    #[allow(clippy::type_complexity)] // two RGB triples
    fn normalize(&self) -> Option<((f64, f64, f64), (f64, f64, f64))> {
        let triple = |v: [f32; 3]| {
            (
                f32_as_written(v[0]),
                f32_as_written(v[1]),
                f32_as_written(v[2]),
            )
        };
        self.0
            .normalize
            .map(|(mean, std)| (triple(mean), triple(std)))
    }

    /// The keywords that rebuild the layout (`pickle` and `copy` use them).
    fn __getnewargs_ex__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyTuple>, Bound<'py, PyDict>)> {
        let py = slf.py();
        let kwargs = PyDict::new(py);
        for name in ["layout", "dtype", "normalize"] {
            kwargs.set_item(name, slf.getattr(name)?)?;
        }
        Ok((PyTuple::empty(py), kwargs))
    }

    fn __repr__(&self) -> String {
        format!("BatchLayout({})", self.0.keywords())
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyImageSpec>()?;
    m.add_class::<PyBatchLayout>()?;
    Ok(())
}
