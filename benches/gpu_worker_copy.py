"""Worker batches to a GPU: page-locked slots (the default) against plain ones.

Needs a CUDA device. Run it in fresh processes, with and without
``FERROFEED_DISABLE_CUDA=1`` (which leaves the slots plain memory), taking turns:

    for r in 1 2; do for d in 0 1; do
        FERROFEED_DISABLE_CUDA=$d PYTHONPATH=python python benches/gpu_worker_copy.py
    done; done

Each prints one JSON line. Batches of 32x3x224x224 float32 (19 MB), made by 4 fork worker
processes into shared-memory slots; the DataLoader copies each to the GPU (``device="cuda"``),
and a ~1 ms kernel stands for the training step. After a warm-up epoch: the epoch's wall
time and the main thread's time inside ``next()`` per batch (which holds the copy when the
slot is plain memory; an asynchronous DMA when it is page-locked).
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import torch
from ferrofeed import DataLoader


class Big:
    """60 batches of 32 float32 CHW images."""

    def __len__(self) -> int:
        return 32 * 60

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return np.full((3, 224, 224), i % 7, dtype=np.float32), i


def main() -> None:
    """Run one measurement; print its JSON line."""
    torch.cuda.init()  # type: ignore[no-untyped-call]
    loader = DataLoader(
        Big(),
        batch_size=32,
        num_workers=4,
        worker_start_method="fork",
        persistent_workers=True,
        output="torch",
        device="cuda",
        prefetch_factor=4,
    )
    for _batch in loader:  # warm-up epoch: workers up, slots made
        pass
    torch.cuda.synchronize()
    in_next, n = 0.0, 0
    t0 = time.perf_counter()
    it = iter(loader)
    while True:
        t = time.perf_counter()
        try:
            _images, _labels = next(it)
        except StopIteration:
            break
        in_next += time.perf_counter() - t
        torch.cuda._sleep(2_000_000)  # type: ignore[no-untyped-call]  # ~1 ms of a "step"
        n += 1
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    slots = loader.stats()["workers"]["slots"]
    loader.shutdown_workers()
    print(
        json.dumps(
            {
                "disabled": os.environ.get("FERROFEED_DISABLE_CUDA") == "1",
                "batches": n,
                "wall_s": round(wall, 3),
                "in_next_ms_per_batch": round(in_next / n * 1e3, 3),
                "pinned_slots": slots["pinned"],
                "slots": slots["slots"],
            }
        )
    )


if __name__ == "__main__":
    main()
