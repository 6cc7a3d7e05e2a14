"""DataLoader over iterable datasets (PyTorch's IterableDataset): threads, workers, resume."""

from __future__ import annotations

import gc
import itertools
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ferrofeed
import numpy as np
import pytest
import torch
from conftest import assert_slots_reused, ctrl_c_with_workers, wait_gone
from ferrofeed import (
    DataLoader,
    TooManyFailuresError,
    WorkerDiedError,
    WorkerTimeoutError,
    get_worker_info,
    ops,
)
from ferrofeed._iterable import SampleStream, StreamSpec, is_iterable_dataset

# JAX (imported by other test modules of the session) warns at every fork; the tests that
# ask for fork explicitly ignore that warning.
pytestmark = pytest.mark.filterwarnings(r"ignore:os\.fork\(\) was called:RuntimeWarning")

TESTS_DIR = Path(__file__).resolve().parent
METHODS = ["fork", "spawn"]


# -- datasets (module level, so spawn workers can unpickle them) ------------------------------


class Split(torch.utils.data.IterableDataset[int]):
    """0..n-1, each worker reading its part (every num_workers-th), as PyTorch's docs show.

    It asks torch's get_worker_info(), as a dataset written for PyTorch does.
    """

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        info = torch.utils.data.get_worker_info()
        wid, count = (info.id, info.num_workers) if info is not None else (0, 1)
        return iter(range(wid, self.n, count))


class Blocks(torch.utils.data.IterableDataset[int]):
    """0..n-1, each worker reading a contiguous block (uneven: worker 0 gets the most)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        # ferrofeed's (torch's in torch's workers, for the comparison with its loader)
        info = get_worker_info() or torch.utils.data.get_worker_info()
        wid, count = (info.id, info.num_workers) if info is not None else (0, 1)
        per = -(-self.n // count)
        return iter(range(wid * per, min(self.n, (wid + 1) * per)))


class Whole:
    """0..n-1 in every worker (no split: each worker yields everything, as in PyTorch)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))


class Sized(Whole):
    def __len__(self) -> int:
        return self.n


class BadAt:
    """0..n-1, whose iterator raises at ``bad`` (0: ``__iter__`` itself raises)."""

    def __init__(self, bad: int, n: int = 20) -> None:
        self.bad, self.n = bad, n

    def __iter__(self) -> Iterator[int]:
        if self.bad == 0:
            raise OSError("cannot open the stream")
        return self._gen()

    def _gen(self) -> Iterator[int]:
        for i in range(self.n):
            if i == self.bad:
                raise KeyError(f"record {i} is corrupt")
            yield i


class DiesAt:
    """A worker kills itself when its stream reaches ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at

    def __iter__(self) -> Iterator[int]:
        for i in range(40):
            if i == self.at and get_worker_info() is not None:
                os.kill(os.getpid(), signal.SIGKILL)
            yield i


class SlowStream:
    """An endless stream of ints, ``delay`` seconds each."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def __iter__(self) -> Iterator[int]:
        for i in itertools.count():
            time.sleep(self.delay)
            yield i


class ShufflesItsParts:
    """Shuffles its parts with Python's global `random` at the start of each pass."""

    def __iter__(self) -> Iterator[int]:
        import random

        parts = list(range(8))
        random.shuffle(parts)
        for p in parts:
            yield from range(p * 4, p * 4 + 4)


class Pids:
    """(pid, i) for i in 0..n-1."""

    def __init__(self, n: int = 64) -> None:
        self.n = n

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return ((os.getpid(), i) for i in range(self.n))


def fails_on_7(x: int) -> int:
    if x == 7:
        raise ValueError("seven is bad")
    return x


def jitter(x: int) -> tuple[int, float]:
    return x, float(ferrofeed.sample_rng().random())


def rows(batches: Any) -> list[list[int]]:
    return [np.asarray(b).tolist() for b in batches]


def assert_same_batches(got: list[Any], want: list[Any]) -> None:
    """The same number of ``(values, draws)`` batches, equal one by one."""
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])


