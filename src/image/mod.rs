//! Image kernels: decode JPEG, PNG, WebP and BMP to 8-bit RGB or grayscale,
//! apply EXIF orientation, resize, crop and flip, writing straight into a
//! caller-given slot of a batch buffer. Pure Rust API, no GIL anywhere.
//!
//! # The one-resample design
//!
//! A [`Transform`] (shorter-side resize, center or random-resized crop,
//! final size, flip) is planned up front from the image header, and every
//! geometric step is folded into a *single* resample of one source
//! rectangle into the output slot (antialiased bilinear, as Pillow's
//! `Image.resize(..., BILINEAR)` and torchvision's `antialias=True`). For a
//! JPEG much larger than its output, libjpeg-turbo decodes at the smallest
//! `n/8` scale that still covers the output (DCT-domain scaling), so a
//! 4000 x 3000 photo bound for 224 x 224 is decoded at 1/8 size. And since
//! the crop is drawn before the decode, libjpeg-turbo decodes only the
//! window of the JPEG that the resample reads (its rows and iMCU columns;
//! [`Transform::crop_decode`]); of a PNG, only the rows down to the
//! window's last are decoded.
//!
//! # JPEG decoders
//!
//! With the `turbojpeg` feature (on by default, and in the wheel), JPEGs
//! are decoded by libjpeg-turbo, built from source (cmake and nasm). Without
//! it, by zune-jpeg, pure Rust: the same output within IDCT rounding, but no
//! DCT-domain scaling (every JPEG is decoded at full size, then resampled),
//! no lossless or arithmetic-coded JPEGs, and slower (see BENCHMARKS.md).
//!
//! # Errors, never panics
//!
//! Empty, truncated, corrupt, unsupported or oversized input is an
//! [`ImageError`] naming the source (a path, or `item 3`). The decoders are
//! additionally run under `catch_unwind`, so a bug in one of them becomes an
//! error for that item, not a crash of the loader.
//!
//! # Example
//!
//! ```
//! use ferrofeed::image::{decode, ColorMode, Transform};
//!
//! // A 1x1 PNG (red).
//! let png = [
//!     0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44,
//!     0x52, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x02, 0x00, 0x00, 0x00, 0x90,
//!     0x77, 0x53, 0xde, 0x00, 0x00, 0x00, 0x0c, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8,
//!     0xcf, 0xc0, 0x00, 0x00, 0x03, 0x01, 0x01, 0x00, 0xc9, 0xfe, 0x92, 0xef, 0x00, 0x00, 0x00,
//!     0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
//! ];
//! let t = Transform { size: Some((2, 3)), ..Transform::default() };
//! let img = decode(&png, "red.png", &t)?;
//! assert_eq!((img.height, img.width, img.channels), (2, 3, 3));
//! assert!(img.data.chunks(3).all(|p| p == [255, 0, 0]));
//! assert!(decode(b"not an image", "x.png", &t).is_err());
//! # Ok::<(), ferrofeed::image::ImageError>(())
//! ```

// Image sizes are bounded by MAX_PIXELS (< 2^28), so the casts between
// pixel counts and f64 in the geometry are exact, and the f64 values cast
// back are non-negative by construction.
#![allow(clippy::cast_precision_loss, clippy::cast_sign_loss)]

pub mod batch;
mod buffer;
mod codecs;
mod error;
mod format;
mod ops;
mod plan;
pub mod spec;
pub mod synth;
#[cfg(test)]
mod tests;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

pub use codecs::ImageInfo;
pub use error::{ImageError, SpecError};
pub use format::Format;

/// The default pixel budget of one image (Pillow's decompression-bomb error
/// limit): headers announcing more pixels are refused before any
/// allocation. See [`set_max_pixels`].
pub const MAX_PIXELS: usize = 178_956_970;

/// The largest pixel budget [`set_max_pixels`] accepts (`2^32`): pixel
/// counts then stay exact in the `f64` geometry of the resampler.
pub const MAX_PIXELS_CEILING: usize = 1 << 32;

static PIXEL_BUDGET: AtomicUsize = AtomicUsize::new(MAX_PIXELS);

/// The pixel budget per image, for every decode in this process: an image
/// whose header announces more pixels (width times height) is an
/// [`ImageError::TooLarge`], before anything is allocated for it.
pub fn max_pixels() -> usize {
    PIXEL_BUDGET.load(Ordering::Relaxed)
}

