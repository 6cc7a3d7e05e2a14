"""The rows of benches/scaling.py: a loader over a source, for a job, on T threads (or
worker processes), in batches of B (`Config`); the rows a run plans (`plan`: ferrofeed's
grid, the proxy rows, the peers), and what a row's reader must know (`note`).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

THREADS = (1, 2, 4, 8, 16, 32)
BATCH_SIZES = (32, 256)
SOURCES = ("folder", "tar")
JOBS = ("train", "exact")
PEERS = ("pytorch", "torchvision")
LABELS = {
    "ferrofeed": "ferrofeed native chain",
    "pytorch": "PyTorch DataLoader + Pillow",
    "torchvision": "PyTorch DataLoader + torchvision decode_jpeg + v2",
}
# compare.py's loader whose availability check (installed, and runs here) each peer shares.
PEER_PROBES = {"pytorch": "pytorch-w2", "torchvision": "torchvision-w2"}
JOB_NAMES = {"train": "training", "exact": "exact 224"}
# The proxy: two images per thread per batch (batches of 32 on 16 threads), against
# batches of 32 on the same threads.
PROXY_PER_THREAD = 2
PROXY_BASE = 32


@dataclass(frozen=True)
class Config:
    """One row: a loader over a source, for a job, on ``threads`` threads (or worker
    processes), in batches of ``batch``."""

    loader: str  # ferrofeed | pytorch | torchvision
    source: str  # folder | tar
    job: str  # train | exact
    threads: int
    batch: int

    @property
    def key(self) -> str:
        """The configuration's name in the results: ``loader/source/job/tT/bB``."""
        return f"{self.loader}/{self.source}/{self.job}/t{self.threads}/b{self.batch}"

    @property
    def per_thread(self) -> float:
        """Images per thread per batch: ``batch / threads``."""
        return self.batch / self.threads


def plan(args: argparse.Namespace, peers: list[str]) -> list[Config]:
    """The configurations to run, each once per round: ferrofeed's grid and proxy rows,
    then each peer at every (T, B, job) of ferrofeed's image-folder rows."""
    ours: list[Config] = []
    if not args.proxy_only:
        ours += [
            Config("ferrofeed", s, j, t, b)
            for s in args.sources
            for j in args.jobs
            for t in args.threads
            for b in args.batch_sizes
        ]
    for small, base in proxy_pairs(args.proxy_threads, "ferrofeed"):
        ours += [small, base]
    ours = list(dict.fromkeys(ours))  # in order, once each
    theirs = [
        Config(p, "folder", c.job, c.threads, c.batch)
        for p in peers
        for c in ours
        if c.source == "folder"
    ]
    return ours + list(dict.fromkeys(theirs))


def proxy_pairs(threads: Iterable[int], loader: str) -> list[tuple[Config, Config]]:
    """(batches of 2T on T threads, batches of 32 on T threads): training job, image folder."""
    return [
        (
            Config(loader, "folder", "train", t, PROXY_PER_THREAD * t),
            Config(loader, "folder", "train", t, PROXY_BASE),
        )
        for t in threads
    ]


def note(cfg: Config, runs: list[dict[str, Any]], cores: int) -> str:
    """What a row's reader must know: more threads than cores, the decode off the pool."""
    notes = []
    if cfg.threads > cores:
        notes.append(f"T > {cores} cores")
    if cfg.loader == "ferrofeed" and runs and not all(r["decode_in_pool"] for r in runs):
        why = " (one thread: on the op's thread)" if cfg.threads == 1 else ""
        notes.append(f"decoded outside the pool{why}")
    if any(r["children_left"] for r in runs):
        notes.append("workers left alive at the end")
    return "; ".join(notes)