def flat(batches: Any) -> list[int]:
    return [x for b in rows(batches) for x in b]


def collect(batches: Any, into: list[list[int]]) -> None:
    """Append each batch to ``into`` as it comes (what came before an error stays)."""
    for b in batches:
        into.append(np.asarray(b).tolist())


# -- detection and arguments ---------------------------------------------------------------------


def test_detection() -> None:
    # torch's IterableDataset has a __getitem__ (inherited from Dataset): still iterable.
    assert is_iterable_dataset(Split(3))
    assert is_iterable_dataset(Whole(3))
    assert is_iterable_dataset(x for x in range(3))
    assert not is_iterable_dataset([1, 2, 3])
    assert not is_iterable_dataset(range(3))


def test_arguments_an_iterable_cannot_take() -> None:
    with pytest.raises(ValueError, match="shuffle_window"):
        DataLoader(Whole(8), 2, shuffle=True)
    with pytest.raises(TypeError, match="batches_per_epoch"):
        DataLoader(Whole(8), 2, batches_per_epoch=3)
    with pytest.raises(TypeError, match="Python transform"):
        DataLoader(Whole(8), 2, transform=ops.decode_image(size=32))
    with pytest.raises(TypeError, match="image="):
        DataLoader(Whole(8), 2, image="jpg")
    with pytest.raises(ValueError, match="shuffle_window must be"):
        DataLoader(Whole(8), 2, shuffle=True, shuffle_window=0)
    with pytest.raises(TypeError, match="bucket_by"):
        DataLoader(Whole(8), 2, bucket_by=len)
    with pytest.raises(TypeError, match="batch_sampler"):
        DataLoader(Whole(8), batch_sampler=[[0, 1]])


def test_len_from_the_dataset_as_pytorch() -> None:
    assert len(DataLoader(Sized(10), 4)) == 3
    assert len(DataLoader(Sized(10), 4, drop_last=True)) == 2
    assert len(DataLoader(Sized(10), None)) == 10
    with pytest.raises(TypeError, match="no __len__"):
        len(DataLoader(Whole(10), 4))
    # Iterating needs no length.
    assert rows(DataLoader(Whole(5), 2, progress=True)) == [[0, 1], [2, 3], [4]]


# -- threads --------------------------------------------------------------------------------------


