//! The decoders: JPEG (libjpeg-turbo with the `turbojpeg` feature,
//! zune-jpeg without it), `png`, `image-webp`, zune-bmp, and the EXIF
//! orientation of JPEGs (through `kamadak-exif`).

mod bmp;
#[cfg(feature = "turbojpeg")]
pub(crate) mod jpeg_turbo;
// Without the feature, the JPEG decoder; with it, compared against
// libjpeg-turbo by the unit tests.
#[cfg_attr(all(feature = "turbojpeg", not(test)), allow(dead_code))]
pub(crate) mod jpeg_zune;

use std::io::Cursor;

use super::buffer::{scratch, zeroed, Scratch};
use super::{max_pixels, ColorMode, Format, ImageError};

/// At most this many progressive scans: a crafted progressive JPEG with
/// thousands of tiny scans would otherwise take minutes to decode
/// (libjpeg-turbo's own advice for untrusted input).
const MAX_JPEG_SCANS: usize = 500;

/// Whether this build's JPEG decoder can decode at a reduced `n/8` scale
/// (libjpeg-turbo can; zune-jpeg always decodes at full size).
pub(crate) const JPEG_DCT_SCALING: bool = cfg!(feature = "turbojpeg");

/// The header of an image: enough to plan the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageInfo {
    /// The format, from the first bytes (never the file name).
    pub format: Format,
    /// Width as stored (before EXIF orientation).
    pub width: usize,
    /// Height as stored (before EXIF orientation).
    pub height: usize,
    /// EXIF orientation, 1 (none) to 8; always 1 for PNG, WebP and BMP.
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
    } else if zune_bmp::probe_bmp(data) {
        // "BM" and a known info-header size.
        Some(Format::Bmp)
    } else {
        None
    }
}

/// Refuses a zero size, or more pixels than `limit` (the budget).
pub(crate) fn check_size(
    width: usize,
    height: usize,
    format: Format,
    limit: usize,
) -> Result<(), ImageError> {
    if width == 0 || height == 0 {
        return Err(ImageError::Corrupt {
            name: String::new(),
            format,
            reason: format!("zero image size {width}x{height}"),
        });
    }
    if width.saturating_mul(height) > limit {
        return Err(ImageError::TooLarge {
            name: String::new(),
            width,
            height,
            limit,
        });
    }
    Ok(())
}

/// Checks that `bytes` more can be allocated now, before calling a decoder
/// that allocates about that much inside (image-webp, zune-jpeg) with
/// allocations that would abort the process on failure: a best effort (the
/// memory is released before the decoder asks for it), which turns the
/// common case, an address-space or memory limit far below what a hostile
/// header claims, into an [`ImageError::OutOfMemory`].
pub(crate) fn headroom(bytes: usize) -> Result<(), ImageError> {
    let mut probe: Vec<u8> = Vec::new();
    probe
        .try_reserve_exact(bytes)
        .map_err(|_| ImageError::OutOfMemory {
            name: String::new(),
            bytes,
        })
}

/// Deflate's best compression ratio: a 258-byte match coded in 2 bits
/// (1-bit length and distance codes) gives 1032 output bytes per input
/// byte; no zlib stream decompresses to more.
const DEFLATE_MAX_RATIO: usize = 1032;

/// Refuses a PNG whose file is too short to hold the pixel data its header
/// announces, even at deflate's best ratio: a truncated or hostile file
/// (74 bytes claiming 13000 x 13000) fails before its buffers are allocated.
fn check_png_plausible(data: &[u8], info: &png::Info<'_>) -> Result<(), ImageError> {
    let samples = info.color_type.samples();
    let bits = u64::from(info.bit_depth as u8) * samples as u64;
    // Each row: a filter byte and the packed samples.
    let row = (u64::from(info.width) * bits).div_ceil(8) + 1;
    let raw = row.saturating_mul(u64::from(info.height));
    let most = (data.len() as u64).saturating_mul(DEFLATE_MAX_RATIO as u64);
    if raw > most {
        return Err(corrupt(
            Format::Png,
            format!(
                "truncated: a {}x{} image needs {raw} bytes of pixel data, more than the \
                 {} bytes of the file can hold",
                info.width,
                info.height,
                data.len()
            ),
        ));
    }
    Ok(())
}

#[cold]
#[allow(clippy::needless_pass_by_value)] // takes both errors and &str
fn corrupt(format: Format, reason: impl ToString) -> ImageError {
    ImageError::Corrupt {
        name: String::new(),
        format,
        reason: reason.to_string(),
    }
}

