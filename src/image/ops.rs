//! Pixel kernels: color conversion, EXIF orientation, resample into a
//! region of the output, horizontal flip.

use std::cell::RefCell;

use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

use super::buffer::Scratch;
use super::plan::{RectF, RectU};

thread_local! {
    /// One resizer per thread: it keeps its scratch buffers between images.
    static RESIZER: RefCell<Resizer> = RefCell::new(Resizer::new());
}

/// Pillow's `RGB` -> `L`: ITU-R 601-2 luma with 16-bit fixed point weights
/// (`L = R * 299/1000 + G * 587/1000 + B * 114/1000`, rounded).
#[inline]
pub(crate) fn luma(r: u8, g: u8, b: u8) -> u8 {
    ((u32::from(r) * 19595 + u32::from(g) * 38470 + u32::from(b) * 7471 + 0x8000) >> 16) as u8
}

/// Pillow's `MULDIV255`: `a * b / 255`, rounded.
#[inline]
fn muldiv255(a: u32, b: u32) -> u32 {
    let t = a * b + 128;
    ((t >> 8) + t) >> 8
}

/// Adobe (inverted) CMYK as libjpeg returns it -> RGB, as Pillow's
/// `CMYK;I` unpacking followed by `convert("RGB")` computes it.
pub(crate) fn inverted_cmyk_to_rgb(cmyk: &[u8], rgb: &mut [u8]) {
    for (src, dst) in cmyk.chunks_exact(4).zip(rgb.chunks_exact_mut(3)) {
        let nk = u32::from(src[3]);
        for i in 0..3 {
            let c = 255 - u32::from(src[i]);
            dst[i] = nk.saturating_sub(muldiv255(c, nk)) as u8;
        }
    }
}

/// Converts `n` pixels of `from` channels (1: gray, 2: gray+alpha, 3: RGB,
/// 4: RGBA) into `to` channels (1 or 3); alpha is dropped, as Pillow's
/// `convert("RGB")` / `convert("L")` drop it.
pub(crate) fn convert_channels(src: &[u8], from: usize, dst: &mut [u8], to: usize) {
    match (from, to) {
        (a, b) if a == b => dst.copy_from_slice(src),
        (1 | 2, 1) => {
            for (s, d) in src.chunks_exact(from).zip(dst.iter_mut()) {
                *d = s[0];
            }
        }
        (1 | 2, 3) => {
            for (s, d) in src.chunks_exact(from).zip(dst.chunks_exact_mut(3)) {
                d.fill(s[0]);
            }
        }
        (3 | 4, 3) => {
            for (s, d) in src.chunks_exact(from).zip(dst.chunks_exact_mut(3)) {
                d.copy_from_slice(&s[..3]);
            }
        }
        (3 | 4, 1) => {
            for (s, d) in src.chunks_exact(from).zip(dst.iter_mut()) {
                *d = luma(s[0], s[1], s[2]);
            }
        }
        _ => unreachable!("channel counts are 1 to 4, output 1 or 3"),
    }
}

#[allow(clippy::many_single_char_names)]
/// Applies EXIF `orientation` (2..=8) to a `w` x `h` image of `c` channels;
/// returns the new buffer and its width and height.
pub(crate) fn orient(
    src: &[u8],
    w: usize,
    h: usize,
    c: usize,
    orientation: u16,
) -> Result<(Scratch, usize, usize), super::ImageError> {
    let transposed = orientation >= 5;
    let (ow, oh) = if transposed { (h, w) } else { (w, h) };
    // Every pixel is written below.
    let mut out = super::buffer::scratch(ow * oh * c)?;
    for oy in 0..oh {
        for ox in 0..ow {
            let (sx, sy) = match orientation {
                2 => (w - 1 - ox, oy),
                3 => (w - 1 - ox, h - 1 - oy),
                4 => (ox, h - 1 - oy),
                5 => (oy, ox),
                6 => (oy, h - 1 - ox),
                7 => (w - 1 - oy, h - 1 - ox),
                8 => (w - 1 - oy, ox),
                _ => (ox, oy),
            };
            let s = (sy * w + sx) * c;
            let d = (oy * ow + ox) * c;
            out[d..d + c].copy_from_slice(&src[s..s + c]);
        }
    }
    Ok((out, ow, oh))
}

