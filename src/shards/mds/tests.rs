use std::io::Write;

use super::*;

/// A column: name, encoding, fixed size.
type Col = (&'static str, &'static str, Option<usize>);

/// An MDS shard of `samples` (each a column's bytes, in column order),
/// as `MDSWriter` lays it out.
fn shard_bytes(cols: &[Col], samples: &[Vec<Vec<u8>>]) -> Vec<u8> {
    let config = serde_json::json!({
        "column_names": cols.iter().map(|c| c.0).collect::<Vec<_>>(),
        "column_encodings": cols.iter().map(|c| c.1).collect::<Vec<_>>(),
        "column_sizes": cols.iter().map(|c| c.2).collect::<Vec<_>>(),
        "compression": null, "format": "mds", "hashes": [], "size_limit": null, "version": 2,
    })
    .to_string();
    let bodies: Vec<Vec<u8>> = samples
        .iter()
        .map(|columns| {
            let mut head = Vec::new();
            let mut body = Vec::new();
            for (col, data) in cols.iter().zip(columns) {
                match col.2 {
                    Some(n) => assert_eq!(n, data.len(), "fixed size of {}", col.0),
                    None => head.extend_from_slice(&(data.len() as u32).to_le_bytes()),
                }
                body.extend_from_slice(data);
            }
            [head, body].concat()
        })
        .collect();
    let n = samples.len() as u32;
    let start = 4 + 4 * (n + 1) + config.len() as u32;
    let mut out = n.to_le_bytes().to_vec();
    let mut at = start;
    out.extend_from_slice(&at.to_le_bytes());
    for b in &bodies {
        at += b.len() as u32;
        out.extend_from_slice(&at.to_le_bytes());
    }
    out.extend_from_slice(config.as_bytes());
    for b in &bodies {
        out.extend_from_slice(b);
    }
    out
}

fn file(bytes: &[u8]) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(bytes).unwrap();
    f
}

fn read(shard: &Shard, lo: u64, hi: u64) -> (Vec<Result<Sample, String>>, Result<(), String>) {
    let mut got = Vec::new();
    let end = MdsFormat.read(shard, lo, hi, &mut |_, s| {
        got.push(s.map_err(|e| e.to_string()));
    });
    (got, end.map_err(|e| e.to_string()))
}

const COLS: [Col; 9] = [
    ("b", "bytes", None),
    ("s", "str", None),
    ("i", "int", Some(8)),
    ("f", "float32", Some(4)),
    ("u", "uint64", Some(8)),
    ("j", "json", None),
    ("a", "ndarray", None),
    ("p", "pil", None),
    ("big", "str_int", None),
];

/// Sample `k`'s columns, as `MDSWriter` encodes them.
fn columns(k: usize) -> Vec<Vec<u8>> {
    let k8 = u8::try_from(k).unwrap();
    let rgb: Vec<u8> = (0..2 * 3 * 3).map(|v| (v * 7 + k) as u8).collect();
    let pil = [
        3u32.to_le_bytes().as_slice(),
        2u32.to_le_bytes().as_slice(),
        3u32.to_le_bytes().as_slice(),
        b"RGB",
        &rgb,
    ]
    .concat();
    // ndarray of int16, shape (2, k + 1): dtype 17, ndim 2 with u8 dims.
    let values: Vec<u8> = (0..2 * (i16::from(k8) + 1))
        .flat_map(|v| (-v).to_le_bytes())
        .collect();
    let array = [vec![17, 2 << 2, 2, (k + 1) as u8], values].concat();
    vec![
        vec![k as u8; k],
        format!("sample {k}").into_bytes(),
        (-i64::from(k8) - 1).to_le_bytes().to_vec(),
        (f32::from(k8) / 4.0).to_le_bytes().to_vec(),
        (u64::MAX - k as u64).to_le_bytes().to_vec(),
        format!("{{\"k\": {k}}}").into_bytes(),
        array,
        pil,
        format!("{}{k}", "9".repeat(25)).into_bytes(),
    ]
}

