"""What starting and stopping a pipeline costs: a small pass, and a small DataLoader epoch.

Run: PYTHONPATH=python python benches/pipeline_start.py [--repeats 300]

Prints one JSON line: medians over ``--repeats`` runs, after 20 warm-up runs, of
  * a pipeline of 32 ints through one native op, grouped by 32: build to first group,
    and build to the end of the pass (stopped and joined);
  * a DataLoader epoch of 64 JPEGs cut from real photos (the training job, natively, on
    2 threads, batches of 32): first batch, and the whole epoch (``--repeats`` / 3 runs).
Compare builds by running it with each build's ``python/`` on ``PYTHONPATH``, taking turns.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

from _common import make_jpegs, native_op
from ferrofeed import DataLoader, PipelineBuilder, ops


def first_and_all(start: Callable[[], Iterable[Any]]) -> tuple[float, float]:
    """(seconds to the first item, seconds to the end) of iterating what ``start`` gives,
    timed from the call of ``start``."""
    t0 = time.perf_counter()
    it = iter(start())
    next(it)
    t1 = time.perf_counter()
    for _ in it:
        pass
    return t1 - t0, time.perf_counter() - t0


def pipeline_pass() -> tuple[float, float]:
    """(seconds to the first group, seconds to the end) of one small pipeline pass."""
    return first_and_all(
        lambda: (
            PipelineBuilder()
            .add_source(range(32))
            .pipe(ops.identity())
            .aggregate(32)
            .add_sink()
            .build()
        )
    )


def loader_epoch(loader: DataLoader) -> tuple[float, float]:
    """(seconds to the first batch, seconds to the end) of one epoch of ``loader``."""
    return first_and_all(lambda: loader)


def medians_ms(runs: list[tuple[float, float]]) -> tuple[float, float]:
    """The medians of both figures, in milliseconds."""
    return (
        round(statistics.median(r[0] for r in runs) * 1e3, 3),
        round(statistics.median(r[1] for r in runs) * 1e3, 3),
    )


def main() -> None:
    """Measure; print the JSON line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=300)
    args = p.parse_args()
    for _ in range(20):
        pipeline_pass()
    first, whole = medians_ms([pipeline_pass() for _ in range(args.repeats)])
    with tempfile.TemporaryDirectory() as root:
        files, _info = make_jpegs(root, 64, 0, varied=True)
        loader = DataLoader(
            files, 32, shuffle=True, seed=0, transform=native_op("train"), num_threads=2
        )
        for _ in range(5):
            loader_epoch(loader)
        batch, epoch = medians_ms([loader_epoch(loader) for _ in range(max(1, args.repeats // 3))])
    print(
        json.dumps(
            {
                "pipeline_first_item_ms": first,
                "pipeline_pass_ms": whole,
                "loader_first_batch_ms": batch,
                "loader_epoch_ms": epoch,
            }
        )
    )


if __name__ == "__main__":
    main()
