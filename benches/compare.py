"""Data loaders side by side on the same images and jobs: numbers, tables and plots.

``make compare`` installs the peers and runs this script; ``make compare COMPARE_ARGS=--quick``
is a short run. Directly: ``python benches/compare.py [--n 2000] [--rounds 3] [--quick]``.
Results: ``--out-dir`` (default benches/results/, where the committed ones are; with
``--quick``, bench-results/compare-quick/) gets compare.json, compare.md (the tables that
BENCHMARKS.md quotes) and the PNG plots; ``--replot FILE`` redraws them from a JSON.

Data: ``--n`` ImageNet-like JPEGs made from the real photos in scikit-image's wheel (random
crops, scales, flips, mild colour jitter; about 500x375, some portrait, some up to 1000 px;
quality 75-95, mostly 4:2:0, some progressive and greyscale; a label each), from ``--seed``
(see ``_common.make_jpegs``), in a temporary folder; and COCO-like annotation lists for the
metadata job.

Jobs, batches of 32, shuffled, uint8 224x224x3 images with int labels out:

- ``exact``: resize the shorter side to 256 (bilinear), center crop 224 (ImageNet's
  evaluation transform);
- ``train``: torchvision's RandomResizedCrop(224) (scale 0.08-1, ratio 3/4-4/3) and a random
  horizontal flip;
- ``shards``: the training job over the same JPEGs packed as shards of ``--shard-size``
  (default 200) images: WebDataset tar shards (``{i:06d}.jpg`` and ``{i:06d}.cls``, written
  with ``tarfile``) and Parquet files in the Hugging Face layout (an ``image`` struct of
  ``bytes`` and ``path``, an int ``label``, the ``Image`` feature in the schema's metadata;
  row groups of 100), shuffled within a window of ``--shuffle-window`` (default 1000)
  samples. ``make compare-shards`` (``--jobs shards --name shards_compare``) runs it alone;
- ``ram``: metadata only (the RAM study's experiment: COCO-like annotation dicts read by
  worker processes from a plain list, the study's NumpySerializedList, and ferrofeed's
  SharedList), run through benches/ram_study.py (see `ram_experiment`).

Loaders (`LOADERS`) of the image-file jobs: PyTorch's DataLoader with the Pillow transform
(0, 1, 2, 4 workers); PyTorch's DataLoader with torchvision's decoder and ``transforms.v2``
on uint8 tensors (2 and 4 workers; see `TorchvisionJob`), what speed-minded PyTorch users
pick today; SPDL 0.8 (its PipelineBuilder and its FFmpeg decoder and filters); ferrofeed's
native chain (decode, resize, crop and the random flip in Rust); ferrofeed's DataLoader
running the same Pillow transform as PyTorch on threads and in worker processes;
dataloader-rs (threads; the same Pillow transform; it needs Python >= 3.13, so it runs in its
own interpreter, ``--py313``) and datago, where they install and can do the job. Of the
shards job: ferrofeed's native chain over ``TarShards`` and over ``ParquetShards``
(``shuffle_window=``, ``image=``, ``label=``), and over the image files themselves (the
image-folder path, for the CPU per image); webdataset's usual pipeline in PyTorch's
DataLoader with Pillow (2 and 4 workers; `webdataset_loader`); Hugging Face ``datasets`` over
the Parquet files, map-style and streaming, in PyTorch's DataLoader with Pillow (2 and 4
workers; `hf_loader`); the ratios are quoted for the tar source, and each ferrofeed source is
also set against the fastest peer of each round and against the image-folder path. Each (job,
loader) runs in a fresh interpreter, the loaders taking turns, ``--rounds`` rounds with the
order rotated each round. A loader that cannot run here (not installed, or its probe fails)
is skipped with a printed line and listed in the results.

In each run: the loader is built and the time to the first batch taken (construction,
worker and thread start-up included); then ``--epochs`` epochs (default 3): the first is the
warm-up (files in the page cache, workers started), the others give the steady images/s.
CPU seconds per 1000 images: the CPU time of the whole process tree, from building the
loader until its workers are ended and reaped (``getrusage`` of the interpreter, all its
threads, plus its reaped children's), over all images loaded; the interpreter's imports
before and its exit after are left out (a run that leaves a worker alive is flagged). Every
run imports torch first when it is installed, as a training script would. Memory: the
total PSS of the process tree (``/proc/PID/smaps_rollup`` of the child and all its
descendants), sampled from this process every ``--pss-interval`` seconds and at the end of
each epoch by the child: the peak, the peak less the tree's PSS just before the loader was
built ("added by the loader"), and the growth from the end of the first epoch to the end of
the last. Figures are medians over the rounds with min-max; ferrofeed's ratios to each peer
are taken round by round (the two ran within minutes of each other), then the median and
range of those. Every figure names the CPU it was measured on (the results' ``cpu`` and
``machine``, the tables' headings, the plots' titles).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from typing import Any

from _common import make_images, pack_parquet_shards, pack_tar_shards, scratch_dir
from _compare_loaders import (
    BATCH,
    BY_KEY,
    JOBS,
    LOADERS,
    Loader,
    available,
    batch_images,
    build,
    torchvision_requirement,
)
from _compare_report import best_peer_ratios, peer_ratios, ratios, report, summarize
from _rounds import (
    add_result_options,
    add_run_options,
    fill_defaults,
    results_dir,
    rotated,
    runnable,
    subset,
)
from _runs import LoaderCosts, add_tree_figures, read_epoch, run_fresh, run_script
from bench_machine import loadavg, stamp, version_of, versions

MIB = 1 << 20
QUICK_DIR = "compare-quick"  # under bench-results/: a quick run's results


def child_main(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one (job, loader) in this fresh interpreter; return its figures."""
    lo, job = BY_KEY[spec["loader"]], spec["job"]
    # Every run imports torch first when it is installed, as a training script would: the
    # memory then compares loaders, not imports.
    if spec["import_torch"] and importlib.util.find_spec("torch") is not None:
        import torch

        torch.set_num_threads(1)
    # The loader's own library is imported before the measurement starts, as torch is.
    if lo.ferrofeed:
        import ferrofeed  # noqa: F401
    if lo.family == "torchvision":
        import torchvision.io
        import torchvision.transforms.v2  # noqa: F401
    if lo.family in ("webdataset", "hf"):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files: nothing to look up
        importlib.import_module(lo.module)
    if lo.family == "hf":
        import datasets

        datasets.disable_progress_bars()
    n = len(spec["files"])
    costs = LoaderCosts()
    t0 = time.perf_counter()
    epochs_it = build(lo, job, spec)
    ttfb = 0.0
    epoch_s: list[float] = []
    for epoch in range(spec["epochs"]):
        t = time.perf_counter() if epoch else t0
        count, first = read_epoch(next(epochs_it), lo.key, since=t, images_of=batch_images)
        ttfb = ttfb or first
        epoch_s.append(time.perf_counter() - t)
        costs.epoch_end()
        if count != n:
            raise AssertionError(f"{lo.key}: epoch {epoch} gave {count} images, not {n}")
    epochs_it.close()  # ends worker processes, threads, pipelines
    del epochs_it
    # The CPU time from building the loader to here: the interpreter's own exit (torch's
    # teardown) is not the loader's.
    steady = epoch_s[1:] or epoch_s
    return {
        "loader": lo.key,
        "job": job,
        "python": platform.python_version(),
        "ttfb_s": ttfb,
        "epoch_s": epoch_s,
        "images_per_s": n * len(steady) / sum(steady),
        "images": n * len(epoch_s),
        **costs.end(),
        "torch_imported": "torch" in sys.modules,
    }


