use std::io::{Cursor, Write};

use proptest::prelude::*;

use super::super::ShardData;
use super::*;
use crate::shards::testing::{assert_not_fetched, format_test_reads};

/// A member to write: its name and content (`None`: a directory).
type Entry = (String, Option<Vec<u8>>);

fn file(name: &str, data: &[u8]) -> Entry {
    (name.to_owned(), Some(data.to_vec()))
}

fn dir(name: &str) -> Entry {
    (name.to_owned(), None)
}

/// A tar of `entries` (GNU headers: long names as GNU long-name entries).
fn tar_bytes(entries: &[Entry]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, data) in entries {
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o644);
        if let Some(data) = data {
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(data.len() as u64);
            builder.append_data(&mut header, name, &data[..]).unwrap();
        } else {
            header.set_entry_type(tar::EntryType::Directory);
            header.set_size(0);
            builder.append_data(&mut header, name, io::empty()).unwrap();
        }
    }
    builder.into_inner().unwrap()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

fn shard(bytes: &[u8]) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(bytes).unwrap();
    file.flush().unwrap();
    file
}

format_test_reads!(TarFormat);

/// All samples of a good shard, numbered.
fn read_all(path: &Path) -> Vec<(u64, Sample)> {
    let n = TarFormat.count(&Shard::file(path)).unwrap().samples;
    let (got, end) = read(path, 0, n);
    end.unwrap();
    got.into_iter().map(|(n, s)| (n, s.unwrap())).collect()
}

fn sample(key: &str, fields: &[(&str, &[u8])]) -> Sample {
    Sample {
        key: key.to_owned(),
        fields: fields
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::Bytes(v.to_vec())))
            .collect(),
    }
}

/// The samples counted before a shard's damage, and where it is.
fn damaged(shard: &Shard) -> (u64, String) {
    let info = TarFormat.count(shard).unwrap();
    let damage = info
        .damage
        .unwrap_or_else(|| panic!("no damage: {} samples", info.samples));
    (info.samples, damage.at)
}

fn corrupt_at(result: &Result<(), ShardError>) -> (&str, &str) {
    match result {
        Err(ShardError::Corrupt { at, message, .. }) => (at, message),
        other => panic!("not corrupt: {other:?}"),
    }
}

#[test]
fn groups_members_by_key() {
    let bytes = tar_bytes(&[
        dir("train/"),
        file("train/000001.jpg", b"jpeg one"),
        file("train/000001.cls", b"3"),
        file("train/000001.seg.png", b"png"),
        file("README", b"no extension: passed over"),
        file("train/000001.JSON", b"{}"),
        file("train/.hidden.jpg", b"dot file: passed over"),
        file("__index__", b"metadata"),
        file("__meta__/x.json", b"metadata"),
        file("train/000002.jpg", b""),
        file("train/a.b/000002.jpg", b"a dir with a dot"),
        file("000002.jpg", b"no dir"),
        file("000002.", b"empty ext"),
    ]);
    let path = shard(&bytes);
    let info = TarFormat.count(&Shard::file(path.path())).unwrap();
    assert_eq!(
        info,
        ShardInfo {
            samples: 4,
            first_key: Some("train/000001".into()),
            last_key: Some("000002".into()),
            damage: None,
        }
    );
    let all = read_all(path.path());
    assert_eq!(
        all,
        [
            (
                0,
                sample(
                    "train/000001",
                    &[
                        ("jpg", b"jpeg one"),
                        ("cls", b"3"),
                        ("seg.png", b"png"),
                        ("json", b"{}")
                    ]
                )
            ),
            (1, sample("train/000002", &[("jpg", b"")])),
            (
                2,
                sample("train/a.b/000002", &[("jpg", b"a dir with a dot")])
            ),
            (
                3,
                sample("000002", &[("jpg", b"no dir"), ("", b"empty ext")])
            ),
        ]
    );
    assert_eq!(all[0].1.get("cls"), Some(&Value::Bytes(b"3".to_vec())));
}

