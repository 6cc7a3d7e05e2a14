use super::*;
use crate::image::{decode, synth, ColorMode, Flip};

fn jpeg(w: usize, h: usize, seed: u64) -> Vec<u8> {
    synth::encode_jpeg(
        &synth::photo(w, h, seed),
        w,
        h,
        90,
        synth::Chroma::Subsampled,
    )
    .unwrap()
}

fn items(data: &[Vec<u8>]) -> Vec<BatchItem<'_>> {
    data.iter()
        .enumerate()
        .map(|(i, d)| {
            BatchItem::new(Source::Borrowed(d), format!("item {i}")).with_seed(i as u64 * 7)
        })
        .collect()
}

fn transform() -> Transform {
    Transform {
        size: Some((12, 10)),
        crop: Some(Crop::random_resized(0)),
        ..Transform::default()
    }
}

fn options(threads: usize, layout: Layout, on_error: OnError) -> BatchOptions {
    BatchOptions {
        layout,
        threads,
        on_error,
    }
}

#[test]
fn each_slot_is_the_single_decode_with_the_items_seed() {
    let data: Vec<Vec<u8>> = (0..7).map(|i| jpeg(40 + i, 30, i as u64)).collect();
    let t = transform();
    for threads in [1, 2, 5] {
        let mut out = vec![0u8; 7 * 12 * 10 * 3];
        let o = options(threads, Layout::default(), OnError::Stop);
        let report = decode_batch(&items(&data), &t, &o, &mut out).unwrap();
        assert_eq!(report.kept, 7);
        for (i, d) in data.iter().enumerate() {
            let mut ti = t;
            ti.crop = Some(Crop::random_resized(i as u64 * 7));
            let single = decode(d, "x", &ti).unwrap();
            assert_eq!(&out[i * 360..(i + 1) * 360], &single.data[..], "item {i}");
        }
    }
}

/// [`spawn_batch`] of owned copies of `data`'s items, waited for.
fn spawned(
    data: &[Vec<u8>],
    t: &Transform,
    o: &BatchOptions,
    lanes: &std::sync::Arc<crate::runtime::cpu::Lanes>,
) -> (Result<BatchReport, ImageError>, Vec<u8>, usize) {
    let items: Vec<BatchItem<'static>> = data
        .iter()
        .enumerate()
        .map(|(i, d)| {
            BatchItem::new(Source::Owned(d.clone()), format!("item {i}")).with_seed(i as u64 * 7)
        })
        .collect();
    let len = o.layout.slot_len(batch_shape(t).unwrap_or_default()) * data.len();
    let buffer = PooledBuffer::standalone(len.max(1), crate::staging::Pinning::Off).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    spawn_batch(items, t, o, buffer, lanes, move |done| {
        tx.send(done).unwrap();
    });
    let (outcome, buffer, items) = rx.recv_timeout(std::time::Duration::from_secs(30)).unwrap();
    (outcome, buffer[..len].to_vec(), items.len())
}

