//! The shared arena: one memory-mapped file of opaque items per node.
//!
//! Dataset metadata held as millions of small Python objects is copied into
//! every worker process by reference-count writes ("copy-on-read"), pickled
//! again into every spawned worker and duplicated in every GPU rank. An
//! arena keeps it as bytes in one file, on `/dev/shm` by default, that every
//! process maps read-only: the page cache holds a single copy per node.
//!
//! - [`ArenaWriter`] builds a file item by item, under a temporary name,
//!   with space reserved by `fallocate`, and publishes it atomically,
//!   sealed: read-only ([`SEALED_MODE`], `0444`) for everyone, its owner
//!   included.
//! - [`Arena`] maps a file read-only, validates it once at open and hands
//!   out items as zero-copy slices.
//! - [`sweep_orphans`] removes arenas that no process holds any more (their
//!   owner was killed before it could remove them).
//!
//! The format is described in [`mod@format`] and, with MUST/MAY wording, in the
//! README.
//!
//! # Lifetime
//!
//! The process that writes an arena owns it and removes its file when the
//! owning [`Arena`] is dropped ([`Arena::remove_file`]). Every process that
//! maps an arena, the owner included, holds a shared `flock` on it for as
//! long as the mapping lives; the kernel releases the lock when the process
//! exits, however it exits. An arena file without any lock holder is thus an
//! orphan, and the next writer created in its directory removes it.
//!
//! # Example
//!
//! ```
//! use ferrofeed::arena::{Arena, ArenaWriter};
//! let dir = tempfile::tempdir()?;
//! let mut writer = ArenaWriter::create_in(dir.path())?;
//! for word in ["one", "two", "three"] {
//!     writer.push(word.as_bytes())?;
//! }
//! let owned = writer.finish()?;
//! // Any other process can now map the same pages:
//! let shared = Arena::open(owned.path())?;
//! assert_eq!(shared.get(2), Some(&b"three"[..]));
//! let path = owned.path().to_path_buf();
//! drop(owned); // the owner removes the file...
//! assert!(!path.exists());
//! assert_eq!(shared.get(0), Some(&b"one"[..])); // ...readers keep their mapping
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
pub mod format;
mod lock;
mod reader;
pub(crate) mod sweep;
mod writer;

pub use error::{ArenaError, Result};
pub use reader::{validate, Arena, Layout};
pub use sweep::{sweep_orphans, ARENA_SUFFIX};
pub use writer::{ArenaWriter, SEALED_MODE};

#[cfg(test)]
mod tests;
