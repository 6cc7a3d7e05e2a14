//! What goes wrong writing shards: [`PackError`], naming the sample or the
//! destination.

/// Why a destination refused a write (how `py/errors.rs` picks the Python
/// class: missing, denied, or any other failure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DestKind {
    /// The folder's parent, or the bucket, does not exist.
    NotFound,
    /// The folder cannot be written, or the store refused the credentials.
    Denied,
    /// Anything else (a full disk, a failed upload once retries are spent).
    Other,
}

/// What went wrong writing shards.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// A sample cannot be packed: its file cannot be read, its image field
    /// is not an image or is truncated, a field's value does not fit the
    /// output. `name` is the file's path, or the sample's key or position.
    /// With `OnError::Skip` such a sample is left out and counted.
    #[error("{name}: {reason}")]
    BadSample {
        /// The file or the sample.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The destination cannot be written: a folder that cannot be made or
    /// written, a missing bucket, refused credentials, a failed upload.
    #[error("{dest}: {reason}")]
    Dest {
        /// The destination, or the file or object in it.
        dest: String,
        /// What went wrong.
        reason: String,
        /// Missing, denied or other.
        kind: DestKind,
        /// The OS error number, for a local destination.
        errno: Option<i32>,
    },
    /// The destination holds something other than this pack: files that no
    /// pack of ferrofeed wrote, or a pack of other input or options, or
    /// another pack is writing it now.
    #[error("{dest}: {reason}")]
    Conflict {
        /// The destination.
        dest: String,
        /// What is there.
        reason: String,
    },
    /// An option is out of range, or options do not go together.
    #[error("{0}")]
    Options(String),
    /// The progress callback asked to stop (Ctrl-C in Python): the shard
    /// being written is removed, the finished ones are kept for a resume.
    #[error("the pack was stopped")]
    Stopped,
    /// Preparing a sample panicked (a bug, never skipped).
    #[error("{0}")]
    Panic(String),
}

impl PackError {
    /// A [`PackError::BadSample`].
    #[cold]
    pub(crate) fn bad(name: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        Self::BadSample {
            name: name.into(),
            reason: reason.to_string(),
        }
    }

    /// A [`PackError::Dest`] for a local I/O error on `path`.
    #[cold]
    pub(crate) fn local(path: &std::path::Path, what: &str, e: &std::io::Error) -> Self {
        let kind = match e.kind() {
            std::io::ErrorKind::NotFound => DestKind::NotFound,
            std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
                DestKind::Denied
            }
            _ => DestKind::Other,
        };
        Self::Dest {
            dest: path.display().to_string(),
            reason: format!("{what}: {e}"),
            kind,
            errno: e.raw_os_error(),
        }
    }

    /// A [`PackError::Dest`] for a failure of the object store.
    #[cold]
    pub(crate) fn remote(e: &crate::remote::RemoteError, what: &str) -> Self {
        use crate::remote::RemoteError;
        let kind = match e {
            RemoteError::NotFound { .. } => DestKind::NotFound,
            RemoteError::Denied { .. } => DestKind::Denied,
            _ => DestKind::Other,
        };
        let text = e.to_string();
        let url = e.url();
        let reason = text
            .strip_prefix(&format!("{url}: "))
            .unwrap_or(&text)
            .to_string();
        Self::Dest {
            dest: url,
            reason: format!("{what}: {reason}"),
            kind,
            errno: None,
        }
    }
}
