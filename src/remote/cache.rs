//! Fetched shards kept on local disk, shared by every process of a node.
//!
//! A shard's file is named by its URL, `ETag` and size (a changed object is
//! another file). The protocol:
//!
//! - **Hit**: the file is opened and mapped; the map stays valid if the file
//!   is evicted meanwhile (eviction unlinks, it never truncates). Its mtime
//!   is set to now: the cache evicts the least recently used.
//! - **Miss**: the process takes the shard's lock file (`flock`, exclusive,
//!   polled so no runtime thread blocks on it), looks again (another process
//!   may have fetched it while this one waited), fetches, writes to a
//!   temporary name and renames it into place. So a shard is downloaded
//!   once per node however many ranks and workers want it, and a file under
//!   its final name is always whole.
//! - **Eviction**: after a write, while the files add up to more than the
//!   limit, the least recently used are removed (never the one just
//!   written). One process evicts at a time (a second lock); the others skip.
//! - Temporary files of processes that died mid-write are removed when a
//!   cache is opened.

use std::fmt::Write as _;
use std::fs::File;
use std::future::Future;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use md5::{Digest, Md5};
use rustix::fs::FlockOperation;

use super::fetch::Object;
use super::RemoteError;

/// How often a process waiting for another's download looks again.
const POLL: Duration = Duration::from_millis(20);

/// Prefix of temporary files: `.tmp-<pid>-<n>-<name>`.
const TMP: &str = ".tmp-";
/// Prefix of lock files: `.lock-<name>` (kept: removing a lock file someone
/// waits on would let two processes hold "the" lock).
const LOCK: &str = ".lock-";
/// The lock one evicting process holds.
const EVICT_LOCK: &str = ".evict.lock";

/// A cache directory with a size limit.
#[derive(Debug, Clone)]
pub struct Cache {
    dir: PathBuf,
    limit: u64,
    /// Shard writes on their way (on the blocking pool), shared by the
    /// clones: a source's drop waits for them (see [`Cache::settle`]).
    writing: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// Counts one shard write on its way while it lives.
struct Writing(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Writing {
    fn new(count: &std::sync::Arc<std::sync::atomic::AtomicUsize>) -> Self {
        count.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Self(std::sync::Arc::clone(count))
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl Cache {
    /// Opens (making it if need be) the cache in `dir`, keeping at most
    /// `limit` bytes of shards.
    ///
    /// # Errors
    ///
    /// [`RemoteError::Cache`] when the directory cannot be made or read.
    pub fn open(dir: &Path, limit: u64) -> Result<Self, RemoteError> {
        let io = |source| RemoteError::Cache {
            path: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let Ok(entry) = entry else { continue };
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(tmp_pid) else {
                continue;
            };
            if crate::fs::process_is_dead(pid) {
                // Best effort: another process may remove it first.
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            limit,
            writing: std::sync::Arc::default(),
        })
    }

    /// Waits, until `deadline` at the latest, for the shard writes on their
    /// way to end (each writes a temporary file, then renames it): the fetch
    /// that started one may have been aborted, and a process that exits in
    /// the middle of a write leaves its temporary file to the next sweep.
    pub fn settle(&self, deadline: std::time::Instant) {
        while self.writing.load(std::sync::atomic::Ordering::Acquire) > 0
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// The cache's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file name of `object` in the cache.
    pub fn name(object: &Object) -> String {
        let mut h = Md5::new();
        h.update(object.url.url.as_bytes());
        h.update([0]);
        h.update(object.etag.as_deref().unwrap_or("").as_bytes());
        h.update([0]);
        h.update(object.size.to_le_bytes());
        let digest = h.finalize();
        let mut name = String::with_capacity(2 * digest.len() + 81);
        for b in digest {
            let _ = write!(name, "{b:02x}");
        }
        let base = object.url.path.filename().unwrap_or("");
        let tail: String = base
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
            .take(80)
            .collect();
        if !tail.is_empty() {
            name.push('-');
            name.push_str(&tail);
        }
        name
    }

    /// The bytes of `object` from the cache, if it holds them.
    ///
    /// # Errors
    ///
    /// [`RemoteError::Cache`] when the file is there but cannot be read.
    pub fn lookup(&self, object: &Object) -> Result<Option<Bytes>, RemoteError> {
        let path = self.dir.join(Self::name(object));
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(RemoteError::Cache { path, source }),
        };
        let len = file
            .metadata()
            .map_err(|source| RemoteError::Cache {
                path: path.clone(),
                source,
            })?
            .len();
        if len != object.size {
            // Not ours to trust (a file put there by hand, or a filesystem
            // that lost data): fetch again, replacing it.
            return Ok(None);
        }
        // Least recently used: a hit counts as a use. Best effort (a cache
        // shared by several users may hold others' files).
        let _ = file.set_modified(SystemTime::now());
        if len == 0 {
            return Ok(Some(Bytes::new()));
        }
        // SAFETY: the map is read only. Files under their final name are
        // never written again: they are written under a temporary name and
        // renamed into place, and eviction unlinks them (the map keeps the
        // pages) without truncating. A process outside this protocol that
        // truncates a cache file could fault a reader (SIGBUS); the cache
        // directory is this module's alone, as the docs say.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| RemoteError::Cache {
            path: path.clone(),
            source,
        })?;
        Ok(Some(Bytes::from_owner(map)))
    }

    /// The bytes of `object`: from the cache, or from `fetch` (run by one
    /// process of the node at a time for this object), then kept in the
    /// cache. Returns the bytes and whether they were fetched here.
    ///
    /// # Errors
    ///
    /// `fetch`'s error, or [`RemoteError::Cache`] when the cache cannot be
    /// written.
    pub async fn get_or_fetch<F, Fut>(
        &self,
        object: &Object,
        fetch: F,
    ) -> Result<(Bytes, bool), RemoteError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Bytes, RemoteError>>,
    {
        if let Some(bytes) = self.lookup(object)? {
            return Ok((bytes, false));
        }
        let name = Self::name(object);
        let lock_path = self.dir.join(format!("{LOCK}{name}"));
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|source| RemoteError::Cache {
                path: lock_path.clone(),
                source,
            })?;
        loop {
            match rustix::fs::flock(lock.as_fd(), FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => break,
                Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR) => {
                    tokio::time::sleep(POLL).await;
                }
                Err(e) => {
                    return Err(RemoteError::Cache {
                        path: lock_path,
                        source: e.into(),
                    })
                }
            }
        }
        // Held: fetched by another process while this one waited?
        if let Some(bytes) = self.lookup(object)? {
            return Ok((bytes, false));
        }
        let bytes = fetch().await?;
        // Written on the runtime's blocking pool: a shard's write (and the
        // eviction's walk of the directory) never holds up a runtime thread,
        // which pipelines' stage tasks share.
        let (cache, kept) = (self.clone(), bytes.clone());
        let writing = Writing::new(&self.writing);
        let written = tokio::task::spawn_blocking(move || {
            let _writing = writing;
            cache.store(&name, &kept)?;
            drop(lock); // closing the file releases the lock
            cache.evict(&name);
            Ok(())
        })
        .await;
        match written {
            Ok(result) => result.map(|()| (bytes, true)),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(RemoteError::Failed {
                url: object.url.url.clone(),
                message: format!("writing the cache: {e}"),
            }),
        }
    }

