"""``ferrofeed demo``: the main job, end to end, measured.

1. Images: a folder of ImageNet-like JPEGs, one subfolder per class (made at run time in
   a temporary folder, or the user's own with ``--images DIR``), and their metadata
   (file, label, size, COCO-like boxes) in a `SharedList`.
2. Loading: `DataLoader` over that metadata through the native image chain (read, decode,
   resize, crop, collate in Rust, no GIL): time to first batch, images/s (per core too),
   and the pipeline's per-stage figures. Then the same images packed as WebDataset tar
   shards by `write_shards` (what ``ferrofeed pack`` runs; for the generated sample, or with
   ``--shards``) and read back through `TarShards`: the image bytes go from the files to the
   shards and from the shards to the decode in Rust.
3. Side by side, each in a fresh interpreter on the same images and job: the native
   chain, a Python transform in ferrofeed's worker processes, and PyTorch's DataLoader
   with Pillow when torch and Pillow are installed (a line says so when they are not):
   images/s, time to first batch and the whole process tree's memory (PSS).
4. Memory: this process and the batch buffer pool; then COCO-like annotation metadata
   read by several worker processes, first from a plain Python list, then from a
   `SharedList`, with each process's USS and PSS. Each variant runs in a fresh
   interpreter so that neither inherits the other's heap.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from .memory import format_bytes, process_memory
from .samples import coco_like_annotations, image_folder

__all__ = ["main", "run_variant"]


def _worker(
    dataset: Sequence[Any],
    passes: int,
    barrier: Any,
    results: Any,
    done: Any,
) -> None:
    checksum = 0
    for _ in range(passes):
        for sample in dataset:
            # Touch the data as a real worker would (the study's "fake latency").
            checksum += len(pickle.dumps(sample))
    barrier.wait()
    results.put((os.getpid(), process_memory(), checksum))
    done.wait()


def run_variant(
    variant: str, n: int, workers: int, passes: int, start_method: str
) -> dict[str, Any]:
    """Run one variant (``"list"`` or ``"shared"``) in this process and return its figures."""
    from ._shared_list import SharedList

    t0 = time.perf_counter()
    items = coco_like_annotations(n)
    dataset: Sequence[Any] = list(items) if variant == "list" else SharedList(items)
    build_s = time.perf_counter() - t0
    arena_bytes = dataset.nbytes if isinstance(dataset, SharedList) else 0
    ctx: Any = mp.get_context(start_method)  # typeshed's BaseContext lacks Process
    barrier, results, done = ctx.Barrier(workers + 1), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=_worker, args=(dataset, passes, barrier, results, done), daemon=True)
        for _ in range(workers)
    ]
    t1 = time.perf_counter()
    for p in procs:
        p.start()
    try:
        barrier.wait(timeout=600)
        read_s = time.perf_counter() - t1
        worker_mem = [results.get(timeout=60) for _ in procs]
        main_mem = process_memory()
    finally:
        done.set()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
        if isinstance(dataset, SharedList):
            dataset.close()
    checksums = {c for _, _, c in worker_mem}
    if len(checksums) != 1:
        raise RuntimeError(f"workers read different data: {checksums}")
    return {
        "variant": variant,
        "n": n,
        "build_s": build_s,
        "read_s": read_s,
        "arena_bytes": arena_bytes,
        "main": main_mem.__dict__,
        "workers": [m.__dict__ for _, m, _ in worker_mem],
        "items_per_s": n * passes * workers / read_s,
    }


def _print_variant(title: str, r: dict[str, Any]) -> None:
    print(f"\n{title}")
    print(f"  {'process':<10}{'pid':>9}{'RSS':>12}{'PSS':>12}{'USS':>12}{'shared':>12}")
    rows = [("main", r["main"])] + [(f"worker {i}", w) for i, w in enumerate(r["workers"])]
    for name, m in rows:
        print(
            f"  {name:<10}{m['pid']:>9}{format_bytes(m['rss']):>12}{format_bytes(m['pss']):>12}"
            f"{format_bytes(m['uss']):>12}{format_bytes(m['shared']):>12}"
        )
    total_pss = sum(m["pss"] for _, m in rows)
    print(f"  total PSS {format_bytes(total_pss)}", end="")
    if r["arena_bytes"]:
        print(f"   (arena file: {format_bytes(r['arena_bytes'])})", end="")
    print(
        f"\n  built in {r['build_s']:.1f} s; {len(r['workers'])} workers read "
        f"{r['items_per_s'] / 1e3:.0f}k items/s together"
    )


class _Records:
    """The image records of a `SharedList` as ``(path, label)`` pairs, for `DataLoader`."""

    def __init__(self, records: Sequence[dict[str, Any]]) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> tuple[str, int]:
        r = self.records[index]
        return r["file_name"], r["label"]


def _image_records(files: list[tuple[str, int]], seed: int) -> list[dict[str, Any]]:
    """COCO-like metadata for each image: its file, label and a few annotations."""
    boxes = coco_like_annotations(4 * len(files), seed=seed)
    return [
        {
            "id": i,
            "file_name": path,
            "label": label,
            "annotations": [next(boxes) for _ in range(4)],
        }
        for i, (path, label) in enumerate(files)
    ]


def _folder_size(paths: Sequence[str]) -> int:
    return sum(os.path.getsize(p) for p in paths)


def _load(args: argparse.Namespace, files: list[tuple[str, int]]) -> None:
    """Part 2: load the images with the DataLoader and print what it measured."""
    from . import DataLoader, SharedList, ops

    t0 = time.perf_counter()
    meta = SharedList(_image_records(files, args.seed))
    print(
        f"  metadata: {len(meta):,} image records (file, label, COCO-like boxes) in a "
        f"SharedList, {format_bytes(meta.nbytes)} arena, built in "
        f"{time.perf_counter() - t0:.2f} s"
    )
    threads = args.threads or min(os.cpu_count() or 1, 8)
    transform = ops.decode_image(resize_shorter=round(args.size * 256 / 224), crop=args.size)
    loader = DataLoader(
        _Records(meta),
        batch_size=args.batch_size,
        shuffle=True,
        seed=args.seed,
        transform=transform,
        num_threads=threads,
        on_error="skip",
    )
    print(
        f"\nloading: DataLoader(batch_size={args.batch_size}, shuffle=True, "
        f"num_threads={threads}), decode_image(resize_shorter="
        f"{round(args.size * 256 / 224)}, crop={args.size}) in Rust, uint8 NHWC batches"
    )
    with meta:
        last_images = _epochs(loader, args.epochs, threads)
        skipped = loader.stats()["skipped"]
        if skipped:
            print(f"  skipped {len(skipped)} unreadable image(s), e.g. {skipped[0][1]}")
        print("\nper-stage figures of the last epoch (decode_batch: one item per batch):")
        for line in loader.stats_table().splitlines():
            print(f"  {line}")
    if last_images == 0:
        raise SystemExit("ferrofeed demo: no image could be loaded")
    me = process_memory()
    pool = loader.stats()["buffers"]
    print(
        f"\nmemory: this process RSS {format_bytes(me.rss)}, USS {format_bytes(me.uss)}; "
        f"batch buffers: {pool['allocated']} allocated ({format_bytes(pool['bytes'])}), "
        f"reused {pool['reuses']} times for {pool['allocations'] + pool['reuses']} batches "
        f"and label vectors"
    )


def _epochs(loader: Any, epochs: int, threads: int, prefix: str = "") -> int:
    """Run ``epochs`` epochs of ``loader``; return the images of the last.

    Prints each epoch's images/s (and per thread) and its time to the first batch.
    """
    images = 0
    for epoch in range(epochs):
        start = time.perf_counter()
        first = None
        images = 0
        for batch in loader:
            if first is None:
                first = time.perf_counter() - start
            images += len(batch[0])
        took = time.perf_counter() - start
        rate = images / took if took > 0 else float("inf")
        print(
            f"  {prefix}epoch {epoch}: {images} images in {took:.2f} s = {rate:,.0f} images/s "
            f"({rate / threads:,.0f} per thread); first batch after "
            f"{(first or 0) * 1e3:.0f} ms"
        )
    return images


def _shards(args: argparse.Namespace, files: list[tuple[str, int]], root: str) -> None:
    """Part 2b: the images packed as WebDataset tar shards in ``root``, read back."""
    from . import DataLoader, ImageFiles, TarShards, ops, write_shards

    per_shard = max(1, min(args.shard_size, len(files)))
    # An image is named by its format in a shard: what `image=` names below.
    formats = {".jpeg": "jpg", ".jpg": "jpg", ".png": "png", ".webp": "webp", ".bmp": "bmp"}
    exts = sorted({formats.get(os.path.splitext(p)[1].lower(), "jpg") for p, _ in files})
    images = ImageFiles([p for p, _ in files], [label for _, label in files])
    summary = write_shards(images, root, samples_per_shard=per_shard, progress=False)
    paths = sorted(os.path.join(root, n) for n in os.listdir(root) if n.endswith(".tar"))
    t0 = time.perf_counter()
    shards = TarShards(paths)
    counted_s = time.perf_counter() - t0
    print(
        f"\nshards: the {len(files):,} images packed as {len(paths)} WebDataset tar shards of "
        f"up to {per_shard} ({format_bytes(summary.bytes)}, in {summary.seconds:.2f} s) in "
        f"{root} by write_shards (ferrofeed pack); TarShards read {len(shards):,} samples' "
        f"counts from its index in {counted_s * 1e3:.0f} ms"
    )
    threads = args.threads or min(os.cpu_count() or 1, 8)
    window = 2 * per_shard
    image = ";".join(exts)
    shorter = round(args.size * 256 / 224)
    loader = DataLoader(
        shards,
        batch_size=args.batch_size,
        shuffle=True,
        seed=args.seed,
        shuffle_window=window,
        transform=ops.decode_image(resize_shorter=shorter, crop=args.size),
        image=image,
        label="cls",
        num_threads=threads,
        on_error="skip",
    )
    print(
        f"  read back: DataLoader(TarShards(...), batch_size={args.batch_size}, shuffle=True, "
        f"shuffle_window={window}, image={image!r}, label='cls', num_threads={threads}), the "
        "same decode_image; shard order permuted per epoch, samples shuffled within the window"
    )
    if _epochs(loader, args.epochs, threads, "shards, ") == 0:
        raise SystemExit("ferrofeed demo: no image could be read back from the shards")
    skipped = loader.stats()["skipped"]
    if skipped:
        print(f"  skipped {len(skipped)} unreadable image(s) in the shards")


# --- part 3: loaders side by side ------------------------------------------------------------

#: The loaders of the side-by-side part, in the order they are printed.
LOADERS = {
    "native": "ferrofeed, native chain",
    "workers": "ferrofeed, Python transform, 2 workers",
    "torch": "PyTorch DataLoader + Pillow, 2 workers",
}


def _center_box(w: int, h: int, size: int) -> tuple[int, int]:
    """The top-left corner of a centered ``size`` x ``size`` crop of a ``w`` x ``h`` image."""
    return (w - size) // 2, (h - size) // 2


class _DecodeInPython:
    """Map-style dataset whose ``__getitem__`` runs Python around ferrofeed's decoder.

    As a user's own ``__getitem__`` would: ``ferrofeed.io.decode_image`` (the shorter side
    resized in Rust), then the center crop in NumPy. At module level so that worker
    processes started by spawn or forkserver can unpickle it.
    """

    def __init__(self, files: Sequence[tuple[str, int]], size: int) -> None:
        self.files = list(files)
        self.size = size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        from .io import decode_image

        path, label = self.files[index]
        image = decode_image(path, resize_shorter=round(self.size * 256 / 224)).numpy()
        left, top = _center_box(image.shape[1], image.shape[0], self.size)
        return image[top : top + self.size, left : left + self.size], label


class _PillowImages:
    """Map-style dataset doing what torchvision's Resize(256) + CenterCrop(224) do, in Pillow."""

    def __init__(self, files: Sequence[tuple[str, int]], size: int) -> None:
        self.files = list(files)
        self.size = size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[Any, int] | None:
        import numpy as np
        from PIL import Image

        path, label = self.files[index]
        shorter = round(self.size * 256 / 224)
        try:
            with Image.open(path) as f:
                im = f.convert("RGB")
        except OSError:
            return None  # unreadable: left out of its batch by _collate_readable
        w, h = im.size
        scale = shorter / min(w, h)
        im = im.resize(
            (max(shorter, round(w * scale)), max(shorter, round(h * scale))),
            Image.Resampling.BILINEAR,
        )
        left, top = _center_box(im.width, im.height, self.size)
        im = im.crop((left, top, left + self.size, top + self.size))
        return np.array(im), label  # a copy, writable, as torchvision's to-tensor makes


