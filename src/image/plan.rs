//! Geometry: from the source size and a [`Transform`] to the output size,
//! the rectangle of the source that fills it, and the JPEG scaling factor.
//!
//! Every geometric step (shorter-side resize, crops, the final resize) is
//! composed into *one* resample: a source rectangle (fractional, in source
//! pixels) mapped onto a region of the output. Resampling that rectangle
//! with the scale of the full resize is exactly what resizing the whole
//! image and cropping afterwards computes (Pillow's `reduce`/`box` and
//! `fast_image_resize`'s crop place the filter taps at the same points),
//! without the intermediate image.

use super::{Crop, ImageError, Transform};
use crate::seed::SplitMix64;

/// A rectangle in fractional source pixels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RectF {
    pub left: f64,
    pub top: f64,
    pub width: f64,
    pub height: f64,
}

/// An integer rectangle of the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RectU {
    pub x: usize,
    pub y: usize,
    pub width: usize,
    pub height: usize,
}

#[cfg(test)]
impl RectF {
    /// The rectangle at `(left, top)`, `width` by `height` (for tests).
    pub(crate) const fn new(left: f64, top: f64, width: f64, height: f64) -> Self {
        Self {
            left,
            top,
            width,
            height,
        }
    }
}

#[cfg(test)]
impl RectU {
    /// The rectangle at `(x, y)`, `width` by `height` (for tests).
    pub(crate) const fn new(x: usize, y: usize, width: usize, height: usize) -> Self {
        Self {
            x,
            y,
            width,
            height,
        }
    }
}

/// What to compute for one image, in the coordinates of the *oriented*
/// source (EXIF orientation already applied).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Plan {
    /// Output width and height.
    pub out_w: usize,
    pub out_h: usize,
    /// The source rectangle that is resampled...
    pub src: RectF,
    /// ...onto this region of the output; the rest (only where a center
    /// crop is larger than the image) is zero, as torchvision pads.
    pub dst: RectU,
}

/// Python's `round()` (half to even) of a non-negative `x`.
fn round_half_even(x: f64) -> f64 {
    let r = x.round();
    if (x - x.trunc() - 0.5).abs() < 1e-12 && r % 2.0 != 0.0 {
        r - 1.0
    } else {
        r
    }
}

/// torchvision's `RandomResizedCrop.get_params`: `(top, left, height, width)`
/// of a crop of a `width` x `height` image.
#[allow(
    clippy::cast_precision_loss,
    clippy::cast_sign_loss,
    clippy::similar_names
)]
pub(crate) fn random_resized_crop(
    width: usize,
    height: usize,
    scale: (f64, f64),
    ratio: (f64, f64),
    seed: u64,
) -> (usize, usize, usize, usize) {
    let mut rng = SplitMix64::new(seed);
    let area = (width * height) as f64;
    let (log_lo, log_hi) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target_area = area * rng.uniform(scale.0, scale.1);
        let aspect = rng.uniform(log_lo, log_hi).exp();
        let w = round_half_even((target_area * aspect).sqrt());
        let h = round_half_even((target_area / aspect).sqrt());
        if w > 0.0 && h > 0.0 && w <= width as f64 && h <= height as f64 {
            let (w, h) = (w as usize, h as usize);
            let top = rng.below(height - h + 1);
            let left = rng.below(width - w + 1);
            return (top, left, h, w);
        }
    }
    // Fallback: a center crop with the ratio clamped into range.
    let in_ratio = width as f64 / height as f64;
    let (w, h) = if in_ratio < ratio.0.min(ratio.1) {
        let w = width;
        (w, round_half_even(w as f64 / ratio.0.min(ratio.1)) as usize)
    } else if in_ratio > ratio.0.max(ratio.1) {
        let h = height;
        (round_half_even(h as f64 * ratio.0.max(ratio.1)) as usize, h)
    } else {
        (width, height)
    };
    let (w, h) = (w.clamp(1, width), h.clamp(1, height));
    ((height - h) / 2, (width - w) / 2, h, w)
}

/// torchvision's `Resize(shorter)` output size: the shorter side becomes
/// `shorter`, the longer one is scaled and truncated.
#[allow(clippy::cast_precision_loss, clippy::cast_sign_loss)]
fn shorter_side_size(width: usize, height: usize, shorter: usize) -> (usize, usize) {
    if width <= height {
        let long = (shorter as f64 * height as f64 / width as f64) as usize;
        (shorter, long.max(1))
    } else {
        let long = (shorter as f64 * width as f64 / height as f64) as usize;
        (long.max(1), shorter)
    }
}

