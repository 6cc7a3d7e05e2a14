"""A rank process of benches/ram_loaders.py, as torchrun starts one: it builds its dataset
and loader the way a user would (`RankConfig`), iterates its epochs, tells the launcher what
happens (`emit`: lines on stdout) and keeps its workers alive until the launcher releases it.

The launcher starts it as ``python -c RANK_BOOT BENCH_DIR CONFIG``: importing this module by
name, so that `coco_collate` pickles as ``_ram_rank.coco_collate`` for forkserver and spawn
workers.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import os
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from _ram_common import coco_annotations

EVENT_PREFIX = "@@ram-loaders "
RANK_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); import _ram_rank; "
    "sys.exit(_ram_rank.rank_entry(sys.argv[2]))"
)


def coco_collate(batch: Sequence[dict[str, Any]]) -> dict[str, npt.NDArray[Any]]:
    """Reduce a batch of COCO-like annotation dicts to arrays, reading every field of each.

    The polygons' coordinates are concatenated (``points``) with a count per annotation.

    Example:
        >>> b = coco_collate(list(coco_annotations(3)))
        >>> b["bbox"].shape, int(b["num_points"].sum()) == len(b["points"])
        ((3, 4), True)
    """
    n = len(batch)
    counts = np.fromiter((sum(len(poly) for poly in a["segmentation"]) for a in batch), np.int64, n)
    coords = itertools.chain.from_iterable(poly for a in batch for poly in a["segmentation"])
    return {
        "id": np.fromiter((a["id"] for a in batch), np.int64, n),
        "image_id": np.fromiter((a["image_id"] for a in batch), np.int64, n),
        "category_id": np.fromiter((a["category_id"] for a in batch), np.int64, n),
        "iscrowd": np.fromiter((a["iscrowd"] for a in batch), np.int8, n),
        "area": np.fromiter((a["area"] for a in batch), np.float64, n),
        "bbox": np.fromiter(
            itertools.chain.from_iterable(a["bbox"] for a in batch), np.float32, 4 * n
        ).reshape(n, 4),
        "num_points": counts,
        "points": np.fromiter(coords, np.float32, int(counts.sum())),
    }


# --------------------------------------------------------------------------------------------
# A rank process
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankConfig:
    loader: str  # "ferrofeed" | "torch"
    method: str  # worker start method
    baseline: bool
    n: int
    ranks: int
    workers: int
    epochs: int
    batch_size: int
    seed: int
    import_torch: bool
    arena_dir: str
    name: str  # the SharedList.shared name (unique per configuration)
    timeout: float
    rank: int = 0

    @property
    def label(self) -> str:
        return f"{self.method}/{self.loader}" + ("/baseline" if self.baseline else "")


def emit(event: str, **fields: Any) -> None:
    """One event line to the launcher (stdout)."""
    print(EVENT_PREFIX + json.dumps({"ev": event, "t": time.time(), **fields}), flush=True)


def _ferrofeed_loader(cfg: RankConfig) -> tuple[Any, Callable[[int], Iterable[Any]], Any]:
    import ferrofeed

    n, seed = cfg.n, cfg.seed
    ds: ferrofeed.SharedList[dict[str, Any]] = ferrofeed.SharedList.shared(
        lambda: coco_annotations(n, seed),
        name=cfg.name,
        local_rank=cfg.rank,
        local_world_size=cfg.ranks,
        dir=cfg.arena_dir,
        timeout=cfg.timeout,
    )
    loader = ferrofeed.DataLoader(
        ds,
        cfg.batch_size,
        shuffle=True,
        seed=seed,
        collate=coco_collate,
        num_workers=cfg.workers,
        worker_start_method=cfg.method,  # type: ignore[arg-type]
        persistent_workers=True,
        rank=cfg.rank,
        world_size=cfg.ranks,
    )

    def epoch(_: int) -> Iterable[Any]:
        return loader  # each complete iteration is the next epoch

    def close() -> None:
        loader.shutdown_workers()
        ds.close()

    return ds, epoch, close


def _torch_loader(cfg: RankConfig) -> tuple[Any, Callable[[int], Iterable[Any]], Any]:
    import torch.utils.data as tud

    # A plain list is a map-style dataset to PyTorch (len and []), not a `Dataset` to mypy.
    ds: Any = list(coco_annotations(cfg.n, cfg.seed))
    sampler: tud.DistributedSampler[int] = tud.DistributedSampler(
        ds, num_replicas=cfg.ranks, rank=cfg.rank, shuffle=True, seed=cfg.seed
    )
    loader: tud.DataLoader[Any] = tud.DataLoader(
        ds,
        batch_size=cfg.batch_size,
        sampler=sampler,
        collate_fn=coco_collate,
        num_workers=cfg.workers,
        multiprocessing_context=cfg.method,
        persistent_workers=True,
    )

    def epoch(e: int) -> Iterable[Any]:
        sampler.set_epoch(e)
        return loader

    def close() -> None:
        nonlocal loader
        del loader  # persistent workers end with their iterator

    return ds, epoch, close


def rank_main(cfg: RankConfig) -> None:
    """Build the dataset and loader, iterate ``cfg.epochs`` epochs, wait for the release."""
    emit("started", pid=os.getpid())
    if cfg.import_torch:
        import torch  # noqa: F401  (a training process has it imported)
    # PyTorch warns when there are more workers than cores (this machine has 2).
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    make = _ferrofeed_loader if cfg.loader == "ferrofeed" else _torch_loader
    t = time.perf_counter()
    ds, epoch_iter, close = make(cfg)
    gc.collect()
    emit(
        "built", build_s=round(time.perf_counter() - t, 3), arena_bytes=getattr(ds, "nbytes", None)
    )
    try:
        for e in range(cfg.epochs):
            t = time.perf_counter()
            items = id_sum = points = batches = 0
            for batch in epoch_iter(e):
                if batches == 0:
                    emit("first_batch", epoch=e, s=round(time.perf_counter() - t, 3))
                batches += 1
                items += len(batch["id"])
                id_sum += int(batch["id"].sum())
                points += int(batch["num_points"].sum())
                if len(batch["points"]) != batch["num_points"].sum():
                    raise AssertionError("points and num_points disagree")
            emit(
                "epoch_done",
                epoch=e,
                s=round(time.perf_counter() - t, 3),
                batches=batches,
                items=items,
                id_sum=id_sum,
                points=points,
            )
        emit("done")
        sys.stdin.readline()  # the launcher's release (or EOF): workers stay alive till then
    finally:
        close()


def rank_entry(cfg_json: str) -> int:
    cfg = RankConfig(**json.loads(cfg_json))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides
    # Should the machine run out of memory anyway, the kernel's OOM killer takes this job's
    # processes (workers inherit the setting) before anything else running on it.
    with contextlib.suppress(OSError):
        Path("/proc/self/oom_score_adj").write_text("1000")
    try:
        rank_main(cfg)
    except BaseException as exc:
        emit("error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        return 1
    return 0
