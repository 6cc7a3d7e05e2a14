//! Unit and property tests of the arena: round trips, corrupted and hostile
//! files, ownership and sweeping.

use std::path::{Path, PathBuf};

use proptest::prelude::*;

use super::format::{align_up, HEADER_LEN, ITEM_ALIGN};
use super::*;

fn build(dir: &Path, items: &[Vec<u8>]) -> Arena {
    let mut w = ArenaWriter::create_in(dir).unwrap();
    for it in items {
        w.push(it).unwrap();
    }
    w.finish().unwrap()
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

/// Copies an arena's bytes to a new file, patched by `f`, and opens it.
fn open_patched(arena: &Arena, f: impl FnOnce(&mut Vec<u8>)) -> Result<Arena> {
    let mut bytes = arena.as_bytes().to_vec();
    f(&mut bytes);
    let path = arena.path().with_extension("patched");
    std::fs::write(&path, &bytes).unwrap();
    let r = Arena::open(&path);
    std::fs::remove_file(&path).unwrap();
    r
}

fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn sample() -> Vec<Vec<u8>> {
    vec![
        b"alpha".to_vec(),
        Vec::new(),
        vec![7u8; 1000],
        b"z".to_vec(),
    ]
}

#[test]
fn round_trip_items_are_aligned_and_exact() {
    let dir = tempfile::tempdir().unwrap();
    let items = sample();
    let arena = build(dir.path(), &items);
    assert_eq!(arena.len(), items.len());
    for (i, it) in items.iter().enumerate() {
        assert_eq!(arena.get(i).unwrap(), &it[..]);
        let span = arena.span(i).unwrap();
        assert_eq!(span.start as u64 % ITEM_ALIGN, 0, "item {i} is not aligned");
        // The mapping is page aligned, so the item's address is 64-aligned too.
        assert_eq!(arena.get(i).unwrap().as_ptr() as usize % 64, 0);
    }
    assert!(arena.get(items.len()).is_none());
    assert_eq!(arena.iter().count(), items.len());
    assert_eq!(
        arena.nbytes(),
        std::fs::metadata(arena.path()).unwrap().len()
    );
}

#[test]
fn empty_arena_is_valid() {
    let dir = tempfile::tempdir().unwrap();
    let arena = build(dir.path(), &[]);
    assert!(arena.is_empty());
    assert!(arena.get(0).is_none());
    let again = Arena::open(arena.path()).unwrap();
    assert_eq!(again.len(), 0);
}

#[test]
fn push_parts_aligns_each_part() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = ArenaWriter::create_in(dir.path()).unwrap();
    w.push(b"x").unwrap();
    w.push_parts(&[b"abc", b"defg", b"", b"h"]).unwrap();
    let a = w.finish().unwrap();
    let item = a.get(1).unwrap();
    assert_eq!(&item[..3], b"abc");
    assert!(item[3..64].iter().all(|&b| b == 0));
    assert_eq!(&item[64..68], b"defg");
    // The empty part starts at 128, so "h" does too.
    assert_eq!(&item[128..], b"h");
}

#[test]
fn large_items_bypass_the_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let big: Vec<u8> = (0..(9 << 20)).map(|i: u32| (i % 253) as u8).collect();
    let items = vec![b"a".to_vec(), big.clone(), b"b".to_vec(), big];
    let arena = build(dir.path(), &items);
    for (i, it) in items.iter().enumerate() {
        assert_eq!(arena.get(i).unwrap(), &it[..]);
    }
}

#[test]
fn owner_removes_file_on_drop_and_readers_keep_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let owned = build(dir.path(), &sample());
    assert!(owned.is_owner());
    let path = owned.path().to_path_buf();
    let reader = Arena::open(&path).unwrap();
    assert!(!reader.is_owner());
    reader.remove_file().unwrap(); // not the owner: a no-op
    assert!(path.exists());
    drop(owned);
    assert!(!path.exists());
    assert_eq!(reader.get(0).unwrap(), b"alpha");
    assert!(files_in(dir.path()).is_empty());
}

#[test]
fn owner_leaves_a_file_renamed_over_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let owned = build(dir.path(), &sample());
    let path = owned.path().to_path_buf();
    // Someone else's file takes the path (rename is atomic, as a second
    // arena's publication would be).
    let other = dir.path().join("other.tmp");
    std::fs::write(&other, b"not yours").unwrap();
    std::fs::rename(&other, &path).unwrap();
    owned.remove_file().unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"not yours");
    drop(owned);
    assert_eq!(std::fs::read(&path).unwrap(), b"not yours");
    // And its own file it does remove.
    std::fs::remove_file(&path).unwrap();
    let owned = build(dir.path(), &sample());
    let path = owned.path().to_path_buf();
    owned.remove_file().unwrap();
    assert!(!path.exists());
}

