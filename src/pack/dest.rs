//! Where shards go: a local folder, or a prefix in object storage through
//! the readers' own clients (`crate::remote::store`).
//!
//! Nothing is ever seen half written:
//!
//! - a local shard is written to a hidden temporary name in the folder
//!   (`.NAME.tmp`), then renamed over its name; small files (the pack's
//!   records, the index) the same way;
//! - a remote shard smaller than one upload part is one `PUT`; a larger one
//!   is a multipart upload (parts of [`UPLOAD_PART`] bytes, up to
//!   [`UPLOAD_CONCURRENCY`] in flight), completed only once the shard is
//!   whole and aborted otherwise, so the object appears whole or not at all.
//!
//! A local pack holds an exclusive `flock` on its records' lock file for
//! its whole run: a second pack into the same folder fails at once. (A
//! store has no such lock: two packs into one prefix at once are the
//! caller's mistake.) Temporary files left by a pack that was killed are
//! removed by the next one, which holds the lock.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures_util::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};

use super::error::DestKind;
use super::PackError;
use crate::remote::store::{client, runtime, StorageOptions};
use crate::remote::{ObjectUrl, RemoteError};
use crate::runtime::Runtime;

/// Bytes of one part of a multipart upload (S3 wants 5 MiB at least, but
/// for the last).
pub const UPLOAD_PART: usize = 8 << 20;

/// Parts of one shard uploaded at once.
pub const UPLOAD_CONCURRENCY: usize = 4;

/// A written file's size and version: its `ETag` (a store) or its
/// modification time (a local file), what an index's staleness check
/// compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    /// Bytes.
    pub size: u64,
    /// The store's `ETag`, if it gave one.
    pub etag: Option<String>,
    /// The local file's modification time, in nanoseconds since the epoch.
    pub mtime_ns: Option<i64>,
}

/// A destination: a local folder or an object-store prefix.
pub enum Dest {
    /// A local folder (made if missing).
    Local {
        /// The folder.
        dir: PathBuf,
    },
    /// A prefix in object storage.
    Remote(Remote),
}

/// An object-store prefix and its client.
pub struct Remote {
    /// The prefix as given, without a trailing `/`.
    shown: String,
    /// The prefix's store and path.
    prefix: ObjectUrl,
    /// The process's runtime.
    runtime: Arc<Runtime>,
    /// The store's client.
    store: Arc<dyn ObjectStore>,
}

impl std::fmt::Debug for Dest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown())
    }
}

/// Whether `text` names an object-store prefix (`scheme://...`).
pub fn is_url(text: &str) -> bool {
    let Some((scheme, _)) = text.split_once("://") else {
        return false;
    };
    !scheme.is_empty()
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
}

impl Dest {
    /// Opens `text`: a local folder (made, with its parents, if missing) or
    /// a URL prefix (`s3://bucket/path`), whose client is built with
    /// `options` (`storage_options`, as for the readers).
    ///
    /// # Errors
    ///
    /// [`PackError::Dest`] when the folder cannot be made or is a file;
    /// [`PackError::Options`] for a URL of no store read here, or a bad
    /// storage option.
    pub fn open(text: &str, options: &StorageOptions) -> Result<Self, PackError> {
        if !is_url(text) {
            if !options.is_empty() {
                return Err(PackError::Options(
                    "storage_options are for a destination in object storage (a URL); \
                     this is a local folder"
                        .into(),
                ));
            }
            let dir = PathBuf::from(text);
            std::fs::create_dir_all(&dir)
                .map_err(|e| PackError::local(&dir, "cannot make the folder", &e))?;
            return Ok(Dest::Local { dir });
        }
        let shown = text.trim_end_matches('/').to_string();
        let bad = |e: RemoteError| PackError::Options(e.to_string());
        let prefix = ObjectUrl::parse_prefix(&shown).map_err(bad)?;
        let runtime = runtime(&shown).map_err(|e| PackError::remote(&e, "the runtime"))?;
        let store = client(&prefix, options).map_err(bad)?;
        Ok(Dest::Remote(Remote {
            shown,
            prefix,
            runtime,
            store,
        }))
    }