def _collate_readable(samples: list[Any]) -> Any:
    """PyTorch's default collate over the samples that could be read (None: unreadable)."""
    from torch.utils.data import default_collate

    return default_collate([s for s in samples if s is not None])


def _missing_for_torch() -> list[str]:
    """The packages the PyTorch loader needs that are not installed here."""
    import importlib.util

    return [name for name in ("torch", "PIL") if importlib.util.find_spec(name) is None]


def _tree_pss() -> int:
    """Total PSS of this process and its children (worker processes), in bytes."""
    me = os.getpid()
    total = process_memory(me).pss
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                # The parent pid is the 2nd field after the command, which is in parentheses.
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid == me:
                total += process_memory(int(entry)).pss
        except (OSError, ValueError, IndexError):
            continue  # a process that ended meanwhile
    return total


def run_loader(
    name: str, files: Sequence[tuple[str, int]], args: argparse.Namespace
) -> dict[str, Any]:
    """Build loader ``name`` over ``files``, run ``args.epochs`` epochs; return its figures.

    The time to the first batch is taken from construction (worker start-up included);
    images/s from the last epoch; the memory (PSS of this process and its workers) at the
    end of the last epoch, with the workers still alive.
    """
    # Imports first: the time to the first batch is the loader's, not torch's import.
    from . import DataLoader, ops

    if name == "torch":
        import torch.utils.data
    t0 = time.perf_counter()
    threads = args.threads or min(os.cpu_count() or 1, 8)
    loader: Any
    if name == "native":
        shorter = round(args.size * 256 / 224)
        loader = DataLoader(
            list(files),
            batch_size=args.batch_size,
            shuffle=True,
            seed=args.seed,
            transform=ops.decode_image(resize_shorter=shorter, crop=args.size),
            num_threads=threads,
            on_error="skip",  # a user's folder may hold unreadable files
            max_failures=None,
        )
    elif name == "workers":
        loader = DataLoader(
            _DecodeInPython(files, args.size),
            batch_size=args.batch_size,
            shuffle=True,
            seed=args.seed,
            num_workers=2,
            persistent_workers=True,
            on_error="skip",
            max_failures=None,
        )
    elif name == "torch":
        loader = torch.utils.data.DataLoader(
            _PillowImages(files, args.size),  # type: ignore[arg-type]  # map-style, duck-typed
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=2,
            persistent_workers=True,
            collate_fn=_collate_readable,
        )
    else:
        raise ValueError(f"unknown loader {name!r}")
    first = rate = 0.0
    images = 0
    pss = 0
    for epoch in range(args.epochs):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        start = time.perf_counter()
        images = 0
        for batch in loader:
            if epoch == 0 and images == 0:
                first = time.perf_counter() - t0
            images += len(batch[1])
        took = time.perf_counter() - start
        rate = images / took if took > 0 else float("inf")
        if epoch == args.epochs - 1:
            pss = _tree_pss()
    return {
        "loader": name,
        "first_batch_s": first,
        "images_per_s": rate,
        "images": images,
        "pss": pss,
    }


