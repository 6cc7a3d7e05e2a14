//! The one description of an image transform ([`ImageSpec`]) and of a
//! batch's layout ([`Layout`], named by [`Layout::from_names`]), validated
//! once, here, with one set of error messages ([`SpecError`]).
//!
//! Every entry point that decodes images takes these: `io.decode_image`,
//! `io.load_images`, `ops.decode_image`, `ops.collate` and the
//! `DataLoader`'s batch op (the Python bindings only turn Python objects
//! into the fields). A spec holds no seed: [`ImageSpec::transform`] makes
//! the [`Transform`] of one image from it and that image's seed.
//!
//! # Example
//!
//! ```
//! use ferrofeed::image::spec::{CropSpec, FlipSpec, ImageSpec};
//! use ferrofeed::image::SpecError;
//! use ferrofeed::image::{Crop, Flip};
//!
//! // torchvision's RandomResizedCrop(224) + RandomHorizontalFlip().
//! let spec = ImageSpec {
//!     size: Some((224, 224)),
//!     crop: Some(CropSpec::Random),
//!     flip: FlipSpec::Random,
//!     ..ImageSpec::default()
//! }
//! .validated()?;
//! let t = spec.transform(7);
//! assert!(matches!(t.crop, Some(Crop::RandomResized { seed: 7, .. })));
//! assert_eq!(t.flip, Flip::Random { seed: 7 });
//!
//! let no_size = ImageSpec { crop: Some(CropSpec::Random), ..ImageSpec::default() };
//! assert_eq!(no_size.validated(), Err(SpecError::RandomCropNeedsSize));
//! # Ok::<(), SpecError>(())
//! ```

use std::fmt::Write as _;

use super::batch::{batch_shape, Layout};
use super::error::SpecError;
use super::{ColorMode, Crop, Flip, Transform};

/// torchvision's `RandomResizedCrop` area fraction bounds.
pub const DEFAULT_SCALE: (f64, f64) = (0.08, 1.0);

/// torchvision's `RandomResizedCrop` aspect ratio bounds.
pub const DEFAULT_RATIO: (f64, f64) = (3.0 / 4.0, 4.0 / 3.0);

/// The crop of an [`ImageSpec`]: [`Crop`] without its seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CropSpec {
    /// torchvision's `CenterCrop((height, width))`.
    Center {
        /// Crop height.
        height: usize,
        /// Crop width.
        width: usize,
    },
    /// torchvision's `RandomResizedCrop`, within [`ImageSpec::scale`] and
    /// [`ImageSpec::ratio`]; needs [`ImageSpec::size`].
    Random,
}

/// The mirroring of an [`ImageSpec`]: [`Flip`] without its seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FlipSpec {
    /// Never mirrored.
    #[default]
    Never,
    /// Always mirrored.
    Always,
    /// torchvision's `RandomHorizontalFlip()`: mirrored with probability 1/2.
    Random,
}

/// What to do with each decoded image: the keywords `size`,
/// `resize_shorter`, `crop`, `flip`, `scale`, `ratio`, `mode`,
/// `dct_scaling` and `crop_decode` of every image entry point, as one value.
///
/// It maps onto [`Transform`] ([`ImageSpec::transform`]) once an image's
/// seed is known. Build it with struct syntax over [`ImageSpec::default`]
/// and check it with [`ImageSpec::validated`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ImageSpec {
    /// Final `(height, width)`.
    pub size: Option<(usize, usize)>,
    /// Resize so that the shorter side has this length first.
    pub resize_shorter: Option<usize>,
    /// A center or random resized crop.
    pub crop: Option<CropSpec>,
    /// Mirror left-right at the end.
    pub flip: FlipSpec,
    /// Area fraction bounds of a random crop.
    pub scale: (f64, f64),
    /// Aspect ratio bounds of a random crop.
    pub ratio: (f64, f64),
    /// RGB or grayscale output.
    pub mode: ColorMode,
    /// See [`Transform::dct_scaling`].
    pub dct_scaling: bool,
    /// See [`Transform::crop_decode`].
    pub crop_decode: bool,
}

impl Default for ImageSpec {
    /// The image as decoded (RGB, any size), with torchvision's random crop
    /// bounds.
    fn default() -> Self {
        Self {
            size: None,
            resize_shorter: None,
            crop: None,
            flip: FlipSpec::Never,
            scale: DEFAULT_SCALE,
            ratio: DEFAULT_RATIO,
            mode: ColorMode::Rgb,
            dct_scaling: true,
            crop_decode: true,
        }
    }
}