    /// The destination as errors and the summary name it.
    pub fn shown(&self) -> String {
        match self {
            Dest::Local { dir } => dir.display().to_string(),
            Dest::Remote(r) => r.shown.clone(),
        }
    }

    /// The path or URL of `name` in the destination.
    pub fn url_of(&self, name: &str) -> String {
        match self {
            Dest::Local { dir } => dir.join(name).display().to_string(),
            Dest::Remote(r) => format!("{}/{name}", r.shown),
        }
    }

    /// The names in the destination, relative to it, with their stamps: a
    /// local folder's entries (and those of its subfolder `sub`, as
    /// `sub/NAME`), every object under a prefix (one listing).
    ///
    /// # Errors
    ///
    /// [`PackError::Dest`]: the folder cannot be read, the bucket does not
    /// exist, the credentials are refused.
    pub fn list(&self, sub: &str) -> Result<Vec<(String, Stamp)>, PackError> {
        match self {
            Dest::Local { dir } => {
                let mut out = read_entries(dir)?;
                let inner = dir.join(sub);
                if inner.is_dir() {
                    out.extend(
                        read_entries(&inner)?
                            .into_iter()
                            .map(|(n, s)| (format!("{sub}/{n}"), s)),
                    );
                }
                out.sort_by(|a, b| a.0.cmp(&b.0));
                Ok(out)
            }
            Dest::Remote(r) => {
                let prefix = r.prefix.path.clone();
                let metas: Vec<object_store::ObjectMeta> = r
                    .runtime
                    .block_on(r.store.list(Some(&prefix)).try_collect())
                    .map_err(|e| match RemoteError::from_store(&r.shown, &e) {
                        // Listing a prefix finds nothing rather than failing: a 404
                        // is the bucket's.
                        RemoteError::NotFound { .. } => PackError::Dest {
                            dest: r.shown.clone(),
                            reason: "the bucket does not exist (listing it answered 404)".into(),
                            kind: DestKind::NotFound,
                            errno: None,
                        },
                        other => PackError::remote(&other, "cannot list"),
                    })?;
                let strip = format!("{}/", prefix.as_ref());
                let mut out: Vec<(String, Stamp)> = metas
                    .into_iter()
                    .map(|m| {
                        let key = m.location.as_ref();
                        let name = key.strip_prefix(&strip).unwrap_or(key).to_string();
                        let stamp = Stamp {
                            size: m.size,
                            etag: m.e_tag,
                            mtime_ns: None,
                        };
                        (name, stamp)
                    })
                    .collect();
                out.sort_by(|a, b| a.0.cmp(&b.0));
                Ok(out)
            }
        }
    }

    /// Removes the local folder `name` if it is empty (nothing for a store,
    /// whose folders are only prefixes).
    pub fn remove_empty_folder(&self, name: &str) {
        if let Dest::Local { dir } = self {
            let _ = std::fs::remove_dir(dir.join(name));
        }
    }