/// Sets the pixel budget per image (see [`max_pixels`]; default
/// [`MAX_PIXELS`]) for every later decode in this process, and returns the
/// previous one.
///
/// # Errors
///
/// [`ImageError::InvalidTransform`] when `pixels` is 0 or above
/// [`MAX_PIXELS_CEILING`].
pub fn set_max_pixels(pixels: usize) -> Result<usize, ImageError> {
    if pixels == 0 || pixels > MAX_PIXELS_CEILING {
        return Err(ImageError::InvalidTransform {
            reason: format!(
                "the pixel budget must be positive and at most {MAX_PIXELS_CEILING}, not {pixels}"
            ),
        });
    }
    Ok(PIXEL_BUDGET.swap(pixels, Ordering::Relaxed))
}

/// The pixel layout of the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ColorMode {
    /// 3 channels, R, G, B (alpha is dropped, as Pillow's `convert("RGB")`).
    #[default]
    Rgb,
    /// 1 channel of luma (Pillow's `convert("L")` weights).
    Gray,
}

impl ColorMode {
    /// Channels per pixel: 3 or 1.
    pub fn channels(self) -> usize {
        match self {
            ColorMode::Rgb => 3,
            ColorMode::Gray => 1,
        }
    }
}

/// A crop, applied after the shorter-side resize and before the final
/// resize to [`Transform::size`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Crop {
    /// torchvision's `CenterCrop((height, width))`: offsets rounded half to
    /// even; a crop larger than the image pads it with zeros.
    Center {
        /// Crop height.
        height: usize,
        /// Crop width.
        width: usize,
    },
    /// torchvision's `RandomResizedCrop`: an area fraction in `scale` and an
    /// aspect ratio (log-uniform) in `ratio`, 10 attempts, then a center
    /// crop; reproducible from `seed`. Needs [`Transform::size`].
    RandomResized {
        /// Area fraction bounds, torchvision's default `(0.08, 1.0)`.
        scale: (f64, f64),
        /// Aspect ratio bounds, torchvision's default `(3/4, 4/3)`.
        ratio: (f64, f64),
        /// The seed of the crop's random draws.
        seed: u64,
    },
}

impl Crop {
    /// A random resized crop with torchvision's default bounds.
    pub fn random_resized(seed: u64) -> Self {
        Crop::RandomResized {
            scale: (0.08, 1.0),
            ratio: (3.0 / 4.0, 4.0 / 3.0),
            seed,
        }
    }
}

/// Horizontal mirroring, the last step of a [`Transform`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Flip {
    /// Never mirrored.
    #[default]
    Never,
    /// Always mirrored.
    Always,
    /// torchvision's `RandomHorizontalFlip()`: mirrored with probability
    /// 1/2, drawn from `seed` (the image's seed, the one its random crop
    /// draws from: [`Transform::with_seed`] sets both), through
    /// [`crate::seed::Stream::Flip`], so the flip does not follow the crop.
    Random {
        /// The image's seed.
        seed: u64,
    },
}

impl Flip {
    /// Whether the image is mirrored.
    pub fn applies(self) -> bool {
        match self {
            Flip::Never => false,
            Flip::Always => true,
            Flip::Random { seed } => {
                crate::seed::mix(seed, 0, 0, crate::seed::Stream::Flip) >> 63 == 1
            }
        }
    }
}

impl From<bool> for Flip {
    fn from(flip: bool) -> Self {
        if flip {
            Flip::Always
        } else {
            Flip::Never
        }
    }
}

/// What to do with a decoded image, in this order: EXIF orientation,
/// shorter-side resize, crop, resize to `size`, horizontal flip.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transform {
    /// Output pixel layout.
    pub mode: ColorMode,
    /// Resize so that the shorter side has this length (the longer side
    /// scaled and truncated, as torchvision's `Resize(int)`).
    pub resize_shorter: Option<usize>,
    /// A crop.
    pub crop: Option<Crop>,
    /// Final `(height, width)`: the (cropped) image is resized to it.
    pub size: Option<(usize, usize)>,
    /// Mirror left-right at the end: never, always, or at random.
    pub flip: Flip,
    /// Let libjpeg-turbo decode at a reduced `n/8` scale when the output is
    /// much smaller (faster; slightly different from a full decode and
    /// resize). On by default; ignored by builds without the `turbojpeg`
    /// feature, which always decode at full size.
    pub dct_scaling: bool,
    /// Decode only the part of a JPEG that the output reads: libjpeg-turbo
    /// decodes just the rows and iMCU columns (8 to 32 pixels wide) of the
    /// source rectangle, plus the resize filter's reach and a small margin,
    /// at the `n/8` scale that `dct_scaling` picks; EXIF-rotated JPEGs
    /// included (the window is mapped to the stored orientation). Lossless
    /// and unusually subsampled JPEGs, which libjpeg-turbo cannot decode
    /// partially, WebP and BMP, and every JPEG in builds without the
    /// `turbojpeg` feature, are decoded whole. The pixels equal a full
    /// decode's (tested on real photos: PSNR >= 40 dB required, equal in
    /// practice). A non-interlaced PNG is read only down to the window's
    /// last row, and only the window's columns are kept (exactly the full
    /// decode's pixels); an interlaced one is decoded whole. On by default;
    /// `false` decodes every pixel.
    pub crop_decode: bool,
}

