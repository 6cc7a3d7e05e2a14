//! Writing an arena file.

use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::FallocateFlags;
use rustix::io::Errno;
use zerocopy::little_endian::{U32, U64};
use zerocopy::IntoBytes;

use super::error::{ArenaError, Result};
use super::format::{align_up, Header, FLAG_COMPLETE, HEADER_LEN, INDEX_ALIGN, ITEM_ALIGN};
use super::lock;
use super::reader::Arena;
use super::sweep::{sweep_orphans, ARENA_SUFFIX, TMP_SUFFIX};

/// The mode of a finished arena file: read-only for everyone, the owner
/// included. Only root, or the owner after a `chmod`, can change it.
pub const SEALED_MODE: u32 = 0o444;

/// Bytes gathered before one `pwrite`.
const WRITE_BUFFER: usize = 4 << 20;
/// Smallest step by which the file's reservation grows.
const MIN_RESERVE_STEP: u64 = 4 << 20;
/// Largest step by which the reservation grows ahead of the data.
const MAX_RESERVE_STEP: u64 = 1 << 30;

/// Builds an arena file item by item.
///
/// The file is written under a temporary name in the target's directory and
/// renamed into place by [`ArenaWriter::finish`], so no process ever maps a
/// half-written arena. Space is reserved with `fallocate` as the data grows:
/// a file system that runs out of room (a small `/dev/shm`, say) fails here
/// with [`ArenaError::NoSpace`], never with a SIGBUS in a reader later. A
/// writer dropped before `finish` (or failing) removes its temporary file.
/// A finished arena is sealed: its file is read-only ([`SEALED_MODE`]) from
/// the moment it has its final name, and ferrofeed never writes to it again.
///
/// Creating a writer first sweeps the directory's orphans
/// ([`sweep_orphans`]).
///
/// # Examples
///
/// ```
/// use ferrofeed::arena::ArenaWriter;
/// let dir = tempfile::tempdir()?;
/// let mut w = ArenaWriter::create_in(dir.path())?;
/// w.push(b"first")?;
/// w.push_parts(&[b"header", b"64-byte aligned payload"])?;
/// let arena = w.finish()?;
/// assert_eq!(arena.len(), 2);
/// assert_eq!(arena.get(0), Some(&b"first"[..]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct ArenaWriter {
    path: PathBuf,
    tmp_path: PathBuf,
    file: Option<File>,
    /// Bytes not yet written, to go at file offset `buf_at`.
    buf: Vec<u8>,
    buf_at: u64,
    /// End of the data written so far (the last item's end).
    end: u64,
    /// Bytes reserved with `fallocate` (0 when the file system lacks it).
    reserved: u64,
    can_fallocate: bool,
    /// `off[1..]`: the end of each item.
    ends: Vec<u64>,
}

/// A name that no other arena on this node uses: pid, a per-process counter
/// and a random part (the hasher's per-process random keys).
fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(n);
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!("{}-{n}-{:016x}", std::process::id(), h.finish())
}

/// Computes where each part of an item that follows offset `end` goes
/// (into `starts`) and returns the item's end; `None` on overflow.
fn place_parts(end: u64, parts: &[&[u8]], starts: &mut Vec<u64>) -> Option<u64> {
    let start = align_up(end, ITEM_ALIGN)?;
    let mut rel = 0u64;
    for (k, part) in parts.iter().enumerate() {
        if k > 0 {
            rel = align_up(rel, ITEM_ALIGN)?;
        }
        starts.push(start.checked_add(rel)?);
        rel = rel.checked_add(part.len() as u64)?;
    }
    start.checked_add(rel)
}