    /// The bytes of `name`, or `None` if it does not exist.
    ///
    /// # Errors
    ///
    /// [`PackError::Dest`] for any other failure.
    pub fn read(&self, name: &str) -> Result<Option<Vec<u8>>, PackError> {
        match self {
            Dest::Local { dir } => match std::fs::read(dir.join(name)) {
                Ok(b) => Ok(Some(b)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(PackError::local(&dir.join(name), "cannot read", &e)),
            },
            Dest::Remote(r) => {
                let path = r.path(name);
                let got = r.runtime.block_on(async {
                    match r.store.get(&path).await {
                        Ok(g) => g.bytes().await.map(Some),
                        Err(object_store::Error::NotFound { .. }) => Ok(None),
                        Err(e) => Err(e),
                    }
                });
                got.map(|b| b.map(|b| b.to_vec()))
                    .map_err(|e| Remote::error(&self.url_of(name), &e, "cannot read"))
            }
        }
    }

    /// The size and version of `name`, or `None` if it does not exist.
    ///
    /// # Errors
    ///
    /// [`PackError::Dest`] for any other failure.
    pub fn stamp(&self, name: &str) -> Result<Option<Stamp>, PackError> {
        match self {
            Dest::Local { dir } => match std::fs::metadata(dir.join(name)) {
                Ok(m) => Ok(Some(local_stamp(&m))),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(PackError::local(&dir.join(name), "cannot stat", &e)),
            },
            Dest::Remote(r) => {
                let path = r.path(name);
                match r.runtime.block_on(r.store.head(&path)) {
                    Ok(m) => Ok(Some(Stamp {
                        size: m.size,
                        etag: m.e_tag,
                        mtime_ns: None,
                    })),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(Remote::error(&self.url_of(name), &e, "cannot look up")),
                }
            }
        }
    }

    /// Writes `bytes` as `name`, whole or not at all.
    ///
    /// # Errors
    ///
    /// [`PackError::Dest`] naming the file or object.
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<Stamp, PackError> {
        let mut out = self.create(name)?;
        out.write_all(bytes).map_err(|e| out.failure(&e))?;
        out.commit()
    }

    /// Removes `name` (nothing if it does not exist).
    ///
    /// # Errors
    ///
    /// [`PackError::Dest`] naming the file or object.
    pub fn remove(&self, name: &str) -> Result<(), PackError> {
        match self {
            Dest::Local { dir } => match std::fs::remove_file(dir.join(name)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    Err(PackError::local(&dir.join(name), "cannot remove", &e))
                }
                _ => Ok(()),
            },
            Dest::Remote(r) => {
                let path = r.path(name);
                match r.runtime.block_on(r.store.delete(&path)) {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                    Err(e) => Err(Remote::error(&self.url_of(name), &e, "cannot remove")),
                }
            }
        }
    }

    /// A new file or object `name`, seen only once [`ShardOut::commit`]ted.
    ///
    /// # Errors
    ///
    /// [`PackError::Dest`] when a local temporary file cannot be made (a
    /// remote upload starts with the first part).
    pub fn create(&self, name: &str) -> Result<ShardOut, PackError> {
        match self {
            Dest::Local { dir } => {
                let target = dir.join(name);
                let tmp = temp_name(&target);
                if let Some(parent) = target.parent() {
                    std::fs::create_dir_all(parent)
                        .map_err(|e| PackError::local(parent, "cannot make the folder", &e))?;
                }
                let file =
                    File::create(&tmp).map_err(|e| PackError::local(&tmp, "cannot create", &e))?;
                Ok(ShardOut::Local {
                    file: Some(BufWriter::with_capacity(1 << 20, file)),
                    tmp,
                    target,
                })
            }
            Dest::Remote(r) => Ok(ShardOut::Remote(Box::new(RemoteOut {
                url: self.url_of(name),
                path: r.path(name),
                runtime: Arc::clone(&r.runtime),
                store: Arc::clone(&r.store),
                buffer: Vec::new(),
                upload: None,
                written: 0,
                failed: None,
            }))),
        }
    }

    /// Takes the folder's lock (held while the returned file is open), and
    /// removes the temporary files of packs that died; `None` for a store.
    ///
    /// # Errors
    ///
    /// [`PackError::Conflict`] when another pack holds the lock;
    /// [`PackError::Dest`] when the lock file cannot be made.
    pub fn lock(&self, records: &str) -> Result<Option<File>, PackError> {
        let Dest::Local { dir } = self else {
            return Ok(None);
        };
        let folder = dir.join(records);
        std::fs::create_dir_all(&folder)
            .map_err(|e| PackError::local(&folder, "cannot make the folder", &e))?;
        let path = folder.join("lock");
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| PackError::local(&path, "cannot make the lock file", &e))?;
        // A file system without flock fails otherwise: the pack goes on
        // without the lock.
        let locked = rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive);
        if locked == Err(rustix::io::Errno::WOULDBLOCK) {
            return Err(PackError::Conflict {
                dest: self.shown(),
                reason: "another pack is writing into this folder now".into(),
            });
        }
        for sub in [dir.clone(), folder] {
            for name in read_names(&sub)? {
                let temporary = Path::new(&name).extension().is_some_and(|e| e == "tmp");
                if name.starts_with('.') && temporary {
                    let _ = std::fs::remove_file(sub.join(name));
                }
            }
        }
        Ok(Some(file))
    }
}

