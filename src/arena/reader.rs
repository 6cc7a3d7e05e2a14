//! Mapping and validating an arena file.

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use memmap2::Mmap;
use rustix::fs::OFlags;
use zerocopy::little_endian::U64;
use zerocopy::FromBytes;

use super::error::{ArenaError, Result};
use super::format::{
    align_up, Header, FORMAT_VERSION, HEADER_LEN, INDEX_ALIGN, ITEM_ALIGN, KNOWN_FLAGS, MAGIC,
};
use super::lock;

/// Where the regions of a validated arena lie, in bytes from the file start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Number of items.
    pub item_count: usize,
    /// Start of the item data.
    pub data_offset: usize,
    /// Start of the `item_count + 1` offsets.
    pub index_offset: usize,
}

/// A read-only, validated, memory-mapped arena.
///
/// Every item is an opaque byte string; [`Arena::get`] returns it as a slice
/// of the mapping, without copying. Any number of processes may map the same
/// file: the page cache holds one copy per node.
///
/// # Safety of the mapping
///
/// The file is mapped read-only, so nothing in this process can write
/// through the mapping. It is validated once at open, after which every
/// item's range lies inside the mapping. Arena files are never modified or
/// truncated after they are complete: the writer builds them under a
/// temporary name and renames them only once finished, and readers hold a
/// shared `flock` that keeps [`sweep_orphans`](super::sweep_orphans) from
/// removing them (removal would not invalidate the mapping anyway: the pages
/// live until the last mapping goes). A process that truncates an arena file
/// behind ferrofeed's back breaks this contract, as it would for any mmap.
#[derive(Debug)]
pub struct Arena {
    map: Mmap,
    /// Holds the shared lock that marks the file as in use; its inode is
    /// what [`Arena::remove_file`] removes.
    file: File,
    path: PathBuf,
    layout: Layout,
    /// The pid of the process that created the file and must remove it.
    owner_pid: Option<u32>,
    removed: AtomicBool,
}

