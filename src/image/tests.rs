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

/// A JPEG of `px` (`w * h * 3` RGB bytes) by jpeg-encoder (pure Rust, so the
/// tests run with or without the `turbojpeg` feature), quality 95.
fn jpeg_of(
    px: &[u8],
    w: usize,
    h: usize,
    color: jpeg_encoder::ColorType,
    opts: JpegOpts,
) -> Vec<u8> {
    let mut out = Vec::new();
    let mut e = jpeg_encoder::Encoder::new(&mut out, opts.quality);
    e.set_progressive(opts.progressive);
    e.set_sampling_factor(opts.sampling);
    if opts.restart > 0 {
        e.set_restart_interval(opts.restart);
    }
    e.encode(px, w as u16, h as u16, color).unwrap();
    out
}

#[derive(Clone, Copy)]
struct JpegOpts {
    quality: u8,
    progressive: bool,
    sampling: jpeg_encoder::SamplingFactor,
    restart: u16,
}

impl Default for JpegOpts {
    fn default() -> Self {
        Self {
            quality: 95,
            progressive: false,
            sampling: jpeg_encoder::SamplingFactor::R_4_4_4,
            restart: 0,
        }
    }
}

fn jpeg(w: usize, h: usize, progressive: bool) -> Vec<u8> {
    let opts = JpegOpts {
        progressive,
        ..JpegOpts::default()
    };
    jpeg_of(&gradient(w, h), w, h, jpeg_encoder::ColorType::Rgb, opts)
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

/// A marker segment: `FF code`, the big-endian length, the payload.
fn segment(code: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0xFF, code];
    out.extend_from_slice(&u16::try_from(payload.len() + 2).unwrap().to_be_bytes());
    out.extend_from_slice(payload);
    out
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
    out.extend(segment(0xE1, &payload));
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
            let (px, w, h) = ops::orient(&plain.data, 32, 16, 3, o).unwrap();
            (px.to_vec(), w, h)
        };
        assert_eq!((img.width, img.height), (w, h), "orientation {o}");
        assert_eq!(img.data, want, "orientation {o}");
    }
}

#[test]
fn exif_segment_is_found_among_the_segments_before_the_first_scan() {
    let tiff = b"II*\0 the tiff data";
    let exif = segment(0xE1, &[b"Exif\0\0".as_slice(), tiff].concat());
    let mut file = vec![0xFF, 0xD8];
    file.extend(segment(0xE0, b"JFIF\0\x01\x01"));
    file.extend([0xFF, 0xFF, 0xFF]); // fill bytes before a marker
    file.extend(segment(0xE1, b"http://ns.adobe.com/xap/1.0/\0<x:xmpmeta/>")); // XMP, not EXIF
    file.extend([0x12, 0x34, 0x00]); // stray bytes between segments, skipped as Pillow does
    file.extend([0xFF, 0xD0]); // a marker without a length
    file.extend(&exif);
    file.extend(segment(0xDA, b"\x01\x01\x00\x00\x3f\x00"));
    file.extend([0x12, 0xFF, 0x00, 0x34, 0xFF, 0xD9]);
    assert_eq!(codecs::jpeg_exif_segment(&file), Some(tiff.as_slice()));
    // The first of two EXIF segments, as Pillow keeps it.
    let second = segment(0xE1, b"Exif\0\0MM\0*second");
    let mut two = file[..2].to_vec();
    two.extend(&exif);
    two.extend(&second);
    assert_eq!(codecs::jpeg_exif_segment(&two), Some(tiff.as_slice()));
}

#[test]
fn exif_segment_after_the_first_scan_or_cut_short_is_not_read() {
    let exif = segment(0xE1, b"Exif\0\0II*\0");
    // After SOS (Pillow stops reading markers there too) or after EOI.
    for stop in [segment(0xDA, b"\x01\x01\x00\x00\x3f\x00"), vec![0xFF, 0xD9]] {
        let mut file = vec![0xFF, 0xD8];
        file.extend(segment(0xE0, b"JFIF\0"));
        file.extend(&stop);
        file.extend([0x55; 9]);
        file.extend(&exif);
        assert_eq!(codecs::jpeg_exif_segment(&file), None, "{stop:02x?}");
    }
    // Every truncation of a file whose EXIF segment is its last: found only whole.
    let mut file = vec![0xFF, 0xD8];
    file.extend(segment(0xE0, b"JFIF\0"));
    file.extend(&exif);
    for end in 0..file.len() {
        assert_eq!(
            codecs::jpeg_exif_segment(&file[..end]),
            None,
            "cut at {end}"
        );
    }
    assert!(codecs::jpeg_exif_segment(&file).is_some());
    // A length below 2 (it counts itself), or no marker at all.
    assert_eq!(
        codecs::jpeg_exif_segment(&[0xFF, 0xD8, 0xFF, 0xE1, 0x00, 0x01, 0xFF, 0xD9]),
        None
    );
    assert_eq!(
        codecs::jpeg_exif_segment(&[0xFF, 0xD8, 0x00, 0x00, 0x00]),
        None
    );
    assert_eq!(codecs::jpeg_exif_segment(&[]), None);
}