/// The EXIF orientation of a JPEG (1 when absent, unreadable or out of
/// range: a broken EXIF block never fails a decode; Pillow's
/// `exif_transpose` ignores it the same way).
fn jpeg_orientation(data: &[u8]) -> u16 {
    let Some(tiff) = jpeg_exif_segment(data) else {
        return 1;
    };
    let Ok(exif) = exif::Reader::new().read_raw(tiff.to_vec()) else {
        return 1;
    };
    exif.get_field(exif::Tag::Orientation, exif::In::PRIMARY)
        .and_then(|f| f.value.get_uint(0))
        .and_then(|v| u16::try_from(v).ok())
        .filter(|v| (1..=8).contains(v))
        .unwrap_or(1)
}

/// The TIFF data of a JPEG's first EXIF APP1 segment (after its
/// `Exif\0\0` identifier), found among the marker segments before the
/// first scan, as Pillow reads them: bytes between segments that are not
/// a marker are skipped, and so are fill bytes (`0xFF` runs). `None`
/// without such a segment before the first SOS, or when a segment's length
/// runs past the end.
///
/// Written here, rather than calling kamadak-exif's
/// `read_from_container`, because that reader walks on past SOS through
/// the whole entropy-coded data (looking for an APP1 after it), and
/// copies it into a growing `Vec` on the way: a cost per image, on every
/// decode, for a segment that sits in the first bytes of the file.
pub(super) fn jpeg_exif_segment(data: &[u8]) -> Option<&[u8]> {
    const EXIF_ID: &[u8] = b"Exif\0\0";
    let mut pos = 2; // after SOI (the format probe checked it)
    loop {
        // The next marker: skip to a 0xFF, then past any fill 0xFFs.
        pos += data.get(pos..)?.iter().position(|&b| b == 0xFF)?;
        pos += data.get(pos..)?.iter().position(|&b| b != 0xFF)?;
        let code = data[pos];
        pos += 1;
        match code {
            // Not markers (a stuffed 0xFF00 in stray data), or markers
            // without a length: TEM, RST0..RST7, SOI.
            0x00 | 0x01 | 0xD0..=0xD8 => continue,
            // The first scan, or the end: no EXIF before it.
            0xDA | 0xD9 => return None,
            _ => {}
        }
        let len = usize::from(u16::from_be_bytes([*data.get(pos)?, *data.get(pos + 1)?]));
        let segment = data.get(pos + 2..pos.checked_add(len)?)?;
        if code == 0xE1 {
            if let Some(tiff) = segment.strip_prefix(EXIF_ID) {
                return Some(tiff);
            }
        }
        pos += len;
    }
}

/// Reads the header (and, for JPEG, the EXIF orientation).
pub(crate) fn probe(data: &[u8], format: Format) -> Result<ImageInfo, ImageError> {
    let (width, height, orientation) = match format {
        Format::Jpeg => {
            #[cfg(feature = "turbojpeg")]
            let (w, h) = jpeg_turbo::header(data)?;
            #[cfg(not(feature = "turbojpeg"))]
            let (w, h) = jpeg_zune::header(data)?;
            (w, h, jpeg_orientation(data))
        }
        Format::Png => {
            let mut decoder = png::Decoder::new(Cursor::new(data));
            let info = decoder.read_header_info().map_err(|e| corrupt(format, e))?;
            check_png_plausible(data, info)?;
            (info.width as usize, info.height as usize, 1)
        }
        Format::Webp => {
            let decoder =
                image_webp::WebPDecoder::new(Cursor::new(data)).map_err(|e| corrupt(format, e))?;
            let (w, h) = decoder.dimensions();
            (w as usize, h as usize, 1)
        }
        Format::Bmp => {
            let (w, h) = bmp::header(data)?;
            (w, h, 1)
        }
    };
    check_size(width, height, format, max_pixels())?;
    Ok(ImageInfo {
        format,
        width,
        height,
        orientation,
    })
}

/// The size a JPEG decodes to at `num/8` scale (`num` is 8 in builds
/// without DCT scaling).
pub(crate) fn jpeg_scaled_size(info: &ImageInfo, num: usize) -> (usize, usize) {
    #[cfg(feature = "turbojpeg")]
    return jpeg_turbo::scaled_size(info.width, info.height, num);
    #[cfg(not(feature = "turbojpeg"))]
    {
        debug_assert_eq!(num, 8, "zune-jpeg has no DCT scaling");
        (info.width, info.height)
    }
}