fn dataset(n: usize) -> Vec<u8> {
    shard_bytes(&COLS, &(0..n).map(columns).collect::<Vec<_>>())
}

#[test]
fn columns_decode_by_their_encoding() {
    let f = file(&dataset(3));
    let shard = Shard::file(f.path());
    assert_eq!(MdsFormat.count(&shard).unwrap().samples, 3);
    let (got, end) = read(&shard, 0, 3);
    end.unwrap();
    let s = got[2].as_ref().unwrap();
    assert_eq!(s.key, "sample 2");
    assert_eq!(s.get("b"), Some(&Value::Bytes(vec![2, 2])));
    assert_eq!(s.get("s"), Some(&Value::Str("sample 2".into())));
    assert_eq!(s.get("i"), Some(&Value::Int(-3)));
    assert_eq!(s.get("f"), Some(&Value::Float(0.5)));
    assert_eq!(s.get("u"), Some(&Value::UInt(u64::MAX - 2)));
    assert_eq!(s.get("j"), Some(&Value::Json(b"{\"k\": 2}".to_vec())));
    let Some(Value::Array(a)) = s.get("a") else {
        panic!("{:?}", s.get("a"))
    };
    assert_eq!((a.dtype, a.shape.as_slice()), ("int16", [2, 3].as_slice()));
    assert_eq!(&a.data[..4], &[0, 0, 0xff, 0xff]); // 0, -1
    let Some(Value::Array(p)) = s.get("p") else {
        panic!("{:?}", s.get("p"))
    };
    assert_eq!(
        (p.dtype, p.shape.as_slice()),
        ("uint8", [2, 3, 3].as_slice())
    );
    assert_eq!(p.data[1], 9);
    let big = format!("{}2", "9".repeat(25));
    assert_eq!(s.get("big"), Some(&Value::Json(big.into_bytes())));
}

