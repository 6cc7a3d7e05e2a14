//! What goes wrong describing a tensor or answering a `__dlpack__` request.

use super::MAX_NDIM;

/// Errors of tensor descriptions and `__dlpack__` requests.
///
/// The request variants ([`DlpackError::is_request_error`]) mean the export
/// cannot be done as asked; the array API standard wants a `BufferError`
/// for them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DlpackError {
    /// A dtype name that is not one of [`DType::ALL`](super::DType::ALL).
    #[error(
        "unsupported dtype {0:?}; expected one of uint8, int32, int64, float16, bfloat16, float32"
    )]
    UnsupportedDType(String),
    /// More than [`MAX_NDIM`] dimensions.
    #[error("a tensor has at most {MAX_NDIM} dimensions, not {0}")]
    TooManyDimensions(usize),
    /// The element count or byte size does not fit in memory addresses.
    #[error("a tensor of shape {shape:?} and dtype {dtype} is too large")]
    TooLarge {
        /// The shape asked for.
        shape: Vec<usize>,
        /// The element type's name ([`DType::name`](super::DType::name)).
        dtype: &'static str,
    },
    /// `stream` was given for memory that has no stream to synchronize.
    #[error("stream={stream} is not supported for a tensor on {device}; pass stream=None")]
    UnsupportedStream {
        /// The stream value passed.
        stream: i64,
        /// The tensor's device, as text.
        device: String,
    },
    /// The consumer asked for a device the data cannot be exported to.
    #[error(
        "cannot export a tensor on {current} to dl_device={requested}{}",
        if *copy_requested { "" } else { " without a copy" }
    )]
    UnsupportedDevice {
        /// The device asked for, as text.
        requested: String,
        /// The tensor's device, as text.
        current: String,
        /// Whether the consumer allowed a copy.
        copy_requested: bool,
    },
}

impl DlpackError {
    /// Whether this error refuses a `__dlpack__` request (a `BufferError`
    /// in Python), as opposed to an invalid tensor description.
    pub fn is_request_error(&self) -> bool {
        matches!(
            self,
            Self::UnsupportedStream { .. } | Self::UnsupportedDevice { .. }
        )
    }
}