def _side_by_side(args: argparse.Namespace, files: list[tuple[str, int]]) -> None:
    """Part 3: each loader in a fresh interpreter on the same images; a table and ratios."""
    names = ["native", "workers"]
    missing = _missing_for_torch()
    if not missing:
        names.append("torch")
    print(
        f"\nside by side, each loader in a fresh interpreter on the same {len(files)} images "
        f"(shorter side to {round(args.size * 256 / 224)}, center crop {args.size}, uint8 "
        f"batches of {args.batch_size}, {args.epochs} epochs; images/s of the last one):"
    )
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(files, f)
        listing = f.name
    results = {}
    try:
        for name in names:
            cmd = [
                *(sys.executable, "-m", "ferrofeed", "demo", "--loader", name),
                *(f"--files={listing}", f"--epochs={args.epochs}"),
                *(f"--batch-size={args.batch_size}", f"--size={args.size}"),
                f"--seed={args.seed}",
            ]
            if args.threads:
                cmd.append(f"--threads={args.threads}")
            out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
            results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        os.unlink(listing)
    print(f"  {'loader':<42}{'images/s':>10}{'first batch':>14}{'total PSS':>12}")
    for name, r in results.items():
        print(
            f"  {LOADERS[name]:<42}{r['images_per_s']:>10,.0f}"
            f"{r['first_batch_s'] * 1e3:>11,.0f} ms{format_bytes(r['pss']):>12}"
        )
    if "torch" not in results:
        print(
            f"  PyTorch's DataLoader: not run ({' and '.join(missing)} not installed here; "
            "pip install 'ferrofeed[torch]' pillow to see it side by side)"
        )
        return
    peer = results["torch"]
    for name in ("native", "workers"):
        r = results[name]
        print(
            f"  {LOADERS[name]}: {r['images_per_s'] / peer['images_per_s']:.2f}x PyTorch's "
            f"images/s, first batch {peer['first_batch_s'] / r['first_batch_s']:.1f}x "
            f"sooner, {r['pss'] / peer['pss']:.2f}x its memory"
        )


