"""Reading an arena item by item allocates nothing that outlives the call."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from ferrofeed import SharedList

N = 5_000


def _objects_left_per_call(call: Callable[[int], Any]) -> float:
    """Allocations still alive per call of ``call``, made from this file's frames.

    The calls are synchronous and their objects are allocated from the lambdas below (the
    native code has no Python frame of its own), so only allocations traced to this file
    count: a thread that an earlier test left behind by design (a stuck call ending in
    its own time) may allocate during the measurement, and is not this test's concern.
    """
    for i in range(100):  # warm caches (interned strings, pickle's state)
        call(i)
    gc.collect()
    here = [tracemalloc.Filter(True, __file__)]
    tracemalloc.start(1)
    try:
        before = tracemalloc.take_snapshot().filter_traces(here)
        for i in range(N):
            call(i)
        gc.collect()
        after = tracemalloc.take_snapshot().filter_traces(here)
    finally:
        tracemalloc.stop()
    return sum(s.count_diff for s in after.compare_to(before, "filename")) / N


@pytest.mark.parametrize(
    "items",
    [
        [{"id": 1000 + i, "bbox": [1.5 * i, 2.0, 3.0, 4.0]} for i in range(N)],
        [{"mask": np.arange(i % 7 + 1, dtype=np.int32)} for i in range(N)],
    ],
    ids=["dicts", "numpy"],
)
@pytest.mark.parametrize("access", ["getitem", "raw", "iter", "slice"])
def test_no_per_item_leak(items: list[Any], access: str, tmp_path: Any) -> None:
    with SharedList(items, path=tmp_path) as sl:
        calls: dict[str, Callable[[int], Any]] = {
            "getitem": lambda i: sl[i],
            "raw": lambda i: sl.raw(i),
            "iter": lambda i: next(iter(sl)),
            "slice": lambda i: sl[i : i + 2],
        }
        # A leak of even one small object per call shows as >= 1.0 here.
        assert _objects_left_per_call(calls[access]) < 0.05
