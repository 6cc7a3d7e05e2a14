//! What goes wrong reaching a remote shard: [`RemoteError`], naming the URL,
//! sorted from `object_store`'s errors (what is retried and what fails fast:
//! see the [module docs](super)).

/// What went wrong reaching a remote shard. Every variant names the URL.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The URL is not one this module reads, or is malformed.
    #[error("{url}: {why}")]
    BadUrl {
        /// The URL.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// A storage option is unknown to the URL's store, or its value is bad.
    #[error("{url}: storage option {key:?}: {why}")]
    BadOption {
        /// The URL whose store the option was for.
        url: String,
        /// The option.
        key: String,
        /// What is wrong.
        why: String,
    },
    /// The object, or its bucket, does not exist (HTTP 404).
    #[error("{url}: not found ({message})")]
    NotFound {
        /// The URL.
        url: String,
        /// The store's words.
        message: String,
    },
    /// The credentials were refused or lack the permission (HTTP 401, 403).
    #[error("{url}: access denied ({message})")]
    Denied {
        /// The URL.
        url: String,
        /// The store's words.
        message: String,
    },
    /// The object changed while it was read (its `ETag` or size is not the
    /// one it had when the source was opened).
    #[error("{url}: {message} (it changed since the source was opened)")]
    Changed {
        /// The URL.
        url: String,
        /// What differs.
        message: String,
    },
    /// A response body broke off in a request `object_store` does not
    /// retry itself (a listing); [`fetch`](super::fetch) retries it.
    #[error("{url}: {message}")]
    Interrupted {
        /// The URL.
        url: String,
        /// What happened.
        message: String,
    },
    /// Any other failure, once the retries are spent.
    #[error("{url}: {message}")]
    Failed {
        /// The URL.
        url: String,
        /// What happened.
        message: String,
    },
    /// The cache directory could not be used.
    #[error("cache {path}: {source}")]
    Cache {
        /// The file or directory.
        path: std::path::PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl RemoteError {
    /// The error of `object_store` for `url`, sorted into the variants.
    pub(crate) fn from_store(url: &str, e: &object_store::Error) -> Self {
        let message = store_message(e);
        // A listing's failure comes as `Generic`, its status only in the text
        // of its source ("... status code: 404 Not Found ...").
        let status = |code: &str| message.contains(&format!("status code: {code}"));
        match e {
            object_store::Error::NotFound { .. } => Self::NotFound {
                url: url.to_string(),
                message,
            },
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => Self::Denied {
                url: url.to_string(),
                message,
            },
            object_store::Error::Generic { .. } if status("404") => Self::NotFound {
                url: url.to_string(),
                message,
            },
            object_store::Error::Generic { .. } if status("403") || status("401") => Self::Denied {
                url: url.to_string(),
                message,
            },
            object_store::Error::Precondition { .. } => Self::Changed {
                url: url.to_string(),
                message: "its ETag no longer matches".into(),
            },
            // A body that broke off, outside object_store's retry loop (whose
            // errors read "Error performing GET ... after N retries").
            _ if message.contains("response body") && !message.contains("Error performing") => {
                Self::Interrupted {
                    url: url.to_string(),
                    message,
                }
            }
            _ => Self::Failed {
                url: url.to_string(),
                message,
            },
        }
    }

    /// The URL (or cache path) the error names.
    pub fn url(&self) -> String {
        match self {
            Self::BadUrl { url, .. }
            | Self::BadOption { url, .. }
            | Self::NotFound { url, .. }
            | Self::Denied { url, .. }
            | Self::Changed { url, .. }
            | Self::Interrupted { url, .. }
            | Self::Failed { url, .. } => url.clone(),
            Self::Cache { path, .. } => path.display().to_string(),
        }
    }
}

/// `e` with its chain of sources, without repeating a source's text that the
/// one above already holds (the store's errors often embed their source).
pub(crate) fn store_message(e: &object_store::Error) -> String {
    use std::error::Error as _;
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}
