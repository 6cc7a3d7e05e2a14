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

use super::format::MAGIC;
use super::lock::try_lock_exclusive;
use crate::fs::process_is_dead;

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
    /// The claim of a node-shared arena's builder (`ferrofeed-shared-*.claim`,
    /// written by the Python `SharedList.shared`): it records that the build
    /// failed or that its builder died, for the ranks waiting on it.
    Claim,
}

/// Prefix and suffix of a shared arena builder's claim file.
const CLAIM_PREFIX: &str = "ferrofeed-shared-";
const CLAIM_SUFFIX: &str = ".claim";
/// A claim nobody holds is kept this long, for waiters to read.
const CLAIM_TTL: std::time::Duration = std::time::Duration::from_secs(60);

fn classify(name: &str) -> Option<Candidate> {
    if name.starts_with(CLAIM_PREFIX) && name.ends_with(CLAIM_SUFFIX) {
        return Some(Candidate::Claim);
    }
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

/// Opens a sweep candidate for reading, if it is a regular file (never
/// following a symlink, never blocking on a FIFO).
fn open_regular(path: &Path) -> Option<(File, std::fs::Metadata)> {
    let file = File::options()
        .read(true)
        .custom_flags((OFlags::NOFOLLOW | OFlags::NONBLOCK).bits().cast_signed())
        .open(path)
        .ok()?;
    let meta = file.metadata().ok().filter(std::fs::Metadata::is_file)?;
    Some((file, meta))
}

/// Removes `path`, a claim file, if nobody holds it and it is older than
/// [`CLAIM_TTL`]. Returns whether it did.
fn sweep_claim(path: &Path) -> bool {
    let Some((file, meta)) = open_regular(path) else {
        return false;
    };
    let old = meta
        .modified()
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age > CLAIM_TTL);
    old && try_lock_exclusive(&file) && std::fs::remove_file(path).is_ok()
}

/// Removes `path` if it is an arena file (by its magic) that no process
/// holds. Returns whether it did.
fn sweep_one(path: &Path) -> bool {
    let Some((file, _)) = open_regular(path) else {
        return false;
    };
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
/// complete arenas (`*.arena`) with nobody mapping them, partial ones whose
/// writer has died, and shared-arena claims nobody holds that are over a
/// minute old. Files that are not ours (wrong name or magic) are
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
        let path = entry.path();
        let swept = match kind {
            Candidate::Arena => sweep_one(&path),
            Candidate::Partial { pid } => process_is_dead(pid) && sweep_one(&path),
            Candidate::Claim => sweep_claim(&path),
        };
        if swept {
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
        assert_eq!(classify("ferrofeed-shared-x.claim"), Some(Candidate::Claim));
        assert_eq!(classify("other.claim"), None);
    }
}
