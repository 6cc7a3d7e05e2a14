//! Reads from marks ([`Marks`]): the same samples as a read from the
//! shard's start, without walking the headers before the mark.

use std::fs::OpenOptions;
use std::sync::Arc;

use super::*;
use crate::shards::marks::STRIDE;

/// `n` samples of one to three members of varied sizes (some empty), with
/// a directory entry before some, a metadata member between others, and a
/// GNU long name every 50th: what a mark must point before.
fn varied(n: usize) -> Vec<Entry> {
    let exts = ["jpg", "cls", "json"];
    let mut entries = Vec::new();
    for s in 0..n {
        if s % 7 == 3 {
            entries.push(dir(&format!("d{s}/")));
        }
        if s % 11 == 5 {
            entries.push(file(&format!("__meta__/{s}.json"), b"{}"));
        }
        let key = if s % 50 == 49 {
            format!("{}/{s:06}", "l".repeat(120))
        } else {
            format!("part/{s:06}")
        };
        for (m, ext) in exts.iter().enumerate().take(1 + s % 3) {
            let data: Vec<u8> = (0..(s * 37 + m * 500) % 1300)
                .map(|i| (i + s + m) as u8)
                .collect();
            entries.push(file(&format!("{key}.{ext}"), &data));
        }
    }
    entries
}

fn read_marked(shard: &Shard, lo: u64, hi: u64, marks: &Marks) -> Vec<(u64, Sample)> {
    let mut got = Vec::new();
    TarFormat
        .read_whole(shard, &whole_read(lo, hi, marks, &[]), &mut |n, s| {
            got.push((n, s.unwrap()));
        })
        .unwrap();
    got
}

/// A shard of [`varied`] `n` samples: its bytes, its file and its samples.
fn varied_shard(n: usize) -> (Vec<u8>, tempfile::NamedTempFile, Vec<(u64, Sample)>) {
    let bytes = tar_bytes(&varied(n));
    let file = shard(&bytes);
    let all = read_all(file.path());
    (bytes, file, all)
}

/// A read of samples `lo..hi` of a whole shard, from `marks`, locating
/// `located`.
fn whole_read<'a>(lo: u64, hi: u64, marks: &'a Marks, located: &'a [String]) -> WholeRead<'a> {
    WholeRead {
        lo,
        hi,
        marks,
        located,
    }
}

/// A set of tar shards `paths`, local.
fn tar_set(paths: Vec<std::path::PathBuf>) -> crate::shards::ShardSet {
    crate::shards::ShardSet::new(Arc::new(TarFormat), paths, None, None).unwrap()
}

/// Pieces of a shard of `n` samples, as windows read them: some short, some
/// long, some starting on a mark, out of order.
fn pieces(n: u64) -> Vec<(u64, u64)> {
    let mut out = vec![
        (n - 3, n),
        (2 * STRIDE, 2 * STRIDE + 1),
        (STRIDE - 1, STRIDE + 1),
        (0, 5),
        (3 * STRIDE + 7, n),
        (STRIDE + 5, 2 * STRIDE + 60),
        (0, n),
    ];
    out.extend((0..n).step_by(97).map(|lo| (lo, (lo + 130).min(n))));
    out
}

#[test]
fn reads_from_marks_are_the_reads_from_the_start_file_and_memory() {
    let n = 3 * STRIDE as usize + 41;
    let (bytes, file, all) = varied_shard(n);
    assert_eq!(all.len(), n);
    for whole in [Shard::file(file.path()), Shard::memory("mem.tar", bytes)] {
        // Marks from counting.
        let counted = Marks::new();
        let info = TarFormat.count_marked(&whole, &counted).unwrap();
        assert_eq!(info, TarFormat.count(&whole).unwrap());
        assert_eq!(counted.len(), n.div_ceil(STRIDE as usize));
        // Marks found by the reads themselves, in any order.
        let learned = Marks::new();
        for (lo, hi) in pieces(n as u64) {
            let want = &all[lo as usize..hi as usize];
            assert_eq!(read_marked(&whole, lo, hi, &counted), want, "{lo}..{hi}");
            assert_eq!(read_marked(&whole, lo, hi, &learned), want, "{lo}..{hi}");
        }
        assert_eq!(learned.len(), counted.len());
    }
}