impl Arena {
    /// Maps the arena at `path`, read-only, and validates it.
    ///
    /// Takes a shared `flock` on the file for as long as the returned value
    /// lives, so that [`sweep_orphans`](super::sweep_orphans) leaves it alone.
    ///
    /// # Errors
    ///
    /// [`ArenaError::NotFound`] for a missing file; a corruption variant
    /// ([`ArenaError::is_corrupt`]) for a file that is not a complete, valid
    /// arena; [`ArenaError::Io`] when the file cannot be opened, locked or
    /// mapped.
    ///
    /// # Examples
    ///
    /// ```
    /// use ferrofeed::arena::{Arena, ArenaWriter};
    /// let dir = tempfile::tempdir()?;
    /// let mut w = ArenaWriter::create(dir.path().join("a.arena"))?;
    /// w.push(b"hello")?;
    /// let owned = w.finish()?;
    /// let reader = Arena::open(owned.path())?;
    /// assert_eq!(reader.get(0), Some(&b"hello"[..]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = path.as_ref();
        // std opens every file with O_CLOEXEC. O_NONBLOCK: a named pipe given as
        // the path is refused below instead of waiting for a writer (it has no
        // effect on a regular file).
        let file = File::options()
            .read(true)
            .custom_flags((OFlags::NONBLOCK | OFlags::NOCTTY).bits().cast_signed())
            .open(path)
            .map_err(|e| ArenaError::io("open", path, e))?;
        let meta = file
            .metadata()
            .map_err(|e| ArenaError::io("stat", path, e))?;
        if !meta.is_file() {
            return Err(ArenaError::io(
                "open",
                path,
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file"),
            ));
        }
        lock::lock_shared(&file, path)?;
        Self::from_file(file, path.to_path_buf(), None)
    }

    /// Maps an already locked file and validates it.
    pub(crate) fn from_file(file: File, path: PathBuf, owner_pid: Option<u32>) -> Result<Self> {
        let len = file
            .metadata()
            .map_err(|e| ArenaError::io("stat", &path, e))?
            .len();
        if len < HEADER_LEN {
            return Err(ArenaError::Truncated {
                path,
                expected: HEADER_LEN,
                actual: len,
            });
        }
        // SAFETY: the mapping is read-only and private to this value; the
        // file is an arena, which ferrofeed never modifies or truncates once
        // complete (see the type-level "Safety of the mapping"). Its length
        // was just read and is non-zero; `validate` checks every region
        // against the mapping's actual length before anything is read.
        let map = unsafe { memmap2::MmapOptions::new().map(&file) }
            .map_err(|e| ArenaError::io("mmap", &path, e))?;
        let layout = validate(&path, &map)?;
        Ok(Self {
            map,
            file,
            path,
            layout,
            owner_pid,
            removed: AtomicBool::new(false),
        })
    }

    /// Number of items.
    #[inline]
    pub fn len(&self) -> usize {
        self.layout.item_count
    }

    /// Whether the arena holds no item.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.layout.item_count == 0
    }

    /// The byte range of item `i` within the mapping ([`Arena::as_bytes`]),
    /// or `None` when `i >= len()`.
    #[inline]
    pub fn span(&self, i: usize) -> Option<Range<usize>> {
        if i >= self.layout.item_count {
            return None;
        }
        let at = self.layout.index_offset + i * 8;
        // In bounds and overflow-free: validated at open (the index fits in
        // the file, offsets are monotonic after alignment and end before the
        // index).
        let off = <[U64]>::ref_from_bytes(&self.map[at..at + 16]).ok()?;
        let start = align_up(off[0].get(), ITEM_ALIGN)? as usize;
        let end = off[1].get() as usize;
        Some(start..end)
    }

    /// The bytes of item `i`, borrowed from the mapping, or `None` when
    /// `i >= len()`.
    #[inline]
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        self.span(i).map(|r| &self.map[r])
    }

    /// An iterator over every item's bytes, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        (0..self.len()).map(move |i| self.get(i).unwrap_or_default())
    }

    /// The whole mapping (header, data and index).
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.map
    }

    /// Size of the file in bytes.
    #[inline]
    pub fn nbytes(&self) -> u64 {
        self.map.len() as u64
    }

    /// Where the regions lie.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this process created the file (and so removes it).
    pub fn is_owner(&self) -> bool {
        self.owner_pid == Some(std::process::id())
    }

    /// Removes the file if this process owns it and it is still the file at
    /// [`Arena::path`] (same device and inode: a file someone renamed over
    /// the path is left alone); does nothing otherwise, and nothing the
    /// second time. The mapping stays valid: processes that map
    /// the arena keep reading it until they unmap it.
    ///
    /// In a child forked from the owner the inherited value is not the owner
    /// (the pid differs), so a child never removes its parent's arena.
    ///
    /// # Errors
    ///
    /// [`ArenaError::Io`] when the file exists but cannot be removed.
    pub fn remove_file(&self) -> Result<()> {
        if !self.is_owner() || self.removed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        // Only our own file: someone may have renamed another file over the
        // path since (a stale handle's close must not delete a newer arena
        // made at the same path). Compare device and inode of what sits at
        // the path with the file this value maps. (A file renamed over the
        // path between this check and the unlink is still removed: POSIX has
        // no unlink-if-same-inode; the window is a few microseconds.)
        let ours = rustix::fs::fstat(&self.file)
            .map_err(|e| ArenaError::io("stat", &self.path, e.into()))?;
        match rustix::fs::lstat(&self.path) {
            Ok(there) if (there.st_dev, there.st_ino) == (ours.st_dev, ours.st_ino) => {}
            Ok(_) | Err(rustix::io::Errno::NOENT) => return Ok(()),
            Err(e) => return Err(ArenaError::io("stat", &self.path, e.into())),
        }
        match std::fs::remove_file(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ArenaError::io("remove", &self.path, e)),
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // Nothing sensible to do with an error while dropping: the file will
        // be swept by the next arena created in its directory.
        let _ = self.remove_file();
    }
}

/// Reads one little-endian u64 of the index; `at` must be in bounds.
fn read_u64(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(b)
}