#[test]
fn empty_archive_has_no_samples() {
    let path = shard(&tar_bytes(&[]));
    assert_eq!(
        TarFormat.count(&Shard::file(path.path())).unwrap(),
        ShardInfo::default()
    );
    let path = shard(&tar_bytes(&[dir("d/"), file("README", b"x")]));
    assert_eq!(
        TarFormat.count(&Shard::file(path.path())).unwrap().samples,
        0
    );
    let (got, end) = read(path.path(), 0, 1);
    assert!(got.is_empty());
    assert!(matches!(
        end,
        Err(ShardError::Changed {
            expected: 1,
            found: 0,
            ..
        })
    ));
    // An empty file is not a tar.
    let path = shard(b"");
    assert_eq!(
        damaged(&Shard::file(path.path())),
        (0, "end of file".into())
    );
}

/// `samples` samples of `members` members each, member `m` of sample `s`
/// holding `size(s, m)` bytes.
fn layout(samples: usize, members: usize, size: impl Fn(usize, usize) -> usize) -> Vec<Entry> {
    let exts = ["jpg", "cls", "json", "txt", "seg.png"];
    let mut entries = Vec::new();
    for s in 0..samples {
        for (m, ext) in exts.iter().enumerate().take(members) {
            let data: Vec<u8> = (0..size(s, m))
                .map(|i| (i * 31 + s * 7 + m) as u8)
                .collect();
            entries.push(file(&format!("part/{s:06}.{ext}"), &data));
        }
    }
    entries
}

#[test]
fn ranges_are_slices_of_the_whole_plain_and_gzip() {
    let entries = layout(7, 3, |s, m| (s * 700 + m * 300) % 1500);
    let bytes = tar_bytes(&entries);
    let plain = shard(&bytes);
    let gz = shard(&gzip(&bytes));
    let all = read_all(plain.path());
    assert_eq!(all.len(), 7);
    assert_eq!(read_all(gz.path()), all);
    for path in [plain.path(), gz.path()] {
        let info = TarFormat.count(&Shard::file(path)).unwrap();
        assert_eq!(info.samples, 7);
        assert_eq!(info.first_key.as_deref(), Some("part/000000"));
        assert_eq!(info.last_key.as_deref(), Some("part/000006"));
        for lo in 0..=7 {
            for hi in lo..=7 {
                let (got, end) = read(path, lo, hi);
                end.unwrap();
                let got: Vec<_> = got.into_iter().map(|(n, s)| (n, s.unwrap())).collect();
                assert_eq!(got, all[lo as usize..hi as usize], "{lo}..{hi}");
            }
        }
        let (got, end) = read(path, 5, 9);
        assert_eq!(got.len(), 2);
        assert!(matches!(
            end,
            Err(ShardError::Changed { expected: 9, found: 7, ref shard }) if shard == path
        ));
    }
}

#[test]
fn zstd_compressed_tar_reads_too() {
    let bytes = tar_bytes(&layout(3, 2, |_, _| 100));
    let plain = shard(&bytes);
    let zst = shard(&zstd::encode_all(&bytes[..], 3).unwrap());
    assert_eq!(read_all(zst.path()), read_all(plain.path()));
}

#[test]
fn long_names_gnu_and_pax() {
    let long_dir = "d".repeat(150);
    let gnu_name = format!("{long_dir}/000001.jpg");
    let bytes = tar_bytes(&[
        file(&gnu_name, b"gnu"),
        file(&format!("{long_dir}/000001.cls"), b"1"),
    ]);
    let path = shard(&bytes);
    assert_eq!(
        read_all(path.path()),
        [(
            0,
            sample(
                &format!("{long_dir}/000001"),
                &[("jpg", b"gnu"), ("cls", b"1")]
            )
        )]
    );

    // A pax header with a `path` record before a ustar header holding a
    // cut name.
    let pax_name = format!("{}/000002.seg.png", "p".repeat(120));
    let mut builder = tar::Builder::new(Vec::new());
    let record_body = format!(" path={pax_name}\n");
    let mut record_len = record_body.len() + 1;
    while format!("{record_len}{record_body}").len() != record_len {
        record_len += 1;
    }
    let record = format!("{record_len}{record_body}");
    let mut pax = tar::Header::new_ustar();
    pax.set_path("PaxHeaders/x").unwrap();
    pax.set_entry_type(tar::EntryType::XHeader);
    pax.set_size(record.len() as u64);
    pax.set_cksum();
    builder.append(&pax, record.as_bytes()).unwrap();
    let mut header = tar::Header::new_ustar();
    header.set_path("cut-name").unwrap();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(3);
    header.set_cksum();
    builder.append(&header, &b"pax"[..]).unwrap();
    let bytes = builder.into_inner().unwrap();
    let path = shard(&bytes);
    assert_eq!(
        read_all(path.path()),
        [(
            0,
            sample(
                &format!("{}/000002", "p".repeat(120)),
                &[("seg.png", b"pax")]
            )
        )]
    );
}

