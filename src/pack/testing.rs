//! What the pack's unit tests share.

use crate::image::synth;

/// A 32 x 24 baseline JPEG (jpeg-encoder's bytes: the same in every build).
pub(crate) fn jpeg() -> Vec<u8> {
    synth::encode_jpeg(
        &synth::photo(32, 24, 1),
        32,
        24,
        90,
        synth::Chroma::Subsampled,
    )
    .expect("a valid image encodes")
}