impl Transform {
    /// The transform for one image whose random draws come from `seed`:
    /// a [`Crop::RandomResized`]'s and a [`Flip::Random`]'s seed become
    /// `seed`; everything else is kept.
    #[must_use]
    pub fn with_seed(mut self, seed: u64) -> Self {
        if let Some(Crop::RandomResized { seed: s, .. }) = &mut self.crop {
            *s = seed;
        }
        if let Flip::Random { seed: s } = &mut self.flip {
            *s = seed;
        }
        self
    }

    /// The seed of the random draws, if any is random (a random crop's, or
    /// else a random flip's).
    pub fn seed(&self) -> Option<u64> {
        match (self.crop, self.flip) {
            (Some(Crop::RandomResized { seed, .. }), _) | (_, Flip::Random { seed }) => Some(seed),
            _ => None,
        }
    }
}

impl Default for Transform {
    fn default() -> Self {
        Self {
            mode: ColorMode::Rgb,
            resize_shorter: None,
            crop: None,
            size: None,
            flip: Flip::Never,
            dct_scaling: true,
            crop_decode: true,
        }
    }
}

/// A decoded image, HWC, 8-bit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedImage {
    /// Rows.
    pub height: usize,
    /// Columns.
    pub width: usize,
    /// 3 (RGB) or 1 (gray).
    pub channels: usize,
    /// `height * width * channels` bytes, row-major, interleaved.
    pub data: Vec<u8>,
}

/// The image header and the output shape `(height, width, channels)` that
/// `transform` gives for it.
///
/// # Errors
///
/// As [`decode_into`], for the header only.
pub fn output_shape(
    data: &[u8],
    name: &str,
    transform: &Transform,
) -> Result<(ImageInfo, (usize, usize, usize)), ImageError> {
    guarded(name, || {
        let info = probe_inner(data)?;
        let (w, h) = info.oriented_size();
        let p = plan::plan(w, h, transform)?;
        Ok((info, (p.out_h, p.out_w, transform.mode.channels())))
    })
}

/// Reads the header: format, stored size, EXIF orientation.
///
/// # Errors
///
/// As [`decode_into`], for the header only.
pub fn probe(data: &[u8], name: &str) -> Result<ImageInfo, ImageError> {
    guarded(name, || probe_inner(data))
}

fn probe_inner(data: &[u8]) -> Result<ImageInfo, ImageError> {
    if data.is_empty() {
        return Err(ImageError::Empty {
            name: String::new(),
        });
    }
    let format = codecs::sniff(data).ok_or_else(|| ImageError::UnknownFormat {
        name: String::new(),
        magic: data
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(" "),
    })?;
    codecs::probe(data, format)
}

/// Runs `f`, turning a panic into [`ImageError::DecoderPanic`] and naming
/// the source in any error.
fn guarded<T>(name: &str, f: impl FnOnce() -> Result<T, ImageError>) -> Result<T, ImageError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(|e| e.named(name)),
        Err(payload) => Err(ImageError::DecoderPanic {
            name: name.to_owned(),
            reason: crate::panic::message(&*payload),
        }),
    }
}

/// Decodes `data` (named `name` in errors), applies `transform`, and writes
/// the result, HWC uint8, into `slot`, which must be exactly the output
/// size (see [`output_shape`]). Returns `(height, width, channels)`.
///
/// # Errors
///
/// [`ImageError`]: empty, unknown, corrupt, unsupported or oversized input,
/// an invalid transform, or a slot of the wrong size. `slot` may be partly
/// written when an error is returned.
pub fn decode_into(
    data: &[u8],
    name: &str,
    transform: &Transform,
    slot: &mut [u8],
) -> Result<(usize, usize, usize), ImageError> {
    guarded(name, || decode_inner(data, transform, slot))
}

