//! `flock` helpers: every process that maps an arena holds a shared lock on
//! it, so an arena that nobody holds any more can be told apart (an exclusive
//! non-blocking lock succeeds) and swept.

use std::fs::File;
use std::path::Path;

use rustix::fs::{flock, FlockOperation};
use rustix::io::Errno;

use super::error::{ArenaError, Result};

/// Takes a shared lock on `file`, waiting out a sweeper's momentary
/// exclusive lock.
///
/// File systems without `flock` support (some network file systems) are
/// accepted without a lock: sweeping cannot lock them either, so it leaves
/// them alone.
pub(crate) fn lock_shared(file: &File, path: &Path) -> Result<()> {
    loop {
        match flock(file, FlockOperation::LockShared) {
            Ok(()) | Err(Errno::NOLCK | Errno::OPNOTSUPP | Errno::NOSYS) => return Ok(()),
            Err(Errno::INTR) => {}
            Err(e) => return Err(ArenaError::io("lock", path, e.into())),
        }
    }
}

/// Tries to take an exclusive lock without waiting: `true` when no other
/// open file description holds any lock on the file.
pub(crate) fn try_lock_exclusive(file: &File) -> bool {
    loop {
        match flock(file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return true,
            Err(Errno::INTR) => {}
            Err(_) => return false,
        }
    }
}
