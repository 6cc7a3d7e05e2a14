//! The decoders: libjpeg-turbo (through `turbojpeg`), `png`, `image-webp`,
//! and the EXIF orientation of JPEGs (through `kamadak-exif`).

use std::cell::RefCell;
use std::io::Cursor;

use turbojpeg::{Colorspace, Decompressor, PixelFormat, ScalingFactor};

use super::{ColorMode, Format, ImageError, MAX_PIXELS};

thread_local! {
    /// One libjpeg-turbo handle per thread (`tj3Init` allocates).
    static DECOMPRESSOR: RefCell<Option<Decompressor>> = const { RefCell::new(None) };
}

/// At most this many progressive scans: a crafted progressive JPEG with
/// thousands of tiny scans would otherwise take minutes to decode
/// (libjpeg-turbo's own advice for untrusted input).
const MAX_JPEG_SCANS: u32 = 500;

/// The header of an image: enough to plan the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageInfo {
    /// The format, from the first bytes (never the file name).
    pub format: Format,
    /// Width as stored (before EXIF orientation).
    pub width: usize,
    /// Height as stored (before EXIF orientation).
    pub height: usize,
    /// EXIF orientation, 1 (none) to 8; always 1 for PNG and WebP.
    pub orientation: u16,
}

impl ImageInfo {
    /// Width and height once the orientation is applied.
    pub fn oriented_size(&self) -> (usize, usize) {
        if self.orientation >= 5 {
            (self.height, self.width)
        } else {
            (self.width, self.height)
        }
    }
}

/// Decoded pixels, 8-bit, `channels` interleaved (1 gray, 2 gray+alpha,
/// 3 RGB, 4 RGBA).
pub(crate) struct Pixels {
    pub data: Vec<u8>,
    pub width: usize,
    pub height: usize,
    pub channels: usize,
}

/// Guesses the format from the magic bytes.
pub(crate) fn sniff(data: &[u8]) -> Option<Format> {
    if data.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some(Format::Jpeg)
    } else if data.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some(Format::Png)
    } else if data.len() >= 12 && &data[..4] == b"RIFF" && &data[8..12] == b"WEBP" {
        Some(Format::Webp)
    } else {
        None
    }
}

fn check_size(width: usize, height: usize, format: Format) -> Result<(), ImageError> {
    if width == 0 || height == 0 {
        return Err(ImageError::Corrupt {
            name: String::new(),
            format,
            reason: format!("zero image size {width}x{height}"),
        });
    }
    if width.saturating_mul(height) > MAX_PIXELS {
        return Err(ImageError::TooLarge {
            name: String::new(),
            width,
            height,
        });
    }
    Ok(())
}

#[allow(clippy::needless_pass_by_value)] // takes both errors and &str
fn corrupt(format: Format, reason: impl ToString) -> ImageError {
    ImageError::Corrupt {
        name: String::new(),
        format,
        reason: reason.to_string(),
    }
}

fn with_decompressor<T>(
    f: impl FnOnce(&mut Decompressor) -> Result<T, ImageError>,
) -> Result<T, ImageError> {
    DECOMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(Decompressor::new().map_err(|e| corrupt(Format::Jpeg, e))?);
        }
        // The handle was just made if it was missing.
        let d = slot
            .as_mut()
            .ok_or_else(|| corrupt(Format::Jpeg, "no decompressor"))?;
        let result = f(d);
        if result.is_err() {
            // libjpeg-turbo can leave a handle in a bad state after a corrupt
            // input (the next, valid image then fails): start afresh.
            *slot = None;
        }
        result
    })
}

/// The EXIF orientation of a JPEG (1 when absent, unreadable or out of
/// range: a broken EXIF block never fails a decode; Pillow's
/// `exif_transpose` ignores it the same way).
fn jpeg_orientation(data: &[u8]) -> u16 {
    let Ok(exif) = exif::Reader::new().read_from_container(&mut Cursor::new(data)) else {
        return 1;
    };
    exif.get_field(exif::Tag::Orientation, exif::In::PRIMARY)
        .and_then(|f| f.value.get_uint(0))
        .and_then(|v| u16::try_from(v).ok())
        .filter(|v| (1..=8).contains(v))
        .unwrap_or(1)
}

/// Reads the header (and, for JPEG, the EXIF orientation).
pub(crate) fn probe(data: &[u8], format: Format) -> Result<ImageInfo, ImageError> {
    let (width, height, orientation) = match format {
        Format::Jpeg => {
            let header =
                with_decompressor(|d| d.read_header(data).map_err(|e| corrupt(format, e)))?;
            (header.width, header.height, jpeg_orientation(data))
        }
        Format::Png => {
            let mut decoder = png::Decoder::new(Cursor::new(data));
            let info = decoder.read_header_info().map_err(|e| corrupt(format, e))?;
            (info.width as usize, info.height as usize, 1)
        }
        Format::Webp => {
            let decoder =
                image_webp::WebPDecoder::new(Cursor::new(data)).map_err(|e| corrupt(format, e))?;
            let (w, h) = decoder.dimensions();
            (w as usize, h as usize, 1)
        }
    };
    check_size(width, height, format)?;
    Ok(ImageInfo {
        format,
        width,
        height,
        orientation,
    })
}

