"""Checks of test_jax_sharding.py, run in a subprocess: ``python jax_sharding_checks.py NAME``.

JAX reads ``XLA_FLAGS`` (8 CPU devices: ``--xla_force_host_platform_device_count=8``) and
``JAX_PLATFORMS`` once, when it starts, and JAX in the pytest process would make the
fork-based tests warn: each check runs in a fresh interpreter that the test starts with
those variables set. A check asserts what it checks, and prints one JSON line with what it
saw for the test to look at too.
"""

from __future__ import annotations

import gc
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import ferrofeed.jax
import jax
import numpy as np
from ferrofeed import DataLoader, ImageFolder, ops
from ferrofeed.samples import image_folder
from jax.sharding import NamedSharding, PartitionSpec

DATA = PartitionSpec("data")


class Pair(NamedTuple):
    """A named tuple in a sample, to see it kept through the sharding."""

    a: np.ndarray
    b: int


def sample(i: int) -> dict[str, Any]:
    """A dict sample with arrays of several dtypes and shapes, a string, a named tuple."""
    return {
        "x": np.full((3,), i, np.float32),
        "y": i,
        "img": np.full((4, 4, 2), i % 256, np.uint8),
        "name": f"s{i}",
        "pair": Pair(np.arange(2, dtype=np.int32) + i, -i),
    }


def samples(n: int) -> list[dict[str, Any]]:
    return [sample(i) for i in range(n)]


def mesh_1d() -> NamedSharding:
    assert jax.device_count() == 8, jax.devices()
    return NamedSharding(jax.make_mesh((8,), ("data",)), DATA)


def mesh_2d() -> NamedSharding:
    """4 x 2 devices, data x model: the batch cut in 4, each piece on 2 devices."""
    return NamedSharding(jax.make_mesh((4, 2), ("data", "model")), DATA)