/// `(height, width)` as the user would write it back: `n` for a square.
fn size_text((h, w): (usize, usize)) -> String {
    if h == w {
        h.to_string()
    } else {
        format!("({h}, {w})")
    }
}

impl ImageSpec {
    /// The spec, if every option is valid: sizes positive, a random crop
    /// with a `size`, `0 < scale.0 <= scale.1 <= 1`, `0 < ratio.0 <= ratio.1`
    /// (both checked whether or not the crop is random).
    ///
    /// # Errors
    ///
    /// The [`SpecError`] of the first invalid option.
    pub fn validated(self) -> Result<Self, SpecError> {
        if let Some(size) = self.size.filter(|&(h, w)| h == 0 || w == 0) {
            return Err(SpecError::NotPositive {
                what: "size",
                value: size_text(size),
            });
        }
        if self.resize_shorter == Some(0) {
            return Err(SpecError::NotPositive {
                what: "resize_shorter",
                value: "0".to_owned(),
            });
        }
        match self.crop {
            Some(CropSpec::Center { height, width }) if height == 0 || width == 0 => {
                return Err(SpecError::NotPositive {
                    what: "crop",
                    value: size_text((height, width)),
                })
            }
            Some(CropSpec::Random) if self.size.is_none() => {
                return Err(SpecError::RandomCropNeedsSize)
            }
            _ => {}
        }
        let ordered = |(a, b): (f64, f64)| a.is_finite() && b.is_finite() && a > 0.0 && a <= b;
        if !ordered(self.scale) || self.scale.1 > 1.0 {
            return Err(SpecError::Scale(self.scale));
        }
        if !ordered(self.ratio) {
            return Err(SpecError::Ratio(self.ratio));
        }
        Ok(self)
    }

    /// Whether anything is drawn at random (the crop or the flip).
    pub fn is_random(&self) -> bool {
        self.crop == Some(CropSpec::Random) || self.flip == FlipSpec::Random
    }

    /// The transform of one image whose random draws (crop and flip) come
    /// from `seed`.
    pub fn transform(&self, seed: u64) -> Transform {
        Transform {
            mode: self.mode,
            resize_shorter: self.resize_shorter,
            crop: self.crop.map(|c| match c {
                CropSpec::Center { height, width } => Crop::Center { height, width },
                CropSpec::Random => Crop::RandomResized {
                    scale: self.scale,
                    ratio: self.ratio,
                    seed,
                },
            }),
            size: self.size,
            flip: match self.flip {
                FlipSpec::Never => Flip::Never,
                FlipSpec::Always => Flip::Always,
                FlipSpec::Random => Flip::Random { seed },
            },
            dct_scaling: self.dct_scaling,
            crop_decode: self.crop_decode,
        }
    }

    /// The `(height, width, channels)` of every image, if the spec fixes
    /// one (a `size`, or a center crop without one): what a batch needs.
    pub fn batch_shape(&self) -> Option<(usize, usize, usize)> {
        batch_shape(&self.transform(0))
    }

    /// The options that differ from [`ImageSpec::default`], as Python
    /// keywords (`size=(224, 224), crop='random'`): what a repr shows.
    pub fn keywords(&self) -> String {
        let d = Self::default();
        let mut out = Vec::new();
        if let Some((h, w)) = self.size {
            out.push(format!("size=({h}, {w})"));
        }
        if let Some(n) = self.resize_shorter {
            out.push(format!("resize_shorter={n}"));
        }
        match self.crop {
            None => {}
            Some(CropSpec::Center { height, width }) => {
                out.push(format!("crop=({height}, {width})"));
            }
            Some(CropSpec::Random) => out.push("crop='random'".to_owned()),
        }
        match self.flip {
            FlipSpec::Never => {}
            FlipSpec::Always => out.push("flip=True".to_owned()),
            FlipSpec::Random => out.push("flip='random'".to_owned()),
        }
        if self.scale != d.scale {
            out.push(format!("scale=({:?}, {:?})", self.scale.0, self.scale.1));
        }
        if self.ratio != d.ratio {
            out.push(format!("ratio=({:?}, {:?})", self.ratio.0, self.ratio.1));
        }
        if self.mode != d.mode {
            out.push(format!("mode='{}'", self.mode.name()));
        }
        if !self.dct_scaling {
            out.push("dct_scaling=False".to_owned());
        }
        if !self.crop_decode {
            out.push("crop_decode=False".to_owned());
        }
        out.join(", ")
    }
}