/// The scaled size libjpeg-turbo produces for `num/8`.
pub(crate) fn jpeg_scaled_size(info: &ImageInfo, num: usize) -> (usize, usize) {
    let f = ScalingFactor::new(num, 8);
    (f.scale(info.width), f.scale(info.height))
}

/// Decodes a JPEG at `num/8` scale in `mode` into `out`, rows `pitch`
/// bytes apart (`out` holds at least `pitch * scaled height` bytes).
pub(crate) fn decode_jpeg_into(
    data: &[u8],
    num: usize,
    mode: ColorMode,
    out: &mut [u8],
    pitch: usize,
) -> Result<(usize, usize), ImageError> {
    let fmt = Format::Jpeg;
    with_decompressor(|d| {
        let header = d.read_header(data).map_err(|e| corrupt(fmt, e))?;
        // Lossless JPEGs cannot be scaled while decoding.
        let num = if header.is_lossless { 8 } else { num };
        d.set_scaling_factor(ScalingFactor::new(num, 8))
            .map_err(|e| corrupt(fmt, e))?;
        d.set_scan_limit(MAX_JPEG_SCANS)
            .map_err(|e| corrupt(fmt, e))?;
        let header = header.scaled(ScalingFactor::new(num, 8));
        let (w, h) = (header.width, header.height);
        let cmyk = matches!(header.colorspace, Colorspace::CMYK | Colorspace::YCCK);
        if cmyk {
            // libjpeg converts neither CMYK nor YCCK to RGB: take the
            // (Adobe-inverted) CMYK and convert it as Pillow does.
            let mut buf = vec![0u8; w * h * 4];
            let image = turbojpeg::Image {
                pixels: buf.as_mut_slice(),
                width: w,
                pitch: w * 4,
                height: h,
                format: PixelFormat::CMYK,
            };
            d.decompress(data, image).map_err(|e| corrupt(fmt, e))?;
            let mut rgb = vec![0u8; w * h * 3];
            super::ops::inverted_cmyk_to_rgb(&buf, &mut rgb);
            let c = mode.channels();
            for (y, line) in rgb.chunks_exact(w * 3).enumerate() {
                let row = &mut out[y * pitch..y * pitch + w * c];
                super::ops::convert_channels(line, 3, row, c);
            }
            return Ok((w, h));
        }
        let format = match mode {
            ColorMode::Rgb => PixelFormat::RGB,
            ColorMode::Gray => PixelFormat::GRAY,
        };
        let needed = pitch * h.saturating_sub(1) + w * format.size();
        if out.len() < needed || pitch < w * format.size() {
            return Err(corrupt(fmt, "output buffer too small (a bug)"));
        }
        let image = turbojpeg::Image {
            pixels: &mut out[..needed],
            width: w,
            pitch,
            height: h,
            format,
        };
        d.decompress(data, image).map_err(|e| corrupt(fmt, e))?;
        Ok((w, h))
    })
}

/// Decodes a PNG (any bit depth, palette, alpha, gray) to 8-bit pixels:
/// 16-bit samples keep their high byte, as Pillow's `RGB` mode does.
pub(crate) fn decode_png(data: &[u8]) -> Result<Pixels, ImageError> {
    let fmt = Format::Png;
    let mut decoder = png::Decoder::new(Cursor::new(data));
    decoder.set_transformations(png::Transformations::normalize_to_color8());
    let mut reader = decoder.read_info().map_err(|e| corrupt(fmt, e))?;
    let size = reader
        .output_buffer_size()
        .ok_or_else(|| corrupt(fmt, "image too large"))?;
    let mut buf = vec![0u8; size];
    let info = reader.next_frame(&mut buf).map_err(|e| corrupt(fmt, e))?;
    let channels = match info.color_type {
        png::ColorType::Grayscale => 1,
        png::ColorType::GrayscaleAlpha => 2,
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        png::ColorType::Indexed => {
            return Err(ImageError::Unsupported {
                name: String::new(),
                format: fmt,
                reason: "palette not expanded".into(),
            })
        }
    };
    let (width, height) = (info.width as usize, info.height as usize);
    // Rows may be padded to `line_size`; pack them.
    let packed = width * channels;
    if info.line_size == packed {
        buf.truncate(packed * height);
    } else {
        let mut out = Vec::with_capacity(packed * height);
        for row in buf.chunks(info.line_size).take(height) {
            out.extend_from_slice(&row[..packed]);
        }
        buf = out;
    }
    Ok(Pixels {
        data: buf,
        width,
        height,
        channels,
    })
}

/// Decodes a WebP (lossy or lossless, still; the first frame of an
/// animation) to RGB or RGBA.
pub(crate) fn decode_webp(data: &[u8]) -> Result<Pixels, ImageError> {
    let fmt = Format::Webp;
    let mut decoder =
        image_webp::WebPDecoder::new(Cursor::new(data)).map_err(|e| corrupt(fmt, e))?;
    let (w, h) = decoder.dimensions();
    let channels = if decoder.has_alpha() { 4 } else { 3 };
    let size = decoder
        .output_buffer_size()
        .ok_or_else(|| corrupt(fmt, "image too large"))?;
    let mut buf = vec![0u8; size];
    decoder.read_image(&mut buf).map_err(|e| corrupt(fmt, e))?;
    Ok(Pixels {
        data: buf,
        width: w as usize,
        height: h as usize,
        channels,
    })
}
