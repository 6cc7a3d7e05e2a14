//! Which store and which object a URL names.

use std::fmt::Write as _;

use object_store::path::Path as ObjectPath;

use super::RemoteError;

/// The kind of store a URL's scheme names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// `s3://bucket/key` (and `s3a://`): Amazon S3 or an S3-compatible
    /// server (`AWS_ENDPOINT_URL`).
    S3,
    /// `gs://bucket/key`: Google Cloud Storage.
    Gcs,
    /// `az://container/path`, `abfs[s]://container@account.dfs.core.windows.net/path`:
    /// Azure Blob Storage.
    Azure,
    /// `http://host/path`, `https://host/path`: a web server that answers
    /// ranged GETs.
    Http,
}

impl Scheme {
    /// The scheme of `text`, if it is a URL this module reads.
    fn of(scheme: &str) -> Option<Self> {
        match scheme {
            "s3" | "s3a" => Some(Self::S3),
            "gs" | "gcs" => Some(Self::Gcs),
            "az" | "azure" | "abfs" | "abfss" | "adl" => Some(Self::Azure),
            "http" | "https" => Some(Self::Http),
            _ => None,
        }
    }
}

/// A parsed object URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectUrl {
    /// The URL as given (what errors name).
    pub url: String,
    /// The kind of store.
    pub scheme: Scheme,
    /// The URL of the store: everything before the object's path
    /// (`s3://bucket`, `https://host:port`). Objects of one store share a
    /// client.
    pub store: String,
    /// The object's path within the store (percent-decoded).
    pub path: ObjectPath,
}

impl ObjectUrl {
    /// Parses `text`.
    ///
    /// # Errors
    ///
    /// [`RemoteError::BadUrl`] for a scheme this module does not read, a
    /// URL without a bucket (or host), or without an object path.
    pub fn parse(text: &str) -> Result<Self, RemoteError> {
        let url = Self::parse_prefix(text)?;
        if url.path.as_ref().is_empty() {
            return Err(RemoteError::BadUrl {
                url: text.to_string(),
                why: "no object path".into(),
            });
        }
        Ok(url)
    }

    /// Parses `text` as a directory of a store to list: as [`Self::parse`],
    /// but the path may be empty (the bucket's root).
    ///
    /// # Errors
    ///
    /// As [`Self::parse`], but for an empty path.
    pub fn parse_prefix(text: &str) -> Result<Self, RemoteError> {
        let bad = |why: &str| RemoteError::BadUrl {
            url: text.to_string(),
            why: why.to_string(),
        };
        let parsed = url::Url::parse(text).map_err(|e| bad(&e.to_string()))?;
        let scheme = Scheme::of(parsed.scheme()).ok_or_else(|| {
            bad("not a URL of object storage: s3://, gs://, az://, abfs://, http:// or https://")
        })?;
        let host = parsed
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad("no bucket, container or host"))?;
        let mut store = format!("{}://", parsed.scheme());
        if !parsed.username().is_empty() {
            store.push_str(parsed.username());
            store.push('@');
        }
        store.push_str(host);
        if let Some(port) = parsed.port() {
            let _ = write!(store, ":{port}");
        }
        let path = ObjectPath::from_url_path(parsed.path()).map_err(|e| bad(&e.to_string()))?;
        Ok(Self {
            url: text.to_string(),
            scheme,
            store,
            path,
        })
    }

    /// The URL of the object `path` of the same store.
    pub fn sibling(&self, path: &ObjectPath) -> String {
        format!("{}/{}", self.store, encode_path(path.as_ref()))
    }
}

/// `path` with the characters a URL path cannot hold percent-encoded
/// (the inverse of what [`ObjectPath::from_url_path`] decodes).
fn encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"/-_.~!$&'()*+,;=:@".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_scheme() {
        let u = ObjectUrl::parse("s3://bucket/train/shard-000.tar").unwrap();
        assert_eq!(u.scheme, Scheme::S3);
        assert_eq!(u.store, "s3://bucket");
        assert_eq!(u.path.as_ref(), "train/shard-000.tar");

        let u = ObjectUrl::parse("gs://b/x.parquet").unwrap();
        assert_eq!((u.scheme, u.store.as_str()), (Scheme::Gcs, "gs://b"));

        let u = ObjectUrl::parse("az://container/dir/x.jsonl").unwrap();
        assert_eq!(
            (u.scheme, u.store.as_str()),
            (Scheme::Azure, "az://container")
        );

        let u = ObjectUrl::parse("abfss://c@acct.dfs.core.windows.net/p/x.tar").unwrap();
        assert_eq!(u.store, "abfss://c@acct.dfs.core.windows.net");
        assert_eq!(u.path.as_ref(), "p/x.tar");

        let u = ObjectUrl::parse("http://127.0.0.1:8080/data/a%20b.tar").unwrap();
        assert_eq!(
            (u.scheme, u.store.as_str()),
            (Scheme::Http, "http://127.0.0.1:8080")
        );
        assert_eq!(u.path.as_ref(), "data/a b.tar");
        assert_eq!(u.sibling(&u.path), "http://127.0.0.1:8080/data/a%20b.tar");
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        for bad in [
            "ftp://host/x.tar",
            "s3://bucket",
            "s3://bucket/",
            "s3:///key",
            "nonsense",
        ] {
            let e = ObjectUrl::parse(bad).unwrap_err();
            assert!(matches!(e, RemoteError::BadUrl { .. }), "{bad}: {e}");
            assert!(e.to_string().starts_with(bad), "{e}");
        }
    }
}
