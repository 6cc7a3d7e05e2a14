//! Opens arbitrary bytes as an arena file and reads every item.
//!
//! `Arena::open` must refuse anything that is not a valid arena with an
//! error (never a panic, never a read outside the mapping), and every item
//! of an arena it accepts must lie inside the file.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use ferrofeed::arena::{validate, Arena};
use libfuzzer_sys::fuzz_target;

/// One file per fuzzing process, rewritten for every input (on tmpfs when
/// there is one: no disk traffic).
fn path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = ["/dev/shm", "/tmp"]
            .into_iter()
            .map(PathBuf::from)
            .find(|d| d.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        // Not `.arena`: the sweep of a real arena directory leaves it alone.
        dir.join(format!("ferrofeed-fuzz-{}.bin", std::process::id()))
    })
}

fuzz_target!(|data: &[u8]| {
    let in_memory = validate(std::path::Path::new("fuzz"), data);
    std::fs::write(path(), data).expect("write the input file");
    let opened = Arena::open(path());
    // The mapped file and the bytes are judged alike.
    assert_eq!(
        in_memory.is_ok(),
        opened.is_ok(),
        "{in_memory:?} vs {opened:?}"
    );
    let Ok(arena) = opened else { return };
    let bytes = arena.as_bytes();
    let mut total = 0usize;
    for i in 0..arena.len() {
        let span = arena.span(i).expect("an item below len() has a span");
        assert!(span.start <= span.end && span.end <= bytes.len());
        assert!(span.start % 64 == 0, "items start 64-byte aligned");
        let item = arena.get(i).expect("an item below len()");
        assert_eq!(item.len(), span.len());
        // Touch every byte: a read outside the mapping would fault here.
        total = total.wrapping_add(item.iter().map(|&b| usize::from(b)).sum::<usize>());
    }
    assert!(arena.get(arena.len()).is_none());
    assert_eq!(arena.iter().count(), arena.len());
    std::hint::black_box(total);
});
