//! The image module's errors: [`ImageError`] (an image that cannot be
//! decoded, read or encoded, naming its source) and [`SpecError`] (an
//! invalid image spec or batch layout, one variant per bad option).

use super::format::Format;

/// Why an image could not be decoded. Every variant names its source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// The input has no bytes.
    #[error("{name}: empty input, not an image")]
    Empty {
        /// The source: a path or `item N`.
        name: String,
    },
    /// The first bytes are none of the supported formats' signatures.
    #[error("{name}: not a JPEG, PNG, WebP or BMP image (starts with {magic})")]
    UnknownFormat {
        /// The source.
        name: String,
        /// The first bytes, in hex.
        magic: String,
    },
    /// The decoder rejected the data: truncated, damaged, or invalid.
    #[error("{name}: corrupt or truncated {format} data: {reason}")]
    Corrupt {
        /// The source.
        name: String,
        /// The format the signature announced.
        format: Format,
        /// The decoder's message.
        reason: String,
    },
    /// A valid file using a feature that is not supported.
    #[error("{name}: unsupported {format} image: {reason}")]
    Unsupported {
        /// The source.
        name: String,
        /// The format.
        format: Format,
        /// What is not supported.
        reason: String,
    },
    /// The header announces more pixels than the budget ([`max_pixels`](super::max_pixels)).
    #[error(
        "{name}: image of {width}x{height} pixels exceeds the pixel budget of {limit} \
         (see set_max_image_pixels)"
    )]
    TooLarge {
        /// The source.
        name: String,
        /// Width from the header.
        width: usize,
        /// Height from the header.
        height: usize,
        /// The pixel budget at the time.
        limit: usize,
    },
    /// The memory to decode the image could not be allocated (the process
    /// is short of memory, or the header claims a size the data cannot
    /// hold): this image fails, the process goes on.
    #[error("{name}: cannot allocate {bytes} bytes to decode the image")]
    OutOfMemory {
        /// The source.
        name: String,
        /// The size of the failed allocation.
        bytes: usize,
    },
    /// Reading the file failed.
    #[error("{name}: cannot read the file: {source}")]
    Io {
        /// The path.
        name: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Encoding an image failed (see [`encode_jpeg`](super::synth::encode_jpeg)).
    #[error("cannot encode the image: {reason}")]
    Encode {
        /// The encoder's message.
        reason: String,
    },
    /// The transform is invalid (zero sizes, a random crop without a size).
    #[error("invalid image transform: {reason}")]
    InvalidTransform {
        /// What is wrong.
        reason: String,
    },
    /// The output slot's length is not the planned output size.
    #[error(
        "{name}: output slot of {len} bytes, expected {expected} ({height}x{width}x{channels})"
    )]
    SlotSize {
        /// The source.
        name: String,
        /// The slot's length.
        len: usize,
        /// The bytes needed.
        expected: usize,
        /// Planned height.
        height: usize,
        /// Planned width.
        width: usize,
        /// Channels.
        channels: usize,
    },
    /// A decoder panicked (a bug in it); the item is reported, not the process.
    #[error("{name}: the image decoder failed unexpectedly: {reason}")]
    DecoderPanic {
        /// The source.
        name: String,
        /// The panic message.
        reason: String,
    },
}

/// `$then` with `$name` bound to the source name of the error `$error` (a
/// reference, shared or not), or `$none` for an error about no source.
macro_rules! with_source_name {
    ($error:expr, $name:ident => $then:expr, $none:expr) => {
        match $error {
            ImageError::Empty { $name }
            | ImageError::UnknownFormat { $name, .. }
            | ImageError::Corrupt { $name, .. }
            | ImageError::Unsupported { $name, .. }
            | ImageError::TooLarge { $name, .. }
            | ImageError::OutOfMemory { $name, .. }
            | ImageError::Io { $name, .. }
            | ImageError::SlotSize { $name, .. }
            | ImageError::DecoderPanic { $name, .. } => $then,
            ImageError::InvalidTransform { .. } | ImageError::Encode { .. } => $none,
        }
    };
}

impl ImageError {
    /// Sets the source name (the kernels build errors before they know it).
    #[cold]
    pub(super) fn named(mut self, source: &str) -> Self {
        with_source_name!(
            &mut self,
            name => {
                if name.is_empty() {
                    source.clone_into(name);
                }
            },
            {}
        );
        self
    }

    /// The name of the source the error is about, if any.
    pub fn source_name(&self) -> Option<&str> {
        with_source_name!(self, name => Some(name), None)
    }
}

/// An invalid [`ImageSpec`](super::spec::ImageSpec) or batch
/// [`Layout`](super::batch::Layout): one variant, and one
/// message, per bad option.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// A size (`size`, `resize_shorter`, `crop`) with a zero side.
    #[error("{what} must be positive, not {value}")]
    NotPositive {
        /// The option.
        what: &'static str,
        /// Its value, as given.
        value: String,
    },
    /// `crop="random"` without `size`.
    #[error("crop=\"random\" (a random resized crop) needs an output size=")]
    RandomCropNeedsSize,
    /// `scale` is not `0 < min <= max <= 1`.
    #[error("scale is (min, max) with 0 < min <= max <= 1, not {0:?}")]
    Scale((f64, f64)),
    /// `ratio` is not `0 < min <= max`.
    #[error("ratio is (min, max) with 0 < min <= max, not {0:?}")]
    Ratio((f64, f64)),
    /// An unknown `mode`.
    #[error("mode is \"RGB\" or \"L\" (grayscale), not {0:?}")]
    Mode(String),
    /// An unknown `layout`.
    #[error("layout is \"NHWC\" or \"NCHW\", not {0:?}")]
    LayoutName(String),
    /// An unknown `dtype`.
    #[error("dtype is \"uint8\" or \"float32\", not {0:?}")]
    DType(String),
    /// `normalize` with `uint8` output.
    #[error("normalize= needs dtype=\"float32\"")]
    NormalizeNeedsFloat,
    /// A `normalize` mean or std of neither 1 nor 3 values.
    #[error("normalize {what} has 1 or 3 values, not {len}")]
    NormalizeLength {
        /// `"mean"` or `"std"`.
        what: &'static str,
        /// The values given.
        len: usize,
    },
    /// A `normalize` value that is NaN or infinite, or a std of 0.
    #[error("normalize {what} must be {}, not {values:?}", normalize_rule(.what))]
    NormalizeValue {
        /// `"mean"` or `"std"`.
        what: &'static str,
        /// The values given.
        values: Vec<f32>,
    },
}

/// What a `normalize` mean (`what`) or std must be.
fn normalize_rule(what: &str) -> &'static str {
    if what == "std" {
        "finite and not 0"
    } else {
        "finite"
    }
}