fn pixel_type(c: usize) -> PixelType {
    if c == 1 {
        PixelType::U8
    } else {
        PixelType::U8x3
    }
}

/// Whether `v` is (within float noise) the integer `n`.
#[allow(clippy::cast_precision_loss)]
fn is_int(v: f64, n: usize) -> bool {
    (v - n as f64).abs() < 1e-9
}

/// `v` as an integer, if it is one (within float noise) and non-negative.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn as_int(v: f64) -> Option<usize> {
    let r = v.round();
    (r >= 0.0 && (v - r).abs() < 1e-9).then_some(r as usize)
}

/// Resamples the `rect` of a `sw` x `sh` image of `c` channels (antialiased
/// bilinear, Pillow's `BILINEAR`) onto the `dst` region of an `out_w` x
/// `out_h` output; the output outside `dst` is zeroed. A rectangle that is
/// integral and already the size of `dst` is copied, not resampled.
///
/// # Errors
///
/// The resizer's error message (it only fails on inconsistent sizes, which
/// the plan rules out).
#[allow(
    clippy::too_many_arguments,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]
pub(crate) fn resample(
    src: &[u8],
    sw: usize,
    sh: usize,
    c: usize,
    rect: RectF,
    out: &mut [u8],
    out_w: usize,
    out_h: usize,
    dst: RectU,
) -> Result<(), String> {
    let full = dst.x == 0 && dst.y == 0 && dst.width == out_w && dst.height == out_h;
    if !full {
        out.fill(0);
    }
    let row = out_w * c;
    let copy = as_int(rect.left).zip(as_int(rect.top));
    if let Some((left, top)) = copy {
        if is_int(rect.width, dst.width) && is_int(rect.height, dst.height) {
            for y in 0..dst.height {
                let s = ((top + y) * sw + left) * c;
                let d = (dst.y + y) * row + dst.x * c;
                out[d..d + dst.width * c].copy_from_slice(&src[s..s + dst.width * c]);
            }
            return Ok(());
        }
    }
    let pixel = pixel_type(c);
    let (dw, dh) = (dst.width, dst.height);
    if full {
        convolve(
            src,
            (sw, sh),
            pixel,
            rect,
            &mut out[..out_w * out_h * c],
            (dw, dh),
        )
    } else {
        let mut tmp = vec![0u8; dw * dh * c];
        convolve(src, (sw, sh), pixel, rect, &mut tmp, (dw, dh))?;
        for (y, line) in tmp.chunks_exact(dst.width * c).enumerate() {
            let d = (dst.y + y) * row + dst.x * c;
            out[d..d + line.len()].copy_from_slice(line);
        }
        Ok(())
    }
}

/// [`resample`] of an RGBX image (4 bytes a pixel, the fourth ignored)
/// onto the whole of an `out_w` x `out_h` RGB output, mirrored left-right
/// with `mirror`.
///
/// The resizer runs over 4-byte pixels about a quarter faster than over
/// 3-byte ones (224 x 224 from about 300 x 300: 100 against 140 us), which
/// pays for the packing (about 18 us); the packing also does the flip, at
/// no extra cost, where a flip of its own took about 28.
///
/// # Errors
///
/// As [`resample`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn resample_rgbx(
    src: &[u8],
    sw: usize,
    sh: usize,
    rect: RectF,
    out: &mut [u8],
    out_w: usize,
    out_h: usize,
    mirror: bool,
) -> Result<(), String> {
    let copy = as_int(rect.left)
        .zip(as_int(rect.top))
        .filter(|_| is_int(rect.width, out_w) && is_int(rect.height, out_h));
    if let Some((left, top)) = copy {
        // A crop without scaling: pack the rectangle's rows.
        let rows =
            (top..top + out_h).map(|y| &src[(y * sw + left) * 4..(y * sw + left + out_w) * 4]);
        pack_rgbx(rows, out, out_w, mirror);
        return Ok(());
    }
    let mut tmp = super::buffer::scratch(out_w * out_h * 4).map_err(|e| e.to_string())?;
    convolve(
        src,
        (sw, sh),
        PixelType::U8x4,
        rect,
        &mut tmp,
        (out_w, out_h),
    )?;
    pack_rgbx(tmp.chunks_exact(out_w * 4), out, out_w, mirror);
    Ok(())
}

