//! Synthetic photo-like images, for the demo, examples, tests and
//! benchmarks: the repository holds no photo files, and `ferrofeed demo`
//! makes its sample at run time.
//!
//! # Example
//!
//! ```
//! use ferrofeed::image::synth::{encode_jpeg, photo, Chroma};
//! use ferrofeed::image::{decode, Transform};
//!
//! let pixels = photo(64, 48, 7);
//! let jpeg = encode_jpeg(&pixels, 64, 48, 90, Chroma::Subsampled)?;
//! let img = decode(&jpeg, "synthetic", &Transform::default())?;
//! assert_eq!((img.width, img.height), (64, 48));
//! # Ok::<(), ferrofeed::image::ImageError>(())
//! ```

#![allow(
    clippy::cast_precision_loss,
    clippy::cast_sign_loss,
    clippy::many_single_char_names
)]

use super::ImageError;

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    fn range(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.unit()
    }

    /// Standard normal (Box-Muller).
    fn gauss(&mut self) -> f32 {
        let u = self.unit().max(f32::MIN_POSITIVE);
        let v = self.unit();
        (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
    }
}

/// One octave of value noise: Gaussian values on a grid of `cell` pixels,
/// bilinearly interpolated, `w * h` values.
fn value_noise(rng: &mut Rng, w: usize, h: usize, cell: usize) -> Vec<f32> {
    let (gw, gh) = (w / cell + 2, h / cell + 2);
    let grid: Vec<f32> = (0..gw * gh).map(|_| rng.gauss()).collect();
    let mut out = Vec::with_capacity(w * h);
    for y in 0..h {
        let (y0, fy) = (y / cell, (y % cell) as f32 / cell as f32);
        for x in 0..w {
            let (x0, fx) = (x / cell, (x % cell) as f32 / cell as f32);
            let g = |yy: usize, xx: usize| grid[yy * gw + xx];
            let top = g(y0, x0) * (1.0 - fx) + g(y0, x0 + 1) * fx;
            let bottom = g(y0 + 1, x0) * (1.0 - fx) + g(y0 + 1, x0 + 1) * fx;
            out.push(top * (1.0 - fy) + bottom * fy);
        }
    }
    out
}

/// Photo-like RGB pixels, `w * h * 3` bytes: a two-colour gradient, 60
/// soft-edged ellipses and rectangles (8 large, 52 small) with some shading,
/// a multi-octave (1/f-like) texture that is strong in some regions and
/// absent in others, a little chroma texture, and sensor-like noise (the
/// same recipe as `benches/decode_vs_pillow.py`). Deterministic in `seed`.
///
/// They compress better than most real photos (smaller files, so less
/// entropy decoding): decode times measured on them are on the optimistic
/// side.
pub fn photo(w: usize, h: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let (wf, hf) = (w as f32, h as f32);
    let color = |rng: &mut Rng| [rng.unit() * 255.0, rng.unit() * 255.0, rng.unit() * 255.0];
    let (top, bottom, side) = (color(&mut rng), color(&mut rng), color(&mut rng));
    let mut img = vec![0f32; w * h * 3];
    for y in 0..h {
        let t = y as f32 / hf;
        for x in 0..w {
            let s = x as f32 / wf * 0.4;
            for k in 0..3 {
                img[(y * w + x) * 3 + k] =
                    (top[k] * (1.0 - t) + bottom[k] * t) * (1.0 - s) + side[k] * s;
            }
        }
    }
    for k in 0..60 {
        let (lo, hi) = if k < 8 { (0.08, 0.3) } else { (0.01, 0.08) };
        let (cx, cy) = (rng.range(0.0, wf), rng.range(0.0, hf));
        let (rx, ry) = (rng.range(lo, hi) * wf, rng.range(lo, hi) * hf);
        let ellipse = rng.unit() < 0.6;
        let edge = rng.range(0.7, 3.0);
        let alpha = rng.range(0.5, 1.0);
        let c = color(&mut rng);
        // Only the shape's bounding box (plus the soft edge) is touched.
        let y1 = (cy - ry - 4.0).max(0.0) as usize;
        let y2 = ((cy + ry + 5.0) as usize).min(h);
        let x1 = (cx - rx - 4.0).max(0.0) as usize;
        let x2 = ((cx + rx + 5.0) as usize).min(w);
        for y in y1..y2 {
            for x in x1..x2 {
                let (dx, dy) = ((x as f32 - cx) / rx, (y as f32 - cy) / ry);
                let d = if ellipse {
                    ((dx * dx + dy * dy).sqrt() - 1.0) * rx.min(ry)
                } else {
                    (dx.abs().max(dy.abs()) - 1.0) * rx.min(ry)
                };
                let cover = (0.5 - d / edge).clamp(0.0, 1.0) * alpha;
                let shade = 1.0 - 0.25 * (dy * 0.5 + 0.5).clamp(0.0, 1.0);
                for (k, &ck) in c.iter().enumerate() {
                    let p = &mut img[(y * w + x) * 3 + k];
                    *p = *p * (1.0 - cover) + ck * shade * cover;
                }
            }
        }
    }
    let mask: Vec<f32> = value_noise(&mut rng, w, h, 96)
        .into_iter()
        .map(|v| (v * 0.8 + 0.5).clamp(0.0, 1.0))
        .collect();
    let mut lum = vec![0f32; w * h];
    for (cell, amp) in [(32, 12.0), (16, 10.0), (8, 9.0), (4, 8.0), (2, 7.0)] {
        for (l, v) in lum.iter_mut().zip(value_noise(&mut rng, w, h, cell)) {
            *l += amp * v;
        }
    }
    for k in 0..3 {
        let mut chroma = vec![0f32; w * h];
        for cell in [8, 4, 2] {
            for (l, v) in chroma.iter_mut().zip(value_noise(&mut rng, w, h, cell)) {
                *l += v;
            }
        }
        for (i, ch) in chroma.iter().enumerate() {
            img[i * 3 + k] += 3.0 * mask[i] * lum[i] + 8.0 * mask[i] * ch;
        }
    }
    img.iter()
        .map(|&p| {
            // Noise of standard deviation 3 (a sum of three uniforms).
            let noise = 3.0 * (rng.range(-1.0, 1.0) + rng.range(-1.0, 1.0) + rng.range(-1.0, 1.0));
            (p + noise).clamp(0.0, 255.0) as u8
        })
        .collect()
}

