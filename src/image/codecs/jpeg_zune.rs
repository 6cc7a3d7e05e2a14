//! JPEG through zune-jpeg: pure Rust, the decoder of builds without the
//! `turbojpeg` feature (no cmake or nasm needed). Always a full-size decode:
//! zune-jpeg has no DCT-domain scaling.
//!
//! It is made to give what the libjpeg-turbo path gives: 8-bit RGB or gray
//! (the luma channel of a color JPEG, as libjpeg's gray output), and CMYK and
//! YCCK converted as Pillow converts libjpeg's (Adobe-inverted) CMYK.

use zune_jpeg::errors::DecodeErrors;
use zune_jpeg::zune_core::bytestream::ZCursor;
use zune_jpeg::zune_core::colorspace::ColorSpace;
use zune_jpeg::zune_core::options::DecoderOptions;
use zune_jpeg::JpegDecoder;

use super::{corrupt, headroom, zeroed, ColorMode, ImageError, MAX_JPEG_SCANS};
use crate::image::Format;

const FMT: Format = Format::Jpeg;

#[cold]
#[allow(clippy::needless_pass_by_value)] // an error is consumed
fn error(e: DecodeErrors) -> ImageError {
    match e {
        DecodeErrors::Unsupported(_) => ImageError::Unsupported {
            name: String::new(),
            format: FMT,
            reason: e.to_string(),
        },
        _ => corrupt(FMT, e),
    }
}

/// Strict mode (a premature end of the data or a damaged scan is an error,
/// as it is for libjpeg-turbo here, not a gray-filled image), the scan limit,
/// and no size limit of zune's own: sizes are checked against the pixel
/// budget (`image::max_pixels`).
fn options(out: ColorSpace) -> DecoderOptions {
    DecoderOptions::default()
        .set_strict_mode(true)
        .jpeg_set_max_scans(MAX_JPEG_SCANS)
        .set_max_width(usize::from(u16::MAX))
        .set_max_height(usize::from(u16::MAX))
        .jpeg_set_out_colorspace(out)
}

/// A decoder after the headers, with the width, height and stored colorspace.
type Headers<'a> = (JpegDecoder<ZCursor<&'a [u8]>>, usize, usize, ColorSpace);

/// Reads the headers, to decode to `out`.
fn headers(data: &[u8], out: ColorSpace) -> Result<Headers<'_>, ImageError> {
    let mut d = JpegDecoder::new_with_options(ZCursor::new(data), options(out));
    d.decode_headers().map_err(error)?;
    let (w, h) = d
        .dimensions()
        .ok_or_else(|| corrupt(FMT, "no frame header"))?;
    let input = d
        .input_colorspace()
        .ok_or_else(|| corrupt(FMT, "no frame header"))?;
    Ok((d, w, h, input))
}

/// The stored `(width, height)`.
pub(crate) fn header(data: &[u8]) -> Result<(usize, usize), ImageError> {
    let (_, w, h, _) = headers(data, ColorSpace::RGB)?;
    Ok((w, h))
}

/// Decodes in `mode` into `out`, rows `pitch` bytes apart (`out` holds at
/// least `pitch * height` bytes).
pub(crate) fn decode_into(
    data: &[u8],
    mode: ColorMode,
    out: &mut [u8],
    pitch: usize,
) -> Result<(usize, usize), ImageError> {
    let c = mode.channels();
    // Read the headers once to learn the stored colorspace, then decode with
    // the matching output colorspace (zune picks its conversion when it
    // reads the headers, so that takes a second decoder).
    let (_, w, h, input) = headers(data, ColorSpace::RGB)?;
    if !first_component_is_sampled_most(data) {
        // zune-jpeg 0.5 mis-decodes these (a CMYK JPEG whose K channel has
        // the largest sampling factors came out wrong in the tests): an
        // error is better than wrong pixels. Cameras and Pillow never write
        // them; libjpeg-turbo decodes them.
        return Err(ImageError::Unsupported {
            name: String::new(),
            format: FMT,
            reason: "a component sampled more finely than the first one \
                     (not supported by the pure-Rust decoder)"
                .into(),
        });
    }
    if !data.windows(2).rev().any(|m| m == [0xFF, 0xD9]) {
        // All of the scan data but no end-of-image marker: zune decodes it
        // without a word, libjpeg-turbo reports a premature end, which is an
        // error here. (An EOI inside an EXIF thumbnail passes this check,
        // but a cut in the scans themselves is caught by the strict mode.)
        return Err(corrupt(
            FMT,
            "premature end of data: no end-of-image marker",
        ));
    }
    if out.len() < pitch * h.saturating_sub(1) + w * c || pitch < w * c {
        return Err(corrupt(FMT, "output buffer too small (a bug)"));
    }
    // zune-jpeg allocates its own component and coefficient planes
    // (infallibly; up to 2 bytes a sample for progressive JPEGs): check that
    // they fit first.
    headroom(w.saturating_mul(h).saturating_mul(8))?;
    let decoded = match input {
        ColorSpace::CMYK | ColorSpace::YCCK => {
            let (mut d, ..) = headers(data, input)?;
            let mut buf = zeroed(w * h * 4)?;
            d.decode_into(&mut buf).map_err(error)?;
            if input == ColorSpace::YCCK {
                ycck_to_inverted_cmyk(&mut buf);
            }
            super::write_inverted_cmyk(&buf, w, mode, out, pitch);
            return Ok((w, h));
        }
        ColorSpace::Luma if mode == ColorMode::Gray => ColorSpace::Luma,
        // The Y channel is the gray image (libjpeg's gray output of a color
        // JPEG is its Y channel too). zune's own `YCbCr` to gray path gets
        // progressive JPEGs with vertical chroma subsampling wrong, so take
        // the Y of the raw `YCbCr` output.
        ColorSpace::YCbCr if mode == ColorMode::Gray => ColorSpace::YCbCr,
        ColorSpace::YCbCr | ColorSpace::Luma | ColorSpace::RGB => ColorSpace::RGB,
        other => {
            return Err(ImageError::Unsupported {
                name: String::new(),
                format: FMT,
                reason: format!("{other:?} colorspace"),
            })
        }
    };
    let (mut d, ..) = headers(data, decoded)?;
    let got = decoded.num_components();
    if decoded == ColorSpace::YCbCr {
        let mut buf = zeroed(w * h * 3)?;
        d.decode_into(&mut buf).map_err(error)?;
        for (y, line) in buf.chunks_exact(w * 3).enumerate() {
            let row = &mut out[y * pitch..y * pitch + w];
            for (dst, px) in row.iter_mut().zip(line.chunks_exact(3)) {
                *dst = px[0];
            }
        }
    } else if got == c && pitch == w * c {
        // One copy: zune writes straight into the slot.
        d.decode_into(&mut out[..w * h * c]).map_err(error)?;
    } else {
        let mut buf = zeroed(w * h * got)?;
        d.decode_into(&mut buf).map_err(error)?;
        for (y, line) in buf.chunks_exact(w * got).enumerate() {
            let row = &mut out[y * pitch..y * pitch + w * c];
            super::super::ops::convert_channels(line, got, row, c);
        }
    }
    Ok((w, h))
}