#[test]
fn split_key_is_damage_to_count_and_a_sample_error_in_read() {
    let bytes = tar_bytes(&[
        file("a.jpg", b"a"),
        file("b.jpg", b"b"),
        file("a.cls", b"1"),
        file("c.jpg", b"c"),
    ]);
    let path = shard(&bytes);
    // Counting stops at the split: the samples before it are whole.
    let info = TarFormat.count(&Shard::file(path.path())).unwrap();
    assert_eq!(info.samples, 2);
    let damage = info.damage.unwrap();
    assert_eq!(damage.at, "member a.cls");
    assert!(damage.message.contains("consecutive"), "{damage:?}");
    assert!(damage
        .message
        .starts_with(&path.path().display().to_string()));
    let (got, end) = read(path.path(), 0, 4);
    end.unwrap();
    assert_eq!(got.len(), 4);
    assert_eq!(got[0].1.as_ref().unwrap(), &sample("a", &[("jpg", b"a")]));
    assert!(matches!(&got[2].1, Err(ShardError::Corrupt { at, .. }) if at == "member a.cls"));
    assert_eq!(got[3].0, 3);
    assert_eq!(got[3].1.as_ref().unwrap(), &sample("c", &[("jpg", b"c")]));
}

#[test]
fn duplicate_field_is_a_sample_error() {
    let bytes = tar_bytes(&[
        file("a.jpg", b"a"),
        file("b.jpg", b"b1"),
        file("b.cls", b"1"),
        file("b.JPG", b"b2"),
        file("b.txt", b"t"),
        file("c.jpg", b"c"),
    ]);
    let path = shard(&bytes);
    assert_eq!(
        TarFormat.count(&Shard::file(path.path())).unwrap().samples,
        3
    );
    let (got, end) = read(path.path(), 0, 3);
    end.unwrap();
    assert_eq!(got[0].0, 0);
    assert_eq!(got[0].1.as_ref().unwrap(), &sample("a", &[("jpg", b"a")]));
    match &got[1] {
        (1, Err(ShardError::Corrupt { at, message, .. })) => {
            assert_eq!(at, "member b.JPG");
            assert!(message.contains("\"jpg\""), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(got[2].0, 2);
    assert_eq!(got[2].1.as_ref().unwrap(), &sample("c", &[("jpg", b"c")]));
}

/// Where each member's header and data lie in an uncompressed tar.
struct Placed {
    name: String,
    header: u64,
    data: Range<u64>,
    /// Where the next header starts.
    next: u64,
}

fn placed(entries: &[Entry]) -> Vec<Placed> {
    let mut at = 0;
    entries
        .iter()
        .map(|(name, data)| {
            let size = data.as_ref().map_or(0, Vec::len) as u64;
            let p = Placed {
                name: name.clone(),
                header: at,
                data: at + 512..at + 512 + size,
                next: at + 512 + size.div_ceil(512) * 512,
            };
            at = p.next;
            p
        })
        .collect()
}

/// Every cut of a shard: at a header, after a member's padding, the tar
/// reads whole (as one without its end-of-archive marker); anywhere else,
/// the samples wholly before it are delivered, then an error naming the
/// member the file ends in, or after, and counting gives those samples
/// and that error as the damage.
#[test]
fn truncated_shards_name_the_member() {
    // Short names (no long-name entries), data sizes around the block.
    let entries = layout(4, 2, |s, m| [0, 1, 511, 512, 513, 700, 3, 1030][s * 2 + m]);
    let bytes = tar_bytes(&entries);
    let places = placed(&entries);
    let marker = places.last().unwrap().next;
    let full = read_all(shard(&bytes).path());
    assert_eq!(full.len(), 4);
    let mut checked = 0;
    for cut in 0..marker + 512 {
        let cut_bytes = &bytes[..cut as usize];
        if let Some(i) = (1..places.len())
            .map(|i| (i, places[i].header))
            .chain([(places.len(), marker)])
            .find_map(|(i, at)| (at == cut).then_some(i))
        {
            // Members 0..i whole, and nothing after: a tar without its
            // end-of-archive marker. Its last sample has the members
            // before the cut (1 of 2 when `i` is odd).
            for (kind, data) in [("plain", cut_bytes.to_vec()), ("gzip", gzip(cut_bytes))] {
                let path = shard(&data);
                let info = TarFormat.count(&Shard::file(path.path())).unwrap();
                assert_eq!(info.damage, None, "count {kind} cut {cut}");
                assert_eq!(info.samples, i.div_ceil(2) as u64, "count {kind} cut {cut}");
                let got = read_all(path.path());
                assert_eq!(got[..i / 2], full[..i / 2], "read {kind} cut {cut}");
                if i % 2 == 1 {
                    let (n, last) = &got[i / 2];
                    assert_eq!(*n, (i / 2) as u64);
                    assert_eq!(last.fields, full[i / 2].1.fields[..1]);
                }
                checked += 1;
            }
            continue;
        }
        // The error expected at this cut.
        let want_at = match places.iter().rposition(|p| p.header <= cut) {
            None => "end of file".to_owned(),
            Some(i) if cut < places[i].data.start => match i {
                0 => "end of file".to_owned(),
                _ => format!("end of file after member {}", places[i - 1].name),
            },
            Some(i) if cut < places[i].data.end => format!("member {}", places[i].name),
            Some(i) => format!("end of file after member {}", places[i].name),
        };
        // Samples delivered: those the first member of the next one of
        // which has its header whole before the cut.
        let delivered = (1..4).filter(|s| places[s * 2].data.start <= cut).count();
        for (kind, data) in [("plain", cut_bytes.to_vec()), ("gzip", gzip(cut_bytes))] {
            let path = shard(&data);
            let (samples, at) = damaged(&Shard::file(path.path()));
            assert_eq!(at, want_at, "count {kind} cut {cut}");
            assert_eq!(samples, delivered as u64, "count {kind} cut {cut}");
            if samples > 0 {
                // The samples before the damage read without meeting it.
                let (got, end) = read(path.path(), 0, samples);
                end.unwrap();
                let got: Vec<_> = got.into_iter().map(|(n, s)| (n, s.unwrap())).collect();
                assert_eq!(got, full[..delivered], "read {kind} cut {cut}");
            }
            for lo in [0, 1] {
                let (got, end) = read(path.path(), lo, 4);
                let (at, message) = corrupt_at(&end);
                assert_eq!(at, want_at, "read {kind} {lo}..4 cut {cut}: {message}");
                assert!(cut == 0 || message.contains("truncated"), "{message}");
                let got: Vec<_> = got.into_iter().map(|(n, s)| (n, s.unwrap())).collect();
                let lo = (lo as usize).min(delivered);
                assert_eq!(got, full[lo..delivered], "read {kind} cut {cut}");
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 2 * (marker + 512));
    // One zero block is enough of a marker (tar writes two).
    let path = shard(&bytes[..(marker + 512) as usize]);
    assert_eq!(read_all(path.path()), full);
}

#[test]
fn truncated_gzip_stream_is_corrupt() {
    let entries = layout(20, 2, |_, _| 5000);
    let bytes = tar_bytes(&entries);
    let gz = gzip(&bytes);
    let full = read_all(shard(&bytes).path());
    // (A cut in the gzip trailer, after the tar's end-of-archive marker,
    // loses nothing and is not looked for.)
    for cut in [10, gz.len() / 3, gz.len() / 2, gz.len() * 2 / 3] {
        let path = shard(&gz[..cut]);
        let (samples, _) = damaged(&Shard::file(path.path()));
        let (got, end) = read(path.path(), 0, 20);
        let (at, message) = corrupt_at(&end);
        assert!(
            at.starts_with("member part/") || at.starts_with("end of file"),
            "{at}"
        );
        assert!(message.contains("gzip stream"), "{message}");
        let got: Vec<_> = got.into_iter().map(|(n, s)| (n, s.unwrap())).collect();
        assert_eq!(got, full[..got.len()]);
        assert_eq!(samples, got.len() as u64, "cut {cut}");
    }
}

#[test]
fn garbage_header_is_corrupt() {
    let entries = layout(3, 1, |_, _| 10);
    let mut bytes = tar_bytes(&entries);
    let places = placed(&entries);
    bytes[places[1].header as usize + 20] ^= 0x55;
    let path = shard(&bytes);
    let (samples, at) = damaged(&Shard::file(path.path()));
    assert_eq!(
        (samples, at.as_str()),
        (0, "header after member part/000000.jpg")
    );
    let (got, end) = read(path.path(), 0, 3);
    assert_eq!(corrupt_at(&end).0, "header after member part/000000.jpg");
    assert!(got.is_empty());
}

/// A reader that counts the bytes read from it.
struct Counting<R> {
    inner: R,
    read: Rc<Cell<u64>>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.set(self.read.get() + n as u64);
        Ok(n)
    }
}

impl<R: Seek> Seek for Counting<R> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        self.inner.seek(to)
    }
}

#[test]
fn plain_shards_seek_over_unwanted_data() {
    let big = 1 << 20;
    let entries = layout(16, 2, |_, m| if m == 0 { big } else { 4 });
    let bytes = tar_bytes(&entries);
    let len = bytes.len() as u64;
    let run = |job: &mut Job<'_>| {
        let read = Rc::new(Cell::new(0));
        let reader = BufReader::with_capacity(
            FILE_BUFFER,
            Counting {
                inner: Cursor::new(&bytes),
                read: Rc::clone(&read),
            },
        );
        let walker = Walker::new(Path::new("mem.tar"), Codec::Plain, Some(len), 0);
        let found = walk_seekable(walker, reader, job).unwrap();
        (found, read.get())
    };
    let mut info = ShardInfo::default();
    let (found, read) = run(&mut Job::Count(&mut info));
    assert_eq!((found, info.samples), (16, 16));
    // Headers (and the buffer around each) only.
    assert!(read < 64 * FILE_BUFFER as u64, "count read {read} bytes");
    let mut got = Vec::new();
    let (found, read) = run(&mut Job::Read {
        range: 10..12,
        each: &mut |n, s| got.push((n, s.unwrap())),
    });
    assert_eq!(found, 12);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].1.key, "part/000010");
    let wanted = 2 * big as u64;
    assert!(
        read >= wanted && read < wanted + 64 * FILE_BUFFER as u64,
        "read {read} bytes"
    );
}