#[test]
fn remove_file_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let owned = build(dir.path(), &sample());
    owned.remove_file().unwrap();
    owned.remove_file().unwrap();
    assert!(files_in(dir.path()).is_empty());
    assert_eq!(owned.get(3).unwrap(), b"z");
}

#[test]
fn dropped_writer_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = ArenaWriter::create_in(dir.path()).unwrap();
    w.push(b"abc").unwrap();
    assert_eq!(files_in(dir.path()).len(), 1, "the temporary file exists");
    drop(w);
    assert!(files_in(dir.path()).is_empty());
}

#[test]
fn existing_target_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.arena");
    std::fs::write(&path, b"someone else's").unwrap();
    let err = ArenaWriter::create(&path).unwrap_err();
    assert!(matches!(err, ArenaError::AlreadyExists { .. }), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), b"someone else's");
}

#[test]
fn target_taken_while_writing_is_refused_at_finish() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.arena");
    let mut w = ArenaWriter::create(&path).unwrap();
    w.push(b"abc").unwrap();
    std::fs::write(&path, b"raced").unwrap();
    let err = w.finish().unwrap_err();
    assert!(matches!(err, ArenaError::AlreadyExists { .. }), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), b"raced");
    assert_eq!(files_in(dir.path()), vec![path]);
}

#[test]
fn missing_file_and_directory() {
    let dir = tempfile::tempdir().unwrap();
    let err = Arena::open(dir.path().join("nope.arena")).unwrap_err();
    assert!(matches!(err, ArenaError::NotFound { .. }), "{err}");
    let err = ArenaWriter::create(dir.path().join("no/such/dir/x.arena")).unwrap_err();
    assert!(matches!(err, ArenaError::NotFound { .. }), "{err}");
}

#[test]
fn corrupt_files_are_refused_with_distinct_errors() {
    let dir = tempfile::tempdir().unwrap();
    let a = build(dir.path(), &sample());
    let n = a.len();
    let idx = a.layout().index_offset;
    let len = a.as_bytes().len();

    let e = open_patched(&a, |b| b[0] = b'X').unwrap_err();
    assert!(matches!(e, ArenaError::BadMagic { .. }), "{e}");
    let e = open_patched(&a, |b| b[8] = 2).unwrap_err();
    assert!(
        matches!(e, ArenaError::UnsupportedVersion { found: 2, .. }),
        "{e}"
    );
    let e = open_patched(&a, |b| b[12] = 0).unwrap_err();
    assert!(matches!(e, ArenaError::Incomplete { .. }), "{e}");
    // Flag bits this version does not know, alone or with "complete".
    for flags in [3u32, 0x8000_0001, 0x100] {
        let e = open_patched(&a, |b| b[12..16].copy_from_slice(&flags.to_le_bytes())).unwrap_err();
        assert!(
            matches!(e, ArenaError::UnknownFlags { unknown, .. } if unknown == flags & !1),
            "{e}"
        );
        assert!(e.is_corrupt());
        assert!(e.to_string().contains("unknown flag bits"), "{e}");
    }
    let e = open_patched(&a, |b| b.truncate(len - 1)).unwrap_err();
    assert!(matches!(e, ArenaError::Truncated { .. }), "{e}");
    let e = open_patched(&a, |b| b.truncate(10)).unwrap_err();
    assert!(
        matches!(
            e,
            ArenaError::Truncated {
                expected: 64,
                actual: 10,
                ..
            }
        ),
        "{e}"
    );
    let e = open_patched(&a, Vec::clear).unwrap_err();
    assert!(matches!(e, ArenaError::Truncated { actual: 0, .. }), "{e}");
    let e = open_patched(&a, |b| b.push(0)).unwrap_err();
    assert!(matches!(e, ArenaError::SizeMismatch { .. }), "{e}");
    let e = open_patched(&a, |b| put_u64(b, 24, 96)).unwrap_err();
    assert!(matches!(e, ArenaError::BadLayout { .. }), "{e}");
    let e = open_patched(&a, |b| put_u64(b, 24, 0)).unwrap_err();
    assert!(matches!(e, ArenaError::BadLayout { .. }), "{e}");
    let e = open_patched(&a, |b| put_u64(b, 32, idx as u64 + 4)).unwrap_err();
    assert!(matches!(e, ArenaError::BadLayout { .. }), "{e}");
    let e = open_patched(&a, |b| put_u64(b, 16, u64::MAX)).unwrap_err();
    assert!(matches!(e, ArenaError::BadLayout { .. }), "{e}");
    let e = open_patched(&a, |b| put_u64(b, 16, n as u64 + 1)).unwrap_err();
    assert!(matches!(e, ArenaError::BadLayout { .. }), "{e}");
    let e = open_patched(&a, |b| put_u64(b, idx, 128)).unwrap_err();
    assert!(matches!(e, ArenaError::BadIndex { item: 0, .. }), "{e}");
    // Item 2 ends before item 1 starts.
    let e = open_patched(&a, |b| put_u64(b, idx + 24, 64)).unwrap_err();
    assert!(matches!(e, ArenaError::BadIndex { item: 2, .. }), "{e}");
    // The last item runs into the index.
    let e = open_patched(&a, |b| put_u64(b, idx + 8 * n, idx as u64 + 8)).unwrap_err();
    assert!(matches!(e, ArenaError::BadIndex { .. }), "{e}");
    let e = open_patched(&a, |b| put_u64(b, idx + 8 * n, u64::MAX)).unwrap_err();
    assert!(e.is_corrupt(), "{e}");
    // The pristine copy still opens.
    open_patched(&a, |_| {}).unwrap();
}