/// [`decode_into`] a new buffer.
///
/// # Errors
///
/// As [`decode_into`].
pub fn decode(data: &[u8], name: &str, transform: &Transform) -> Result<DecodedImage, ImageError> {
    let (_, (h, w, c)) = output_shape(data, name, transform)?;
    let mut buf = vec![0u8; h * w * c];
    decode_into(data, name, transform, &mut buf)?;
    Ok(DecodedImage {
        height: h,
        width: w,
        channels: c,
        data: buf,
    })
}

/// Reads `path` and decodes it (errors name the path).
///
/// # Errors
///
/// [`ImageError::Io`] when the file cannot be read, else as [`decode`].
pub fn decode_file(path: &Path, transform: &Transform) -> Result<DecodedImage, ImageError> {
    let data = batch::read_file(path)?;
    decode(&data, &path.display().to_string(), transform)
}

fn decode_inner(
    data: &[u8],
    transform: &Transform,
    slot: &mut [u8],
) -> Result<(usize, usize, usize), ImageError> {
    let info = probe_inner(data)?;
    let (ow, oh) = info.oriented_size();
    let p = plan::plan(ow, oh, transform)?;
    let c = transform.mode.channels();
    let expected = p.out_w * p.out_h * c;
    if slot.len() != expected {
        return Err(ImageError::SlotSize {
            name: String::new(),
            len: slot.len(),
            expected,
            height: p.out_h,
            width: p.out_w,
            channels: c,
        });
    }
    let Some(decoded) = decode_window(data, &info, &p, transform, slot)? else {
        return Ok((p.out_h, p.out_w, c));
    };
    resample_window(decoded, &info, &p, transform, slot)?;
    Ok((p.out_h, p.out_w, c))
}

/// Decodes what the plan `p` reads of the image: straight into `slot` where
/// the output is the whole image as stored (then `None`), else the window
/// the resize reads, in the transform's mode (or RGBX), before orientation.
fn decode_window(
    data: &[u8],
    info: &ImageInfo,
    p: &plan::Plan,
    transform: &Transform,
    slot: &mut [u8],
) -> Result<Option<codecs::WindowPixels>, ImageError> {
    let (ow, oh) = info.oriented_size();
    let c = transform.mode.channels();
    let identity = info.orientation == 1
        && (p.out_w, p.out_h) == (ow, oh)
        && p.dst.width == ow
        && p.dst.height == oh
        && p.src.left == 0.0
        && p.src.top == 0.0;
    // The resize runs over 4-byte pixels faster than over 3-byte ones: a
    // JPEG decoded for a resize onto the whole RGB output comes as RGBX,
    // and the resampled pixels are packed into the slot (mirrored there
    // when flipped).
    let whole = p.dst.x == 0 && p.dst.y == 0 && (p.dst.width, p.dst.height) == (p.out_w, p.out_h);
    let padded = c == 3 && whole;
    // The decoded pixels in `mode` (or RGBX), before orientation: a buffer
    // holding the window of the whole (stored, maybe DCT-scaled) image.
    let decoded = match info.format {
        Format::Jpeg => {
            if identity {
                // One copy: libjpeg-turbo writes straight into the slot.
                codecs::decode_jpeg_into(data, 8, transform.mode, slot, ow * c)?;
                finish(slot, p, c, transform.flip);
                return Ok(None);
            }
            let num = if transform.dct_scaling && codecs::JPEG_DCT_SCALING {
                plan::jpeg_scale_num(p, ow, oh)
            } else {
                8
            };
            let want = jpeg_window(p, info, num, transform.crop_decode);
            codecs::decode_jpeg_window(data, num, transform.mode, want, padded)?
        }
        Format::Png if !identity => {
            // Only the rows down to the window's last are inflated and
            // unfiltered, and only the window is kept (exact: PNG is
            // lossless, and the window holds all the resample reads).
            let size = (info.width, info.height);
            let want = stored_window(p, info, size, transform.crop_decode, 0);
            codecs::decode_png_window(data, transform.mode, want)?
        }
        Format::Png | Format::Webp | Format::Bmp => {
            let px = decode_frame(data, info)?;
            if identity {
                ops::convert_channels(&px.data, px.channels, slot, c);
                finish(slot, p, c, transform.flip);
                return Ok(None);
            }
            let mut buf = buffer::scratch(px.width * px.height * c)?;
            ops::convert_channels(&px.data, px.channels, &mut buf, c);
            let all = codecs::Window {
                x: 0,
                y: 0,
                width: px.width,
                height: px.height,
            };
            codecs::WindowPixels {
                pixels: buf,
                channels: c,
                window: all,
                full: (px.width, px.height),
            }
        }
    };
    Ok(Some(decoded))
}

