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

Each configuration runs in a fresh interpreter (``_runs.run_fresh``), the configurations
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
import os
import platform
import shutil
import subprocess
import sys
import time
import warnings
from dataclasses import asdict
from typing import Any

from _common import PillowExact, PillowTrain, make_images, native_op, scratch_dir, shutdown_workers
from _compare_loaders import BY_KEY, available
from _rounds import (
    add_result_options,
    add_run_options,
    better,
    fill_defaults,
    med_range,
    results_dir,
    rotated,
    runnable,
    same_rounds,
    subset,
)
from _runs import cpu_self, read_epoch, reap_children, run_fresh, run_script
from _scaling_report import progress_line, report, targets
from _scaling_rows import (
    BATCH_SIZES,
    JOBS,
    LABELS,
    PEER_PROBES,
    PEERS,
    SOURCES,
    THREADS,
    Config,
    note,
    plan,
    proxy_pairs,
)
from _scaling_threads import thread_figures, thread_samples, tree_cpu_s
from bench_machine import loadavg, stamp, versions

QUICK_DIR = "scaling-quick"  # under bench-results/: a quick run's results
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


# --- in the child: build the loader, time the epochs, read the threads -------------------------


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
    count, first = read_epoch(loader, cfg.key)
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
        count, _ = read_epoch(loader, cfg.key)
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
    children_left = reap_children()
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
        "children_left": children_left,
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
            per = same_rounds(runs.get(small.key, []), runs.get(base.key, []))
            if not per:
                continue
            out.append(
                {
                    "loader": loader,
                    "threads": small.threads,
                    "batch": small.batch,
                    "base_batch": base.batch,
                    "small": small.key,
                    "base": base.key,
                    "ratio": better(per, "images_per_s"),
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
            per = same_rounds(runs.get(key, []), runs.get(other, []))
            if not per:
                continue
            out.setdefault(key, {})[peer] = {
                "throughput": better(per, "images_per_s"),
                "cpu_per_image_less": better(per, "cpu_ms_per_image", lower=True),
            }
    return out


# --- main --------------------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``."""
    return [int(x) for x in text.split(",") if x.strip()]


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
    add_run_options(
        p,
        timeout=1200.0,
        quick="a smoke run: 512 images, shards of 64, 1 round, 1 timed epoch (what is given "
        "explicitly stays)",
    )
    add_result_options(
        p, quick_dir=QUICK_DIR, replot="only write the tables of a JSON again", flag="--out"
    )
    p.add_argument("--name", default="scaling", help="stem of the result files")
    args = p.parse_args(argv)
    fill_defaults(args, n=(2000, 512), epochs=(2, 1), rounds=(2, 1), shard_size=(250, 64))
    args.out = results_dir(args.out, args.quick, QUICK_DIR)
    args.threads = _ints(args.threads)
    args.batch_sizes = _ints(args.batch_sizes)
    args.proxy_threads = _ints(args.proxy_threads)
    args.sources = subset(args.sources, SOURCES, "sources", p)
    args.jobs = subset(args.jobs, JOBS, "jobs", p)
    if min([*args.threads, *args.batch_sizes, *args.proxy_threads], default=1) < 1:
        p.error("threads and batch sizes must be >= 1")
    if args.epochs < 1 or args.rounds < 1 or args.shard_size < 1 or args.shuffle_window < 1:
        p.error("--epochs, --rounds, --shard-size and --shuffle-window must be >= 1")
    return args


def ferrofeed_build() -> dict[str, Any]:
    """ferrofeed's build as the runs load it, and the versions of what they run."""
    probe = subprocess.run(
        [sys.executable, "-c", "import json, ferrofeed; print(json.dumps(ferrofeed.build_info()))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return {
        "ferrofeed": json.loads(probe.stdout),
        "versions": versions("numpy", "pillow", "scikit-image", "torch", "torchvision"),
    }


def main(argv: list[str]) -> int:
    """Run the rows in fresh interpreters, round by round; write the JSON and the tables."""
    args = parse_args(argv)
    if args.replot:
        saved = json.loads(args.replot.read_text())
        saved["targets"] = targets(saved)  # as this version of the script reads them
        report(saved, args.out, args.name)
        return 0
    peers, not_run = runnable(
        {p: available(BY_KEY[PEER_PROBES[p]], None) for p in PEERS if args.compare}, LABELS
    )
    configs = plan(args, peers)
    if not configs:
        print("nothing to run: no threads, batch sizes, sources or jobs", file=sys.stderr)
        return 2
    largest = max(c.batch for c in configs)
    if args.n < largest:
        print(f"--n {args.n} is less than a batch of {largest}", file=sys.stderr)
        return 2
    results: dict[str, Any] = {
        **stamp("scaling.py", argv),
        "cores": os.cpu_count() or 1,
        **ferrofeed_build(),
        "args": {k: v if isinstance(v, int | list) else str(v) for k, v in vars(args).items()},
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
    workdir = scratch_dir("ferrofeed-scaling-")
    try:
        tar_rows = any(c.source == "tar" for c in configs)
        files, tar, data = make_images(
            workdir,
            args.n,
            args.seed,
            folders=True,
            per_shard=args.shard_size if tar_rows else None,
        )
        results["data"] = {**data, "shuffle_window": args.shuffle_window}
        base = {
            "files": files,
            "root": os.path.join(workdir, "images"),
            "tar": tar,
            "seed": args.seed,
            "epochs": args.epochs,
            "shuffle_window": args.shuffle_window,
        }
        for rnd in range(args.rounds):
            for cfg in rotated(configs, rnd):
                spec = {**base, "config": asdict(cfg)}
                r = run_fresh(__file__, spec, workdir, args.timeout)
                runs[cfg.key].append(r)
                print(f"[round {rnd + 1}/{args.rounds}] {progress_line(cfg, r, cores)}", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results["loadavg_end"] = loadavg()
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


if __name__ == "__main__":
    sys.exit(run_script(main, child_main))
