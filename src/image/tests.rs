//! Round trips through real encoders, orientation, corrupt input.

#![allow(clippy::cast_possible_truncation)]

use proptest::prelude::*;

use super::*;

fn gradient(w: usize, h: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(w * h * 3);
    for y in 0..h {
        for x in 0..w {
            v.extend_from_slice(&[
                (x * 255 / w.max(1)) as u8,
                (y * 255 / h.max(1)) as u8,
                ((x + y) * 255 / (w + h)) as u8,
            ]);
        }
    }
    v
}

fn jpeg(w: usize, h: usize, progressive: bool) -> Vec<u8> {
    let px = gradient(w, h);
    let mut c = turbojpeg::Compressor::new().unwrap();
    c.set_quality(95).unwrap();
    c.set_subsamp(turbojpeg::Subsamp::None).unwrap();
    c.set_progressive(progressive).unwrap();
    let img = turbojpeg::Image {
        pixels: px.as_slice(),
        width: w,
        pitch: w * 3,
        height: h,
        format: turbojpeg::PixelFormat::RGB,
    };
    c.compress_to_vec(img).unwrap()
}

fn png_rgb(w: usize, h: usize) -> (Vec<u8>, Vec<u8>) {
    let px = gradient(w, h);
    let mut out = Vec::new();
    {
        let mut e = png::Encoder::new(&mut out, w as u32, h as u32);
        e.set_color(png::ColorType::Rgb);
        e.set_depth(png::BitDepth::Eight);
        let mut wr = e.write_header().unwrap();
        wr.write_image_data(&px).unwrap();
    }
    (out, px)
}

/// Inserts an EXIF APP1 segment with `orientation` right after SOI.
fn with_orientation(jpeg: &[u8], orientation: u16) -> Vec<u8> {
    let mut tiff = Vec::new();
    tiff.extend_from_slice(b"II*\0");
    tiff.extend_from_slice(&8u32.to_le_bytes());
    tiff.extend_from_slice(&1u16.to_le_bytes()); // one entry
    tiff.extend_from_slice(&0x0112u16.to_le_bytes()); // Orientation
    tiff.extend_from_slice(&3u16.to_le_bytes()); // SHORT
    tiff.extend_from_slice(&1u32.to_le_bytes());
    tiff.extend_from_slice(&orientation.to_le_bytes());
    tiff.extend_from_slice(&[0, 0]);
    tiff.extend_from_slice(&0u32.to_le_bytes()); // no next IFD
    let mut payload = b"Exif\0\0".to_vec();
    payload.extend_from_slice(&tiff);
    let mut out = jpeg[..2].to_vec();
    out.extend_from_slice(&[0xFF, 0xE1]);
    out.extend_from_slice(&u16::try_from(payload.len() + 2).unwrap().to_be_bytes());
    out.extend_from_slice(&payload);
    out.extend_from_slice(&jpeg[2..]);
    out
}

fn mae(a: &[u8], b: &[u8]) -> f64 {
    assert_eq!(a.len(), b.len());
    let s: u64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| u64::from(x.abs_diff(y)))
        .sum();
    s as f64 / a.len() as f64
}

#[test]
fn png_round_trip_is_exact() {
    let (data, px) = png_rgb(37, 21);
    let img = decode(&data, "a.png", &Transform::default()).unwrap();
    assert_eq!((img.height, img.width, img.channels), (21, 37, 3));
    assert_eq!(img.data, px);
    let gray = decode(
        &data,
        "a.png",
        &Transform {
            mode: ColorMode::Gray,
            ..Transform::default()
        },
    )
    .unwrap();
    assert_eq!(gray.channels, 1);
    assert_eq!(gray.data[5], ops::luma(px[15], px[16], px[17]));
}

#[test]
fn jpeg_decodes_close_to_source_baseline_and_progressive() {
    for progressive in [false, true] {
        let data = jpeg(64, 48, progressive);
        let img = decode(&data, "a.jpg", &Transform::default()).unwrap();
        assert_eq!((img.height, img.width), (48, 64));
        assert!(mae(&img.data, &gradient(64, 48)) < 3.0);
    }
}

#[test]
fn webp_lossless_round_trip_is_exact() {
    let px = gradient(19, 11);
    let mut out = Vec::new();
    image_webp::WebPEncoder::new(&mut out)
        .encode(&px, 19, 11, image_webp::ColorType::Rgb8)
        .unwrap();
    let img = decode(&out, "a.webp", &Transform::default()).unwrap();
    assert_eq!(img.data, px);
}

#[test]
fn jpeg_dct_scaling_is_close_to_a_full_decode() {
    let data = jpeg(640, 480, false);
    let t = Transform {
        size: Some((60, 80)),
        ..Transform::default()
    };
    let fast = decode(&data, "a.jpg", &t).unwrap();
    let full = decode(
        &data,
        "a.jpg",
        &Transform {
            dct_scaling: false,
            ..t
        },
    )
    .unwrap();
    assert_eq!((fast.height, fast.width), (60, 80));
    let m = mae(&fast.data, &full.data);
    assert!(m < 2.0, "{m}");
}