#[test]
fn a_spawned_batch_is_the_waited_for_batch_on_any_lanes() {
    let mut data: Vec<Vec<u8>> = (0..9).map(|i| jpeg(30 + i, 40, i as u64)).collect();
    let t = Transform {
        flip: Flip::Random { seed: 0 },
        ..transform()
    };
    for on_error in [OnError::Stop, OnError::Skip] {
        let mut want = vec![0u8; 9 * 360];
        let o = options(2, Layout::default(), on_error);
        let want_report = decode_batch(&items(&data), &t, &o, &mut want).unwrap();
        for threads in [1, 2, 16] {
            let lanes = std::sync::Arc::new(crate::runtime::cpu::Lanes::new(threads));
            let o = options(threads, Layout::default(), on_error);
            let (outcome, out, items) = spawned(&data, &t, &o, &lanes);
            let report = outcome.unwrap();
            assert_eq!(report.kept, want_report.kept);
            assert_eq!(out, want, "{threads} threads");
            assert_eq!(items, 9, "the items come back");
            let r = lanes.report();
            assert_eq!((r.calls, r.in_flight), (1, 0));
        }
    }
    // Failures: the lowest under Stop; left out, the rest moved up, under Skip.
    data[2] = b"junk".to_vec();
    data[6] = Vec::new();
    let lanes = std::sync::Arc::new(crate::runtime::cpu::Lanes::new(3));
    let stop = options(3, Layout::default(), OnError::Stop);
    let (outcome, _, _) = spawned(&data, &t, &stop, &lanes);
    assert!(
        matches!(outcome, Err(ImageError::UnknownFormat { ref name, .. }) if name == "item 2"),
        "{outcome:?}"
    );
    let skip = options(3, Layout::default(), OnError::Skip);
    let mut want = vec![0u8; 9 * 360];
    let want_report = decode_batch(&items(&data), &t, &skip, &mut want).unwrap();
    let (outcome, out, _) = spawned(&data, &t, &skip, &lanes);
    let report = outcome.unwrap();
    assert_eq!(report.kept, 7);
    let failed: Vec<usize> = report.failures.iter().map(|(i, _)| *i).collect();
    assert_eq!(failed, [2, 6]);
    assert_eq!(want_report.kept, 7);
    assert_eq!(&out[..7 * 360], &want[..7 * 360]);
    // Nothing to decode, or no fixed shape: handed over at once.
    let (outcome, _, items) = spawned(&[], &t, &skip, &lanes);
    assert_eq!((outcome.unwrap().kept, items), (0, 0));
    let (outcome, _, items) = spawned(&data, &Transform::default(), &skip, &lanes);
    assert!(matches!(outcome, Err(ImageError::InvalidTransform { .. })));
    assert_eq!(items, 9);
}

#[test]
fn a_random_flip_draws_from_each_items_seed() {
    let data: Vec<Vec<u8>> = (0..16).map(|i| jpeg(40, 30 + i, i as u64)).collect();
    let t = Transform {
        flip: Flip::Random { seed: 0 },
        ..transform()
    };
    let mut out = vec![0u8; 16 * 360];
    decode_batch(
        &items(&data),
        &t,
        &options(3, Layout::default(), OnError::Stop),
        &mut out,
    )
    .unwrap();
    let mut mirrored = 0;
    for (i, d) in data.iter().enumerate() {
        let seed = i as u64 * 7;
        let single = decode(d, "x", &t.with_seed(seed)).unwrap();
        assert_eq!(&out[i * 360..(i + 1) * 360], &single.data[..], "item {i}");
        mirrored += usize::from(Flip::Random { seed }.applies());
    }
    assert!(
        (1..16).contains(&mirrored),
        "both outcomes occur: {mirrored} of 16"
    );
}

#[test]
fn layouts_convert_the_same_pixels() {
    let data: Vec<Vec<u8>> = (0..3).map(|i| jpeg(20, 20, i)).collect();
    let t = Transform {
        size: Some((4, 5)),
        ..Transform::default()
    };
    let mut hwc = vec![0u8; 3 * 60];
    decode_batch(&items(&data), &t, &BatchOptions::default(), &mut hwc).unwrap();
    let norm = Layout {
        chw: true,
        float: true,
        normalize: Some(([0.5, 0.5, 0.5], [0.25, 0.5, 1.0])),
    };
    let mut chw = vec![0u8; 3 * 60 * 4];
    let o = options(2, norm, OnError::Stop);
    decode_batch(&items(&data), &t, &o, &mut chw).unwrap();
    let f32_at = |k: usize| f32::from_ne_bytes(chw[k * 4..k * 4 + 4].try_into().unwrap());
    for n in 0..3 {
        for y in 0..4 {
            for x in 0..5 {
                for ch in 0..3 {
                    let v = f32::from(hwc[n * 60 + (y * 5 + x) * 3 + ch]) / 255.0;
                    let want = (v - 0.5) / [0.25, 0.5, 1.0][ch];
                    let got = f32_at(n * 60 + (ch * 4 + y) * 5 + x);
                    assert!((got - want).abs() < 1e-6);
                }
            }
        }
    }
    assert_eq!(norm.shape(3, (4, 5, 3)), [3, 3, 4, 5]);
    assert_eq!(Layout::default().shape(3, (4, 5, 3)), [3, 4, 5, 3]);
}

