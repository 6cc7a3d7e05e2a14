"""The one sample-seed rule: every random draw of a sample comes from (seed, epoch, index).

Native crops and flips, ``io.decode_image`` inside a transform, `sample_rng` and the
global generators, on threads and on worker processes alike.
"""

from __future__ import annotations

import itertools
import random
import shutil
from pathlib import Path
from typing import Any

import ferrofeed
import numpy as np
import pytest
from ferrofeed import DataLoader, ImageFolder, io, ops
from ferrofeed._core import crop_seed
from ferrofeed.samples import synthetic_jpeg

SIZE = 24
N = 14


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("seeded") / "images"
    for i in range(N):
        cls = root / ("a" if i % 2 else "b")
        cls.mkdir(parents=True, exist_ok=True)
        (cls / f"{i:02d}.jpg").write_bytes(synthetic_jpeg(64 + 3 * i, 48 + 2 * i, seed=i))
    return root


def native(root: Path, epoch: int, **kw: Any) -> list[tuple[np.ndarray, list[int]]]:
    loader = DataLoader(
        ImageFolder(root),
        batch_size=4,
        shuffle=True,
        seed=7,
        transform=ops.decode_image(size=SIZE, crop="random", flip="random"),
        **kw,
    )
    return [(np.array(im), lb.tolist()) for im, lb in loader.epoch_batches(epoch)]


class DecodeInTransform:
    """A Python transform: ``io.decode_image`` without ``seed=`` (picklable for workers)."""

    def __call__(self, item: tuple[str, int]) -> tuple[Any, int]:
        path, label = item
        image = io.decode_image(path, size=SIZE, crop="random", flip="random")
        return np.from_dlpack(image), label


def python_loader(root: Path, **kw: Any) -> DataLoader:
    files = ImageFolder(root)
    pairs = [(str(files[i][0]), int(files[i][1])) for i in range(len(files))]
    return DataLoader(
        pairs, batch_size=4, shuffle=True, seed=7, transform=DecodeInTransform(), **kw
    )


def same(a: list[tuple[np.ndarray, list[int]]], b: list[tuple[np.ndarray, list[int]]]) -> bool:
    return len(a) == len(b) and all(
        la == lb and np.array_equal(ia, ib) for (ia, la), (ib, lb) in zip(a, b, strict=True)
    )


def test_native_crops_follow_the_sample_not_the_folder(folder: Path, tmp_path: Path) -> None:
    copy = tmp_path / "elsewhere" / "mounted"
    shutil.copytree(folder, copy)
    for epoch in (0, 1):
        assert same(native(folder, epoch), native(copy, epoch)), f"epoch {epoch}"
    # ... and differ by epoch: compare each sample's image across epochs.
    e0, e1 = native(folder, 0), native(folder, 1)
    assert not same(e0, e1)


def test_each_native_crop_is_decode_image_with_the_samples_seed(folder: Path) -> None:
    files = ImageFolder(folder)
    loader = DataLoader(
        files,
        batch_size=4,
        shuffle=True,
        seed=7,
        transform=ops.decode_image(size=SIZE, crop="random", flip="random"),
    )
    plan = ferrofeed._core.EpochPlan(N, 4, shuffle=True, seed=7, epoch=1)
    batches = list(loader.epoch_batches(1))
    assert len(batches) == len(plan)
    for (images, _), (_, indices) in zip(batches, plan, strict=True):
        for image, index in zip(np.array(images), indices, strict=True):
            seed = crop_seed(7, 1, index)  # the one crop-seed rule
            want = io.decode_image(
                files[index][0], size=SIZE, crop="random", flip="random", seed=seed
            )
            assert np.array_equal(image, np.from_dlpack(want)), index


@pytest.mark.parametrize("threads", [1, 3])
def test_decode_image_without_seed_in_a_transform_on_threads(folder: Path, threads: int) -> None:
    for epoch in (0, 1):
        got = [
            (np.array(im), lb.tolist())
            for im, lb in python_loader(folder, num_threads=threads).epoch_batches(epoch)
        ]
        assert same(got, native(folder, epoch)), f"epoch {epoch}"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_decode_image_without_seed_in_a_transform_on_workers(
    folder: Path, start_method: str
) -> None:
    loader = python_loader(folder, num_workers=2, worker_start_method=start_method)
    got = [(np.array(im), lb.tolist()) for im, lb in loader.epoch_batches(1)]
    assert same(got, native(folder, 1))