#[test]
fn a_shard_in_memory_reads_as_its_file_plain_gzip_and_zstd() {
    let entries = layout(9, 3, |s, m| (s * 900 + m * 257) % 2000);
    let bytes = tar_bytes(&entries);
    let zst = zstd::encode_all(&bytes[..], 3).unwrap();
    for data in [bytes.clone(), gzip(&bytes), zst] {
        let file = shard(&data);
        let memory = Shard::memory(file.path(), data.clone());
        let all = read_all(file.path());
        assert_eq!(all.len(), 9);
        let info = TarFormat.count(&memory).unwrap();
        assert_eq!(info, TarFormat.count(&Shard::file(file.path())).unwrap());
        assert_eq!(info.samples, 9);
        let (got, end) = read_shard(&memory, 0, 9);
        end.unwrap();
        let got: Vec<_> = got.into_iter().map(|(n, s)| (n, s.unwrap())).collect();
        assert_eq!(got, all);
        for (lo, hi) in [(0, 1), (3, 7), (8, 9), (2, 12), (9, 10)] {
            assert_eq!(
                outcome(&memory, lo, hi),
                outcome(&Shard::file(file.path()), lo, hi),
                "{lo}..{hi}"
            );
        }
    }
    // Sample errors (a split key, a repeated field) come the same way.
    let bytes = tar_bytes(&[
        file("a.jpg", b"a"),
        file("b.jpg", b"b"),
        file("b.JPG", b"B"),
        file("a.cls", b"1"),
        file("c.jpg", b"c"),
    ]);
    let path = shard(&bytes);
    let memory = Shard::memory(path.path(), bytes);
    let from_memory = outcome(&memory, 0, 4);
    assert!(from_memory.contains("comes back"), "{from_memory}");
    assert!(from_memory.contains("a second"), "{from_memory}");
    assert_eq!(from_memory, outcome(&Shard::file(path.path()), 0, 4));
}

