use super::*;
use crate::pack::testing::jpeg;

fn sample(fields: Vec<(&str, Value)>) -> Sample {
    Sample {
        key: None,
        path: None,
        fields: fields
            .into_iter()
            .map(|(n, v)| (n.to_string(), v))
            .collect(),
    }
}

#[test]
fn the_image_is_named_by_its_format_and_the_label_cls() {
    let s = sample(vec![
        ("image", Value::Bytes(jpeg())),
        ("label", Value::Text("7".into())),
        ("json", Value::Text("{}".into())),
    ]);
    let p = prepare(s, 12, None).unwrap();
    assert_eq!(p.key, "00000012");
    let names: Vec<&str> = p.fields.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["jpg", "cls", "json"]);
    assert_eq!((p.image, p.label, p.label()), (Some(0), Some(1), Some(7)));
    assert_eq!(
        p.fields[0].1,
        Value::Bytes(jpeg()),
        "the bytes are unchanged"
    );
}

#[test]
fn bad_samples_name_their_path_or_key() {
    let mut s = sample(vec![("jpg", Value::Bytes(b"text".to_vec()))]);
    s.path = Some("cats/1.jpg".into());
    let e = prepare(s, 0, None).unwrap_err();
    assert!(e.to_string().starts_with("cats/1.jpg: "), "{e}");
    assert!(matches!(e, PackError::BadSample { .. }));

    let mut s = sample(vec![("txt", Value::Text("x".into()))]);
    s.key = Some("a.b".into());
    assert!(prepare(s, 0, None).unwrap_err().to_string().contains("'.'"));
    for key in ["", "/abs", "a//b", "a/../b"] {
        let mut s = sample(vec![]);
        s.key = Some(key.into());
        assert!(prepare(s, 0, None).is_err(), "{key:?}");
    }
    for field in ["", "a/b", ".hidden", "__key__", "x."] {
        assert!(
            prepare(sample(vec![(field, Value::Int(1))]), 0, None).is_err(),
            "{field:?}"
        );
    }
    let e = prepare(sample(vec![("cls", Value::Text("cat".into()))]), 0, None).unwrap_err();
    assert!(e.to_string().contains("not an integer"), "{e}");
    let e = prepare(sample(vec![("jpg", Value::Int(3))]), 0, None).unwrap_err();
    assert!(e.to_string().contains("not bytes"), "{e}");
    // Every image-named field is checked, not only the first.
    let e = prepare(
        sample(vec![
            ("jpg", Value::Bytes(jpeg())),
            ("seg.png", Value::Bytes(b"broken".to_vec())),
        ]),
        0,
        None,
    )
    .unwrap_err();
    assert!(e.to_string().contains("seg.png"), "{e}");
    // A second label-like field stays a field of its own.
    let p = prepare(
        sample(vec![("cls", Value::Int(1)), ("label", Value::Int(2))]),
        0,
        None,
    )
    .unwrap();
    assert_eq!(p.fields[1].0, "label");
    // Two fields that end up with one name: the image is named by its format.
    let e = prepare(
        sample(vec![
            ("image", Value::Bytes(jpeg())),
            ("jpg", Value::Bytes(jpeg())),
        ]),
        0,
        None,
    )
    .unwrap_err();
    assert!(e.to_string().contains("two fields"), "{e}");
}

#[test]
fn reencoding_makes_a_jpeg_of_the_size_asked() {
    let s = sample(vec![("png", Value::Bytes(jpeg()))]);
    let r = Reencode {
        shorter: 12,
        quality: 80,
    };
    let p = prepare(s, 0, Some(&r)).unwrap();
    assert_eq!(p.fields[0].0, "jpg");
    let Value::Bytes(b) = &p.fields[0].1 else {
        panic!("bytes")
    };
    let info = crate::image::probe(b, "out").unwrap();
    assert_eq!((info.width, info.height), (16, 12));
}

#[test]
fn values_in_a_tar_member_read_as_python_writes_them() {
    assert_eq!(&*Value::Int(-3).tar_bytes(), b"-3");
    assert_eq!(&*Value::Float(1.0).tar_bytes(), b"1.0");
    assert_eq!(&*Value::Float(0.1).tar_bytes(), b"0.1");
    assert_eq!(&*Value::Float(f64::NAN).tar_bytes(), b"nan");
    assert_eq!(&*Value::Text("é".into()).tar_bytes(), "é".as_bytes());
    assert_eq!(default_key(5), "00000005");
}
