//! Sweeping arenas whose every user is gone.
//!
//! The owner of an arena removes its file when it closes it or exits; an
//! owner killed with SIGKILL cannot. Every process that maps an arena holds
//! a shared `flock` on it, and the kernel drops those locks when a process
//! dies, so an arena file that nobody holds is an orphan. Creating an arena
//! sweeps the orphans of its directory.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::OFlags;
use rustix::io::Errno;

use super::format::MAGIC;
use super::lock::try_lock_exclusive;

/// Suffix of every arena file ferrofeed names.
pub const ARENA_SUFFIX: &str = ".arena";
/// Suffix of an arena being written.
pub(crate) const TMP_SUFFIX: &str = ".tmp";

/// What a directory entry is, judged by its name.
#[derive(Debug, PartialEq, Eq)]
enum Candidate {
    /// A complete arena: `*.arena`.
    Arena,
    /// An arena being written by process `pid`: `.NAME.arena.PID.RAND.tmp`.
    Partial { pid: i32 },
}

fn classify(name: &str) -> Option<Candidate> {
    if name.ends_with(ARENA_SUFFIX) && !name.starts_with('.') {
        return Some(Candidate::Arena);
    }
    let inner = name.strip_prefix('.')?.strip_suffix(TMP_SUFFIX)?;
    let mut parts = inner.rsplitn(3, '.');
    let _rand = parts.next()?;
    let pid = parts.next()?.parse().ok()?;
    let stem = parts.next()?;
    stem.ends_with(ARENA_SUFFIX)
        .then_some(Candidate::Partial { pid })
}

fn process_is_dead(pid: i32) -> bool {
    match rustix::process::Pid::from_raw(pid) {
        Some(p) => matches!(rustix::process::test_kill_process(p), Err(Errno::SRCH)),
        None => false,
    }
}

/// Removes `path` if it is an arena file (by its magic) that no process
/// holds. Returns whether it did.
fn sweep_one(path: &Path) -> bool {
    let Ok(file) = File::options()
        .read(true)
        .custom_flags((OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC).bits() as i32)
        .open(path)
    else {
        return false;
    };
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return false;
    }
    let mut magic = [0u8; 8];
    if file.read_exact_at(&mut magic, 0).is_err() || magic != MAGIC {
        return false;
    }
    // Holding the exclusive lock while removing: a reader that opened the
    // file meanwhile waits in `lock_shared`, then maps the (unlinked, still
    // valid) orphan, which is harmless.
    try_lock_exclusive(&file) && std::fs::remove_file(path).is_ok()
}

/// Removes, from `dir`, the arena files that no process holds any more:
/// complete arenas (`*.arena`) with nobody mapping them, and partial ones
/// whose writer has died. Files that are not ours (wrong name or magic) are
/// never touched. Returns the paths removed; errors (an unreadable
/// directory, a file that vanished) only mean fewer removals.
///
/// # Examples
///
/// ```
/// let dir = tempfile::tempdir()?;
/// std::fs::write(dir.path().join("notes.arena"), b"not an arena")?;
/// assert!(ferrofeed::arena::sweep_orphans(dir.path()).is_empty());
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn sweep_orphans(dir: impl AsRef<Path>) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir.as_ref()) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(kind) = name.to_str().and_then(classify) else {
            continue;
        };
        if let Candidate::Partial { pid } = kind {
            if !process_is_dead(pid) {
                continue;
            }
        }
        let path = entry.path();
        if sweep_one(&path) {
            removed.push(path);
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_names() {
        assert_eq!(classify("ferrofeed-1-2.arena"), Some(Candidate::Arena));
        assert_eq!(classify("x.arena"), Some(Candidate::Arena));
        assert_eq!(
            classify(".x.arena.1234.abcd.tmp"),
            Some(Candidate::Partial { pid: 1234 })
        );
        assert_eq!(classify(".x.arena"), None);
        assert_eq!(classify(".x.arena.notapid.ab.tmp"), None);
        assert_eq!(classify(".x.bin.12.ab.tmp"), None);
        assert_eq!(classify("x.txt"), None);
        assert_eq!(classify("ferrofeed-shared-x.claim"), None);
    }

    #[test]
    fn live_and_dead_pids() {
        assert!(!process_is_dead(std::process::id() as i32));
        // Linux pids never reach i32::MAX (pid_max is at most 2^22).
        assert!(process_is_dead(i32::MAX));
    }
}
