use std::path::Path;

use super::*;
use crate::pack::run::pack_samples;
use crate::pack::{OnError, Sample, Value};

fn text(i: u64, len: usize) -> Sample {
    Sample {
        key: None,
        path: None,
        fields: vec![
            ("txt".into(), Value::Text("x".repeat(len))),
            ("cls".into(), Value::Int(i64::try_from(i % 3).unwrap())),
        ],
    }
}

fn open(dir: &Path, options: PackOptions) -> Result<Packer, PackError> {
    let dest = Dest::open(dir.to_str().unwrap(), &Vec::new())?;
    Packer::open(dest, options, &json!({"test": 1}))
}

fn options(per_shard: Option<u64>, size: Option<u64>) -> PackOptions {
    PackOptions {
        samples_per_shard: per_shard,
        shard_size: size,
        ..PackOptions::default()
    }
}

/// The destination's files and their bytes, the index left out (it holds
/// modification times).
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap() != INDEX_NAME)
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap_or_default())
        })
        .collect();
    out.sort();
    out
}

fn index(dir: &Path) -> Index {
    Index::parse(&std::fs::read(dir.join(INDEX_NAME)).unwrap(), "index").unwrap()
}

#[test]
fn shards_are_cut_by_count_and_by_size() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = open(dir.path(), options(Some(4), None)).unwrap();
    pack_samples((0..10).map(|i| text(i, 10)).collect(), 0, &mut p, 2).unwrap();
    let s = p.finish().unwrap();
    assert_eq!((s.samples, s.shards, s.resumed), (10, 3, 0));
    let counts: Vec<u64> = index(dir.path()).shards.iter().map(|e| e.samples).collect();
    assert_eq!(counts, [4, 4, 2]);

    // Each sample is two members of 512 + 512 bytes: 2048 bytes; 5000 holds two.
    let dir = tempfile::tempdir().unwrap();
    let mut p = open(dir.path(), options(None, Some(5000))).unwrap();
    pack_samples((0..5).map(|i| text(i, 10)).collect(), 0, &mut p, 1).unwrap();
    p.finish().unwrap();
    let idx = index(dir.path());
    let counts: Vec<u64> = idx.shards.iter().map(|e| e.samples).collect();
    assert_eq!(counts, [2, 2, 1]);
    let e = &idx.shards[0];
    assert_eq!(e.offsets.as_deref(), Some(&[0, 2048][..]));
    assert_eq!((e.end, e.size), (Some(4096), 4096 + 1024));
    assert_eq!(
        (e.first_key.as_deref(), e.last_key.as_deref()),
        (Some("00000000"), Some("00000001"))
    );
    // A sample larger than the size gets a shard of its own.
    let dir = tempfile::tempdir().unwrap();
    let mut p = open(dir.path(), options(None, Some(5000))).unwrap();
    pack_samples(vec![text(0, 10), text(1, 9000), text(2, 10)], 0, &mut p, 1).unwrap();
    assert_eq!(p.finish().unwrap().shards, 3);
    assert!(
        !dir.path().join(RECORDS).exists(),
        "the records go once the index is there"
    );
}

#[test]
fn the_bytes_do_not_depend_on_the_workers() {
    let run = |workers| {
        let dir = tempfile::tempdir().unwrap();
        let mut p = open(dir.path(), options(Some(7), None)).unwrap();
        let samples = (0..50).map(|i| text(i, (i as usize * 37) % 700)).collect();
        pack_samples(samples, 0, &mut p, workers).unwrap();
        p.finish().unwrap();
        files(dir.path())
    };
    let one = run(1);
    assert_eq!(one.len(), 8);
    assert_eq!(one, run(4));
}

#[test]
fn a_pack_dropped_midway_resumes_without_rewriting_or_duplicating() {
    let all: Vec<Sample> = (0..11).map(|i| text(i, 100)).collect();
    let fresh = tempfile::tempdir().unwrap();
    let mut p = open(fresh.path(), options(Some(3), None)).unwrap();
    pack_samples(all.clone(), 0, &mut p, 2).unwrap();
    p.finish().unwrap();

    let dir = tempfile::tempdir().unwrap();
    let mut p = open(dir.path(), options(Some(3), None)).unwrap();
    pack_samples(all[..7].to_vec(), 0, &mut p, 2).unwrap();
    drop(p); // as if killed: shards 0 and 1 finished, shard 2 half written
    let before = std::fs::metadata(dir.path().join("shard-000001.tar")).unwrap();
    assert!(!dir.path().join("shard-000002.tar").exists());

    let mut p = open(dir.path(), options(Some(3), None)).unwrap();
    assert_eq!(p.resume_at(), 6);
    assert_eq!(p.progress().shards, 2);
    pack_samples(all[6..].to_vec(), 6, &mut p, 2).unwrap();
    let s = p.finish().unwrap();
    assert_eq!((s.samples, s.shards, s.resumed), (11, 4, 2));
    let after = std::fs::metadata(dir.path().join("shard-000001.tar")).unwrap();
    assert_eq!(before.modified().unwrap(), after.modified().unwrap());
    assert_eq!(files(dir.path()), files(fresh.path()));
    let keys: Vec<String> = index(dir.path())
        .shards
        .iter()
        .flat_map(|e| [e.first_key.clone().unwrap(), e.last_key.clone().unwrap()])
        .collect();
    assert_eq!(keys.first().map(String::as_str), Some("00000000"));
    assert_eq!(keys.last().map(String::as_str), Some("00000010"));

    // Run again once whole: nothing to do.
    let p = open(dir.path(), options(Some(3), None)).unwrap();
    assert!(p.complete().is_some());
    assert_eq!(p.finish().unwrap().resumed, 4);
}

