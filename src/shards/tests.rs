use super::*;

/// 256 bytes, each its own position.
fn positions() -> Vec<u8> {
    (0..=255).collect()
}

#[test]
fn memory_reads_and_seeks_as_a_file_does() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shard");
    std::fs::write(&path, positions()).unwrap();
    for shard in [Shard::file(&path), Shard::memory(&path, positions())] {
        assert_eq!(shard.name, path);
        let mut r = shard.open().unwrap();
        assert_eq!((r.len(), r.is_empty()), (256, false));
        let mut buf = [0; 10];
        r.read_exact(&mut buf).unwrap();
        assert_eq!(buf, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(r.seek(SeekFrom::Current(100)).unwrap(), 110);
        r.read_exact(&mut buf).unwrap();
        assert_eq!(buf[0], 110);
        assert_eq!(r.seek(SeekFrom::End(-6)).unwrap(), 250);
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, [250, 251, 252, 253, 254, 255]);
        assert_eq!(r.read(&mut buf).unwrap(), 0);
        // Past the end: nothing to read, as in a file.
        assert_eq!(r.seek(SeekFrom::Start(1000)).unwrap(), 1000);
        assert_eq!(r.read(&mut buf).unwrap(), 0);
        let e = r.seek(SeekFrom::Current(-2000)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        assert_eq!(r.stream_position().unwrap(), 1000);
        assert_eq!(r.seek(SeekFrom::Start(3)).unwrap(), 3);
        r.read_exact(&mut buf[..1]).unwrap();
        assert_eq!(buf[0], 3);
    }
    let empty = Shard::memory("empty", Vec::new()).open().unwrap();
    assert!(empty.is_empty());
}

#[test]
fn bytes_not_fetched_are_an_error_not_a_panic() {
    let data = positions();
    let shard = Shard::tail("s3://bucket/key", data[200..].to_vec(), 256);
    assert!(matches!(
        shard.data,
        ShardData::Memory { offset: 200, len: 256, ref bytes } if bytes.len() == 56
    ));
    let mut r = shard.open().unwrap();
    assert_eq!(r.len(), 256);
    let e = r.read(&mut [0; 4]).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    assert!(not_fetched(&e));
    assert!(e.to_string().contains("byte 0 "), "{e}");
    assert!(e.to_string().contains("200..256"), "{e}");
    r.seek(SeekFrom::Start(199)).unwrap();
    assert!(not_fetched(&r.read_exact(&mut [0; 4]).unwrap_err()));
    r.seek(SeekFrom::Start(200)).unwrap();
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, data[200..]);
    // Bytes held but not fetched in the middle of a shard: the end of
    // what is held is not the end of the shard.
    let middle = Shard {
        name: "middle".into(),
        data: ShardData::Memory {
            bytes: Bytes::from(data[10..20].to_vec()),
            offset: 10,
            len: 256,
        },
    };
    let mut r = middle.open().unwrap();
    r.seek(SeekFrom::Start(15)).unwrap();
    let mut got = [0; 8];
    let e = r.read_exact(&mut got).unwrap_err();
    assert!(not_fetched(&e), "{e}");
    assert!(e.to_string().contains("byte 20 "), "{e}");
    let ShardReader::Memory(m) = r else {
        unreachable!("a memory shard")
    };
    assert_eq!(&m.slice(12, 8).unwrap().unwrap()[..], &data[12..20]);
    assert!(not_fetched(&m.slice(5, 8).unwrap_err()));
    assert!(not_fetched(&m.slice(12, 9).unwrap_err()));
    assert!(m
        .slice(250, 10)
        .unwrap_err()
        .to_string()
        .contains("byte 250"));
    assert!(m.slice(256, 1).unwrap().is_none());
    assert!(m.slice(0, 0).unwrap().unwrap().is_empty());
    // Bytes past the shard's length are not part of it.
    let long = Shard {
        name: "long".into(),
        data: ShardData::Memory {
            bytes: Bytes::from(data.clone()),
            offset: 0,
            len: 5,
        },
    };
    let mut all = Vec::new();
    long.open().unwrap().read_to_end(&mut all).unwrap();
    assert_eq!(all, [0, 1, 2, 3, 4]);
    // A tail longer than the shard is the whole shard.
    let whole = Shard::tail("t", data.clone(), 4);
    assert!(matches!(
        whole.data,
        ShardData::Memory {
            offset: 0,
            len: 256,
            ..
        }
    ));
}

#[test]
fn a_file_that_cannot_be_opened_is_io_naming_the_shard() {
    let dir = tempfile::tempdir().unwrap();
    let shard = Shard {
        name: "https://host/shard.tar".into(),
        data: ShardData::File(dir.path().to_path_buf()),
    };
    match shard.open() {
        Err(ShardError::Io { shard, .. }) => {
            assert_eq!(shard, Path::new("https://host/shard.tar"));
        }
        other => panic!("{other:?}"),
    }
}

/// Counts one sample from a file and two from memory.
struct Moody;

impl ShardFormat for Moody {
    fn count(&self, shard: &Shard) -> Result<ShardInfo, ShardError> {
        let samples = match shard.data {
            ShardData::File(_) => 1,
            ShardData::Memory { .. } => 2,
        };
        Ok(ShardInfo {
            samples,
            ..ShardInfo::default()
        })
    }

    fn read(
        &self,
        _shard: &Shard,
        lo: u64,
        hi: u64,
        each: &mut dyn FnMut(u64, Result<Sample, ShardError>),
    ) -> Result<(), ShardError> {
        for n in lo..hi {
            each(
                n,
                Ok(Sample {
                    key: n.to_string(),
                    fields: Vec::new(),
                }),
            );
        }
        Ok(())
    }

    fn layout(&self) -> SampleLayout {
        SampleLayout::Value
    }
}

#[test]
fn the_fuzz_check_finds_a_file_and_memory_that_disagree() {
    let dir = tempfile::tempdir().unwrap();
    let e = fuzz_formats(b"abc", dir.path(), &[("moody", &Moody)]).unwrap_err();
    assert!(e.contains("disagree"), "{e}");
    fuzz_formats(b"abc", dir.path(), &[("tar", &tar::TarFormat)]).unwrap();
}

/// The fuzz target's committed inputs (seeds and regressions) replay
/// without a panic or a disagreement.
#[test]
fn committed_fuzz_inputs_replay() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = crate::fuzz_inputs::committed("shards");
    assert!(inputs.len() >= 5, "seeds are committed: {}", inputs.len());
    for (path, data) in inputs {
        if let Err(e) = super::fuzz_every_format(&data, dir.path()) {
            panic!("{}: {e}", path.display());
        }
    }
}