#[test]
fn exif_orientation_is_applied() {
    let data = jpeg(32, 16, false);
    let plain = decode(&data, "a.jpg", &Transform::default()).unwrap();
    for o in 1..=8u16 {
        let img = decode(&with_orientation(&data, o), "o.jpg", &Transform::default()).unwrap();
        let (want, w, h) = if o == 1 {
            (plain.data.clone(), 32, 16)
        } else {
            ops::orient(&plain.data, 32, 16, 3, o)
        };
        assert_eq!((img.width, img.height), (w, h), "orientation {o}");
        assert_eq!(img.data, want, "orientation {o}");
    }
}

#[test]
fn center_crop_and_flip() {
    let (data, px) = png_rgb(10, 8);
    let t = Transform {
        crop: Some(Crop::Center {
            height: 4,
            width: 6,
        }),
        flip: true,
        ..Transform::default()
    };
    let img = decode(&data, "a.png", &t).unwrap();
    assert_eq!((img.height, img.width), (4, 6));
    // Top-left of the flipped crop = pixel (x = 2 + 5, y = 2) of the source.
    assert_eq!(&img.data[..3], &px[(2 * 10 + 7) * 3..(2 * 10 + 7) * 3 + 3]);
}

#[test]
fn random_resized_crop_is_seeded() {
    let (data, _) = png_rgb(50, 40);
    let t = |seed| Transform {
        crop: Some(Crop::random_resized(seed)),
        size: Some((16, 16)),
        ..Transform::default()
    };
    let a = decode(&data, "a.png", &t(1)).unwrap();
    assert_eq!(a, decode(&data, "a.png", &t(1)).unwrap());
    assert_eq!((a.height, a.width), (16, 16));
    assert!((2..20).any(|s| decode(&data, "a.png", &t(s)).unwrap() != a));
}

#[test]
fn errors_name_the_source() {
    let t = Transform::default();
    let e = decode(b"", "empty.jpg", &t).unwrap_err();
    assert!(matches!(e, ImageError::Empty { .. }));
    assert!(e.to_string().starts_with("empty.jpg: "), "{e}");
    let e = decode(b"GIF89a....", "item 7", &t).unwrap_err();
    assert!(matches!(e, ImageError::UnknownFormat { .. }), "{e}");
    assert!(e.to_string().contains("item 7"));
    let data = jpeg(64, 48, false);
    for cut in [3, 20, 200, data.len() / 2, data.len() - 2] {
        let e = decode(&data[..cut], "cut.jpg", &t).unwrap_err();
        assert!(e.to_string().contains("cut.jpg"), "{e}");
    }
    let (png, _) = png_rgb(20, 20);
    for cut in [8, 20, 40, png.len() - 5] {
        assert!(decode(&png[..cut], "cut.png", &t).is_err(), "{cut}");
    }
    let e = decode_file(Path::new("/nonexistent/x.jpg"), &t).unwrap_err();
    assert!(matches!(e, ImageError::Io { .. }));
    let mut slot = [0u8; 5];
    let e = decode_into(&png, "p.png", &t, &mut slot).unwrap_err();
    assert!(matches!(e, ImageError::SlotSize { .. }), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Random bytes after a valid signature, and random truncations or
    /// corruptions of valid files: an error or an image, never a panic.
    #[test]
    fn garbage_never_panics(
        kind in 0usize..3,
        garbage in proptest::collection::vec(any::<u8>(), 0..400),
        cut in 0.0f64..1.0,
        flips in proptest::collection::vec((0.0f64..1.0, any::<u8>()), 0..4),
    ) {
        let t = Transform { size: Some((8, 8)), ..Transform::default() };
        let mut data = match kind {
            0 => jpeg(24, 16, cut > 0.5),
            1 => png_rgb(24, 16).0,
            _ => {
                let mut v = b"RIFF\x20\0\0\0WEBPVP8 ".to_vec();
                v.extend_from_slice(&garbage);
                v
            }
        };
        for (pos, b) in flips {
            let i = ((data.len() - 1) as f64 * pos) as usize;
            data[i] ^= b;
        }
        let len = ((data.len() as f64) * cut) as usize;
        let _ = decode(&data[..len], "fuzz", &t);
        let mut sig = data[..4.min(data.len())].to_vec();
        sig.extend_from_slice(&garbage);
        let _ = decode(&sig, "fuzz", &t);
    }
}

#[test]
fn a_corrupt_jpeg_does_not_poison_the_next_decode_on_the_thread() {
    let good = {
        let mut c = turbojpeg::Compressor::new().unwrap();
        let pixels = vec![128u8; 40 * 30 * 3];
        let img = turbojpeg::Image {
            pixels: pixels.as_slice(),
            width: 40,
            pitch: 40 * 3,
            height: 30,
            format: turbojpeg::PixelFormat::RGB,
        };
        c.compress_to_vec(img).unwrap()
    };
    // A small output lets libjpeg-turbo decode at a reduced scale, which the
    // handle remembers.
    let small = Transform {
        size: Some((8, 8)),
        ..Transform::default()
    };
    for cut in [20usize, 100, 200] {
        let bad = &good[..cut.min(good.len() - 1)];
        assert!(decode(bad, "bad.jpg", &small).is_err());
        let ok = decode(&good, "good.jpg", &small).unwrap();
        assert_eq!((ok.height, ok.width, ok.channels), (8, 8, 3));
        let ok = decode(&good, "good.jpg", &Transform::default()).unwrap();
        assert_eq!((ok.height, ok.width, ok.channels), (30, 40, 3));
    }
}
