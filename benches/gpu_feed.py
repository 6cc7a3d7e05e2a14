"""Feeding a GPU: ferrofeed's pinned batches against PyTorch's DataLoader(pin_memory=True).

``PYTHONPATH=python python benches/gpu_feed.py [--n 2000] [--rounds 2] [--threads 4,8]
[--epochs 3] [--quick]``; needs a CUDA device that PyTorch sees (without one: a message and
exit status 2; status 1 when a run failed). ``--out-dir`` (default bench-results/gpu-feed)
gets gpu_feed.json and gpu_feed.md (the tables, also printed at the end).

Data: ``--n`` ImageNet-like JPEGs cut from scikit-image's photos (``_common.make_jpegs``,
varied sizes and encodings, a label each), in a temporary folder (in RAM when it fits).

Copy bandwidth, in this process: one batch, 32x224x224x3 uint8 (what the loaders hand out)
and 32x3x224x224 float32 (a normalized NCHW batch), ``copy_(non_blocking=True)`` into a
CUDA tensor, timed by CUDA events (5 warm-ups, 30 timed, median and min-max) from (a) a
ferrofeed pinned buffer (``BufferPool(2, pinned=True)`` seen by ``torch.from_dlpack``,
checked ``is_pinned()``), (b) a PyTorch pinned tensor, (c) a pageable tensor, taking turns
copy by copy; GB/s, and the ratios a/b and a/c of the medians.

Loaders, batches of 32, shuffled, with the same N (``--threads``) for both:

- ``pytorch-wN``: torch.utils.data.DataLoader over compare.py's Pillow transform
  (``PillowTrain``/``PillowExact``), N worker processes (fork, persistent),
  ``pin_memory=True``; each batch then ``.to("cuda", non_blocking=True)``.
- ``ferrofeed-tN``: ferrofeed.DataLoader over the files with ``ops.decode_image`` (decode,
  resize, crop and, for ``train``, the random flip in Rust on N threads: ``size=224,
  crop="random", flip="random"``), ``output="torch", device="cuda"``: each batch is decoded
  into a pinned pooled buffer and copied with a non-blocking copy.

Jobs: ``train`` (RandomResizedCrop 224 + random horizontal flip) and ``exact`` (shorter side
256, center crop 224). The consumer is the same for all: images and labels to the GPU (a
no-op for ferrofeed's), ``acc += images.float().mean()`` there, ``torch.cuda.synchronize()``
after the first batch and at the end of each epoch.

Each (job, loader) runs in a fresh interpreter (CUDA initialized and the consumer's kernels
warmed up before the loader is built; torch's thread settings left as they are), the loaders
taking turns, ``--rounds`` rounds, the order rotated each round. Per run: the time to the
first batch on the GPU, from building the loader; ``--epochs`` epochs, the first a warm-up,
the others giving the steady images/s; CPU seconds per 1000 images of the whole process tree
(``getrusage`` of the interpreter and its reaped workers, from building the loader until its
workers are ended); each epoch is checked to give n images of 224x224x3 uint8 on the GPU.
Figures: medians over the rounds with min-max; ferrofeed-tN against pytorch-wN round by
round, then the median and range of those ratios.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.utils.dlpack
from _common import CROP, PillowExact, PillowTrain, make_jpegs, native_op, shutdown_workers
from _rounds import LOCAL_RESULTS, add_run_options, better, fmt, fmt_ratio, med_range, medians
from _runs import cpu_children, cpu_self, reap_children, run_fresh, run_script

DEVICE = "cuda"
BATCH = 32
JOBS = ("train", "exact")
JOB_TITLES = {
    "train": "training (RandomResizedCrop 224 + random flip)",
    "exact": "exact 224 (shorter side 256, center crop 224)",
}
COPY_SHAPES = {
    "uint8 NHWC 32x224x224x3": ((BATCH, CROP, CROP, 3), "uint8"),
    "float32 NCHW 32x3x224x224": ((BATCH, 3, CROP, CROP), "float32"),
}
SOURCES = ("ferrofeed_pinned", "torch_pinned", "pageable")
FAMILIES = ("pytorch", "ferrofeed")
LABELS = {
    "pytorch": "PyTorch DataLoader + Pillow, {n} worker{s}, pin_memory",
    "ferrofeed": "ferrofeed native, {n} thread{s}, device='cuda'",
}


# --- copy bandwidth ----------------------------------------------------------------------------


def copy_bandwidth(warmup: int = 5, reps: int = 30) -> dict[str, Any]:
    """Host-to-device GB/s of one batch from each kind of host memory (see the docstring)."""
    import ferrofeed

    pool = ferrofeed.BufferPool(2, pinned=True)
    out: dict[str, Any] = {}
    for name, (shape, dtype_name) in COPY_SHAPES.items():
        dtype = getattr(torch, dtype_name)
        sources = {
            "ferrofeed_pinned": torch.utils.dlpack.from_dlpack(pool.empty(shape, dtype_name)),
            "torch_pinned": torch.empty(shape, dtype=dtype, pin_memory=True),
            "pageable": torch.empty(shape, dtype=dtype),
        }
        if not (sources["ferrofeed_pinned"].is_pinned() and sources["torch_pinned"].is_pinned()):
            raise AssertionError(f"{name}: a pinned source is not page-locked for CUDA")
        fill = torch.randint(0, 256, shape, dtype=torch.uint8).to(dtype)
        for src in sources.values():
            src.copy_(fill)
        dst = torch.empty(shape, dtype=dtype, device=DEVICE)
        ms: dict[str, list[float]] = {k: [] for k in sources}
        for i in range(warmup + reps):
            for key, src in sources.items():
                start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                start.record()
                dst.copy_(src, non_blocking=True)
                end.record()
                end.synchronize()
                if i >= warmup:
                    ms[key].append(start.elapsed_time(end))
        nbytes = fill.numel() * fill.element_size()
        gbs = {k: med_range([nbytes / (t * 1e-3) / 1e9 for t in v]) for k, v in ms.items()}
        ff = gbs["ferrofeed_pinned"]["median"]
        out[name] = {
            "bytes": nbytes,
            "gb_per_s": gbs,
            "ferrofeed_vs_torch_pinned": ff / gbs["torch_pinned"]["median"],
            "ferrofeed_vs_pageable": ff / gbs["pageable"]["median"],
        }
        del sources, dst
    torch.cuda.empty_cache()
    return out


# --- one run, in a fresh interpreter -------------------------------------------------------------


def build(family: str, workers: int, job: str, files: list[tuple[str, int]], seed: int) -> Any:
    """The loader of ``family`` with ``workers`` worker processes or threads, for ``job``."""
    if family == "pytorch":
        dataset = PillowExact(files) if job == "exact" else PillowTrain(files)
        return torch.utils.data.DataLoader(
            dataset,  # type: ignore[arg-type]  # map-style, duck-typed
            batch_size=BATCH,
            shuffle=True,
            num_workers=workers,
            pin_memory=True,
            persistent_workers=True,
            multiprocessing_context="fork",
            generator=torch.Generator().manual_seed(seed),
        )
    import ferrofeed

    op = native_op(job)
    return ferrofeed.DataLoader(
        files,
        BATCH,
        shuffle=True,
        seed=seed,
        transform=op,
        num_threads=workers,
        output="torch",
        device=DEVICE,
    )


def consume(batch: Any, acc: Any) -> int:
    """The training step stand-in: to the GPU, ``acc += mean``; the batch's size."""
    images, labels = batch
    images = images.to(DEVICE, non_blocking=True)
    labels = labels.to(DEVICE, non_blocking=True)
    if (
        tuple(images.shape[1:]) != (CROP, CROP, 3)
        or images.dtype != torch.uint8
        or images.device.type != torch.device(DEVICE).type
        or labels.shape[0] != images.shape[0]
    ):
        raise AssertionError(f"a batch of {tuple(images.shape)} {images.dtype} {images.device}")
    acc += images.float().mean()
    return int(images.shape[0])