/// Whether the first component of the frame has the largest horizontal and
/// vertical sampling factors (true when the frame header is not found: the
/// decoder then reports what is wrong).
fn first_component_is_sampled_most(data: &[u8]) -> bool {
    let Some(factors) = sampling_factors(data) else {
        return true;
    };
    let Some(&(h0, v0)) = factors.first() else {
        return true;
    };
    factors.iter().all(|&(h, v)| h <= h0 && v <= v0)
}

/// The `(horizontal, vertical)` sampling factors of each component, from the
/// first frame header (`SOFn`) before the first scan.
fn sampling_factors(data: &[u8]) -> Option<Vec<(u8, u8)>> {
    let mut i = 2; // after SOI
    loop {
        if *data.get(i)? != 0xFF {
            return None;
        }
        let marker = *data.get(i + 1)?;
        match marker {
            // Fill bytes.
            0xFF => i += 1,
            // Markers without a length.
            0x01 | 0xD0..=0xD8 => i += 2,
            // The first scan: no frame header before it.
            0xDA => return None,
            _ => {
                let len = usize::from(u16::from_be_bytes([*data.get(i + 2)?, *data.get(i + 3)?]));
                // SOF0..SOF15, except DHT (C4), JPG (C8) and DAC (CC).
                if (0xC0..=0xCF).contains(&marker) && !matches!(marker, 0xC4 | 0xC8 | 0xCC) {
                    let count = usize::from(*data.get(i + 9)?);
                    let comps = data.get(i + 10..i + 10 + 3 * count)?;
                    return Some(
                        comps
                            .chunks_exact(3)
                            .map(|c| (c[1] >> 4, c[1] & 15))
                            .collect(),
                    );
                }
                i += 2 + len;
            }
        }
    }
}

/// Turns zune's raw YCCK (`Y`, `Cb`, `Cr`, `K` as stored) into the
/// Adobe-inverted CMYK that libjpeg makes of it (`C = 255 - R` of the
/// `YCbCr`, `K` kept), with libjpeg's fixed-point arithmetic (jdcolor.c), so
/// that both decoders hand the same CMYK to the Pillow conversion.
#[allow(clippy::cast_possible_wrap, clippy::cast_sign_loss)]
fn ycck_to_inverted_cmyk(buf: &mut [u8]) {
    const SCALEBITS: i32 = 16;
    const ONE_HALF: i32 = 1 << (SCALEBITS - 1);
    // FIX(x) = round(x * 2^16)
    const FIX_1_40200: i32 = 91_881;
    const FIX_1_77200: i32 = 116_130;
    const FIX_0_71414: i32 = 46_802;
    const FIX_0_34414: i32 = 22_554;
    for px in buf.chunks_exact_mut(4) {
        let y = i32::from(px[0]);
        let cb = i32::from(px[1]) - 128;
        let cr = i32::from(px[2]) - 128;
        let r = y + ((FIX_1_40200 * cr + ONE_HALF) >> SCALEBITS);
        let g = y + ((-FIX_0_34414 * cb - FIX_0_71414 * cr + ONE_HALF) >> SCALEBITS);
        let b = y + ((FIX_1_77200 * cb + ONE_HALF) >> SCALEBITS);
        px[0] = (255 - r).clamp(0, 255) as u8;
        px[1] = (255 - g).clamp(0, 255) as u8;
        px[2] = (255 - b).clamp(0, 255) as u8;
    }
}