#[test]
fn scalars_fixed_arrays_and_bilevel_images() {
    assert_eq!(Scalar::I8.value(&[0x80]), Value::Int(-128));
    assert_eq!(Scalar::U16.value(&[0xff, 0xff]), Value::Int(65535));
    assert_eq!(Scalar::I32.value(&(-5i32).to_le_bytes()), Value::Int(-5));
    assert_eq!(Scalar::U64.value(&7u64.to_le_bytes()), Value::Int(7));
    assert_eq!(Scalar::F16.value(&[0x00, 0x3c]), Value::Float(1.0));
    assert_eq!(
        Scalar::F64.value(&1.25f64.to_le_bytes()),
        Value::Float(1.25)
    );
    let fixed = Kind::parse("ndarray:float32:2,3").unwrap();
    let Value::Array(a) = fixed.decode(&[0u8; 24]).unwrap() else {
        panic!()
    };
    assert_eq!((a.dtype, a.shape), ("float32", vec![2, 3]));
    assert!(fixed.decode(&[0u8; 20]).unwrap_err().contains("24 bytes"));
    assert_eq!(Kind::parse("int").unwrap(), Kind::Scalar(Scalar::I64));
    assert!(Kind::parse("ndarray:complex64").is_err());
    assert!(Kind::parse("frobnicate")
        .unwrap_err()
        .contains("frobnicate"));
    // Mode "1": 10 x 2 pixels, rows padded to 2 bytes, first pixel in the high bit.
    let bits = bilevel(10, 2, &[0b1000_0001, 0b0100_0000, 0, 0b1000_0000]).unwrap();
    assert_eq!(bits.shape, vec![2, 10]);
    assert_eq!(&bits.data[..10], &[1, 0, 0, 0, 0, 0, 0, 1, 0, 1]);
    assert_eq!(&bits.data[10..], &[0, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
    assert!(bilevel(10, 2, &[0; 3]).is_err());
    assert!(pil(&[1, 0, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0, b'X', b'Y', b'Z'])
        .unwrap_err()
        .contains("XYZ"));
}

#[test]
fn compressed_shards_and_ranges_read_as_the_whole() {
    let plain = dataset(7);
    let gz = {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(&plain).unwrap();
        e.finish().unwrap()
    };
    let zst = zstd::encode_all(plain.as_slice(), 3).unwrap();
    let whole = read(&Shard::memory("p.mds", plain.clone()), 0, 7).0;
    for data in [plain, gz, zst] {
        for shard in [
            Shard::memory("s.mds", data.clone()),
            Shard::file(file(&data).path()),
        ] {
            assert_eq!(MdsFormat.count(&shard).unwrap().samples, 7);
            for (lo, hi) in [(0, 7), (2, 5), (6, 7), (3, 3)] {
                let (got, end) = read(&shard, lo, hi);
                end.unwrap();
                assert_eq!(got, whole[lo as usize..hi as usize], "{lo}..{hi}");
            }
            let (_, end) = read(&shard, 5, 9);
            assert!(end.unwrap_err().contains("has 7 samples, 9"));
        }
    }
    let bz = [b"BZh9".as_slice(), &[0; 20]].concat();
    let e = MdsFormat
        .count(&Shard::memory("s.mds.bz2", bz))
        .unwrap_err();
    assert!(e.to_string().contains("bzip2-compressed"), "{e}");
}

#[test]
fn a_bad_header_is_corrupt_at_header() {
    let good = dataset(3);
    let header_error = |bytes: Vec<u8>| {
        let e = MdsFormat
            .count(&Shard::memory("s.mds", bytes))
            .map(|i| i.samples)
            .unwrap_err();
        match e {
            ShardError::Corrupt { at, message, .. } => {
                assert_eq!(at, "header");
                message
            }
            other => panic!("{other:?}"),
        }
    };
    let mut huge = good.clone();
    huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(header_error(huge).contains("do not fit"));
    let mut backwards = good.clone();
    backwards[8..12].copy_from_slice(&0u32.to_le_bytes());
    assert!(header_error(backwards).contains("backwards"));
    let mut past = good.clone();
    let end = past.len() as u32 + 100;
    past[16..20].copy_from_slice(&end.to_le_bytes());
    assert!(header_error(past).contains("past the file"));
    let mut config = good.clone();
    config[20] = b'!';
    assert!(header_error(config).contains("not MDS's"));
    assert!(header_error(good[..3].to_vec()).contains("ends early"));
    // Compressed, the same header checks (the file's length is unknown).
    let zst = zstd::encode_all(&good[..30], 1).unwrap();
    assert!(header_error(zst).contains("ends early"));
}

#[test]
fn a_sample_that_does_not_fit_its_bytes_is_its_own_error() {
    let cols: [Col; 2] = [("s", "str", None), ("i", "int", Some(8))];
    let ok = vec![b"fine".to_vec(), 1i64.to_le_bytes().to_vec()];
    let bad_text = vec![vec![0xff, 0xfe], 2i64.to_le_bytes().to_vec()];
    let mut bytes = shard_bytes(&cols, &[ok.clone(), bad_text, ok]);
    // Sample 2's stored size of its str column (its first 4 bytes, where
    // offset 2 points), beyond its bytes.
    let s2 = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    bytes[s2..s2 + 4].copy_from_slice(&100u32.to_le_bytes());
    let (got, end) = read(&Shard::memory("s.mds", bytes), 0, 3);
    end.unwrap();
    assert!(got[0].is_ok());
    assert!(got[1]
        .as_ref()
        .unwrap_err()
        .contains("sample 1: column \"s\": not UTF-8"));
    assert!(
        got[2].as_ref().unwrap_err().contains("runs past"),
        "{:?}",
        got[2]
    );
}
