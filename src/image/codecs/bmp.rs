//! BMP through zune-bmp (8 bit palette and gray, 24 and 32 bit, bit fields,
//! RLE4 and RLE8, OS/2 headers, bottom-up and top-down), 1/2/4 and 16-bit
//! images decoded here (zune-bmp 0.5 gets their row lengths wrong), and a
//! check of our own that the pixel data is all there: zune-bmp fills missing
//! pixels with zeros, and a truncated file must be an error (as for Pillow).

use zune_bmp::zune_core::bytestream::ZCursor;
use zune_bmp::zune_core::colorspace::ColorSpace;
use zune_bmp::zune_core::options::DecoderOptions;
use zune_bmp::{BmpDecoder, BmpDecoderErrors};

use super::{corrupt, zeroed, ImageError, Pixels};
use crate::image::{Format, MAX_PIXELS_CEILING};

const FMT: Format = Format::Bmp;

#[cold]
#[allow(clippy::needless_pass_by_value)] // an error is consumed
fn error(e: BmpDecoderErrors) -> ImageError {
    // zune-bmp's messages end with a newline.
    corrupt(FMT, format!("{e:?}").trim_end())
}

fn decoder(data: &[u8]) -> BmpDecoder<ZCursor<&[u8]>> {
    // No size limit of zune's own: sizes are checked against the pixel
    // budget (`image::max_pixels`).
    let options = DecoderOptions::default()
        .set_max_width(MAX_PIXELS_CEILING)
        .set_max_height(MAX_PIXELS_CEILING);
    BmpDecoder::new_with_options(ZCursor::new(data), options)
}

/// The stored `(width, height)`.
pub(crate) fn header(data: &[u8]) -> Result<(usize, usize), ImageError> {
    let mut d = decoder(data);
    d.decode_headers().map_err(error)?;
    d.dimensions()
        .ok_or_else(|| corrupt(FMT, "no image header"))
}