/// Decodes a JPEG at `num/8` scale (`num` is 8 in builds without DCT
/// scaling) in `mode` into `out`, rows `pitch` bytes apart (`out` holds at
/// least `pitch * scaled height` bytes). Returns the decoded size.
pub(crate) fn decode_jpeg_into(
    data: &[u8],
    num: usize,
    mode: ColorMode,
    out: &mut [u8],
    pitch: usize,
) -> Result<(usize, usize), ImageError> {
    #[cfg(feature = "turbojpeg")]
    return jpeg_turbo::decode_into(data, num, mode, out, pitch);
    #[cfg(not(feature = "turbojpeg"))]
    {
        debug_assert_eq!(num, 8, "zune-jpeg has no DCT scaling");
        jpeg_zune::decode_into(data, mode, out, pitch)
    }
}

/// A window of an image: `width` x `height` pixels from column `x`, row `y`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Window {
    pub x: usize,
    pub y: usize,
    pub width: usize,
    pub height: usize,
}

/// Decoded pixels of a window.
#[derive(Debug)]
pub(crate) struct WindowPixels {
    /// Packed rows.
    pub pixels: Scratch,
    /// Bytes per pixel: the mode's, or 4 for RGB decoded as RGBX.
    pub channels: usize,
    /// The window they hold.
    pub window: Window,
    /// The size of the whole image (at the scale decoded).
    pub full: (usize, usize),
}

/// Decodes the window `want` (in the coordinates of the image scaled to
/// `num/8`, as stored: before EXIF orientation) of a JPEG in `mode`, into
/// a buffer of packed rows. Returns the buffer, the window it holds
/// (which contains `want` clipped to the image: libjpeg-turbo widens it
/// left to an iMCU boundary), and the size of the whole image at the scale
/// decoded. With `padded`, libjpeg-turbo writes RGB as RGBX (4 bytes a
/// pixel, see [`WindowPixels::channels`]) where it can.
///
/// libjpeg-turbo decodes only the window's rows and iMCU columns (entropy
/// decoding still reads the whole file up to the window's last row); a
/// lossless or unusually subsampled JPEG, which libjpeg-turbo cannot
/// decode partially, and every JPEG in builds without the `turbojpeg`
/// feature (zune-jpeg has no partial decoding, and `num` is then 8) are
/// decoded whole, and the window returned is the whole image.
pub(crate) fn decode_jpeg_window(
    data: &[u8],
    num: usize,
    mode: ColorMode,
    want: Window,
    padded: bool,
) -> Result<WindowPixels, ImageError> {
    #[cfg(feature = "turbojpeg")]
    return jpeg_turbo::decode_window(data, num, mode, want, padded);
    #[cfg(not(feature = "turbojpeg"))]
    {
        debug_assert_eq!(num, 8, "zune-jpeg has no DCT scaling");
        let _ = (want, padded);
        let (w, h) = jpeg_zune::header(data)?;
        let mut buf = scratch(w * h * mode.channels())?;
        let (w, h) = jpeg_zune::decode_into(data, mode, &mut buf, w * mode.channels())?;
        if buf.len() != w * h * mode.channels() {
            return Err(corrupt(Format::Jpeg, "frame size differs from the header"));
        }
        let all = Window {
            x: 0,
            y: 0,
            width: w,
            height: h,
        };
        Ok(WindowPixels {
            pixels: buf,
            channels: mode.channels(),
            window: all,
            full: (w, h),
        })
    }
}

/// Converts `w`-wide Adobe-inverted CMYK (what libjpeg-turbo and zune-jpeg
/// give for CMYK and YCCK JPEGs) to `mode` as Pillow does, into `out`, rows
/// `pitch` bytes apart.
fn write_inverted_cmyk(cmyk: &[u8], w: usize, mode: ColorMode, out: &mut [u8], pitch: usize) {
    let c = mode.channels();
    let mut rgb = vec![0u8; w * 3]; // one row
    for (y, line) in cmyk.chunks_exact(w * 4).enumerate() {
        super::ops::inverted_cmyk_to_rgb(line, &mut rgb);
        let row = &mut out[y * pitch..y * pitch + w * c];
        super::ops::convert_channels(&rgb, 3, row, c);
    }
}

/// A PNG reader that gives 8-bit gray, gray + alpha, RGB or RGBA rows
/// (palettes expanded, 16-bit samples cut to their high byte), for a file
/// that can hold the pixel data its header announces.
fn png_reader(data: &[u8]) -> Result<png::Reader<Cursor<&[u8]>>, ImageError> {
    let mut decoder = png::Decoder::new(Cursor::new(data));
    decoder.set_transformations(png::Transformations::normalize_to_color8());
    let reader = decoder.read_info().map_err(|e| corrupt(Format::Png, e))?;
    check_png_plausible(data, reader.info())?;
    Ok(reader)
}

