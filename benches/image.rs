//! Criterion benches of the image kernels: JPEG decode (full size,
//! DCT-scaled, and of the crop's window only), the resize, PNG decode, and
//! the batch engine (`image::batch::decode_batch` of 32 images into the slots
//! of one pooled batch buffer; criterion reports it per image).
//!
//! Run with `cargo bench --bench image` (JPEG by libjpeg-turbo, the default
//! build) and `cargo bench --bench image --no-default-features` (JPEG by
//! zune-jpeg, the pure-Rust fallback): the JPEG benchmark ids name the
//! decoder, and both builds decode the same files. Results and method in
//! BENCHMARKS.md.
//!
//! There are no photo files in the repository, so the inputs are generated:
//! photo-like content (gradients, soft-edged shapes, a multi-octave texture
//! and sensor-like noise, `ferrofeed::image::synth`), encoded by jpeg-encoder (pure Rust, so
//! both builds get the same bytes; libjpeg's quantization tables and quality
//! scaling, standard Huffman tables; 4:2:0 chroma subsampling as most camera
//! and `ImageNet` JPEGs, one set in 4:4:4) and by the `png` crate. They
//! compress better than most real photos (smaller files, so less entropy
//! decoding): absolute decode times are on the optimistic side.

#![allow(
    clippy::cast_precision_loss,
    clippy::cast_sign_loss,
    clippy::many_single_char_names
)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use ferrofeed::image::batch::{decode_batch, BatchItem, BatchOptions, Source};
use ferrofeed::image::synth::{encode_jpeg, photo, Chroma};
use ferrofeed::image::{decode_into, output_shape, Crop, Flip, Transform};
use ferrofeed::seed::{mix, Stream};
use ferrofeed::staging::{BufferPool, Pinning, PoolConfig};

/// `ImageNet`'s typical size.
const W: usize = 500;
const H: usize = 375;
/// Different images decoded per iteration (so no single image is favoured).
const SET: usize = 8;
/// Images per batch in the batch-assembly bench.
const BATCH: usize = 32;
/// The JPEG decoder of this build, in the benchmark ids.
const DECODER: &str = if cfg!(feature = "turbojpeg") {
    "libjpeg-turbo"
} else {
    "zune-jpeg"
};

fn jpeg(px: &[u8], w: usize, h: usize, quality: u8) -> Vec<u8> {
    encode_jpeg(px, w, h, quality, Chroma::Subsampled).unwrap()
}

fn png_rgb(px: &[u8], w: usize, h: usize) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut e = png::Encoder::new(&mut out, w as u32, h as u32);
        e.set_color(png::ColorType::Rgb);
        e.set_depth(png::BitDepth::Eight);
        e.set_compression(png::Compression::Balanced);
        let mut wr = e.write_header().unwrap();
        wr.write_image_data(px).unwrap();
    }
    out
}

/// torchvision's eval transform: `Resize(256)` then `CenterCrop(224)`,
/// decoding every pixel (the crop-window decode is benched on its own, in
/// `bench_crop_window`, so these ids keep their meaning).
fn resize256_crop224(dct_scaling: bool) -> Transform {
    Transform {
        resize_shorter: Some(256),
        crop: Some(Crop::Center {
            height: 224,
            width: 224,
        }),
        dct_scaling,
        crop_decode: false,
        ..Transform::default()
    }
}

/// torchvision's training transform: `RandomResizedCrop(224)` (the crop
/// drawn from `seed`) and a flip.
fn random_resized_crop224(seed: u64, crop_decode: bool) -> Transform {
    Transform {
        crop: Some(Crop::random_resized(seed)),
        size: Some((224, 224)),
        flip: seed.is_multiple_of(2).into(),
        crop_decode,
        ..Transform::default()
    }
}

/// Asking for exactly the `n/8`-scaled size makes libjpeg-turbo decode at
/// `n/8` and the resample a plain copy: the cost of the scaled decode alone.
fn decode_at(n: usize, w: usize, h: usize) -> Transform {
    Transform {
        size: Some(((h * n).div_ceil(8), (w * n).div_ceil(8))),
        ..Transform::default()
    }
}

/// The transforms benched on each JPEG set, with their names (the scaled
/// decodes only where the decoder can scale: zune-jpeg always decodes at
/// full size, so there `_dct` would repeat `_no_dct`).
fn jpeg_transforms(w: usize, h: usize) -> Vec<(String, Transform)> {
    let mut v = vec![
        ("full_decode", Transform::default()),
        ("resize256_crop224_no_dct", resize256_crop224(false)),
    ];
    if cfg!(feature = "turbojpeg") {
        v.extend([
            ("decode_at_6_8_only", decode_at(6, w, h)),
            ("decode_at_4_8_only", decode_at(4, w, h)),
            ("resize256_crop224_dct", resize256_crop224(true)),
        ]);
    }
    v.into_iter()
        .map(|(name, t)| (format!("{DECODER}/{name}"), t))
        .collect()
}

