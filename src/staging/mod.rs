//! Staging buffers: a bounded pool of 64-byte aligned host buffers, pinned
//! when a CUDA driver is present, and the tensors built on them.
//!
//! A batch is assembled once, straight into a buffer of a [`BufferPool`],
//! and handed to a framework by `DLPack` ([`Tensor::export`]) without a copy.
//! When the consumer frees its last view, the buffer goes back to the pool
//! and the next batch reuses it: a training loop that keeps up allocates a
//! handful of buffers once, then none.
//!
//! # Alignment
//!
//! Every buffer starts on a 64-byte boundary ([`BUFFER_ALIGN`]) and its
//! capacity is a multiple of 64. JAX copies data that is less aligned than
//! that, and SIMD kernels like it too.
//!
//! # The bound
//!
//! A pool holds at most [`PoolConfig::max_buffers`] buffers, in use and idle
//! together, so its memory is bounded by that many of the largest size asked
//! for. [`BufferPool::acquire`]:
//!
//! 1. reuses an idle buffer of a fitting size (at least the size asked for,
//!    at most twice it);
//! 2. else allocates one, if the pool is below its bound (first freeing an
//!    idle buffer of another size if it is at its bound);
//! 3. else, every buffer being in use, *waits* for one to come back, up to
//!    [`PoolConfig::timeout`], then fails with [`StagingError::Exhausted`],
//!    whose message says how to fix it.
//!
//! Waiting is the right default for a pipeline: a consumer that holds on to
//! batches slows the producer down (back-pressure) instead of letting memory
//! grow; the timeout turns a consumer that never lets go (a list of every
//! batch, a leak) into a clear error instead of a hang.
//!
//! # Pinned memory
//!
//! With [`Pinning::Auto`] (the default) new buffers are page-locked when the
//! CUDA driver can be loaded at run time (see [`pinned_available`]), so a
//! host-to-device copy can run asynchronously at full speed; otherwise they
//! are plain memory and everything else behaves the same.
//! [`PooledBuffer::pinned`] says which. Pinned buffers are exported as
//! `kDLCPU` (PyTorch refuses `kDLCUDAHost`). Probing initializes CUDA, which
//! a process then cannot fork and use again: create pinned pools after
//! starting worker processes, or use [`Pinning::Off`] before.
//!
//! # Example
//!
//! ```
//! use ferrofeed::dlpack::{DType, ExportRequest};
//! use ferrofeed::staging::{BufferPool, PoolConfig, Tensor};
//!
//! let pool = BufferPool::new(PoolConfig::default())?;
//! let batch = Tensor::zeros(&pool, &[32, 3, 224, 224], DType::U8)?;
//! let exported = batch.export(&ExportRequest { max_version: Some((1, 0)), ..Default::default() })?;
//! assert_eq!(exported.dl_tensor().data as usize % 64, 0);
//! drop(batch); // the export still holds the buffer...
//! assert_eq!(pool.stats().in_use, 1);
//! drop(exported); // ...until the consumer calls the deleter
//! assert_eq!((pool.stats().in_use, pool.stats().idle), (0, 1));
//! # Ok::<(), ferrofeed::staging::StagingError>(())
//! ```

mod cuda;
mod error;
mod host;
mod pool;
mod slots;
mod tensor;

pub use cuda::{pinned_available, probed as cuda_probed, status as pinned_status, DISABLE_ENV};
pub use error::{SlotError, StagingError};
pub use pool::{BufferPool, PoolConfig, PoolStats, PooledBuffer};
pub use slots::{SlotLease, SlotRing, SlotStats};
pub use tensor::{Exported, ManagedPtr, Tensor};

/// The alignment of every staging buffer, in bytes.
pub const BUFFER_ALIGN: usize = 64;

/// Whether new buffers are page-locked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pinning {
    /// Plain memory; CUDA is never touched.
    Off,
    /// Pinned when the CUDA driver can be loaded, plain otherwise.
    #[default]
    Auto,
    /// Pinned, or [`StagingError::PinnedUnavailable`].
    Required,
}