def child_main(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one (job, loader) in this fresh interpreter; return its figures."""
    family, workers, job = spec["family"], spec["workers"], spec["job"]
    files = [(p, int(label)) for p, label in spec["files"]]
    n = len(files)
    if family == "ferrofeed":
        import ferrofeed  # noqa: F401
    # CUDA's start-up and the consumer's first kernels are not the loader's.
    acc = torch.zeros((), device=DEVICE)
    warm = torch.zeros((BATCH, CROP, CROP, 3), dtype=torch.uint8)
    consume((warm, torch.zeros(BATCH, dtype=torch.int64)), acc)
    torch.cuda.synchronize()
    acc.zero_()
    del warm
    gc.collect()
    cpu_before = cpu_self() + cpu_children()
    t0 = time.perf_counter()
    loader = build(family, workers, job, files, spec["seed"])
    ttfb = 0.0
    epoch_s: list[float] = []
    for epoch in range(spec["epochs"]):
        t = time.perf_counter() if epoch else t0
        count = 0
        for batch in loader:
            count += consume(batch, acc)
            if not ttfb:
                torch.cuda.synchronize()
                ttfb = time.perf_counter() - t0
            del batch
        torch.cuda.synchronize()
        epoch_s.append(time.perf_counter() - t)
        if count != n:
            raise AssertionError(f"{spec['key']}: epoch {epoch} gave {count} images, not {n}")
    shutdown_workers(loader)
    del loader
    children_left = reap_children()
    cpu_loader = cpu_self() + cpu_children() - cpu_before
    steady = epoch_s[1:]
    return {
        "ttfb_s": ttfb,
        "epoch_s": epoch_s,
        "images_per_s": n * len(steady) / sum(steady),
        "images": n * len(epoch_s),
        "cpu_loader_s": cpu_loader,
        "cpu_s_per_1000": cpu_loader / (n * len(epoch_s)) * 1000,
        "children_left": children_left,
        "acc": float(acc),
    }


# --- summary and report ----------------------------------------------------------------------


def loader_keys(threads: list[int]) -> list[tuple[str, str, int]]:
    """(key, family, N) of every loader, PyTorch's first for each N."""
    return [(f"{f}-{'w' if f == 'pytorch' else 't'}{n}", f, n) for n in threads for f in FAMILIES]


def summarize(results: dict[str, Any], threads: list[int]) -> None:
    """Per (job, loader) medians and ranges; ferrofeed-tN / pytorch-wN round by round."""
    results["summary"], results["ratios"] = {}, {}
    for job, by_key in results["runs"].items():
        results["summary"][job] = {
            key: medians(runs, ("images_per_s", "ttfb_s", "cpu_s_per_1000"))
            for key, runs in by_key.items()
            if runs
        }
        results["ratios"][job] = {}
        for n in threads:
            ours = {r["round"]: r for r in by_key[f"ferrofeed-t{n}"]}
            theirs = {r["round"]: r for r in by_key[f"pytorch-w{n}"]}
            pairs = [(ours[i], theirs[i]) for i in sorted(ours.keys() & theirs.keys())]
            if pairs:  # above 1: better for ferrofeed
                results["ratios"][job][str(n)] = {
                    "throughput": better(pairs, "images_per_s"),
                    "cpu_per_image_less": better(pairs, "cpu_s_per_1000", lower=True),
                    "ttfb_sooner": better(pairs, "ttfb_s", lower=True),
                }


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"### Feeding a GPU: {results['gpu']}, {results['cpu_count']} CPUs, n={results['n']}",
        "",
        "Host-to-device copy of one batch (GB/s, median of 30 (min-max)):",
        "",
        "| batch | ferrofeed pinned | PyTorch pinned | pageable | ferrofeed / PyTorch pinned "
        "| ferrofeed / pageable |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, c in results["copy"].items():
        cells = " | ".join(fmt(c["gb_per_s"][s], digits=1) for s in SOURCES)
        lines.append(
            f"| {name} | {cells} | {c['ferrofeed_vs_torch_pinned']:.2f}x "
            f"| {c['ferrofeed_vs_pageable']:.2f}x |"
        )
    lines.append("")
    for job, summary in results["summary"].items():
        lines += [
            f"#### {JOB_TITLES[job]}",
            "",
            "| loader | images/s | first batch (ms) | CPU s / 1000 images |",
            "|---|---:|---:|---:|",
        ]
        for key, s in summary.items():
            family, n = key.split("-")[0], int(key.split("-")[1][1:])
            label = LABELS[family].format(n=n, s="s" * (n != 1))
            label = f"**{label}**" if family == "ferrofeed" else label
            lines.append(
                f"| {label} | {fmt(s['images_per_s'])} | {fmt(s['ttfb_s'], 1e3)} "
                f"| {fmt(s['cpu_s_per_1000'], digits=2)} |"
            )
        lines.append("")
        for n, r in results["ratios"].get(job, {}).items():
            lines.append(
                f"- ferrofeed-t{n} / pytorch-w{n} (per round, median (min-max); above 1 is better "
                f"for ferrofeed): images/s {fmt_ratio(r['throughput'])}, CPU per image "
                f"{fmt_ratio(r['cpu_per_image_less'])} less, first batch "
                f"{fmt_ratio(r['ttfb_sooner'])} sooner"
            )
        lines.append("")
    for err in results["errors"]:
        lines.append(f"- failed: {err}")
    return "\n".join(lines).rstrip() + "\n"


# --- main --------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=None, help="JPEGs (default 2000; --quick: 64)")
    p.add_argument("--rounds", type=int, default=None, help="turns of each loader (default 2)")
    p.add_argument("--epochs", type=int, default=None, help="per run, the first a warm-up (3)")
    p.add_argument("--threads", default=None, help="N: workers and threads (default 4,8)")
    p.add_argument("--jobs", default="train,exact", help="subset of train,exact")
    add_run_options(p, timeout=1200.0, quick="n=64, 1 round, 2 epochs, threads 2")
    p.add_argument("--out-dir", type=Path, default=LOCAL_RESULTS / "gpu-feed")
    args = p.parse_args(argv)
    defaults = (64, 1, 2, "2") if args.quick else (2000, 2, 3, "4,8")
    for name, value in zip(("n", "rounds", "epochs", "threads"), defaults, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.threads = [int(t) for t in str(args.threads).split(",") if t.strip()]
    args.jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
    if unknown := set(args.jobs) - set(JOBS):
        p.error(f"unknown jobs: {sorted(unknown)}")
    if args.n < BATCH or args.epochs < 2 or args.rounds < 1 or min(args.threads, default=0) < 1:
        p.error(f"--n must be >= {BATCH}, --epochs >= 2, --rounds >= 1, --threads >= 1")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "gpu_feed.py: no CUDA device is available to PyTorch (torch.cuda.is_available() "
            "is False); this benchmark needs one.",
            file=sys.stderr,
            flush=True,
        )
        return 2
    import ferrofeed

    results: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "ferrofeed": ferrofeed.__version__,
            "pillow": importlib.metadata.version("pillow"),
        },
        "cpu_count": os.cpu_count(),
        "n": args.n,
        "args": {k: str(v) for k, v in vars(args).items()},
        "command": "python benches/gpu_feed.py " + " ".join(argv),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "errors": [],
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    json_path = args.out_dir / "gpu_feed.json"
    results["copy"] = copy_bandwidth()
    for name, c in results["copy"].items():
        gbs = ", ".join(f"{s} {c['gb_per_s'][s]['median']:.1f}" for s in SOURCES)
        print(f"copy {name}: {gbs} GB/s", flush=True)
    keys = loader_keys(args.threads)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        job: {key: [] for key, _, _ in keys} for job in args.jobs
    }
    results["runs"] = runs
    # The images in RAM where /dev/shm has room (a container's may have only 64 MiB).
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    shm = shm if shm and shutil.disk_usage(shm).free > 2 * 2**30 else None
    with tempfile.TemporaryDirectory(prefix="ferrofeed-gpu-feed-", dir=shm) as workdir:
        image_dir = os.path.join(workdir, "images")
        os.makedirs(image_dir)
        files, info = make_jpegs(image_dir, args.n, args.seed, varied=True)
        results["data"] = info
        print(f"{args.n} JPEGs, {info['mean_file_bytes'] / 1024:.0f} KiB on average", flush=True)
        base = {"files": files, "seed": args.seed, "epochs": args.epochs}
        order = [(job, key, family, n) for job in args.jobs for key, family, n in keys]
        for rnd in range(args.rounds):
            # Rotate the order each round so that no loader always follows the same one.
            shift = rnd % len(order)
            for job, key, family, n in order[shift:] + order[:shift]:
                spec = {**base, "config": f"{job}/{key}", "job": job, "key": key}
                spec.update(family=family, workers=n)
                try:
                    r = run_fresh(__file__, spec, workdir, args.timeout)
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    results["errors"].append(f"round {rnd + 1}, {job}, {key}: {e}")
                    print(f"[round {rnd + 1}] {job:5s} {key:14s} FAILED: {e}", flush=True)
                    continue
                r["round"] = rnd
                runs[job][key].append(r)
                print(
                    f"[round {rnd + 1}] {job:5s} {key:14s} {r['images_per_s']:7.0f} images/s, "
                    f"first batch {r['ttfb_s'] * 1e3:6.0f} ms, "
                    f"{r['cpu_s_per_1000']:6.2f} CPU s/1000 images"
                    + (f", {r['children_left']} workers left" if r["children_left"] else ""),
                    flush=True,
                )
                json_path.write_text(json.dumps(results, indent=1))  # partial, in case
    summarize(results, args.threads)
    json_path.write_text(json.dumps(results, indent=1))
    md = markdown(results)
    (args.out_dir / "gpu_feed.md").write_text(md)
    print(f"\n{md}\nwritten: {json_path}, {args.out_dir / 'gpu_feed.md'}", flush=True)
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(run_script(main, child_main))