#[test]
fn exif_orientation_after_other_segments_is_applied() {
    // A real JPEG with an XMP APP1 ahead of its EXIF one: the orientation
    // still comes through probe.
    let data = jpeg(32, 16, false);
    for o in 1..=8u16 {
        let with = with_orientation(&data, o);
        let mut file = with[..2].to_vec();
        file.extend(segment(0xE1, b"http://ns.adobe.com/xap/1.0/\0<x:xmpmeta/>"));
        file.extend(&with[2..]);
        let info = codecs::probe(&file, Format::Jpeg).unwrap();
        assert_eq!(info.orientation, o);
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
        flip: Flip::Always,
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

/// A random flip mirrors the image or leaves it, as its seed draws, about
/// half the time, and never moves the crop: the same seed with
/// `Flip::Never` gives the same crop unmirrored.
#[test]
fn random_flip_mirrors_about_half_and_keeps_the_crop() {
    let (data, _) = png_rgb(50, 40);
    let t = |seed, flip| {
        Transform {
            crop: Some(Crop::random_resized(0)),
            size: Some((12, 16)),
            flip,
            ..Transform::default()
        }
        .with_seed(seed)
    };
    let mut mirrored = 0;
    for seed in 0..200u64 {
        let plain = decode(&data, "a.png", &t(seed, Flip::Never)).unwrap();
        let random = decode(&data, "a.png", &t(seed, Flip::Random { seed: 0 })).unwrap();
        let always = decode(&data, "a.png", &t(seed, Flip::Always)).unwrap();
        assert_eq!(
            random,
            decode(&data, "a.png", &t(seed, Flip::Random { seed: 9 })).unwrap()
        );
        let mut flipped = plain.data.clone();
        ops::flip_horizontal(&mut flipped, 16, 3);
        assert_eq!(always.data, flipped, "seed {seed}");
        if (Flip::Random { seed }).applies() {
            assert_eq!(random.data, flipped, "seed {seed}");
            mirrored += 1;
        } else {
            assert_eq!(random.data, plain.data, "seed {seed}");
        }
    }
    // Binomial(200, 1/2): 100 +- 7; these bounds are over 5 standard deviations.
    assert!((65..=135).contains(&mirrored), "{mirrored} of 200 mirrored");
}

#[test]
fn transform_seed_and_with_seed() {
    let t = Transform::default();
    assert_eq!(t.seed(), None);
    assert_eq!(t.with_seed(5), t, "nothing random: nothing changes");
    let flip = Transform {
        flip: Flip::Random { seed: 1 },
        ..Transform::default()
    };
    assert_eq!(flip.seed(), Some(1));
    assert_eq!(flip.with_seed(5).flip, Flip::Random { seed: 5 });
    let both = Transform {
        crop: Some(Crop::random_resized(2)),
        ..flip
    };
    assert_eq!(both.seed(), Some(2));
    let both = both.with_seed(7);
    assert_eq!(
        (both.crop, both.flip),
        (Some(Crop::random_resized(7)), Flip::Random { seed: 7 })
    );
    assert!(!Flip::Never.applies() && Flip::Always.applies());
    assert_eq!(Flip::from(true), Flip::Always);
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
        kind in 0usize..6,
        garbage in proptest::collection::vec(any::<u8>(), 0..400),
        cut in 0.0f64..1.0,
        flips in proptest::collection::vec((0.0f64..1.0, any::<u8>()), 0..4),
    ) {
        let t = Transform { size: Some((8, 8)), ..Transform::default() };
        let mut data = match kind {
            0 => jpeg(24, 16, cut > 0.5),
            1 => png_rgb(24, 16).0,
            2 => bmp_rgb24(&gradient(24, 16), 24, 16, false),
            3 => bmp_pal8(24, 16, false),
            4 => bmp_16(&gradient(24, 16), 24, 16, cut > 0.5, false),
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
    let good = jpeg_of(
        &[128u8; 40 * 30 * 3],
        40,
        30,
        jpeg_encoder::ColorType::Rgb,
        JpegOpts::default(),
    );
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

// ---------------------------------------------------------------------------
// BMP

/// A BMP file: `rows` are the packed pixel rows, top first, of `bpp` bits;
/// `palette` entries are `[b, g, r, 0]`. Rows are padded to 4 bytes and
/// stored bottom-up, or top-down (negative height) when asked.
fn bmp_file(
    w: usize,
    h: usize,
    bpp: u16,
    palette: &[[u8; 4]],
    rows: &[Vec<u8>],
    top_down: bool,
) -> Vec<u8> {
    let stride = (w * usize::from(bpp)).div_ceil(32) * 4;
    let offset = 14 + 40 + palette.len() * 4;
    let size = offset + stride * h;
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(b"BM");
    out.extend_from_slice(&(size as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&(offset as u32).to_le_bytes());
    out.extend_from_slice(&40u32.to_le_bytes());
    out.extend_from_slice(&i32::try_from(w).unwrap().to_le_bytes());
    let h32 = i32::try_from(h).unwrap();
    let height = if top_down { -h32 } else { h32 };
    out.extend_from_slice(&height.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&bpp.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes()); // BI_RGB
    out.extend_from_slice(&((stride * h) as u32).to_le_bytes());
    out.extend_from_slice(&[0; 8]); // resolution
    out.extend_from_slice(&(palette.len() as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    for entry in palette {
        out.extend_from_slice(entry);
    }
    let mut order: Vec<&Vec<u8>> = rows.iter().collect();
    if !top_down {
        order.reverse();
    }
    for row in order {
        out.extend_from_slice(row);
        out.resize(out.len() + stride - row.len(), 0);
    }
    out
}

fn bmp_rgb24(px: &[u8], w: usize, h: usize, top_down: bool) -> Vec<u8> {
    let rows: Vec<Vec<u8>> = px
        .chunks_exact(w * 3)
        .map(|row| {
            row.chunks_exact(3)
                .flat_map(|p| [p[2], p[1], p[0]])
                .collect()
        })
        .collect();
    bmp_file(w, h, 24, &[], &rows, top_down)
}

/// A palette image: index `(x + 2y) % 200`, entry `i` = RGB `(i, 255 - i, i / 2)`.
fn bmp_pal8(w: usize, h: usize, top_down: bool) -> Vec<u8> {
    let palette: Vec<[u8; 4]> = (0..200u8).map(|i| [i / 2, 255 - i, i, 0]).collect();
    let rows: Vec<Vec<u8>> = (0..h)
        .map(|y| (0..w).map(|x| ((x + 2 * y) % 200) as u8).collect())
        .collect();
    bmp_file(w, h, 8, &palette, &rows, top_down)
}

#[test]
fn bmp_24_and_32_bit_and_top_down_are_exact() {
    let (w, h) = (13, 7); // 39-byte rows: padded
    let px = gradient(w, h);
    for top_down in [false, true] {
        let img = decode(
            &bmp_rgb24(&px, w, h, top_down),
            "a.bmp",
            &Transform::default(),
        )
        .unwrap();
        assert_eq!((img.height, img.width, img.channels), (h, w, 3));
        assert_eq!(img.data, px, "top_down {top_down}");
    }
    let rows: Vec<Vec<u8>> = px
        .chunks_exact(w * 3)
        .map(|row| {
            row.chunks_exact(3)
                .flat_map(|p| [p[2], p[1], p[0], 77])
                .collect()
        })
        .collect();
    let img = decode(
        &bmp_file(w, h, 32, &[], &rows, false),
        "a.bmp",
        &Transform::default(),
    )
    .unwrap();
    assert_eq!(img.data, px);
    let gray = decode(
        &bmp_rgb24(&px, w, h, false),
        "a.bmp",
        &Transform {
            mode: ColorMode::Gray,
            ..Transform::default()
        },
    )
    .unwrap();
    assert_eq!(gray.data[4], ops::luma(px[12], px[13], px[14]));
}

#[test]
fn bmp_palette_is_expanded() {
    let (w, h) = (11, 5);
    for top_down in [false, true] {
        let img = decode(&bmp_pal8(w, h, top_down), "p.bmp", &Transform::default()).unwrap();
        for y in 0..h {
            for x in 0..w {
                let i = ((x + 2 * y) % 200) as u8;
                let at = (y * w + x) * 3;
                assert_eq!(&img.data[at..at + 3], &[i, 255 - i, i / 2], "({x}, {y})");
            }
        }
    }
}

/// 1, 2 and 4 bit: rows of `ceil(w * bpp / 8)` bytes padded to 4 (odd widths,
/// so the padding matters), bottom-up and top-down.
#[test]
fn bmp_low_bit_depths_are_exact() {
    for bpp in [1u16, 2, 4] {
        let colors = 1usize << bpp;
        let palette: Vec<[u8; 4]> = (0..colors)
            .map(|i| [(i * 17) as u8, (i * 40) as u8, (255 - i * 13) as u8, 0])
            .collect();
        let (w, h): (usize, usize) = (53, 9);
        let index = |x: usize, y: usize| (x * 3 + y * 5) % colors;
        let rows: Vec<Vec<u8>> = (0..h)
            .map(|y| {
                let per_byte = 8 / usize::from(bpp);
                let mut row = vec![0u8; w.div_ceil(per_byte)];
                for x in 0..w {
                    let shift = 8 - usize::from(bpp) * (x % per_byte + 1);
                    row[x / per_byte] |= (index(x, y) as u8) << shift;
                }
                row
            })
            .collect();
        for top_down in [false, true] {
            let data = bmp_file(w, h, bpp, &palette, &rows, top_down);
            let img = decode(&data, "low.bmp", &Transform::default()).unwrap();
            for y in 0..h {
                for x in 0..w {
                    let e = palette[index(x, y)];
                    let at = (y * w + x) * 3;
                    assert_eq!(
                        &img.data[at..at + 3],
                        &[e[2], e[1], e[0]],
                        "{bpp} bit ({x}, {y})"
                    );
                }
            }
            let cut = &data[..data.len() - 2];
            assert!(decode(cut, "low.bmp", &Transform::default()).is_err());
        }
    }
}

/// A 16-bit BMP: 5-5-5 (`BI_RGB`) or 5-6-5 (`BI_BITFIELDS`), odd width so
/// the rows are padded.
fn bmp_16(px: &[u8], w: usize, h: usize, rgb565: bool, top_down: bool) -> Vec<u8> {
    let rows: Vec<Vec<u8>> = px
        .chunks_exact(w * 3)
        .map(|row| {
            row.chunks_exact(3)
                .flat_map(|p| {
                    let [red, green, blue] = [p[0], p[1], p[2]].map(u16::from);
                    let value = if rgb565 {
                        (red >> 3) << 11 | (green >> 2) << 5 | blue >> 3
                    } else {
                        (red >> 3) << 10 | (green >> 3) << 5 | blue >> 3
                    };
                    value.to_le_bytes()
                })
                .collect()
        })
        .collect();
    let mut data = bmp_file(w, h, 16, &[], &rows, top_down);
    if rgb565 {
        // BI_BITFIELDS, and the three masks between the header and the pixels.
        data[30..34].copy_from_slice(&3u32.to_le_bytes());
        let masks: Vec<u8> = [0xF800u32, 0x07E0, 0x001F]
            .iter()
            .flat_map(|m| m.to_le_bytes())
            .collect();
        data.splice(54..54, masks);
        let offset = u32::from_le_bytes(data[10..14].try_into().unwrap()) + 12;
        data[10..14].copy_from_slice(&offset.to_le_bytes());
    }
    data
}

#[test]
fn bmp_16_bit_scales_like_pillow() {
    let (w, h) = (13, 6);
    let px = gradient(w, h);
    for rgb565 in [false, true] {
        for top_down in [false, true] {
            let data = bmp_16(&px, w, h, rgb565, top_down);
            let img = decode(&data, "16.bmp", &Transform::default()).unwrap();
            let want: Vec<u8> = px
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let bits = if rgb565 && i % 3 == 1 { 6 } else { 5 };
                    let max = (1u32 << bits) - 1;
                    ((u32::from(v) >> (8 - bits)) * 255 / max) as u8
                })
                .collect();
            assert_eq!(img.data, want, "565 {rgb565} top_down {top_down}");
            let cut = &data[..data.len() - 3];
            assert!(decode(cut, "16.bmp", &Transform::default()).is_err());
        }
    }
}

#[test]
fn bmp_truncated_or_corrupt_is_an_error_naming_the_source() {
    let t = Transform::default();
    let data = bmp_rgb24(&gradient(20, 10), 20, 10, false);
    for cut in [2, 14, 30, 54, 60, data.len() / 2, data.len() - 1] {
        let e = decode(&data[..cut], "cut.bmp", &t).unwrap_err();
        assert!(e.to_string().starts_with("cut.bmp: "), "{cut}: {e}");
    }
    let e = decode(&data[..data.len() - 1], "cut.bmp", &t).unwrap_err();
    assert!(
        matches!(
            e,
            ImageError::Corrupt {
                format: Format::Bmp,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("truncated"), "{e}");
    let pal = bmp_pal8(9, 9, false);
    assert!(decode(&pal[..pal.len() - 3], "cut.bmp", &t).is_err());
    // A bit depth BMP does not have.
    let mut bad = data.clone();
    bad[28] = 7;
    let e = decode(&bad, "depth.bmp", &t).unwrap_err();
    assert!(e.to_string().contains("depth.bmp"), "{e}");
    // A header claiming more pixels than the budget.
    let mut huge = data;
    huge[18..22].copy_from_slice(&100_000i32.to_le_bytes());
    huge[22..26].copy_from_slice(&100_000i32.to_le_bytes());
    let e = decode(&huge, "huge.bmp", &t).unwrap_err();
    assert!(matches!(e, ImageError::TooLarge { .. }), "{e}");
}

// ---------------------------------------------------------------------------
// The pure-Rust JPEG decoder (zune-jpeg): the decoder of builds without the
// `turbojpeg` feature, where every test above runs through it. With the
// feature, it is checked here against libjpeg-turbo on the same files.

/// JPEG variants: every chroma subsampling, progressive, restart markers,
/// gray, CMYK and YCCK (`(name, data, width, height)`).
fn jpeg_variants() -> Vec<(String, Vec<u8>)> {
    use jpeg_encoder::{ColorType, SamplingFactor};
    let (w, h) = (75, 53); // not a multiple of the MCU size
    let px = gradient(w, h);
    let mut v = Vec::new();
    for (name, sampling) in [
        ("444", SamplingFactor::R_4_4_4),
        ("422", SamplingFactor::R_4_2_2),
        ("420", SamplingFactor::R_4_2_0),
        ("440", SamplingFactor::R_4_4_0),
    ] {
        for progressive in [false, true] {
            for quality in [75, 95] {
                let opts = JpegOpts {
                    quality,
                    progressive,
                    sampling,
                    ..JpegOpts::default()
                };
                let label = format!("{name} q{quality} progressive={progressive}");
                v.push((label, jpeg_of(&px, w, h, ColorType::Rgb, opts)));
            }
        }
    }
    let opts = JpegOpts {
        restart: 3,
        sampling: SamplingFactor::R_4_2_0,
        ..JpegOpts::default()
    };
    v.push(("restart".into(), jpeg_of(&px, w, h, ColorType::Rgb, opts)));
    let luma: Vec<u8> = px.chunks_exact(3).map(|p| p[1]).collect();
    v.push((
        "gray".into(),
        jpeg_of(&luma, w, h, ColorType::Luma, JpegOpts::default()),
    ));
    let cmyk: Vec<u8> = px
        .chunks_exact(3)
        .flat_map(|p| [255 - p[0], 255 - p[1], 255 - p[2], p[0] / 3])
        .collect();
    // (CMYK subsampled: see zune_jpeg_refuses_a_k_channel_sampled_most.)
    for (name, color, sampling) in [
        ("cmyk", ColorType::Cmyk, SamplingFactor::R_4_4_4),
        ("ycck", ColorType::CmykAsYcck, SamplingFactor::R_4_4_4),
        ("ycck", ColorType::CmykAsYcck, SamplingFactor::R_4_2_0),
    ] {
        let opts = JpegOpts {
            sampling,
            ..JpegOpts::default()
        };
        v.push((
            format!("{name} {sampling:?}"),
            jpeg_of(&cmyk, w, h, color, opts),
        ));
    }
    v
}

/// jpeg-encoder subsamples a CMYK JPEG by giving K the 2x2 factors (and C, M,
/// Y 1x1): zune-jpeg 0.5 decodes that wrongly (MAE 51 against libjpeg-turbo),
/// so the pure-Rust path refuses it rather than return wrong pixels.
#[test]
fn zune_jpeg_refuses_a_k_channel_sampled_most() {
    let px: Vec<u8> = gradient(40, 24)
        .chunks_exact(3)
        .flat_map(|p| [p[0], p[1], p[2], 30])
        .collect();
    let opts = JpegOpts {
        sampling: jpeg_encoder::SamplingFactor::R_4_2_0,
        ..JpegOpts::default()
    };
    let data = jpeg_of(&px, 40, 24, jpeg_encoder::ColorType::Cmyk, opts);
    let mut out = vec![0u8; 40 * 24 * 3];
    let e = codecs::jpeg_zune::decode_into(&data, ColorMode::Rgb, &mut out, 40 * 3).unwrap_err();
    assert!(matches!(e, ImageError::Unsupported { .. }), "{e}");
    #[cfg(feature = "turbojpeg")]
    assert!(decode(&data, "k.jpg", &Transform::default()).is_ok());
}

/// zune-jpeg's output for `data` in `mode`, rows `extra` bytes wider than
/// the image (a pitch larger than a row).
fn zune(data: &[u8], mode: ColorMode, extra: usize) -> (Vec<u8>, usize, usize) {
    let (w, h) = codecs::jpeg_zune::header(data).unwrap();
    let c = mode.channels();
    let pitch = w * c + extra;
    let mut out = vec![0u8; pitch * h];
    assert_eq!(
        codecs::jpeg_zune::decode_into(data, mode, &mut out, pitch).unwrap(),
        (w, h)
    );
    let packed = out
        .chunks_exact(pitch)
        .flat_map(|r| r[..w * c].to_vec())
        .collect();
    (packed, w, h)
}

#[cfg(feature = "turbojpeg")]
#[test]
fn zune_jpeg_matches_libjpeg_turbo() {
    for (name, data) in jpeg_variants() {
        for mode in [ColorMode::Rgb, ColorMode::Gray] {
            let (w, h) = codecs::jpeg_turbo::header(&data).unwrap();
            let c = mode.channels();
            let mut want = vec![0u8; w * h * c];
            codecs::jpeg_turbo::decode_into(&data, 8, mode, &mut want, w * c).unwrap();
            for extra in [0, 5] {
                let (got, gw, gh) = zune(&data, mode, extra);
                assert_eq!((gw, gh), (w, h), "{name}");
                let m = mae(&got, &want);
                // Measured: 0.00 to 0.32 (IDCT and chroma upsampling rounding).
                assert!(m < 1.0, "{name} {mode:?}: MAE {m}");
            }
        }
    }
}

#[test]
fn zune_jpeg_decodes_close_to_the_source() {
    let px = gradient(75, 53);
    for (name, data) in jpeg_variants() {
        if name.starts_with("gray") || name.starts_with("cmyk") || name.starts_with("ycck") {
            continue;
        }
        let (got, ..) = zune(&data, ColorMode::Rgb, 0);
        let m = mae(&got, &px);
        assert!(m < 4.0, "{name}: MAE {m}");
    }
}

#[test]
fn zune_jpeg_errors_on_truncated_or_corrupt_data() {
    for progressive in [false, true] {
        let data = jpeg(64, 48, progressive);
        for cut in [3, 20, 200, data.len() / 2, data.len() * 9 / 10] {
            let mut out = vec![0u8; 64 * 48 * 3];
            let r = codecs::jpeg_zune::decode_into(&data[..cut], ColorMode::Rgb, &mut out, 64 * 3);
            let e = r.expect_err("a truncated JPEG decoded");
            assert!(
                matches!(
                    e,
                    ImageError::Corrupt {
                        format: Format::Jpeg,
                        ..
                    }
                ),
                "{e}"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Hostile sizes (issue 12): tiny files claiming huge images fail cleanly.

fn png_chunk(kind: &[u8], body: &[u8]) -> Vec<u8> {
    let mut out = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
    out.extend_from_slice(kind);
    out.extend_from_slice(body);
    let mut crc_in = kind.to_vec();
    crc_in.extend_from_slice(body);
    out.extend_from_slice(&crc32(&crc_in).to_be_bytes());
    out
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A PNG whose header claims `w` x `h` RGB pixels, with a few bytes of data.
fn huge_png(w: u32, h: u32) -> Vec<u8> {
    let mut ihdr = w.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    out.extend(png_chunk(b"IHDR", &ihdr));
    // zlib of 8 zero bytes.
    out.extend(png_chunk(
        b"IDAT",
        &[
            0x78, 0x9c, 0x63, 0x60, 0x80, 0x00, 0x00, 0x00, 0x08, 0x00, 0x01,
        ],
    ));
    out.extend(png_chunk(b"IEND", b""));
    out
}

#[test]
fn png_too_short_for_its_header_fails_before_allocating() {
    let data = huge_png(13_000, 13_000);
    assert!(data.len() < 80, "{}", data.len());
    let t = Transform {
        size: Some((8, 8)),
        ..Transform::default()
    };
    let e = decode(&data, "bomb.png", &t).unwrap_err();
    assert!(matches!(e, ImageError::Corrupt { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.starts_with("bomb.png: ") && msg.contains("13000x13000"),
        "{msg}"
    );
    // The header alone (output_shape) refuses it too.
    assert!(output_shape(&data, "bomb.png", &t).is_err());
}

#[test]
fn zeroed_buffers_fail_instead_of_aborting() {
    assert_eq!(buffer::zeroed(0).unwrap(), Vec::<u8>::new());
    assert_eq!(buffer::zeroed(5).unwrap(), vec![0u8; 5]);
    let e = buffer::zeroed(usize::MAX / 2).unwrap_err();
    assert!(matches!(e, ImageError::OutOfMemory { .. }), "{e}");
    assert!(codecs::headroom(usize::MAX / 2).is_err());
    assert!(codecs::headroom(1 << 20).is_ok());
}

#[test]
fn pixel_budget_is_checked_and_settable() {
    // The budget is process-wide and other tests decode meanwhile: the
    // check is tested with an explicit limit, the setter only with values
    // it refuses (the Python tests set it, in one process).
    assert!(codecs::check_size(40, 30, Format::Png, 1200).is_ok());
    match codecs::check_size(40, 30, Format::Png, 1199).unwrap_err() {
        ImageError::TooLarge {
            width,
            height,
            limit,
            ..
        } => assert_eq!((width, height, limit), (40, 30, 1199)),
        other => panic!("{other}"),
    }
    assert_eq!(max_pixels(), MAX_PIXELS);
    assert!(set_max_pixels(0).is_err());
    assert!(set_max_pixels(MAX_PIXELS_CEILING + 1).is_err());
    assert_eq!(max_pixels(), MAX_PIXELS);
}

/// Replays the committed fuzz inputs of the `decode` target (the seed
/// corpus, and the regression inputs of crashes found) through every decode
/// path: none may panic.
#[test]
fn fuzz_corpus_replays_without_a_decoder_panic() {
    let inputs = crate::fuzz_inputs::committed("decode");
    for (path, data) in &inputs {
        if let Err(e) = fuzz_every_path(data, 1 << 22) {
            panic!("{}: {e}", path.display());
        }
    }
    let n = inputs.len();
    assert!(n >= 20, "only {n} corpus files");
}

// ---------------------------------------------------------------------------
// Crop-window decode (`Transform::crop_decode`)

/// Small JPEGs made from scikit-image's photos (tests/fixtures/photos/make.py).
const PHOTOS: [(&str, &[u8]); 6] = [
    (
        "coffee 4:2:0 q90",
        include_bytes!("../../tests/fixtures/photos/coffee_420_q90.jpg"),
    ),
    (
        "chelsea 4:4:4 q75 progressive",
        include_bytes!("../../tests/fixtures/photos/chelsea_444_q75_progressive.jpg"),
    ),
    (
        "camera gray q85",
        include_bytes!("../../tests/fixtures/photos/camera_gray_q85.jpg"),
    ),
    (
        "astronaut 4:2:2 q95 EXIF 6",
        include_bytes!("../../tests/fixtures/photos/astronaut_422_q95_exif6.jpg"),
    ),
    (
        "rocket 4:2:0 q80 progressive EXIF 8",
        include_bytes!("../../tests/fixtures/photos/rocket_420_q80_progressive_exif8.jpg"),
    ),
    (
        "hubble CMYK q90",
        include_bytes!("../../tests/fixtures/photos/hubble_cmyk_q90.jpg"),
    ),
];

/// Peak signal-to-noise ratio in dB (infinite for equal images).
fn psnr(a: &[u8], b: &[u8]) -> f64 {
    assert_eq!(a.len(), b.len());
    let se: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
        .sum();
    if se == 0.0 {
        return f64::INFINITY;
    }
    10.0 * (255.0f64.powi(2) * a.len() as f64 / se).log10()
}

/// The transforms of the crop-window tests for `seed`: random resized
/// crops to several sizes (so every DCT scale is picked), with flips and
/// both color modes, and center crops after a shorter-side resize.
fn window_transforms(seed: u64) -> Vec<Transform> {
    let mode = if seed.is_multiple_of(3) {
        ColorMode::Gray
    } else {
        ColorMode::Rgb
    };
    let mut v = Vec::new();
    for size in [(96, 96), (64, 48), (24, 32), (8, 8)] {
        v.push(Transform {
            mode,
            crop: Some(Crop::random_resized(seed)),
            size: Some(size),
            flip: (!seed.is_multiple_of(2)).into(),
            ..Transform::default()
        });
    }
    // Tiny crops: a few pixels, or one.
    v.push(Transform {
        mode,
        crop: Some(Crop::RandomResized {
            scale: (0.0001, 0.002),
            ratio: (0.5, 2.0),
            seed,
        }),
        size: Some((7, 5)),
        ..Transform::default()
    });
    let shorter = [32, 64, 100, 256][(seed % 4) as usize];
    let crop = shorter * 7 / 8;
    v.push(Transform {
        mode,
        resize_shorter: Some(shorter),
        crop: Some(Crop::Center {
            height: crop,
            width: crop,
        }),
        ..Transform::default()
    });
    v
}

/// Decodes `data` with `t` with and without the crop window; returns the
/// PSNR between the two.
fn window_vs_full(data: &[u8], t: &Transform) -> f64 {
    let window = decode(data, "w.jpg", t).unwrap();
    let full = decode(
        data,
        "f.jpg",
        &Transform {
            crop_decode: false,
            ..*t
        },
    )
    .unwrap();
    assert_eq!(
        (window.height, window.width, window.channels),
        (full.height, full.width, full.channels)
    );
    psnr(&window.data, &full.data)
}

/// A few crops of each photo, in every build (without the `turbojpeg`
/// feature `crop_decode` changes nothing: zune-jpeg decodes whole).
#[test]
fn crop_decode_keeps_the_output() {
    for (name, data) in PHOTOS {
        for seed in 0..2 {
            for t in window_transforms(seed) {
                let p = window_vs_full(data, &t);
                assert!(p >= 40.0, "{name} seed {seed} {t:?}: PSNR {p:.1} dB");
                if !cfg!(feature = "turbojpeg") {
                    assert!(p.is_infinite(), "{name} seed {seed} {t:?}");
                }
            }
        }
    }
}

/// On real photos (4:2:0, 4:2:2, 4:4:4, gray, CMYK, baseline and
/// progressive, EXIF-rotated), the crop-window decode gives what a full
/// decode, crop and resize give, to PSNR >= 40 dB, for many random crops.
#[cfg(feature = "turbojpeg")] // zune-jpeg decodes whole: nothing to compare
#[test]
fn crop_window_decode_matches_a_full_decode_on_real_photos() {
    let mut worst = f64::INFINITY;
    for (name, data) in PHOTOS {
        for seed in 0..24 {
            for t in window_transforms(seed) {
                let p = window_vs_full(data, &t);
                assert!(p >= 40.0, "{name} seed {seed} {t:?}: PSNR {p:.1} dB");
                worst = worst.min(p);
            }
        }
    }
    eprintln!("crop window vs full decode, real photos: worst PSNR {worst:.1} dB");
}

/// Every EXIF orientation: the window is mapped to stored coordinates
/// before decoding, and the result still matches the full decode.
#[cfg(feature = "turbojpeg")] // zune-jpeg decodes whole: nothing to compare
#[test]
fn crop_window_decode_handles_every_exif_orientation() {
    for (name, data) in [PHOTOS[0], PHOTOS[1], PHOTOS[2], PHOTOS[5]] {
        for o in 1..=8u16 {
            let data = with_orientation(data, o);
            for seed in 0..4 {
                for t in window_transforms(seed) {
                    let p = window_vs_full(&data, &t);
                    assert!(p >= 40.0, "{name} orientation {o} seed {seed}: {p:.1} dB");
                }
            }
        }
    }
}

/// Every JPEG variant (chroma subsamplings, progressive, restart markers,
/// gray, CMYK, YCCK) of a 75 x 53 image (not a multiple of the MCU), and
/// tiny images, with crops that reach the right and bottom edges and
/// crops of a single pixel.
#[cfg(feature = "turbojpeg")] // zune-jpeg decodes whole: nothing to compare
#[test]
fn crop_window_decode_on_variants_edges_and_tiny_images() {
    let mut variants = jpeg_variants();
    for (w, h) in [(1, 1), (2, 3), (9, 17), (17, 9), (16, 16)] {
        let opts = JpegOpts {
            sampling: jpeg_encoder::SamplingFactor::R_4_2_0,
            ..JpegOpts::default()
        };
        let data = jpeg_of(&gradient(w, h), w, h, jpeg_encoder::ColorType::Rgb, opts);
        variants.push((format!("{w}x{h}"), data));
    }
    let (mut right, mut bottom, mut one_pixel) = (0, 0, 0);
    for (name, data) in &variants {
        let info = probe(data, "v.jpg").unwrap();
        for seed in 0..20 {
            for t in window_transforms(seed) {
                if let Some(Crop::RandomResized { scale, ratio, seed }) = t.crop {
                    let (top, left, h, w) =
                        plan::random_resized_crop(info.width, info.height, scale, ratio, seed);
                    right += usize::from(left + w == info.width);
                    bottom += usize::from(top + h == info.height);
                    one_pixel += usize::from(w * h == 1);
                }
                let p = window_vs_full(data, &t);
                assert!(p >= 40.0, "{name} seed {seed} {t:?}: PSNR {p:.1} dB");
            }
        }
    }
    eprintln!("crops at the right edge {right}, bottom {bottom}, of one pixel {one_pixel}");
    // The cases the test is about did come up.
    assert!(
        right > 100 && bottom > 100 && one_pixel > 20,
        "{right} {bottom} {one_pixel}"
    );
}

/// The window libjpeg-turbo decodes holds the pixels of a full decode
/// (away from the window's inner edges), is smaller than the image, and
/// this holds for progressive JPEGs too.
#[cfg(feature = "turbojpeg")]
#[test]
fn jpeg_window_is_partial_and_equals_the_full_decode_inside() {
    for (name, data) in PHOTOS {
        let info = probe(data, "p.jpg").unwrap();
        for num in [1, 2, 4, 8] {
            let (sw, sh) = codecs::jpeg_scaled_size(&info, num);
            let full = codecs::decode_jpeg_window(
                data,
                num,
                ColorMode::Rgb,
                codecs::Window {
                    x: 0,
                    y: 0,
                    width: sw,
                    height: sh,
                },
                false,
            )
            .unwrap();
            assert_eq!(full.window.width * full.window.height, sw * sh, "{name}");
            let want = codecs::Window {
                x: sw * 3 / 8,
                y: sh / 3,
                width: (sw / 4).max(1),
                height: (sh / 4).max(1),
            };
            let codecs::WindowPixels {
                pixels: px,
                channels,
                window: win,
                full: size,
            } = codecs::decode_jpeg_window(data, num, ColorMode::Rgb, want, false).unwrap();
            assert_eq!((size, channels), ((sw, sh), 3));
            // RGBX: the same pixels, a padding byte after each (CMYK is
            // converted here, to RGB).
            let padded = codecs::decode_jpeg_window(data, num, ColorMode::Rgb, want, true).unwrap();
            if name.contains("CMYK") {
                assert_eq!((padded.window, padded.channels), (win, 3));
                assert_eq!(&padded.pixels[..], &px[..]);
            } else {
                assert_eq!((padded.window, padded.channels), (win, 4), "{name}");
                let rgb = padded.pixels.chunks_exact(4).map(|p| &p[..3]);
                assert!(rgb.eq(px.chunks_exact(3)), "{name}");
            }
            assert!(
                win.x <= want.x && win.y == want.y,
                "{name} 1/{num}: {win:?}"
            );
            assert!(win.x + win.width == want.x + want.width && win.height == want.height);
            assert!(
                win.width < sw,
                "{name} {num}/8: the window is the whole width"
            );
            // Inside the window, away from its left and right edges (the
            // margin that `jpeg_window` adds), the pixels are a full
            // decode's: on every row, the first and last included.
            let m = super::JPEG_WINDOW_MARGIN;
            let mut worst = 0u8;
            for y in 0..win.height {
                for x in (if win.x == 0 { 0 } else { m })..win.width.saturating_sub(m) {
                    for k in 0..3 {
                        let a = px[(y * win.width + x) * 3 + k];
                        let b = full.pixels[((win.y + y) * sw + win.x + x) * 3 + k];
                        worst = worst.max(a.abs_diff(b));
                    }
                }
            }
            assert!(
                worst <= 1,
                "{name} {num}/8: differs by {worst} inside the window"
            );
        }
    }
}

/// A lossless JPEG cannot be decoded partially (nor scaled): it is decoded
/// whole, and the result is the same with or without `crop_decode`.
#[cfg(feature = "turbojpeg")]
#[test]
fn lossless_jpeg_falls_back_to_a_full_decode() {
    let (w, h) = (60, 44);
    let px = gradient(w, h);
    let mut c = turbojpeg::Compressor::new().unwrap();
    c.set_lossless(true).unwrap();
    let image = turbojpeg::Image {
        pixels: px.as_slice(),
        width: w,
        pitch: w * 3,
        height: h,
        format: turbojpeg::PixelFormat::RGB,
    };
    let data = c.compress_to_vec(image).unwrap();
    assert!(
        codecs::decode_jpeg_window(
            &data,
            1,
            ColorMode::Rgb,
            codecs::Window {
                x: 16,
                y: 8,
                width: 3,
                height: 3
            },
            false,
        )
        .unwrap()
        .window
            == codecs::Window {
                x: 0,
                y: 0,
                width: w,
                height: h
            }
    );
    // Never RGBX: a lossless JPEG is decoded in the plain mode.
    let whole = codecs::Window {
        x: 0,
        y: 0,
        width: w,
        height: h,
    };
    let padded = codecs::decode_jpeg_window(&data, 8, ColorMode::Rgb, whole, true).unwrap();
    assert_eq!((padded.channels, padded.pixels.len()), (3, w * h * 3));
    // (RGB only: libjpeg-turbo converts a lossless RGB JPEG to nothing else.)
    for seed in (0..30).filter(|s: &u64| !s.is_multiple_of(3)) {
        for t in window_transforms(seed) {
            assert!(window_vs_full(&data, &t).is_infinite(), "seed {seed} {t:?}");
        }
    }
}

/// `box_to_stored` and `box_to_oriented` follow `ops::orient`: the stored
/// box, oriented, is the oriented image's box.
#[test]
fn window_boxes_follow_the_exif_orientation() {
    let (w, h) = (7, 5);
    let px: Vec<u8> = (0..w * h).map(|i| i as u8).collect();
    for o in 1..=8u16 {
        let (opx, ow, oh) = ops::orient(&px, w, h, 1, o).unwrap();
        for (x0, y0, x1, y1) in [
            (0, 0, ow, oh),
            (1, 2, 3, 4),
            (0, 1, 2, oh),
            (ow - 1, 0, ow, 1),
        ] {
            let b = plan::BoxU { x0, y0, x1, y1 };
            let s = plan::box_to_stored(b, o, w, h);
            assert_eq!(plan::box_to_oriented(s, o, w, h), b, "orientation {o}");
            let sub: Vec<u8> = (s.y0..s.y1)
                .flat_map(|y| px[y * w + s.x0..y * w + s.x1].to_vec())
                .collect();
            let (got, gw, gh) = ops::orient(&sub, s.x1 - s.x0, s.y1 - s.y0, 1, o).unwrap();
            let want: Vec<u8> = (y0..y1)
                .flat_map(|y| opx[y * ow + x0..y * ow + x1].to_vec())
                .collect();
            assert_eq!((gw, gh), (x1 - x0, y1 - y0), "orientation {o}");
            assert_eq!(&got[..], &want[..], "orientation {o} box {b:?}");
        }
    }
}

// ---------------------------------------------------------------------------
// PNG row-range decode (`codecs::decode_png_window`)

/// A PNG of `w` x `h` RGB pixels `px`, stored as `color` (8 or 16 bits,
/// palette: a 6x6x6 cube).
fn png_of(px: &[u8], w: usize, h: usize, color: png::ColorType, deep: bool) -> Vec<u8> {
    let quant = |v: u8| (u16::from(v) * 5 + 127) / 255; // 0..=5
    let samples: Vec<u8> = px
        .chunks_exact(3)
        .flat_map(|p| {
            let gray = ((u32::from(p[0]) * 299 + u32::from(p[1]) * 587 + u32::from(p[2]) * 114)
                / 1000) as u8;
            let alpha = p[0] ^ p[2];
            let s: Vec<u8> = match color {
                png::ColorType::Rgb => p.to_vec(),
                png::ColorType::Rgba => vec![p[0], p[1], p[2], alpha],
                png::ColorType::Grayscale => vec![gray],
                png::ColorType::GrayscaleAlpha => vec![gray, alpha],
                png::ColorType::Indexed => {
                    vec![(quant(p[0]) * 36 + quant(p[1]) * 6 + quant(p[2])) as u8]
                }
            };
            // 16 bits: the high byte, and a low byte that must be cut.
            if deep {
                s.into_iter().flat_map(|v| [v, v ^ 0x5A]).collect()
            } else {
                s
            }
        })
        .collect();
    let mut out = Vec::new();
    {
        let mut e = png::Encoder::new(&mut out, w as u32, h as u32);
        e.set_color(color);
        e.set_depth(if deep {
            png::BitDepth::Sixteen
        } else {
            png::BitDepth::Eight
        });
        if color == png::ColorType::Indexed {
            let cube: Vec<u8> = (0..216u16)
                .flat_map(|i| [i / 36, (i / 6) % 6, i % 6].map(|v| (v * 51) as u8))
                .collect();
            e.set_palette(cube);
        }
        let mut wr = e.write_header().unwrap();
        wr.write_image_data(&samples).unwrap();
    }
    out
}

/// An interlaced (Adam7) 8-bit RGB PNG of `px` (the `png` crate writes no
/// interlaced PNGs): the seven passes' rows, unfiltered, in one zlib stream
/// of stored (uncompressed) deflate blocks.
fn adam7_png(px: &[u8], w: usize, h: usize) -> Vec<u8> {
    const PASSES: [(usize, usize, usize, usize); 7] = [
        (0, 0, 8, 8),
        (4, 0, 8, 8),
        (0, 4, 4, 8),
        (2, 0, 4, 4),
        (0, 2, 2, 4),
        (1, 0, 2, 2),
        (0, 1, 1, 2),
    ];
    let mut raw = Vec::new();
    for (x0, y0, dx, dy) in PASSES {
        if x0 >= w || y0 >= h {
            continue; // an empty pass has no rows
        }
        for y in (y0..h).step_by(dy) {
            raw.push(0); // filter: none
            for x in (x0..w).step_by(dx) {
                raw.extend_from_slice(&px[(y * w + x) * 3..(y * w + x + 1) * 3]);
            }
        }
    }
    let mut zlib = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = raw.chunks(65_535).collect();
    for (i, block) in blocks.iter().enumerate() {
        zlib.push(u8::from(i + 1 == blocks.len())); // BFINAL, stored
        let len = u16::try_from(block.len()).unwrap();
        zlib.extend_from_slice(&len.to_le_bytes());
        zlib.extend_from_slice(&(!len).to_le_bytes());
        zlib.extend_from_slice(block);
    }
    let (mut sum, mut sums) = (1u32, 0u32); // Adler-32
    for &v in &raw {
        sum = (sum + u32::from(v)) % 65_521;
        sums = (sums + sum) % 65_521;
    }
    zlib.extend_from_slice(&((sums << 16) | sum).to_be_bytes());
    let mut ihdr = u32::try_from(w).unwrap().to_be_bytes().to_vec();
    ihdr.extend_from_slice(&u32::try_from(h).unwrap().to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 1]); // 8-bit RGB, Adam7
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    out.extend(png_chunk(b"IHDR", &ihdr));
    out.extend(png_chunk(b"IDAT", &zlib));
    out.extend(png_chunk(b"IEND", b""));
    out
}

/// The pixels of the first real photo (decoded whole), for PNGs of real content.
fn photo_pixels() -> (Vec<u8>, usize, usize) {
    let img = decode(PHOTOS[0].1, "photo.jpg", &Transform::default()).unwrap();
    (img.data, img.width, img.height)
}

const PNG_KINDS: [(png::ColorType, bool); 6] = [
    (png::ColorType::Rgb, false),
    (png::ColorType::Rgba, false),
    (png::ColorType::Grayscale, false),
    (png::ColorType::GrayscaleAlpha, false),
    (png::ColorType::Rgb, true),
    (png::ColorType::Indexed, false),
];

/// The window of a PNG is exactly those pixels of the whole image, for
/// every kind of PNG, in both modes, wherever the window lies (edges and
/// single pixels included).
#[test]
fn png_window_is_the_window_of_the_whole_image() {
    let (px, w, h) = photo_pixels();
    let windows = [
        (0, 0, w, h),
        (0, 0, 1, 1),
        (w - 1, h - 1, 1, 1),
        (17, 5, 40, 9),
        (w / 3, h / 2, w, h), // runs past the edges: clipped
    ];
    for (color, deep) in PNG_KINDS {
        let data = png_of(&px, w, h, color, deep);
        // The reference: the whole frame at once (`next_frame`), converted.
        let frame = codecs::decode_png(&data).unwrap();
        assert_eq!((frame.width, frame.height), (w, h));
        for mode in [ColorMode::Rgb, ColorMode::Gray] {
            let c = mode.channels();
            let mut whole = vec![0u8; w * h * c];
            ops::convert_channels(&frame.data, frame.channels, &mut whole, c);
            for (x, y, ww, wh) in windows {
                let want = codecs::Window {
                    x,
                    y,
                    width: ww,
                    height: wh,
                };
                let codecs::WindowPixels {
                    pixels: buf,
                    window: win,
                    full: size,
                    ..
                } = codecs::decode_png_window(&data, mode, want).unwrap();
                assert_eq!(size, (w, h));
                let (x1, y1) = ((x + ww).min(w), (y + wh).min(h));
                assert_eq!(
                    win,
                    codecs::Window {
                        x,
                        y,
                        width: x1 - x,
                        height: y1 - y
                    }
                );
                let expected: Vec<u8> = (y..y1)
                    .flat_map(|r| whole[(r * w + x) * c..(r * w + x1) * c].to_vec())
                    .collect();
                assert!(
                    buf[..] == expected[..],
                    "{color:?} deep={deep} {mode:?} {want:?}"
                );
            }
        }
    }
}

/// Decoding only a PNG's window changes nothing in the result: every kind
/// of PNG, random and center crops, against `crop_decode` off (the whole
/// image, row by row); and for RGB against the same pixels stored
/// interlaced (decoded whole, as one frame) and as an uncompressed BMP.
#[test]
fn png_window_decode_gives_the_full_decode_exactly() {
    let (px, w, h) = photo_pixels();
    for (color, deep) in PNG_KINDS {
        let plain = png_of(&px, w, h, color, deep);
        for seed in 0..6 {
            for t in window_transforms(seed) {
                let window = decode(&plain, "w.png", &t).unwrap();
                let off = Transform {
                    crop_decode: false,
                    ..t
                };
                let full = decode(&plain, "f.png", &off).unwrap();
                assert!(window == full, "{color:?} deep={deep} seed {seed} {t:?}");
            }
        }
    }
    let plain = png_of(&px, w, h, png::ColorType::Rgb, false);
    let adam7 = adam7_png(&px, w, h);
    let bmp = bmp_rgb24(&px, w, h, false);
    for seed in 0..6 {
        for t in window_transforms(seed) {
            let window = decode(&plain, "w.png", &t).unwrap();
            assert!(
                window == decode(&adam7, "i.png", &t).unwrap(),
                "seed {seed} {t:?}"
            );
            assert!(
                window == decode(&bmp, "b.bmp", &t).unwrap(),
                "seed {seed} {t:?}"
            );
        }
    }
}

/// An interlaced PNG is decoded whole: the window returned is all of it.
#[test]
fn interlaced_png_falls_back_to_the_whole_image() {
    let (px, w, h) = photo_pixels();
    let data = adam7_png(&px, w, h);
    let want = codecs::Window {
        x: 10,
        y: 10,
        width: 5,
        height: 5,
    };
    let codecs::WindowPixels {
        pixels: buf,
        window: win,
        full: size,
        ..
    } = codecs::decode_png_window(&data, ColorMode::Rgb, want).unwrap();
    assert_eq!((win.x, win.y, win.width, win.height), (0, 0, w, h));
    assert_eq!(size, (w, h));
    assert_eq!(&buf[..], &px[..]);
}

/// Reading stops after the window's last row: a PNG cut short below the
/// window still gives the window (and fails as a whole, naming the cut).
#[test]
fn png_window_stops_after_its_last_row() {
    let (px, w, h) = photo_pixels();
    let data = png_of(&px, w, h, png::ColorType::Rgb, false);
    // Drop the last third of the compressed data (and the IEND chunk).
    let cut = &data[..data.len() * 2 / 3];
    let top = codecs::Window {
        x: 3,
        y: 2,
        width: 30,
        height: 10,
    };
    let buf = codecs::decode_png_window(cut, ColorMode::Rgb, top)
        .unwrap()
        .pixels;
    let expected: Vec<u8> = (2..12)
        .flat_map(|r| px[(r * w + 3) * 3..(r * w + 33) * 3].to_vec())
        .collect();
    assert_eq!(&buf[..], &expected[..]);
    let bottom = codecs::Window {
        x: 0,
        y: h - 4,
        width: w,
        height: 4,
    };
    assert!(codecs::decode_png_window(cut, ColorMode::Rgb, bottom).is_err());
}

/// A decode's window goes into the thread's spare buffer, which holds an
/// earlier image's pixels: every path must write all of it, so the output
/// is the same as on a thread whose buffers are new (and zeroed).
#[test]
fn decodes_do_not_see_an_earlier_images_pixels() {
    let jpeg = |w: usize, h: usize, seed: u64| {
        synth::encode_jpeg(
            &synth::photo(w, h, seed),
            w,
            h,
            90,
            synth::Chroma::Subsampled,
        )
        .unwrap()
    };
    let (px, pw, ph) = photo_pixels();
    let cases: Vec<Vec<u8>> = vec![
        jpeg(120, 90, 3),
        with_orientation(&jpeg(96, 64, 4), 6),
        jpeg(90, 120, 5),
        png_of(&px, pw, ph, png::ColorType::Rgb, false),
    ];
    let t = Transform {
        size: Some((24, 24)),
        crop: Some(Crop::random_resized(0)),
        flip: Flip::Random { seed: 0 },
        ..Transform::default()
    };
    let decode_all = move |cases: &[Vec<u8>]| -> Vec<Vec<u8>> {
        (0..12u64)
            .map(|seed| {
                let data = &cases[seed as usize % cases.len()];
                decode(data, "case", &t.with_seed(seed)).unwrap().data
            })
            .collect()
    };
    let fresh = {
        let cases = cases.clone();
        std::thread::spawn(move || decode_all(&cases))
            .join()
            .unwrap()
    };
    let reused = std::thread::spawn(move || {
        // Fill the spare with a large image's pixels (a whole-frame window:
        // the resize needs every row and column at full scale).
        let big = jpeg(400, 300, 9);
        let dirty = Transform {
            size: Some((299, 399)),
            ..Transform::default()
        };
        decode(&big, "big", &dirty).unwrap();
        decode_all(&cases)
    })
    .join()
    .unwrap();
    assert_eq!(fresh, reused);
}

/// A JPEG window's rows are exactly those of a full decode, at its top and
/// bottom edges too: the window needs a margin of columns only (see
/// `JPEG_WINDOW_MARGIN`). Windows at many heights and positions, every
/// scale, on the real photos (4:2:0, 4:2:2, 4:4:4, progressive, grey,
/// CMYK) and a 4:4:0 JPEG (chroma halved vertically only).
#[cfg(feature = "turbojpeg")]
#[test]
fn jpeg_window_rows_equal_the_full_decode() {
    let sub440 = {
        let (w, h) = (96, 80);
        let px = gradient(w, h);
        let image = turbojpeg::Image {
            pixels: &px[..],
            width: w,
            pitch: w * 3,
            height: h,
            format: turbojpeg::PixelFormat::RGB,
        };
        turbojpeg::compress(image, 90, turbojpeg::Subsamp::Sub1x2)
            .unwrap()
            .to_vec()
    };
    let photos = PHOTOS.iter().map(|&(name, data)| (name, data));
    let mut windows = 0;
    for (name, data) in photos.chain([("gradient 4:4:0", &sub440[..])]) {
        let info = probe(data, "p.jpg").unwrap();
        for num in [1, 2, 4, 8] {
            let (sw, sh) = codecs::jpeg_scaled_size(&info, num);
            let all = codecs::Window {
                x: 0,
                y: 0,
                width: sw,
                height: sh,
            };
            let full = codecs::decode_jpeg_window(data, num, ColorMode::Rgb, all, false).unwrap();
            for y in (0..sh).step_by(7) {
                for height in [1, 2, 9, 16, 17, 40] {
                    if y + height > sh {
                        continue;
                    }
                    // The middle third of the columns: the columns near
                    // the window's left and right edges may differ.
                    let want = codecs::Window {
                        x: sw / 3,
                        y,
                        width: (sw / 3).max(1),
                        height,
                    };
                    let got =
                        codecs::decode_jpeg_window(data, num, ColorMode::Rgb, want, false).unwrap();
                    let win = got.window;
                    assert_eq!((win.y, win.height), (y, height), "{name} {num}/8");
                    let m = super::JPEG_WINDOW_MARGIN;
                    let x0 = if win.x == 0 { 0 } else { win.x + m };
                    let x1 = if win.x + win.width == sw {
                        sw
                    } else {
                        win.x + win.width - m
                    };
                    if x0 >= x1 {
                        continue; // a narrow window at 1/8: all edge
                    }
                    for r in 0..height {
                        let row = &got.pixels[r * win.width * 3..][..win.width * 3];
                        let a = &row[(x0 - win.x) * 3..(x1 - win.x) * 3];
                        let b = &full.pixels[((y + r) * sw + x0) * 3..((y + r) * sw + x1) * 3];
                        assert!(a == b, "{name} {num}/8: window {want:?}, row {r}");
                    }
                    windows += 1;
                }
            }
        }
    }
    assert!(windows > 1000, "{windows}");
}