#[test]
fn a_shard_changed_since_its_record_is_written_again() {
    let dir = tempfile::tempdir().unwrap();
    let all: Vec<Sample> = (0..6).map(|i| text(i, 10)).collect();
    let mut p = open(dir.path(), options(Some(2), None)).unwrap();
    pack_samples(all[..5].to_vec(), 0, &mut p, 1).unwrap();
    drop(p);
    std::fs::write(dir.path().join("shard-000001.tar"), b"damaged").unwrap();
    let mut p = open(dir.path(), options(Some(2), None)).unwrap();
    assert_eq!(p.resume_at(), 2, "shard 1 is no longer as recorded");
    pack_samples(all[2..].to_vec(), 2, &mut p, 1).unwrap();
    assert_eq!(p.finish().unwrap().samples, 6);
}

#[test]
fn bad_samples_stop_the_pack_or_are_skipped() {
    let bad = Sample {
        key: None,
        path: Some("broken.jpg".into()),
        fields: vec![("jpg".into(), Value::Bytes(b"not a jpeg".to_vec()))],
    };
    let mut input: Vec<Sample> = (0..5).map(|i| text(i, 10)).collect();
    input.insert(2, bad);

    let dir = tempfile::tempdir().unwrap();
    let mut p = open(dir.path(), options(Some(10), None)).unwrap();
    let e = pack_samples(input.clone(), 0, &mut p, 2).unwrap_err();
    assert!(e.to_string().starts_with("broken.jpg: "), "{e}");
    drop(p);
    let left: Vec<String> = files(dir.path()).into_iter().map(|(n, _)| n).collect();
    assert_eq!(left, [RECORDS], "no shard, whole or partial, is left");
    assert_eq!(
        std::fs::read_dir(dir.path().join(RECORDS)).unwrap().count(),
        2,
        "the marker and the lock"
    );

    // The same pack resumed with skip: the options that shape the bytes are the same.
    let skip = PackOptions {
        on_error: OnError::Skip,
        ..options(Some(10), None)
    };
    let mut p = open(dir.path(), skip).unwrap();
    pack_samples(input, 0, &mut p, 2).unwrap();
    let s = p.finish().unwrap();
    assert_eq!((s.samples, s.skipped.len()), (5, 1));
    assert_eq!(
        (s.skipped[0].position, s.skipped[0].name.as_str()),
        (2, "broken.jpg")
    );
}

#[test]
fn a_destination_of_something_else_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"mine").unwrap();
    let e = open(dir.path(), options(Some(2), None)).unwrap_err();
    assert!(matches!(e, PackError::Conflict { .. }), "{e}");
    assert!(e.to_string().contains("not empty"), "{e}");

    let dir = tempfile::tempdir().unwrap();
    let mut p = open(dir.path(), options(Some(2), None)).unwrap();
    pack_samples(vec![text(0, 1)], 0, &mut p, 1).unwrap();
    // Another pack while this one holds the folder.
    let e = open(dir.path(), options(Some(2), None)).unwrap_err();
    assert!(e.to_string().contains("another pack"), "{e}");
    drop(p);
    // Other options: another pack.
    let e = open(dir.path(), options(Some(3), None)).unwrap_err();
    assert!(e.to_string().contains("other input or options"), "{e}");

    let file = dir.path().join("a-file");
    std::fs::write(&file, b"").unwrap();
    let e = Dest::open(file.join("sub").to_str().unwrap(), &Vec::new()).unwrap_err();
    assert!(matches!(e, PackError::Dest { .. }), "{e}");
    assert!(open(
        dir.path(),
        PackOptions {
            workers: 0,
            ..PackOptions::default()
        }
    )
    .is_err());
}
