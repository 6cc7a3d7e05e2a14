"""DataLoader(num_workers=N): worker processes, shared batch slots, seeds, faults."""

from __future__ import annotations

import collections
import faulthandler
import gc
import json
import os
import pickle
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import ferrofeed
import numpy as np
import pytest
from conftest import Indexed, Stalls, assert_slots_reused, ctrl_c_with_workers, wait_gone
from ferrofeed import (
    DataLoader,
    SharedList,
    WorkerDiedError,
    WorkerTimeoutError,
    _worker_process,
    get_worker_info,
)

METHODS = ["fork", "spawn", "forkserver"]

# JAX (imported by other test modules of the session) warns at every fork; the tests that
# ask for fork explicitly ignore that warning (the default start method avoids fork then).
pytestmark = pytest.mark.filterwarnings(r"ignore:os\.fork\(\) was called:RuntimeWarning")

Point = collections.namedtuple("Point", "x y")
TESTS_DIR = Path(__file__).resolve().parent


# -- datasets (module level, so spawn and forkserver workers can unpickle them) -----------


class Numbers:
    """Sample i: a dict of a float32 array, an int, a random draw and a string."""

    def __init__(self, n: int = 40) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "x": np.full((2, 3), i, np.float32),
            "y": i,
            "py_random": random.random(),
            "np_random": float(np.random.random()),
            "name": f"s{i}",
        }


class Pids:
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[int, int]:
        info = get_worker_info()
        assert info is not None
        assert info.dataset is not None
        return (os.getpid(), info.id)


class Points:
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> Point:
        return Point(np.arange(3, dtype=np.float32) + i, i)


class Failing(Indexed):
    """Raises KeyError on sample `bad`."""

    def __init__(self, bad: int, n: int = 32) -> None:
        self.bad, self.n = bad, n

    def __getitem__(self, i: int) -> int:
        if i == self.bad:
            raise KeyError(f"no sample {i}")
        return i


class Dies(Indexed):
    """Kills its own worker with `sig` at sample `bad`."""

    def __init__(self, bad: int, sig: int) -> None:
        self.bad, self.sig = bad, sig

    def __getitem__(self, i: int) -> int:
        if i == self.bad:
            # A fork worker inherits pytest's faulthandler, whose traceback of this
            # deliberate SIGSEGV would reach the terminal under pytest-xdist.
            faulthandler.disable()
            os.kill(os.getpid(), self.sig)
            time.sleep(10)
        return i


class Slow(Indexed):
    """Every sample takes `delay` seconds."""

    def __init__(self, delay: float, n: int = 1000) -> None:
        self.delay, self.n = delay, n

    def __getitem__(self, i: int) -> int:
        time.sleep(self.delay)
        return i


class CountsPickles:
    """Counts how often it is unpickled, in a file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> int:
        return i

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        with open(self.path, "a") as f:
            f.write("x")


class ArenaView:
    """Reads a SharedList; reports the arena file's inode and whether it is mapped."""

    def __init__(self, meta: SharedList) -> None:
        self.meta = meta

    def __len__(self) -> int:
        return len(self.meta)

    def __getitem__(self, i: int) -> dict[str, Any]:
        path = self.meta.path
        with open("/proc/self/maps") as f:
            mapped = path in f.read()
        return {
            "label": self.meta[i]["label"],
            "inode": os.stat(path).st_ino,
            "mapped": int(mapped),
            "pid": os.getpid(),
        }


def init_marks(worker_id: int) -> None:
    info = get_worker_info()
    assert info is not None
    assert info.id == worker_id
    os.environ["FERROFEED_TEST_INIT"] = f"{worker_id}:{os.getpid()}"


class InitSeen:
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> str:
        return os.environ.get("FERROFEED_TEST_INIT", "")


def cuda_in_fork(x: int) -> int:
    raise RuntimeError("Cannot re-initialize CUDA in forked subprocess.")


def torch_collate(samples: list[int]) -> Any:
    import torch

    return {"t": torch.tensor(samples, dtype=torch.int64), "n": len(samples)}


