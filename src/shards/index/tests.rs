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