/// Orients the decoded window and resamples the plan's rectangle of it into
/// `slot`, mirrored as the transform says.
fn resample_window(
    decoded: codecs::WindowPixels,
    info: &ImageInfo,
    p: &plan::Plan,
    transform: &Transform,
    slot: &mut [u8],
) -> Result<(), ImageError> {
    let (ow, oh) = info.oriented_size();
    let c = transform.mode.channels();
    let codecs::WindowPixels {
        pixels,
        channels: pc,
        window: win,
        full,
    } = decoded;
    let (w, h) = (win.width, win.height);
    let (pixels, w, h) = if info.orientation == 1 {
        (pixels, w, h)
    } else {
        ops::orient(&pixels, w, h, pc, info.orientation)?
    };
    // Where the window lies in the oriented (maybe DCT-scaled) image.
    let origin = plan::box_to_oriented(
        plan::BoxU {
            x0: win.x,
            y0: win.y,
            x1: win.x + win.width,
            y1: win.y + win.height,
        },
        info.orientation,
        full.0,
        full.1,
    );
    let rect = scaled_rect(p, info.orientation, (ow, oh), full);
    let rect = plan::RectF {
        left: rect.left - origin.x0 as f64,
        top: rect.top - origin.y0 as f64,
        // The window holds the rectangle; keep float noise inside it.
        width: rect.width.min(w as f64 - (rect.left - origin.x0 as f64)),
        height: rect.height.min(h as f64 - (rect.top - origin.y0 as f64)),
    };
    let resized = if pc == c {
        ops::resample(&pixels, w, h, c, rect, slot, p.out_w, p.out_h, p.dst).map(|()| {
            finish(slot, p, c, transform.flip);
        })
    } else {
        ops::resample_rgbx(
            &pixels,
            w,
            h,
            rect,
            slot,
            p.out_w,
            p.out_h,
            transform.flip.applies(),
        )
    };
    resized.map_err(|reason| ImageError::Corrupt {
        name: String::new(),
        format: info.format,
        reason: format!("resize failed: {reason}"),
    })
}

/// The whole frame of a PNG, WebP or BMP, checked against the header's size.
fn decode_frame(data: &[u8], info: &ImageInfo) -> Result<codecs::Pixels, ImageError> {
    let px = match info.format {
        Format::Png => codecs::decode_png(data)?,
        Format::Webp => codecs::decode_webp(data)?,
        _ => codecs::decode_bmp(data)?,
    };
    if (px.width, px.height) != (info.width, info.height) {
        return Err(ImageError::Corrupt {
            name: String::new(),
            format: info.format,
            reason: "frame size differs from the header".into(),
        });
    }
    Ok(px)
}

/// The window of a JPEG to decode at `num/8` (stored coordinates): what
/// the resample of the plan reads, widened by [`JPEG_WINDOW_MARGIN`]
/// columns on each side, or with `crop_decode` off all of it.
fn jpeg_window(p: &plan::Plan, info: &ImageInfo, num: usize, crop_decode: bool) -> codecs::Window {
    let size = codecs::jpeg_scaled_size(info, num);
    stored_window(p, info, size, crop_decode, JPEG_WINDOW_MARGIN)
}

/// The window of an image decoded at `(sw, sh)` pixels (stored coordinates)
/// that the resample of the plan reads, widened by `margin` stored columns
/// on each side (clipped to the image), or with `crop_decode` off all of it.
fn stored_window(
    p: &plan::Plan,
    info: &ImageInfo,
    (sw, sh): (usize, usize),
    crop_decode: bool,
    margin: usize,
) -> codecs::Window {
    let b = if crop_decode {
        let oriented = info.oriented_size();
        let b = support(p, info.orientation, oriented, (sw, sh));
        let b = plan::box_to_stored(b, info.orientation, sw, sh);
        plan::BoxU {
            x0: b.x0.saturating_sub(margin),
            x1: (b.x1 + margin).min(sw),
            ..b
        }
    } else {
        plan::BoxU {
            x0: 0,
            y0: 0,
            x1: sw,
            y1: sh,
        }
    };
    codecs::Window {
        x: b.x0,
        y: b.y0,
        width: b.x1 - b.x0,
        height: b.y1 - b.y0,
    }
}