#[allow(clippy::too_many_lines)] // one case per step, read top to bottom
/// Plans `transform` for an oriented source of `width` x `height`.
///
/// # Errors
///
/// [`ImageError::InvalidTransform`] for zero sizes, a random crop without
/// an output `size`, or crop parameters out of range.
#[allow(clippy::cast_precision_loss)]
pub(crate) fn plan(width: usize, height: usize, transform: &Transform) -> Result<Plan, ImageError> {
    let invalid = |reason: String| ImageError::InvalidTransform { reason };
    if transform.size.is_some_and(|(h, w)| h == 0 || w == 0) {
        return Err(invalid("size must be positive".into()));
    }
    // The current virtual image: its size, and the source rectangle it
    // shows (a resize keeps the rectangle, a crop narrows it).
    let (mut vw, mut vh) = (width, height);
    let mut src = RectF {
        left: 0.0,
        top: 0.0,
        width: width as f64,
        height: height as f64,
    };
    if let Some(shorter) = transform.resize_shorter {
        if shorter == 0 {
            return Err(invalid("resize_shorter must be positive".into()));
        }
        (vw, vh) = shorter_side_size(vw, vh, shorter);
    }
    // The output region the virtual image fills (smaller than the output
    // only for a center crop larger than the image).
    let mut dst = RectU {
        x: 0,
        y: 0,
        width: vw,
        height: vh,
    };
    let (mut out_w, mut out_h) = (vw, vh);
    match transform.crop {
        None => {}
        Some(Crop::Center {
            height: th,
            width: tw,
        }) => {
            if th == 0 || tw == 0 {
                return Err(invalid("crop size must be positive".into()));
            }
            let sx = src.width / vw as f64;
            let sy = src.height / vh as f64;
            // Per axis: crop inside the image, or pad around it.
            let axis = |v: usize, t: usize| -> (usize, usize, usize) {
                if t <= v {
                    // (offset in the virtual image, offset in the output, length)
                    (round_half_even((v - t) as f64 / 2.0) as usize, 0, t)
                } else {
                    (0, (t - v) / 2, v)
                }
            };
            let (x0, dx, lw) = axis(vw, tw);
            let (y0, dy, lh) = axis(vh, th);
            src = RectF {
                left: src.left + x0 as f64 * sx,
                top: src.top + y0 as f64 * sy,
                width: lw as f64 * sx,
                height: lh as f64 * sy,
            };
            dst = RectU {
                x: dx,
                y: dy,
                width: lw,
                height: lh,
            };
            (out_w, out_h) = (tw, th);
        }
        Some(Crop::RandomResized { scale, ratio, seed }) => {
            if transform.size.is_none() {
                return Err(invalid("a random resized crop needs an output size".into()));
            }
            let ok = |(a, b): (f64, f64)| a.is_finite() && b.is_finite() && a > 0.0 && a <= b;
            if !ok(scale) || scale.1 > 1.0 || !ok(ratio) {
                return Err(invalid(format!(
                    "random crop needs 0 < scale[0] <= scale[1] <= 1 and 0 < ratio[0] <= ratio[1], \
                     got scale={scale:?}, ratio={ratio:?}"
                )));
            }
            let (top, left, h, w) = random_resized_crop(vw, vh, scale, ratio, seed);
            let sx = src.width / vw as f64;
            let sy = src.height / vh as f64;
            src = RectF {
                left: src.left + left as f64 * sx,
                top: src.top + top as f64 * sy,
                width: w as f64 * sx,
                height: h as f64 * sy,
            };
            dst = RectU {
                x: 0,
                y: 0,
                width: w,
                height: h,
            };
            (out_w, out_h) = (w, h);
        }
    }
    if let Some((h, w)) = transform.size {
        if (w, h) != (out_w, out_h) {
            // Scale the filled region with the frame (it is the whole frame
            // except after a padding center crop).
            let fx = w as f64 / out_w as f64;
            let fy = h as f64 / out_h as f64;
            let scale = |v: usize, f: f64| (v as f64 * f).round() as usize;
            let x = scale(dst.x, fx).min(w);
            let y = scale(dst.y, fy).min(h);
            dst = RectU {
                x,
                y,
                width: scale(dst.width, fx).clamp(1, w - x.min(w - 1)),
                height: scale(dst.height, fy).clamp(1, h - y.min(h - 1)),
            };
            let x = dst.x.min(w - dst.width);
            let y = dst.y.min(h - dst.height);
            dst.x = x;
            dst.y = y;
            (out_w, out_h) = (w, h);
        }
    }
    Ok(Plan {
        out_w,
        out_h,
        src,
        dst,
    })
}