/// A local file's [`Stamp`].
fn local_stamp(m: &std::fs::Metadata) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    Stamp {
        size: m.len(),
        etag: None,
        mtime_ns: Some(m.mtime() * 1_000_000_000 + m.mtime_nsec()),
    }
}

/// The names in `dir`.
fn read_names(dir: &Path) -> Result<Vec<String>, PackError> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| PackError::local(dir, "cannot read the folder", &e))?;
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| PackError::local(dir, "cannot read the folder", &e))?;
        out.push(entry.file_name().to_string_lossy().into_owned());
    }
    Ok(out)
}

/// The names in `dir` with their stamps (an entry that vanished meanwhile
/// is left out).
fn read_entries(dir: &Path) -> Result<Vec<(String, Stamp)>, PackError> {
    let mut out = Vec::new();
    for name in read_names(dir)? {
        if let Ok(m) = std::fs::metadata(dir.join(&name)) {
            out.push((name, local_stamp(&m)));
        }
    }
    Ok(out)
}

/// `dir/.NAME.tmp` for `dir/NAME`.
fn temp_name(target: &Path) -> PathBuf {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    target.with_file_name(format!(".{name}.tmp"))
}

impl Remote {
    /// The object path of `name` under the prefix.
    fn path(&self, name: &str) -> ObjectPath {
        let base = self.prefix.path.as_ref();
        if base.is_empty() {
            ObjectPath::from(name)
        } else {
            ObjectPath::from(format!("{base}/{name}"))
        }
    }

    /// A store's failure as a [`PackError`].
    fn error(url: &str, e: &object_store::Error, what: &str) -> PackError {
        PackError::remote(&RemoteError::from_store(url, e), what)
    }
}

/// A file or object being written: [`Write`], then [`ShardOut::commit`]
/// (dropped without it, nothing is left).
pub enum ShardOut {
    /// A local temporary file, renamed at the end.
    Local {
        /// The open temporary file (`None` once committed or aborted).
        file: Option<BufWriter<File>>,
        /// Its name.
        tmp: PathBuf,
        /// The name it takes.
        target: PathBuf,
    },
    /// An upload.
    Remote(Box<RemoteOut>),
}

/// An object being uploaded: a `PUT` of the buffer if it stays under one
/// part, else a multipart upload.
pub struct RemoteOut {
    url: String,
    path: ObjectPath,
    runtime: Arc<Runtime>,
    store: Arc<dyn ObjectStore>,
    /// Bytes not yet handed to an upload.
    buffer: Vec<u8>,
    /// The multipart upload, once the object passed one part.
    upload: Option<WriteMultipart>,
    /// Bytes written.
    written: u64,
    /// The first failure (later writes fail with it).
    failed: Option<PackError>,
}

impl RemoteOut {
    fn error(&self, e: &object_store::Error, what: &str) -> PackError {
        Remote::error(&self.url, e, what)
    }

    /// Hands the buffer to the multipart upload (started if need be) and
    /// waits until at most [`UPLOAD_CONCURRENCY`] parts are in flight.
    fn flush_parts(&mut self) -> Result<(), PackError> {
        let rt = Arc::clone(&self.runtime);
        if self.upload.is_none() {
            let upload = rt
                .block_on(self.store.put_multipart(&self.path))
                .map_err(|e| self.error(&e, "cannot start the upload"))?;
            self.upload = Some(WriteMultipart::new_with_chunk_size(upload, UPLOAD_PART));
        }
        let upload = self.upload.as_mut().expect("started above");
        {
            // WriteMultipart spawns each part's request on the runtime.
            let _in_runtime = rt.enter();
            upload.write(&self.buffer);
        }
        self.buffer.clear();
        let waited = rt.block_on(upload.wait_for_capacity(UPLOAD_CONCURRENCY));
        waited.map_err(|e| self.error(&e, "cannot upload a part"))
    }