@pytest.mark.parametrize("threads", [1, 3])
def test_native_crops_are_the_same_on_any_number_of_threads(folder: Path, threads: int) -> None:
    assert same(native(folder, 1, num_threads=threads), native(folder, 1, num_threads=2))


def resumed(make: Any, epoch: int, after: int) -> list[tuple[np.ndarray, list[int]]]:
    """The batches of ``epoch`` read ``after`` batches in, then the rest by a new loader."""
    first = make()
    first.set_epoch(epoch)
    it = iter(first)
    head = [(np.array(im), lb.tolist()) for im, lb in itertools.islice(it, after)]
    state = first.state_dict()
    assert (state["epoch"], state["batches_done"]) == (epoch, after)
    first.shutdown_workers()
    again = make()
    again.load_state_dict(state)
    rest = [(np.array(im), lb.tolist()) for im, lb in again]
    again.shutdown_workers()
    return head + rest


@pytest.mark.timeout(180)
def test_a_resumed_epoch_keeps_each_samples_crop(folder: Path) -> None:
    # The native chain, a Python transform on threads and on worker processes: each
    # resumed sample gets the crop and flip of the full epoch's native chain.
    whole = native(folder, 1)

    def native_loader() -> DataLoader:
        return DataLoader(
            ImageFolder(folder),
            batch_size=4,
            shuffle=True,
            seed=7,
            transform=ops.decode_image(size=SIZE, crop="random", flip="random"),
        )

    assert same(resumed(native_loader, 1, 2), whole)
    assert same(resumed(lambda: python_loader(folder, num_threads=2), 1, 1), whole)
    on_workers = {"num_workers": 2, "worker_start_method": "fork"}
    assert same(resumed(lambda: python_loader(folder, **on_workers), 1, 2), whole)


def test_decode_image_outside_a_loader_draws_a_fresh_seed(folder: Path) -> None:
    path = ImageFolder(folder)[0][0]
    draws = {
        np.from_dlpack(io.decode_image(path, size=SIZE, crop="random")).tobytes() for _ in range(6)
    }
    assert len(draws) > 1


def _rng_sample(index: int) -> tuple[int, float]:
    rng = ferrofeed.sample_rng()
    first = float(rng.random())
    # The same generator within one sample: its draws go on.
    assert ferrofeed.sample_rng() is rng
    return index, first + float(ferrofeed.sample_rng().random())


class RngDataset:
    def __len__(self) -> int:
        return 20

    def __getitem__(self, index: int) -> tuple[int, float]:
        return _rng_sample(index)


@pytest.mark.timeout(180)
def test_sample_rng_is_the_same_on_any_number_of_threads_or_workers() -> None:
    def run(**kw: Any) -> list[tuple[list[int], list[float]]]:
        loader = DataLoader(RngDataset(), batch_size=3, shuffle=True, seed=4, **kw)
        return [(ix.tolist(), vals.tolist()) for ix, vals in loader.epoch_batches(2)]

    one = run(num_threads=1)
    assert run(num_threads=4) == one
    assert run(num_workers=2, worker_start_method="fork") == one
    other_epoch = DataLoader(RngDataset(), batch_size=3, shuffle=True, seed=4)
    assert [v.tolist() for _, v in other_epoch.epoch_batches(3)] != [v for _, v in one]


def test_sample_rng_outside_a_loader_says_where_it_works() -> None:
    with pytest.raises(RuntimeError, match=r"inside the DataLoader's dataset\[i\] or transform"):
        ferrofeed.sample_rng()


class GlobalDraws:
    """Draws from the global generators, as a transform written for workers does."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int) -> list[float]:
        return [random.random(), float(np.random.random())]


@pytest.mark.timeout(180)
def test_one_thread_seeds_the_global_generators_as_workers_do() -> None:
    def run(**kw: Any) -> list[list[list[float]]]:
        loader = DataLoader(GlobalDraws(), batch_size=4, shuffle=True, seed=9, **kw)
        return [b.tolist() for b in loader.epoch_batches(1)]

    threads = run(num_threads=1)
    assert threads == run(num_workers=2, worker_start_method="fork")
    assert threads == run(num_workers=3, worker_start_method="spawn")
    assert threads == run(num_threads=1)