#[test]
fn stop_returns_the_lowest_failing_item() {
    let mut data: Vec<Vec<u8>> = (0..6).map(|i| jpeg(20, 20, i)).collect();
    data[4] = b"not an image".to_vec();
    data[2] = Vec::new();
    let mut out = vec![0u8; 6 * 360];
    for threads in [1, 3] {
        let o = options(threads, Layout::default(), OnError::Stop);
        let err = decode_batch(&items(&data), &transform(), &o, &mut out).unwrap_err();
        assert!(
            matches!(err, ImageError::Empty { ref name } if name == "item 2"),
            "{err}"
        );
    }
}

#[test]
fn skip_reports_failures_and_closes_the_gaps() {
    let mut data: Vec<Vec<u8>> = (0..6).map(|i| jpeg(20 + i, 20, i as u64)).collect();
    data[0] = b"junk".to_vec();
    data[3] = jpeg(20, 20, 9)[..100].to_vec();
    let t = transform();
    let o = options(2, Layout::default(), OnError::Skip);
    let mut out = vec![0u8; 6 * 360];
    let report = decode_batch(&items(&data), &t, &o, &mut out).unwrap();
    assert_eq!(report.kept, 4);
    let failed: Vec<usize> = report.failures.iter().map(|(i, _)| *i).collect();
    assert_eq!(failed, [0, 3]);
    for (slot, i) in [1usize, 2, 4, 5].into_iter().enumerate() {
        let mut ti = t;
        ti.crop = Some(Crop::random_resized(i as u64 * 7));
        let single = decode(&data[i], "x", &ti).unwrap();
        assert_eq!(&out[slot * 360..(slot + 1) * 360], &single.data[..]);
    }
}

#[test]
fn files_are_read_and_missing_ones_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.jpg");
    std::fs::write(&path, jpeg(20, 20, 1)).unwrap();
    let missing = dir.path().join("missing.jpg");
    let batch = vec![
        BatchItem::new(Source::Path(path.clone()), path.display().to_string()),
        BatchItem::new(Source::Path(missing.clone()), missing.display().to_string()),
    ];
    let t = Transform {
        size: Some((8, 8)),
        mode: ColorMode::Gray,
        ..Transform::default()
    };
    let mut out = vec![0u8; 2 * 64];
    let err = decode_batch(&batch, &t, &BatchOptions::default(), &mut out).unwrap_err();
    assert!(matches!(err, ImageError::Io { ref name, .. } if name.ends_with("missing.jpg")));
    let skip = options(2, Layout::default(), OnError::Skip);
    let report = decode_batch(&batch, &t, &skip, &mut out).unwrap();
    assert_eq!(report.kept, 1);
    assert_eq!(
        &out[..64],
        &decode(&read_file(&path).unwrap(), "a", &t).unwrap().data[..]
    );
    assert!(matches!(read_file(&missing), Err(ImageError::Io { .. })));
}

#[test]
fn bad_shapes_and_short_buffers_are_errors() {
    let data = vec![jpeg(20, 20, 0)];
    let mut out = vec![0u8; 10];
    let no_size = Transform::default();
    assert!(matches!(
        decode_batch(&items(&data), &no_size, &BatchOptions::default(), &mut out),
        Err(ImageError::InvalidTransform { .. })
    ));
    assert!(matches!(
        decode_batch(
            &items(&data),
            &transform(),
            &BatchOptions::default(),
            &mut out
        ),
        Err(ImageError::InvalidTransform { .. })
    ));
    let center = Transform {
        crop: Some(Crop::Center {
            height: 3,
            width: 2,
        }),
        ..Transform::default()
    };
    assert_eq!(batch_shape(&center), Some((3, 2, 3)));
    let report = decode_batch(&[], &transform(), &BatchOptions::default(), &mut []).unwrap();
    assert_eq!(report.kept, 0);
}