/// How a JPEG stores its chroma.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Chroma {
    /// Halved both ways (4:2:0), as most camera and `ImageNet` JPEGs.
    #[default]
    Subsampled,
    /// Full resolution (4:4:4).
    Full,
}

/// Encodes RGB pixels (`w * h * 3` bytes) as a baseline JPEG at `quality`
/// (1 to 100) with jpeg-encoder (pure Rust, so the bytes are the same in
/// every build): libjpeg's quantization tables and quality scaling,
/// standard Huffman tables, box-filtered chroma as libjpeg downsamples.
///
/// # Errors
///
/// [`ImageError::Encode`] for a pixel buffer of the wrong size, a side over
/// 65,535, a quality out of range, or a failure of the encoder.
pub fn encode_jpeg(
    pixels: &[u8],
    w: usize,
    h: usize,
    quality: u8,
    chroma: Chroma,
) -> Result<Vec<u8>, ImageError> {
    let encode = |reason: String| ImageError::Encode { reason };
    if pixels.len() != w * h * 3 || w == 0 || h == 0 {
        return Err(encode(format!(
            "{} bytes are not a {w}x{h} RGB image",
            pixels.len()
        )));
    }
    if !(1..=100).contains(&quality) {
        return Err(encode(format!("JPEG quality is 1 to 100, not {quality}")));
    }
    let (Ok(w16), Ok(h16)) = (u16::try_from(w), u16::try_from(h)) else {
        return Err(encode(format!(
            "{w}x{h} exceeds JPEG's 65535 pixels a side"
        )));
    };
    let mut out = Vec::new();
    let mut e = jpeg_encoder::Encoder::new(&mut out, quality);
    e.set_sampling_factor(match chroma {
        Chroma::Subsampled => jpeg_encoder::SamplingFactor::R_4_2_0,
        Chroma::Full => jpeg_encoder::SamplingFactor::R_4_4_4,
    });
    e.set_chroma_subsampling_method(jpeg_encoder::ChromaSubsamplingMethod::Average);
    e.encode(pixels, w16, h16, jpeg_encoder::ColorType::Rgb)
        .map_err(|err| encode(err.to_string()))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn photos_are_deterministic_and_differ_by_seed() {
        assert_eq!(photo(40, 30, 1), photo(40, 30, 1));
        assert_ne!(photo(40, 30, 1), photo(40, 30, 2));
        assert_eq!(photo(40, 30, 1).len(), 40 * 30 * 3);
    }

    #[test]
    fn encode_refuses_bad_input() {
        assert!(encode_jpeg(&[0; 10], 2, 2, 90, Chroma::Subsampled).is_err());
        assert!(encode_jpeg(&[0; 12], 2, 2, 0, Chroma::Subsampled).is_err());
        assert!(encode_jpeg(&[0; 12], 2, 2, 101, Chroma::Full).is_err());
    }

    #[test]
    fn encoded_photo_decodes_close_to_the_original() {
        let (w, h) = (96, 64);
        let px = photo(w, h, 3);
        let jpeg = encode_jpeg(&px, w, h, 95, Chroma::Full).unwrap();
        let img = crate::image::decode(&jpeg, "p", &crate::image::Transform::default()).unwrap();
        let mad = px
            .iter()
            .zip(&img.data)
            .map(|(a, b)| f64::from(a.abs_diff(*b)))
            .sum::<f64>()
            / px.len() as f64;
        assert!(mad < 6.0, "mean absolute difference {mad}");
    }
}
