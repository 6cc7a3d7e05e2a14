"""``ferrofeed demo``: the main job, end to end, measured.

1. Images: a folder of ImageNet-like JPEGs, one subfolder per class (made at run time in
   a temporary folder, or the user's own with ``--images DIR``), and their metadata
   (file, label, size, COCO-like boxes) in a `SharedList`.
2. Loading: `DataLoader` over that metadata through the native image chain (read, decode,
   resize, crop, collate in Rust, no GIL): time to first batch, images/s (per core too),
   and the pipeline's per-stage figures.
3. Memory: this process and the batch buffer pool; then COCO-like annotation metadata
   read by several worker processes, first from a plain Python list, then from a
   `SharedList`, with each process's USS and PSS. Each variant runs in a fresh
   interpreter so that neither inherits the other's heap.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from .memory import format_bytes, process_memory
from .samples import coco_like_annotations, image_folder

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


class _Records:
    """The image records of a `SharedList` as ``(path, label)`` pairs, for `DataLoader`."""

    def __init__(self, records: Sequence[dict[str, Any]]) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> tuple[str, int]:
        r = self.records[index]
        return r["file_name"], r["label"]


def _image_records(files: list[tuple[str, int]], seed: int) -> list[dict[str, Any]]:
    """COCO-like metadata for each image: its file, label and a few annotations."""
    boxes = coco_like_annotations(4 * len(files), seed=seed)
    return [
        {
            "id": i,
            "file_name": path,
            "label": label,
            "annotations": [next(boxes) for _ in range(4)],
        }
        for i, (path, label) in enumerate(files)
    ]


def _folder_size(paths: Sequence[str]) -> int:
    return sum(os.path.getsize(p) for p in paths)


def _load(args: argparse.Namespace, files: list[tuple[str, int]]) -> None:
    """Part 2: load the images with the DataLoader and print what it measured."""
    from . import DataLoader, SharedList, ops

    t0 = time.perf_counter()
    meta = SharedList(_image_records(files, args.seed))
    print(
        f"  metadata: {len(meta):,} image records (file, label, COCO-like boxes) in a "
        f"SharedList, {format_bytes(meta.nbytes)} arena, built in "
        f"{time.perf_counter() - t0:.2f} s"
    )
    threads = args.threads or min(os.cpu_count() or 1, 8)
    transform = ops.decode_image(resize_shorter=round(args.size * 256 / 224), crop=args.size)
    loader = DataLoader(
        _Records(meta),
        batch_size=args.batch_size,
        shuffle=True,
        seed=args.seed,
        transform=transform,
        num_threads=threads,
        on_error="skip",
    )
    print(
        f"\nloading: DataLoader(batch_size={args.batch_size}, shuffle=True, "
        f"num_threads={threads}), decode_image(resize_shorter="
        f"{round(args.size * 256 / 224)}, crop={args.size}) in Rust, uint8 NHWC batches"
    )
    last_images = 0
    with meta:
        for epoch in range(args.epochs):
            start = time.perf_counter()
            first = None
            images = 0
            for batch in loader:
                if first is None:
                    first = time.perf_counter() - start
                images += len(batch[0])
            took = time.perf_counter() - start
            rate = images / took if took > 0 else float("inf")
            print(
                f"  epoch {epoch}: {images} images in {took:.2f} s = {rate:,.0f} images/s "
                f"({rate / threads:,.0f} per thread); first batch after "
                f"{(first or 0) * 1e3:.0f} ms"
            )
            last_images = images
        skipped = loader.stats()["skipped"]
        if skipped:
            print(f"  skipped {len(skipped)} unreadable image(s), e.g. {skipped[0][1]}")
        print("\nper-stage figures of the last epoch (decode_batch: one item per batch):")
        for line in loader.stats_table().splitlines():
            print(f"  {line}")
    if last_images == 0:
        raise SystemExit("ferrofeed demo: no image could be loaded")
    me = process_memory()
    pool = loader.stats()["buffers"]
    print(
        f"\nmemory: this process RSS {format_bytes(me.rss)}, USS {format_bytes(me.uss)}; "
        f"batch buffers: {pool['allocated']} allocated ({format_bytes(pool['bytes'])}), "
        f"reused {pool['reuses']} times for {pool['allocations'] + pool['reuses']} batches "
        f"and label vectors"
    )


def _memory_study(args: argparse.Namespace) -> None:
    """Part 3: annotation metadata in worker processes, plain list against SharedList."""
    print(
        f"\nmetadata in worker processes: {args.annotations:,} COCO-like annotations read by "
        f"{args.workers} {args.start_method} workers"
    )
    results = {}
    for variant in ("list", "shared"):
        out = subprocess.run(
            [
                *(sys.executable, "-m", "ferrofeed", "demo", "--variant", variant),
                *(f"--annotations={args.annotations}", f"--workers={args.workers}"),
                f"--passes={args.passes}",
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


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``ferrofeed demo``."""
    parser = argparse.ArgumentParser(
        prog="ferrofeed demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--images",
        metavar="DIR",
        help="your own images, one subfolder per class (default: generate a sample)",
    )
    parser.add_argument(
        "--n-images", type=int, default=256, help="images to generate (default 256)"
    )
    parser.add_argument("--batch-size", type=int, default=32, help="default 32")
    parser.add_argument("--epochs", type=int, default=2, help="default 2")
    parser.add_argument(
        "--threads", type=int, help="decoding threads (default: the CPUs, at most 8)"
    )
    parser.add_argument("--size", type=int, default=224, help="output side (default 224)")
    parser.add_argument("--seed", type=int, default=0, help="default 0")
    parser.add_argument(
        "--annotations",
        type=int,
        default=100_000,
        help="annotations in the memory study (default 100000; 0 skips the study)",
    )
    parser.add_argument(
        "--workers", type=int, default=2, help="worker processes in the memory study (2)"
    )
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
        result = run_variant(
            args.variant, args.annotations, args.workers, args.passes, args.start_method
        )
        print(json.dumps(result))
        return 0
    for name in ("n_images", "batch_size", "epochs", "size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")

    tmp = None
    try:
        if args.images:
            from ._images import ImageFolder

            try:
                folder = ImageFolder(args.images)
            except FileNotFoundError as e:
                print(f"ferrofeed demo: {e}", file=sys.stderr)
                return 2
            files = [(str(p), int(label)) for p, label in folder]
            print(
                f"ferrofeed demo: {len(files):,} images in {len(folder.classes)} classes "
                f"from {args.images} ({format_bytes(_folder_size([p for p, _ in files]))})"
            )
        else:
            tmp = tempfile.mkdtemp(prefix="ferrofeed-demo-")
            t0 = time.perf_counter()
            files = image_folder(tmp, args.n_images, seed=args.seed)
            print(
                f"ferrofeed demo: {len(files):,} generated ImageNet-like JPEGs (about "
                f"500x375, quality 75-95, 4 classes) in {tmp} "
                f"({format_bytes(_folder_size([p for p, _ in files]))}, made in "
                f"{time.perf_counter() - t0:.1f} s)"
            )
        _load(args, files)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.annotations > 0:
        _memory_study(args)
    return 0