#[test]
fn a_live_writer_and_live_readers_are_never_swept() {
    let dir = tempfile::tempdir().unwrap();
    let a = build(dir.path(), &sample());
    let mut w = ArenaWriter::create_in(dir.path()).unwrap();
    w.push(b"in progress").unwrap();
    assert!(sweep_orphans(dir.path()).is_empty());
    assert_eq!(files_in(dir.path()).len(), 2);
    drop(w);
    drop(a);
}

#[test]
fn orphans_are_swept_and_foreign_files_kept() {
    let dir = tempfile::tempdir().unwrap();
    let a = build(dir.path(), &sample());
    // An orphan: a copy of a complete arena that nobody holds.
    let orphan = dir.path().join("orphan.arena");
    std::fs::write(&orphan, a.as_bytes()).unwrap();
    // A partial arena of a dead writer (pid i32::MAX cannot exist).
    let partial = dir.path().join(format!(".dead.arena.{}.ab.tmp", i32::MAX));
    std::fs::write(&partial, &a.as_bytes()[..64]).unwrap();
    // Files that are not ours.
    let foreign = dir.path().join("notes.arena");
    std::fs::write(&foreign, b"hello").unwrap();
    let other = dir.path().join("data.bin");
    std::fs::write(&other, a.as_bytes()).unwrap();
    let mut removed = sweep_orphans(dir.path());
    removed.sort();
    let mut expected = vec![orphan, partial];
    expected.sort();
    assert_eq!(removed, expected);
    assert!(foreign.exists() && other.exists() && a.path().exists());
}

#[test]
fn a_finished_arena_is_read_only_and_still_removed() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let owned = build(dir.path(), &sample());
    let path = owned.path().to_path_buf();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, SEALED_MODE);
    assert_eq!(SEALED_MODE, 0o444);
    // Root bypasses permission checks; anyone else, the owner included,
    // cannot open the sealed file for writing (so cannot truncate it).
    if !rustix::process::geteuid().is_root() {
        let err = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied);
    }
    // Readers open it read-only, as before.
    let reader = Arena::open(&path).unwrap();
    assert_eq!(reader.get(0).unwrap(), b"alpha");
    drop(reader);
    // Removal needs write permission on the directory, not the file.
    drop(owned);
    assert!(!path.exists());
    assert!(files_in(dir.path()).is_empty());
}

#[test]
fn a_named_pipe_or_a_folder_is_refused_at_open_not_waited_on() {
    use rustix::fs::{mknodat, FileType, Mode, CWD};
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pipe.arena");
    mknodat(CWD, &fifo, FileType::Fifo, Mode::from_raw_mode(0o600), 0).unwrap();
    // Nobody opens the other end: a blocking open would wait forever.
    for path in [fifo.as_path(), dir.path()] {
        let err = Arena::open(path).unwrap_err();
        assert!(
            matches!(&err, ArenaError::Io { op: "open", path: p, .. } if p == path),
            "{err:?}"
        );
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }
}

#[test]
fn a_read_only_orphan_is_swept() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let a = build(dir.path(), &sample());
    // fs::copy keeps the sealed mode: an orphan as a killed owner leaves it.
    let orphan = dir.path().join("orphan.arena");
    std::fs::copy(a.path(), &orphan).unwrap();
    let mode = std::fs::metadata(&orphan).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, SEALED_MODE);
    assert_eq!(sweep_orphans(dir.path()), vec![orphan]);
    assert!(a.path().exists());
}