/// The JPEG scaling numerator `n` (of `n/8`): the smallest whose scaled
/// image still has at least as many pixels across the source rectangle as
/// the output region it fills, so the resize after it still only shrinks
/// (8 when no smaller factor qualifies).
///
/// Only 1/8, 2/8 and 4/8 are tried: libjpeg-turbo has x86-64 SIMD for
/// those reduced IDCTs but not for 3/8, 5/8, 6/8 or 7/8, which decode
/// slower than a full-size decode (measured in BENCHMARKS.md: a 6/8 decode
/// of a 500x375 JPEG is 1.3-1.7x slower than the full one).
#[allow(clippy::cast_precision_loss)]
pub(crate) fn jpeg_scale_num(plan: &Plan, width: usize, height: usize) -> usize {
    for num in [1, 2, 4] {
        let sw = (width * num).div_ceil(8);
        let sh = (height * num).div_ceil(8);
        let fx = sw as f64 / width as f64;
        let fy = sh as f64 / height as f64;
        if plan.src.width * fx >= plan.dst.width as f64
            && plan.src.height * fy >= plan.dst.height as f64
        {
            return num;
        }
    }
    8
}

/// An integer box of pixels, `[x0, x1) x [y0, y1)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BoxU {
    pub x0: usize,
    pub y0: usize,
    pub x1: usize,
    pub y1: usize,
}

/// The pixels of a `w` x `h` image that resampling `rect` onto `dst_w` x
/// `dst_h` pixels reads (antialiased bilinear: the filter reaches
/// `max(1, scale)` pixels either side of each output pixel's center, see
/// `ops::resample`), clipped to the image. Decoding only these pixels
/// changes nothing in the result.
#[allow(clippy::cast_possible_truncation)]
pub(crate) fn resample_support(
    rect: RectF,
    dst_w: usize,
    dst_h: usize,
    w: usize,
    h: usize,
) -> BoxU {
    let axis = |start: f64, len: f64, out: usize, n: usize| -> (usize, usize) {
        let radius = (len / out.max(1) as f64).max(1.0);
        let lo = (start - radius).floor().max(0.0) as usize;
        let hi = (start + len + radius).ceil().max(0.0) as usize;
        (lo.min(n), hi.min(n))
    };
    let (x0, x1) = axis(rect.left, rect.width, dst_w, w);
    let (y0, y1) = axis(rect.top, rect.height, dst_h, h);
    BoxU { x0, y0, x1, y1 }
}

/// `[a, b)` mirrored in `[0, n)`.
fn mirror((a, b): (usize, usize), n: usize) -> (usize, usize) {
    (n - b, n - a)
}

/// The box of the stored image (`stored_w` x `stored_h`, before EXIF
/// `orientation`) that holds the pixels of box `b` of the oriented image
/// (`ops::orient`'s mapping, on boxes).
pub(crate) fn box_to_stored(b: BoxU, orientation: u16, stored_w: usize, stored_h: usize) -> BoxU {
    let (xs, ys) = ((b.x0, b.x1), (b.y0, b.y1));
    let (w, h) = (stored_w, stored_h);
    let ((x0, x1), (y0, y1)) = match orientation {
        2 => (mirror(xs, w), ys),
        3 => (mirror(xs, w), mirror(ys, h)),
        4 => (xs, mirror(ys, h)),
        5 => (ys, xs),
        6 => (ys, mirror(xs, h)),
        7 => (mirror(ys, w), mirror(xs, h)),
        8 => (mirror(ys, w), xs),
        _ => (xs, ys),
    };
    BoxU { x0, y0, x1, y1 }
}