#[test]
fn a_read_from_a_mark_does_not_walk_the_headers_before_it() {
    let n = 3 * STRIDE as usize;
    let (_, file, all) = varied_shard(n);
    let marks = Marks::new();
    TarFormat
        .count_marked(&Shard::file(file.path()), &marks)
        .unwrap();
    // The first header spoilt, the file's length and time kept: what a read
    // from the start walks is now corrupt, what a read from a mark walks is
    // not.
    let modified = std::fs::metadata(file.path()).unwrap().modified().unwrap();
    let mut f = OpenOptions::new().write(true).open(file.path()).unwrap();
    f.write_all(&[0xAB; 512]).unwrap();
    f.set_modified(modified).unwrap();
    drop(f);
    let lo = 2 * STRIDE + 3;
    let (_, end) = read(file.path(), lo, lo + 10);
    assert_eq!(corrupt_at(&end).0, "first header");
    let got = read_marked(&Shard::file(file.path()), lo, lo + 10, &marks);
    assert_eq!(got, all[lo as usize..lo as usize + 10]);
}

#[test]
fn marks_of_another_version_of_the_shard_are_not_used() {
    let n = 2 * STRIDE as usize + 10;
    let file = shard(&tar_bytes(&varied(n)));
    let marks = Marks::new();
    TarFormat
        .count_marked(&Shard::file(file.path()), &marks)
        .unwrap();
    assert_eq!(marks.len(), 3);
    // Rewritten with other members: the marks would point into them.
    let other = layout(n, 2, |s, m| (s * 13 + m * 900) % 2000);
    std::fs::write(file.path(), tar_bytes(&other)).unwrap();
    let all = read_all(file.path());
    let lo = 2 * STRIDE + 1;
    let got = read_marked(&Shard::file(file.path()), lo, n as u64, &marks);
    assert_eq!(got, all[lo as usize..]);
}

#[test]
fn a_compressed_shard_keeps_no_marks_and_reads_from_its_start() {
    let n = 2 * STRIDE as usize + 10;
    let (bytes, _plain, all) = varied_shard(n);
    for packed in [gzip(&bytes), zstd::encode_all(&bytes[..], 3).unwrap()] {
        let file = shard(&packed);
        let marks = Marks::new();
        let info = TarFormat
            .count_marked(&Shard::file(file.path()), &marks)
            .unwrap();
        assert_eq!(info.samples, n as u64);
        let lo = 2 * STRIDE + 2;
        let got = read_marked(&Shard::file(file.path()), lo, n as u64, &marks);
        assert_eq!(got, all[lo as usize..]);
        assert!(marks.is_empty());
    }
}

#[test]
fn a_damaged_shard_read_from_a_mark_fails_where_a_read_from_its_start_does() {
    let n = 2 * STRIDE as usize + 10;
    let bytes = tar_bytes(&varied(n));
    // Cut inside the data of a member after the last mark.
    let cut = &bytes[..bytes.len() - 1500];
    let file = shard(cut);
    let whole = Shard::file(file.path());
    let marks = Marks::new();
    let info = TarFormat.count_marked(&whole, &marks).unwrap();
    let damage = info.damage.expect("truncated");
    let lo = 2 * STRIDE;
    let mut got = Vec::new();
    let read_to_end = whole_read(lo, info.samples + 1, &marks, &[]);
    let end = TarFormat.read_whole(&whole, &read_to_end, &mut |k, _| {
        got.push(k);
    });
    assert_eq!(corrupt_at(&end).0, damage.at);
    let (from_start, end) = read(file.path(), lo, info.samples + 1);
    assert_eq!(corrupt_at(&end).0, damage.at);
    assert_eq!(got, from_start.iter().map(|(k, _)| *k).collect::<Vec<_>>());
}

#[test]
fn a_shard_set_keeps_each_shards_marks_from_counting_and_from_reads() {
    use crate::plan::Piece;
    use crate::shards::lock_entry;

    let n = 2 * STRIDE as usize + 10;
    let file = shard(&tar_bytes(&varied(n)));
    let all = read_all(file.path());
    let paths = vec![file.path().to_path_buf(), file.path().to_path_buf()];
    let set = tar_set(paths);
    let counted = set.count(2);
    assert!(counted
        .iter()
        .all(|c| c.as_ref().unwrap().samples == n as u64));
    assert_eq!((set.marks(0), set.marks(1)), (3, 3));
    // Shard 1 read by windows only (as a worker process that did not count).
    let fresh = tar_set(vec![file.path().to_path_buf()]);
    for set in [&set, &fresh] {
        let lo = 2 * STRIDE + 1;
        let piece = Piece {
            shard: 0,
            lo,
            hi: n as u64,
        };
        let window = set.read(&[piece], &[1000]).unwrap();
        for (i, (_, want)) in all[lo as usize..].iter().enumerate() {
            let (_, entry) = window.entry(1000 + i as u64).unwrap();
            assert_eq!(lock_entry(entry).as_ref().unwrap(), want);
        }
    }
    assert_eq!(fresh.marks(0), 3, "learned by the read");
}