def _memory_study(args: argparse.Namespace) -> None:
    """Part 4: annotation metadata in worker processes, plain list against SharedList."""
    print(
        f"\nmetadata in worker processes: {args.annotations:,} COCO-like annotations read by "
        f"{args.workers} {args.start_method} workers"
    )
    results = {}
    for variant in ("list", "shared"):
        out = subprocess.run(
            [
                *(sys.executable, "-m", "ferrofeed", "demo", "--variant", variant),
                *(f"--annotations={args.annotations}", f"--workers={args.workers}"),
                f"--passes={args.passes}",
                f"--start-method={args.start_method}",
            ],
            check=True,
            stdout=subprocess.PIPE,
            text=True,
        )
        results[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    _print_variant("plain Python list (copy-on-read in every worker):", results["list"])
    _print_variant("ferrofeed.SharedList (one mmap'd arena per node):", results["shared"])

    def total(r: dict[str, Any]) -> int:
        return int(r["main"]["pss"] + sum(w["pss"] for w in r["workers"]))

    def worst_uss(r: dict[str, Any]) -> int:
        return max(int(w["uss"]) for w in r["workers"])

    lst, sh = results["list"], results["shared"]
    print(
        f"\ntotal PSS: {format_bytes(total(lst))} -> {format_bytes(total(sh))} "
        f"({total(lst) / total(sh):.1f}x less); "
        f"largest worker USS: {format_bytes(worst_uss(lst))} -> {format_bytes(worst_uss(sh))}"
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``ferrofeed demo``."""
    parser = argparse.ArgumentParser(
        prog="ferrofeed demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--images",
        metavar="DIR",
        help="your own images, one subfolder per class (default: generate a sample)",
    )
    parser.add_argument(
        "--n-images", type=int, default=256, help="images to generate (default 256)"
    )
    parser.add_argument("--batch-size", type=int, default=32, help="default 32")
    parser.add_argument("--epochs", type=int, default=2, help="default 2")
    parser.add_argument(
        "--threads", type=int, help="decoding threads (default: the CPUs, at most 8)"
    )
    parser.add_argument("--size", type=int, default=224, help="output side (default 224)")
    parser.add_argument("--seed", type=int, default=0, help="default 0")
    parser.add_argument(
        "--annotations",
        type=int,
        default=100_000,
        help="annotations in the memory study (default 100000; 0 skips the study)",
    )
    parser.add_argument(
        "--workers", type=int, default=2, help="worker processes in the memory study (2)"
    )
    parser.add_argument("--passes", type=int, default=1, help="passes per worker (default 1)")
    parser.add_argument(
        "--start-method",
        choices=["fork", "spawn", "forkserver"],
        default="fork",
        help="how workers start (default fork, as PyTorch's DataLoader on Linux)",
    )
    parser.add_argument(
        "--shards",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="pack the images as WebDataset tar shards and read them back (default: for the "
        "generated sample, not for --images)",
    )
    parser.add_argument(
        "--shard-size", type=int, default=64, help="images per tar shard (default 64)"
    )
    parser.add_argument(
        "--no-compare",
        action="store_true",
        help="skip the side-by-side run of the loaders (and PyTorch's)",
    )
    parser.add_argument("--variant", choices=["list", "shared"], help=argparse.SUPPRESS)
    parser.add_argument("--loader", choices=list(LOADERS), help=argparse.SUPPRESS)
    parser.add_argument("--files", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.loader:
        with open(args.files) as f:
            listing = [(str(p), int(label)) for p, label in json.load(f)]
        print(json.dumps(run_loader(args.loader, listing, args)))
        return 0
    if args.variant:
        result = run_variant(
            args.variant, args.annotations, args.workers, args.passes, args.start_method
        )
        print(json.dumps(result))
        return 0
    for name in ("n_images", "batch_size", "epochs", "size", "shard_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")

    tmp = None
    try:
        if args.images:
            from ._images import ImageFolder

            try:
                folder = ImageFolder(args.images)
            except FileNotFoundError as e:
                print(f"ferrofeed demo: {e}", file=sys.stderr)
                return 2
            files = [(str(p), int(label)) for p, label in folder]
            print(
                f"ferrofeed demo: {len(files):,} images in {len(folder.classes)} classes "
                f"from {args.images} ({format_bytes(_folder_size([p for p, _ in files]))})"
            )
        else:
            tmp = tempfile.mkdtemp(prefix="ferrofeed-demo-")
            t0 = time.perf_counter()
            files = image_folder(tmp, args.n_images, seed=args.seed)
            print(
                f"ferrofeed demo: {len(files):,} generated ImageNet-like JPEGs (about "
                f"500x375, quality 75-95, 4 classes) in {tmp} "
                f"({format_bytes(_folder_size([p for p, _ in files]))}, made in "
                f"{time.perf_counter() - t0:.1f} s)"
            )
        _load(args, files)
        if args.shards if args.shards is not None else not args.images:
            if tmp is None:
                tmp = tempfile.mkdtemp(prefix="ferrofeed-demo-")
            _shards(args, files, os.path.join(tmp, "shards"))
        if not args.no_compare:
            _side_by_side(args, files)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.annotations > 0:
        _memory_study(args)
    return 0
