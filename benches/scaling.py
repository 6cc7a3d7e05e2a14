"""How ferrofeed's native chain scales with threads and batch size, and where its CPU goes.

``make bench-scaling`` runs it (``SCALING_ARGS=...`` passes options); directly:
``python benches/scaling.py [--threads 1,2,4] [--batch-sizes 32] [--sources folder]
[--jobs train] [--proxy-only] [--compare] [--quick]``. Results: ``--out`` (default
benches/results/; with ``--quick``, bench-results/scaling-quick/) gets ``{--name}.json``
(every run, the machine, ferrofeed's build) and ``{--name}.md`` (the tables BENCHMARKS.md
quotes, also printed); ``--replot FILE`` writes the tables again from a JSON.

Data: ``--n`` ImageNet-like JPEGs (default 2000) made from the real photos in
scikit-image's wheel (``_common.make_jpegs(..., varied=True, folders=True)``: about
500x375, some portrait, some up to 1000 px, quality 75-95, some progressive and greyscale),
in an image folder (one subfolder per class) on /dev/shm, and the same files packed as
WebDataset tar shards of ``--shard-size`` samples (default 250; ``TarShards(...)`` with
``image="jpg", label="cls"``, shuffled within ``--shuffle-window`` samples, rounded up to a
multiple of the batch size).

Rows (configurations): ferrofeed's DataLoader with the native chain (``transform=
_common.native_op(job)``: ``train`` is RandomResizedCrop 224 + random flip, ``exact`` is
Resize 256 + CenterCrop 224; uint8 batches) at ``num_threads=T`` for T in ``--threads``
(default 1, 2, 4, 8, 16, 32), batch sizes ``--batch-sizes`` (default 32 and 256), over the
image folder and the tar shards (``--sources``), both jobs (``--jobs``). Rows with more
threads than the machine has cores say so. The proxy rows (``--proxy-threads``, default 1
and 2; training job, image folder, whatever ``--jobs`` and ``--sources`` say): batches of
2T on T threads against batches of 32 on the same threads. Two images per thread per
batch is what batches of 32 on 16 threads give each thread: on a 2-core machine, where 16
threads cannot be measured (their idle time hides behind the other runnable threads, so
the total CPU use cannot show it), batches of 2 on 1 thread and of 4 on 2 threads show
what those small shares of a batch cost each thread; the proxy table gives their images/s
as a ratio to batches of 32 on as many threads. ``--proxy-only`` runs only those.
``--compare`` adds, at every (T, B, job) of the image folder, PyTorch's DataLoader with the
Pillow transform (``_common.PillowTrain`` / ``PillowExact``) and with torchvision's
``decode_jpeg`` + ``transforms.v2`` (``_compare_loaders.TorchvisionJob``), both with T
worker processes and batches of B (``_compare_loaders.torch_loader``); they are left out,
with the reason, where torch or torchvision cannot run.

Each configuration runs in a fresh interpreter (``_common.run_fresh``), the configurations
taking turns for ``--rounds`` rounds (default 2; the order rotated each round) so that all
see the same machine state. In each run: the loader is built, one warm-up epoch is read
(page cache, thread pools, PyTorch's workers), then ``--epochs`` timed epochs (default 2);
every epoch must give all ``--n`` images. Over the timed epochs:

- images/s: the images over the wall time;
- CPU: the CPU seconds of the process tree over the timed epochs (the interpreter, all its
  threads, and its worker processes: the live ones' ``/proc/PID/stat`` and the reaped ones'
  ``getrusage``); CPU ms per image; "threads busy": CPU seconds per wall second / T;
- ferrofeed's threads, each on its own (``/proc/self/task/*``, before and after the timed
  epochs: ``comm`` for the name, ``schedstat`` for the CPU time and the time waiting for a
  core, in ns, or ``stat``'s utime + stime where there is no schedstat): the decode pool's
  threads are named ``ferrofeed-cpu-<i>``; everything else (the main thread, the
  ``ferrofeed-rt`` runtime threads that run each batch's op call, the ``ferrofeed-source``
  thread, threads that came and went) is the serial part. "pool busy" = the pool's CPU
  seconds / (wall seconds x the threads at work, ``min(T, the pool's threads)``): the
  per-thread figure, which on 2 cores still falls when threads idle; "pool runnable" adds
  the time they waited for a core (schedstat): it stays near 1 on an oversubscribed machine
  while the threads have work; "serial share" = CPU outside the pool / the process's CPU.
  Where the pool did less than half the work (one thread: the batch decodes on the op's
  own thread), the per-thread figures are shown as "-" and the row says why;
- ferrofeed's own counters of its decode pool, ``loader.stats()["pools"]["decode"]`` (its
  threads, batches and images in flight, busy and idle seconds, ``busy``: the share of
  threads x wall time of the pass its threads spent decoding), recorded as they are ("-"
  where this build has none).

Figures are medians over the rounds with min-max; ratios (proxy, and with ``--compare``
ferrofeed against each peer at the same T and B) are taken round by round, then the median
and range. Every table names the CPU and its number of cores.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import multiprocessing
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

from _common import (
    CROP,
    PillowExact,
    PillowTrain,
    child_entry,
    child_pids,
    cpu_children,
    cpu_self,
    fmt,
    fmt_ratio,
    make_jpegs,
    med_range,
    native_op,
    pack_tar_shards,
    run_fresh,
    shutdown_workers,
    stat_fields,
    tree_pids,
)
from _compare_loaders import BY_KEY, available
from bench_machine import cpu_model, version_of

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "benches" / "results"
QUICK_OUT = REPO_ROOT / "bench-results" / "scaling-quick"
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
POOL_PREFIX = "ferrofeed-cpu"  # the decode pool's threads, "ferrofeed-cpu-<i>" (comm: 15 chars)
CLK_TCK = os.sysconf("SC_CLK_TCK")
# The figures summarized per configuration (medians and ranges), in the tables' order.
METRICS = (
    "images_per_s",
    "threads_busy",
    "pool_busy",
    "pool_runnable",
    "decode_busy",
    "serial_share",
    "cpu_ms_per_image",
)


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


# --- in the child: build the loader, time the epochs, read the threads -------------------------


class ThreadSample(NamedTuple):
    """One thread's name and times so far (seconds)."""

    comm: str
    cpu_s: float
    wait_s: float | None  # time runnable but waiting for a core (schedstat), None without it


