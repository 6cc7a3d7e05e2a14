//! JPEG through libjpeg-turbo (the `turbojpeg` feature): SIMD IDCT, and
//! DCT-domain scaling to `n/8` of the stored size.

use std::cell::RefCell;

use turbojpeg::{Colorspace, Decompressor, PixelFormat, ScalingFactor};

use super::{corrupt, ColorMode, ImageError, MAX_JPEG_SCANS};
use crate::image::Format;

thread_local! {
    /// One libjpeg-turbo handle per thread (`tj3Init` allocates).
    static DECOMPRESSOR: RefCell<Option<Decompressor>> = const { RefCell::new(None) };
}

const FMT: Format = Format::Jpeg;

fn with_decompressor<T>(
    f: impl FnOnce(&mut Decompressor) -> Result<T, ImageError>,
) -> Result<T, ImageError> {
    DECOMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(Decompressor::new().map_err(|e| corrupt(FMT, e))?);
        }
        // The handle was just made if it was missing.
        let d = slot
            .as_mut()
            .ok_or_else(|| corrupt(FMT, "no decompressor"))?;
        let result = f(d);
        if result.is_err() {
            // libjpeg-turbo can leave a handle in a bad state after a corrupt
            // input (the next, valid image then fails): start afresh.
            *slot = None;
        }
        result
    })
}

/// The stored `(width, height)`.
pub(crate) fn header(data: &[u8]) -> Result<(usize, usize), ImageError> {
    let header = with_decompressor(|d| d.read_header(data).map_err(|e| corrupt(FMT, e)))?;
    Ok((header.width, header.height))
}

/// The size libjpeg-turbo produces at `num/8` of `width` x `height`.
pub(crate) fn scaled_size(width: usize, height: usize, num: usize) -> (usize, usize) {
    let f = ScalingFactor::new(num, 8);
    (f.scale(width), f.scale(height))
}

/// Decodes at `num/8` scale in `mode` into `out`, rows `pitch` bytes apart
/// (`out` holds at least `pitch * scaled height` bytes).
pub(crate) fn decode_into(
    data: &[u8],
    num: usize,
    mode: ColorMode,
    out: &mut [u8],
    pitch: usize,
) -> Result<(usize, usize), ImageError> {
    with_decompressor(|d| {
        let header = d.read_header(data).map_err(|e| corrupt(FMT, e))?;
        // Lossless JPEGs cannot be scaled while decoding.
        let num = if header.is_lossless { 8 } else { num };
        d.set_scaling_factor(ScalingFactor::new(num, 8))
            .map_err(|e| corrupt(FMT, e))?;
        d.set_scan_limit(MAX_JPEG_SCANS as u32)
            .map_err(|e| corrupt(FMT, e))?;
        let header = header.scaled(ScalingFactor::new(num, 8));
        let (w, h) = (header.width, header.height);
        if matches!(header.colorspace, Colorspace::CMYK | Colorspace::YCCK) {
            // libjpeg converts neither CMYK nor YCCK to RGB: take the
            // (Adobe-inverted) CMYK and convert it as Pillow does.
            let mut buf = super::zeroed(w * h * 4)?;
            let image = turbojpeg::Image {
                pixels: buf.as_mut_slice(),
                width: w,
                pitch: w * 4,
                height: h,
                format: PixelFormat::CMYK,
            };
            d.decompress(data, image).map_err(|e| corrupt(FMT, e))?;
            super::write_inverted_cmyk(&buf, w, mode, out, pitch);
            return Ok((w, h));
        }
        let format = match mode {
            ColorMode::Rgb => PixelFormat::RGB,
            ColorMode::Gray => PixelFormat::GRAY,
        };
        let needed = pitch * h.saturating_sub(1) + w * format.size();
        if out.len() < needed || pitch < w * format.size() {
            return Err(corrupt(FMT, "output buffer too small (a bug)"));
        }
        let image = turbojpeg::Image {
            pixels: &mut out[..needed],
            width: w,
            pitch,
            height: h,
            format,
        };
        d.decompress(data, image).map_err(|e| corrupt(FMT, e))?;
        Ok((w, h))
    })
}