impl ArenaWriter {
    /// Starts an arena that will be published at `path`.
    ///
    /// # Errors
    ///
    /// [`ArenaError::AlreadyExists`] if `path` exists; [`ArenaError::NotFound`]
    /// if its directory does not; [`ArenaError::Io`] for other failures.
    pub fn create(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        sweep_orphans(&dir);
        if path.symlink_metadata().is_ok() {
            return Err(ArenaError::AlreadyExists { path });
        }
        let file_name = path
            .file_name()
            .ok_or_else(|| ArenaError::Io {
                op: "create",
                path: path.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "an arena path must name a file",
                ),
            })?
            .to_string_lossy()
            .into_owned();
        let mut tmp_name = format!(".{file_name}");
        if !tmp_name.ends_with(ARENA_SUFFIX) {
            // The sweeper recognises partial arenas by `.arena.PID.RAND.tmp`.
            tmp_name.push_str(ARENA_SUFFIX);
        }
        let tmp_path = dir.join(format!(
            "{tmp_name}.{}.{:x}{TMP_SUFFIX}",
            std::process::id(),
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        ));
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp_path)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => ArenaError::NotFound { path: dir.clone() },
                _ => ArenaError::io("create", &tmp_path, e),
            })?;
        let mut w = Self {
            path,
            tmp_path,
            file: Some(file),
            buf: Vec::new(),
            buf_at: HEADER_LEN,
            end: HEADER_LEN,
            reserved: 0,
            can_fallocate: true,
            ends: Vec::new(),
        };
        lock::lock_shared(w.file(), &w.tmp_path)?;
        w.ensure_reserved(HEADER_LEN)?;
        let header = Header::incomplete();
        w.file()
            .write_all_at(header.as_bytes(), 0)
            .map_err(|e| w.write_error(e, HEADER_LEN))?;
        Ok(w)
    }

    /// Starts an arena with a generated, unique name
    /// (`ferrofeed-PID-N-RANDOM.arena`) in `dir`.
    ///
    /// # Errors
    ///
    /// As [`ArenaWriter::create`].
    pub fn create_in(dir: impl AsRef<Path>) -> Result<Self> {
        let name = format!("ferrofeed-{}{ARENA_SUFFIX}", unique_suffix());
        Self::create(dir.as_ref().join(name))
    }

    /// The path the arena will have once finished.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of items pushed so far.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether no item was pushed yet.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Bytes of item data (with alignment padding) written so far.
    pub fn data_len(&self) -> u64 {
        self.end - HEADER_LEN
    }

    fn file(&self) -> &File {
        self.file
            .as_ref()
            .expect("the file is open until finish or drop")
    }

    /// Appends one item.
    ///
    /// # Errors
    ///
    /// [`ArenaError::NoSpace`] when the file system is full;
    /// [`ArenaError::Io`] on other write failures. The writer should be
    /// dropped after an error (which removes the temporary file).
    pub fn push(&mut self, item: &[u8]) -> Result<()> {
        self.push_parts(&[item])
    }

    /// Appends one item made of `parts`, each of which starts 64-byte aligned
    /// relative to the item's start (and so in the file and the mapping),
    /// with zero padding between them.
    ///
    /// # Errors
    ///
    /// As [`ArenaWriter::push`].
    pub fn push_parts(&mut self, parts: &[&[u8]]) -> Result<()> {
        let mut starts = Vec::with_capacity(parts.len());
        let Some(item_end) = place_parts(self.end, parts, &mut starts) else {
            return Err(self.no_space(u64::MAX));
        };
        self.ensure_reserved(item_end)?;
        for (&at, part) in starts.iter().zip(parts) {
            self.write_at(at, part)?;
        }
        self.end = item_end;
        self.ends.push(item_end);
        Ok(())
    }

    /// Buffers (or, for large parts, writes) `bytes` at file offset `at`,
    /// which is at or past the end of everything written so far.
    fn write_at(&mut self, at: u64, bytes: &[u8]) -> Result<()> {
        let buffered_end = self.buf_at + self.buf.len() as u64;
        debug_assert!(at >= buffered_end);
        if bytes.len() >= WRITE_BUFFER {
            self.flush()?;
            self.file()
                .write_all_at(bytes, at)
                .map_err(|e| self.write_error(e, at + bytes.len() as u64))?;
            self.buf_at = at + bytes.len() as u64;
            return Ok(());
        }
        let gap = (at - buffered_end) as usize;
        if self.buf.len() + gap + bytes.len() > WRITE_BUFFER {
            self.flush()?;
            self.buf_at = at;
        } else {
            self.buf.resize(self.buf.len() + gap, 0);
        }
        self.buf.extend_from_slice(bytes);
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if !self.buf.is_empty() {
            let end = self.buf_at + self.buf.len() as u64;
            self.file()
                .write_all_at(&self.buf, self.buf_at)
                .map_err(|e| self.write_error(e, end))?;
            self.buf_at = end;
            self.buf.clear();
        }
        Ok(())
    }

    fn dir(&self) -> PathBuf {
        self.tmp_path
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
    }

    /// Bytes this process may still add to a file in the target directory:
    /// the file system's free space, capped by `RLIMIT_FSIZE`.
    fn available(&self) -> u64 {
        let fs_free =
            rustix::fs::statvfs(self.dir()).map_or(0, |s| s.f_bavail.saturating_mul(s.f_frsize));
        let limit = rustix::process::getrlimit(rustix::process::Resource::Fsize)
            .current
            .map_or(u64::MAX, |l| l.saturating_sub(self.reserved));
        fs_free.min(limit)
    }

    #[cold]
    fn no_space(&self, needed: u64) -> ArenaError {
        ArenaError::NoSpace {
            path: self.path.clone(),
            dir: self.dir(),
            needed,
            available: self.available().saturating_add(self.reserved),
        }
    }

    #[cold]
    fn write_error(&self, e: std::io::Error, needed: u64) -> ArenaError {
        match Errno::from_io_error(&e) {
            Some(Errno::NOSPC | Errno::FBIG | Errno::DQUOT) => self.no_space(needed),
            _ => ArenaError::io("write", &self.tmp_path, e),
        }
    }

    /// Makes sure the file has room for `needed` bytes, reserving ahead of
    /// the data in growing steps so that `fallocate` runs rarely.
    fn ensure_reserved(&mut self, needed: u64) -> Result<()> {
        if needed <= self.reserved || !self.can_fallocate {
            return Ok(());
        }
        let step = self.reserved.clamp(MIN_RESERVE_STEP, MAX_RESERVE_STEP);
        let ahead = needed.saturating_add(step);
        if self.reserve(ahead).is_err() {
            // The step ahead may not fit where the data itself does.
            self.reserve(needed)?;
        }
        Ok(())
    }

    /// Reserves the file's first `len` bytes with `fallocate`.
    fn reserve(&mut self, len: u64) -> Result<()> {
        if len <= self.reserved || !self.can_fallocate {
            return Ok(());
        }
        let from = self.reserved;
        let res = loop {
            match rustix::fs::fallocate(self.file(), FallocateFlags::empty(), from, len - from) {
                Err(Errno::INTR) => {}
                other => break other,
            }
        };
        match res {
            Ok(()) => {
                self.reserved = len;
                Ok(())
            }
            Err(Errno::OPNOTSUPP | Errno::NOSYS) => {
                // No fallocate here: a full disk then shows as ENOSPC from
                // the writes themselves, which `write_error` reports the same way.
                self.can_fallocate = false;
                Ok(())
            }
            Err(Errno::NOSPC | Errno::FBIG | Errno::DQUOT) => Err(self.no_space(len)),
            Err(e) => Err(ArenaError::io("fallocate", &self.tmp_path, e.into())),
        }
    }

    /// Writes the index and the header, publishes the file under its final
    /// name and returns it mapped, owned by this process: the returned
    /// [`Arena`] removes the file when dropped (see [`Arena::remove_file`]).
    ///
    /// # Errors
    ///
    /// [`ArenaError::NoSpace`] when the index does not fit;
    /// [`ArenaError::AlreadyExists`] when another file took the final name
    /// meanwhile; [`ArenaError::Io`] otherwise. The temporary file is removed
    /// on error.
    pub fn finish(mut self) -> Result<Arena> {
        self.flush()?;
        let n = self.ends.len() as u64;
        let index_offset =
            align_up(self.end, INDEX_ALIGN).ok_or_else(|| self.no_space(u64::MAX))?;
        let mut index = Vec::with_capacity((self.ends.len() + 1) * 8);
        index.extend_from_slice(&HEADER_LEN.to_le_bytes());
        for end in &self.ends {
            index.extend_from_slice(&end.to_le_bytes());
        }
        let file_len = index_offset + index.len() as u64;
        self.ensure_reserved(file_len)?;
        self.file()
            .write_all_at(&index, index_offset)
            .map_err(|e| self.write_error(e, file_len))?;
        // Trim what was reserved ahead of the data.
        self.file()
            .set_len(file_len)
            .map_err(|e| ArenaError::io("truncate", &self.tmp_path, e))?;
        let mut header = Header::incomplete();
        header.flags = U32::new(FLAG_COMPLETE);
        header.item_count = U64::new(n);
        header.index_offset = U64::new(index_offset);
        header.file_len = U64::new(file_len);
        self.file()
            .write_all_at(header.as_bytes(), 0)
            .map_err(|e| self.write_error(e, file_len))?;
        self.seal()?;
        self.publish()?;
        let Some(file) = self.file.take() else {
            return Err(ArenaError::io(
                "finish",
                &self.path,
                std::io::Error::other("the writer's file is gone"),
            ));
        };
        Arena::from_file(file, self.path.clone(), Some(std::process::id())).inspect_err(|_| {
            let _ = std::fs::remove_file(&self.path);
        })
    }

    /// Makes the complete file read-only ([`SEALED_MODE`]) before it gets
    /// its final name, so that no process of the owner's user can open it
    /// for writing and truncate it under the readers' mappings. This
    /// writer's own descriptor stays writable, but nothing writes through it
    /// any more; the owner still removes the file (removal needs write
    /// permission on the directory, not the file).
    ///
    /// A file system without file modes (some FUSE ones) is accepted
    /// unsealed, as a file system without `flock` is accepted unlocked.
    fn seal(&mut self) -> Result<()> {
        let mode = rustix::fs::Mode::from_raw_mode(SEALED_MODE);
        match rustix::fs::fchmod(self.file(), mode) {
            Ok(()) | Err(Errno::OPNOTSUPP | Errno::NOSYS) => Ok(()),
            Err(e) => Err(ArenaError::io("chmod", &self.tmp_path, e.into())),
        }
    }

    /// Renames the temporary file to the final path, never replacing an
    /// existing file (a reader may be mapping it).
    fn publish(&mut self) -> Result<()> {
        use rustix::fs::{renameat_with, RenameFlags, CWD};
        match renameat_with(CWD, &self.tmp_path, CWD, &self.path, RenameFlags::NOREPLACE) {
            Ok(()) => {}
            Err(Errno::EXIST) => {
                return Err(ArenaError::AlreadyExists {
                    path: self.path.clone(),
                })
            }
            Err(Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
                // No RENAME_NOREPLACE on this file system: a hard link is
                // just as atomic and fails on an existing target.
                std::fs::hard_link(&self.tmp_path, &self.path)
                    .map_err(|e| ArenaError::io("link", &self.path, e))?;
                let _ = std::fs::remove_file(&self.tmp_path);
            }
            Err(e) => return Err(ArenaError::io("rename", &self.tmp_path, e.into())),
        }
        // Published: nothing temporary is left to remove.
        self.tmp_path = PathBuf::new();
        Ok(())
    }
}

impl Drop for ArenaWriter {
    fn drop(&mut self) {
        if !self.tmp_path.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.tmp_path);
        }
    }
}