def thread_samples() -> dict[int, ThreadSample]:
    """Every live thread of this process: ``{tid: ThreadSample}``.

    CPU and wait times from ``/proc/self/task/TID/schedstat`` (ns: time on a CPU, time
    waiting on a run queue), else the CPU time from ``stat`` (utime + stime, in clock ticks).
    """
    out: dict[int, ThreadSample] = {}
    for entry in os.listdir("/proc/self/task"):
        base = f"/proc/self/task/{entry}"
        try:
            comm = Path(f"{base}/comm").read_text().strip()
            stat = Path(f"{base}/stat").read_text()
        except OSError:
            continue  # it ended meanwhile
        wait: float | None = None
        try:
            on_cpu, waited = Path(f"{base}/schedstat").read_text().split()[:2]
            cpu, wait = int(on_cpu) / 1e9, int(waited) / 1e9
        except (OSError, ValueError):
            fields = stat_fields(stat)
            cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
        out[int(entry)] = ThreadSample(comm, cpu, wait)
    return out


def _proc_cpu_s(pid: int) -> float:
    """CPU seconds of process ``pid`` and its reaped children (``stat``), 0 when it is gone."""
    try:
        fields = stat_fields(Path(f"/proc/{pid}/stat").read_text())
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / CLK_TCK  # utime, stime, cutime, cstime


def tree_cpu_s() -> float:
    """CPU seconds of this process tree so far: this process (all its threads), its reaped
    children, and its live descendants (worker processes)."""
    me = os.getpid()
    return cpu_self() + cpu_children() + sum(_proc_cpu_s(p) for p in tree_pids(me) if p != me)


