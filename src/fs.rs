//! Opening files that must be regular files, without ever blocking.
//!
//! A path given as an image or a shard can name a named pipe (FIFO), a
//! socket or a device; opening a FIFO with no writer blocks the opening
//! thread until one comes, forever for a loader. [`open_regular`] opens with
//! `O_NONBLOCK` and checks with `fstat` before any read, so such a path is
//! refused at once, with an error that says what it is.
//!
//! A temporary file whose name carries its writer's pid (an arena being
//! built, a shard being cached) is an orphan once `process_is_dead`.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

/// Bytes left where they are in an open file: `len` bytes at `offset` (a
/// tar member that the native image chain's decode threads read themselves,
/// rather than the one thread that reads a window of a shard).
#[derive(Debug, Clone)]
pub struct FileRange {
    file: Arc<File>,
    offset: u64,
    len: u64,
}

impl FileRange {
    /// `len` bytes of `file` from `offset`.
    pub fn new(file: Arc<File>, offset: u64, len: u64) -> Self {
        Self { file, offset, len }
    }

    /// Where the bytes start in the file.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// How many bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads the bytes (`pread`: the file's position is not used, so any
    /// number of threads read ranges of one file at once). Read into the
    /// buffer's spare capacity (rustix's `spare_capacity`), not zeroed first.
    ///
    /// # Errors
    ///
    /// The OS error of the read; `UnexpectedEof` when the file now ends
    /// before the range does (it was cut since the range was found).
    pub fn read(&self) -> std::io::Result<Vec<u8>> {
        use std::io::{Error, ErrorKind};

        let len = usize::try_from(self.len)
            .map_err(|_| Error::new(ErrorKind::OutOfMemory, "range too large"))?;
        let mut data = Vec::new();
        data.try_reserve_exact(len)?;
        while data.len() < len {
            let at = self.offset + data.len() as u64;
            match rustix::io::pread(&*self.file, rustix::buffer::spare_capacity(&mut data), at) {
                Ok(0) => {
                    return Err(Error::new(
                        ErrorKind::UnexpectedEof,
                        format!(
                            "the file ends {} bytes into the {len} at byte {}",
                            data.len(),
                            self.offset
                        ),
                    ))
                }
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        // The spare capacity may have been larger than asked for.
        data.truncate(len);
        Ok(data)
    }
}

/// The same bytes of the same open file.
impl PartialEq for FileRange {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.file, &other.file) && self.offset == other.offset && self.len == other.len
    }
}

/// Opens `path` for reading; it must be a regular file (or a symlink to
/// one). Returns the file and its size.
///
/// `O_NONBLOCK` has no effect on the reads of a regular file, so it is left
/// set. `O_NOCTTY` keeps a terminal device from becoming the process's
/// controlling one.
///
/// # Errors
///
/// The OS error of the open or the `fstat`; `EISDIR` for a directory; an
/// `InvalidInput` error naming the kind of file for anything else that is
/// not a regular file.
pub fn open_regular(path: &Path) -> std::io::Result<(File, u64)> {
    use rustix::fs::{FileType, Mode, OFlags};

    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let st = rustix::fs::fstat(&fd)?;
    let kind = FileType::from_raw_mode(st.st_mode);
    if kind != FileType::RegularFile {
        return Err(not_regular(kind));
    }
    Ok((File::from(fd), u64::try_from(st.st_size).unwrap_or(0)))
}

/// The error for a path that is not a regular file: `EISDIR` for a
/// directory (as reading one would give), else an `InvalidInput` error that
/// says what the file is.
fn not_regular(kind: rustix::fs::FileType) -> std::io::Error {
    use rustix::fs::FileType;
    let what = match kind {
        FileType::Directory => return rustix::io::Errno::ISDIR.into(),
        FileType::Fifo => "a named pipe (FIFO)",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::RegularFile | FileType::Symlink | FileType::Unknown => "a file of another kind",
    };
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("not a regular file: {what}"),
    )
}

/// Whether no process `pid` exists (on this machine, in this PID namespace).
pub(crate) fn process_is_dead(pid: i32) -> bool {
    match rustix::process::Pid::from_raw(pid) {
        Some(p) => matches!(
            rustix::process::test_kill_process(p),
            Err(rustix::io::Errno::SRCH)
        ),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_range_reads_its_bytes_and_says_when_the_file_was_cut() {
        use std::io::Write;

        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(b"0123456789").unwrap();
        let file = Arc::new(File::open(f.path()).unwrap());
        let range = FileRange::new(Arc::clone(&file), 3, 4);
        assert_eq!(range.read().unwrap(), b"3456");
        assert_eq!(
            (range.offset(), range.len(), range.is_empty()),
            (3, 4, false)
        );
        assert_eq!(range, range.clone());
        assert_ne!(range, FileRange::new(Arc::clone(&file), 3, 5));
        assert!(FileRange::new(Arc::clone(&file), 10, 0)
            .read()
            .unwrap()
            .is_empty());
        f.as_file().set_len(5).unwrap();
        let e = range.read().unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn a_fifo_and_a_directory_are_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
            0,
        )
        .unwrap();
        let e = open_regular(&fifo).unwrap_err();
        assert!(e.to_string().contains("named pipe"), "{e}");
        let e = open_regular(dir.path()).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc_eisdir()));
        let file = dir.path().join("f");
        std::fs::write(&file, b"abc").unwrap();
        assert_eq!(open_regular(&file).unwrap().1, 3);
    }

    #[test]
    fn live_and_dead_pids() {
        assert!(!process_is_dead(i32::try_from(std::process::id()).unwrap()));
        // Linux pids never reach i32::MAX (pid_max is at most 2^22).
        assert!(process_is_dead(i32::MAX));
    }

    fn libc_eisdir() -> i32 {
        rustix::io::Errno::ISDIR.raw_os_error()
    }
}