    /// Writes `bytes` as the cache file `name`: to a temporary file, then
    /// renamed into place.
    fn store(&self, name: &str, bytes: &[u8]) -> Result<(), RemoteError> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .dir
            .join(format!("{TMP}{}-{n}-{name}", std::process::id()));
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| RemoteError::Cache { path, source }
        };
        let written = File::create(&tmp)
            .and_then(|mut f| f.write_all(bytes))
            .map_err(io(&tmp));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        let target = self.dir.join(name);
        std::fs::rename(&tmp, &target).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io(&target)(e)
        })
    }

    /// Removes the least recently used files while they add up to more than
    /// the limit, keeping `keep`. Skipped if another process is evicting.
    fn evict(&self, keep: &str) {
        let Ok(lock) = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.dir.join(EVICT_LOCK))
        else {
            return;
        };
        if rustix::fs::flock(lock.as_fd(), FlockOperation::NonBlockingLockExclusive).is_err() {
            return;
        }
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut files: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
        let mut total = 0u64;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with('.') {
                continue;
            }
            let Ok(meta) = entry.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            total += meta.len();
            if name != keep {
                let used = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                files.push((used, meta.len(), entry.path()));
            }
        }
        files.sort();
        for (_, len, path) in files {
            if total <= self.limit {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
    }
}

