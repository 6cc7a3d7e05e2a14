"""`ferrofeed.DataLoader` (map-style datasets); `default_collate` alone is in test_collate.py.

Sharding by rank, shuffling, determinism across thread counts, exact resume in a new
process, ``batches_per_epoch``, epochs, torch and JAX output, collation, bad samples,
progress, time to first batch, argument checks and shutdown when a loop breaks early.

JAX is only ever imported in subprocesses: importing it here breaks the fork tests elsewhere
(its threads make ``os.fork`` warn, and warnings are errors).
"""

from __future__ import annotations

import collections
import gc
import importlib.util
import json
import logging
import math
import random
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pytest
from conftest import Stalls
from ferrofeed import DataLoader, PipelineError, TooManyFailuresError, default_collate
from thread_counts import settle_threads, thread_counts

RunPython = Callable[..., subprocess.CompletedProcess[str]]


def batches_of(loader: Iterable[Any]) -> list[list[Any]]:
    """The batches of one iteration, as lists (batches are 1-D arrays of indices)."""
    return [np.asarray(b).tolist() for b in loader]


def flat(batches: Iterable[Iterable[Any]]) -> list[Any]:
    return [x for b in batches for x in b]


def epoch_order(n: int, *, shuffle: bool, seed: int, epoch: int = 0) -> list[int]:
    """The whole epoch's order, as a single-process loader with one batch sees it."""
    loader = DataLoader(list(range(n)), batch_size=n, shuffle=shuffle, seed=seed)
    (batch,) = batches_of(loader.epoch_batches(epoch))
    assert sorted(batch) == list(range(n))
    return batch


# --------------------------------------------------------------------------------------
# sharding by rank