#[test]
fn a_truncated_tar_in_memory_is_corrupt_as_its_file_is() {
    let entries = layout(4, 2, |s, m| [0, 1, 511, 512, 513, 700, 3, 1030][s * 2 + m]);
    let bytes = tar_bytes(&entries);
    let marker = placed(&entries).last().unwrap().next as usize;
    let mut checked = 0;
    for cut in (0..marker).step_by(61).chain([512, 1024, marker - 1]) {
        for data in [bytes[..cut].to_vec(), gzip(&bytes[..cut])] {
            let file = shard(&data);
            let memory = Shard::memory(file.path(), data);
            let info = TarFormat.count(&memory).unwrap();
            assert_eq!(info, TarFormat.count(&Shard::file(file.path())).unwrap());
            if let Some(d) = &info.damage {
                assert!(cut == 0 || d.message.contains("truncated"), "{d:?}");
            }
            for lo in [0, 2] {
                assert_eq!(
                    outcome(&memory, lo, 4),
                    outcome(&Shard::file(file.path()), lo, 4),
                    "cut {cut}"
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 100, "{checked}");
}

#[test]
fn a_tar_in_memory_without_its_start_is_an_io_error() {
    let bytes = tar_bytes(&layout(3, 2, |_, _| 700));
    let len = bytes.len() as u64;
    let name = Path::new("s3://bucket/shard.tar");
    let tail = Shard::tail(name, bytes[1024..].to_vec(), len);
    assert_not_fetched(TarFormat.count(&tail), name);
    let (got, end) = read_shard(&tail, 0, 3);
    assert!(got.is_empty());
    assert!(matches!(end, Err(ShardError::Io { .. })), "{end:?}");
    // Its start only: the members past it are not fetched, not cut.
    let head = Shard {
        name: name.to_path_buf(),
        data: ShardData::Memory {
            bytes: bytes::Bytes::from(bytes[..3700].to_vec()),
            offset: 0,
            len,
        },
    };
    for count in [true, false] {
        let end = if count {
            TarFormat.count(&head).map(|_| ())
        } else {
            let (got, end) = read_shard(&head, 0, 3);
            assert_eq!(got.len(), 1);
            end
        };
        match end {
            Err(ShardError::Io { source, .. }) => {
                assert!(source.to_string().contains("not fetched"), "{source}");
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn names_split_as_webdataset_does() {
    assert_eq!(split_name("a/b/000.x.y"), Some(("a/b/000", "x.y")));
    assert_eq!(split_name("a.b/c"), None);
    assert_eq!(split_name("a.b/c.d"), Some(("a.b/c", "d")));
    assert_eq!(split_name("a/.c.d"), None);
    assert_eq!(split_name("x."), Some(("x", "")));
    assert_eq!(split_name("dir/"), None);
    assert_eq!(split_name("./000.jpg"), Some(("./000", "jpg")));
    assert!(is_meta("__key__"));
    assert!(is_meta("__meta__/a.json"));
    assert!(is_meta("____"));
    assert!(!is_meta("__key__.json"));
    assert!(!is_meta("a/__key__"));
    assert!(!is_meta("__x"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Any layout: a range read is the slice of the whole read, plain
    /// and compressed alike.
    #[test]
    fn range_reads_are_slices(
        samples in proptest::collection::vec(
            (1usize..4, proptest::collection::vec(0usize..1100, 4), any::<bool>()),
            0..12,
        ),
        lo in 0u64..14,
        len in 0u64..14,
    ) {
        let exts = ["jpg", "cls", "json", "seg.png"];
        let mut entries = Vec::new();
        for (s, (members, sizes, with_dir)) in samples.iter().enumerate() {
            if *with_dir {
                entries.push(dir(&format!("d{s}/")));
            }
            for m in 0..*members {
                let data: Vec<u8> = (0..sizes[m]).map(|i| (i + s + m) as u8).collect();
                entries.push(file(&format!("d{s}/{s:04}.{}", exts[m]), &data));
            }
        }
        let bytes = tar_bytes(&entries);
        let n = samples.len() as u64;
        let plain = shard(&bytes);
        let gz = shard(&gzip(&bytes));
        let all = read_all(plain.path());
        prop_assert_eq!(all.len() as u64, n);
        prop_assert_eq!(&read_all(gz.path()), &all);
        let hi = lo + len;
        for path in [plain.path(), gz.path()] {
            let (got, end) = read(path, lo, hi);
            let got: Vec<_> = got.into_iter().map(|(n, s)| (n, s.unwrap())).collect();
            if hi <= n {
                prop_assert!(end.is_ok());
                prop_assert_eq!(&got[..], &all[lo as usize..hi as usize]);
            } else if lo < hi {
                let is_changed = matches!(end, Err(ShardError::Changed { .. }));
                prop_assert!(is_changed);
                prop_assert_eq!(&got[..], &all[(lo.min(n)) as usize..]);
            }
        }
    }
}

mod marked;