/// The antialiased bilinear resample of `rect` of a `sw` x `sh` image of
/// `pixel`s onto all of `out` (`dw` x `dh` of them), on this thread's
/// resizer. A fourth byte is padding, never alpha (no premultiplying).
fn convolve(
    src: &[u8],
    (sw, sh): (usize, usize),
    pixel: PixelType,
    rect: RectF,
    out: &mut [u8],
    (dw, dh): (usize, usize),
) -> Result<(), String> {
    let to_u32 = |v: usize| u32::try_from(v).map_err(|_| format!("dimension {v} is too large"));
    let src_img = ImageRef::new(to_u32(sw)?, to_u32(sh)?, src, pixel).map_err(|e| e.to_string())?;
    let options = ResizeOptions::new()
        .resize_alg(ResizeAlg::Convolution(FilterType::Bilinear))
        .crop(rect.left, rect.top, rect.width, rect.height)
        .use_alpha(false);
    let mut dst_img =
        Image::from_slice_u8(to_u32(dw)?, to_u32(dh)?, out, pixel).map_err(|e| e.to_string())?;
    RESIZER.with(|r| {
        r.borrow_mut()
            .resize(&src_img, &mut dst_img, &options)
            .map_err(|e| e.to_string())
    })
}

/// Writes `rows` of `w` RGBX pixels into `out` as RGB, each row mirrored
/// with `mirror`.
///
/// Four pixels at a time, as three 32-bit words: a pixel at a time is
/// two stores per pixel (a 2-byte and a 1-byte one), and took a quarter
/// longer (224 x 224 into slots not in cache: 22-24 against 17.5-18 us).
/// Plain safe code: an SSSE3 byte shuffle (tried) was no faster end to
/// end, the time then going to writing the slot's cold memory.
fn pack_rgbx<'a>(rows: impl Iterator<Item = &'a [u8]>, out: &mut [u8], w: usize, mirror: bool) {
    for (src, dst) in rows.zip(out.chunks_exact_mut(w * 3)) {
        let src = &src[..w * 4];
        let (groups, dst_rest) = dst.as_chunks_mut::<12>();
        if mirror {
            // The `w % 4` pixels left over are the row's first ones: they
            // end the mirrored row. The groups of 4 after them are read
            // from the row's end, each written out last pixel first.
            // (Slices of arrays, reversed: `rchunks_exact` is as right,
            // but compiles to a loop a third slower.)
            let (src_rest, body) = src.split_at((w % 4) * 4);
            for (d, s) in groups.iter_mut().zip(body.as_chunks::<16>().0.iter().rev()) {
                let p = words(s);
                *d = pack4([p[3], p[2], p[1], p[0]]);
            }
            let rest = src_rest.as_chunks::<4>().0.iter().rev();
            for (d, s) in dst_rest.chunks_exact_mut(3).zip(rest) {
                d.copy_from_slice(&s[..3]);
            }
        } else {
            let (chunks, src_rest) = src.as_chunks::<16>();
            for (d, s) in groups.iter_mut().zip(chunks) {
                *d = pack4(words(s));
            }
            for (d, s) in dst_rest.chunks_exact_mut(3).zip(src_rest.chunks_exact(4)) {
                d.copy_from_slice(&s[..3]);
            }
        }
    }
}

/// Four RGBX pixels as little-endian words (`R | G << 8 | B << 16 | X << 24`).
fn words(s: &[u8; 16]) -> [u32; 4] {
    let word = |i: usize| u32::from_le_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]);
    [word(0), word(4), word(8), word(12)]
}

/// The 12 RGB bytes of four RGBX pixels (given as [`words`]), padding dropped.
fn pack4([p0, p1, p2, p3]: [u32; 4]) -> [u8; 12] {
    let a = (p0 & 0x00FF_FFFF) | (p1 << 24);
    let b = ((p1 >> 8) & 0xFFFF) | (p2 << 16);
    let c = ((p2 >> 16) & 0xFF) | (p3 << 8);
    let mut out = [0; 12];
    out[..4].copy_from_slice(&a.to_le_bytes());
    out[4..8].copy_from_slice(&b.to_le_bytes());
    out[8..].copy_from_slice(&c.to_le_bytes());
    out
}

