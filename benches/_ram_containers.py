"""The containers benches/ram_study.py compares (its `NumpySerializedList`, ferrofeed's
``SharedList``; `build_container`), and their random-access latency and sanity checks
(`run_latency`).
"""

from __future__ import annotations

import gc
import os
import pickle
import random
import statistics
import time
from collections.abc import Iterable
from typing import Any

import ferrofeed
import numpy as np
import numpy.typing as npt
from _ram_common import MEM_FIELDS, MIB, Json, coco_annotations, read_mem, smaps_rollup

GETITEM_RATIO_TARGET = 1.2  # SharedList[i] / pickle.loads(bytes)
RAW_TARGET_NS = 500.0  # SharedList.raw(i)
LATENCY_CHUNK = 10_000  # latency benchmarks are interleaved in chunks of this many accesses


class NumpySerializedList:
    """The study's list: pickled items concatenated in one uint8 array plus end offsets."""

    def __init__(self, items: Iterable[Any]) -> None:
        arrays = [np.frombuffer(pickle.dumps(x, protocol=-1), dtype=np.uint8) for x in items]
        self._addr: npt.NDArray[np.int64] = np.cumsum([len(a) for a in arrays], dtype=np.int64)
        self._lst: npt.NDArray[np.uint8] = (
            np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.uint8)
        )

    def __len__(self) -> int:
        return len(self._addr)

    def __getitem__(self, idx: int) -> Any:
        start = 0 if idx == 0 else self._addr[idx - 1]
        end = self._addr[idx]
        return pickle.loads(self._lst[start:end].data)  # memoryview of the slice, no copy

    @property
    def nbytes(self) -> int:
        return int(self._lst.nbytes + self._addr.nbytes)


def build_container(kind: str, n: int, seed: int, arena_dir: str) -> tuple[Any, int | None]:
    """Build the dataset container ``kind``; return it and its data size (None if unknown)."""
    if kind == "baseline":
        return [], None
    items = coco_annotations(n, seed)
    if kind == "naive":
        return list(items), None
    if kind == "numpy":
        nsl = NumpySerializedList(items)
        return nsl, nsl.nbytes
    if kind == "shared":
        sl = ferrofeed.SharedList(items, path=arena_dir)
        return sl, int(sl.nbytes)
    raise ValueError(f"unknown container {kind!r}")


def _loop_getitem(seq: Any, idxs: list[int]) -> int:
    t0 = time.perf_counter_ns()
    for i in idxs:
        x = seq[i]
    t1 = time.perf_counter_ns()
    del x
    return t1 - t0


def _loop_loads(blobs: list[bytes], _idxs: list[int]) -> int:
    loads = pickle.loads
    t0 = time.perf_counter_ns()
    for b in blobs:
        x = loads(b)
    t1 = time.perf_counter_ns()
    del x
    return t1 - t0


def _loop_raw(sl: Any, idxs: list[int]) -> int:
    t0 = time.perf_counter_ns()
    for i in idxs:
        x = sl.raw(i)
    t1 = time.perf_counter_ns()
    del x
    return t1 - t0


def _loop_empty(_seq: Any, idxs: list[int]) -> int:
    t0 = time.perf_counter_ns()
    for i in idxs:
        x = i
    t1 = time.perf_counter_ns()
    del x
    return t1 - t0


