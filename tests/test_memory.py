"""RAM: spawn workers iterating a >= 200 MB SharedList share its pages instead of copying them."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import run_spawned
from ferrofeed import SharedList
from ferrofeed.memory import process_memory

N_ITEMS = 460_000  # ~500 bytes each on disk (64-byte aligned): ~230 MB
N_WORKERS = 4
PASSES = 3
MIN_ARENA = 200 * 10**6


def _mem_fields(m: Any) -> dict[str, int]:
    return {k: int(getattr(m, k)) for k in ("rss", "pss", "uss", "shared", "swap")}


def _mem_worker(barrier: Any, sl: SharedList, passes: int, queue: Any) -> None:
    """Spawn worker: ``sl`` was unpickled (opened) before this runs; imports are done."""
    try:
        before = _mem_fields(process_memory())
        t0 = time.monotonic()
        count = 0
        id_sum = 0
        for _ in range(passes):
            for item in sl:
                count += 1
                id_sum += item["id"]
        elapsed = time.monotonic() - t0
        barrier.wait(120)  # every worker has touched every page: they are all shared now
        after = _mem_fields(process_memory())
        barrier.wait(120)  # nobody unmaps before everybody has measured
        queue.put(
            {
                "pid": os.getpid(),
                "before": before,
                "after": after,
                "count": count,
                "id_sum": id_sum,
                "elapsed": elapsed,
            }
        )
    except BaseException as e:  # report instead of hanging the parent
        barrier.abort()
        queue.put({"pid": os.getpid(), "error": repr(e)})
        raise


def test_process_memory_of_self_and_pid() -> None:
    mine = _mem_fields(process_memory())
    assert mine["rss"] > 1 << 20
    assert 0 < mine["uss"] <= mine["rss"]
    assert mine["uss"] <= mine["pss"] <= mine["rss"]
    assert mine["shared"] + mine["uss"] == mine["rss"]
    assert mine["swap"] >= 0
    by_pid = _mem_fields(process_memory(os.getpid()))
    assert abs(by_pid["rss"] - mine["rss"]) < 64 << 20
    # it reads smaps_rollup: RSS in kB there
    with open("/proc/self/smaps_rollup") as f:
        rss_kb = next(int(line.split()[1]) for line in f if line.startswith("Rss:"))
    assert abs(_mem_fields(process_memory())["rss"] - rss_kb * 1024) < 64 << 20


@pytest.mark.timeout(120)
def test_spawn_workers_share_arena_pages(
    arena_dir: Path, coco: Callable[..., Iterator[dict[str, Any]]]
) -> None:
    t0 = time.monotonic()
    sl = SharedList(coco(N_ITEMS), path=arena_dir)
    build_s = time.monotonic() - t0
    try:
        assert len(sl) == N_ITEMS
        assert sl.nbytes >= MIN_ARENA, sl.nbytes
        results, exitcodes = run_spawned(N_WORKERS, _mem_worker, sl, PASSES, timeout=150)
        errors = [r for r in results if "error" in r]
        assert errors == []
        assert exitcodes == [0] * N_WORKERS
        expected_id_sum = PASSES * N_ITEMS * (N_ITEMS - 1) // 2
        summary = []
        for r in results:
            grow = r["after"]["uss"] - r["before"]["uss"]
            summary.append(
                f"pid {r['pid']}: uss {r['before']['uss'] >> 20} -> {r['after']['uss'] >> 20} "
                f"MiB, shared {r['after']['shared'] >> 20} MiB, {r['elapsed']:.1f}s"
            )
            assert r["count"] == PASSES * N_ITEMS
            assert r["id_sum"] == expected_id_sum
            assert grow < 0.05 * sl.nbytes, (grow, sl.nbytes, summary)
            assert r["after"]["shared"] >= 0.9 * sl.nbytes, (sl.nbytes, summary)
            assert r["after"]["rss"] >= 0.9 * sl.nbytes
        print(f"build {build_s:.1f}s, arena {sl.nbytes >> 20} MiB", *summary, sep="\n")
    finally:
        sl.close()