    fn commit(&mut self) -> Result<Stamp, PackError> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        let rt = Arc::clone(&self.runtime);
        let result = match self.upload.take() {
            None => {
                let payload = PutPayload::from(std::mem::take(&mut self.buffer));
                rt.block_on(self.store.put(&self.path, payload))
                    .map_err(|e| self.error(&e, "cannot upload"))?
            }
            Some(mut upload) => {
                {
                    let _in_runtime = rt.enter();
                    upload.write(&self.buffer);
                }
                rt.block_on(upload.finish())
                    .map_err(|e| self.error(&e, "cannot complete the upload"))?
            }
        };
        Ok(Stamp {
            size: self.written,
            etag: result.e_tag,
            mtime_ns: None,
        })
    }
}

impl Drop for RemoteOut {
    fn drop(&mut self) {
        if let Some(upload) = self.upload.take() {
            // Not committed: the parts sent are discarded (best effort; a
            // store's lifecycle rule removes what a killed pack leaves).
            let _ = self.runtime.block_on(upload.abort());
        }
    }
}

impl ShardOut {
    /// Makes the file or object whole and visible under its name.
    ///
    /// # Errors
    ///
    /// [`PackError::Dest`]: the flush, the rename or the upload failed.
    ///
    /// # Panics
    ///
    /// Never: a local file is open until this call, which consumes it.
    pub fn commit(mut self) -> Result<Stamp, PackError> {
        match &mut self {
            ShardOut::Local { file, tmp, target } => {
                let inner = file.take().expect("open until committed");
                let written = inner.into_inner().map_err(|e| {
                    let _ = std::fs::remove_file(&*tmp);
                    PackError::local(tmp, "cannot write", e.error())
                })?;
                drop(written);
                std::fs::rename(&*tmp, &*target).map_err(|e| {
                    let _ = std::fs::remove_file(&*tmp);
                    PackError::local(target, "cannot rename the finished file", &e)
                })?;
                let m = std::fs::metadata(&*target)
                    .map_err(|e| PackError::local(target, "cannot stat", &e))?;
                Ok(local_stamp(&m))
            }
            ShardOut::Remote(r) => r.commit(),
        }
    }

    /// The [`PackError`] of a failed write (the upload's own, kept, or the
    /// local file's I/O error).
    pub fn failure(&mut self, e: &io::Error) -> PackError {
        match self {
            ShardOut::Local { tmp, .. } => PackError::local(tmp, "cannot write", e),
            ShardOut::Remote(r) => r.failed.take().unwrap_or_else(|| PackError::Dest {
                dest: r.url.clone(),
                reason: format!("cannot write: {e}"),
                kind: DestKind::Other,
                errno: None,
            }),
        }
    }
}

impl Drop for ShardOut {
    fn drop(&mut self) {
        if let ShardOut::Local { file, tmp, .. } = self {
            if file.take().is_some() {
                let _ = std::fs::remove_file(tmp);
            }
        }
    }
}

impl Write for ShardOut {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            ShardOut::Local { file, .. } => file.as_mut().expect("open until committed").write(buf),
            ShardOut::Remote(r) => {
                if let Some(e) = &r.failed {
                    return Err(io::Error::other(e.to_string()));
                }
                r.buffer.extend_from_slice(buf);
                r.written += buf.len() as u64;
                if r.buffer.len() >= UPLOAD_PART {
                    if let Err(e) = r.flush_parts() {
                        let text = e.to_string();
                        r.failed = Some(e);
                        return Err(io::Error::other(text));
                    }
                }
                Ok(buf.len())
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            ShardOut::Local { file, .. } => file.as_mut().expect("open until committed").flush(),
            ShardOut::Remote(_) => Ok(()),
        }
    }
}