/// The inverse of [`box_to_stored`]: the box of the oriented image that
/// the stored box `b` becomes. That is [`box_to_stored`] with the oriented
/// image taken as the stored one, in the inverse orientation (6 and 8 undo
/// each other; every other orientation undoes itself).
pub(crate) fn box_to_oriented(b: BoxU, orientation: u16, stored_w: usize, stored_h: usize) -> BoxU {
    let inverse = match orientation {
        6 => 8,
        8 => 6,
        o => o,
    };
    let (w, h) = if (5..=8).contains(&orientation) {
        (stored_h, stored_w)
    } else {
        (stored_w, stored_h)
    };
    box_to_stored(b, inverse, w, h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_half_even_matches_python() {
        assert!((round_half_even(0.5) - 0.0).abs() < 1e-9);
        assert!((round_half_even(1.5) - 2.0).abs() < 1e-9);
        assert!((round_half_even(2.5) - 2.0).abs() < 1e-9);
        assert!((round_half_even(2.4) - 2.0).abs() < 1e-9);
        assert!((round_half_even(2.6) - 3.0).abs() < 1e-9);
    }

    #[test]
    fn shorter_side_truncates_like_torchvision() {
        assert_eq!(shorter_side_size(500, 375, 256), (341, 256));
        assert_eq!(shorter_side_size(375, 500, 256), (256, 341));
        assert_eq!(shorter_side_size(100, 100, 7), (7, 7));
    }

    #[test]
    fn random_crop_is_in_bounds_and_seeded() {
        for seed in 0..500 {
            let (t, l, h, w) = random_resized_crop(123, 77, (0.08, 1.0), (0.75, 4.0 / 3.0), seed);
            assert!(h >= 1 && w >= 1 && t + h <= 77 && l + w <= 123, "{seed}");
            assert_eq!(
                (t, l, h, w),
                random_resized_crop(123, 77, (0.08, 1.0), (0.75, 4.0 / 3.0), seed)
            );
        }
        // An impossible ratio falls back to a clamped center crop.
        let (t, l, h, w) = random_resized_crop(100, 10, (0.99, 1.0), (1.0, 1.0), 1);
        assert_eq!((t, l, h, w), (0, 45, 10, 10));
    }

    #[test]
    fn center_crop_after_shorter_side_resize() {
        let t = Transform {
            resize_shorter: Some(256),
            crop: Some(Crop::Center {
                height: 224,
                width: 224,
            }),
            ..Transform::default()
        };
        let p = plan(500, 375, &t).unwrap();
        assert_eq!((p.out_w, p.out_h), (224, 224));
        assert_eq!(p.dst, RectU::new(0, 0, 224, 224));
        // 341 wide: left = round((341 - 224) / 2) = round(58.5) = 58.
        let s = 500.0 / 341.0;
        assert!((p.src.left - 58.0 * s).abs() < 1e-9);
        assert!((p.src.width - 224.0 * s).abs() < 1e-9);
    }

    #[test]
    fn padding_center_crop() {
        let t = Transform {
            crop: Some(Crop::Center {
                height: 10,
                width: 4,
            }),
            ..Transform::default()
        };
        let p = plan(6, 5, &t).unwrap();
        assert_eq!((p.out_w, p.out_h), (4, 10));
        assert_eq!(p.dst, RectU::new(0, 2, 4, 5));
        assert!((p.src.left - 1.0).abs() < 1e-9);
    }

    #[test]
    fn invalid_transforms() {
        let t = Transform {
            crop: Some(Crop::RandomResized {
                scale: (0.08, 1.0),
                ratio: (0.75, 1.33),
                seed: 0,
            }),
            ..Transform::default()
        };
        assert!(matches!(
            plan(10, 10, &t),
            Err(ImageError::InvalidTransform { .. })
        ));
        let t = Transform {
            size: Some((0, 3)),
            ..Transform::default()
        };
        assert!(plan(10, 10, &t).is_err());
    }

    #[test]
    fn jpeg_scale_covers_output() {
        let t = Transform {
            size: Some((224, 224)),
            ..Transform::default()
        };
        let p = plan(2000, 1000, &t).unwrap();
        // 1000 * 2/8 = 250 >= 224, 1000 * 1/8 = 125 < 224.
        assert_eq!(jpeg_scale_num(&p, 2000, 1000), 2);
        // 6/8 would cover 224 of 300, but it has no SIMD: a full decode.
        let p = plan(300, 300, &t).unwrap();
        assert_eq!(jpeg_scale_num(&p, 300, 300), 8);
        let p = plan(1000, 1000, &t).unwrap();
        assert_eq!(jpeg_scale_num(&p, 1000, 1000), 2);
        let p = plan(500, 500, &t).unwrap();
        assert_eq!(jpeg_scale_num(&p, 500, 500), 4);
        let t = Transform::default();
        let p = plan(300, 300, &t).unwrap();
        assert_eq!(jpeg_scale_num(&p, 300, 300), 8);
    }
}
