use super::*;

fn entry() -> ShardEntry {
    ShardEntry {
        name: "shard-000000.tar".into(),
        size: 4096,
        etag: Some("\"abc\"".into()),
        mtime_ns: None,
        samples: 2,
        first_key: Some("a".into()),
        last_key: Some("b".into()),
        offsets: Some(vec![0, 1536]),
        end: Some(3072),
    }
}

#[test]
fn an_index_reads_back_as_written() {
    let index = Index {
        shards: vec![entry()],
        pack: Some(json!({"fingerprint": "x"})),
    };
    let bytes = index.to_bytes();
    assert_eq!(Index::parse(&bytes, "i").unwrap(), index);
    assert_eq!(entry().sample_range(0), Some(0..1536));
    assert_eq!(entry().sample_range(1), Some(1536..3072));
    assert_eq!(entry().sample_range(2), None);
}

#[test]
fn bad_indexes_are_refused_saying_why() {
    let parse = |v: Value| Index::parse(v.to_string().as_bytes(), "idx").unwrap_err();
    assert!(Index::parse(b"nope", "idx")
        .unwrap_err()
        .contains("not JSON"));
    assert!(parse(json!({"format": "other"})).contains("not a ferrofeed index"));
    let e = parse(json!({"format": "ferrofeed-index", "version": 2, "shards": []}));
    assert!(e.contains("version"), "{e}");
    let with = |f: &dyn Fn(&mut Value)| {
        let mut e = entry().to_json();
        f(&mut e);
        parse(json!({"format": "ferrofeed-index", "version": 1, "shards": [e]}))
    };
    assert!(with(&|e| e["offsets"] = json!([0, 1000])).contains("multiple of 512"));
    assert!(with(&|e| e["offsets"] = json!([512, 0])).contains("increase"));
    assert!(with(&|e| e["offsets"] = json!([0])).contains("offsets for"));
    assert!(with(&|e| e["end"] = json!(8192)).contains("past the size"));
    assert!(with(&|e| e["name"] = json!("../x.tar")).contains("relative path"));
    assert!(with(&|e| e["size"] = json!(-1)).contains("size"));
    assert!(with(&|e| e["end"] = Value::Null).contains("without end"));
}

#[test]
fn fetches_cover_the_pieces_and_merge_what_touches() {
    let offsets = vec![
        Some((vec![0, 1024, 2048, 4096], 5120)),
        None,
        Some((vec![0, 512], 1024)),
    ];
    let pieces = [
        (0, 1, 3),
        (0, 3, 4),
        (1, 0, 5),
        (2, 0, 1),
        (0, 0, 0),
        (0, 2, 9),
    ];
    let (fetches, placed) = plan_fetches(&offsets, &pieces);
    assert_eq!(fetches, [(0, 1024..5120), (2, 0..512)]);
    assert_eq!(placed[0], Some((0, 0..3072)));
    assert_eq!(placed[1], Some((0, 3072..4096)));
    assert_eq!(placed[2], None, "a shard without offsets");
    assert_eq!(placed[3], Some((1, 0..512)));
    assert_eq!(placed[4], None, "an empty piece");
    assert_eq!(placed[5], None, "past the shard's samples");
    // Apart: two fetches of one shard.
    let (fetches, _) = plan_fetches(&offsets, &[(0, 0, 1), (0, 2, 3)]);
    assert_eq!(fetches, [(0, 0..1024), (0, 2048..4096)]);
}

/// A tar of `samples` samples, each of the given member names (a long key
/// for one, to have a GNU long-name header), and a hidden member between.
fn tar_bytes(samples: usize) -> (Vec<u8>, Vec<u64>) {
    let mut b = ::tar::Builder::new(Vec::new());
    let mut starts = Vec::new();
    for i in 0..samples {
        starts.push(b.get_ref().len() as u64);
        let key = if i == 1 {
            format!("{}/{i:04}", "d".repeat(120))
        } else {
            format!("{i:04}")
        };
        for (ext, len) in [("jpg", 700 + i), ("cls", 1)] {
            let mut h = ::tar::Header::new_gnu();
            h.set_size(len as u64);
            h.set_mode(0o644);
            b.append_data(&mut h, format!("{key}.{ext}"), &vec![b'x'; len][..])
                .unwrap();
        }
        if i == 0 {
            let mut h = ::tar::Header::new_gnu();
            h.set_size(3);
            b.append_data(&mut h, ".DS_Store", &b"abc"[..]).unwrap();
        }
    }
    (b.into_inner().unwrap(), starts)
}

#[test]
fn scanning_a_tar_finds_each_sample_start_and_what_a_slice_reads() {
    let (bytes, mut starts) = tar_bytes(3);
    // The hidden member after sample 0 belongs to its bytes.
    let hidden = 512 + 1024 + 512 + 512;
    starts[1] = hidden + 512 + 512;
    let s = scan_tar(&Shard::memory("s.tar", bytes.clone())).unwrap();
    assert_eq!((s.samples, s.first_key.as_deref()), (3, Some("0000")));
    let (offsets, end) = s.offsets.unwrap();
    assert_eq!(offsets, starts);
    assert_eq!(end, bytes.len() as u64 - 1024, "before the two zero blocks");
    // A slice of a sample's bytes reads as a shard of that sample alone.
    let slice = bytes[offsets[1] as usize..offsets[2] as usize].to_vec();
    let mut keys = Vec::new();
    TarFormat
        .read(&Shard::memory("slice", slice), 0, 1, &mut |_, s| {
            keys.push(s.unwrap().key);
        })
        .unwrap();
    assert_eq!(keys, [format!("{}/0001", "d".repeat(120))]);
}

#[test]
fn scanning_refuses_damaged_shards_and_gives_no_offsets_when_compressed() {
    let (bytes, _) = tar_bytes(2);
    let cut = Shard::memory("cut.tar", bytes[..bytes.len() / 2].to_vec());
    assert!(scan_tar(&cut).is_err());
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &bytes).unwrap();
    let s = scan_tar(&Shard::memory("s.tar.gz", gz.finish().unwrap())).unwrap();
    assert_eq!((s.samples, s.offsets), (2, None));
}