def _worker_pids(loader: DataLoader) -> list[int]:
    return [w["pid"] for w in loader.stats()["workers"]["workers"]]


# -- the same batches as threads ---------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_batches_match_threads_under_every_start_method(method: str) -> None:
    kw: dict[str, Any] = {"shuffle": True, "seed": 5}
    threads = [b for b in DataLoader(Numbers(), 6, **kw)]
    loader = DataLoader(Numbers(), 6, num_workers=2, worker_start_method=method, **kw)
    workers = list(loader)
    assert len(workers) == len(threads) == 7
    for a, b in zip(workers, threads, strict=True):
        np.testing.assert_array_equal(a["x"], b["x"])
        np.testing.assert_array_equal(a["y"], b["y"])
        assert a["name"] == b["name"]
        assert a["x"].dtype == np.float32
        assert a["x"].flags.writeable


def test_order_is_sampler_order_whatever_the_worker_speeds() -> None:
    class Jitter(Slow):
        def __getitem__(self, i: int) -> int:
            time.sleep(0.002 * (i % 5))
            return i

    loader = DataLoader(Jitter(0, 60), 4, shuffle=True, seed=1, num_workers=3)
    got = [int(v) for b in loader for v in b]
    expected = [int(v) for b in DataLoader(list(range(60)), 4, shuffle=True, seed=1) for v in b]
    assert got == expected


def test_batch_size_positional_and_drop_last() -> None:
    loader = DataLoader(list(range(10)), 4, drop_last=True, num_workers=2)
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]


# -- randomness -----------------------------------------------------------------------------


def test_random_augmentations_reproduce_for_any_worker_count() -> None:
    def draws(n: int) -> list[tuple[float, float]]:
        loader = DataLoader(Numbers(), 5, shuffle=True, seed=11, num_workers=n)
        return [
            (float(p), float(q))
            for b in loader
            for p, q in zip(b["py_random"], b["np_random"], strict=True)
        ]

    one, two, three = draws(1), draws(2), draws(3)
    assert one == two == three
    assert len(set(one)) == len(one), "every sample draws its own numbers"


def test_random_draws_depend_on_seed_and_epoch() -> None:
    loader = DataLoader(Numbers(), 40, num_workers=2, persistent_workers=True)
    try:
        (first_batch,) = list(loader)
        first = first_batch["py_random"].tolist()
        (second_batch,) = list(loader)  # epoch 1
        second = second_batch["py_random"].tolist()
        assert first != second
        again = next(iter(loader.epoch_batches(0)))["py_random"].tolist()
        assert again == first
        other = DataLoader(Numbers(), 40, seed=1, num_workers=2)
        assert next(iter(other))["py_random"].tolist() != first
    finally:
        loader.shutdown_workers()


def test_sample_seed_is_pinned() -> None:
    # The same golden values as the Rust unit test: augmentations must not change
    # between releases.
    assert ferrofeed._core.sample_seed(0, 0, 0) == 16894410173589626229
    assert ferrofeed._core.sample_seed(42, 3, 1_000_000) == 7443091746617491268


def test_slot_pinning_without_a_driver_says_why_and_keeps_plain_memory() -> None:
    ring = ferrofeed._core._SlotRing()
    reason = ring.pin_for_cuda()
    if reason is None:
        pytest.skip("a CUDA driver is present (tests/test_gpu.py covers pinned slots)")
    assert reason == ferrofeed._core.pinned_memory_status()[1]
    slot = ring.create()
    assert ring.acquire() == slot
    os.ftruncate(ring.fd(slot), 4096)
    lease = ring.lease(slot, 100)
    assert not lease.pinned
    stats = ring.stats()
    assert (stats["pinned"], stats["pin_error"]) == (0, None)