impl ColorMode {
    /// The mode named `"RGB"`, or `"L"` (also `"gray"`).
    ///
    /// # Errors
    ///
    /// [`SpecError::Mode`] for any other name.
    pub fn from_name(name: &str) -> Result<Self, SpecError> {
        match name {
            "RGB" => Ok(ColorMode::Rgb),
            "L" | "gray" => Ok(ColorMode::Gray),
            other => Err(SpecError::Mode(other.to_owned())),
        }
    }

    /// The mode's name (Pillow's): `"RGB"` or `"L"`.
    pub fn name(self) -> &'static str {
        match self {
            ColorMode::Rgb => "RGB",
            ColorMode::Gray => "L",
        }
    }
}

impl Layout {
    /// The layout named by `ops.collate`'s keywords: `layout` `"NHWC"` or
    /// `"NCHW"`, `dtype` `"uint8"` or `"float32"`, and for `float32` an
    /// optional per-channel `(mean, std)` of 1 (every channel) or 3 values
    /// each, finite, no std 0.
    ///
    /// # Errors
    ///
    /// The [`SpecError`] of the first invalid option.
    pub fn from_names(
        layout: &str,
        dtype: &str,
        normalize: Option<(&[f32], &[f32])>,
    ) -> Result<Self, SpecError> {
        let chw = match layout {
            "NHWC" => false,
            "NCHW" => true,
            other => return Err(SpecError::LayoutName(other.to_owned())),
        };
        let float = match dtype {
            "uint8" => false,
            "float32" => true,
            other => return Err(SpecError::DType(other.to_owned())),
        };
        let normalize = match normalize {
            None => None,
            Some(_) if !float => return Err(SpecError::NormalizeNeedsFloat),
            Some((mean, std)) => {
                let three = |v: &[f32], what: &'static str| -> Result<[f32; 3], SpecError> {
                    let out = match *v {
                        [a] => [a, a, a],
                        [a, b, c] => [a, b, c],
                        _ => return Err(SpecError::NormalizeLength { what, len: v.len() }),
                    };
                    if out
                        .iter()
                        .any(|x| !x.is_finite() || (what == "std" && *x == 0.0))
                    {
                        return Err(SpecError::NormalizeValue {
                            what,
                            values: v.to_vec(),
                        });
                    }
                    Ok(out)
                };
                Some((three(mean, "mean")?, three(std, "std")?))
            }
        };
        Ok(Layout {
            chw,
            float,
            normalize,
        })
    }

    /// `"NHWC"` or `"NCHW"`.
    pub fn layout_name(&self) -> &'static str {
        if self.chw {
            "NCHW"
        } else {
            "NHWC"
        }
    }

    /// `"uint8"` or `"float32"`.
    pub fn dtype_name(&self) -> &'static str {
        if self.float {
            "float32"
        } else {
            "uint8"
        }
    }

    /// The options that differ from [`Layout::default`], as Python keywords
    /// (`layout='NCHW', dtype='float32'`): what a repr shows.
    pub fn keywords(&self) -> String {
        let mut out = Vec::new();
        if self.chw {
            out.push(format!("layout='{}'", self.layout_name()));
        }
        if self.float {
            out.push(format!("dtype='{}'", self.dtype_name()));
        }
        if let Some((mean, std)) = self.normalize {
            let mut s = String::from("normalize=(");
            for (k, v) in [mean, std].iter().enumerate() {
                let sep = if k == 0 { "" } else { ", " };
                let _ = write!(s, "{sep}({:?}, {:?}, {:?})", v[0], v[1], v[2]);
            }
            s.push(')');
            out.push(s);
        }
        out.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random_crop() -> ImageSpec {
        ImageSpec {
            size: Some((8, 6)),
            crop: Some(CropSpec::Random),
            ..ImageSpec::default()
        }
    }

    #[test]
    fn default_is_valid_and_maps_to_the_default_transform() {
        let spec = ImageSpec::default().validated().unwrap();
        assert_eq!(spec.transform(5), Transform::default());
        assert!(!spec.is_random());
        assert_eq!(spec.batch_shape(), None);
        assert_eq!(spec.keywords(), "");
    }

    #[test]
    fn every_field_maps_onto_the_transform() {
        let spec = ImageSpec {
            size: Some((8, 6)),
            resize_shorter: Some(20),
            crop: Some(CropSpec::Center {
                height: 10,
                width: 12,
            }),
            flip: FlipSpec::Always,
            scale: (0.5, 0.9),
            ratio: (0.5, 2.0),
            mode: ColorMode::Gray,
            dct_scaling: false,
            crop_decode: false,
        }
        .validated()
        .unwrap();
        let t = spec.transform(3);
        assert_eq!(t.mode, ColorMode::Gray);
        assert_eq!(t.resize_shorter, Some(20));
        assert_eq!(
            t.crop,
            Some(Crop::Center {
                height: 10,
                width: 12
            })
        );
        assert_eq!(t.size, Some((8, 6)));
        assert_eq!(t.flip, Flip::Always);
        assert!(!t.dct_scaling && !t.crop_decode);
        assert_eq!(t.seed(), None);
        assert!(!spec.is_random());
        assert_eq!(spec.batch_shape(), Some((8, 6, 1)));
        assert_eq!(
            spec.keywords(),
            "size=(8, 6), resize_shorter=20, crop=(10, 12), flip=True, scale=(0.5, 0.9), \
             ratio=(0.5, 2.0), mode='L', dct_scaling=False, crop_decode=False"
        );
    }

    #[test]
    fn random_crop_and_flip_draw_from_the_images_seed() {
        let spec = ImageSpec {
            flip: FlipSpec::Random,
            scale: (0.25, 0.5),
            ..random_crop()
        };
        assert!(spec.is_random());
        let t = spec.transform(42);
        assert_eq!(
            t.crop,
            Some(Crop::RandomResized {
                scale: (0.25, 0.5),
                ratio: DEFAULT_RATIO,
                seed: 42
            })
        );
        assert_eq!(t.flip, Flip::Random { seed: 42 });
        assert_eq!(t.seed(), Some(42));
        // `Transform::with_seed` and a new `transform(seed)` agree.
        assert_eq!(t.with_seed(9), spec.transform(9));
        let flip_only = ImageSpec {
            flip: FlipSpec::Random,
            ..ImageSpec::default()
        };
        assert!(flip_only.is_random());
        assert_eq!(flip_only.transform(4).flip, Flip::Random { seed: 4 });
    }

    #[test]
    fn batch_shape_is_the_size_or_else_a_center_crop() {
        assert_eq!(random_crop().batch_shape(), Some((8, 6, 3)));
        let center = ImageSpec {
            crop: Some(CropSpec::Center {
                height: 4,
                width: 5,
            }),
            ..ImageSpec::default()
        };
        assert_eq!(center.batch_shape(), Some((4, 5, 3)));
        let shorter = ImageSpec {
            resize_shorter: Some(9),
            ..ImageSpec::default()
        };
        assert_eq!(shorter.batch_shape(), None);
    }

    #[test]
    fn each_bad_option_has_its_own_error() {
        let not_positive = |what: &'static str, value: &str| SpecError::NotPositive {
            what,
            value: value.to_owned(),
        };
        let cases = [
            (
                ImageSpec {
                    size: Some((0, 4)),
                    ..ImageSpec::default()
                },
                not_positive("size", "(0, 4)"),
            ),
            (
                ImageSpec {
                    size: Some((0, 0)),
                    ..ImageSpec::default()
                },
                not_positive("size", "0"),
            ),
            (
                ImageSpec {
                    resize_shorter: Some(0),
                    ..ImageSpec::default()
                },
                not_positive("resize_shorter", "0"),
            ),
            (
                ImageSpec {
                    crop: Some(CropSpec::Center {
                        height: 3,
                        width: 0,
                    }),
                    ..ImageSpec::default()
                },
                not_positive("crop", "(3, 0)"),
            ),
            (
                ImageSpec {
                    size: None,
                    ..random_crop()
                },
                SpecError::RandomCropNeedsSize,
            ),
            (
                ImageSpec {
                    scale: (0.5, 0.25),
                    ..ImageSpec::default()
                },
                SpecError::Scale((0.5, 0.25)),
            ),
            (
                ImageSpec {
                    scale: (0.5, 1.5),
                    ..random_crop()
                },
                SpecError::Scale((0.5, 1.5)),
            ),
            (
                ImageSpec {
                    scale: (0.0, 1.0),
                    ..ImageSpec::default()
                },
                SpecError::Scale((0.0, 1.0)),
            ),
            (
                ImageSpec {
                    ratio: (2.0, 1.0),
                    ..ImageSpec::default()
                },
                SpecError::Ratio((2.0, 1.0)),
            ),
            (
                ImageSpec {
                    ratio: (f64::NAN, 1.0),
                    ..ImageSpec::default()
                },
                SpecError::Ratio((f64::NAN, 1.0)),
            ),
        ];
        for (spec, want) in cases {
            let got = spec.validated().unwrap_err();
            // NaN != NaN: compare the messages, which say the same.
            assert_eq!(got.to_string(), want.to_string(), "{spec:?}");
        }
        assert_eq!(
            not_positive("size", "(0, 4)").to_string(),
            "size must be positive, not (0, 4)"
        );
        assert_eq!(
            SpecError::Scale((0.5, 0.25)).to_string(),
            "scale is (min, max) with 0 < min <= max <= 1, not (0.5, 0.25)"
        );
        // Bounds that touch are fine: a fixed area, a fixed ratio.
        ImageSpec {
            scale: (1.0, 1.0),
            ratio: (1.0, 1.0),
            ..random_crop()
        }
        .validated()
        .unwrap();
    }

    #[test]
    fn mode_names() {
        assert_eq!(ColorMode::from_name("RGB"), Ok(ColorMode::Rgb));
        assert_eq!(ColorMode::from_name("L"), Ok(ColorMode::Gray));
        assert_eq!(ColorMode::from_name("gray"), Ok(ColorMode::Gray));
        assert_eq!(
            ColorMode::from_name("rgb").unwrap_err().to_string(),
            "mode is \"RGB\" or \"L\" (grayscale), not \"rgb\""
        );
        assert_eq!(ColorMode::Gray.name(), "L");
        assert_eq!(ColorMode::Rgb.name(), "RGB");
    }

    #[test]
    fn layout_from_names() {
        assert_eq!(
            Layout::from_names("NHWC", "uint8", None),
            Ok(Layout::default())
        );
        let l = Layout::from_names("NCHW", "float32", Some((&[0.5], &[0.25, 0.5, 1.0]))).unwrap();
        assert!(l.chw && l.float);
        assert_eq!(l.normalize, Some(([0.5; 3], [0.25, 0.5, 1.0])));
        assert_eq!((l.layout_name(), l.dtype_name()), ("NCHW", "float32"));
        assert_eq!(
            l.keywords(),
            "layout='NCHW', dtype='float32', normalize=((0.5, 0.5, 0.5), (0.25, 0.5, 1.0))"
        );
        assert_eq!(Layout::default().keywords(), "");
        assert_eq!(
            (
                Layout::default().layout_name(),
                Layout::default().dtype_name()
            ),
            ("NHWC", "uint8")
        );
    }

    #[test]
    fn each_bad_layout_option_has_its_own_error() {
        /// `layout`, `dtype`, `normalize`, and the error they give.
        type Case<'a> = (&'a str, &'a str, Option<(&'a [f32], &'a [f32])>, SpecError);
        let one: &[f32] = &[1.0];
        let cases: [Case<'_>; 7] = [
            ("HWC", "uint8", None, SpecError::LayoutName("HWC".into())),
            ("NHWC", "float64", None, SpecError::DType("float64".into())),
            (
                "NHWC",
                "uint8",
                Some((one, one)),
                SpecError::NormalizeNeedsFloat,
            ),
            (
                "NHWC",
                "float32",
                Some((&[0.0, 1.0], one)),
                SpecError::NormalizeLength {
                    what: "mean",
                    len: 2,
                },
            ),
            (
                "NHWC",
                "float32",
                Some((one, &[])),
                SpecError::NormalizeLength {
                    what: "std",
                    len: 0,
                },
            ),
            (
                "NHWC",
                "float32",
                Some((one, &[1.0, 0.0, 1.0])),
                SpecError::NormalizeValue {
                    what: "std",
                    values: vec![1.0, 0.0, 1.0],
                },
            ),
            (
                "NHWC",
                "float32",
                Some((&[f32::INFINITY], one)),
                SpecError::NormalizeValue {
                    what: "mean",
                    values: vec![f32::INFINITY],
                },
            ),
        ];
        for (layout, dtype, normalize, want) in cases {
            assert_eq!(
                Layout::from_names(layout, dtype, normalize),
                Err(want),
                "{layout} {dtype} {normalize:?}"
            );
        }
        assert_eq!(
            SpecError::NormalizeValue {
                what: "std",
                values: vec![0.0]
            }
            .to_string(),
            "normalize std must be finite and not 0, not [0.0]"
        );
        assert_eq!(
            SpecError::NormalizeValue {
                what: "mean",
                values: vec![f32::NAN]
            }
            .to_string(),
            "normalize mean must be finite, not [NaN]"
        );
    }
}