/// Channels of the 8-bit pixels a [`png_reader`] gives for `color`.
fn png_channels(color: png::ColorType) -> Result<usize, ImageError> {
    match color {
        png::ColorType::Grayscale => Ok(1),
        png::ColorType::GrayscaleAlpha => Ok(2),
        png::ColorType::Rgb => Ok(3),
        png::ColorType::Rgba => Ok(4),
        png::ColorType::Indexed => Err(ImageError::Unsupported {
            name: String::new(),
            format: Format::Png,
            reason: "palette not expanded".into(),
        }),
    }
}

/// Decodes a PNG (any bit depth, palette, alpha, gray) to 8-bit pixels:
/// 16-bit samples keep their high byte, as Pillow's `RGB` mode does.
pub(crate) fn decode_png(data: &[u8]) -> Result<Pixels, ImageError> {
    let fmt = Format::Png;
    let mut reader = png_reader(data)?;
    let size = reader
        .output_buffer_size()
        .ok_or_else(|| corrupt(fmt, "image too large"))?;
    let mut buf = zeroed(size)?;
    let info = reader.next_frame(&mut buf).map_err(|e| corrupt(fmt, e))?;
    let channels = png_channels(info.color_type)?;
    let (width, height) = (info.width as usize, info.height as usize);
    // Rows may be padded to `line_size`; pack them.
    let packed = width * channels;
    if info.line_size == packed {
        buf.truncate(packed * height);
    } else {
        let mut out = Vec::new();
        out.try_reserve_exact(packed * height)
            .map_err(|_| ImageError::OutOfMemory {
                name: String::new(),
                bytes: packed * height,
            })?;
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

/// Decodes the window `want` of a PNG in `mode`, into a new buffer of
/// packed rows. Returns the buffer, the window it holds (`want` clipped to
/// the image) and the image's size.
///
/// A non-interlaced PNG is read row by row and reading stops after the
/// window's last row: the rows below it are neither inflated nor
/// unfiltered (so damage there goes unnoticed, as it does below a JPEG's
/// window), and only the window's pixels are kept. An interlaced PNG, whose
/// every pass reaches the whole image, is decoded whole, and the window
/// returned is then the whole image, as for an empty `want`.
pub(crate) fn decode_png_window(
    data: &[u8],
    mode: ColorMode,
    want: Window,
) -> Result<WindowPixels, ImageError> {
    let fmt = Format::Png;
    let c = mode.channels();
    let mut reader = png_reader(data)?;
    let (width, height) = (reader.info().width as usize, reader.info().height as usize);
    let x1 = (want.x + want.width).min(width);
    let y1 = (want.y + want.height).min(height);
    let (x0, y0) = (want.x.min(x1), want.y.min(y1));
    if reader.info().interlaced || x0 == x1 || y0 == y1 {
        drop(reader);
        let px = decode_png(data)?;
        let mut buf = scratch(px.width * px.height * c)?;
        super::ops::convert_channels(&px.data, px.channels, &mut buf, c);
        let all = Window {
            x: 0,
            y: 0,
            width: px.width,
            height: px.height,
        };
        return Ok(WindowPixels {
            pixels: buf,
            channels: c,
            window: all,
            full: (px.width, px.height),
        });
    }
    let channels = png_channels(reader.output_color_type().0)?;
    let win = Window {
        x: x0,
        y: y0,
        width: x1 - x0,
        height: y1 - y0,
    };
    let packed = win.width * c;
    let mut out = scratch(packed * win.height)?;
    for y in 0..y1 {
        let row = reader
            .next_row()
            .map_err(|e| corrupt(fmt, e))?
            .ok_or_else(|| corrupt(fmt, "fewer rows than the header says"))?;
        if y >= y0 {
            let line = row
                .data()
                .get(x0 * channels..x1 * channels)
                .ok_or_else(|| corrupt(fmt, "a row shorter than the header says"))?;
            let dst = &mut out[(y - y0) * packed..(y - y0 + 1) * packed];
            super::ops::convert_channels(line, channels, dst, c);
        }
    }
    Ok(WindowPixels {
        pixels: out,
        channels: c,
        window: win,
        full: (width, height),
    })
}

/// Decodes a BMP to 8-bit gray, RGB or RGBA.
pub(crate) fn decode_bmp(data: &[u8]) -> Result<Pixels, ImageError> {
    bmp::decode(data)
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
    let mut buf = zeroed(size)?;
    // image-webp allocates its own frame buffers (up to 4 bytes a pixel,
    // infallibly): check that they fit first.
    headroom((w as usize).saturating_mul(h as usize).saturating_mul(4))?;
    decoder.read_image(&mut buf).map_err(|e| corrupt(fmt, e))?;
    Ok(Pixels {
        data: buf,
        width: w as usize,
        height: h as usize,
        channels,
    })
}
