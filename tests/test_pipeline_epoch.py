"""A pipeline is an epoch: build() numbers them, and random crops key on (seed, epoch, position)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ferrofeed import PipelineBuilder, _core, io, ops
from ferrofeed.samples import synthetic_jpeg


def write_jpegs(d: Path, n: int) -> list[Path]:
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        p = d / f"img_{i:03d}.jpg"
        p.write_bytes(synthetic_jpeg(64 + 8 * (i % 4), 48 + 8 * (i % 3), seed=i))
        paths.append(p)
    return paths


def crops(
    builder: PipelineBuilder, *, epoch: int | None = None, num_threads: int = 2
) -> dict[int, np.ndarray]:
    """Each item's decoded image, keyed by its label (its position in the source)."""
    p = builder.build(epoch=epoch, num_threads=num_threads)
    with p.auto_stop():
        return {label: np.from_dlpack(t).copy() for t, label in p}


def chain(paths: list[Path], *, seed: int = 7, concurrency: int = 1, flip: Any = "random") -> Any:
    op = ops.decode_image(size=16, crop="random", flip=flip, seed=seed)
    return (
        PipelineBuilder()
        .add_source([(str(p), i) for i, p in enumerate(paths)])
        .pipe(ops.read_file())
        .pipe(op, concurrency=concurrency, ordered=False)
        .add_sink(4)
    )


def same(a: dict[int, np.ndarray], b: dict[int, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_each_build_is_the_next_epoch_and_build_epoch_sets_it() -> None:
    b = PipelineBuilder().add_source(range(3)).add_sink()
    assert [b.build().epoch for _ in range(3)] == [0, 1, 2]
    assert b.build(epoch=10).epoch == 10
    assert b.build().epoch == 11
    assert b.build(epoch=0).epoch == 0
    assert b.build().epoch == 1
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="epoch"):
            b.build(epoch=bad)  # type: ignore[arg-type]


@pytest.mark.timeout(120)
def test_random_crops_are_the_same_for_an_epoch_and_new_for_the_next(tmp_path: Path) -> None:
    paths = write_jpegs(tmp_path / "a", 12)
    b = chain(paths)
    first = crops(b)  # epoch 0
    second = crops(b)  # epoch 1
    assert len(first) == len(second) == 12
    assert not same(first, second)
    assert sum(not np.array_equal(first[k], second[k]) for k in first) >= 6
    assert same(crops(b, epoch=0), first)
    assert same(crops(b, epoch=1), second)
    # A new builder and a new op with the same seed: the same crops for the same epoch.
    assert same(crops(chain(paths), epoch=1), second)
    # Another seed: other crops.
    assert not same(crops(chain(paths, seed=8), epoch=0), first)
    # The one crop-seed rule: item i of epoch e draws from crop_seed(seed, e, i).
    for i in (0, 5, 11):
        seed = _core.crop_seed(7, 1, i)
        want = io.decode_image(paths[i], size=16, crop="random", flip="random", seed=seed)
        assert np.array_equal(second[i], np.from_dlpack(want)), i


@pytest.mark.timeout(120)
def test_the_same_files_under_another_folder_get_the_same_crops(tmp_path: Path) -> None:
    paths = write_jpegs(tmp_path / "a", 10)
    elsewhere = tmp_path / "mount" / "copy"
    shutil.copytree(tmp_path / "a", elsewhere)
    copies = [elsewhere / p.name for p in paths]
    for epoch in (0, 3):
        assert same(crops(chain(paths), epoch=epoch), crops(chain(copies), epoch=epoch))


@pytest.mark.timeout(120)
def test_a_crop_depends_on_the_position_not_on_thread_timing(tmp_path: Path) -> None:
    paths = write_jpegs(tmp_path, 16)
    reference = crops(chain(paths, concurrency=1), epoch=2, num_threads=1)
    op = ops.decode_image(size=16, crop="random", flip="random", seed=7)
    b = (
        PipelineBuilder()
        .add_source([(str(p), i) for i, p in enumerate(paths)])
        .pipe(ops.read_file(), concurrency=4, ordered=False)
        .pipe(op, concurrency=8, ordered=False)
        .add_sink(4)
    )
    for _ in range(3):
        assert same(crops(b, epoch=2, num_threads=8), reference)
    # Paths decoded straight (no read_file stage): the same crops.
    b = (
        PipelineBuilder()
        .add_source([(str(p), i) for i, p in enumerate(paths)])
        .pipe(op, concurrency=4, ordered=False)
        .add_sink(4)
    )
    assert same(crops(b, epoch=2, num_threads=4), reference)
    # The same file at every position: the crop follows the position.
    one = [paths[0]] * 8
    by_position = crops(chain(one), epoch=0)
    distinct = {by_position[k].tobytes() for k in by_position}
    assert len(distinct) >= 4


@pytest.mark.timeout(120)
def test_without_a_seed_each_op_draws_a_fresh_one(tmp_path: Path) -> None:
    paths = write_jpegs(tmp_path, 8)

    def unseeded() -> dict[int, np.ndarray]:
        op = ops.decode_image(size=16, crop="random")
        b = (
            PipelineBuilder()
            .add_source([(str(p), i) for i, p in enumerate(paths)])
            .pipe(op)
            .add_sink()
        )
        return crops(b, epoch=0)

    assert not same(unseeded(), unseeded())
