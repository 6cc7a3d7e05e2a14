//! Re-encoding an image at a smaller size: the usual `ImageNet`
//! preprocessing of a dataset before it is packed (`--resize 256 --quality
//! 90`).
//!
//! The image is decoded by [`crate::image::decode`] (EXIF orientation
//! applied, a JPEG decoded at the smallest `n/8` DCT scale that still
//! covers the output), its shorter side resized to [`Reencode::shorter`]
//! (antialiased bilinear, as torchvision's `Resize(256)`, which enlarges a
//! smaller image too), and encoded as a baseline JPEG with 4:2:0 chroma:
//! by libjpeg-turbo with the `turbojpeg` feature (the wheel's build), by
//! jpeg-encoder without it. The output is the same bytes for the same
//! input in one build, whatever the threads; two builds may differ.

use crate::image::{self, Transform};

/// Re-encode the image field: shorter side to `shorter` pixels, JPEG at
/// `quality`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reencode {
    /// The length of the shorter side, in pixels (1 to 65,535).
    pub shorter: usize,
    /// JPEG quality, 1 to 100.
    pub quality: u8,
}

impl Reencode {
    /// Checks the ranges.
    ///
    /// # Errors
    ///
    /// A message naming the value out of range.
    pub fn validated(self) -> Result<Self, String> {
        if !(1..=65_535).contains(&self.shorter) {
            return Err(format!(
                "resize must be 1 to 65535 pixels, not {}",
                self.shorter
            ));
        }
        if !(1..=100).contains(&self.quality) {
            return Err(format!("quality must be 1 to 100, not {}", self.quality));
        }
        Ok(self)
    }

    /// The re-encoded image of `data` (named `name` in errors).
    ///
    /// # Errors
    ///
    /// The decoder's or encoder's message (not an image, truncated,
    /// corrupt).
    pub fn apply(&self, data: &[u8], name: &str) -> Result<Vec<u8>, String> {
        let transform = Transform {
            resize_shorter: Some(self.shorter),
            ..Transform::default()
        };
        let unnamed = |e: image::ImageError| {
            let text = e.to_string();
            text.strip_prefix(&format!("{name}: "))
                .unwrap_or(&text)
                .to_string()
        };
        let img = image::decode(data, name, &transform).map_err(unnamed)?;
        encode_rgb(&img.data, img.width, img.height, self.quality)
    }
}

/// Encodes RGB pixels as a JPEG with libjpeg-turbo (one compressor per
/// thread, kept).
#[cfg(feature = "turbojpeg")]
fn encode_rgb(pixels: &[u8], w: usize, h: usize, quality: u8) -> Result<Vec<u8>, String> {
    use std::cell::RefCell;
    thread_local! {
        static COMPRESSOR: RefCell<Option<turbojpeg::Compressor>> = const { RefCell::new(None) };
    }
    COMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(turbojpeg::Compressor::new().map_err(|e| e.to_string())?);
        }
        let c = slot.as_mut().expect("made above");
        c.set_quality(i32::from(quality))
            .map_err(|e| e.to_string())?;
        c.set_subsamp(turbojpeg::Subsamp::Sub2x2)
            .map_err(|e| e.to_string())?;
        let img = turbojpeg::Image {
            pixels,
            width: w,
            pitch: w * 3,
            height: h,
            format: turbojpeg::PixelFormat::RGB,
        };
        c.compress_to_vec(img).map_err(|e| e.to_string())
    })
}

/// Encodes RGB pixels as a JPEG with jpeg-encoder (builds without
/// libjpeg-turbo).
#[cfg(not(feature = "turbojpeg"))]
fn encode_rgb(pixels: &[u8], w: usize, h: usize, quality: u8) -> Result<Vec<u8>, String> {
    image::synth::encode_jpeg(pixels, w, h, quality, image::synth::Chroma::Subsampled)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::synth;

    fn jpeg(w: usize, h: usize) -> Vec<u8> {
        synth::encode_jpeg(&synth::photo(w, h, 7), w, h, 95, synth::Chroma::Subsampled).unwrap()
    }

    #[test]
    fn the_shorter_side_becomes_the_size_asked() {
        let r = Reencode {
            shorter: 32,
            quality: 90,
        };
        let out = r.apply(&jpeg(96, 64), "a.jpg").unwrap();
        let img = image::decode(&out, "out", &Transform::default()).unwrap();
        assert_eq!((img.height, img.width), (32, 48));
        // Deterministic.
        assert_eq!(out, r.apply(&jpeg(96, 64), "a.jpg").unwrap());
    }

    #[test]
    fn refuses_bad_ranges_and_bad_images() {
        let ok = Reencode {
            shorter: 256,
            quality: 90,
        };
        assert!(ok.validated().is_ok());
        assert!(Reencode { shorter: 0, ..ok }.validated().is_err());
        assert!(Reencode { quality: 0, ..ok }.validated().is_err());
        assert!(Reencode { quality: 101, ..ok }.validated().is_err());
        let e = ok.apply(b"not an image", "x.jpg").unwrap_err();
        assert!(!e.starts_with("x.jpg"), "{e}");
    }
}
