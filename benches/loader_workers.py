"""Python transforms in worker processes: ferrofeed's DataLoader against PyTorch's, side by side.

Run: ``python benches/loader_workers.py [--n 640] [--repeats 3] [--epochs 2] [--quick]``;
results go to stdout and to bench-results/loader_workers.json.

Data: ``--n`` ImageNet-like JPEGs made from real photos (scikit-image's bundled astronaut,
coffee, chelsea, rocket, ...): each a random crop (50 to 100% of the largest crop of the
target aspect), randomly mirrored, resized with Lanczos to about 500x375 (70% 500x375, 15%
375x500, 15% 500x333), saved by Pillow with quality 75 to 95 (4:2:0) into a temporary
directory, with a label per file; everything follows from ``--seed``.

Jobs, all with batches of 32, shuffled, fork start method:

(a) a Pillow transform in Python, the same code in both loaders: ``Image.open`` + decode,
    torchvision's ``RandomResizedCrop(224)`` (its parameter draw, written out; the crop and
    resize as one ``Image.resize(..., BILINEAR, box=...)``), a random horizontal flip, to a
    float32 CHW array normalised with ImageNet's mean and std. Configurations: PyTorch
    ``DataLoader(num_workers=2|4, persistent_workers=True)``, ferrofeed
    ``DataLoader(num_workers=2|4, persistent_workers=True, output="torch")``, ferrofeed on
    threads (``num_workers=0, num_threads=2``).
(b) a pure-Python CPU-heavy transform on small arrays: ``--passes`` passes of a 3x3 blur
    written as Python loops over a 16x16 array (about 0.08 ms a pass here), float32 out.
    ferrofeed with 2 worker processes against ferrofeed with 2 threads (and PyTorch with 2
    workers, for reference).
(c) native decode, Python augmentation: ``__getitem__`` decodes with
    ``ferrofeed.io.decode_image(path, resize_shorter=256)`` (libjpeg-turbo with DCT scaling,
    resize in Rust), then a random 224 crop and a random flip in NumPy and the same
    normalisation, in ferrofeed workers (2 and 4); and a variant where the random resized
    crop and the flip are native too (``decode_image(path, size=224, crop="random",
    seed=..., flip=...)``, the parameters drawn in Python), only the normalisation in
    NumPy. Compared with PyTorch's best configuration of job (a).

Each (job, configuration) runs in its own fresh interpreter (this script re-executed with
an internal flag), the configurations taking turns, ``--repeats`` rounds with the order
rotated each round. In that interpreter: the loader is built, the time to the first batch
is taken (construction and worker start-up included), the first epoch is finished
(warm-up), then ``--epochs`` epochs are timed (steady images/s; workers persist across
epochs). CPU seconds per image: the CPU time of the whole process tree (the interpreter
and its workers, reaped, read with ``getrusage(RUSAGE_CHILDREN)`` in this process) minus
what the interpreter spent before building the loader (imports, the dataset), over all
images loaded (warm-up epoch included, so worker start-up is in it). Figures are the
medians over the rounds, with min-max; ratios are computed per round and from the medians.
The load average is recorded before and after, since other jobs may share the CPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import FileDataset, make_jpegs, native_train_decode, rrc_params, shutdown_workers
from _compare_loaders import torch_loader
from _rounds import LOCAL_RESULTS, add_run_options, fmt, med_range
from _runs import cpu_children, cpu_self, run_fresh, run_script
from bench_machine import cpu_model
from PIL import Image

DEFAULT_OUT = LOCAL_RESULTS / "loader_workers.json"
BATCH = 32
CROP = 224

# ImageNet's normalisation, on 0..255 values: (x / 255 - mean) / std.
MEAN = np.array([0.485, 0.456, 0.406], np.float32) * 255
INV_STD = 1.0 / (np.array([0.229, 0.224, 0.225], np.float32) * 255)

TARGETS = {"a_throughput": 1.1, "b_workers_vs_threads": 1.6, "c_vs_pytorch": 1.5}


# --- data ------------------------------------------------------------------------------------


def small_arrays(n: int, seed: int) -> np.ndarray:
    """``n`` 16x16 uint8 arrays (job (b)'s samples)."""
    return np.random.default_rng(seed).integers(0, 256, (n, 16, 16), dtype=np.uint8)


# --- the transforms (module level: the same code in every loader and worker) ------------------


def to_chw(rgb: np.ndarray) -> np.ndarray:
    """HWC uint8 to CHW float32, normalised: torchvision's ToTensor + Normalize."""
    x = (rgb.astype(np.float32) - MEAN) * INV_STD
    return np.ascontiguousarray(x.transpose(2, 0, 1))


class PillowRRC(FileDataset):
    """Job (a): decode with Pillow, RandomResizedCrop(224), flip, to normalised CHW float32."""

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        path, label = self.files[i]
        with Image.open(path) as im:
            im = im.convert("RGB")
            box = rrc_params(*im.size)
            im = im.resize((CROP, CROP), Image.Resampling.BILINEAR, box=box)
        if random.random() < 0.5:
            im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return to_chw(np.asarray(im)), label


class NativeDecodeCrop(FileDataset):
    """Job (c): decode + resize_shorter=256 in Rust; random crop, flip, normalise in NumPy."""

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        import ferrofeed.io

        path, label = self.files[i]
        rgb = np.from_dlpack(ferrofeed.io.decode_image(path, resize_shorter=256))
        h, w = rgb.shape[:2]
        top, left = random.randint(0, h - CROP), random.randint(0, w - CROP)
        rgb = rgb[top : top + CROP, left : left + CROP]
        if random.random() < 0.5:
            rgb = rgb[:, ::-1]
        return to_chw(rgb), label


class NativeRRC(FileDataset):
    """Job (c'): RandomResizedCrop(224) and flip inside the native decode; normalise in NumPy."""

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        path, label = self.files[i]
        return to_chw(np.from_dlpack(native_train_decode(path))), label


def blur_passes(a: np.ndarray, passes: int) -> np.ndarray:
    """``passes`` 3x3 binomial blurs as Python loops (edges clamped): pure-Python CPU work."""
    rows = a.tolist()
    n = len(rows)
    for _ in range(passes):
        out = []
        for y in range(n):
            up = rows[y - 1] if y else rows[y]
            mid = rows[y]
            dn = rows[y + 1] if y + 1 < n else rows[y]
            row = []
            for x in range(n):
                lx = x - 1 if x else x
                rx = x + 1 if x + 1 < n else x
                s = (
                    up[lx]
                    + 2 * up[x]
                    + up[rx]
                    + 2 * mid[lx]
                    + 4 * mid[x]
                    + 2 * mid[rx]
                    + dn[lx]
                    + 2 * dn[x]
                    + dn[rx]
                )
                row.append(s * 0.0625)
            out.append(row)
        rows = out
    return np.array(rows, np.float32)


class PythonHeavy:
    """Job (b): small arrays through ``blur_passes`` (about 0.08 ms of Python per pass)."""

    def __init__(self, data: np.ndarray, passes: int) -> None:
        self.data, self.passes = data, passes

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return blur_passes(self.data[i], self.passes), i % 10


# --- configurations ----------------------------------------------------------------------------

# name -> (job, loader, dataset, workers (processes, or threads for "ferrofeed-threads"))
CONFIGS: dict[str, tuple[str, str, str, int]] = {
    "a/pytorch-w2": ("a", "pytorch", "pillow", 2),
    "a/pytorch-w4": ("a", "pytorch", "pillow", 4),
    "a/ferrofeed-w2": ("a", "ferrofeed", "pillow", 2),
    "a/ferrofeed-w4": ("a", "ferrofeed", "pillow", 4),
    "a/ferrofeed-threads2": ("a", "ferrofeed-threads", "pillow", 2),
    "b/ferrofeed-w2": ("b", "ferrofeed", "heavy", 2),
    "b/ferrofeed-threads2": ("b", "ferrofeed-threads", "heavy", 2),
    "b/pytorch-w2": ("b", "pytorch", "heavy", 2),
    "c/ferrofeed-w2": ("c", "ferrofeed", "native", 2),
    "c/ferrofeed-w4": ("c", "ferrofeed", "native", 4),
    "c/ferrofeed-native-rrc-w2": ("c", "ferrofeed", "native-rrc", 2),
}


def child_main(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one configuration in this fresh interpreter; return its figures."""
    job, kind, data, workers = CONFIGS[spec["config"]]
    uses_torch = kind == "pytorch" or job in ("a", "c")
    if uses_torch:
        import torch

        torch.set_num_threads(1)
    import ferrofeed

    files = [tuple(f) for f in spec["files"]]
    dataset: Any
    if data == "pillow":
        dataset = PillowRRC(files)  # type: ignore[arg-type]
    elif data == "native":
        dataset = NativeDecodeCrop(files)  # type: ignore[arg-type]
    elif data == "native-rrc":
        dataset = NativeRRC(files)  # type: ignore[arg-type]
    else:
        dataset = PythonHeavy(small_arrays(spec["n_small"], spec["seed"]), spec["passes"])
    gc.collect()
    cpu_before = cpu_self()
    t0 = time.perf_counter()
    loader: Any
    if kind == "pytorch":
        loader = torch_loader(dataset, workers, spec["seed"])
    else:
        # Worker processes (forked, kept from epoch to epoch, as PyTorch's), or threads.
        parallel: dict[str, Any] = (
            {"num_workers": workers, "worker_start_method": "fork", "persistent_workers": True}
            if kind == "ferrofeed"
            else {"num_threads": workers}
        )
        loader = ferrofeed.DataLoader(
            dataset,
            BATCH,
            shuffle=True,
            seed=spec["seed"],
            output="torch" if uses_torch else "numpy",
            **parallel,
        )
    it = iter(loader)
    first = next(it)
    ttfb = time.perf_counter() - t0
    x, y = first
    shape, dtype = tuple(x.shape), str(x.dtype)
    count = len(x)
    del first, x, y
    for x, _ in it:  # the rest of the warm-up epoch
        count += len(x)
    warm_s = time.perf_counter() - t0
    epochs = []
    for _ in range(spec["epochs"]):
        t = time.perf_counter()
        for x, _ in loader:
            count += len(x)
        epochs.append(time.perf_counter() - t)
    del x, it
    shutdown_workers(loader)
    del loader
    gc.collect()
    left = multiprocessing.active_children()  # joins (reaps) the workers that ended
    n = len(dataset)
    return {
        "config": spec["config"],
        "ttfb_s": ttfb,
        "warmup_epoch_s": warm_s,
        "epoch_s": epochs,
        "images_per_s": n * len(epochs) / sum(epochs),
        "images": count,
        "cpu_before_loader_s": cpu_before,
        "cpu_self_s": cpu_self(),
        "cpu_children_s": cpu_children(),
        "children_left": len(left),
        "batch_shape": shape,
        "batch_dtype": dtype,
    }


def run_child(spec: dict[str, Any], workdir: str) -> dict[str, Any]:
    """Run one configuration in a fresh interpreter; add its CPU time per image."""
    result = run_fresh(__file__, spec, workdir, spec["timeout"])
    loader_cpu = result["cpu_tree_s"] - result["cpu_before_loader_s"]
    result["cpu_s_per_image"] = loader_cpu / result["images"]
    return result


# --- report ------------------------------------------------------------------------------------


def ratio_per_round(
    runs: dict[str, list[dict[str, Any]]], num: list[str], den: list[str], key: str
) -> dict[str, float] | None:
    """max over ``num`` / max over ``den`` of ``key``, round by round; median and range."""
    rounds = min(len(runs.get(c, [])) for c in num + den)
    if rounds == 0:
        return None
    ratios = []
    for r in range(rounds):
        top = max(runs[c][r][key] for c in num)
        bottom = max(runs[c][r][key] for c in den)
        ratios.append(top / bottom)
    return med_range(ratios)


def best(summary: dict[str, Any], names: list[str]) -> str:
    return max(names, key=lambda c: summary[c]["images_per_s"]["median"])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=640, help="JPEGs (default 640)")
    parser.add_argument("--n-small", type=int, default=2048, help="job (b) samples")
    parser.add_argument("--passes", type=int, default=9, help="job (b) blur passes per sample")
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs after the warm-up")
    parser.add_argument("--repeats", type=int, default=3, help="rounds (configurations alternate)")
    parser.add_argument("--jobs", default="a,b,c", help="subset of a,b,c")
    add_run_options(parser, timeout=600.0, quick="a smoke run: small sizes, 1 round")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.n_small, args.epochs, args.repeats = 96, 256, 1, 1
    jobs = {j.strip() for j in args.jobs.split(",")}
    configs = [c for c, (job, *_) in CONFIGS.items() if job in jobs]
    if "c" in jobs and "a" not in jobs:
        configs = [c for c in CONFIGS if c.startswith("a/pytorch")] + configs
    import ferrofeed
    import PIL
    import torch

    load_start = Path("/proc/loadavg").read_text().split()[:3]
    results: dict[str, Any] = {
        "machine": f"{cpu_model()}, {platform.machine()}, {os.cpu_count()} CPUs",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "pillow": PIL.__version__,
        "numpy": np.__version__,
        "ferrofeed_version": ferrofeed.__version__,
        "args": {k: str(v) for k, v in vars(args).items()},
        "loadavg_start": load_start,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory(prefix="ferrofeed-bench-workers-") as root:
        files, info = make_jpegs(root, args.n, args.seed)
        results["data"] = info
        print(
            f"{args.n} JPEGs from scikit-image photos, mean {info['mean_file_bytes'] / 1024:.0f}"
            f" KiB, sizes {info['sizes']}; load average {' '.join(load_start)}",
            flush=True,
        )
        spec_base = {
            "files": files,
            "n_small": args.n_small,
            "passes": args.passes,
            "seed": args.seed,
            "epochs": args.epochs,
            "timeout": args.timeout,
        }
        for rnd in range(args.repeats):
            order = configs[rnd % len(configs) :] + configs[: rnd % len(configs)]
            for config in order:
                r = run_child({**spec_base, "config": config}, root)
                runs[config].append(r)
                print(
                    f"[round {rnd + 1}] {config:28s} first batch {r['ttfb_s'] * 1e3:6.0f} ms, "
                    f"{r['images_per_s']:7.0f} images/s, "
                    f"{r['cpu_s_per_image'] * 1e3:6.2f} ms CPU/image",
                    flush=True,
                )
    results["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
    summary: dict[str, Any] = {}
    for config, rs in runs.items():
        summary[config] = {
            "images_per_s": med_range([r["images_per_s"] for r in rs]),
            "ttfb_s": med_range([r["ttfb_s"] for r in rs]),
            "cpu_s_per_image": med_range([r["cpu_s_per_image"] for r in rs]),
        }
    results["runs"] = runs
    results["summary"] = summary
    ratios: dict[str, Any] = {}
    torch_a = [c for c in configs if c.startswith("a/pytorch")]
    if "a" in jobs:
        ferro_a = ["a/ferrofeed-w2", "a/ferrofeed-w4"]
        tb, fb = best(summary, torch_a), best(summary, ferro_a)
        s_t, s_f = summary[tb], summary[fb]
        ratios["a"] = {
            "pytorch_best": tb,
            "ferrofeed_best": fb,
            "throughput": s_f["images_per_s"]["median"] / s_t["images_per_s"]["median"],
            "throughput_per_round": ratio_per_round(runs, ferro_a, torch_a, "images_per_s"),
            "cpu_per_image": s_f["cpu_s_per_image"]["median"] / s_t["cpu_s_per_image"]["median"],
            "ttfb": s_f["ttfb_s"]["median"] / s_t["ttfb_s"]["median"],
            "threads_vs_pytorch": summary["a/ferrofeed-threads2"]["images_per_s"]["median"]
            / s_t["images_per_s"]["median"],
        }
        ratios["a"]["met"] = {
            "throughput >= 1.1x": ratios["a"]["throughput"] >= TARGETS["a_throughput"],
            "cpu/image <= PyTorch": ratios["a"]["cpu_per_image"] <= 1.0,
            "first batch <= PyTorch": ratios["a"]["ttfb"] <= 1.0,
        }
    if "b" in jobs:
        w, t = summary["b/ferrofeed-w2"], summary["b/ferrofeed-threads2"]
        ratios["b"] = {
            "workers_vs_threads": w["images_per_s"]["median"] / t["images_per_s"]["median"],
            "workers_vs_threads_per_round": ratio_per_round(
                runs, ["b/ferrofeed-w2"], ["b/ferrofeed-threads2"], "images_per_s"
            ),
            "workers_vs_pytorch_w2": w["images_per_s"]["median"]
            / summary["b/pytorch-w2"]["images_per_s"]["median"],
        }
        ratios["b"]["met"] = {
            "workers >= 1.6x threads": ratios["b"]["workers_vs_threads"]
            >= TARGETS["b_workers_vs_threads"]
        }
    if "c" in jobs:
        ferro_c = ["c/ferrofeed-w2", "c/ferrofeed-w4"]
        tb, fb = best(summary, torch_a), best(summary, ferro_c)
        ratios["c"] = {
            "pytorch_best": tb,
            "ferrofeed_best": fb,
            "vs_pytorch": summary[fb]["images_per_s"]["median"]
            / summary[tb]["images_per_s"]["median"],
            "vs_pytorch_per_round": ratio_per_round(runs, ferro_c, torch_a, "images_per_s"),
            "native_rrc_vs_pytorch": summary["c/ferrofeed-native-rrc-w2"]["images_per_s"]["median"]
            / summary[tb]["images_per_s"]["median"],
            "cpu_per_image": summary[fb]["cpu_s_per_image"]["median"]
            / summary[tb]["cpu_s_per_image"]["median"],
        }
        ratios["c"]["met"] = {"vs PyTorch >= 1.5x": ratios["c"]["vs_pytorch"] >= 1.5}
    results["ratios"] = ratios
    print()
    print(f"machine: {results['machine']}; load average {load_start} -> {results['loadavg_end']}")
    print(f"{'configuration':28s} {'images/s':>22s} {'first batch ms':>20s} {'CPU ms/image':>20s}")
    for config, s in summary.items():
        print(
            f"{config:28s} {fmt(s['images_per_s']):>22s} {fmt(s['ttfb_s'], 1e3):>20s} "
            f"{fmt(s['cpu_s_per_image'], 1e3, 2):>20s}"
        )
    print(json.dumps(ratios, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, child_main))