# --- running the rounds ------------------------------------------------------------------------


def run_one(
    lo: Loader, job: str, base: dict[str, Any], workdir: str, args: argparse.Namespace
) -> dict[str, Any]:
    """One (job, loader) in a fresh interpreter, with the tree's CPU time and PSS samples."""
    spec = {**base, "loader": lo.key, "job": job}
    python = args.py313 if lo.python == "py313" else sys.executable
    r = add_tree_figures(
        run_fresh(
            __file__, spec, workdir, args.timeout, pss_interval=args.pss_interval, python=python
        )
    )
    r["pss_growth"] = r["pss_epoch_end"][-1] - r["pss_epoch_end"][0]
    return r


def ram_experiment(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    """The metadata-only job: the RAM study's experiment with the loaders themselves.

    The one place that calls it: benches/ram_loaders.py's ``run_loader_ram`` starts
    ``--ram-ranks`` rank processes (as torchrun does), each iterating ferrofeed's
    DataLoader over one shared ``SharedList`` or PyTorch's DataLoader over its own Python
    list, with ``--ram-workers`` worker processes each, and samples the PSS of the whole
    process tree over time; a baseline of each (same imports, loader and workers, a few
    items) gives the job's own footprint. ``--ram-methods`` picks the start methods
    (PyTorch's DataLoader under forkserver pickles the list into every worker: about 27 GiB
    at 1M entries, so fork only by default).
    """
    from ram_loaders import run_loader_ram

    res = run_loader_ram(
        n=args.ram_n,
        ranks=args.ram_ranks,
        workers=args.ram_workers,
        methods=args.ram_methods,
        epochs=1 if args.quick else None,
        batch_size=128 if args.quick else None,
        seed=args.seed,
        interval=args.pss_interval,
        timeout=args.timeout,
        shm_dir=workdir if not os.path.isdir("/dev/shm") else None,
        verbose=not args.no_progress,
    )
    base = {
        (c["method"], c["loader"]): c.get("steady_total_pss")
        for c in res["configs"]
        if c.get("baseline") and c.get("round") == 0
    }
    names = {"ferrofeed": "ferrofeed DataLoader + SharedList", "torch": "PyTorch DataLoader + list"}
    runs = [
        {
            "container": f"{names.get(c['loader'], c['loader'])}, {c['method']}",
            "n": c["n"],
            "peak_total_pss": c.get("peak_total_pss") or 0,
            # The median over the last epoch; a run too short to have one: its last sample.
            "total_pss_end": c.get("steady_total_pss")
            or (c["series"][-1]["total_pss"] if c.get("series") else 0),
            "footprint": base.get((c["method"], c["loader"])),
            "lower_bound": bool(c.get("aborted")),
            "iterate_s": c.get("wall_s", 0.0),
            "series": [(rec["t"], rec["total_pss"]) for rec in c.get("series", [])],
        }
        for c in res["configs"]
        if not c.get("baseline") and c.get("round") == 0 and not c.get("error")
    ]
    if not runs:
        raise RuntimeError(f"RAM experiment: no run completed: {res.get('notes')}")
    return {
        "layout": f"{args.ram_ranks} ranks x {args.ram_workers} workers",
        "runs": runs,
        "targets": res.get("targets"),
        "notes": res.get("notes"),
    }


# --- main --------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=None, help="JPEGs (default 2000; --quick: 96)")
    p.add_argument("--rounds", type=int, default=None, help="turns of each loader (default 3)")
    p.add_argument("--epochs", type=int, default=3, help="epochs per run, the first a warm-up")
    p.add_argument(
        "--jobs", default="exact,train,shards,ram", help="subset of exact,train,shards,ram"
    )
    p.add_argument(
        "--shard-size",
        type=int,
        default=None,
        help="images per shard (shards job; default 200; --quick: 16)",
    )
    p.add_argument(
        "--shuffle-window",
        type=int,
        default=1000,
        help="samples held for shuffling by the shard loaders (shards job; default 1000)",
    )
    p.add_argument(
        "--name",
        default="compare",
        help="stem of the result files (default compare: compare.json, compare.md, compare_*.png)",
    )
    p.add_argument("--loaders", default="all", help=f"subset of {','.join(BY_KEY)}")
    p.add_argument(
        "--ram-n",
        type=int,
        default=None,
        help="COCO-like entries (default 1M; the plain list then needs about 16 GiB)",
    )
    p.add_argument("--ram-ranks", type=int, default=2, help="ranks (RAM job)")
    p.add_argument("--ram-workers", type=int, default=None, help="workers per rank (default 4)")
    p.add_argument(
        "--ram-methods",
        default="fork",
        help="start methods of the RAM job, a subset of fork,forkserver (default fork)",
    )
    p.add_argument("--py313", default=None, help="a Python >= 3.13 with dataloader-rs")
    p.add_argument("--pss-interval", type=float, default=1.0, help="PSS sampling, seconds")
    add_run_options(p, timeout=1200.0, quick="a short run: small sizes, 1 round")
    add_result_options(
        p,
        quick_dir=QUICK_DIR,
        replot="only redraw the tables and plots of a compare.json (into --out-dir)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--torchvision-requirement",
        action="store_true",
        help="only print the pip requirement of the torchvision built for the installed torch "
        "(make compare-deps installs it)",
    )
    p.add_argument(
        "--no-torch-import",
        action="store_true",
        help="do not import torch in the runs of loaders that do not need it (quicker; "
        "their memory then lacks torch's, which a training process has)",
    )
    args = p.parse_args(argv)
    # --quick: small sizes and one round.
    fill_defaults(
        args,
        n=(2000, 96),
        rounds=(3, 1),
        ram_n=(1_000_000, 20_000),
        ram_workers=(4, 2),
        shard_size=(200, 16),
    )
    args.out_dir = results_dir(args.out_dir, args.quick, QUICK_DIR)
    args.ram_methods = tuple(subset(args.ram_methods, ("fork", "forkserver"), "start methods", p))
    args.jobs = subset(args.jobs, (*JOBS, "ram"), "jobs", p)
    args.loaders = subset(args.loaders, BY_KEY, "loaders", p)
    if args.n < BATCH or args.epochs < 2 or args.rounds < 1:
        p.error(f"--n must be >= {BATCH}, --epochs >= 2, --rounds >= 1")
    if args.shard_size < 1 or args.shuffle_window < 1:
        p.error("--shard-size and --shuffle-window must be >= 1")
    return args


def ferrofeed_and_peers(py313: str | None) -> dict[str, str | None]:
    """The versions of Python, ferrofeed and every peer, and the build of ferrofeed's
    extension that the runs load."""
    out = versions(
        "ferrofeed",
        "numpy",
        "torch",
        "torchvision",
        "pillow",
        "scikit-image",
        "spdl_io",
        "datago",
        "webdataset",
        "datasets",
        "pyarrow",
        "matplotlib",
    )
    # Which build of ferrofeed's extension the loaders' interpreters load (x86-64-v3 or
    # baseline; FERROFEED_CPU, inherited by them, picks it).
    probe = subprocess.run(
        [sys.executable, "-c", "import ferrofeed; print(ferrofeed.build_info()['native_build'])"],
        capture_output=True,
        text=True,
    )
    out["ferrofeed native build"] = probe.stdout.strip() or None
    if py313:
        probe = subprocess.run(
            [py313, "-c", "import platform; print(platform.python_version())"],
            capture_output=True,
            text=True,
        )
        out["python (dataloader-rs)"] = probe.stdout.strip() or None
        out["dataloader-rs"] = version_of("dataloader-rs", py313)
    return out


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.torchvision_requirement:
        try:
            print(torchvision_requirement(importlib.metadata.version("torch")))
        except (ValueError, importlib.metadata.PackageNotFoundError) as e:
            print(f"compare: {e!r}", file=sys.stderr)
            return 1
        return 0
    if args.replot:
        results = json.loads(args.replot.read_text())
        report(results, args.out_dir, args.name)
        return 0
    from tqdm import tqdm

    asked = [BY_KEY[k] for k in args.loaders]
    keys, not_run = runnable(
        {lo.key: available(lo, args.py313) for lo in asked}, {lo.key: lo.label for lo in asked}
    )
    loaders = [BY_KEY[k] for k in keys]
    results: dict[str, Any] = {
        **stamp("compare.py", argv),
        "versions": ferrofeed_and_peers(args.py313),
        "args": {k: str(v) for k, v in vars(args).items()},
        "not_run": not_run,
    }
    # The image jobs that a loader asked for runs (the shards job has loaders of its own).
    image_jobs = [j for j in args.jobs if j in JOBS and any(j in lo.jobs for lo in loaders)]
    plan = [
        (rnd, lo, job)
        for rnd in range(args.rounds)
        for job in image_jobs
        for lo in [lo for lo in loaders if job in lo.jobs]
    ]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        job: {lo.key: [] for lo in loaders if job in lo.jobs} for job in image_jobs
    }
    workdir = scratch_dir("ferrofeed-compare-")
    try:
        if image_jobs:
            files, _, results["data"] = make_images(workdir, args.n, args.seed)
            base = {
                "files": files,
                "root": os.path.join(workdir, "images"),
                "seed": args.seed,
                "epochs": args.epochs,
                "import_torch": not args.no_torch_import,
            }
            if "shards" in image_jobs:
                base["shards"] = pack_shards(files, workdir, loaders, args)
                results["data"]["shards"] = {
                    k: v for k, v in base["shards"].items() if k not in ("tar", "parquet")
                }
            bar = tqdm(total=len(plan), unit="run", disable=args.no_progress, dynamic_ncols=True)
            for rnd in range(args.rounds):
                order = [(lo, job) for r, lo, job in plan if r == rnd]
                for lo, job in rotated(order, rnd):
                    bar.set_description(f"round {rnd + 1}/{args.rounds} {job}/{lo.key}")
                    r = run_one(lo, job, base, workdir, args)
                    runs[job][lo.key].append(r)
                    bar.write(
                        f"[round {rnd + 1}] {job:5s} {lo.key:22s} "
                        f"{r['images_per_s']:7.0f} images/s, "
                        f"first batch {r['ttfb_s'] * 1e3:6.0f} ms, "
                        f"{r['cpu_s_per_1000']:6.2f} CPU s/1000 images, "
                        f"peak PSS {r['peak_pss'] / MIB:6.0f} MiB"
                    )
                    bar.update()
            bar.close()
        if "ram" in args.jobs:
            print(f"RAM job: {args.ram_n:,} COCO-like annotations ...", flush=True)
            results["ram"] = ram_experiment(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results["loadavg_end"] = loadavg()
    results["runs"] = runs
    results["summary"] = {
        job: {lo.key: summarize(by[lo.key]) for lo in LOADERS if by.get(lo.key)}
        for job, by in runs.items()
    }
    results["warnings"] = [
        f"{job}/{key}, round {i + 1}: {r['children_left']} worker processes still alive at the "
        "end (their CPU time is missing from the tree's)"
        for job, by in runs.items()
        for key, rs in by.items()
        for i, r in enumerate(rs)
        if r["children_left"]
    ]
    results["ratios"] = ratios(runs)
    results["peer_ratios"] = peer_ratios(runs)
    results["best_peer"] = best_peer_ratios(runs)
    results["title"] = (
        f"{results['machine']}; {args.n} JPEGs, batches of {BATCH}, {args.rounds} rounds"
    )
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"{args.name}.json").write_text(json.dumps(results, indent=1))
    report(results, args.out_dir, args.name)
    return 0