/// The plan's source rectangle (in full-size oriented coordinates of an
/// `oriented` = (width, height) image) in the oriented image that a decode
/// of `stored` = (width, height) pixels gives (DCT scaling shrinks it).
fn scaled_rect(
    p: &plan::Plan,
    orientation: u16,
    oriented: (usize, usize),
    stored: (usize, usize),
) -> plan::RectF {
    let (w, h) = if orientation >= 5 {
        (stored.1, stored.0)
    } else {
        stored
    };
    let (fx, fy) = (w as f64 / oriented.0 as f64, h as f64 / oriented.1 as f64);
    // Scaled sizes are rounded up, so a rectangle that touched the far edge
    // can overshoot it by a fraction of a pixel: keep it inside.
    let left = (p.src.left * fx).min(w as f64);
    let top = (p.src.top * fy).min(h as f64);
    plan::RectF {
        left,
        top,
        width: (p.src.width * fx).min(w as f64 - left),
        height: (p.src.height * fy).min(h as f64 - top),
    }
}

/// The window of the oriented image decoded at `stored` = (width, height)
/// that resampling the plan's rectangle reads.
fn support(
    p: &plan::Plan,
    orientation: u16,
    oriented: (usize, usize),
    stored: (usize, usize),
) -> plan::BoxU {
    let (w, h) = if orientation >= 5 {
        (stored.1, stored.0)
    } else {
        stored
    };
    let rect = scaled_rect(p, orientation, oriented, stored);
    plan::resample_support(rect, p.dst.width, p.dst.height, w, h)
}

/// Columns decoded beyond what the resize filter reads, on each side of a
/// partial JPEG decode's window: libjpeg-turbo upsamples the chroma at a
/// window's left and right edges from the window alone (a chroma sample
/// is up to 2 pixels wide, 4 for 4:1:1), so the pixels next to those edges
/// can differ slightly from a full decode's. Rows need no margin: skipping
/// the rows above the window keeps the upsampler's context rows, and the
/// window's rows are exactly a full decode's (tested).
const JPEG_WINDOW_MARGIN: usize = 4;

fn finish(slot: &mut [u8], p: &plan::Plan, c: usize, flip: Flip) {
    if flip.applies() {
        ops::flip_horizontal(slot, p.out_w, c);
    }
}

/// Runs `data` through every decode path, for the fuzz targets (`fuzz/`)
/// and their corpus replay test: into a batch slot (RGB, and gray with a
/// resize, crop and flip), to a full-size image, and for a JPEG through
/// zune-jpeg as well as libjpeg-turbo. Errors are expected (the input is
/// arbitrary); a decoder panic is not, and is returned. An image whose
/// header announces more than `max_pixels` pixels is not decoded (a
/// fuzzer's memory limit is small; the budget check is tested on its own).
///
/// # Errors
///
/// The first [`ImageError::DecoderPanic`]: a bug in a decoder.
#[doc(hidden)]
pub fn fuzz_every_path(data: &[u8], max_pixels: usize) -> Result<(), ImageError> {
    if let Ok(info) = probe(data, "fuzz") {
        if info.width.saturating_mul(info.height) > max_pixels {
            return Ok(());
        }
    }
    let keep_panics = |r: Result<(), ImageError>| match r {
        Err(e @ ImageError::DecoderPanic { .. }) => Err(e),
        _ => Ok(()),
    };
    let rgb = Transform {
        size: Some((16, 16)),
        ..Transform::default()
    };
    let mut slot = [0u8; 16 * 16 * 3];
    keep_panics(decode_into(data, "fuzz", &rgb, &mut slot).map(drop))?;
    let gray = Transform {
        mode: ColorMode::Gray,
        resize_shorter: Some(20),
        crop: Some(Crop::Center {
            height: 12,
            width: 10,
        }),
        size: Some((8, 8)),
        flip: Flip::Always,
        dct_scaling: true,
        crop_decode: true,
    };
    let mut slot = [0u8; 8 * 8];
    keep_panics(decode_into(data, "fuzz", &gray, &mut slot).map(drop))?;
    keep_panics(decode(data, "fuzz", &Transform::default()).map(drop))?;
    if codecs::sniff(data) == Some(Format::Jpeg) {
        keep_panics(guarded("fuzz", || {
            let info = probe_inner(data)?;
            let mut buf = buffer::zeroed(info.width * info.height * 3)?;
            codecs::jpeg_zune::decode_into(data, ColorMode::Rgb, &mut buf, info.width * 3).map(drop)
        }))?;
    }
    Ok(())
}
