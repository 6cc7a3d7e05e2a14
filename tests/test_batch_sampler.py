"""`DataLoader(dataset, batch_sampler=...)`: PyTorch's batch-sampler protocol on map-style data."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import ferrofeed as ff
import numpy as np
import pytest
from ferrofeed import ops


class Buckets:
    """Batches of indices of similar length, in an order that depends on the epoch."""

    def __init__(self, lengths: list[int], batch_size: int) -> None:
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        self.batches = [order[k : k + batch_size] for k in range(0, len(order), batch_size)]
        self.epoch = 0
        self.epochs_set: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.epochs_set.append(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        rng = np.random.default_rng(self.epoch)
        for k in rng.permutation(len(self.batches)):
            yield self.batches[k]

    def __len__(self) -> int:
        return len(self.batches)


LENGTHS = [int(n) for n in np.random.default_rng(0).integers(1, 50, size=23)]


def lists(batch: Any) -> list[int]:
    return [int(i) for i in np.asarray(batch)]


def test_batches_are_the_samplers_and_set_epoch_is_called() -> None:
    sampler = Buckets(LENGTHS, 4)
    dl = ff.DataLoader(list(range(23)), batch_sampler=sampler, num_threads=3)
    assert len(dl) == 6
    e0 = [lists(b) for b in dl]
    e1 = [lists(b) for b in dl]
    assert sampler.epochs_set == [0, 1]
    assert e0 == [sampler.batches[k] for k in np.random.default_rng(0).permutation(6)]
    assert e0 != e1
    assert sorted(i for b in e0 for i in b) == list(range(23))


def test_resume_skips_the_batches_given(tmp_path: Any) -> None:
    dl = ff.DataLoader(list(range(23)), batch_sampler=Buckets(LENGTHS, 4), num_workers=2)
    full = [lists(b) for b in ff.DataLoader(list(range(23)), batch_sampler=Buckets(LENGTHS, 4))]
    it = iter(dl)
    head = [lists(next(it)) for _ in range(2)]
    state = dl.state_dict()
    resumed = ff.DataLoader(list(range(23)), batch_sampler=Buckets(LENGTHS, 4))
    resumed.load_state_dict(state)
    assert head + [lists(b) for b in resumed] == full
    plain = ff.DataLoader(list(range(23)))
    with pytest.raises(ValueError, match="batch_sampler"):
        plain.load_state_dict(state)


def test_a_sampler_without_len_works_as_a_generator_does() -> None:
    def gen() -> Iterator[list[int]]:
        yield from ([0, 1], [2], [5, 4, 3])

    class Once:
        def __iter__(self) -> Iterator[list[int]]:
            return gen()

    dl = ff.DataLoader(list(range(6)), batch_sampler=Once(), progress=True)
    assert [lists(b) for b in dl] == [[0, 1], [2], [5, 4, 3]]
    with pytest.raises(TypeError, match="no len"):
        len(dl)


def test_torch_batch_sampler() -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import BatchSampler, SequentialSampler

    bs = BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=False)
    dl = ff.DataLoader(list(range(10)), batch_sampler=bs, output="torch")
    got = list(dl)
    assert all(isinstance(b, torch.Tensor) for b in got)
    assert [b.tolist() for b in got] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


@pytest.mark.parametrize(
    "kw", [{"batch_size": 4}, {"shuffle": True}, {"drop_last": True}, {"batches_per_epoch": 2}]
)
def test_exclusive_options_are_refused(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="mutually exclusive"):
        ff.DataLoader(list(range(4)), batch_sampler=[[0, 1]], **kw)


def test_the_native_chain_refuses_a_batch_sampler(tmp_path: Any) -> None:
    with pytest.raises(TypeError, match="batch_sampler= needs a Python transform"):
        ff.DataLoader(
            [str(tmp_path / "a.jpg")], batch_sampler=[[0]], transform=ops.decode_image(size=8)
        )


def test_a_failing_sample_names_its_index() -> None:
    class Bad:
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> int:
            if i == 2:
                raise KeyError("two")
            return i

    with pytest.raises(KeyError, match="two"):
        list(ff.DataLoader(Bad(), batch_sampler=[[0, 1], [2, 3]]))
    dl = ff.DataLoader(Bad(), batch_sampler=[[0, 1], [2, 3]], on_error="skip")
    assert [lists(b) for b in dl] == [[0, 1], [3]]
    assert [i for i, _ in dl.stats()["skipped"]] == [2]