def pack_shards(
    files: list[tuple[str, int]], workdir: str, loaders: list[Loader], args: argparse.Namespace
) -> dict[str, Any]:
    """The shards job's data: the JPEGs packed as tar shards and, where a loader reads
    them, Parquet shards; the Arrow cache of Hugging Face's map-style dataset made once.

    Returns the spec's ``shards``: the shard paths, the shuffle window and what was made.
    """
    t = time.perf_counter()
    keys = {lo.key for lo in loaders if "shards" in lo.jobs}
    tar = pack_tar_shards(files, os.path.join(workdir, "shards-tar"), args.shard_size)
    out: dict[str, Any] = {
        "tar": tar,
        "window": args.shuffle_window,
        "per_shard": args.shard_size,
        "shards": len(tar),
        "mean_tar_bytes": round(sum(os.path.getsize(p) for p in tar) / len(tar)),
    }
    if keys & {"ferrofeed-parquet", "hf-w2", "hf-w4", "hf-stream-w2", "hf-stream-w4"}:
        out["parquet"] = pack_parquet_shards(
            files, os.path.join(workdir, "shards-parquet"), args.shard_size
        )
        out["mean_parquet_bytes"] = round(
            sum(os.path.getsize(p) for p in out["parquet"]) / len(out["parquet"])
        )
    if keys & {"hf-w2", "hf-w4"}:
        # The first load_dataset converts the Parquet files into its Arrow cache; the runs
        # then memory-map that cache, as a training job does after its first run.
        out["hf_cache"] = os.path.join(workdir, "hf-cache")
        code = (
            "import sys, datasets; datasets.disable_progress_bars(); "
            "datasets.load_dataset('parquet', data_files=sys.argv[2:], split='train', "
            "cache_dir=sys.argv[1])"
        )
        subprocess.run(
            [sys.executable, "-c", code, out["hf_cache"], *out["parquet"]],
            check=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
    out["made_s"] = round(time.perf_counter() - t, 1)
    print(
        f"packed as {len(tar)} tar shards of {args.shard_size} images"
        + (" and as many Parquet files" if "parquet" in out else "")
        + f" in {out['made_s']} s; shuffle window {args.shuffle_window} samples",
        flush=True,
    )
    return out


if __name__ == "__main__":
    sys.exit(run_script(main, child_main))