fn mkfifo(path: &Path) {
    use rustix::fs::{mknodat, FileType, Mode, CWD};
    mknodat(CWD, path, FileType::Fifo, Mode::from_raw_mode(0o600), 0).unwrap();
}

#[test]
fn a_named_pipe_is_refused_at_once_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pipe.jpg");
    mkfifo(&fifo);
    // Nobody ever opens the other end: a blocking open would wait forever.
    let err = read_file(&fifo).unwrap_err();
    let ImageError::Io { name, source } = &err else {
        panic!("not an Io error: {err:?}");
    };
    assert_eq!(name, &fifo.display().to_string());
    assert_eq!(source.kind(), std::io::ErrorKind::InvalidInput);
    let msg = err.to_string();
    assert!(msg.starts_with(&*fifo.display().to_string()), "{msg}");
    assert!(
        msg.contains("not a regular file: a named pipe (FIFO)"),
        "{msg}"
    );
    // A symlink to it is refused the same way.
    let link = dir.path().join("link.jpg");
    std::os::unix::fs::symlink(&fifo, &link).unwrap();
    assert!(read_file(&link)
        .unwrap_err()
        .to_string()
        .contains("named pipe"));
}

#[test]
fn a_named_pipe_in_a_batch_is_skipped_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pipe.jpg");
    mkfifo(&fifo);
    let good = dir.path().join("good.jpg");
    std::fs::write(&good, jpeg(40, 30, 1)).unwrap();
    let batch = [
        BatchItem::new(Source::Path(good.clone()), "good".into()),
        BatchItem::new(Source::Path(fifo), "pipe".into()),
        BatchItem::new(Source::Path(good), "good again".into()),
    ];
    let t = transform();
    let mut out = vec![0u8; 3 * 360];
    let mut decode = |on_error| {
        decode_batch(
            &batch,
            &t,
            &options(2, Layout::default(), on_error),
            &mut out,
        )
    };
    let report = decode(OnError::Skip).unwrap();
    assert_eq!(report.kept, 2);
    assert_eq!(report.failures.len(), 1);
    assert_eq!(report.failures[0].0, 1);
    assert!(matches!(&report.failures[0].1, ImageError::Io { name, .. } if name == "pipe"));
    let err = decode(OnError::Stop).unwrap_err();
    assert!(err.to_string().starts_with("pipe: "), "{err}");
}

#[test]
fn directories_sockets_and_devices_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let err = read_file(dir.path()).unwrap_err();
    let ImageError::Io { source, .. } = &err else {
        panic!("not an Io error: {err:?}");
    };
    assert_eq!(
        source.raw_os_error(),
        Some(rustix::io::Errno::ISDIR.raw_os_error())
    );
    // Opening a Unix socket fails (ENXIO) rather than blocking.
    let sock = dir.path().join("sock.png");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    assert!(matches!(read_file(&sock), Err(ImageError::Io { .. })));
    // /dev/null would read as an empty image; it is refused as a device.
    let err = read_file(Path::new("/dev/null")).unwrap_err();
    assert!(err.to_string().contains("a character device"), "{err}");
}

#[test]
fn regular_files_and_symlinks_to_them_are_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.bin");
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, &data).unwrap();
    assert_eq!(read_file(&path).unwrap(), data);
    let link = dir.path().join("link.bin");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    assert_eq!(read_file(&link).unwrap(), data);
    std::fs::write(&path, b"").unwrap();
    assert_eq!(read_file(&path).unwrap(), b"");
    assert!(matches!(
        read_file(&dir.path().join("missing")),
        Err(ImageError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound
    ));
}