/// Checks that `bytes` is a complete, well-formed arena and returns where
/// its regions lie. Never panics, whatever the input.
///
/// # Errors
///
/// A corruption variant of [`ArenaError`] naming `path` and the first
/// problem found.
pub fn validate(path: &Path, bytes: &[u8]) -> Result<Layout> {
    let actual = bytes.len() as u64;
    let bad = |detail: String| ArenaError::BadLayout {
        path: path.to_path_buf(),
        detail,
    };
    let Some(header_bytes) = bytes.get(..HEADER_LEN as usize) else {
        return Err(ArenaError::Truncated {
            path: path.to_path_buf(),
            expected: HEADER_LEN,
            actual,
        });
    };
    let header =
        Header::ref_from_bytes(header_bytes).map_err(|_| bad("unreadable header".into()))?;
    if header.magic != MAGIC {
        return Err(ArenaError::BadMagic {
            path: path.to_path_buf(),
        });
    }
    if header.version.get() != FORMAT_VERSION {
        return Err(ArenaError::UnsupportedVersion {
            path: path.to_path_buf(),
            found: header.version.get(),
            supported: FORMAT_VERSION,
        });
    }
    let flags = header.flags.get();
    if flags & !KNOWN_FLAGS != 0 {
        return Err(ArenaError::UnknownFlags {
            path: path.to_path_buf(),
            flags,
            unknown: flags & !KNOWN_FLAGS,
            known: KNOWN_FLAGS,
        });
    }
    if !header.is_complete() {
        return Err(ArenaError::Incomplete {
            path: path.to_path_buf(),
        });
    }
    let file_len = header.file_len.get();
    if actual < file_len {
        return Err(ArenaError::Truncated {
            path: path.to_path_buf(),
            expected: file_len,
            actual,
        });
    }
    if actual > file_len {
        return Err(ArenaError::SizeMismatch {
            path: path.to_path_buf(),
            expected: file_len,
            actual,
        });
    }
    let data_offset = header.data_offset.get();
    if data_offset < HEADER_LEN || data_offset % ITEM_ALIGN != 0 || data_offset > file_len {
        return Err(bad(format!(
            "data offset {data_offset} must be a multiple of {ITEM_ALIGN}, at least \
             {HEADER_LEN} and within the file ({file_len} bytes)"
        )));
    }
    let index_offset = header.index_offset.get();
    if index_offset % INDEX_ALIGN != 0 || index_offset < data_offset {
        return Err(bad(format!(
            "index offset {index_offset} must be a multiple of {INDEX_ALIGN} and not before \
             the data ({data_offset})"
        )));
    }
    let count = header.item_count.get();
    let index_end = count
        .checked_add(1)
        .and_then(|n| n.checked_mul(8))
        .and_then(|len| len.checked_add(index_offset))
        .ok_or_else(|| bad(format!("item count {count} overflows the index size")))?;
    if index_end > file_len {
        return Err(bad(format!(
            "the index of {count} items ends at {index_end}, past the end of the file \
             ({file_len} bytes)"
        )));
    }
    // The file length fits in usize (it is the length of a slice), so do all
    // offsets up to it.
    let layout = Layout {
        item_count: count as usize,
        data_offset: data_offset as usize,
        index_offset: index_offset as usize,
    };
    validate_index(path, bytes, &layout)?;
    Ok(layout)
}

/// Checks the offsets of an index whose position and size are validated:
/// the first is the data offset, each item ends no earlier than it starts,
/// and none runs into the index.
fn validate_index(path: &Path, bytes: &[u8], layout: &Layout) -> Result<()> {
    let (item_count, index_at) = (layout.item_count, layout.index_offset);
    let (data_offset, index_offset) = (layout.data_offset as u64, index_at as u64);
    let bad_index = |item: usize, detail: String| ArenaError::BadIndex {
        path: path.to_path_buf(),
        item: item as u64,
        detail,
    };
    let first = read_u64(bytes, index_at);
    if first != data_offset {
        return Err(bad_index(
            0,
            format!("the first offset is {first}, not the data offset {data_offset}"),
        ));
    }
    let mut prev_end = first;
    for i in 0..item_count {
        let end = read_u64(bytes, index_at + (i + 1) * 8);
        let start = align_up(prev_end, ITEM_ALIGN)
            .ok_or_else(|| bad_index(i, format!("offset {prev_end} overflows when aligned")))?;
        if end < start {
            return Err(bad_index(
                i,
                format!("it ends at {end}, before it starts at {start}"),
            ));
        }
        if end > index_offset {
            return Err(bad_index(
                i,
                format!("it ends at {end}, inside the index (at {index_offset})"),
            ));
        }
        prev_end = end;
    }
    Ok(())
}