def test_threads_batches_in_stream_order() -> None:
    assert rows(DataLoader(Whole(10), 4)) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert rows(DataLoader(Whole(10), 4, drop_last=True)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [int(s) for s in DataLoader(Whole(3), None)] == [0, 1, 2]


def test_threads_same_output_whatever_num_threads() -> None:
    kw: dict[str, Any] = {"shuffle": True, "shuffle_window": 16, "seed": 3, "transform": jitter}
    one = list(DataLoader(Whole(100), 8, num_threads=1, **kw))
    many = list(DataLoader(Whole(100), 8, num_threads=4, **kw))
    assert len(one) == 13
    assert_same_batches(one, many)


def test_torch_output_and_collate() -> None:
    batches = list(DataLoader(Split(6), 3, output="torch", transform=lambda x: {"x": x}))
    assert [b["x"].tolist() for b in batches] == [[0, 1, 2], [3, 4, 5]]
    assert isinstance(batches[0]["x"], torch.Tensor)


# -- workers --------------------------------------------------------------------------------------


# torch warns that 3 workers are more than this machine's CPUs.
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dataset", [Split(23), Blocks(23)], ids=["strided", "blocks"])
def test_workers_give_pytorchs_batches_in_pytorchs_order(method: Any, dataset: Any) -> None:
    # Blocks of 23 on 3 workers: 8, 8 and 7 samples, batches of 3: the last worker's last
    # batch is short and it drops out of the round-robin first.
    ours = rows(DataLoader(dataset, 3, num_workers=3, worker_start_method=method))
    theirs = rows(
        torch.utils.data.DataLoader(
            dataset, batch_size=3, num_workers=3, multiprocessing_context=method
        )
    )
    assert ours == theirs
    assert sorted(x for b in ours for x in b) == list(range(23))


def test_workers_round_robin_with_an_early_exhausted_worker() -> None:
    # Blocks(10) on 3 workers: 4, 4 and 2 samples; batches of 2.
    got = rows(DataLoader(Blocks(10), 2, num_workers=3))
    assert got == [[0, 1], [4, 5], [8, 9], [2, 3], [6, 7]]
    got = rows(DataLoader(Blocks(10), 3, num_workers=3, drop_last=True))
    assert got == [[0, 1, 2], [4, 5, 6]]


def test_a_dataset_that_does_not_split_is_read_by_every_worker() -> None:
    # As in PyTorch: each worker iterates its own copy, the whole of it.
    got = rows(DataLoader(Whole(6), 3, num_workers=2))
    assert got == [[0, 1, 2], [0, 1, 2], [3, 4, 5], [3, 4, 5]]


def test_one_worker_gives_the_threads_batches() -> None:
    kw: dict[str, Any] = {"shuffle": True, "shuffle_window": 10, "seed": 9, "transform": jitter}
    threads = list(DataLoader(Whole(50), 6, **kw))
    worker = list(DataLoader(Whole(50), 6, num_workers=1, **kw))
    assert len(threads) == 9
    assert_same_batches(threads, worker)


def test_batches_come_from_the_workers_own_processes() -> None:
    batches = list(DataLoader(Pids(12), 3, num_workers=2, transform=tuple))
    pids = [b[0].tolist() for b in batches]
    assert all(len(set(p)) == 1 for p in pids)
    assert pids[0][0] != pids[1][0]
    assert pids[0][0] != os.getpid()
    assert [b[1].tolist() for b in batches][:2] == [[0, 1, 2], [0, 1, 2]]


def test_worker_draws_depend_on_the_worker_count_and_reproduce() -> None:
    # A sample's id is position * num_workers + worker: the draws of a given sample (here
    # a value of the stream) depend on how many workers read the dataset, as in PyTorch.
    def run(workers: int) -> dict[int, float]:
        loader = DataLoader(Blocks(24), 4, num_workers=workers, transform=jitter, seed=1)
        return {int(x): float(r) for b in loader for x, r in zip(b[0], b[1], strict=True)}

    two = run(2)
    assert sorted(two) == list(range(24))
    assert run(2) == two
    three = run(3)
    assert sorted(three) == list(range(24))
    assert three != two


def test_worker_batches_come_in_shared_slots_a_few_in_flight() -> None:
    def lease_of(arr: np.ndarray) -> Any:
        base: Any = arr
        while getattr(base, "base", None) is not None:
            base = base.base
            if isinstance(base, memoryview):
                return base.obj
        return base

    loader = DataLoader(Split(400), 8, num_workers=2, transform=float, persistent_workers=True)
    try:
        for b in loader:
            assert isinstance(lease_of(b), ferrofeed._core._SlotLease)
            assert b.dtype == np.float64
            del b
            # Each worker has at most prefetch_factor (2) requests in flight.
            assert sum(w["in_flight"] for w in _workers(loader)) <= 2 * 2
        assert_slots_reused(loader, 50)
    finally:
        loader.shutdown_workers()


def test_persistent_workers_start_a_new_pass_each_epoch() -> None:
    loader = DataLoader(
        Split(12), 4, num_workers=2, persistent_workers=True, shuffle=True, shuffle_window=4
    )
    try:
        first, second = flat(loader), flat(loader)
        assert sorted(first) == sorted(second) == list(range(12))
        assert first != second  # another epoch, another shuffle
        assert flat(loader.epoch_batches(0)) == first
    finally:
        loader.shutdown_workers()


# -- shuffle ------------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_shuffle_window(workers: int) -> None:
    def epoch(seed: int, e: int) -> list[int]:
        loader = DataLoader(
            Split(200), 8, shuffle=True, shuffle_window=32, seed=seed, num_workers=workers
        )
        return flat(loader.epoch_batches(e))

    plain = flat(DataLoader(Split(200), 8, num_workers=workers))
    a = epoch(0, 0)
    assert sorted(a) == list(range(200))  # every sample once
    assert a != plain
    assert epoch(0, 0) == a  # reproducible
    assert epoch(0, 1) != a  # another epoch
    assert epoch(1, 0) != a  # another seed


def test_shuffle_buffer_holds_window_samples() -> None:
    read: list[int] = []

    class Counted:
        def __iter__(self) -> Iterator[int]:
            for i in range(100):
                read.append(i)
                yield i

    spec = StreamSpec(batch=1, drop_last=False, window=10, seed=0)
    stream = SampleStream(Counted(), spec, epoch=0)
    first = stream.take(1)
    assert len(read) == 11  # the window, and the sample that took the place of the first out
    assert first[0][0] < 11
    rest = stream.take(1000)
    assert sorted([first[0][0]] + [i for i, _ in rest]) == list(range(100))
    # The sample's id is its position in the stream, here its value.
    assert all(i == s for i, s in rest)


# -- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_a_failing_sample_raises_after_the_batches_before_it(workers: int) -> None:
    loader = DataLoader(Whole(20), 4, transform=fails_on_7, num_workers=workers)
    got: list[list[int]] = []
    with pytest.raises(ValueError, match="seven is bad") as info:
        collect(loader, got)
    assert got == ([[0, 1, 2, 3]] if workers == 0 else [[0, 1, 2, 3], [0, 1, 2, 3]])
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "sample 7" in notes or "sample 14" in notes  # ids: position * 2 + worker
    if workers:
        assert "DataLoader worker" in notes
        assert "traceback" in notes


@pytest.mark.parametrize("workers", [0, 2])
def test_a_failing_sample_is_skipped(workers: int) -> None:
    loader = DataLoader(Split(12), 4, transform=fails_on_7, num_workers=workers, on_error="skip")
    got = flat(loader)
    assert sorted(got) == [x for x in range(12) if x != 7]
    skipped = loader.stats()["skipped"]
    assert len(skipped) == 1
    assert "seven is bad" in skipped[0][1]
    # The id: the position in the stream (with workers, position * num_workers + worker).
    assert skipped[0][0] == 7


@pytest.mark.parametrize("workers", [0, 2])
def test_max_failures_counts_skipped_samples(workers: int) -> None:
    loader = DataLoader(
        Split(40), 4, transform=odd_fails, on_error="skip", max_failures=3, num_workers=workers
    )
    with pytest.raises(TooManyFailuresError, match="max_failures=3"):
        list(loader)
    # Every sample failing raises too, for a dataset of unknown length.
    with pytest.raises(TooManyFailuresError, match="every sample"):
        list(DataLoader(Whole(3), 2, transform=fails_on_7_or_less, on_error="skip"))


def odd_fails(x: int) -> int:
    if x % 2:
        raise ValueError("odd")
    return x


def fails_on_7_or_less(x: int) -> int:
    if x <= 7:
        raise ValueError("small")
    return x


def test_threads_read_the_dataset_on_one_thread_not_the_callers() -> None:
    threads: set[str] = set()

    class Where:
        def __iter__(self) -> Iterator[int]:
            for i in range(50):
                threads.add(threading.current_thread().name)
                yield i

    assert flat(DataLoader(Where(), 4, num_threads=4)) == list(range(50))
    assert len(threads) == 1
    assert threading.current_thread().name not in threads


@pytest.mark.parametrize("workers", [0, 2])
def test_an_iter_that_raises_at_once(workers: int) -> None:
    loader = DataLoader(BadAt(0), 4, num_workers=workers)
    with pytest.raises(OSError, match="cannot open the stream") as info:
        list(loader)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "iter" in notes
    if workers:
        assert "while iterating the dataset, in DataLoader worker" in notes
    # Under skip too: an iterator that failed cannot go on.
    with pytest.raises(OSError):
        list(DataLoader(BadAt(0), 4, num_workers=workers, on_error="skip"))


@pytest.mark.parametrize("workers", [0, 1])
def test_an_iterator_failing_midway(workers: int) -> None:
    got: list[list[int]] = []
    with pytest.raises(KeyError, match="record 9") as info:
        collect(DataLoader(BadAt(9), 4, num_workers=workers), got)
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert "reading sample 9" in "\n".join(info.value.__notes__)


class StallsAt:
    """0..39, a worker's stream stalling for a minute at 9."""

    def __iter__(self) -> Iterator[int]:
        for i in range(40):
            if i == 9 and get_worker_info() is not None:
                time.sleep(60)
            yield i


def test_a_stalled_worker_times_out() -> None:
    start = time.monotonic()
    with pytest.raises(WorkerTimeoutError, match=r"next batch of worker \d") as info:
        list(DataLoader(StallsAt(), 4, num_workers=2, timeout=3.0))
    assert time.monotonic() - start < 40  # a hang guard (the stall is 60 s)
    assert "timeout=3.0" in str(info.value)


def test_a_worker_that_dies_is_named() -> None:
    with pytest.raises(WorkerDiedError, match="SIGKILL") as info:
        list(DataLoader(DiesAt(10), 4, num_workers=2))
    assert "next batch" in str(info.value)
    assert wait_gone([info.value.pid], 30)


# -- resume by replay ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("workers", "method"), [(0, None), (2, "fork"), (3, "spawn")], ids=["threads", "fork", "spawn"]
)
def test_resume_replays_to_exactly_the_rest(workers: int, method: Any) -> None:
    def make() -> DataLoader:
        return DataLoader(
            Blocks(50),
            4,
            shuffle=True,
            shuffle_window=7,
            seed=4,
            num_workers=workers,
            worker_start_method=method,
            transform=jitter,
        )

    whole = [(b[0].tolist(), b[1].tolist()) for b in make()]
    loader = make()
    it = iter(loader)
    head = [next(it) for _ in range(5)]
    state = json.loads(json.dumps(loader.state_dict()))
    del it, head
    gc.collect()
    resumed = make()
    resumed.load_state_dict(state)
    rest = [(b[0].tolist(), b[1].tolist()) for b in resumed]
    assert rest == whole[5:]
    assert resumed.epoch == 1


