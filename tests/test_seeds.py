"""One shuffle family and one crop-seed rule, pinned (src/seed.rs, src/sampler.rs).

Every shuffle of ferrofeed (the epoch's, a sharded source's windows and its ``bucket_by``
batches, an iterable dataset's shuffle buffer) is one of `sampler.rs`'s generators, and
every random crop and flip draws from ``crop_seed(seed, epoch, index)``. The golden values
are the Rust unit tests' (computed by an independent transcription of the formulas):
changing them changes every user's orders and crops, a breaking change.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ferrofeed as ff
import pytest
from ferrofeed import _core


def test_epoch_permutation_is_pinned() -> None:
    assert list(_core.Permutation(10, seed=0, epoch=0)) == [1, 0, 4, 9, 7, 8, 5, 3, 6, 2]
    assert list(_core.Permutation(10, seed=42, epoch=3)) == [1, 5, 7, 0, 3, 6, 9, 4, 2, 8]


def test_shuffle_order_is_pinned() -> None:
    def bucket(n: int, seed: int, epoch: int, index: int) -> list[int]:
        return _core.shuffle_order(n, seed=seed, epoch=epoch, index=index, stream="bucket")

    assert bucket(8, 0, 0, 0) == [1, 2, 5, 6, 7, 3, 4, 0]
    assert bucket(10, 42, 3, 5) == [1, 4, 5, 3, 8, 7, 9, 6, 2, 0]
    assert _core.mix_seed(0, 0, 0, "bucket") == 12561458183599317634
    assert _core.mix_seed(7, 1, 3, "buffer") == 14271414223230950480
    with pytest.raises(ValueError, match=r"stream is one of .*\"bucket\""):
        _core.shuffle_order(3, seed=0, epoch=0, index=0, stream="shuffle")  # type: ignore[arg-type]


def buffered(n: int, window: int, seed: int, epoch: int, index: int) -> list[int]:
    return list(_core._ShuffleBuffer(range(n), window, seed=seed, epoch=epoch, index=index))


def test_shuffle_buffer_is_pinned() -> None:
    assert buffered(12, 4, 0, 0, 0) == [1, 0, 3, 4, 6, 5, 2, 8, 9, 11, 10, 7]
    assert buffered(10, 3, 42, 1, 1) == [2, 3, 0, 5, 1, 7, 6, 9, 8, 4]
    assert buffered(3, 5, 7, 0, 0) == [1, 0, 2]  # shorter than the window


def test_shuffle_buffer_hands_out_each_item_once_and_ends_with_an_error() -> None:
    for n, window in [(0, 4), (1, 1), (100, 7), (7, 100)]:
        assert sorted(buffered(n, window, 3, 2, 1)) == list(range(n))

    def failing() -> Iterator[int]:
        yield from range(5)
        raise OSError("disk gone")

    it = _core._ShuffleBuffer(failing(), 2, seed=0, epoch=0, index=0)
    got = [next(it) for _ in range(3)]
    with pytest.raises(OSError, match="disk gone"):
        next(it)
    assert list(it) == []  # the stream ended with its error
    assert len(set(got)) == 3


class Stream:
    """An iterable dataset of ``n`` numbers."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))


def test_an_iterable_datasets_shuffle_is_the_pinned_buffer() -> None:
    # On threads, the stream's ids are its positions, and the one buffer draws from
    # (seed, epoch, worker 0): the loader's order is the buffer's.
    loader = ff.DataLoader(Stream(12), 4, shuffle=True, shuffle_window=4, seed=0, collate=list)
    assert [x for b in loader.epoch_batches(0) for x in b] == buffered(12, 4, 0, 0, 0)
    assert [x for b in loader.epoch_batches(1) for x in b] == buffered(12, 4, 0, 1, 0)


@pytest.fixture
def token_lines(tmp_path: Path) -> list[Path]:
    paths = []
    for k in range(2):
        lines = [
            # 32 distinct lengths (7 is prime to 32), so the sorted chunks are unambiguous.
            json.dumps({"id": 16 * k + j, "tokens": [0] * (1 + (7 * (16 * k + j)) % 32)})
            for j in range(16)
        ]
        path = tmp_path / f"part-{k}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def test_bucket_by_orders_a_windows_batches_by_the_pinned_permutation(
    token_lines: list[Path],
) -> None:
    def batches(**kw: Any) -> list[list[tuple[int, int]]]:
        loader = ff.DataLoader(
            ff.JsonLines(token_lines),
            4,
            seed=2,
            shuffle_window=16,
            bucket_by=lambda s: len(s["tokens"]),
            transform=lambda s: (len(s["tokens"]), s["id"]),
            collate=list,
            **kw,
        )
        return list(loader.epoch_batches(1))

    shuffled = batches(shuffle=True)
    # A window's batches are its samples sorted by the key, cut in 4: sorted, they are
    # the chunks; the loader yields them in shuffle_order(4, seed, epoch, first batch).
    for first in (0, 4):
        window = shuffled[first : first + 4]
        chunks = sorted(window)
        order = _core.shuffle_order(4, seed=2, epoch=1, index=first, stream="bucket")
        assert window == [chunks[k] for k in order], first


def test_crop_seed_is_pinned() -> None:
    assert _core.crop_seed(0, 0, 0) == 11492569862326130707
    assert _core.crop_seed(7, 1, 3) == 3522167460412779704
    assert _core.crop_seed(7, 1, 5) == 13701360014256768237
    for args in [(0, 0, 0), (5, 2, 99)]:
        assert _core.crop_seed(*args) == _core.mix_seed(*args, "crop")
