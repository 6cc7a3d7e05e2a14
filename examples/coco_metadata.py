"""COCO-style metadata in a SharedList, read by spawn workers: one copy per node.

Run: python examples/coco_metadata.py [--n 200000] [--workers 4]

Each worker maps the same arena; the script prints every process's USS (private memory)
and PSS, and checks that the workers read exactly what the main process stored.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import zlib

from ferrofeed import SharedList
from ferrofeed.memory import format_bytes, process_memory
from ferrofeed.samples import coco_like_annotations


def digest(meta: SharedList) -> tuple[int, int, int]:
    """Read every annotation; return (pid, checksum, uss after reading)."""
    crc = 0
    for ann in meta:
        crc = zlib.crc32(repr((ann["id"], ann["bbox"])).encode(), crc)
    return os.getpid(), crc, process_memory().uss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()

    with SharedList(coco_like_annotations(args.n)) as meta:
        print(f"{len(meta):,} annotations in {meta.path} ({format_bytes(meta.nbytes)})")
        expected = digest(meta)[1]
        with mp.get_context("spawn").Pool(args.workers) as pool:
            results = pool.map(digest, [meta] * args.workers)
        for pid, crc, uss in results:
            assert crc == expected, f"worker {pid} read different data"
            print(f"  worker {pid}: read all {len(meta):,} items, USS {format_bytes(uss)}")
        print(f"  main: PSS {format_bytes(process_memory().pss)}; all workers agree")


if __name__ == "__main__":
    main()