/// Encoded images, and a slot of the right size for each under `t`.
fn slots(images: &[Vec<u8>], t: &Transform) -> Vec<Vec<u8>> {
    images
        .iter()
        .map(|img| {
            let (_, (h, w, c)) = output_shape(img, "bench", t).unwrap();
            vec![0u8; h * w * c]
        })
        .collect()
}

fn bench_set(
    c: &mut Criterion,
    group: &str,
    images: &[Vec<u8>],
    transforms: &[(String, Transform)],
) {
    let bytes: u64 = images.iter().map(|v| v.len() as u64).sum();
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::ElementsAndBytes {
        elements: images.len() as u64,
        bytes,
    });
    for (name, t) in transforms {
        let mut out = slots(images, t);
        g.bench_function(name, |b| {
            b.iter(|| {
                for (img, slot) in images.iter().zip(out.iter_mut()) {
                    black_box(decode_into(black_box(img), "bench", t, slot).unwrap());
                }
            });
        });
    }
    g.finish();
}

fn bench_jpeg(c: &mut Criterion) {
    for quality in [75, 90, 95] {
        let images: Vec<Vec<u8>> = (0..SET)
            .map(|i| jpeg(&photo(W, H, i as u64), W, H, quality))
            .collect();
        bench_set(
            c,
            &format!("jpeg_{W}x{H}_q{quality}"),
            &images,
            &jpeg_transforms(W, H),
        );
    }
    // 4:4:4 (no chroma subsampling), where the chroma planes need no
    // upsampling at any scale.
    let images: Vec<Vec<u8>> = (0..SET)
        .map(|i| {
            let px = photo(W, H, i as u64);
            encode_jpeg(&px, W, H, 90, Chroma::Full).unwrap()
        })
        .collect();
    bench_set(
        c,
        &format!("jpeg_{W}x{H}_q90_444"),
        &images,
        &jpeg_transforms(W, H),
    );
    // A large photo, where DCT scaling picks 2/8.
    let (w, h) = (2048, 1536);
    let images: Vec<Vec<u8>> = (0..2)
        .map(|i| jpeg(&photo(w, h, 100 + i), w, h, 90))
        .collect();
    let transforms: Vec<(String, Transform)> = jpeg_transforms(w, h)
        .into_iter()
        .filter(|(name, _)| !name.contains("decode_at"))
        .collect();
    bench_set(c, &format!("jpeg_{w}x{h}_q90"), &images, &transforms);
}

/// The crop-window decode (`Transform::crop_decode`) against decoding every
/// pixel, DCT scaling on in both: the training transform (a random resized
/// crop to 224, a different crop for each image) and the evaluation one
/// (`Resize(256)`, `CenterCrop(224)`), per image, on `ImageNet`-sized and on
/// large JPEGs.
fn bench_crop_window(c: &mut Criterion) {
    for (w, h, n) in [(W, H, SET), (2048, 1536, 2)] {
        let images: Vec<Vec<u8>> = (0..n)
            .map(|i| jpeg(&photo(w, h, 200 + i as u64), w, h, 90))
            .collect();
        let mut g = c.benchmark_group(format!("crop_window_jpeg_{w}x{h}_q90"));
        for (label, crop_decode) in [("crop_decode", true), ("full_decode", false)] {
            g.throughput(Throughput::Elements(16));
            // Training: 16 crops per iteration (8 images twice, or 2 large
            // images 8 times each), the same ones with and without crop_decode.
            let mut out = vec![0u8; 224 * 224 * 3];
            let per_image = 16 / images.len();
            g.bench_function(format!("{DECODER}/random_resized_crop224/{label}"), |b| {
                b.iter(|| {
                    for (i, img) in images.iter().enumerate() {
                        for k in 0..per_image {
                            let t = random_resized_crop224((i * per_image + k) as u64, crop_decode);
                            black_box(decode_into(black_box(img), "bench", &t, &mut out).unwrap());
                        }
                    }
                });
            });
            let t = Transform {
                crop_decode,
                ..resize256_crop224(true)
            };
            g.throughput(Throughput::Elements(images.len() as u64));
            g.bench_function(format!("{DECODER}/resize256_crop224/{label}"), |b| {
                b.iter(|| {
                    for img in &images {
                        black_box(decode_into(black_box(img), "bench", &t, &mut out).unwrap());
                    }
                });
            });
        }
        g.finish();
    }
}