@pytest.mark.parametrize("workers", [0, 1])
def test_an_iter_drawing_from_the_global_random_resumes(workers: int) -> None:
    whole = flat(DataLoader(ShufflesItsParts(), 4, num_workers=workers, seed=2))
    assert sorted(whole) == list(range(32))
    assert whole != list(range(32))
    loader = DataLoader(ShufflesItsParts(), 4, num_workers=workers, seed=2)
    loader.load_state_dict({**loader.state_dict(), "batches_done": 3})
    assert flat(loader) == whole[12:]


def test_replayed_samples_are_read_not_transformed() -> None:
    seen: list[int] = []

    def record(x: int) -> int:
        seen.append(x)
        return x

    loader = DataLoader(Whole(20), 4, transform=record)
    loader.load_state_dict({**loader.state_dict(), "batches_done": 3})
    assert flat(loader) == list(range(12, 20))
    assert sorted(seen) == list(range(12, 20))


def test_resume_refuses_another_worker_count() -> None:
    state = DataLoader(Whole(20), 4, num_workers=2).state_dict()
    with pytest.raises(ValueError, match="num_workers"):
        DataLoader(Whole(20), 4).load_state_dict(state)


# -- leaving early ----------------------------------------------------------------------------


def test_breaking_early_ends_the_workers() -> None:
    loader = DataLoader(Pids(10_000), 8, num_workers=2, transform=tuple)
    it = iter(loader)
    first = next(it)
    pids = list({int(p) for p in first[0]}) + [w["pid"] for w in _workers(loader)]
    del it, first
    gc.collect()
    assert wait_gone(pids, 30)
    assert loader.stats()["workers"] == {}


def _workers(loader: DataLoader) -> list[dict[str, Any]]:
    workers: list[dict[str, Any]] = loader.stats()["workers"]["workers"]
    return workers


def test_ctrl_c_stops_the_workers() -> None:
    out = ctrl_c_with_workers("test_iterable", "SlowStream", 0.02)
    assert len(out["pids"]) == 2
    assert out["alive"] == [], out