SHARD_SIZES = (1, 2, 3, 5, 7, 10, 13, 24)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
@pytest.mark.parametrize("drop_last", [False, True], ids=["pad", "drop"])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_rank_sharding_covers_never_overlaps_equal_batches(
    world: int, drop_last: bool, shuffle: bool
) -> None:
    seed = 5
    for n in SHARD_SIZES:
        perm = epoch_order(n, shuffle=shuffle, seed=seed)
        if not shuffle:
            assert perm == list(range(n))
        for bs in (1, 3, 4):
            where = f"n={n} world={world} batch_size={bs} drop_last={drop_last}"
            per_rank: list[list[list[int]]] = []
            lengths = []
            for rank in range(world):
                loader = DataLoader(
                    list(range(n)),
                    batch_size=bs,
                    shuffle=shuffle,
                    seed=seed,
                    drop_last=drop_last,
                    rank=rank,
                    world_size=world,
                    num_threads=2,
                )
                per_rank.append(batches_of(loader))
                lengths.append(len(loader))

            # Every rank sees the same number of batches, and len(loader) says it.
            counts = [len(b) for b in per_rank]
            assert counts == lengths, where
            assert len(set(counts)) == 1, f"{where}: batches per rank {counts}"
            samples = [flat(b) for b in per_rank]
            sizes = {len(s) for s in samples}
            assert len(sizes) == 1, f"{where}: samples per rank {[len(s) for s in samples]}"
            per = sizes.pop()
            for rank_batches in per_rank:
                assert all(1 <= len(b) <= bs for b in rank_batches), where
                # only the last batch of a rank may be short
                assert all(len(b) == bs for b in rank_batches[:-1]), where

            everything = flat(samples)
            if drop_last:
                kept = (n // world) // bs * bs
                assert per == kept, where
                assert counts[0] == kept // bs, where
                assert all(len(b) == bs for rb in per_rank for b in rb), where
                # no duplicates at all, and together the ranks hold the kept part
                assert len(set(everything)) == len(everything), where
                assert set(everything) == set(perm[: world * kept]), where
            else:
                assert per == math.ceil(n / world), where
                assert counts[0] == math.ceil(per / bs), where
                # Covers the dataset; the only duplicates are the wrap-around padding.
                assert set(everything) == set(range(n)), where
                pad = world * per - n
                assert len(everything) - len(set(everything)) == pad, where
                extra = collections.Counter(everything) - collections.Counter(range(n))
                wrapped = collections.Counter(perm[p % n] for p in range(n, n + pad))
                assert extra == wrapped, f"{where}: padding {extra} is not wrap-around"
            # Rank r takes positions r, r + W, r + 2W, ... of the epoch's order.
            order = [samples[r][j] for j in range(per) for r in range(world)]
            expected = [perm[p % n] for p in range(world * per)]
            assert order == expected, where


@pytest.mark.timeout(30)
def test_rank_and_world_size_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    loader = DataLoader(list(range(9)), batch_size=3)
    assert (loader.rank, loader.world_size) == (2, 3)
    assert batches_of(loader) == [[2, 5, 8]]
    explicit = DataLoader(list(range(9)), batch_size=3, rank=0, world_size=1)
    assert (explicit.rank, explicit.world_size) == (0, 1)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    single = DataLoader(list(range(9)), batch_size=3)
    assert (single.rank, single.world_size) == (0, 1)
    assert len(single) == 3


# --------------------------------------------------------------------------------------
# shuffling and determinism


@pytest.mark.timeout(30)
def test_shuffle_new_permutation_every_epoch_reproducible_by_seed() -> None:
    n = 50
    loader = DataLoader(list(range(n)), batch_size=7, shuffle=True, seed=11)
    e0 = batches_of(loader)
    e1 = batches_of(loader)
    assert [len(b) for b in e0] == [7] * 7 + [1]
    assert sorted(flat(e0)) == list(range(n))
    assert sorted(flat(e1)) == list(range(n))
    assert flat(e0) != list(range(n)), "shuffle=True gave the dataset order"
    assert flat(e0) != flat(e1), "epoch 1 repeated epoch 0's permutation"

    # the same (seed, epoch) gives the same batches, in a fresh loader too
    again = DataLoader(list(range(n)), batch_size=7, shuffle=True, seed=11)
    assert batches_of(again) == e0
    again.set_epoch(1)
    assert batches_of(again) == e1
    assert batches_of(again.epoch_batches(0)) == e0

    # different seeds give different orders
    orders = {
        tuple(flat(DataLoader(list(range(n)), batch_size=7, shuffle=True, seed=s)))
        for s in range(5)
    }
    assert len(orders) == 5


@pytest.mark.timeout(30)
def test_no_shuffle_gives_dataset_order_every_epoch() -> None:
    data = [10 * i for i in range(11)]
    loader = DataLoader(data, batch_size=4, shuffle=False, seed=99)
    expected = [[0, 10, 20, 30], [40, 50, 60, 70], [80, 90, 100]]
    assert batches_of(loader) == expected
    assert batches_of(loader) == expected
    loader.set_epoch(7)
    assert batches_of(loader) == expected


def _jittery(sample: int) -> dict[str, Any]:
    time.sleep(random.random() * 0.002)
    return {"i": sample, "x": np.full((2,), sample, np.float32)}


@pytest.mark.timeout(60)
def test_same_batches_whatever_num_threads() -> None:
    n = 61
    runs = {}
    for threads in (1, 2, 8):
        loader = DataLoader(
            list(range(n)),
            batch_size=4,
            shuffle=True,
            seed=7,
            transform=_jittery,
            num_threads=threads,
        )
        epochs = []
        for _ in range(2):
            epoch = []
            for b in loader:
                assert b["x"].tolist() == [[float(i)] * 2 for i in b["i"].tolist()]
                epoch.append(b["i"].tolist())
            epochs.append(epoch)
        runs[threads] = epochs
    assert sorted(flat(runs[1][0])) == list(range(n))
    assert runs[1][0] != runs[1][1]
    assert runs[2] == runs[1]
    assert runs[8] == runs[1]


# --------------------------------------------------------------------------------------
# exact resume in a new process

RESUME_SNIPPET = """
import json, sys
from ferrofeed import DataLoader
cfg = json.loads(sys.argv[1])
state = json.loads(sys.argv[2])
n = cfg.pop("n")
loader = DataLoader(list(range(n)), num_threads=1, **cfg)
loader.load_state_dict(state)
first = [b.tolist() for b in loader]
epoch_after_first = loader.epoch
second = [b.tolist() for b in loader]
print(json.dumps({"first": first, "second": second, "epoch": epoch_after_first}))
"""

RESUME_CASES = {
    "mid-epoch": ({"n": 23, "batch_size": 4, "shuffle": True, "seed": 3}, 0, 2),
    "rank1of3": (
        {"n": 23, "batch_size": 3, "shuffle": True, "seed": 8, "rank": 1, "world_size": 3},
        0,
        1,
    ),
    "rank2of3-drop": (
        {
            "n": 31,
            "batch_size": 2,
            "shuffle": True,
            "seed": 4,
            "rank": 2,
            "world_size": 3,
            "drop_last": True,
        },
        1,
        3,
    ),
    "batches_per_epoch-boundary": (
        {"n": 10, "batch_size": 3, "shuffle": True, "seed": 1, "batches_per_epoch": 5},
        1,
        2,
    ),
    "batches_per_epoch-rank1of2": (
        {
            "n": 11,
            "batch_size": 2,
            "shuffle": True,
            "seed": 2,
            "batches_per_epoch": 4,
            "rank": 1,
            "world_size": 2,
        },
        2,
        3,
    ),
    "after-last-batch": ({"n": 9, "batch_size": 2, "shuffle": True, "seed": 6}, 0, 5),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(RESUME_CASES))
def test_resume_in_new_process_continues_exactly(
    case: str, run_python: RunPython, last_json_line: Callable[[str], Any]
) -> None:
    cfg, full_epochs, k = RESUME_CASES[case]
    kw = {key: v for key, v in cfg.items() if key != "n"}
    loader = DataLoader(list(range(cfg["n"])), num_threads=4, **kw)
    for _ in range(full_epochs):  # cross epoch boundaries before the interruption
        assert len(batches_of(loader)) == len(loader)
    it = iter(loader)
    taken = [next(it).tolist() for _ in range(k)]
    state = loader.state_dict()
    assert json.loads(json.dumps(state)) == state, "state_dict is not JSON-serialisable"
    assert state["epoch"] == full_epochs
    rest = batches_of(it)
    assert len(taken) + len(rest) == len(loader)
    assert loader.epoch == full_epochs + 1
    following = batches_of(loader)

    proc = run_python(RESUME_SNIPPET, args=[json.dumps(cfg), json.dumps(state)], timeout=60)
    resumed = last_json_line(proc.stdout)
    assert resumed["first"] == rest
    assert resumed["epoch"] == full_epochs + 1
    assert resumed["second"] == following


@pytest.mark.timeout(30)
def test_resume_in_same_process_after_load_state_dict() -> None:
    data = list(range(40))
    loader = DataLoader(data, batch_size=3, shuffle=True, seed=12)
    full = batches_of(loader.epoch_batches(0))
    it = iter(loader)
    for _ in range(4):
        next(it)
    state = loader.state_dict()
    assert state["batches_done"] == 4
    fresh = DataLoader(data, batch_size=3, shuffle=True, seed=12, num_threads=1)
    fresh.load_state_dict(state)
    assert batches_of(fresh) == full[4:]
    assert batches_of(it) == full[4:]


STATE_MISMATCHES = {
    "seed": {"seed": 2},
    "shuffle": {"shuffle": False},
    "batch_size": {"batch_size": 4},
    "drop_last": {"drop_last": True},
    "rank": {"rank": 1, "world_size": 2},
    "world_size": {"world_size": 3},
    "dataset_len": {"n": 21},
    "batches_per_epoch": {"batches_per_epoch": 3},
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("change", list(STATE_MISMATCHES))
def test_load_state_dict_rejects_other_configuration(change: str) -> None:
    base: dict[str, Any] = {"n": 20, "batch_size": 3, "shuffle": True, "seed": 1}

    def make(cfg: dict[str, Any]) -> DataLoader:
        cfg = dict(cfg)
        return DataLoader(list(range(cfg.pop("n"))), **cfg)

    source = make(base)
    it = iter(source)
    next(it)
    state = source.state_dict()
    del it
    other = make({**base, **STATE_MISMATCHES[change]})
    before = other.state_dict()
    with pytest.raises(ValueError):
        other.load_state_dict(state)
    assert other.state_dict() == before, "a rejected state changed the loader"
    # and the same configuration accepts it
    make(base).load_state_dict(state)


@pytest.mark.timeout(30)
def test_load_state_dict_rejects_unknown_version() -> None:
    loader = DataLoader(list(range(10)), batch_size=2)
    state = loader.state_dict()
    with pytest.raises(ValueError):
        loader.load_state_dict({**state, "version": 999})


# --------------------------------------------------------------------------------------
# batches_per_epoch, epochs


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("n", "bs", "bpe", "shuffle", "rank", "world"),
    [
        (10, 3, 5, True, 0, 1),  # epochs longer than a pass (4 batches)
        (10, 3, 2, True, 0, 1),  # shorter than a pass
        (23, 4, 7, False, 0, 1),
        (7, 2, 1, True, 0, 1),
        (11, 2, 4, True, 1, 2),
        (13, 2, 3, True, 2, 3),
    ],
)
def test_batches_per_epoch_continues_through_data_stream(
    n: int, bs: int, bpe: int, shuffle: bool, rank: int, world: int
) -> None:
    kw: dict[str, Any] = {
        "batch_size": bs,
        "shuffle": shuffle,
        "seed": 3,
        "rank": rank,
        "world_size": world,
    }
    loader = DataLoader(list(range(n)), batches_per_epoch=bpe, **kw)
    assert len(loader) == bpe
    k = 5
    epochs = []
    for e in range(k):
        assert loader.epoch == e
        epochs.append(batches_of(loader))
        assert len(epochs[-1]) == bpe, f"epoch {e} has {len(epochs[-1])} batches"
    assert loader.epoch == k

    plain = DataLoader(list(range(n)), **kw)
    stream: list[list[int]] = []
    e = 0
    while len(stream) < k * bpe:
        stream += batches_of(plain.epoch_batches(e))
        e += 1
    assert flat(epochs) == stream[: k * bpe]
    # a random access to one epoch agrees with the sequential run
    assert batches_of(loader.epoch_batches(3)) == epochs[3]


@pytest.mark.timeout(30)
def test_set_epoch_and_auto_advance() -> None:
    loader = DataLoader(list(range(20)), batch_size=6, shuffle=True, seed=4)
    reference = {e: batches_of(loader.epoch_batches(e)) for e in (0, 1, 5, 6)}
    assert loader.epoch == 0
    assert batches_of(loader) == reference[0]
    assert loader.epoch == 1
    assert batches_of(loader) == reference[1]
    assert loader.epoch == 2
    loader.set_epoch(5)
    assert loader.epoch == 5
    assert loader.state_dict()["batches_done"] == 0
    assert batches_of(loader) == reference[5]
    assert loader.epoch == 6
    assert batches_of(loader) == reference[6]


@pytest.mark.timeout(30)
def test_set_epoch_discards_a_resume_point() -> None:
    data = list(range(20))
    loader = DataLoader(data, batch_size=3, shuffle=True, seed=4)
    it = iter(loader)
    next(it)
    next(it)
    state = loader.state_dict()
    del it
    fresh = DataLoader(data, batch_size=3, shuffle=True, seed=4)
    fresh.load_state_dict(state)
    fresh.set_epoch(2)
    assert batches_of(fresh) == batches_of(loader.epoch_batches(2))


@pytest.mark.timeout(30)
def test_epoch_batches_does_not_change_state() -> None:
    data = list(range(30))
    loader = DataLoader(data, batch_size=4, shuffle=True, seed=9)
    full0 = batches_of(loader.epoch_batches(0))
    assert loader.epoch == 0
    assert loader.state_dict()["batches_done"] == 0

    # mid-iteration: epoch_batches in between does not disturb the running epoch
    it = iter(loader)
    got = [next(it).tolist() for _ in range(3)]
    before = loader.state_dict()
    other = batches_of(loader.epoch_batches(4))
    assert other != full0
    assert loader.state_dict() == before
    assert got + batches_of(it) == full0
    assert loader.epoch == 1

    # after load_state_dict: a resume point survives epoch_batches
    fresh = DataLoader(data, batch_size=4, shuffle=True, seed=9)
    fresh.load_state_dict(before)
    state = fresh.state_dict()
    assert batches_of(fresh.epoch_batches(0)) == full0
    assert batches_of(fresh.epoch_batches(1)) != full0
    assert fresh.state_dict() == state
    assert batches_of(fresh) == full0[3:]


# --------------------------------------------------------------------------------------
# shutdown when a loop breaks early


@pytest.mark.timeout(30)
def test_break_mid_epoch_stops_threads_and_resumes_where_state_says() -> None:
    data = list(range(60))
    loader = DataLoader(data, batch_size=4, shuffle=True, seed=3, num_threads=4)
    full = batches_of(loader.epoch_batches(0))
    gc.collect()
    time.sleep(0.05)
    base = thread_counts()

    def consume(stop_after: int) -> list[list[int]]:
        out = []
        for i, batch in enumerate(loader):
            out.append(batch.tolist())
            if i + 1 == stop_after:
                break
        return out

    got = consume(3)
    assert got == full[:3]
    after = settle_threads(base)
    assert after == base, f"threads (python, os) still running after break: {after} vs {base}"

    state = loader.state_dict()
    assert (state["epoch"], state["batches_done"]) == (0, 3)
    fresh = DataLoader(data, batch_size=4, shuffle=True, seed=3)
    fresh.load_state_dict(state)
    expected = batches_of(fresh)
    assert expected == full[3:]
    assert batches_of(loader) == expected, (
        "the next iteration after a break does not continue from where state_dict() says"
    )
    assert settle_threads(base) == base


# --------------------------------------------------------------------------------------
# time to first batch


class CountingDataset:
    """A huge map-style dataset that only counts reads."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        assert 0 <= index < self.n
        with self._lock:
            self.calls += 1
        return index


@pytest.mark.timeout(60)
@pytest.mark.parametrize("threads", [1, 4])
def test_first_batch_reads_do_not_depend_on_dataset_size(threads: int) -> None:
    # Reads ahead are bounded by the pipeline's queues, not by len(dataset): measured about
    # 22 batches (num_threads >= 2) to 37 batches (num_threads=1) of read-ahead here.
    bs = 16
    bound = 40 * bs + 128
    calls = {}
    for n in (10**4, 10**12):
        ds = CountingDataset(n)
        loader = DataLoader(ds, batch_size=bs, shuffle=True, seed=1, num_threads=threads)
        assert len(loader) == math.ceil(n / bs)
        assert ds.calls == 0, "building the loader read samples"
        it = iter(loader)
        first = next(it)
        assert first.shape == (bs,)
        assert len(set(first.tolist())) == bs
        time.sleep(0.3)  # let the read-ahead fill up to its bound
        calls[n] = ds.calls
        assert bs <= ds.calls <= bound, f"len={n}: {ds.calls} reads for the first batch"
        assert loader.state_dict()["dataset_len"] == n
        del it
    assert calls[10**12] <= bound


# --------------------------------------------------------------------------------------
# torch


@pytest.mark.timeout(60)
def test_torch_dataset_used_unchanged_and_torch_output() -> None:
    torch = pytest.importorskip("torch")

    class TorchDataset(torch.utils.data.Dataset):  # type: ignore[misc]
        def __init__(self, n: int) -> None:
            self.n = n

        def __len__(self) -> int:
            return self.n

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {
                "x": torch.full((3, 4), float(i)),
                "img": torch.full((2, 2), i % 256, dtype=torch.uint8),
                "y": i,
                "name": f"s{i}",
            }

    ds = TorchDataset(10)
    loader = DataLoader(ds, batch_size=4, shuffle=True, seed=2, output="torch")
    as_numpy = DataLoader(ds, batch_size=4, shuffle=True, seed=2, output="numpy")
    reference = list(as_numpy)
    got = list(loader)
    assert [len(b["y"]) for b in got] == [4, 4, 2]
    assert sorted(flat(b["y"].tolist() for b in got)) == list(range(10))
    for batch, ref in zip(got, reference, strict=True):
        x, img, y = batch["x"], batch["img"], batch["y"]
        assert isinstance(x, torch.Tensor)
        assert isinstance(img, torch.Tensor)
        assert isinstance(y, torch.Tensor)
        assert isinstance(ref["x"], np.ndarray)
        m = len(y)
        assert (x.dtype, tuple(x.shape)) == (torch.float32, (m, 3, 4))
        assert (img.dtype, tuple(img.shape)) == (torch.uint8, (m, 2, 2))
        assert (y.dtype, tuple(y.shape)) == (torch.int64, (m,))
        assert x.device.type == "cpu"
        assert batch["name"] == [f"s{i}" for i in y.tolist()]
        assert y.tolist() == ref["y"].tolist()
        for i, label in enumerate(y.tolist()):
            assert torch.equal(x[i], torch.full((3, 4), float(label)))
            assert img[i].tolist() == [[label % 256] * 2] * 2
        # pooled 64-byte aligned buffers, handed over without a copy
        for t in (x, img, y):
            assert t.is_contiguous()
            assert t.data_ptr() % 64 == 0, f"{t.dtype} batch not 64-byte aligned"


@pytest.mark.timeout(60)
def test_torch_tensor_dataset_used_unchanged() -> None:
    torch = pytest.importorskip("torch")
    features = torch.arange(20, dtype=torch.float32).reshape(10, 2)
    labels = torch.arange(10, dtype=torch.int64) * 3
    ds = torch.utils.data.TensorDataset(features, labels)
    loader = DataLoader(ds, batch_size=3, output="torch")
    assert len(loader) == 4
    got = list(loader)
    assert all(isinstance(b, tuple) and len(b) == 2 for b in got)
    assert torch.equal(torch.cat([b[0] for b in got]), features)
    assert torch.equal(torch.cat([b[1] for b in got]), labels)
    assert got[0][0].data_ptr() % 64 == 0
    assert got[0][1].data_ptr() % 64 == 0


@pytest.mark.timeout(30)
def test_device_cuda_without_gpu_is_a_value_error() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(ValueError, match="cuda"):
        DataLoader(list(range(4)), output="torch", device="cuda")
    with pytest.raises(ValueError):
        DataLoader(list(range(4)), output="torch", device="cuda:0")


# --------------------------------------------------------------------------------------
# JAX (in a subprocess)

JAX_SNIPPET = """
import json
import numpy as np
import jax
from ferrofeed import DataLoader

ds = [
    {"x": np.full((2, 3), i, np.float32), "m": np.uint8(i), "y": i, "h": np.float16(i)}
    for i in range(10)
]
loader = DataLoader(ds, batch_size=4, shuffle=True, seed=5, output="jax")
ref = list(DataLoader(ds, batch_size=4, shuffle=True, seed=5, output="numpy"))
out = {"batches": [], "errors": []}
for batch, r in zip(loader, ref, strict=True):
    info = {}
    for key, value in batch.items():
        info[key] = {
            "jax": isinstance(value, jax.Array),
            "dtype": str(value.dtype),
            "shape": list(value.shape),
            "equal": bool(np.array_equal(np.asarray(value), r[key])),
        }
    info["y"]["values"] = np.asarray(batch["y"]).tolist()
    info["x"]["aligned"] = batch["x"].unsafe_buffer_pointer() % 64 == 0
    out["batches"].append(info)
try:
    DataLoader(ds, output="jax", device="no-such-backend")
except ValueError as e:
    out["errors"].append("ValueError")
print(json.dumps(out))
"""


@pytest.mark.timeout(180)
def test_jax_output_arrays(run_python: RunPython, last_json_line: Callable[[str], Any]) -> None:
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed")
    out = last_json_line(run_python(JAX_SNIPPET, timeout=150).stdout)
    batches = out["batches"]
    assert [b["x"]["shape"][0] for b in batches] == [4, 4, 2]
    ys = flat(b["y"]["values"] for b in batches)
    assert sorted(ys) == list(range(10))
    assert ys != list(range(10))
    for b in batches:
        m = b["x"]["shape"][0]
        for key, field in b.items():
            assert field["jax"], f"{key} is not a jax.Array"
            assert field["equal"], f"{key} differs from the numpy batch"
        assert (b["x"]["dtype"], b["x"]["shape"]) == ("float32", [m, 2, 3])
        assert (b["m"]["dtype"], b["m"]["shape"]) == ("uint8", [m])
        assert (b["h"]["dtype"], b["h"]["shape"]) == ("float16", [m])
        assert b["y"]["dtype"] in ("int32", "int64")  # int32 unless jax_enable_x64
        assert b["x"]["aligned"]
    assert out["errors"] == ["ValueError"]


# --------------------------------------------------------------------------------------
# bad samples


class FlakyDataset:
    def __init__(self, n: int, bad: set[int]) -> None:
        self.n, self.bad = n, bad
        self.raised: dict[int, Exception] = {}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i in self.bad:
            e = ValueError(f"bad sample {i}")
            self.raised[i] = e
            raise e
        return i


@pytest.mark.timeout(30)
def test_on_error_skip_leaves_samples_out_and_lists_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="ferrofeed.loader")
    ds = FlakyDataset(12, {2, 3, 7})
    loader = DataLoader(ds, batch_size=3, on_error="skip", num_threads=2)
    assert batches_of(loader) == [[0, 1], [4, 5], [6, 8], [9, 10, 11]]
    stats = loader.stats()
    skipped = sorted((int(i), r) for i, r in stats["skipped"])
    assert [i for i, _ in skipped] == [2, 3, 7]
    for i, reason in skipped:
        assert "ValueError" in reason
        assert f"bad sample {i}" in reason
    assert stats["skipped_count"] == 3
    assert isinstance(stats["pipeline"], dict)
    assert stats["pipeline"], "stats() has no pipeline figures after an epoch"
    records = [
        r for r in caplog.records if r.name == "ferrofeed.loader" and r.levelno == logging.WARNING
    ]
    logged = sorted(
        i for i in (2, 3, 7) if any(f"bad sample {i}" in r.getMessage() for r in records)
    )
    assert logged == [2, 3, 7]
    assert len(records) == 3


@pytest.mark.timeout(30)
def test_on_error_skip_whole_batch_skipped_then_resume() -> None:
    """A batch whose every sample fails must not shift the resume point."""
    bad = {2, 3}
    loader = DataLoader(FlakyDataset(12, bad), batch_size=2, on_error="skip", num_threads=2)
    it = iter(loader)
    taken = [next(it).tolist() for _ in range(2)]
    assert taken == [[0, 1], [4, 5]]
    state = loader.state_dict()
    rest = batches_of(it)
    assert rest == [[6, 7], [8, 9], [10, 11]]
    fresh = DataLoader(FlakyDataset(12, bad), batch_size=2, on_error="skip", num_threads=1)
    fresh.load_state_dict(state)
    assert batches_of(fresh) == rest


@pytest.mark.timeout(30)
def test_on_error_raise_gives_the_original_exception() -> None:
    ds = FlakyDataset(12, {5})
    loader = DataLoader(ds, batch_size=2, on_error="raise", num_threads=2)
    got = []
    with pytest.raises(ValueError, match="bad sample 5") as info:  # noqa: PT012
        for batch in loader:
            got.append(batch.tolist())
    # The batches before the failing one come out first, then the error.
    assert got == [[0, 1], [2, 3]]
    original = info.value
    assert original is ds.raised[5], "the user's exception itself, not a wrapper"
    assert not isinstance(original, PipelineError)
    notes = getattr(original, "__notes__", [])
    assert any("5" in note and "sample" in note for note in notes), notes
    assert any("load" in note for note in notes), notes
    assert loader.stats()["skipped"] == []


@pytest.mark.timeout(60)
def test_thread_timeout_turns_a_stuck_sample_into_timeout_error() -> None:
    release = threading.Event()

    loader = DataLoader(
        Stalls(8, at=5, seconds=30, release=release), batch_size=2, num_threads=2, timeout=0.5
    )
    got = []
    t0 = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match="timeout") as info:  # noqa: PT012
            for batch in loader:
                got.append(batch.tolist())
        assert time.monotonic() - t0 < 20, "the stuck call was waited for"
    finally:
        release.set()
    assert got == [[0, 1], [2, 3]]
    assert any("5" in note for note in getattr(info.value, "__notes__", [])), info.value


class _StuckAt:
    """Samples 0..n-1; loading one of ``stuck`` waits until ``release`` is set."""

    def __init__(self, n: int, stuck: set[int], release: threading.Event) -> None:
        self.n, self.stuck, self.release = n, stuck, release

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i in self.stuck:
            self.release.wait(30)
        return i


@pytest.mark.timeout(60)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("stuck", "expected"),
    [
        ({5}, [[0, 1], [2, 3], [4], [6, 7]]),
        ({2, 3}, [[0, 1], [4, 5], [6, 7]]),  # a whole batch lost: nothing of it comes out
        ({6, 7}, [[0, 1], [2, 3], [4, 5]]),  # lost at the end of the epoch
        ({0, 4, 7}, [[1], [2, 3], [5], [6]]),
    ],
)
def test_thread_timeout_under_skip_skips_the_stuck_samples(
    threads: int, stuck: set[int], expected: list[list[int]]
) -> None:
    release = threading.Event()
    loader = DataLoader(
        _StuckAt(8, stuck, release), 2, num_threads=threads, timeout=0.3, on_error="skip"
    )
    t0 = time.monotonic()
    try:
        got = [b.tolist() for b in loader]
        took = time.monotonic() - t0
    finally:
        release.set()
    assert got == expected
    assert took < 20, "waited for the stuck calls"
    skipped = loader.stats()["skipped"]
    assert sorted(i for i, _ in skipped) == sorted(stuck)
    assert all("TimeoutError" in reason for _, reason in skipped), skipped


@pytest.mark.timeout(60)
def test_thread_timeouts_count_against_max_failures() -> None:
    release = threading.Event()
    loader = DataLoader(
        _StuckAt(12, {1, 5, 9}, release),
        2,
        num_threads=2,
        timeout=0.3,
        on_error="skip",
        max_failures=2,
    )
    got = []
    try:
        with pytest.raises(TooManyFailuresError, match="max_failures=2"):  # noqa: PT012
            for batch in loader:
                got.append(batch.tolist())
    finally:
        release.set()
    assert got == [[0], [2, 3], [4], [6, 7]]  # the third loss (sample 9) trips it


def test_key_error_is_caught_by_except_key_error() -> None:
    class Missing:
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> int:
            raise KeyError(i)

    caught = None
    try:
        list(DataLoader(Missing(), 2))
    except KeyError as e:  # a plain `except KeyError:` catches it, as with PyTorch
        caught = e
    assert caught is not None
    assert caught.args[0] in range(4)


def test_max_failures_bounds_the_skips() -> None:
    ds = FlakyDataset(40, set(range(0, 40, 3)))  # 14 bad samples
    loader = DataLoader(ds, 4, on_error="skip", max_failures=5, num_threads=1)
    with pytest.raises(TooManyFailuresError, match="max_failures=5"):
        list(loader)
    assert len(loader.stats()["skipped"]) == 6
    unbounded = DataLoader(ds, 4, on_error="skip", max_failures=None)
    assert sum(len(b) for b in unbounded) == 40 - 14
    default = DataLoader(ds, 4, on_error="skip")
    assert default.max_failures == 10
    with pytest.raises(TooManyFailuresError):
        list(default)


def test_an_epoch_of_only_failures_raises() -> None:
    ds = FlakyDataset(6, set(range(6)))
    loader = DataLoader(ds, 2, on_error="skip", max_failures=None)
    with pytest.raises(TooManyFailuresError, match="every sample of epoch 0 failed"):
        list(loader)


def test_batch_size_none_hands_out_samples() -> None:
    samples = [{"x": np.arange(3) + i, "y": i} for i in range(5)]
    loader = DataLoader(samples, None, shuffle=True, seed=2)
    got = list(loader)
    assert len(loader) == len(got) == 5
    assert sorted(s["y"] for s in got) == list(range(5))
    assert got[0]["x"].shape == (3,)
    torch = pytest.importorskip("torch")
    as_torch = list(DataLoader(samples, None, output="torch"))
    assert isinstance(as_torch[1]["x"], torch.Tensor)
    assert as_torch[1]["y"] == 1
    with pytest.raises(TypeError, match="no collate"):
        DataLoader(samples, None, collate=default_collate)


# --------------------------------------------------------------------------------------
# progress


@pytest.mark.timeout(30)
def test_progress_bar_on(capsys: pytest.CaptureFixture[str]) -> None:
    loader = DataLoader(list(range(10)), batch_size=3, progress=True)
    assert len(batches_of(loader)) == 4
    err = capsys.readouterr().err
    assert "4/4" in err
    if importlib.util.find_spec("tqdm") is None:
        assert "epoch 0" in err
        assert "batch/s" in err
        assert "[" + "#" * 30 + "]" in err
    else:
        assert "batch" in err


@pytest.mark.timeout(30)
def test_progress_plain_bar_without_tqdm(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm -> ImportError
    loader = DataLoader(list(range(10)), batch_size=3, progress=True)
    assert len(batches_of(loader)) == 4
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err
    for k in range(1, 5):
        assert f"{k}/4" in err
    assert "epoch 0" in err
    assert "batch/s" in err
    assert err.endswith("\n")


@pytest.mark.timeout(30)
def test_progress_uses_tqdm_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[tuple[str, Any]] = []

    class FakeTqdm:
        def __init__(self, *, total: int, desc: str, unit: str) -> None:
            events.append(("init", (total, desc, unit)))

        def update(self, n: int = 1) -> None:
            events.append(("update", n))

        def close(self) -> None:
            events.append(("close", None))

    fake = types.ModuleType("tqdm")
    fake.tqdm = FakeTqdm  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tqdm", fake)
    loader = DataLoader(list(range(10)), batch_size=3, progress=True)
    batches_of(loader)
    assert events[0][0] == "init"
    assert events[0][1][0] == 4
    assert events[1:] == [("update", 1)] * 4 + [("close", None)]


@pytest.mark.timeout(30)
def test_progress_off_writes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    loader = DataLoader(list(range(10)), batch_size=3, progress=False)
    assert len(batches_of(loader)) == 4
    captured = capsys.readouterr()
    assert captured.err == ""
    assert captured.out == ""


# --------------------------------------------------------------------------------------
# arguments


def _gen() -> Any:
    yield from range(3)


@pytest.mark.parametrize("source", [5, None], ids=["int", "none"])
def test_source_must_be_map_style_or_iterable(source: Any) -> None:
    with pytest.raises(TypeError, match="iterable dataset"):
        DataLoader(source)


def test_an_object_with_iter_and_no_getitem_is_an_iterable_dataset() -> None:
    # Read as PyTorch reads an IterableDataset (tests/test_iterable.py).
    assert DataLoader({1, 2, 3}).iterable


@pytest.mark.parametrize("source", [_gen(), iter([1, 2])], ids=["gen", "iter"])
def test_an_iterator_is_refused_since_it_can_be_read_once(source: Any) -> None:
    with pytest.raises(TypeError, match="can be read once"):
        DataLoader(source)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_size": 0},
        {"batch_size": -2},
        {"batch_size": 2.5},
        {"prefetch": 0},
        {"batches_per_epoch": 0},
        {"output": "tensorflow"},
        {"output": "numpy", "device": "cpu"},
        {"on_error": "ignore"},
        {"rank": 2, "world_size": 2},
        {"rank": 5, "world_size": 4},
        {"rank": -1, "world_size": 2},
        {"rank": 0, "world_size": 0},
    ],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()),
)
def test_invalid_arguments_are_value_errors(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        DataLoader(list(range(8)), **kwargs)


def test_len_is_batches_per_epoch_for_this_rank() -> None:
    assert len(DataLoader(list(range(10)), batch_size=3)) == 4
    assert len(DataLoader(list(range(10)), batch_size=3, drop_last=True)) == 3
    assert len(DataLoader(list(range(10)), batch_size=3, batches_per_epoch=9)) == 9
    assert len(DataLoader(list(range(10)), batch_size=2, rank=1, world_size=3)) == 2
    assert len(DataLoader(list(range(10)), batch_size=4, rank=2, world_size=3)) == 1
    assert len(DataLoader(list(range(10)), batch_size=4, world_size=3, drop_last=True)) == 0
    assert batches_of(DataLoader(list(range(10)), batch_size=4, world_size=3, drop_last=True)) == []


@pytest.mark.parametrize(
    ("key", "value"),
    [("batches_done", 99), ("batches_done", -1), ("epoch", -2), ("epoch", "3"), ("epoch", 1.5)],
)
def test_load_state_dict_refuses_positions_out_of_range(key: str, value: object) -> None:
    loader = DataLoader(list(range(10)), 4)
    state = {**loader.state_dict(), key: value}
    with pytest.raises(ValueError, match=key):
        loader.load_state_dict(state)
    assert loader.state_dict()["batches_done"] == 0, "nothing changed"