fn u16_at(data: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(data.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
}

/// The fields of the file and info headers that the checks below need.
struct Header {
    /// Where the pixel data starts.
    offset: usize,
    /// The size of the info header (12 for OS/2 1.x, 40 and more for Windows).
    info_size: usize,
    width: usize,
    height: usize,
    /// Rows stored top first (a negative height).
    top_down: bool,
    bpp: usize,
    /// 0 `BI_RGB`, 1 `BI_RLE8`, 2 `BI_RLE4`, 3 `BI_BITFIELDS`, ...
    compression: u32,
    /// The declared size of the pixel data (0: not given).
    image_size: usize,
    /// The declared number of palette entries (0: `2^bpp`).
    colors_used: usize,
}

impl Header {
    fn parse(data: &[u8]) -> Option<Self> {
        let offset = u32_at(data, 10)? as usize;
        let info_size = u32_at(data, 14)? as usize;
        if info_size == 12 {
            // OS/2 1.x: 16-bit sizes, never compressed.
            return Some(Self {
                offset,
                info_size,
                width: usize::from(u16_at(data, 18)?),
                height: usize::from(u16_at(data, 20)?),
                top_down: false,
                bpp: usize::from(u16_at(data, 24)?),
                compression: 0,
                image_size: 0,
                colors_used: 0,
            });
        }
        // Negative for a top-down image.
        let height = u32_at(data, 22)?.cast_signed();
        let at_least = |n: usize, at: usize| -> Option<u32> {
            if info_size >= n {
                u32_at(data, at)
            } else {
                Some(0)
            }
        };
        Some(Self {
            offset,
            info_size,
            width: u32_at(data, 18)? as usize,
            height: height.unsigned_abs() as usize,
            top_down: height < 0,
            bpp: usize::from(u16_at(data, 28)?),
            compression: at_least(20, 30)?,
            image_size: at_least(24, 34)? as usize,
            colors_used: at_least(36, 46)? as usize,
        })
    }

    /// The bytes of one stored row (padded to 4 bytes), uncompressed.
    fn stride(&self) -> Option<usize> {
        Some(self.width.checked_mul(self.bpp)?.checked_add(31)? / 32 * 4)
    }

    /// The number of bytes the file needs to hold all of its pixel data, when
    /// the header says (uncompressed and bit-field data: the pixel offset
    /// plus the padded rows; RLE: the offset plus the declared data size).
    fn needed_len(&self) -> Option<usize> {
        match self.compression {
            // BI_RGB, BI_BITFIELDS.
            0 | 3 => self
                .offset
                .checked_add(self.stride()?.checked_mul(self.height)?),
            // BI_RLE8, BI_RLE4.
            1 | 2 if self.image_size > 0 => self.offset.checked_add(self.image_size),
            _ => None,
        }
    }
}

/// Uncompressed 1, 2 and 4-bit palette images, decoded here: zune-bmp 0.5
/// does not skip the padding at the end of their rows (every row after the
/// first came out shifted unless the row length was a multiple of 4 bytes).
fn decode_low_depth(data: &[u8], h: &Header) -> Result<Pixels, ImageError> {
    let entry = if h.info_size == 12 { 3 } else { 4 };
    let max_colors = 1usize << h.bpp;
    let colors = if h.colors_used == 0 || h.colors_used > max_colors {
        max_colors
    } else {
        h.colors_used
    };
    let start = 14 + h.info_size;
    let table = data
        .get(start..start + colors * entry)
        .filter(|_| start + colors * entry <= h.offset)
        .ok_or_else(|| corrupt(FMT, "truncated palette"))?;
    // Indices past the palette are black, as Pillow leaves them.
    let mut palette = [[0u8; 3]; 16];
    for (p, e) in palette.iter_mut().zip(table.chunks_exact(entry)) {
        *p = [e[2], e[1], e[0]];
    }
    let stride = h.stride().ok_or_else(|| corrupt(FMT, "image too large"))?;
    let per_byte = 8 / h.bpp;
    let mask = (1u8 << h.bpp) - 1;
    let mut out = zeroed(h.width * h.height * 3)?;
    for (y, row) in out.chunks_exact_mut(h.width * 3).enumerate() {
        let stored = if h.top_down { y } else { h.height - 1 - y };
        let at = h.offset + stored * stride;
        let src = data
            .get(at..at + stride)
            .ok_or_else(|| corrupt(FMT, "truncated pixel data"))?;
        for (x, px) in row.chunks_exact_mut(3).enumerate() {
            let shift = 8 - h.bpp * (x % per_byte + 1);
            let index = (src[x / per_byte] >> shift) & mask;
            px.copy_from_slice(&palette[usize::from(index)]);
        }
    }
    Ok(Pixels {
        data: out,
        width: h.width,
        height: h.height,
        channels: 3,
    })
}

/// 16-bit images (`BI_RGB`: 5-5-5; `BI_BITFIELDS`: the masks of the header),
/// decoded here: zune-bmp 0.5 reads their rows with the wrong length (the
/// top rows came out black in the tests). Each channel is scaled as Pillow
/// scales it, `value * 255 / max` rounded down.
fn decode_16_bit(data: &[u8], h: &Header) -> Result<Pixels, ImageError> {
    let masks = match h.compression {
        0 => [0x7C00, 0x03E0, 0x001F],
        3 if h.info_size >= 40 => {
            // Right after the 40-byte header (or inside a larger one): the
            // same file offsets either way.
            let m = |at| u32_at(data, at).ok_or_else(|| corrupt(FMT, "truncated bit masks"));
            [m(54)?, m(58)?, m(62)?]
        }
        _ => {
            return Err(ImageError::Unsupported {
                name: String::new(),
                format: FMT,
                reason: format!("16-bit image with compression {}", h.compression),
            })
        }
    };
    let channels = masks.map(|mask| {
        let shift = mask.trailing_zeros().min(31);
        (mask, shift, mask >> shift)
    });
    let stride = h.stride().ok_or_else(|| corrupt(FMT, "image too large"))?;
    let mut out = zeroed(h.width * h.height * 3)?;
    for (y, row) in out.chunks_exact_mut(h.width * 3).enumerate() {
        let stored = if h.top_down { y } else { h.height - 1 - y };
        let at = h.offset + stored * stride;
        let src = data
            .get(at..at + 2 * h.width)
            .ok_or_else(|| corrupt(FMT, "truncated pixel data"))?;
        for (px, v) in row.chunks_exact_mut(3).zip(src.chunks_exact(2)) {
            let v = u32::from(u16::from_le_bytes([v[0], v[1]]));
            for (out, &(mask, shift, max)) in px.iter_mut().zip(&channels) {
                *out = if max == 0 {
                    0
                } else {
                    u64::from((v & mask) >> shift) * 255 / u64::from(max)
                } as u8;
            }
        }
    }
    Ok(Pixels {
        data: out,
        width: h.width,
        height: h.height,
        channels: 3,
    })
}

/// Decodes to 8-bit gray, RGB or RGBA.
pub(crate) fn decode(data: &[u8]) -> Result<Pixels, ImageError> {
    let mut d = decoder(data);
    d.decode_headers().map_err(error)?;
    let header = Header::parse(data).ok_or_else(|| corrupt(FMT, "truncated header"))?;
    if let Some(needed) = header.needed_len() {
        if data.len() < needed {
            return Err(corrupt(
                FMT,
                format!("truncated: {} bytes, the header needs {needed}", data.len()),
            ));
        }
    }
    if header.compression == 0 && matches!(header.bpp, 1 | 2 | 4) {
        return decode_low_depth(data, &header);
    }
    if header.bpp == 16 {
        return decode_16_bit(data, &header);
    }
    let (width, height) = d
        .dimensions()
        .ok_or_else(|| corrupt(FMT, "no image header"))?;
    let channels = match d.colorspace() {
        Some(ColorSpace::Luma) => 1,
        Some(ColorSpace::RGB) => 3,
        Some(ColorSpace::RGBA) => 4,
        other => {
            return Err(ImageError::Unsupported {
                name: String::new(),
                format: FMT,
                reason: format!("pixel format {other:?}"),
            })
        }
    };
    // Into a buffer of ours, allocated fallibly (zune's `decode` allocates
    // the whole image with `vec!`, which aborts the process when an RLE
    // file of a few bytes claims a huge size and memory is short).
    let size = d
        .output_buf_size()
        .filter(|&n| n == width * height * channels)
        .ok_or_else(|| corrupt(FMT, "decoded size differs from the header"))?;
    let mut data = zeroed(size)?;
    d.decode_into(&mut data).map_err(error)?;
    Ok(Pixels {
        data,
        width,
        height,
        channels,
    })
}
