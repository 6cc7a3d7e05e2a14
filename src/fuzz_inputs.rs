//! The fuzz targets' committed inputs, for the unit tests that replay them.

use std::path::{Path, PathBuf};

/// The committed inputs of fuzz target `target`: its seed corpus
/// (`fuzz/corpus/<target>/seed-*`) and its regression inputs (every file of
/// `fuzz/regressions/<target>/`), with their bytes. Other files in the
/// corpus are a local fuzzing run's finds, which `make fuzz-replay` replays.
pub(crate) fn committed(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut inputs = Vec::new();
    for (dir, seeds_only) in [("corpus", true), ("regressions", false)] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
        paths.sort();
        for path in paths {
            let name = path.file_name().unwrap().to_string_lossy();
            if seeds_only && !name.starts_with("seed-") {
                continue;
            }
            let data = std::fs::read(&path).unwrap();
            inputs.push((path, data));
        }
    }
    inputs
}