def test_mix_seed_is_pinned() -> None:
    # ferrofeed's one seed mixer (src/seed.rs), pinned by the same golden values as its
    # Rust unit tests: per-sample seeds are its "sample" stream, random crops its "crop"
    # stream.
    mix_seed = ferrofeed._core.mix_seed
    top = 2**64 - 1
    assert mix_seed(0, 0, 0, "sample") == 16894410173589626229
    assert mix_seed(top, top, top, "sample") == 12625010139469418024
    assert mix_seed(0, 0, 0, "crop") == 11492569862326130707
    assert mix_seed(7, 1, 3, "crop") == 3522167460412779704
    assert mix_seed(top, top, top, "crop") == 15917774939899584926
    # a random flip: the top bit of the "flip" stream of the image's (crop) seed
    assert mix_seed(0, 0, 0, "flip") == 7597842688844317922
    assert mix_seed(7, 1, 3, "flip") == 1284616718397077426
    for args in [(0, 0, 0), (5, 2, 99), (top, 0, 1)]:
        assert mix_seed(*args, "sample") == ferrofeed._core.sample_seed(*args)
    with pytest.raises(ValueError, match="stream"):
        mix_seed(0, 0, 0, "shuffle")  # type: ignore[arg-type]


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_torch_generator_is_seeded_per_sample(method: str) -> None:
    # TorchRandom imports torch inside __getitem__: a spawned or forkserver worker must
    # still seed torch before its first sample (it imports the main process's generator
    # modules at start), or that sample's draw would depend on the worker count.
    torch = pytest.importorskip("torch")

    def draws(workers: int) -> list[float]:
        loader = DataLoader(
            TorchRandom(),
            4,
            num_workers=workers,
            worker_start_method=method,  # type: ignore[arg-type]
        )
        return [float(v) for b in loader for v in b]

    a, b = draws(2), draws(1)
    assert a == b
    assert len(set(a)) == len(a)
    assert torch is not None


class TorchRandom:
    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> float:
        import torch

        return float(torch.rand(1).item())


# -- worker info and init -----------------------------------------------------------------


def test_get_worker_info_and_worker_init_fn() -> None:
    assert get_worker_info() is None
    loader = DataLoader(InitSeen(), 1, num_workers=2, worker_init_fn=init_marks)
    marks = {str(b[0]) for b in loader}
    ids = {m.split(":")[0] for m in marks}
    assert ids == {"0", "1"}, marks
    assert all(int(m.split(":")[1]) != os.getpid() for m in marks)


def test_worker_info_fields() -> None:
    loader = DataLoader(Pids(), 4, num_workers=2)
    seen = {(int(p), int(w)) for b in loader for p, w in zip(b[0], b[1], strict=True)}
    assert {w for _, w in seen} == {0, 1}
    assert os.getpid() not in {p for p, _ in seen}


def test_worker_init_fn_failure_surfaces() -> None:
    loader = DataLoader(list(range(4)), 2, num_workers=1, worker_init_fn=bad_init)
    with pytest.raises(ValueError, match="init failed") as info:
        list(loader)
    assert any("worker_init_fn" in n for n in info.value.__notes__)


def bad_init(worker_id: int) -> None:
    raise ValueError("init failed")


# -- the dataset reaches the workers once ---------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_shared_list_is_mapped_not_copied(method: str, arena_dir: Path) -> None:
    with SharedList(({"label": i} for i in range(50)), path=arena_dir / "meta.arena") as meta:
        inode = os.stat(meta.path).st_ino
        loader = DataLoader(ArenaView(meta), 10, num_workers=2, worker_start_method=method)
        batches = list(loader)
        assert sorted(int(v) for b in batches for v in b["label"]) == list(range(50))
        assert {int(v) for b in batches for v in b["inode"]} == {inode}
        assert all(int(v) == 1 for b in batches for v in b["mapped"])
        assert os.getpid() not in {int(v) for b in batches for v in b["pid"]}


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_dataset_is_pickled_once_per_worker(method: str, tmp_path: Path) -> None:
    counter = tmp_path / "unpickled"
    counter.touch()
    loader = DataLoader(
        CountsPickles(str(counter)),
        2,
        num_workers=2,
        worker_start_method=method,
        persistent_workers=True,
    )
    try:
        for _ in range(3):
            assert len(list(loader)) == 8
        assert counter.read_text() == "xx", "once per worker, not per batch or epoch"
    finally:
        loader.shutdown_workers()


