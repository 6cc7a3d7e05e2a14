"""Native image ops in pipelines: read_file -> decode_image -> collate, against Pillow."""

from __future__ import annotations

import os
from pathlib import Path

import ferrofeed
import numpy as np
import pytest
from ferrofeed import PipelineBuilder, PipelineError, ops

Image = pytest.importorskip("PIL.Image")


def write_jpegs(d: Path, n: int, *, seed: int = 0) -> list[str]:
    """Small photo-like JPEGs of varied sizes (gradients plus noise)."""
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        h, w = int(rng.integers(40, 72)), int(rng.integers(40, 72))
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([x * 255 // w, y * 255 // h, (x + y) * 127 // (h + w)], axis=-1)
        noise = rng.integers(-20, 20, size=(h, w, 3))
        img = np.clip(base + noise, 0, 255).astype(np.uint8)
        p = d / f"img_{i:04d}.jpg"
        Image.fromarray(img).save(p, quality=int(rng.integers(75, 96)))
        paths.append(str(p))
    return paths


def pillow_reference(path: str, shorter: int, crop: int) -> np.ndarray:
    """torchvision-style Resize(shorter) + CenterCrop(crop) with Pillow's BILINEAR."""
    with Image.open(path) as im:
        im = im.convert("RGB")
        w, h = im.size
        if w <= h:
            nw, nh = shorter, int(shorter * h / w)
        else:
            nw, nh = int(shorter * w / h), shorter
        im = im.resize((nw, nh), Image.BILINEAR)
        left = round((nw - crop) / 2.0)
        top = round((nh - crop) / 2.0)
        return np.asarray(im.crop((left, top, left + crop, top + crop)))


@pytest.mark.timeout(300)
def test_native_chain_of_1000_images_matches_pillow_in_order(tmp_path: Path) -> None:
    paths = write_jpegs(tmp_path, 1000)
    labels = [i % 7 for i in range(len(paths))]
    pipeline = (
        PipelineBuilder()
        .add_source(list(zip(paths, labels, strict=True)))
        .pipe(ops.read_file())
        .pipe(ops.decode_image(resize_shorter=32, crop=24, dct_scaling=False), concurrency=4)
        .pipe(ops.collate(32, max_batches=40))  # this test keeps every batch
        .add_sink(4)
        .build(num_threads=2)
    )
    batches = list(pipeline)
    assert len(batches) == 32  # 31 full batches and one of 8
    images = np.concatenate([np.from_dlpack(b[0]) for b in batches])
    got_labels = np.concatenate([np.from_dlpack(b[1]) for b in batches])
    assert images.shape == (1000, 24, 24, 3)
    assert images.dtype == np.uint8
    assert got_labels.dtype == np.int64
    assert got_labels.tolist() == labels
    errors = [
        np.abs(images[i].astype(int) - pillow_reference(p, 32, 24).astype(int)).mean()
        for i, p in enumerate(paths)
    ]
    # IDCT rounding and resize arithmetic differ slightly from Pillow's.
    assert max(errors) < 2.0, max(errors)
    assert float(np.mean(errors)) < 1.0
    stats = pipeline.stats()
    assert stats["decode_image"]["items_out"] == 1000
    assert stats["collate"]["items_out"] == 32


def test_batches_are_aligned_tensors_handed_over_without_copy(tmp_path: Path) -> None:
    paths = write_jpegs(tmp_path, 8)
    p = PipelineBuilder().add_source(paths).pipe(ops.decode_image(size=(16, 20)))
    (batch,) = list(p.pipe(ops.collate(8)).add_sink().build())
    assert isinstance(batch, ferrofeed.Tensor)  # no labels: the images alone
    assert batch.shape == (8, 16, 20, 3)
    assert batch.data_ptr % 64 == 0
    view = np.from_dlpack(batch)
    assert view.ctypes.data == batch.data_ptr


def test_float_nchw_normalized(tmp_path: Path) -> None:
    paths = write_jpegs(tmp_path, 4)
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    raw = PipelineBuilder().add_source(paths).pipe(ops.decode_image(size=12))
    (u8,) = list(raw.pipe(ops.collate(4)).add_sink().build())
    norm = PipelineBuilder().add_source(paths).pipe(ops.decode_image(size=12))
    (f32,) = list(
        norm.pipe(ops.collate(4, layout="NCHW", dtype="float32", normalize=(mean, std)))
        .add_sink()
        .build()
    )
    assert f32.shape == (4, 3, 12, 12)
    assert f32.dtype == "float32"
    expected = (np.from_dlpack(u8).astype(np.float32) / 255 - mean) / std
    np.testing.assert_allclose(np.from_dlpack(f32), expected.transpose(0, 3, 1, 2), atol=1e-5)


def test_drop_last_and_bytes_sources(tmp_path: Path) -> None:
    paths = write_jpegs(tmp_path, 10)
    blobs = [Path(p).read_bytes() for p in paths]
    p = PipelineBuilder().add_source(blobs).pipe(ops.decode_image(size=8))
    batches = list(p.pipe(ops.collate(4, drop_last=True)).add_sink().build())
    assert [b.shape[0] for b in batches] == [4, 4]


def test_a_corrupt_image_names_its_file(tmp_path: Path) -> None:
    paths = write_jpegs(tmp_path, 5)
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(Path(paths[0]).read_bytes()[:200])
    source = [*paths[:2], str(bad), *paths[2:]]
    raise_p = (
        PipelineBuilder()
        .add_source(source)
        .pipe(ops.read_file())
        .pipe(ops.decode_image(size=8))
        .pipe(ops.collate(2))
        .add_sink()
        .build()
    )
    with pytest.raises(PipelineError) as info:
        list(raise_p)
    (inner,) = info.value.exceptions
    assert isinstance(inner, ferrofeed.ImageDecodeError)
    assert "broken.jpg" in str(inner)
    skip_p = (
        PipelineBuilder()
        .add_source(source)
        .pipe(ops.read_file())
        .pipe(ops.decode_image(size=8), on_error="skip")
        .pipe(ops.collate(5))
        .add_sink()
        .build()
    )
    (batch,) = list(skip_p)
    assert batch.shape[0] == 5
    assert skip_p.stats()["decode_image"]["failures"] == 1


def test_missing_file_and_wrong_items_are_clear_errors(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.jpg")
    p = PipelineBuilder().add_source([missing]).pipe(ops.read_file()).add_sink().build()
    with pytest.raises(PipelineError) as info:
        list(p)
    (inner,) = info.value.exceptions
    assert isinstance(inner, OSError)
    assert "nope.jpg" in str(inner)
    p = PipelineBuilder().add_source([1, 2]).pipe(ops.decode_image()).add_sink().build()
    with pytest.raises(PipelineError) as info:
        list(p)
    assert isinstance(info.value.exceptions[0], TypeError)


def test_collate_refuses_mixed_shapes(tmp_path: Path) -> None:
    paths = write_jpegs(tmp_path, 6)  # varied sizes, no resize: shapes differ
    p = PipelineBuilder().add_source(paths).pipe(ops.decode_image()).pipe(ops.collate(6))
    with pytest.raises(PipelineError) as info:
        list(p.add_sink().build())
    (inner,) = info.value.exceptions
    assert "size= or crop=" in str(inner)
    assert isinstance(inner, ferrofeed.CollateValueError)
    assert isinstance(inner, ValueError)
    assert isinstance(inner, ferrofeed.FerrofeedError)


def test_collate_errors_are_ferrofeed_errors_of_the_standard_types(tmp_path: Path) -> None:
    paths = write_jpegs(tmp_path, 4)
    decode = ops.decode_image(resize_shorter=32, crop=32)
    # Labels on some images of the batch only.
    items = [(p, 1) if k % 2 else p for k, p in enumerate(paths)]
    p = PipelineBuilder().add_source(items).pipe(decode).pipe(ops.collate(4)).add_sink()
    with pytest.raises(PipelineError) as info:
        list(p.build())
    (inner,) = info.value.exceptions
    assert isinstance(inner, ferrofeed.CollateValueError)
    assert "some images have a label and some do not" in str(inner)
    # Items that are not decoded images.
    p = PipelineBuilder().add_source([b"x", b"y"]).pipe(ops.collate(2)).add_sink()
    with pytest.raises(PipelineError) as info:
        list(p.build())
    (inner,) = info.value.exceptions
    assert isinstance(inner, ferrofeed.CollateTypeError)
    assert isinstance(inner, TypeError)
    assert "ops.collate() takes decoded images" in str(inner)


def test_random_crops_do_not_depend_on_thread_timing(tmp_path: Path) -> None:
    paths = write_jpegs(tmp_path, 24)

    def run(concurrency: int) -> np.ndarray:
        op = ops.decode_image(size=16, crop="random", seed=7)
        p = PipelineBuilder().add_source(paths).pipe(op, concurrency=concurrency)
        (batch,) = list(p.pipe(ops.collate(24)).add_sink().build())
        return np.from_dlpack(batch).copy()

    assert np.array_equal(run(1), run(4))


def test_python_stages_still_get_python_objects(tmp_path: Path) -> None:
    paths = write_jpegs(tmp_path, 3)
    seen: list[object] = []
    p = PipelineBuilder().add_source([(paths[0], 5)]).pipe(seen.append).add_sink().build()
    list(p)
    assert seen == [(paths[0], 5)]  # the first stage is Python: the source stays Python
    p = PipelineBuilder().add_source([(paths[0], 5)]).pipe(ops.read_file()).add_sink().build()
    ((data, label),) = list(p)
    assert data == Path(paths[0]).read_bytes()
    assert label == 5
    assert os.path.exists(paths[0])
