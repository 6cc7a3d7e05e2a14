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