/// The pid of a temporary file's writer, from its name.
fn tmp_pid(name: &str) -> Option<i32> {
    name.strip_prefix(TMP)?.split('-').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::url::ObjectUrl;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    fn object(url: &str, size: u64, etag: &str) -> Object {
        Object {
            url: ObjectUrl::parse(url).unwrap(),
            size,
            etag: Some(etag.into()),
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    }

    #[test]
    fn names_differ_by_url_etag_and_size() {
        let a = Cache::name(&object("s3://b/dir/shard-0.tar", 10, "e1"));
        assert!(a.ends_with("-shard-0.tar"), "{a}");
        assert_ne!(a, Cache::name(&object("s3://b/dir/shard-1.tar", 10, "e1")));
        assert_ne!(a, Cache::name(&object("s3://b/dir/shard-0.tar", 10, "e2")));
        assert_ne!(a, Cache::name(&object("s3://b/dir/shard-0.tar", 11, "e1")));
        assert_eq!(a, Cache::name(&object("s3://b/dir/shard-0.tar", 10, "e1")));
    }

    #[test]
    fn a_miss_fetches_once_and_a_hit_fetches_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path(), 1 << 20).unwrap();
        let obj = object("s3://b/x.tar", 5, "e");
        let calls = AtomicUsize::new(0);
        let rt = runtime();
        let fetch = || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok(Bytes::from_static(b"hello"))
        };
        let (a, fetched) = rt.block_on(cache.get_or_fetch(&obj, fetch)).unwrap();
        assert_eq!((&a[..], fetched), (&b"hello"[..], true));
        let (b, fetched) = rt.block_on(cache.get_or_fetch(&obj, fetch)).unwrap();
        assert_eq!((&b[..], fetched), (&b"hello"[..], false));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // The file, its lock file and the eviction lock; no temporary file.
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        let name = Cache::name(&obj);
        assert_eq!(
            names,
            [EVICT_LOCK.to_string(), format!("{LOCK}{name}"), name],
            "{names:?}"
        );
    }

    #[test]
    fn a_failed_fetch_leaves_nothing_and_the_next_one_retries() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path(), 1 << 20).unwrap();
        let obj = object("s3://b/x.tar", 5, "e");
        let rt = runtime();
        let err = rt
            .block_on(cache.get_or_fetch(&obj, || async {
                Err(RemoteError::Failed {
                    url: "s3://b/x.tar".into(),
                    message: "boom".into(),
                })
            }))
            .unwrap_err();
        assert!(err.to_string().contains("boom"));
        assert!(cache.lookup(&obj).unwrap().is_none());
        let (b, fetched) = rt
            .block_on(cache.get_or_fetch(&obj, || async { Ok(Bytes::from_static(b"12345")) }))
            .unwrap();
        assert_eq!((&b[..], fetched), (&b"12345"[..], true));
    }

    #[test]
    fn a_file_of_the_wrong_size_is_fetched_again() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path(), 1 << 20).unwrap();
        let obj = object("s3://b/x.tar", 5, "e");
        std::fs::write(dir.path().join(Cache::name(&obj)), b"12").unwrap();
        let rt = runtime();
        let (b, fetched) = rt
            .block_on(cache.get_or_fetch(&obj, || async { Ok(Bytes::from_static(b"abcde")) }))
            .unwrap();
        assert_eq!((&b[..], fetched), (&b"abcde"[..], true));
        assert_eq!(
            std::fs::read(dir.path().join(Cache::name(&obj))).unwrap(),
            b"abcde"
        );
    }

    #[test]
    fn evicts_the_least_recently_used_past_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path(), 25).unwrap();
        let rt = runtime();
        let objs: Vec<Object> = (0..4)
            .map(|i| object(&format!("s3://b/{i}.tar"), 10, "e"))
            .collect();
        let data = Bytes::from_static(b"0123456789");
        let put = |o: &Object| {
            let d = data.clone();
            rt.block_on(cache.get_or_fetch(o, || async move { Ok(d) }))
                .unwrap()
        };
        put(&objs[0]);
        std::thread::sleep(Duration::from_millis(20));
        put(&objs[1]);
        std::thread::sleep(Duration::from_millis(20));
        // A hit on 0 makes 1 the least recently used.
        assert!(cache.lookup(&objs[0]).unwrap().is_some());
        std::thread::sleep(Duration::from_millis(20));
        put(&objs[2]); // 30 bytes > 25: 1 goes
        assert!(cache.lookup(&objs[1]).unwrap().is_none());
        assert!(cache.lookup(&objs[0]).unwrap().is_some());
        assert!(cache.lookup(&objs[2]).unwrap().is_some());
        // A map taken before eviction stays readable after it.
        let held = cache.lookup(&objs[0]).unwrap().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        put(&objs[3]); // the hit on 0 made 2 the least recently used: 2 goes
        assert_eq!(&held[..], b"0123456789");
        let kept = objs
            .iter()
            .filter(|o| cache.lookup(o).unwrap().is_some())
            .count();
        assert_eq!(kept, 2);
        assert!(cache.lookup(&objs[3]).unwrap().is_some());
    }

    #[test]
    fn one_download_across_racing_fetchers() {
        let dir = tempfile::tempdir().unwrap();
        let obj = Arc::new(object("s3://b/race.tar", 4, "e"));
        let calls = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..6)
            .map(|_| {
                let (dir, obj, calls) = (dir.path().to_path_buf(), obj.clone(), calls.clone());
                std::thread::spawn(move || {
                    // Each thread opens the cache as another process would.
                    let cache = Cache::open(&dir, 1 << 20).unwrap();
                    runtime()
                        .block_on(cache.get_or_fetch(&obj, || async {
                            calls.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            Ok(Bytes::from_static(b"data"))
                        }))
                        .unwrap()
                        .0
                })
            })
            .collect();
        for t in threads {
            assert_eq!(&t.join().unwrap()[..], b"data");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn removes_temporary_files_of_dead_writers_only() {
        let dir = tempfile::tempdir().unwrap();
        let mine = dir.path().join(format!("{TMP}{}-0-x", std::process::id()));
        let dead = dir.path().join(format!("{TMP}{}-0-y", i32::MAX - 1));
        std::fs::write(&mine, b"partial").unwrap();
        std::fs::write(&dead, b"partial").unwrap();
        Cache::open(dir.path(), 100).unwrap();
        assert!(mine.exists());
        assert!(!dead.exists());
    }
}
