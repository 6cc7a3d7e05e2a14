"""Per-item overhead of a pipeline with one Python no-op stage: ferrofeed vs SPDL vs a loop.

Run: python benches/pipeline_overhead.py [--n 200000] [--repeats 5] [--quick]

Side by side in one run, on the same machine and data:
  * plain loop: ``for x in range(n): noop(x)`` (the floor);
  * ferrofeed: ``PipelineBuilder().add_source(range(n)).pipe(noop).add_sink(b).build()``;
  * the same with ``.pipe(noop, concurrency=k)`` (``--concurrency``, default 4): the stage
    runs on k threads, as ``DataLoader``'s per-sample stage does;
  * ``DataLoader(list(range(n)), batch_size=64, num_threads=k, collate=len)``: the loader's
    own per-sample cost (its load stage runs on k threads), per sample;
  * SPDL 0.8 (``pip install spdl``), the same pipeline with ``output_order="input"``
    (ferrofeed's default order), iterated with ``get_iterator()``;
  * ferrofeed with three native no-op stages (``ops.identity()``), for reference.
Each figure is the median of ``--repeats`` runs; overhead = (pipeline - loop) / n.
Results go to stdout and to bench-results/pipeline_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ferrofeed
from bench_machine import cpu_model
from ferrofeed import PipelineBuilder, ops


def noop(x: Any) -> Any:
    return x


def time_loop(n: int) -> float:
    t = time.perf_counter()
    for x in range(n):
        noop(x)
    return time.perf_counter() - t


def drain(p: ferrofeed.Pipeline, n: int) -> float:
    """Iterate a built pipeline to the end; return the seconds it took."""
    t = time.perf_counter()
    with p.auto_stop():
        count = sum(1 for _ in p)
    elapsed = time.perf_counter() - t
    assert count == n, count
    return elapsed


def time_ferrofeed(n: int, buffer_size: int, threads: int, concurrency: int = 1) -> float:
    b = PipelineBuilder().add_source(range(n)).pipe(noop, concurrency=concurrency)
    return drain(b.add_sink(buffer_size).build(num_threads=threads), n)


def time_loader(n: int, threads: int) -> float:
    loader = ferrofeed.DataLoader(list(range(n)), batch_size=64, num_threads=threads, collate=len)
    t = time.perf_counter()
    count = sum(loader)
    elapsed = time.perf_counter() - t
    assert count == n, count
    return elapsed


def time_ferrofeed_native(n: int, buffer_size: int, threads: int) -> float:
    b = PipelineBuilder().add_source(range(n))
    for _ in range(3):
        b = b.pipe(ops.identity())
    return drain(b.add_sink(buffer_size).build(num_threads=threads), n)


def time_spdl(n: int, buffer_size: int, threads: int) -> float:
    from spdl.pipeline import PipelineBuilder as SpdlBuilder

    p = (
        SpdlBuilder()
        .add_source(range(n))
        .pipe(noop, output_order="input")
        .add_sink(buffer_size)
        .build(num_threads=threads)
    )
    t = time.perf_counter()
    with p.auto_stop():
        count = sum(1 for _ in p.get_iterator(timeout=600))
    elapsed = time.perf_counter() - t
    assert count == n, count
    return elapsed


def median_time(fn: Callable[[], float], repeats: int) -> float:
    return statistics.median(fn() for _ in range(repeats))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--spdl-n", type=int, default=None, help="items for SPDL (default: --n)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--buffer-size", type=int, default=64, help="sink buffer for both")
    parser.add_argument("--threads", type=int, default=2, help="num_threads for both")
    parser.add_argument(
        "--concurrency", type=int, default=4, help="threads of the second Python-stage row"
    )
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--out", default="bench-results/pipeline_overhead.json")
    args = parser.parse_args()
    if args.quick:
        args.n, args.repeats = 20_000, 1
    spdl_n = args.spdl_n or args.n
    b, th = args.buffer_size, args.threads

    loop_s = median_time(lambda: time_loop(args.n), args.repeats)
    ff_s = median_time(lambda: time_ferrofeed(args.n, b, th), args.repeats)
    k = args.concurrency
    ffk_s = median_time(lambda: time_ferrofeed(args.n, b, th, k), args.repeats)
    loader_s = median_time(lambda: time_loader(args.n, k), args.repeats)
    native_s = median_time(lambda: time_ferrofeed_native(args.n, b, th), args.repeats)
    try:
        import spdl  # noqa: F401

        spdl_s: float | None = median_time(lambda: time_spdl(spdl_n, b, th), args.repeats)
    except ImportError:
        spdl_s = None

    def per_item_us(seconds: float, n: int) -> float:
        return seconds / n * 1e6

    rows = {
        "plain loop": per_item_us(loop_s, args.n),
        "ferrofeed, 1 Python stage": per_item_us(ff_s, args.n),
        f"ferrofeed, 1 Python stage, concurrency {k}": per_item_us(ffk_s, args.n),
        f"DataLoader, num_threads={k}, per sample": per_item_us(loader_s, args.n),
        "ferrofeed, 3 native stages": per_item_us(native_s, args.n),
    }
    if spdl_s is not None:
        rows["SPDL 0.8, 1 Python stage"] = per_item_us(spdl_s, spdl_n)
    print(
        f"ferrofeed {ferrofeed.__version__}, Python {platform.python_version()}, {cpu_model()}, "
        f"{os.cpu_count()} CPUs; n={args.n}, median of {args.repeats}, sink buffer {b}, "
        f"num_threads {th}"
    )
    print(f"{'pipeline':<44}{'us/item':>10}{'items/s':>14}{'overhead us/item':>19}")
    for name, us in rows.items():
        overhead = us - rows["plain loop"]
        print(f"{name:<44}{us:>10.2f}{1e6 / us:>14,.0f}{overhead:>19.2f}")
    ratio = None
    if spdl_s is not None:
        ratio = rows["SPDL 0.8, 1 Python stage"] / rows["ferrofeed, 1 Python stage"]
        print(f"ferrofeed / SPDL items per second: {ratio:.1f}x")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "n": args.n,
                "spdl_n": spdl_n,
                "repeats": args.repeats,
                "buffer_size": b,
                "num_threads": th,
                "concurrency": k,
                "us_per_item": rows,
                "ferrofeed_over_spdl_items_per_s": ratio,
                "machine": {
                    "cpu": cpu_model(),
                    "cpus": os.cpu_count(),
                    "python": sys.version.split()[0],
                },
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