def thread_figures(
    before: dict[int, ThreadSample],
    after: dict[int, ThreadSample],
    *,
    main_tid: int,
    process_cpu_s: float,
    wall_s: float,
    threads: int,
) -> dict[str, Any]:
    """Where the process's CPU went between two `thread_samples`, and how busy the decode
    pool's threads were.

    ``process_cpu_s`` is the process's CPU over the same span (``getrusage``: it counts the
    threads that ended in between, which the samples cannot). The pool's threads are those
    named `POOL_PREFIX`; its threads at work are ``min(threads, the pool's threads)``.
    """

    def delta(tid: int) -> tuple[float, float | None]:
        a, b = after[tid], before.get(tid)
        if b is None or b.comm != a.comm:  # started in between (or a reused tid)
            b = ThreadSample(a.comm, 0.0, None if a.wait_s is None else 0.0)
        wait = None if a.wait_s is None or b.wait_s is None else a.wait_s - b.wait_s
        return a.cpu_s - b.cpu_s, wait

    by_name: dict[str, float] = {}
    pool_cpu, pool_wait, pool_threads = 0.0, 0.0, 0
    waits_known = True
    for tid, sample in after.items():
        cpu, wait = delta(tid)
        name = "main" if tid == main_tid else re.sub(r"-\d+$", "", sample.comm)
        by_name[name] = by_name.get(name, 0.0) + cpu
        if sample.comm.startswith(POOL_PREFIX):
            pool_threads += 1
            pool_cpu += cpu
            if wait is None:
                waits_known = False
            else:
                pool_wait += wait
    # Threads that ended between the samples (an epoch's pipeline threads): the rest.
    by_name["ended in between"] = max(0.0, process_cpu_s - sum(by_name.values()))
    lanes = min(threads, pool_threads)
    busy = pool_cpu / (wall_s * lanes) if lanes and wall_s > 0 else None
    return {
        "pool_threads": pool_threads,
        "pool_cpu_s": pool_cpu,
        "pool_wait_s": pool_wait if waits_known else None,
        "cpu_by_thread": {k: round(v, 4) for k, v in sorted(by_name.items())},
        "pool_busy": busy,
        "pool_runnable": (
            (pool_cpu + pool_wait) / (wall_s * lanes) if busy is not None and waits_known else None
        ),
        "serial_share": (
            min(1.0, max(0.0, process_cpu_s - pool_cpu) / process_cpu_s)
            if process_cpu_s > 0
            else None
        ),
        "decode_in_pool": process_cpu_s > 0 and pool_cpu >= 0.5 * process_cpu_s,
    }


def build_loader(cfg: Config, spec: dict[str, Any]) -> Any:
    """The loader of ``cfg`` over the spec's data (see the module's docstring)."""
    files = [(p, int(label)) for p, label in spec["files"]]
    seed = spec["seed"]
    if cfg.loader in PEERS:
        from _compare_loaders import TorchvisionJob, torch_loader

        if cfg.loader == "pytorch":
            dataset: Any = PillowExact(files) if cfg.job == "exact" else PillowTrain(files)
        else:
            # torchvision 0.29 deprecates its image decoders (for TorchCodec's) at every call.
            warnings.filterwarnings("ignore", "The image decoding and encoding", DeprecationWarning)
            dataset = TorchvisionJob(files, cfg.job)
        return torch_loader(dataset, cfg.threads, seed, batch_size=cfg.batch)
    import ferrofeed

    op = native_op(cfg.job)
    if cfg.source == "folder":
        return ferrofeed.DataLoader(
            spec["root"],
            cfg.batch,
            shuffle=True,
            seed=seed,
            transform=op,
            num_threads=cfg.threads,
        )
    return ferrofeed.DataLoader(
        ferrofeed.TarShards(spec["tar"]),
        cfg.batch,
        shuffle=True,
        seed=seed,
        shuffle_window=shuffle_window(spec["shuffle_window"], cfg.batch),
        transform=op,
        image="jpg",
        label="cls",
        num_threads=cfg.threads,
    )


def shuffle_window(window: int, batch: int) -> int:
    """``window`` rounded up to a multiple of ``batch``."""
    return math.ceil(window / batch) * batch


def read_epoch(loader: Iterable[Any], cfg: Config) -> tuple[int, float]:
    """Read one epoch; return its images and the seconds to its first batch."""
    t0 = time.perf_counter()
    first, count = 0.0, 0
    for batch in loader:
        images = batch[0]
        if not count:
            first = time.perf_counter() - t0
            shape, dtype = tuple(images.shape[1:]), str(images.dtype)
            if shape != (CROP, CROP, 3) or "uint8" not in dtype:
                raise AssertionError(f"{cfg.key}: batches of {shape} {dtype}")
        count += len(images)
        del batch, images
    return count, first