class GcProbe:
    """Sample 0: the worker's USS; sample 1: its USS after a full garbage collection."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> int:
        if i == 1:
            gc.collect()
        return ferrofeed.memory.process_memory().uss


def test_fork_workers_collecting_garbage_do_not_copy_the_parents_heap(run_python: Any) -> None:
    # A forked worker shares its parent's heap copy-on-write. A full collection in the
    # worker writes to the header of every container object it inherited (the torch
    # modules a training process imports, a list of dicts...), which copied those pages
    # into every worker over time: benches/ram_loaders.py measured +41 MiB per worker.
    proc = run_python(
        """
        import gc, json
        from ferrofeed import DataLoader
        from ferrofeed.memory import process_memory
        from test_workers import GcProbe

        heap = [[i, [i]] for i in range(300_000)]  # ~40 MiB of containers
        gc.collect()
        base = process_memory().uss
        loader = DataLoader(GcProbe(), 1, num_workers=1, worker_start_method="fork")
        before, after = (int(b[0]) for b in loader)
        print(json.dumps({"growth": after - before, "heap": base}))
        """,
        timeout=60,
        cwd=TESTS_DIR,
    )
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["heap"] > 40 * 2**20, out  # the heap is there to be copied
    assert out["growth"] < 4 * 2**20, out  # without the fix: ~40 MiB


def test_unpicklable_transform_under_spawn_says_why() -> None:
    loader = DataLoader(
        list(range(4)), 2, num_workers=1, worker_start_method="spawn", transform=lambda x: x
    )
    with pytest.raises(Exception) as info:
        list(loader)
    assert any("picklable" in n for n in getattr(info.value, "__notes__", []))


def test_lambdas_work_under_fork() -> None:
    loader = DataLoader(
        list(range(6)), 3, num_workers=2, transform=lambda x: x * 10, worker_start_method="fork"
    )
    assert [b.tolist() for b in loader] == [[0, 10, 20], [30, 40, 50]]


# -- shared slots: zero copy, reuse, kept batches ------------------------------------------


def _lease_of(arr: np.ndarray) -> Any:
    base = arr
    while getattr(base, "base", None) is not None:
        base = base.base
        if isinstance(base, memoryview):
            return base.obj
    return base


def test_batches_live_in_shared_slots_and_slots_are_reused() -> None:
    loader = DataLoader(Numbers(200), 8, num_workers=2, persistent_workers=True)
    try:
        for b in loader:
            assert isinstance(_lease_of(b["x"]), ferrofeed._core._SlotLease)
            del b
        assert_slots_reused(loader, 25)
    finally:
        loader.shutdown_workers()


def test_batches_kept_by_the_consumer_are_never_overwritten() -> None:
    loader = DataLoader(Numbers(120), 4, num_workers=2, persistent_workers=True)
    try:
        kept = list(loader)  # every batch held at once: the ring grows instead
        for k, b in enumerate(kept):
            np.testing.assert_array_equal(b["y"], np.arange(4 * k, 4 * k + 4))
            assert (b["x"][:, 0, 0] == b["y"]).all()
        assert loader.stats()["workers"]["slots"]["slots"] >= 30
        del kept, b
        gc.collect()
        assert loader.stats()["workers"]["slots"]["leased"] == 0, "freed when dropped"
    finally:
        loader.shutdown_workers()


def test_views_keep_the_slot() -> None:
    loader = DataLoader(Numbers(40), 4, num_workers=1, persistent_workers=True)
    try:
        it = iter(loader)
        view = next(it)["x"][1:, 0]  # a view of the batch outlives the batch
        expected = view.copy()
        assert sum(1 for _ in it) == 9
        np.testing.assert_array_equal(view, expected)
        assert loader.stats()["workers"]["slots"]["leased"] == 1
    finally:
        loader.shutdown_workers()


def test_consumer_writes_stay_in_its_batch() -> None:
    loader = DataLoader(Numbers(16), 4, num_workers=1)
    for b in loader:
        b["x"] += 1  # writable, like a batch from threads
        assert (b["x"][:, 0, 0] == b["y"] + 1).all()


def test_torch_output_is_zero_copy() -> None:
    torch = pytest.importorskip("torch")
    loader = DataLoader(Numbers(16), 4, num_workers=2, output="torch")
    for b in loader:
        assert isinstance(b["x"], torch.Tensor)
        assert b["x"].dtype == torch.float32
        assert b["x"].data_ptr() % 64 == 0
        assert isinstance(b["name"], list)


def test_named_tuples_with_every_output() -> None:
    for output in ("numpy", "torch", "jax"):
        if output != "numpy":
            pytest.importorskip(output)
        loader = DataLoader(Points(), 5, num_workers=2, output=output)  # type: ignore[arg-type]
        batches = list(loader)
        assert type(batches[0]) is Point
        assert np.asarray(batches[1].x).shape == (5, 3)
        assert np.asarray(batches[1].y).tolist() == [5, 6, 7, 8, 9]


def test_jax_output() -> None:
    pytest.importorskip("jax")
    import jax

    loader = DataLoader(Numbers(8), 4, num_workers=1, output="jax")
    b = next(iter(loader))
    assert isinstance(b["x"], jax.Array)
    assert b["x"].shape == (4, 2, 3)


def test_user_collate_returning_torch_tensors() -> None:
    torch = pytest.importorskip("torch")
    loader = DataLoader(list(range(8)), 4, num_workers=2, collate=torch_collate)
    batches = list(loader)
    assert isinstance(batches[0]["t"], torch.Tensor)
    assert batches[1]["t"].tolist() == [4, 5, 6, 7]
    assert batches[1]["n"] == 4


def test_non_array_batches_fall_back_to_pickling() -> None:
    loader = DataLoader(
        ["a", "b", "c"],
        2,
        num_workers=1,
        worker_start_method="fork",
        collate=lambda s: {"s": s, "o": object},
    )
    assert [b["s"] for b in loader] == [["a", "b"], ["c"]]


def test_header_encoding_round_trip() -> None:
    batch = {
        "a": np.arange(6, dtype=np.int16).reshape(2, 3),
        "p": Point(np.ones(2, np.float64), "text"),
        "l": [np.zeros(0, np.float32), 3, ("x", np.array([True, False]))],
        "o": np.array(["u", "v"], dtype=object),
    }
    header = _worker_process._encode(batch, None)  # no slot: everything pickled
    assert header[0] == "p"
    assert pickle.loads(pickle.dumps(header))[1]["a"].tolist() == batch["a"].tolist()


# -- order of errors and batches ---------------------------------------------------------------


def test_worker_exception_keeps_its_type_and_traceback() -> None:
    loader = DataLoader(Failing(bad=9), 4, num_workers=2)
    got: list[list[int]] = []

    def consume() -> None:
        for b in loader:
            got.append(b.tolist())

    with pytest.raises(KeyError, match="no sample 9") as info:
        consume()
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7]], "the batches before the failing one come first"
    notes = "\n".join(info.value.__notes__)
    assert "sample 9" in notes
    assert "pid" in notes
    assert "Traceback" in notes
    assert "__getitem__" in notes


def test_skip_in_workers_records_the_sample() -> None:
    loader = DataLoader(Failing(bad=5, n=8), 4, num_workers=2, on_error="skip")
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 6, 7]]
    assert [i for i, _ in loader.stats()["skipped"]] == [5]
    assert "KeyError" in loader.stats()["skipped"][0][1]


def test_fork_worker_touching_cuda_gets_a_clear_note() -> None:
    loader = DataLoader(
        list(range(4)), 2, num_workers=1, transform=cuda_in_fork, worker_start_method="fork"
    )
    with pytest.raises(RuntimeError) as info:
        list(loader)
    assert any("device=" in n and "spawn" in n for n in info.value.__notes__)


# -- resume and persistence -----------------------------------------------------------------


def test_state_dict_resume_with_workers() -> None:
    kw: dict[str, Any] = {"shuffle": True, "seed": 3, "num_workers": 2}
    full = [b["y"].tolist() for b in DataLoader(Numbers(), 6, **kw)]
    loader = DataLoader(Numbers(), 6, **kw)
    it = iter(loader)
    first = [next(it)["y"].tolist() for _ in range(3)]
    state = loader.state_dict()
    del it
    resumed = DataLoader(Numbers(), 6, **kw)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    rest = [b["y"].tolist() for b in resumed]
    assert first + rest == full
    # Random draws resume exactly too: they depend on (seed, epoch, index) only.
    draws = [b["py_random"].tolist() for b in DataLoader(Numbers(), 6, **kw)]
    resumed2 = DataLoader(Numbers(), 6, **kw)
    resumed2.load_state_dict(state)
    assert [b["py_random"].tolist() for b in resumed2] == draws[3:]


def test_persistent_workers_stay_between_epochs() -> None:
    loader = DataLoader(Numbers(16), 4, num_workers=2, persistent_workers=True)
    try:
        list(loader)
        pids = _worker_pids(loader)
        list(loader)
        assert _worker_pids(loader) == pids
        # Leaving an epoch early keeps them too; the next iteration resumes the epoch
        # (what was in flight for the abandoned one is dropped when it comes back).
        it = iter(loader)
        first = next(it)["y"].tolist()
        del it
        assert _worker_pids(loader) == pids
        rest = [b["y"].tolist() for b in loader]
        assert [first, *rest] == [b["y"].tolist() for b in loader.epoch_batches(2)]
    finally:
        loader.shutdown_workers()
    assert wait_gone(pids, 30)


def test_non_persistent_workers_end_with_the_epoch() -> None:
    loader = DataLoader(Pids(), 8, num_workers=2)
    pids = {int(p) for b in loader for p in b[0]}
    assert len(pids) == 2
    assert wait_gone(list(pids), 30)
    assert loader.stats()["workers"] == {}


def test_dropping_the_iterator_ends_the_workers() -> None:
    loader = DataLoader(Pids(), 8, num_workers=2)
    it = iter(loader)
    batch = next(it)
    pids = list({int(p) for p in batch[0]})
    del it
    gc.collect()
    assert wait_gone(pids, 30)


def test_dropping_the_loader_ends_persistent_workers() -> None:
    loader = DataLoader(Pids(), 8, num_workers=2, persistent_workers=True)
    list(loader)
    pids = _worker_pids(loader)
    del loader
    gc.collect()
    assert wait_gone(pids, 30)


# -- faults ----------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV])
def test_worker_killed_by_a_signal_is_named(sig: int) -> None:
    loader = DataLoader(Dies(bad=13, sig=sig), 4, num_workers=2)
    start = time.monotonic()
    with pytest.raises(WorkerDiedError) as info:
        list(loader)
    # A guard against a hang, not a timing target: on a GPU machine, after CUDA is up in
    # the main process, workers are forked and reaped more slowly, and a SIGSEGV may dump
    # core first (5.1 s seen there; well under 1 s here).
    assert time.monotonic() - start < 20
    err = info.value
    assert err.signal == sig
    assert err.exitcode == -sig
    assert 13 in err.indices
    assert f"pid {err.pid}" in str(err)
    assert signal.Signals(sig).name in str(err)
    assert "13" in str(err)
    assert wait_gone(_pids_of_loader_children(), 30)


def _pids_of_loader_children() -> list[int]:
    import multiprocessing

    return [p.pid for p in multiprocessing.active_children() if p.pid is not None]


def test_timeout_turns_a_stalled_batch_into_an_error() -> None:
    # 3 s: every batch but the stalled one takes ~0, even on a loaded machine.
    loader = DataLoader(Stalls(16, at=9, seconds=60), 4, num_workers=2, timeout=3.0)
    start = time.monotonic()
    with pytest.raises(WorkerTimeoutError, match=r"timeout=3\.0") as info:
        list(loader)
    assert time.monotonic() - start < 40  # a hang guard (the stall is 60 s)
    assert "9" in str(info.value)
    assert "pid" in str(info.value)
    assert isinstance(info.value, TimeoutError)


def _slow_start(worker_id: int) -> None:
    time.sleep(6.0)


def test_timeout_does_not_count_a_workers_start() -> None:
    # The worker takes 6 s to start (worker_init_fn); each batch then takes ~0: a 3 s
    # timeout bounds the batches, not the start-up (and leaves a loaded machine room).
    loader = DataLoader(list(range(8)), 4, num_workers=1, timeout=3.0, worker_init_fn=_slow_start)
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_ctrl_c_stops_the_workers() -> None:
    out = ctrl_c_with_workers("test_workers", "Slow", 0.05)
    # The workers are stopped before KeyboardInterrupt reaches the caller. The epoch (1000
    # samples of 50 ms on 2 workers) would last 25 s: the bounds are hang guards.
    assert out["alive"] == [], out
    assert out["raised_after"] < 15, out
    assert out["stopped_in"] < 15, out


def test_workers_exit_when_the_main_process_is_killed(run_python: Any) -> None:
    before = set(os.listdir("/dev/shm"))
    for method in ("fork", "forkserver"):
        proc = run_python(
            f"""
            import os, signal, sys
            from ferrofeed import DataLoader
            from test_workers import Slow

            loader = DataLoader(Slow(0.01), 4, num_workers=2, persistent_workers=True,
                                worker_start_method={method!r})
            it = iter(loader)
            next(it)
            print(os.getpid(), *(w["pid"] for w in loader.stats()["workers"]["workers"]),
                  flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
            """,
            check=False,
            timeout=60,
            cwd=TESTS_DIR,
        )
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        main_pid, *pids = [int(p) for p in proc.stdout.split()]
        assert len(pids) == 2
        assert wait_gone(pids, 30), f"{method}: workers outlived their parent"
        # Only what these processes made counts (other processes of the machine may be
        # using /dev/shm meanwhile): ferrofeed's files there carry their creator's pid.
        ours = {
            n
            for n in set(os.listdir("/dev/shm")) - before
            if any(f"-{p}-" in n for p in (main_pid, *pids))
        }
        assert ours == set(), f"{method}: left in /dev/shm: {ours}"


def test_interpreter_exit_ends_the_workers(run_python: Any) -> None:
    proc = run_python(
        """
        from ferrofeed import DataLoader
        from test_workers import Slow

        loader = DataLoader(Slow(0.01), 4, num_workers=2, persistent_workers=True)
        it = iter(loader)
        next(it)
        print(" ".join(str(w["pid"]) for w in loader.stats()["workers"]["workers"]))
        """,
        timeout=60,
        cwd=TESTS_DIR,
    )
    pids = [int(p) for p in proc.stdout.split()]
    assert wait_gone(pids, 30)


def test_argument_checks() -> None:
    with pytest.raises(ValueError, match="num_workers"):
        DataLoader([1], num_workers=-1)
    with pytest.raises(ValueError, match="worker_start_method"):
        DataLoader([1], num_workers=1, worker_start_method="thread")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        DataLoader([1], num_workers=1, timeout=0)
    with pytest.raises(ValueError, match="prefetch_factor"):
        DataLoader([1], num_workers=1, prefetch_factor=0)


def test_top_level_exports() -> None:
    assert ferrofeed.get_worker_info is get_worker_info
    assert issubclass(WorkerDiedError, ferrofeed.WorkerError)
    assert issubclass(WorkerTimeoutError, TimeoutError)
    assert sys.modules["ferrofeed._workers"].WorkerInfo is ferrofeed.WorkerInfo
