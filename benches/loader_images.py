"""An image folder through ferrofeed's DataLoader and through PyTorch's, side by side.

Both load the same folder of ImageNet-like JPEGs cut from the real photos in scikit-image's
wheel (``_common.make_jpegs(..., varied=True, folders=True)``: about 500x375, some portrait
and some up to 1000 px, quality 75-95, some progressive and greyscale; one subfolder per
photo, its class) with the ImageNet evaluation preprocessing (shorter side to 256,
bilinear; center crop 224) into uint8 batches, shuffled, with the same number of CPU
workers:

- ferrofeed: ``DataLoader(folder, batch_size=B, num_threads=W)``, the native chain (read,
  decode with libjpeg-turbo's DCT scaling, resize, crop in Rust, straight into a pooled
  batch buffer);
- PyTorch: ``torch.utils.data.DataLoader(dataset, batch_size=B, num_workers=W)`` over a
  map-style dataset doing what torchvision's PIL transforms do (``Image.open``,
  ``convert("RGB")``, ``resize`` with ``BILINEAR`` so the shorter side is 256, ``crop`` to
  the center 224, ``np.asarray``), collated by PyTorch's default collate.

Time to first batch is measured on a fresh loader (worker start-up included); throughput
over whole epochs after one warm-up epoch (files in the page cache), the two loaders
taking turns so that both see the same machine state. Run:
``python benches/loader_images.py [--n 512] [--workers 2]``; results go to stdout and to
bench-results/loader_images.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

import ferrofeed
import torch
from _common import PillowExact, make_jpegs
from bench_machine import cpu_model
from PIL import Image


def time_epochs(make: Callable[[], Iterable[Any]], epochs: int) -> tuple[float, list[float]]:
    """Time to first batch of a fresh loader, and the seconds of each epoch after it."""
    start = time.perf_counter()
    loader = make()
    it = iter(loader)
    first = next(it)
    ttfb = time.perf_counter() - start
    del first
    for _ in it:  # finish the warm-up epoch
        pass
    times = []
    for _ in range(epochs):
        t = time.perf_counter()
        for _batch in loader:
            pass
        times.append(time.perf_counter() - t)
    return ttfb, times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=512, help="images (default 512)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2, help="threads / worker processes")
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per round")
    parser.add_argument("--rounds", type=int, default=2, help="turns each loader takes")
    parser.add_argument("--out", default="bench-results/loader_images.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results: dict[str, Any] = {
        "machine": f"{cpu_model()}, {platform.machine()}, {os.cpu_count()} CPUs",
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "pillow": Image.__version__,
        "ferrofeed_version": ferrofeed.__version__,
        "n": args.n,
        "batch_size": args.batch_size,
        "workers": args.workers,
    }
    with tempfile.TemporaryDirectory(prefix="ferrofeed-bench-") as root:
        files, info = make_jpegs(root, args.n, 0, varied=True, folders=True)
        results["data"] = info
        print(f"{args.n} JPEGs from real photos, {info['mean_file_bytes'] / 1024:.0f} KiB each")

        def ferro() -> Iterable[Any]:
            return ferrofeed.DataLoader(
                root, batch_size=args.batch_size, shuffle=True, num_threads=args.workers
            )

        def pytorch() -> Iterable[Any]:
            return torch.utils.data.DataLoader(
                PillowExact(files),
                batch_size=args.batch_size,
                shuffle=True,
                num_workers=args.workers,
                persistent_workers=True,
            )

        runs: dict[str, dict[str, list[float]]] = {
            "ferrofeed": {"ttfb": [], "epoch": []},
            "pytorch": {"ttfb": [], "epoch": []},
        }
        for _ in range(args.rounds):
            for name, make in (("ferrofeed", ferro), ("pytorch", pytorch)):
                ttfb, times = time_epochs(make, args.epochs)
                runs[name]["ttfb"].append(ttfb)
                runs[name]["epoch"].extend(times)
    for name, r in runs.items():
        best = min(r["epoch"])
        results[name] = {
            "ttfb_s": statistics.median(r["ttfb"]),
            "epoch_s": r["epoch"],
            "images_per_s": args.n / statistics.median(r["epoch"]),
            "images_per_s_best": args.n / best,
        }
        print(
            f"{name:>10}: first batch {results[name]['ttfb_s'] * 1e3:7.0f} ms; "
            f"{results[name]['images_per_s']:7.0f} images/s (median epoch), "
            f"{results[name]['images_per_s'] / args.workers:6.0f} per worker"
        )
    ratio = results["ferrofeed"]["images_per_s"] / results["pytorch"]["images_per_s"]
    ttfb_ratio = results["pytorch"]["ttfb_s"] / results["ferrofeed"]["ttfb_s"]
    results["throughput_ratio"], results["ttfb_ratio"] = ratio, ttfb_ratio
    print(f"ferrofeed / PyTorch: {ratio:.2f}x images/s, first batch {ttfb_ratio:.1f}x sooner")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