#[test]
fn orphan_held_by_a_reader_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let a = build(dir.path(), &sample());
    let orphan = dir.path().join("orphan.arena");
    std::fs::write(&orphan, a.as_bytes()).unwrap();
    let reader = Arena::open(&orphan).unwrap();
    assert!(sweep_orphans(dir.path()).is_empty());
    drop(reader);
    assert_eq!(sweep_orphans(dir.path()), vec![orphan]);
}

#[test]
fn creating_a_writer_sweeps_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let a = build(dir.path(), &sample());
    let orphan = dir.path().join("orphan.arena");
    std::fs::write(&orphan, a.as_bytes()).unwrap();
    let _w = ArenaWriter::create_in(dir.path()).unwrap();
    assert!(!orphan.exists());
}

#[test]
fn no_space_is_a_clear_error_and_leaves_nothing() {
    // RLIMIT_FSIZE makes any file system "full" for this process. The
    // limit is per process, so the test runs in a child: this test binary,
    // re-executed by bash with `ulimit -f` and SIGXFSZ ignored (so that the
    // write fails with EFBIG instead of killing the process).
    if let Some(dir) = std::env::var_os("FERROFEED_FSIZE_CHILD") {
        let dir = PathBuf::from(dir);
        let mut w = ArenaWriter::create_in(&dir).unwrap();
        let item = vec![1u8; 100_000];
        let err = (0..100)
            .find_map(|_| w.push(&item).err())
            .expect("must fail");
        drop(w);
        let msg = err.to_string();
        assert!(matches!(err, ArenaError::NoSpace { .. }), "{msg}");
        assert!(
            msg.contains("path=") && msg.contains("bytes needed"),
            "{msg}"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg("trap '' XFSZ; ulimit -f 1024; exec \"$0\" \"$@\"")
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "arena::tests::no_space_is_a_clear_error_and_leaves_nothing",
            "--nocapture",
        ])
        .env("FERROFEED_FSIZE_CHILD", dir.path())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "{text}");
    assert!(files_in(dir.path()).is_empty());
}

#[test]
fn align_helper_matches_layout() {
    assert_eq!(align_up(HEADER_LEN, ITEM_ALIGN), Some(64));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn round_trip_arbitrary_items(items in prop::collection::vec(
        prop::collection::vec(any::<u8>(), 0..300), 0..64)) {
        let dir = tempfile::tempdir().unwrap();
        let arena = build(dir.path(), &items);
        prop_assert_eq!(arena.len(), items.len());
        for (i, it) in items.iter().enumerate() {
            prop_assert_eq!(arena.get(i).unwrap(), &it[..]);
        }
        let reopened = Arena::open(arena.path()).unwrap();
        prop_assert_eq!(reopened.iter().collect::<Vec<_>>(),
                        items.iter().map(Vec::as_slice).collect::<Vec<_>>());
    }

    #[test]
    fn validate_never_panics_on_mutations(
        items in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..100), 0..8),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<Option<prop::sample::Index>>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let arena = build(dir.path(), &items);
        let mut bytes = arena.as_bytes().to_vec();
        for (at, v) in flips {
            let i = at.index(bytes.len());
            bytes[i] = v;
        }
        if let Some(c) = cut {
            bytes.truncate(c.index(bytes.len()));
        }
        if let Ok(layout) = validate(Path::new("mutated"), &bytes) {
            // Whatever validated must be readable in bounds.
            prop_assert!(layout.index_offset + 8 * (layout.item_count + 1) <= bytes.len());
        }
    }

    #[test]
    fn validate_never_panics_on_garbage(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = validate(Path::new("garbage"), &bytes);
    }
}

/// Replays the committed fuzz inputs of the `arena` target (seeds and
/// regression inputs): opened as files, read item by item, judged as
/// the in-memory validation judges them.
#[test]
fn fuzz_corpus_replays_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("input.bin");
    let (mut n, mut valid) = (0, 0);
    for (path, data) in crate::fuzz_inputs::committed("arena") {
        std::fs::write(&file, &data).unwrap();
        let opened = Arena::open(&file);
        assert_eq!(
            validate(&path, &data).is_ok(),
            opened.is_ok(),
            "{}",
            path.display()
        );
        if let Ok(a) = opened {
            for i in 0..a.len() {
                let span = a.span(i).unwrap();
                assert!(span.end <= a.as_bytes().len() && span.start % 64 == 0);
                assert_eq!(a.get(i).unwrap().len(), span.len());
            }
            valid += 1;
        }
        n += 1;
    }
    assert!(n >= 3 && valid >= 3, "{n} corpus files, {valid} valid");
}
