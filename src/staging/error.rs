//! What goes wrong with staging buffers ([`StagingError`]) and worker
//! processes' shared batch slots ([`SlotError`]).

use std::time::Duration;

use crate::dlpack::DlpackError;

/// Errors of the staging buffers.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StagingError {
    /// A [`PoolConfig`](super::PoolConfig) that cannot work.
    #[error("invalid pool configuration: {0}")]
    InvalidConfig(String),
    /// Every buffer of the pool stayed in use for the whole timeout: the
    /// consumer holds on to its batches (or the bound is too low for how
    /// many it keeps at once).
    #[error(
        "buffer pool exhausted: all {max_buffers} buffers stayed in use for {:.3} s; free \
         the tensors you no longer need (every view of them), or raise max_buffers",
        waited.as_secs_f64()
    )]
    Exhausted {
        /// The pool's bound.
        max_buffers: usize,
        /// How long the acquisition waited.
        waited: Duration,
    },
    /// Pinned memory was required and the CUDA driver cannot give it.
    #[error("pinned memory is unavailable: {reason}")]
    PinnedUnavailable {
        /// Why (no driver, no device, disabled, forked child, ...).
        reason: String,
    },
    /// The allocator refused (or the size cannot be allocated at all).
    #[error("cannot allocate a buffer of {bytes} bytes")]
    OutOfMemory {
        /// The size asked for.
        bytes: usize,
    },
    /// A tensor does not fit in the buffer given for it.
    #[error("a tensor of {needed} bytes does not fit in a buffer of {len} bytes")]
    BufferTooSmall {
        /// Bytes the tensor needs.
        needed: usize,
        /// Bytes in the buffer.
        len: usize,
    },
    /// A tensor description or a `DLPack` request was refused.
    #[error(transparent)]
    Dlpack(#[from] DlpackError),
}
/// Errors of the shared batch slots.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SlotError {
    /// The operating system refused to create, size or map a slot.
    #[error("shared batch slot: {what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// No slot has this number.
    #[error("no shared batch slot {0}")]
    NoSuchSlot(usize),
    /// The slot is not in the state the operation needs (a protocol error
    /// of the caller: leasing a slot that was never dispatched, say).
    #[error("shared batch slot {id} is {state}, not {expected}")]
    WrongState {
        /// The slot.
        id: usize,
        /// Its state.
        state: &'static str,
        /// The state the operation needs.
        expected: &'static str,
    },
    /// A worker reported more bytes than the slot's file holds.
    #[error("shared batch slot {id} holds {size} bytes, but the batch claims {len}")]
    TooShort {
        /// The slot.
        id: usize,
        /// The file's size.
        size: usize,
        /// The length claimed.
        len: usize,
    },
}