def sanity_checks(sl: Any, items: list[Any], blobs: list[bytes]) -> list[Json]:
    """Quick checks of the SharedList contract on the benchmark data."""
    checks: list[Json] = []

    def check(name: str, ok: bool, detail: str = "") -> None:
        checks.append({"name": name, "ok": bool(ok), "detail": detail})

    n = len(items)
    probe = sorted({0, n // 2, n - 1, *random.Random(7).sample(range(n), min(n, 200))})
    check("len(sl) == N", len(sl) == n, f"len={len(sl)} N={n}")
    bad = [i for i in probe if sl[i] != items[i]]
    check("sl[i] == item", not bad, f"{len(bad)} of {len(probe)} differ, e.g. {bad[:5]}")
    bad = [i for i in probe if blobs[i] != pickle.dumps(items[i], protocol=5)]
    check(
        "raw(i) == pickle.dumps(item, protocol=5)",
        not bad,
        f"{len(bad)} of {len(probe)} differ, e.g. {bad[:5]}",
    )
    check("raw(i) is read-only", sl.raw(0).readonly is True)
    check("sl[-1] == items[-1]", sl[-1] == items[-1])
    check(
        "nbytes == file size",
        sl.nbytes == os.path.getsize(sl.path),
        f"nbytes={sl.nbytes} file={os.path.getsize(sl.path)}",
    )
    size = len(pickle.dumps(sl))
    check("len(pickle.dumps(sl)) < 300", size < 300, f"{size} bytes")
    payload = sum(len(b) for b in blobs)
    check(
        "arena overhead vs payload",
        sl.nbytes <= payload + 72 * n + 4096,
        f"arena {sl.nbytes} B, payload {payload} B, "
        f"overhead {(sl.nbytes - payload) / max(n, 1):.1f} B/item (64 B align + 8 B index)",
    )
    pid = os.getpid()
    ours, ref = read_mem(pid), smaps_rollup(pid)
    diffs = {f: abs(ours[f] - ref[f]) for f in MEM_FIELDS} if ours else {}
    check(
        "process_memory == smaps_rollup (+-4 MiB)",
        ours is not None and all(d <= 4 * MIB for d in diffs.values()),
        f"ferrofeed={ours} python={ref}",
    )
    ok = ours is not None and ours["uss"] <= ours["pss"] <= ours["rss"]
    check("process_memory: uss <= pss <= rss", ok, f"{ours}")
    return checks


def run_latency(n: int, seed: int, iters: int, repeats: int, arena_dir: str) -> Json:
    items = list(coco_annotations(n, seed))
    nsl = NumpySerializedList(items)
    sl = ferrofeed.SharedList(items, path=arena_dir)
    try:
        path = sl.path
        blobs = [bytes(sl.raw(i)) for i in range(n)]
        order = list(range(n))
        random.Random(seed + 1).shuffle(order)
        idxs = (order * (iters // n + 1))[:iters]
        seq_blobs = [blobs[i] for i in idxs]
        checks = sanity_checks(sl, items, blobs)
        # Each repeat runs every benchmark over all ``iters`` indices, in chunks interleaved
        # across the benchmarks (rotating their order), so that load from other processes on
        # this small machine hits all of them alike and the ratios stay meaningful.
        bounds = [(a, min(a + LATENCY_CHUNK, iters)) for a in range(0, iters, LATENCY_CHUNK)]
        chunks = [idxs[a:b] for a, b in bounds]
        benches: dict[str, tuple[Any, list[tuple[Any, list[int]]]]] = {
            "pickle.loads(bytes)": (
                _loop_loads,
                [(seq_blobs[a:b], c) for (a, b), c in zip(bounds, chunks, strict=True)],
            ),
            "SharedList[i]": (_loop_getitem, [(sl, c) for c in chunks]),
            "NumpySerializedList[i]": (_loop_getitem, [(nsl, c) for c in chunks]),
            "SharedList.raw(i)": (_loop_raw, [(sl, c) for c in chunks]),
            "empty loop": (_loop_empty, [(None, c) for c in chunks]),
        }
        names = list(benches)
        runs: dict[str, list[float]] = {name: [] for name in names}
        gc.collect()
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            for fn, parts in benches.values():  # warm-up
                fn(*parts[0])
            anon_before = smaps_rollup(os.getpid())["anonymous"]
            for _ in range(repeats):
                total = dict.fromkeys(names, 0)
                for k in range(len(chunks)):
                    for name in names[k % len(names) :] + names[: k % len(names)]:
                        fn, parts = benches[name]
                        total[name] += fn(*parts[k])
                for name in names:
                    runs[name].append(total[name] / iters)
            anon_after = smaps_rollup(os.getpid())["anonymous"]
        finally:
            if gc_was_enabled:
                gc.enable()
        # Every SharedList[i] / raw(i) result was dropped at once: the heap must not grow.
        # (Anonymous memory only: USS also counts arena pages that only this process maps.)
        accesses = 2 * repeats * iters
        growth = anon_after - anon_before
        checks.append(
            {
                "name": "no per-access leak (anonymous memory growth over the latency loops)",
                "show": True,
                "ok": growth <= max(MIB, 4 * accesses),
                "detail": f"{growth / MIB:+.2f} MiB over {accesses:,} SharedList[i] + raw(i) "
                f"accesses ({growth / accesses:+.1f} B each)",
            }
        )
    finally:
        sl.close()
    checks.append(
        {"name": "close() removes the owner's file", "ok": not os.path.exists(path), "detail": path}
    )
    try:
        _ = sl[0]
        closed_ok, detail = False, "no error"
    except ferrofeed.ArenaClosedError:
        closed_ok, detail = True, ""
    except Exception as exc:  # a wrong error type is a finding, not a crash
        closed_ok, detail = False, f"{type(exc).__name__}: {exc}"
    checks.append(
        {"name": "access after close raises ArenaClosedError", "ok": closed_ok, "detail": detail}
    )

    med = {name: statistics.median(v) for name, v in runs.items()}
    overhead = med["empty loop"]
    ratio = med["SharedList[i]"] / med["pickle.loads(bytes)"]
    ratio_net = (med["SharedList[i]"] - overhead) / max(med["pickle.loads(bytes)"] - overhead, 1.0)
    return {
        "n": n,
        "iters": iters,
        "repeats": repeats,
        "ns_per_op": {name: [round(x, 1) for x in v] for name, v in runs.items()},
        "median_ns": {name: round(v, 1) for name, v in med.items()},
        "getitem_vs_loads_ratio": round(ratio, 3),
        "getitem_vs_loads_ratio_net_of_loop": round(ratio_net, 3),
        "getitem_ratio_target": GETITEM_RATIO_TARGET,
        "getitem_ratio_pass": ratio <= GETITEM_RATIO_TARGET,
        "raw_target_ns": RAW_TARGET_NS,
        "raw_pass": med["SharedList.raw(i)"] < RAW_TARGET_NS,
        "mean_item_bytes": round(sum(len(b) for b in blobs) / max(n, 1), 1),
        "checks": checks,
    }
