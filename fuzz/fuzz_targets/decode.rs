//! Decodes arbitrary bytes with every codec (JPEG through libjpeg-turbo and
//! zune-jpeg, PNG, WebP, BMP), into batch slots and to full-size images.
//!
//! Every input must give an image or an `ImageError`: never a panic (which
//! the decoders' guard reports as `DecoderPanic`, a finding here), never an
//! abort or an out-of-bounds access.

#![no_main]

use libfuzzer_sys::fuzz_target;

/// Images of at most 4 Mpixel are decoded: larger headers are left to the
/// budget check (tested on its own), and libFuzzer's 2 GB RSS limit is kept
/// for real leaks and runaway allocations.
const MAX_PIXELS: usize = 1 << 22;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = ferrofeed::image::fuzz_every_path(data, MAX_PIXELS) {
        panic!("{e}");
    }
});
