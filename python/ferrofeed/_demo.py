"""``ferrofeed demo``: the shared arena against a plain list, measured.

Builds COCO-like annotation metadata (a few hundred thousand small dicts), lets several
worker processes read every item, and prints each process's USS and PSS, first with the
metadata in a plain Python list, then in a `SharedList`. Each variant runs in a fresh
interpreter so that neither inherits the other's heap.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from .memory import format_bytes, process_memory
from .samples import coco_like_annotations

__all__ = ["main", "run_variant"]


def _worker(
    dataset: Sequence[Any],
    passes: int,
    barrier: Any,
    results: Any,
    done: Any,
) -> None:
    checksum = 0
    for _ in range(passes):
        for sample in dataset:
            # Touch the data as a real worker would (the study's "fake latency").
            checksum += len(pickle.dumps(sample))
    barrier.wait()
    results.put((os.getpid(), process_memory(), checksum))
    done.wait()


def run_variant(
    variant: str, n: int, workers: int, passes: int, start_method: str
) -> dict[str, Any]:
    """Run one variant (``"list"`` or ``"shared"``) in this process and return its figures."""
    from ._shared_list import SharedList

    t0 = time.perf_counter()
    items = coco_like_annotations(n)
    dataset: Sequence[Any] = list(items) if variant == "list" else SharedList(items)
    build_s = time.perf_counter() - t0
    arena_bytes = dataset.nbytes if isinstance(dataset, SharedList) else 0
    ctx: Any = mp.get_context(start_method)  # typeshed's BaseContext lacks Process
    barrier, results, done = ctx.Barrier(workers + 1), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=_worker, args=(dataset, passes, barrier, results, done), daemon=True)
        for _ in range(workers)
    ]
    t1 = time.perf_counter()
    for p in procs:
        p.start()
    try:
        barrier.wait(timeout=600)
        read_s = time.perf_counter() - t1
        worker_mem = [results.get(timeout=60) for _ in procs]
        main_mem = process_memory()
    finally:
        done.set()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
        if isinstance(dataset, SharedList):
            dataset.close()
    checksums = {c for _, _, c in worker_mem}
    if len(checksums) != 1:
        raise RuntimeError(f"workers read different data: {checksums}")
    return {
        "variant": variant,
        "n": n,
        "build_s": build_s,
        "read_s": read_s,
        "arena_bytes": arena_bytes,
        "main": main_mem.__dict__,
        "workers": [m.__dict__ for _, m, _ in worker_mem],
        "items_per_s": n * passes * workers / read_s,
    }


def _print_variant(title: str, r: dict[str, Any]) -> None:
    print(f"\n{title}")
    print(f"  {'process':<10}{'pid':>9}{'RSS':>12}{'PSS':>12}{'USS':>12}{'shared':>12}")
    rows = [("main", r["main"])] + [(f"worker {i}", w) for i, w in enumerate(r["workers"])]
    for name, m in rows:
        print(
            f"  {name:<10}{m['pid']:>9}{format_bytes(m['rss']):>12}{format_bytes(m['pss']):>12}"
            f"{format_bytes(m['uss']):>12}{format_bytes(m['shared']):>12}"
        )
    total_pss = sum(m["pss"] for _, m in rows)
    print(f"  total PSS {format_bytes(total_pss)}", end="")
    if r["arena_bytes"]:
        print(f"   (arena file: {format_bytes(r['arena_bytes'])})", end="")
    print(
        f"\n  built in {r['build_s']:.1f} s; {len(r['workers'])} workers read "
        f"{r['items_per_s'] / 1e3:.0f}k items/s together"
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``ferrofeed demo``."""
    parser = argparse.ArgumentParser(prog="ferrofeed demo", description=__doc__)
    parser.add_argument("--n", type=int, default=250_000, help="annotations (default 250000)")
    parser.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    parser.add_argument("--passes", type=int, default=1, help="passes per worker (default 1)")
    parser.add_argument(
        "--start-method",
        choices=["fork", "spawn", "forkserver"],
        default="fork",
        help="how workers start (default fork, as PyTorch's DataLoader on Linux)",
    )
    parser.add_argument("--variant", choices=["list", "shared"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.variant:
        result = run_variant(args.variant, args.n, args.workers, args.passes, args.start_method)
        print(json.dumps(result))
        return 0
    print(
        f"ferrofeed demo: {args.n:,} COCO-like annotations read by {args.workers} "
        f"{args.start_method} workers, {args.passes} pass(es) each"
    )
    results = {}
    for variant in ("list", "shared"):
        out = subprocess.run(
            [
                *(sys.executable, "-m", "ferrofeed", "demo", "--variant", variant),
                *(f"--n={args.n}", f"--workers={args.workers}", f"--passes={args.passes}"),
                f"--start-method={args.start_method}",
            ],
            check=True,
            stdout=subprocess.PIPE,
            text=True,
        )
        results[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    _print_variant("plain Python list (copy-on-read in every worker):", results["list"])
    _print_variant("ferrofeed.SharedList (one mmap'd arena per node):", results["shared"])

    def total(r: dict[str, Any]) -> int:
        return int(r["main"]["pss"] + sum(w["pss"] for w in r["workers"]))

    def worst_uss(r: dict[str, Any]) -> int:
        return max(int(w["uss"]) for w in r["workers"])

    lst, sh = results["list"], results["shared"]
    print(
        f"\ntotal PSS: {format_bytes(total(lst))} -> {format_bytes(total(sh))} "
        f"({total(lst) / total(sh):.1f}x less); "
        f"largest worker USS: {format_bytes(worst_uss(lst))} -> {format_bytes(worst_uss(sh))}"
    )
    return 0