def child_main(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one configuration in this fresh interpreter; return its figures."""
    cfg = Config(**spec["config"])
    if cfg.loader in PEERS:
        import torch

        torch.set_num_threads(1)
        if cfg.loader == "torchvision":
            import torchvision.io
            import torchvision.transforms.v2  # noqa: F401
    else:
        import ferrofeed  # noqa: F401
    n, me = len(spec["files"]), os.getpid()
    gc.collect()
    cpu_start = tree_cpu_s()
    t0 = time.perf_counter()
    loader = build_loader(cfg, spec)
    build_s = time.perf_counter() - t0
    counts: list[int] = []
    # The warm-up epoch: page cache, thread pools, worker processes.
    count, first = read_epoch(loader, cfg)
    warmup_s = time.perf_counter() - t0
    counts.append(count)
    gc.collect()
    # The threads' samples bracket the timed epochs as closely as the process's CPU time
    # (the span they cover, ``thread_span``, is what their figures are divided by).
    threads_before = thread_samples()
    self_before, span_start = cpu_self(), time.perf_counter()
    tree_before = tree_cpu_s()
    t = time.perf_counter()
    epoch_s: list[float] = []
    for _ in range(spec["epochs"]):
        e = time.perf_counter()
        count, _ = read_epoch(loader, cfg)
        epoch_s.append(time.perf_counter() - e)
        counts.append(count)
    wall = time.perf_counter() - t
    tree_cpu = tree_cpu_s() - tree_before
    thread_span, process_cpu = time.perf_counter() - span_start, cpu_self() - self_before
    threads_after = thread_samples()
    decode_pool: dict[str, Any] = {}
    if cfg.loader == "ferrofeed":
        decode_pool = dict(loader.stats().get("pools", {}).get("decode", {}) or {})
    for i, c in enumerate(counts):
        if c != n:
            raise AssertionError(f"{cfg.key}: epoch {i} gave {c} images, not {n}")
    shutdown_workers(loader)
    del loader
    gc.collect()
    multiprocessing.active_children()  # reaps the workers that ended
    left = child_pids(me)
    images = n * len(epoch_s)
    out: dict[str, Any] = {
        "config": asdict(cfg),
        "key": cfg.key,
        "python": platform.python_version(),
        # Building the loader, and its first batch (worker and thread start-up included).
        "ttfb_s": build_s + first,
        "warmup_s": warmup_s,
        "images_per_epoch": counts,  # the warm-up epoch first
        "epoch_s": epoch_s,
        "wall_s": wall,
        "images": images,
        "images_per_s": images / wall,
        "cpu_s": tree_cpu,
        "cpu_process_s": process_cpu,
        "cpu_ms_per_image": tree_cpu / images * 1e3,
        "threads_busy": tree_cpu / wall / cfg.threads,
        "images_per_thread_per_batch": cfg.per_thread,
        "decode_pool": decode_pool,
        # From building the loader until its workers were ended and reaped.
        "cpu_loader_s": tree_cpu_s() - cpu_start,
        "children_left": len(left),
    }
    figures: dict[str, Any] = {
        "pool_busy": None,
        "pool_runnable": None,
        "serial_share": None,
        "decode_in_pool": None,
    }
    if cfg.loader == "ferrofeed":
        figures = thread_figures(
            threads_before,
            threads_after,
            main_tid=me,
            process_cpu_s=process_cpu,
            wall_s=thread_span,
            threads=cfg.threads,
        )
    return {**out, **figures}


# --- in the parent: the plan, the rounds, the summaries -----------------------------------------


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


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and range of each of `METRICS` over the rounds (None where no round has it)."""
    out: dict[str, Any] = {}
    for metric in METRICS:
        if metric == "decode_busy":
            values = [r["decode_pool"].get("busy") for r in runs]
        else:
            values = [r.get(metric) for r in runs]
        known = [float(v) for v in values if v is not None]
        out[metric] = med_range(known) if known else None
    return out


def proxy_ratios(runs: dict[str, list[dict[str, Any]]], threads: list[int]) -> list[dict[str, Any]]:
    """Each loader's proxy pairs that ran: images/s of batches of 2T over batches of 32, on
    T threads, round by round."""
    out = []
    for loader in ("ferrofeed", *PEERS):
        for small, base in proxy_pairs(threads, loader):
            a, b = runs.get(small.key, []), runs.get(base.key, [])
            rounds = min(len(a), len(b))
            if not rounds:
                continue
            out.append(
                {
                    "loader": loader,
                    "threads": small.threads,
                    "batch": small.batch,
                    "base_batch": base.batch,
                    "small": small.key,
                    "base": base.key,
                    "ratio": med_range(
                        [a[i]["images_per_s"] / b[i]["images_per_s"] for i in range(rounds)]
                    ),
                }
            )
    return out


def peer_ratios(
    configs: dict[str, Config], runs: dict[str, list[dict[str, Any]]]
) -> dict[str, dict[str, Any]]:
    """ferrofeed (image folder) against each peer at the same T, B and job, round by round:
    images/s (>1: ferrofeed faster) and CPU per image (>1: ferrofeed uses less)."""
    out: dict[str, dict[str, Any]] = {}
    for key, cfg in configs.items():
        if cfg.loader != "ferrofeed" or cfg.source != "folder":
            continue
        for peer in PEERS:
            other = Config(peer, cfg.source, cfg.job, cfg.threads, cfg.batch).key
            rounds = min(len(runs.get(key, [])), len(runs.get(other, [])))
            if not rounds:
                continue
            per = [(runs[key][i], runs[other][i]) for i in range(rounds)]
            out.setdefault(key, {})[peer] = {
                "throughput": med_range([a["images_per_s"] / b["images_per_s"] for a, b in per]),
                "cpu_per_image_less": med_range(
                    [b["cpu_ms_per_image"] / a["cpu_ms_per_image"] for a, b in per]
                ),
            }
    return out


def targets(results: dict[str, Any]) -> list[str]:
    """The issue's targets, each with what this run measured (from the medians)."""
    cores, summary = results["cores"], results["summary"]
    configs = {k: Config(**c) for k, c in results["configs"].items()}
    lines = []
    for p in results["proxy"]:
        if p["loader"] != "ferrofeed":
            continue
        r = p["ratio"]["median"]
        lines.append(
            f"{p['batch']} images a batch on {p['threads']} thread{'s' * (p['threads'] > 1)} "
            f"(2 per thread) give {r:.2f}x the images/s of batches of {p['base_batch']} "
            f"(target >= 0.95x): {'met' if r >= 0.95 else 'NOT met'}"
        )
    # The serial target is about the training job's batches of 32 (the batch size
    # of the 16-core runs); smaller batches are the proxy's, and their share is shown apart.
    for source in SOURCES:
        for small in (False, True):
            shares = [
                (summary[k]["serial_share"]["median"], k)
                for k, c in configs.items()
                if c.loader == "ferrofeed"
                and c.source == source
                and (c.batch < PROXY_BASE if small else c.batch == PROXY_BASE)
                and summary[k]["serial_share"] is not None
                and all(r["decode_in_pool"] for r in results["runs"][k])
            ]
            if not shares:
                continue
            worst, key = max(shares)
            if small:
                lines.append(
                    f"serial part at batches under {PROXY_BASE} ({source}; no target, for "
                    f"reference): largest median share {worst:.1%} ({key})"
                )
            else:
                lines.append(
                    f"serial part (CPU outside the decode pool) at batches of {PROXY_BASE} "
                    f"({source}), largest median share: {worst:.1%} ({key}; target <= 2%): "
                    f"{'met' if worst <= 0.02 else 'NOT met'}"
                )
    full = [
        (summary[k]["threads_busy"]["median"], k)
        for k, c in configs.items()
        if c.loader == "ferrofeed" and c.threads == 16 and cores >= 16
    ]
    if full:
        least, key = min(full)
        lines.append(
            f"threads busy at 16 threads on {cores} cores, smallest median: {least:.0%} "
            f"({key}; target >= 95%): {'met' if least >= 0.95 else 'NOT met'}"
        )
    else:
        lines.append(
            f"threads busy at 16 threads on 16 cores: not measurable here ({cores} cores; "
            "the proxy rows stand in for it)"
        )
    return lines


# --- report --------------------------------------------------------------------------------------


def _cell(stat: dict[str, float] | None, scale: float = 1.0, digits: int = 0) -> str:
    """`fmt`, or ``-`` for a figure this row does not have."""
    return "-" if stat is None else fmt(stat, scale, digits)


def markdown(results: dict[str, Any]) -> str:
    """The tables: every row, the proxy, ferrofeed against the peers, the targets."""
    cpu, cores = results["cpu"], results["cores"]
    configs = {k: Config(**c) for k, c in results["configs"].items()}
    summary = results["summary"]
    epochs, rounds = results["args"]["epochs"], results["args"]["rounds"]
    data = results["data"]
    lines = [
        f"#### Scaling of the native chain, on {cpu} ({cores} cores)",
        "",
        f"{data['n']:,} JPEGs (image folder"
        + (f", and tar shards of {data['per_shard']}" if data["shards"] else "")
        + f"), {epochs} timed epoch{'s' * (epochs != 1)} after a "
        f"warm-up, {rounds} round{'s' * (rounds != 1)}: medians (min-max). Threads busy: CPU "
        "of the process tree / wall / T; pool busy: the decode pool's CPU / wall / its threads "
        "at work (per thread); pool runnable: the same with the time they waited for a core; "
        "pool busy (own count): ferrofeed's counter; serial share: CPU outside the decode pool "
        "/ the process's CPU. Rows with more threads than the machine's "
        f"{cores} cores say so.",
        "",
        "| loader | source | job | threads | batch | images/thread/batch | images/s "
        "| threads busy (%) | pool busy (%) | pool runnable (%) | pool busy, own count (%) "
        "| serial share (%) | CPU ms/image | note |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for key, cfg in configs.items():
        s, runs = summary[key], results["runs"][key]
        in_pool = cfg.loader != "ferrofeed" or all(r["decode_in_pool"] for r in runs)
        label = LABELS[cfg.loader]
        label = f"**{label}**" if cfg.loader == "ferrofeed" else label
        per_thread = _cell(s["pool_busy"], 100) if in_pool else "-"
        runnable = _cell(s["pool_runnable"], 100) if in_pool else "-"
        serial = _cell(s["serial_share"], 100, 1) if in_pool else "-"
        lines.append(
            f"| {label} | {cfg.source} | {JOB_NAMES[cfg.job]} | {cfg.threads} | {cfg.batch} "
            f"| {cfg.per_thread:g} | {fmt(s['images_per_s'])} | {_cell(s['threads_busy'], 100)} "
            f"| {per_thread} | {runnable} | {_cell(s['decode_busy'], 100)} | {serial} "
            f"| {fmt(s['cpu_ms_per_image'], digits=2)} | {results['notes'].get(key, '')} |"
        )
    lines.append("")
    if results["proxy"]:
        lines += [
            "Two images per thread per batch (what batches of 32 on 16 threads give each "
            "thread), against batches of 32 on as many threads: training job, image folder "
            "(ratios per round, then median and range):",
            "",
            "| loader | threads | batch | images/s | batch 32, images/s | small batch / batch 32 |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for p in results["proxy"]:
            lines.append(
                f"| {LABELS[p['loader']]} | {p['threads']} | {p['batch']} "
                f"| {fmt(summary[p['small']]['images_per_s'])} "
                f"| {fmt(summary[p['base']]['images_per_s'])} | {fmt_ratio(p['ratio'])} |"
            )
        lines.append("")
    if results["peer_ratios"]:
        lines += [
            "ferrofeed's native chain against each peer with as many worker processes as it "
            "has threads, same batch size, image folder (per round, then median and range; "
            "above 1 is better for ferrofeed):",
            "",
            "| job | threads | batch | against | images/s | less CPU per image |",
            "|---|---:|---:|---|---:|---:|",
        ]
        for key, by_peer in results["peer_ratios"].items():
            cfg = configs[key]
            for peer, r in by_peer.items():
                lines.append(
                    f"| {JOB_NAMES[cfg.job]} | {cfg.threads} | {cfg.batch} | {LABELS[peer]} "
                    f"| {fmt_ratio(r['throughput'])} | {fmt_ratio(r['cpu_per_image_less'])} |"
                )
        lines.append("")
    if results["not_run"]:
        lines += ["Not run:", ""]
        lines += [f"- {LABELS[k]}: {why}" for k, why in results["not_run"].items()]
        lines.append("")
    lines += ["Targets:", ""] + [f"- {t}" for t in results["targets"]] + [""]
    return "\n".join(lines)


def report(results: dict[str, Any], out_dir: Path, name: str) -> None:
    """Write ``{name}.md`` into ``out_dir`` and print it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md = markdown(results)
    (out_dir / f"{name}.md").write_text(md + "\n")
    print()
    print(md)
    print(f"results: {out_dir / f'{name}.json'}, {out_dir / f'{name}.md'}")


# --- main --------------------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``."""
    return [int(x) for x in text.split(",") if x.strip()]


def _names(text: str, allowed: tuple[str, ...], what: str, p: argparse.ArgumentParser) -> list[str]:
    """A comma-separated subset of ``allowed``."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    if unknown := set(names) - set(allowed):
        p.error(f"unknown {what}: {sorted(unknown)} (of {','.join(allowed)})")
    return names


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line (see the module's docstring)."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--n", type=int, default=None, help="JPEGs (default 2000; --quick: 512)")
    p.add_argument(
        "--epochs", type=int, default=None, help="timed epochs after the warm-up (default 2)"
    )
    p.add_argument("--rounds", type=int, default=None, help="turns of each row (default 2)")
    p.add_argument("--threads", default=",".join(map(str, THREADS)), help="threads (T) to run")
    p.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)), help="batch sizes")
    p.add_argument("--sources", default=",".join(SOURCES), help="subset of folder,tar")
    p.add_argument("--jobs", default=",".join(JOBS), help="subset of train,exact")
    p.add_argument(
        "--proxy-threads",
        default="1,2",
        help="the proxy rows: batches of 2T against batches of 32 on T threads, training, "
        "image folder, for each T given ('': none; default 1,2)",
    )
    p.add_argument("--proxy-only", action="store_true", help="only the proxy rows")
    p.add_argument(
        "--compare",
        action="store_true",
        help="also PyTorch DataLoader + Pillow and + torchvision v2 with T workers, batch B",
    )
    p.add_argument(
        "--shard-size", type=int, default=None, help="samples per tar shard (default 250)"
    )
    p.add_argument(
        "--shuffle-window",
        type=int,
        default=1024,
        help="tar shards' shuffle window, rounded up to a multiple of the batch (default 1024)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1200.0, help="per run, seconds")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 512 images, shards of 64, 1 round, 1 timed epoch (what is given "
        "explicitly stays)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where results go (default benches/results; --quick: bench-results/scaling-quick)",
    )
    p.add_argument("--name", default="scaling", help="stem of the result files")
    p.add_argument(
        "--replot", type=Path, default=None, help="only write the tables of a JSON again"
    )
    args = p.parse_args(argv)
    defaults = (512, 1, 1, 64) if args.quick else (2000, 2, 2, 250)
    for name, value in zip(("n", "epochs", "rounds", "shard_size"), defaults, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.out is None:  # a quick run leaves the committed results alone
        args.out = QUICK_OUT if args.quick else DEFAULT_OUT
    args.threads = _ints(args.threads)
    args.batch_sizes = _ints(args.batch_sizes)
    args.proxy_threads = _ints(args.proxy_threads)
    args.sources = _names(args.sources, SOURCES, "sources", p)
    args.jobs = _names(args.jobs, JOBS, "jobs", p)
    if min([*args.threads, *args.batch_sizes, *args.proxy_threads], default=1) < 1:
        p.error("threads and batch sizes must be >= 1")
    if args.epochs < 1 or args.rounds < 1 or args.shard_size < 1 or args.shuffle_window < 1:
        p.error("--epochs, --rounds, --shard-size and --shuffle-window must be >= 1")
    return args


def machine() -> dict[str, Any]:
    """The CPU, its cores, the memory, and ferrofeed's build as the runs load it."""
    cores = os.cpu_count() or 1
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    probe = subprocess.run(
        [sys.executable, "-c", "import json, ferrofeed; print(json.dumps(ferrofeed.build_info()))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return {
        "cpu": cpu_model(),
        "cores": cores,
        "machine": f"{cpu_model()}, {platform.machine()}, {cores} CPUs, {mem:.0f} GiB",
        "ferrofeed": json.loads(probe.stdout),
        "versions": {
            "python": platform.python_version(),
            **{d: version_of(d) for d in ("numpy", "pillow", "scikit-image", "torch")},
            "torchvision": version_of("torchvision"),
        },
    }


def main(argv: list[str] | None = None) -> int:
    """Run the rows in fresh interpreters, round by round; write the JSON and the tables."""
    argv = sys.argv if argv is None else argv
    if child_entry(argv, child_main):
        return 0
    args = parse_args(argv[1:])
    if args.replot:
        saved = json.loads(args.replot.read_text())
        saved["targets"] = targets(saved)  # as this version of the script reads them
        report(saved, args.out, args.name)
        return 0
    peers, not_run = [], {}
    for peer in PEERS if args.compare else ():
        ok, why = available(BY_KEY[PEER_PROBES[peer]], None)
        if ok:
            peers.append(peer)
        else:
            not_run[peer] = why
            print(f"skipped {peer} ({LABELS[peer]}): {why}", flush=True)
    configs = plan(args, peers)
    if not configs:
        print("nothing to run: no threads, batch sizes, sources or jobs", file=sys.stderr)
        return 2
    largest = max(c.batch for c in configs)
    if args.n < largest:
        print(f"--n {args.n} is less than a batch of {largest}", file=sys.stderr)
        return 2
    results: dict[str, Any] = {
        **machine(),
        "command": "python benches/scaling.py " + " ".join(argv[1:]),
        "args": {k: v if isinstance(v, int | list) else str(v) for k, v in vars(args).items()},
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "not_run": not_run,
        "configs": {c.key: asdict(c) for c in configs},
    }
    cores = results["cores"]
    print(
        f"{results['machine']}; ferrofeed {results['ferrofeed']['version']} "
        f"({results['ferrofeed']['native_build']}); {len(configs)} rows x {args.rounds} rounds",
        flush=True,
    )
    runs: dict[str, list[dict[str, Any]]] = {c.key: [] for c in configs}
    workdir = tempfile.mkdtemp(
        prefix="ferrofeed-scaling-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    )
    try:
        t = time.perf_counter()
        image_dir = os.path.join(workdir, "images")
        files, info = make_jpegs(image_dir, args.n, args.seed, varied=True, folders=True)
        tar = (
            pack_tar_shards(files, os.path.join(workdir, "tar"), args.shard_size)
            if any(c.source == "tar" for c in configs)
            else []
        )
        results["data"] = {
            **info,
            "n": args.n,
            "per_shard": args.shard_size,
            "shards": len(tar),
            "shuffle_window": args.shuffle_window,
            "made_s": round(time.perf_counter() - t, 1),
        }
        print(
            f"{args.n} JPEGs from scikit-image's photos, {info['mean_file_bytes'] / 1024:.0f} "
            f"KiB on average{f', in {len(tar)} tar shards too' if tar else ''}; load average "
            f"{results['loadavg_start']}",
            flush=True,
        )
        base = {
            "files": files,
            "root": image_dir,
            "tar": tar,
            "seed": args.seed,
            "epochs": args.epochs,
            "shuffle_window": args.shuffle_window,
        }
        for rnd in range(args.rounds):
            # Rotate the order each round, so that no row always follows the same one.
            shift = rnd % len(configs)
            for cfg in configs[shift:] + configs[:shift]:
                spec = {**base, "config": asdict(cfg)}
                r = run_fresh(__file__, spec, workdir, args.timeout)
                runs[cfg.key].append(r)
                print(f"[round {rnd + 1}/{args.rounds}] {progress_line(cfg, r, cores)}", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    results["runs"] = runs
    results["summary"] = {k: summarize(rs) for k, rs in runs.items()}
    results["notes"] = {c.key: note(c, runs[c.key], cores) for c in configs}
    results["proxy"] = proxy_ratios(runs, args.proxy_threads)
    results["peer_ratios"] = peer_ratios({c.key: c for c in configs}, runs)
    results["targets"] = targets(results)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(results, indent=1))
    report(results, args.out, args.name)
    return 0


def progress_line(cfg: Config, r: dict[str, Any], cores: int) -> str:
    """One run's figures, as printed when it ends."""

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.0%}"

    # Where the pool did not decode (one thread), its figures mean nothing: "-", as in the table.
    in_pool = bool(r["decode_in_pool"])
    serial = r["serial_share"] if in_pool else None
    return (
        f"{cfg.key:34s} {r['images_per_s']:7.0f} images/s, threads busy "
        f"{pct(r['threads_busy'])}, pool busy {pct(r['pool_busy'] if in_pool else None)}, "
        f"serial {'-' if serial is None else f'{serial:.1%}'}, {r['cpu_ms_per_image']:5.2f} CPU "
        f"ms/image" + (f" ({note(cfg, [r], cores)})" if note(cfg, [r], cores) else "")
    )


if __name__ == "__main__":
    sys.exit(main())