def arrays(batch: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(path, leaf) of each array leaf, as `ferrofeed.jax.shard_batch` walks them."""
    if isinstance(batch, np.ndarray | jax.Array):
        yield path, batch
    elif isinstance(batch, dict):
        for k, v in batch.items():
            yield from arrays(v, f"{path}[{k!r}]")
    elif isinstance(batch, tuple | list):
        for i, v in enumerate(batch):
            yield from arrays(v, f"{path}[{i}]")


def check_laid_out(got: Any, ref: Any, sharding: NamedSharding) -> int:
    """Assert ``got`` is ``ref`` (the numpy loader's batch) laid out by ``sharding``.

    Every array is a global `jax.Array` with ``sharding``; its values are ``ref``'s; each
    device holds the rows of its place in the mesh along the data axis (devices that differ
    only along other axes hold the same rows). Non-arrays and the containers are kept.
    Returns the number of arrays checked.
    """
    pairs = list(zip(arrays(got), arrays(ref), strict=True))
    assert [p for (p, _), _ in pairs] == [p for _, (p, _) in pairs]
    if isinstance(ref, dict):
        assert list(got) == list(ref)  # the order of the keys too
        for key, value in ref.items():
            if not list(arrays(value)):
                assert got[key] == value, key
        assert type(got["pair"]) is Pair
    mesh = sharding.mesh
    data_axis = mesh.axis_names.index("data")
    for (path, g), (_, r) in pairs:
        assert isinstance(g, jax.Array), path
        assert g.sharding == sharding, (path, g.sharding)
        assert g.shape == r.shape, (path, g.shape, r.shape)
        np.testing.assert_array_equal(np.asarray(g), r, err_msg=path)
        rows = r.shape[0] // mesh.shape["data"]
        for shard in g.addressable_shards:
            place = np.argwhere(mesh.devices == shard.device)[0][data_axis]
            assert shard.index[0] == slice(rows * place, rows * (place + 1)), (path, place)
            np.testing.assert_array_equal(np.asarray(shard.data), r[shard.index], err_msg=path)
    return len(pairs)


def counting_placements() -> list[int]:
    """Count the batches `ferrofeed.jax.shard_batch` places, from now on."""
    placed = [0]
    real = ferrofeed.jax.shard_batch

    def counted(batch: Any, sharding: Any) -> Any:
        placed[0] += 1
        return real(batch, sharding)

    ferrofeed.jax.shard_batch = counted
    return placed


# --------------------------------------------------------------------------------------
# the checks


def pytree() -> dict[str, Any]:
    """A Python-collated dict pytree, over a 1-D and a 2-D mesh, on threads and workers."""
    ds = samples(96)
    out: dict[str, Any] = {}
    for name, sharding, kw in [
        ("1d", mesh_1d(), {}),
        ("2d", mesh_2d(), {}),
        ("1d_workers", mesh_1d(), {"num_workers": 2}),
    ]:
        loader = DataLoader(ds, 16, shuffle=True, seed=5, output="jax", sharding=sharding, **kw)
        ref = DataLoader(ds, 16, shuffle=True, seed=5)
        checked = batches = 0
        for epoch in range(2):
            loader.set_epoch(epoch)
            ref.set_epoch(epoch)
            for got, want in zip(loader, ref, strict=True):
                checked += check_laid_out(got, want, sharding)
                batches += 1
        # epoch_batches too, which leaves the position alone.
        for got, want in zip(loader.epoch_batches(0), ref.epoch_batches(0), strict=True):
            check_laid_out(got, want, sharding)
        loader.shutdown_workers()
        out[name] = {"batches": batches, "arrays": checked}
    return out


def native() -> dict[str, Any]:
    """The native image chain: images and labels laid out, the images never copied."""
    root = tempfile.mkdtemp()
    image_folder(root, 50, classes=3, size=(48, 40))
    kw: dict[str, Any] = {
        "shuffle": True,
        "seed": 2,
        "drop_last": True,
        "num_threads": 2,
        "transform": ops.decode_image(size=32),
    }
    out: dict[str, Any] = {}
    for name, sharding in [("1d", mesh_1d()), ("2d", mesh_2d())]:
        folder = ImageFolder(root)
        ref = list(DataLoader(folder, 16, **kw))
        loader = DataLoader(folder, 16, output="jax", sharding=sharding, **kw)
        aliased = 0
        for (images, labels), (want_images, want_labels) in zip(loader, ref, strict=True):
            check_laid_out((images, labels), (want_images, want_labels), sharding)
            # On CPU devices JAX keeps an aligned host buffer instead of copying it: every
            # shard of the images is then the batch buffer itself, at its rows' offset, so
            # the batch reached the devices with no copy at all (the DLPack handoff, then
            # one device_put per shard that aliases its rows).
            row = images.nbytes // images.shape[0]
            shards = images.addressable_shards
            base = min(s.data.unsafe_buffer_pointer() for s in shards)
            assert base % 64 == 0
            for s in shards:
                assert s.data.unsafe_buffer_pointer() == base + s.index[0].start * row
                aliased += 1
        del images, labels, shards, s
        gc.collect()
        buffers = loader.stats()["buffers"]
        assert buffers["in_use"] == 0, buffers  # every buffer back in its pool
        # Resumed after one batch, with the next two placed ahead: the rest, exactly.
        loader.set_epoch(0)
        it = iter(loader)
        next(it)
        state = loader.state_dict()
        it.close()
        again = DataLoader(folder, 16, output="jax", sharding=sharding, **kw)
        again.load_state_dict(state)
        rest = list(again)
        assert state["batches_done"] == 1
        assert len(rest) == len(ref) - 1
        for got, want in zip(rest, ref[1:], strict=True):
            check_laid_out(got, want, sharding)
        out[name] = {"batches": len(ref), "aliased": aliased, "buffers": buffers}
    return out


def prefetch() -> dict[str, Any]:
    """``device_prefetch=n``: n batches placed ahead of the one the step holds."""
    ds = samples(80)  # 10 batches of 8
    sharding = mesh_1d()
    out: dict[str, Any] = {}
    placed = counting_placements()
    for depth in (None, 0, 1, 2, 4):
        kw = {} if depth is None else {"device_prefetch": depth}
        loader = DataLoader(ds, 8, output="jax", sharding=sharding, **kw)
        placed[0] = 0
        ahead = [placed[0] - (k + 1) for k, _ in enumerate(loader)]
        out[str(depth)] = ahead
        n = 2 if depth is None else depth
        assert ahead == [min(n, 9 - k) for k in range(10)], (depth, ahead)
    return out


def resume() -> dict[str, Any]:
    """A batch placed ahead but not handed out is not done: the resume gives it again."""
    ds = samples(96)  # 12 batches of 8
    sharding = mesh_1d()
    placed = counting_placements()

    def loader() -> DataLoader:
        return DataLoader(ds, 8, shuffle=True, seed=7, output="jax", sharding=sharding)

    full = list(DataLoader(ds, 8, shuffle=True, seed=7))
    first = loader()
    it = iter(first)
    got = [next(it) for _ in range(3)]
    state = first.state_dict()
    assert placed[0] == 5, placed  # 3 handed out, 2 ahead
    assert state["batches_done"] == 3, state
    it.close()  # break: the 2 placed ahead are dropped
    again = loader()
    again.load_state_dict(json.loads(json.dumps(state)))
    rest = list(again)
    assert len(rest) == 9
    for g, want in zip(got + rest, full, strict=True):
        check_laid_out(g, want, sharding)
    # The loader that stopped goes on from where it stopped, too.
    for g, want in zip(first, full[3:], strict=True):
        check_laid_out(g, want, sharding)
    return {"state_batches_done": state["batches_done"], "rest": len(rest)}


class Failing:
    """Samples 0..n-1, ``bad`` raising KeyError."""

    def __init__(self, n: int, bad: int) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        if i == self.bad:
            raise KeyError(i)
        return sample(i)


def thread_names() -> list[str]:
    return sorted(t.name for t in threading.enumerate())


def settles(baseline: list[str]) -> list[str]:
    """The threads once the loader's are joined (polled: a stop may take a moment)."""
    deadline = time.monotonic() + 10
    while thread_names() != baseline and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    return thread_names()


def errors_and_shutdown() -> dict[str, Any]:
    """An error ahead is raised in its place; break, an error and del leave no thread."""
    sharding = mesh_1d()
    out: dict[str, Any] = {}
    # Warm up: JAX's own threads start at first use.
    list(DataLoader(samples(16), 8, output="jax", sharding=sharding))
    baseline = settles(thread_names())

    # Sample 27 fails: batch 3 (of 8 each) is where its error is raised, after batches
    # 0-2, although the loader placed ahead up to it before handing out batch 1.
    loader = DataLoader(Failing(64, 27), 8, output="jax", sharding=sharding, num_threads=2)
    got = []
    try:
        for batch in loader:
            got.append(np.asarray(batch["y"]).tolist())
    except KeyError as e:
        out["error"] = repr(e)
    assert got == [list(range(8 * b, 8 * b + 8)) for b in range(3)], got
    assert loader.state_dict()["batches_done"] == 3
    assert settles(baseline) == baseline, "threads left after an error"

    loader = DataLoader(samples(64), 8, output="jax", sharding=sharding, num_threads=2)
    for _ in loader:
        break
    assert settles(baseline) == baseline, "threads left after a break"
    assert loader.state_dict()["batches_done"] == 1

    it = iter(DataLoader(samples(64), 8, output="jax", sharding=sharding, num_threads=2))
    next(it)
    del it  # the generator holds the loader: dropping it drops both
    assert settles(baseline) == baseline, "threads left after del"

    # Bad input, each named.
    ds = samples(32)
    refusals: dict[str, str] = {}
    for name, kw, kind in [
        ("output", {"output": "numpy", "sharding": sharding}, ValueError),
        ("not_a_sharding", {"output": "jax", "sharding": DATA}, TypeError),
        ("indivisible", {"output": "jax", "sharding": sharding, "batch_size": 12}, ValueError),
        ("no_batch", {"output": "jax", "sharding": sharding, "batch_size": None}, ValueError),
        ("device", {"output": "jax", "sharding": sharding, "device": "cpu"}, ValueError),
        ("skip", {"output": "jax", "sharding": sharding, "on_error": "skip"}, ValueError),
        ("ranks", {"output": "jax", "sharding": sharding, "world_size": 2}, ValueError),
        ("depth", {"output": "jax", "sharding": sharding, "device_prefetch": -1}, ValueError),
        ("depth_type", {"output": "jax", "sharding": sharding, "device_prefetch": 1.5}, ValueError),
    ]:
        args = {"batch_size": 8, **kw}
        try:
            DataLoader(ds, **args)
        except kind as e:
            refusals[name] = str(e)
        else:
            raise AssertionError(f"{name}: no {kind.__name__}")
    out["refusals"] = refusals

    # Found as the batches come: a last batch the mesh does not divide, a leaf without a
    # batch axis. The error names the array, after the batches before it.
    short = []
    try:
        for batch in DataLoader(samples(20), 8, output="jax", sharding=sharding):
            short.append(batch["x"].shape[0])
    except ValueError as e:
        out["partial"] = str(e)
    assert short == [8, 8], short

    def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
        return {"x": np.stack([s["x"] for s in items]), "count": np.array(len(items), np.int32)}

    try:
        next(iter(DataLoader(ds, 8, collate=collate, output="jax", sharding=sharding)))
    except ValueError as e:
        out["scalar"] = str(e)
    assert settles(baseline) == baseline, "threads left after a placement error"
    return out


def multiprocess() -> dict[str, Any]:
    """One of two processes joined by jax.distributed (argv: process id, port)."""
    pid, port = int(sys.argv[2]), int(sys.argv[3])
    jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=pid)
    assert jax.process_count() == 2
    assert jax.local_device_count() == 4
    sharding = NamedSharding(jax.make_mesh((8,), ("data",)), DATA)
    # rank and world_size come from JAX.
    loader = DataLoader(samples(96), 8, shuffle=True, seed=4, output="jax", sharding=sharding)
    assert (loader.rank, loader.world_size) == (pid, 2)
    batches = []
    for batch in loader:
        x = batch["x"]
        assert x.shape == (16, 3)
        assert x.sharding == sharding
        rows: dict[int, list[float]] = {}
        for s in x.addressable_shards:
            start = s.index[0].start
            for k, value in enumerate(np.asarray(s.data)[:, 0].tolist()):
                rows[start + k] = value
        batches.append({str(k): v for k, v in sorted(rows.items())})
    jax.distributed.shutdown()
    return {"process": pid, "batches": batches}


def gpu() -> dict[str, Any]:
    """On the GPUs JAX sees: every batch laid out over all of them, values as on the host."""
    devices = [d for d in jax.devices() if d.platform == "gpu"]
    if not devices:
        return {"skip": "JAX has no GPU here"}
    sharding = NamedSharding(jax.make_mesh((len(devices),), ("data",), devices=devices), DATA)
    ds = samples(16 * len(devices) * 4)
    loader = DataLoader(ds, 16 * len(devices), shuffle=True, output="jax", sharding=sharding)
    ref = DataLoader(ds, 16 * len(devices), shuffle=True)
    n = sum(check_laid_out(g, r, sharding) for g, r in zip(loader, ref, strict=True))
    return {"devices": len(devices), "arrays": n}


CHECKS: dict[str, Callable[[], dict[str, Any]]] = {
    "pytree": pytree,
    "native": native,
    "prefetch": prefetch,
    "resume": resume,
    "errors_and_shutdown": errors_and_shutdown,
    "multiprocess": multiprocess,
    "gpu": gpu,
}

if __name__ == "__main__":
    print(json.dumps(CHECKS[sys.argv[1]]()), flush=True)
