//! Errors of the arena.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong creating, opening or reading an arena.
///
/// Each variant that concerns a file names it. The corruption variants
/// ([`ArenaError::is_corrupt`]) are what a reader reports for a file that is
/// truncated, not ours, half-written or hostile; opening such a file never
/// panics and never maps anything out of bounds.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ArenaError {
    /// The file does not exist.
    #[error("arena {path:?} does not exist")]
    NotFound {
        /// The path asked for.
        path: PathBuf,
    },
    /// The target of a new arena already exists; arenas are never overwritten,
    /// since another process may be mapping the existing file.
    #[error("arena {path:?} already exists; pick another path or close the arena that owns it")]
    AlreadyExists {
        /// The path asked for.
        path: PathBuf,
    },
    /// The file system cannot hold the arena. Raised while the arena is being
    /// written (space is reserved with `fallocate`), never as a SIGBUS later.
    #[error(
        "not enough space for arena {path:?}: {needed} bytes needed, {available} bytes free \
         in {dir:?}; pass path=... on a local disk with room for it (arenas larger than RAM \
         work from disk too)"
    )]
    NoSpace {
        /// The arena's path.
        path: PathBuf,
        /// Its directory.
        dir: PathBuf,
        /// Bytes the arena needs at the point it failed.
        needed: u64,
        /// Bytes free in the directory's file system (0 when unknown).
        available: u64,
    },
    /// An operating-system call failed.
    #[error("{op} {path:?}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file concerned.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The file is shorter than its header says (or than a header).
    #[error("arena {path:?} is truncated: {actual} bytes, expected {expected}")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Bytes it should have.
        expected: u64,
        /// Bytes it has.
        actual: u64,
    },
    /// The file does not start with the arena magic.
    #[error("{path:?} is not a ferrofeed arena (bad magic)")]
    BadMagic {
        /// The file.
        path: PathBuf,
    },
    /// The file was written by an incompatible version of the format.
    #[error("arena {path:?} has format version {found}; this build reads version {supported}")]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// The version found.
        found: u32,
        /// The version supported.
        supported: u32,
    },
    /// The header sets flag bits this build does not know: a later format
    /// that this reader cannot read safely.
    #[error(
        "arena {path:?} sets unknown flag bits {unknown:#x} (flags {flags:#x}); this build \
         knows only {known:#x}: it was written by a newer ferrofeed, or it is corrupt"
    )]
    UnknownFlags {
        /// The file.
        path: PathBuf,
        /// The whole flags field.
        flags: u32,
        /// The bits this build does not know.
        unknown: u32,
        /// The bits this build knows.
        known: u32,
    },
    /// The complete flag is not set: the writer died or is still writing.
    #[error("arena {path:?} is incomplete (its writer did not finish)")]
    Incomplete {
        /// The file.
        path: PathBuf,
    },
    /// The file is longer than its header says.
    #[error("arena {path:?} has {actual} bytes, but its header says {expected}")]
    SizeMismatch {
        /// The file.
        path: PathBuf,
        /// Bytes the header records.
        expected: u64,
        /// Bytes the file has.
        actual: u64,
    },
    /// A header field places a region outside the file, misaligned, or
    /// overlapping another region.
    #[error("arena {path:?} has a corrupt header: {detail}")]
    BadLayout {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// An index entry points backwards or past the data region.
    #[error("arena {path:?} has a corrupt index at item {item}: {detail}")]
    BadIndex {
        /// The file.
        path: PathBuf,
        /// The first offending item.
        item: u64,
        /// What is wrong.
        detail: String,
    },
}

impl ArenaError {
    /// Whether this error says the file is not a valid arena (as opposed to an
    /// I/O failure or a missing file).
    pub fn is_corrupt(&self) -> bool {
        matches!(
            self,
            Self::Truncated { .. }
                | Self::BadMagic { .. }
                | Self::UnsupportedVersion { .. }
                | Self::UnknownFlags { .. }
                | Self::Incomplete { .. }
                | Self::SizeMismatch { .. }
                | Self::BadLayout { .. }
                | Self::BadIndex { .. }
        )
    }

    /// The raw OS error number behind this error, if any.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Self::Io { source, .. } => source.raw_os_error(),
            Self::NotFound { .. } => Some(rustix::io::Errno::NOENT.raw_os_error()),
            Self::AlreadyExists { .. } => Some(rustix::io::Errno::EXIST.raw_os_error()),
            Self::NoSpace { .. } => Some(rustix::io::Errno::NOSPC.raw_os_error()),
            _ => None,
        }
    }

    #[cold]
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        let path = path.into();
        match source.kind() {
            io::ErrorKind::NotFound => Self::NotFound { path },
            io::ErrorKind::AlreadyExists => Self::AlreadyExists { path },
            _ => Self::Io { op, path, source },
        }
    }
}

/// Shorthand for results of this module.
pub type Result<T, E = ArenaError> = std::result::Result<T, E>;