/// `sample` with its located values read from the file.
fn resolved(mut sample: Sample) -> Sample {
    for (_, v) in &mut sample.fields {
        if let Value::Located(at) = v {
            *v = Value::Bytes(at.read().unwrap());
        }
    }
    sample
}

#[test]
fn located_fields_are_left_in_a_plain_files_and_read_back_the_same() {
    let n = STRIDE as usize + 30;
    let (bytes, file, all) = varied_shard(n);
    let located = ["jpg".to_owned(), "json".to_owned()];
    let marks = Marks::new();
    for (lo, hi) in [(0, n as u64), (STRIDE + 3, n as u64), (5, 9)] {
        let mut got = Vec::new();
        let whole = whole_read(lo, hi, &marks, &located);
        TarFormat
            .read_whole(&Shard::file(file.path()), &whole, &mut |k, s| {
                got.push((k, s.unwrap()));
            })
            .unwrap();
        for (k, sample) in &got {
            for (field, v) in &sample.fields {
                let wanted = located.contains(field);
                assert_eq!(matches!(v, Value::Located(_)), wanted, "{k} {field}");
            }
        }
        let got: Vec<_> = got.into_iter().map(|(k, s)| (k, resolved(s))).collect();
        assert_eq!(got, all[lo as usize..hi as usize]);
    }
    // In memory (a remote shard fetched whole) and compressed, all is read.
    let gz = shard(&gzip(&bytes));
    for whole_shard in [Shard::memory("mem.tar", bytes), Shard::file(gz.path())] {
        let mut got = Vec::new();
        let fresh = Marks::new();
        let whole = whole_read(0, n as u64, &fresh, &located);
        TarFormat
            .read_whole(&whole_shard, &whole, &mut |k, s| {
                got.push((k, s.unwrap()));
            })
            .unwrap();
        assert_eq!(got, all);
    }
}

#[test]
fn a_member_cut_short_is_read_and_fails_as_before_when_located() {
    let n = 20;
    let bytes = tar_bytes(&layout(n, 2, |_, _| 3000));
    let file = shard(&bytes[..bytes.len() - 4000]);
    let located = ["jpg".to_owned()];
    let marks = Marks::new();
    let whole = whole_read(0, n as u64, &marks, &located);
    let mut located_ok = 0;
    let end = TarFormat.read_whole(&Shard::file(file.path()), &whole, &mut |_, s| {
        if let Ok(s) = s {
            located_ok += usize::from(matches!(s.get("jpg"), Some(Value::Located(_))));
        }
    });
    let (_, end_from_start) = read(file.path(), 0, n as u64);
    assert_eq!(corrupt_at(&end), corrupt_at(&end_from_start));
    assert!(located_ok > 10, "{located_ok}");
}

#[test]
fn a_shard_set_locates_only_in_long_pieces() {
    use crate::plan::Piece;
    use crate::shards::{lock_entry, LOCATE_MIN};

    let n = 2 * LOCATE_MIN as usize;
    let file = shard(&tar_bytes(&varied(n)));
    let all = read_all(file.path());
    let set = tar_set(vec![file.path().to_path_buf()]);
    let located = ["jpg".to_owned()];
    for (lo, hi, wanted) in [(0, LOCATE_MIN, true), (3, LOCATE_MIN + 2, false)] {
        let window = set
            .read_locating(&[Piece { shard: 0, lo, hi }], &[0], &located)
            .unwrap();
        for id in 0..hi - lo {
            let (_, entry) = window.entry(id).unwrap();
            let sample = lock_entry(entry).as_ref().unwrap().clone();
            assert_eq!(matches!(sample.get("jpg"), Some(Value::Located(_))), wanted);
            assert_eq!(resolved(sample), all[(lo + id) as usize].1);
        }
    }
}