/// Mirrors each row of a `w`-pixel-wide image of `c` channels in place.
pub(crate) fn flip_horizontal(img: &mut [u8], w: usize, c: usize) {
    if w == 0 {
        return;
    }
    for row in img.chunks_exact_mut(w * c) {
        match c {
            1 => row.reverse(),
            // Whole pixels as arrays: the compiler swaps them as units (and
            // vectorizes), where a byte-by-byte swap does not.
            3 => row.as_chunks_mut::<3>().0.reverse(),
            4 => row.as_chunks_mut::<4>().0.reverse(),
            _ => {
                for x in 0..w / 2 {
                    let (a, b) = (x * c, (w - 1 - x) * c);
                    for k in 0..c {
                        row.swap(a + k, b + k);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orientations_match_their_definition() {
        // 3 x 2 gray image: 0 1 2 / 3 4 5
        let src = [0u8, 1, 2, 3, 4, 5];
        let cases: [(u16, &[u8], usize); 7] = [
            (2, &[2, 1, 0, 5, 4, 3], 3),
            (3, &[5, 4, 3, 2, 1, 0], 3),
            (4, &[3, 4, 5, 0, 1, 2], 3),
            (5, &[0, 3, 1, 4, 2, 5], 2),
            (6, &[3, 0, 4, 1, 5, 2], 2),
            (7, &[5, 2, 4, 1, 3, 0], 2),
            (8, &[2, 5, 1, 4, 0, 3], 2),
        ];
        for (o, want, w) in cases {
            let (out, ow, _) = orient(&src, 3, 2, 1, o).unwrap();
            assert_eq!((&out[..], ow), (want, w), "orientation {o}");
        }
    }

    #[test]
    fn flip_rgb_and_gray() {
        let mut rgb = [1u8, 2, 3, 4, 5, 6, 7, 8, 9];
        flip_horizontal(&mut rgb, 3, 3);
        assert_eq!(rgb, [7, 8, 9, 4, 5, 6, 1, 2, 3]);
        let mut g = [1u8, 2, 3, 4];
        flip_horizontal(&mut g, 2, 1);
        assert_eq!(g, [2, 1, 4, 3]);
        // Every channel count (the 3 and 4 fast paths, the general one), odd and even
        // widths, several rows: pixel x of each row becomes pixel w - 1 - x.
        for c in 1..=5 {
            for w in 1..=7 {
                let img: Vec<u8> = (0..w * c * 3).map(|i| (i * 7 % 251) as u8).collect();
                let mut got = img.clone();
                flip_horizontal(&mut got, w, c);
                for (y, row) in got.chunks_exact(w * c).enumerate() {
                    for x in 0..w {
                        let src = (y * w + (w - 1 - x)) * c;
                        assert_eq!(&row[x * c..x * c + c], &img[src..src + c], "c {c} w {w}");
                    }
                }
            }
        }
    }

    #[test]
    fn conversions() {
        assert_eq!(luma(255, 255, 255), 255);
        assert_eq!(luma(0, 0, 0), 0);
        assert_eq!(luma(255, 0, 0), 76); // Pillow: Image.new("RGB", (1,1), (255,0,0)).convert("L")
        let mut out = [0u8; 6];
        convert_channels(&[10, 20, 30, 40, 50, 60, 70, 80], 4, &mut out, 3);
        assert_eq!(out, [10, 20, 30, 50, 60, 70]);
        let mut rgb = [0u8; 3];
        // Inverted CMYK (255, 255, 255, 255) is "no ink": white.
        inverted_cmyk_to_rgb(&[255, 255, 255, 255], &mut rgb);
        assert_eq!(rgb, [255, 255, 255]);
        inverted_cmyk_to_rgb(&[255, 255, 255, 0], &mut rgb);
        assert_eq!(rgb, [0, 0, 0]);
    }

    #[test]
    fn integral_crop_is_a_copy_and_padding_is_zero() {
        let src: Vec<u8> = (0..16).collect(); // 4 x 4 gray
        let mut out = [9u8; 6]; // 3 wide, 2 high
        let rect = RectF::new(1.0, 2.0, 2.0, 2.0);
        let dst = RectU::new(1, 0, 2, 2);
        resample(&src, 4, 4, 1, rect, &mut out, 3, 2, dst).unwrap();
        assert_eq!(out, [0, 9, 10, 0, 13, 14]);
    }

    #[test]
    fn resize_of_a_flat_image_is_flat() {
        let src = vec![77u8; 40 * 30 * 3];
        let mut out = vec![0u8; 7 * 5 * 3];
        let rect = RectF::new(0.0, 0.0, 40.0, 30.0);
        let dst = RectU::new(0, 0, 7, 5);
        resample(&src, 40, 30, 3, rect, &mut out, 7, 5, dst).unwrap();
        assert!(out.iter().all(|&v| v == 77));
    }

    /// Packing RGBX rows of every width from 1 to 40 gives each pixel's
    /// first three bytes, mirrored or not.
    #[test]
    fn packing_drops_the_padding_at_every_width() {
        for w in 1..=40usize {
            let h = 3;
            let src: Vec<u8> = (0..w * h * 4).map(|i| (i * 37 % 256) as u8).collect();
            for mirror in [false, true] {
                let mut want = Vec::new();
                for row in src.chunks_exact(w * 4) {
                    let px: Vec<&[u8]> = row.chunks_exact(4).map(|p| &p[..3]).collect();
                    let px: Vec<&[u8]> = if mirror {
                        px.into_iter().rev().collect()
                    } else {
                        px
                    };
                    want.extend(px.concat());
                }
                let mut got = vec![0u8; w * h * 3];
                pack_rgbx(src.chunks_exact(w * 4), &mut got, w, mirror);
                assert_eq!(got, want, "width {w}, mirror {mirror}");
                // Rows handed over longer than `w` pixels (a crop's rows):
                // only their first `w` pixels count.
                let padded: Vec<u8> = src
                    .chunks_exact(w * 4)
                    .flat_map(|row| row.iter().copied().chain([0xEE; 12]))
                    .collect();
                let mut got = vec![0u8; w * h * 3];
                pack_rgbx(padded.chunks_exact(w * 4 + 12), &mut got, w, mirror);
                assert_eq!(got, want, "width {w}, mirror {mirror}, longer rows");
            }
        }
    }

    /// The RGBX path gives exactly the RGB path's pixels (then flipped):
    /// downscales, upscales, fractional and integral rectangles (a copy).
    #[test]
    fn rgbx_resample_equals_the_rgb_one() {
        let (sw, sh) = (61, 47);
        let rgb: Vec<u8> = (0..sw * sh * 3)
            .map(|i| ((i * 7919 + i / 5 * 31) % 251) as u8)
            .collect();
        let mut rgbx = Vec::new();
        for (i, px) in rgb.chunks_exact(3).enumerate() {
            rgbx.extend_from_slice(px);
            rgbx.push((i % 256) as u8); // padding: must not show
        }
        let cases = [
            ((1.5, 2.25, 50.5, 40.0), (16, 12)),
            ((0.0, 0.0, 61.0, 47.0), (61, 47)),
            ((3.0, 5.0, 20.0, 9.0), (20, 9)),
            ((10.3, 7.7, 12.2, 9.9), (33, 21)),
            ((0.0, 0.0, 61.0, 47.0), (7, 30)),
        ];
        for ((left, top, width, height), (ow, oh)) in cases {
            let rect = RectF::new(left, top, width, height);
            let dst = RectU::new(0, 0, ow, oh);
            for mirror in [false, true] {
                let mut want = vec![0u8; ow * oh * 3];
                resample(&rgb, sw, sh, 3, rect, &mut want, ow, oh, dst).unwrap();
                if mirror {
                    flip_horizontal(&mut want, ow, 3);
                }
                let mut got = vec![0u8; ow * oh * 3];
                resample_rgbx(&rgbx, sw, sh, rect, &mut got, ow, oh, mirror).unwrap();
                assert!(got == want, "{rect:?} -> {ow}x{oh}, mirror {mirror}");
            }
        }
    }
}