/// The resample alone: the `fast_image_resize` call that the kernel makes
/// (antialiased bilinear convolution of the source rectangle into the
/// 224x224 output), from the full-size and from the 6/8-scaled decode.
fn bench_resize(c: &mut Criterion) {
    let mut g = c.benchmark_group("resize_to_224x224");
    g.throughput(Throughput::Elements(1));
    for (name, sw, sh) in [
        ("from_500x375", W, H),
        (
            "from_375x282_dct_6_8",
            (W * 6).div_ceil(8),
            (H * 6).div_ceil(8),
        ),
    ] {
        let px = photo(sw, sh, 7);
        // Resize(256) + CenterCrop(224) mapped back to the source: the crop
        // is 224/256 of the shorter side, centred.
        let side = sh.min(sw) as f64 * 224.0 / 256.0;
        let (left, top) = ((sw as f64 - side) / 2.0, (sh as f64 - side) / 2.0);
        let src = ImageRef::new(sw as u32, sh as u32, &px, PixelType::U8x3).unwrap();
        let options = ResizeOptions::new()
            .resize_alg(ResizeAlg::Convolution(FilterType::Bilinear))
            .crop(left, top, side, side);
        let mut dst = Image::new(224, 224, PixelType::U8x3);
        let mut resizer = Resizer::new();
        g.bench_function(name, |b| {
            b.iter(|| {
                resizer.resize(black_box(&src), &mut dst, &options).unwrap();
                black_box(dst.buffer()[0]);
            });
        });
    }
    g.finish();
}

fn bench_png(c: &mut Criterion) {
    let images: Vec<Vec<u8>> = (0..SET)
        .map(|i| png_rgb(&photo(W, H, i as u64), W, H))
        .collect();
    let transforms = [
        ("full_decode".to_string(), Transform::default()),
        ("resize256_crop224".to_string(), resize256_crop224(true)),
    ];
    bench_set(c, &format!("png_{W}x{H}_rgb8"), &images, &transforms);
}

/// One batch as `load_images` and the `DataLoader` build it: a buffer from
/// the pool, filled by the batch engine ([`decode_batch`]: each image
/// decoded, DCT-scaled, resized and cropped straight into its slot on
/// `threads` threads of the process's CPU pool).
fn assemble(pool: &BufferPool, items: &[BatchItem<'_>], t: &Transform, threads: usize) {
    let options = BatchOptions {
        threads,
        ..BatchOptions::default()
    };
    let nbytes = options.layout.slot_len((224, 224, 3)) * items.len();
    let mut buffer = pool.acquire(nbytes).unwrap();
    let report = decode_batch(items, t, &options, &mut buffer[..nbytes]).unwrap();
    black_box((report.kept, buffer[nbytes - 1]));
    // Dropping the buffer returns it to the pool.
}

fn bench_batch(c: &mut Criterion) {
    // 32 different images, quality 75 to 95.
    let images: Vec<Vec<u8>> = (0..BATCH)
        .map(|i| {
            let quality = 75 + u8::try_from(i * 20 / (BATCH - 1)).unwrap();
            jpeg(&photo(W, H, 1000 + i as u64), W, H, quality)
        })
        .collect();
    let bytes: u64 = images.iter().map(|v| v.len() as u64).sum();
    let items: Vec<BatchItem<'_>> = images
        .iter()
        .enumerate()
        .map(|(i, data)| {
            BatchItem::new(Source::Borrowed(data), format!("item {i}")).with_seed(mix(
                0,
                0,
                i as u64,
                Stream::Crop,
            ))
        })
        .collect();
    // The exact-224 job and the training job (random resized crop + flip).
    let jobs = [
        ("resize256_crop224", resize256_crop224(true)),
        (
            "random_resized_crop224_flip",
            Transform {
                size: Some((224, 224)),
                crop: Some(Crop::random_resized(0)),
                flip: Flip::Random { seed: 0 },
                crop_decode: false,
                ..Transform::default()
            },
        ),
    ];
    let pool = BufferPool::new(PoolConfig {
        pinning: Pinning::Off,
        ..PoolConfig::default()
    })
    .unwrap();
    let mut g = c.benchmark_group("batch_32_jpeg_500x375_to_224x224");
    g.throughput(Throughput::ElementsAndBytes {
        elements: BATCH as u64,
        bytes,
    });
    // Every pixel decoded (the ids of earlier measurements), then only the
    // crop's window.
    for crop_decode in [false, true] {
        let suffix = if crop_decode { "/crop_decode" } else { "" };
        for (job, t) in &jobs {
            let t = Transform { crop_decode, ..*t };
            for threads in [1, 2] {
                let name = format!("{DECODER}/decode_batch_{job}_{threads}_threads{suffix}");
                g.bench_function(name, |b| {
                    b.iter(|| assemble(&pool, &items, &t, threads));
                });
            }
        }
    }
    g.finish();
}

/// Small samples: `make bench` runs this twice (both JPEG decoders) on a
/// 2-core machine. 20 samples of at least 2 s, after 1 s of warm-up.
fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_jpeg, bench_crop_window, bench_resize, bench_png, bench_batch
}
criterion_main!(benches);
