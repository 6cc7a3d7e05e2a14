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
import functools
import gc
import importlib.metadata
import importlib.util
import json
import multiprocessing
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from _common import (
    CROP,
    SHORT,
    FileDataset,
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
    native_train_decode,
    pack_parquet_shards,
    pack_tar_shards,
    rrc_params,
    run_fresh,
    shutdown_workers,
    tree_pss,
)
from bench_machine import cpu_model

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "benches" / "results"
QUICK_OUT = REPO_ROOT / "bench-results" / "compare-quick"
BATCH = 32
MIB = 1 << 20
# The jobs over image files, and the training job over the same images packed as shards.
FOLDER_JOBS = ("exact", "train")
JOBS = (*FOLDER_JOBS, "shards")
JOB_TITLES = {
    "exact": "exact 224 (shorter side 256, center crop 224)",
    "train": "training (RandomResizedCrop 224 + random flip)",
    "shards": "training (RandomResizedCrop 224 + random flip) from shards: WebDataset tar "
    "and Hugging Face Parquet",
}


@dataclass(frozen=True)
class Loader:
    """One loader configuration of the comparison."""

    key: str
    label: str
    # pytorch | torchvision | spdl | ferrofeed | dataloader-rs | datago | webdataset | hf
    family: str
    workers: int  # worker processes, or threads
    jobs: tuple[str, ...] = FOLDER_JOBS
    module: str = ""  # what must import for it to run ("" : nothing beyond this script's)
    probe: str = ""  # code that must run for it to run (default: import module)
    python: str = "main"  # "main": this interpreter; "py313": --py313

    @property
    def ferrofeed(self) -> bool:
        return self.family == "ferrofeed"


LOADERS = [
    *(
        Loader(
            f"pytorch-w{w}",
            f"PyTorch DataLoader + Pillow, {w} worker{'s' * (w != 1)}",
            "pytorch",
            w,
            module="torch",
        )
        for w in (0, 1, 2, 4)
    ),
    *(
        Loader(
            f"torchvision-w{w}",
            f"PyTorch DataLoader + torchvision decode_jpeg + transforms.v2, {w} workers",
            "torchvision",
            w,
            module="torchvision.io",
            # A torchvision built for another torch fails at its first operator: decode a JPEG.
            probe="import torch, torchvision.io as tio; "
            "tio.decode_jpeg(tio.encode_jpeg(torch.zeros(3, 8, 8, dtype=torch.uint8)))",
        )
        for w in (2, 4)
    ),
    Loader(
        "spdl",
        "SPDL 0.8 pipeline, FFmpeg decode, 2 threads",
        "spdl",
        2,
        module="spdl.io",
        # SPDL loads FFmpeg's libraries at the first decode: decode a JPEG to know.
        probe="import io, PIL.Image, spdl.io; b = io.BytesIO(); "
        "PIL.Image.new('RGB', (8, 8)).save(b, 'JPEG'); "
        "spdl.io.decode_packets(spdl.io.demux_image(b.getvalue()))",
    ),
    Loader(
        "dataloader-rs",
        "dataloader-rs + Pillow, 2 threads",
        "dataloader-rs",
        2,
        module="dataloader_rs",
        python="py313",
    ),
    Loader("datago", "datago decode + Pillow crop", "datago", 2, module="datago"),
    Loader("ferrofeed-native", "ferrofeed native chain, 2 threads", "ferrofeed", 2),
    # The shards job: the same images as tar and Parquet shards (see `SHARDS_DOC`).
    Loader(
        "ferrofeed-folder",
        "ferrofeed native chain over the image files, 2 threads",
        "ferrofeed",
        2,
        jobs=("shards",),
    ),
    Loader(
        "ferrofeed-tar",
        "ferrofeed native chain over tar shards (TarShards), 2 threads",
        "ferrofeed",
        2,
        jobs=("shards",),
    ),
    Loader(
        "ferrofeed-parquet",
        "ferrofeed native chain over Parquet shards (ParquetShards), 2 threads",
        "ferrofeed",
        2,
        jobs=("shards",),
        module="pyarrow",  # what writes the Parquet shards
    ),
    # The shards job's peers, each in PyTorch's DataLoader with Pillow, 2 and 4 workers.
    *(
        Loader(f"{key}-w{w}", f"{label}, {w} workers", family, w, jobs=("shards",), module=module)
        for key, label, family, module in (
            ("webdataset", "webdataset + PyTorch DataLoader + Pillow", "webdataset", "webdataset"),
            (
                "hf",
                "HF datasets (Parquet, map-style) + PyTorch DataLoader + Pillow",
                "hf",
                "datasets",
            ),
            (
                "hf-stream",
                "HF datasets streaming (IterableDataset) + PyTorch DataLoader + Pillow",
                "hf",
                "datasets",
            ),
        )
        for w in (2, 4)
    ),
    Loader(
        "ferrofeed-native-flip",
        "ferrofeed decode per sample (io.decode_image, flip drawn in Python), 2 threads",
        "ferrofeed",
        2,
        jobs=("train",),
    ),
    Loader("ferrofeed-threads", "ferrofeed + Pillow, 2 threads", "ferrofeed", 2),
    Loader("ferrofeed-w2", "ferrofeed + Pillow, 2 worker processes", "ferrofeed", 2),
    Loader("ferrofeed-w4", "ferrofeed + Pillow, 4 worker processes", "ferrofeed", 4),
]
BY_KEY = {lo.key: lo for lo in LOADERS}
# The ferrofeed configuration each headline ratio is quoted for, per job.
HEADLINE = {"exact": "ferrofeed-native", "train": "ferrofeed-native", "shards": "ferrofeed-tar"}
# Pairs compared round by round (besides ferrofeed with each peer): the torchvision loader
# against the Pillow one with as many workers; ferrofeed's shard sources against its
# image-folder path (the "no more CPU per image than the image-folder path").
PEER_PAIRS = [
    *((f"torchvision-w{w}", f"pytorch-w{w}") for w in (2, 4)),
    ("ferrofeed-tar", "ferrofeed-folder"),
    ("ferrofeed-parquet", "ferrofeed-folder"),
]


def torchvision_requirement(torch_version: str) -> str:
    """The pip requirement for the torchvision releases built for ``torch_version``.

    torchvision 0.(m+15) is the release for torch 2.m. From 0.29 (torch 2.14) on, its wheels'
    extensions (``_C_stable.so``, ``image_stable.so``) use only libtorch's stable ABI and the
    wheels require ``torch>=2.14.0`` rather than one release: a later torch takes any of them
    up to its own (torch 2.15 with torchvision 0.29.2, before 0.30 was on PyPI).
    ``make compare-deps`` installs it with ``--no-deps``, so that pip cannot replace the
    installed torch.

    >>> torchvision_requirement("2.5.1+cu124")
    'torchvision==0.20.*'
    >>> torchvision_requirement("2.15.0+cu132")
    'torchvision>=0.29,<0.31'
    """
    m = re.match(r"(\d+)\.(\d+)", torch_version)
    if m is None or int(m[1]) != 2 or int(m[2]) < 3:
        raise ValueError(f"no known torchvision for torch {torch_version!r} (2.3 or later)")
    own = int(m[2]) + 15
    if own < 29:
        return f"torchvision==0.{own}.*"
    return f"torchvision>=0.29,<0.{own + 1}"


# --- the loaders, each built in its child interpreter ------------------------------------------


class NativeTrainFlip(FileDataset):
    """Training job with ferrofeed's decoder called per sample from Python.

    ``ferrofeed.io.decode_image(path, size=224, crop="random", seed=..., flip=...)``, the
    parameters drawn in Python: what a map-style dataset with its own ``__getitem__`` does
    (the decode still runs without the GIL). The native chain does the same job with
    ``ops.decode_image(size=224, crop="random", flip="random")``.
    """

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        path, label = self.files[i]
        return np.from_dlpack(native_train_decode(path)), label


class TorchvisionJob(FileDataset):
    """A job with torchvision: ``read_file``, ``decode_jpeg`` and ``transforms.v2`` on uint8.

    What a speed-minded PyTorch user writes instead of the Pillow transform: the file read
    into a uint8 tensor (``torchvision.io.read_file``), decoded on the CPU by the
    libjpeg-turbo torchvision bundles (``decode_jpeg(data, mode=ImageReadMode.RGB,
    device="cpu")``; RGB as Pillow's ``convert("RGB")``, for the greyscale files), then
    ``v2.RandomResizedCrop(224, antialias=True)`` + ``v2.RandomHorizontalFlip()`` (training)
    or ``v2.Resize(256, antialias=True)`` + ``v2.CenterCrop(224)`` (exact 224) on the uint8
    CHW tensor. The image is handed to the default collate as an HWC view
    (``permute(1, 2, 0)``), so the collate's one stack (a copy it makes anyway) gives the
    same uint8 NHWC batches as the Pillow loaders. The random draws use torch's generator,
    which PyTorch's DataLoader seeds in each worker. (torchvision 0.29 deprecates these
    decoders in favour of TorchCodec's; they still work, and are what users run today.)
    """

    def __init__(self, files: list[tuple[str, int]], job: str) -> None:
        from torchvision.transforms import v2

        super().__init__(files)
        if job == "exact":
            self.transform = v2.Compose([v2.Resize(SHORT, antialias=True), v2.CenterCrop(CROP)])
        else:
            self.transform = v2.Compose(
                [v2.RandomResizedCrop(CROP, antialias=True), v2.RandomHorizontalFlip()]
            )

    def __getitem__(self, i: int) -> tuple[Any, int]:
        from torchvision.io import ImageReadMode, decode_jpeg, read_file

        path, label = self.files[i]
        image = decode_jpeg(read_file(path), mode=ImageReadMode.RGB, device="cpu")
        return self.transform(image).permute(1, 2, 0), label


def stack_batch(samples: list[tuple[np.ndarray, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Collate ``(image, label)`` samples into a uint8 NHWC batch and int64 labels."""
    return np.stack([s[0] for s in samples]), np.array([s[1] for s in samples], np.int64)


def spdl_epochs(
    files: list[tuple[str, int]], job: str, threads: int, seed: int
) -> Iterator[Iterator[Any]]:
    """SPDL 0.8: one pipeline per epoch (SPDL's pattern), decoded and filtered by FFmpeg.

    Source: the epoch's permutation; ``pipe(load, concurrency=threads)``: demux and decode
    each JPEG with FFmpeg's filters doing the job (``scale_mode="crop"`` for exact 224, a
    ``crop,scale,hflip`` chain drawn per image for training); ``aggregate(32)``; one
    ``convert_frames`` per batch.
    """
    import spdl.io
    from spdl.pipeline import PipelineBuilder

    exact_filter = spdl.io.get_video_filter_desc(
        scale_width=256,
        scale_height=256,
        scale_algo="bilinear",
        scale_mode="crop",
        crop_width=CROP,
        crop_height=CROP,
        pix_fmt="rgb24",
    )

    def load(i: int) -> tuple[Any, int]:
        path, label = files[i]
        packets = spdl.io.demux_image(path)
        if job == "exact":
            desc = exact_filter
        else:
            left, top, right, bottom = rrc_params(packets.width, packets.height)
            desc = (
                f"crop={right - left}:{bottom - top}:{left}:{top},"
                f"scale={CROP}:{CROP}:flags=bilinear"
                + (",hflip" if random.random() < 0.5 else "")
                + ",format=rgb24"
            )
        return spdl.io.decode_packets(packets, filter_desc=desc), label

    def collate(items: list[tuple[Any, int]]) -> tuple[np.ndarray, np.ndarray]:
        buf = spdl.io.convert_frames([frames for frames, _ in items])
        images = np.asarray(spdl.io.to_numpy(buf))
        return images, np.array([label for _, label in items], np.int64)

    def epochs() -> Iterator[Iterator[Any]]:
        epoch = 0
        while True:
            order = np.random.default_rng([seed, epoch]).permutation(len(files)).tolist()
            pipeline = (
                PipelineBuilder()
                .add_source(order)
                .pipe(load, concurrency=threads, output_order="input")
                .aggregate(BATCH)
                .pipe(collate)
                .add_sink(4)
                .build(num_threads=threads)
            )
            with pipeline.auto_stop():
                yield pipeline.get_iterator(timeout=600)
            epoch += 1

    return epochs()


def datago_epochs(root: str, files: list[tuple[str, int]], job: str) -> Iterator[Iterator[Any]]:
    """datago: its Rust threads read and decode the folder; Pillow resizes and crops here.

    datago's own processing crops to aspect-ratio buckets, which is not either job: the
    decoded image comes back as a raw buffer, and the job's resize and crop run in Python
    on the main thread (as a datago user would write it). Its ``random_sampling`` shuffles;
    ``start()`` begins each epoch.
    """
    import datago

    labels = {os.path.basename(p): label for p, label in files}
    exact = PillowExact([])
    train = PillowTrain([])
    config = {
        "source_type": "file",
        "source_config": {"root_path": root, "random_sampling": True, "rank": 0, "world_size": 1},
        "limit": len(files),
        "samples_buffer_size": 64,
    }
    client = datago.DatagoClient(json.dumps(config))

    def transform(sample: Any) -> tuple[np.ndarray, int]:
        im = sample.image.to_pil_image().convert("RGB")
        out = exact.apply(im) if job == "exact" else train.apply(im)
        return out, labels[os.path.basename(sample.id.strip('"'))]

    def one_epoch() -> Iterator[Any]:
        client.start()
        batch: list[tuple[np.ndarray, int]] = []
        while (sample := client.get_sample()) is not None:
            batch.append(transform(sample))
            if len(batch) == BATCH:
                yield stack_batch(batch)
                batch = []
        if batch:
            yield stack_batch(batch)

    def epochs() -> Iterator[Iterator[Any]]:
        try:
            while True:
                yield one_epoch()
        finally:
            client.stop()

    return epochs()


def torch_loader(
    dataset: Any, workers: int, seed: int, *, shuffle: bool = True, batch_size: int = BATCH
) -> Any:
    """PyTorch's DataLoader as every PyTorch-based loader here runs it: batches of 32 (or
    ``batch_size``: benches/scaling.py), ``workers`` persistent worker processes started by
    fork (PyTorch's default on Linux), the shuffle (of a map-style dataset) seeded by
    ``seed``."""
    import torch

    # 4 workers on 2 CPUs is one of the configurations measured, on purpose.
    warnings.filterwarnings("ignore", "This DataLoader will create", UserWarning)
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        num_workers=workers,
        persistent_workers=workers > 0,
        generator=torch.Generator().manual_seed(seed),
        multiprocessing_context="fork" if workers > 0 else None,
    )


def webdataset_loader(spec: dict[str, Any], workers: int, seed: int) -> Any:
    """webdataset's usual pipeline over the tar shards, in PyTorch's DataLoader.

    ``WebDataset(urls, shardshuffle=<shards>, seed=seed)`` (each worker reads its own
    shards: webdataset's ``split_by_worker``, the shard order shuffled), ``.shuffle(window)``
    (a buffer of samples in each worker, before the decode: bytes), ``.decode("pil")``
    (Pillow, RGB), ``.to_tuple("jpg", "cls")`` and the training transform with Pillow as the
    other Pillow loaders run it; PyTorch's DataLoader batches by 32 in each worker.
    """
    import webdataset as wds

    train = PillowTrain([])
    shards = spec["shards"]
    dataset = (
        wds.WebDataset(shards["tar"], shardshuffle=len(shards["tar"]), seed=seed)
        .shuffle(shards["window"])
        .decode("pil")
        .to_tuple("jpg", "cls")
        .map_tuple(train.apply, int)
    )
    return torch_loader(dataset, workers, seed, shuffle=False)


def hf_loader(spec: dict[str, Any], workers: int, seed: int, *, streaming: bool) -> Any:
    """Hugging Face ``datasets`` over the Parquet shards, in PyTorch's DataLoader.

    Map-style (``streaming=False``): ``load_dataset("parquet", data_files=...)``, whose
    Arrow cache the parent prepared once (as a first ``load_dataset`` does: later runs
    memory-map it), ``set_transform`` running the Pillow training transform on the decoded
    ``Image`` column of each batch of rows that PyTorch's shuffled sampler asks for
    (``__getitems__``). Streaming: ``load_dataset(..., streaming=True)``, an
    ``IterableDataset`` that reads the Parquet files themselves, each worker its own
    shards, ``.shuffle(seed=seed, buffer_size=window)`` and ``.map`` with the same
    transform on each decoded sample. Batches are dicts of ``image`` and ``label``.
    """
    import datasets

    train = PillowTrain([])
    shards = spec["shards"]
    if streaming:
        stream = datasets.load_dataset(
            "parquet", data_files=shards["parquet"], split="train", streaming=True
        ).shuffle(seed=seed, buffer_size=shards["window"])
        return torch_loader(
            stream.map(
                lambda s: {"image": train.apply(s["image"].convert("RGB")), "label": s["label"]}
            ),
            workers,
            seed,
            shuffle=False,
        )

    def transform(rows: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return {
            "image": [train.apply(im.convert("RGB")) for im in rows["image"]],
            "label": rows["label"],
        }

    table = datasets.load_dataset(
        "parquet", data_files=shards["parquet"], split="train", cache_dir=shards["hf_cache"]
    )
    table.set_transform(transform)
    return torch_loader(table, workers, seed)


def build(lo: Loader, job: str, spec: dict[str, Any]) -> Iterator[Iterable[Any]]:
    """Build loader ``lo`` for ``job``; return an iterator of epochs (each an iterable)."""
    files = [(p, int(label)) for p, label in spec["files"]]
    seed, w = spec["seed"], lo.workers
    pillow = PillowExact(files) if job == "exact" else PillowTrain(files)

    def forever(loader: Iterable[Any]) -> Iterator[Iterable[Any]]:
        try:
            while True:
                yield loader
        finally:  # on close(): end the worker processes, so that the child reaps them
            shutdown_workers(loader)

    if lo.family in ("pytorch", "torchvision"):
        dataset = pillow if lo.family == "pytorch" else TorchvisionJob(files, job)
        # torchvision 0.29 deprecates its image decoders (for TorchCodec's) at every call.
        warnings.filterwarnings("ignore", "The image decoding and encoding", DeprecationWarning)
        return forever(torch_loader(dataset, w, seed))
    if lo.family == "webdataset":
        return forever(webdataset_loader(spec, w, seed))
    if lo.family == "hf":
        return forever(hf_loader(spec, w, seed, streaming=lo.key.startswith("hf-stream")))
    if lo.family == "spdl":
        return spdl_epochs(files, job, w, seed)
    if lo.family == "datago":
        return datago_epochs(spec["root"], files, job)
    if lo.family == "dataloader-rs":
        import dataloader_rs

        class Dataset(dataloader_rs.PyDataset):  # type: ignore[misc]
            def __init__(self) -> None:
                super().__init__()

            def __len__(self) -> int:
                return len(pillow)

            def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
                return pillow[i]

        return forever(
            dataloader_rs.PyDataloader(
                Dataset(),
                batch_size=BATCH,
                shuffle=True,
                seed=seed,
                num_workers=w,
                collate_fn=stack_batch,
            )
        )
    import ferrofeed

    if lo.key in ("ferrofeed-native", "ferrofeed-folder"):
        op = native_op("exact" if job == "exact" else "train")
        return forever(
            ferrofeed.DataLoader(files, BATCH, shuffle=True, seed=seed, transform=op, num_threads=w)
        )
    if lo.key in ("ferrofeed-tar", "ferrofeed-parquet"):
        tar, shards = lo.key == "ferrofeed-tar", spec["shards"]
        return forever(
            ferrofeed.DataLoader(
                ferrofeed.TarShards(shards["tar"])
                if tar
                else ferrofeed.ParquetShards(shards["parquet"]),
                BATCH,
                shuffle=True,
                seed=seed,
                shuffle_window=shards["window"],
                transform=native_op("train"),
                image="jpg" if tar else "image",
                label="cls" if tar else "label",
                num_threads=w,
            )
        )
    if lo.key == "ferrofeed-native-flip":
        return forever(
            ferrofeed.DataLoader(
                NativeTrainFlip(files), BATCH, shuffle=True, seed=seed, num_threads=w
            )
        )
    if lo.key == "ferrofeed-threads":
        return forever(ferrofeed.DataLoader(pillow, BATCH, shuffle=True, seed=seed, num_threads=w))
    return forever(
        ferrofeed.DataLoader(
            pillow,
            BATCH,
            shuffle=True,
            seed=seed,
            num_workers=w,
            worker_start_method="fork",
            persistent_workers=True,
        )
    )


def batch_images(batch: Any) -> Any:
    """The images of a batch: ``(images, labels)``, or ``{"image": ..., "label": ...}``
    from Hugging Face ``datasets``."""
    if isinstance(batch, dict):
        return batch["image"]
    images, _labels = batch
    return images


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
    gc.collect()
    n, me = len(spec["files"]), os.getpid()
    pss_before = tree_pss(me)
    cpu_before = cpu_self() + cpu_children()
    t0 = time.perf_counter()
    epochs_it = build(lo, job, spec)
    ttfb = 0.0
    epoch_s: list[float] = []
    pss_epoch_end: list[int] = []
    shape = None
    for epoch in range(spec["epochs"]):
        t = time.perf_counter() if epoch else t0
        count = 0
        for batch in next(epochs_it):
            images = batch_images(batch)
            if shape is None:
                ttfb = time.perf_counter() - t0
                shape, dtype = tuple(images.shape[1:]), str(images.dtype)
                if shape != (CROP, CROP, 3) or "uint8" not in dtype:
                    raise AssertionError(f"{lo.key}: batches of {shape} {dtype}")
            count += len(images)
            del batch, images
        epoch_s.append(time.perf_counter() - t)
        pss_epoch_end.append(tree_pss(me))
        if count != n:
            raise AssertionError(f"{lo.key}: epoch {epoch} gave {count} images, not {n}")
    epochs_it.close()  # ends worker processes, threads, pipelines
    del epochs_it
    gc.collect()
    multiprocessing.active_children()  # reaps the workers that ended
    # Workers still alive now would leave their CPU time out (flagged).
    left = child_pids(me)
    # This interpreter's CPU time (all its threads) and its reaped workers', from building
    # the loader to here: the interpreter's own exit (torch's teardown) is not the loader's.
    cpu_loader = cpu_self() + cpu_children() - cpu_before
    steady = epoch_s[1:] or epoch_s
    return {
        "loader": lo.key,
        "job": job,
        "python": platform.python_version(),
        "ttfb_s": ttfb,
        "epoch_s": epoch_s,
        "images_per_s": n * len(steady) / sum(steady),
        "images": n * len(epoch_s),
        "cpu_before_loader_s": cpu_before,
        "cpu_loader_s": cpu_loader,
        "pss_before_loader": pss_before,
        "pss_epoch_end": pss_epoch_end,
        "children_left": len(left),
        "torch_imported": "torch" in sys.modules,
    }


# --- running the rounds ------------------------------------------------------------------------


def available(lo: Loader, py313: str | None) -> tuple[bool, str]:
    """Whether ``lo`` can run here, and if not, why (said in the results)."""
    if lo.python == "py313":
        if not py313:
            return False, "needs Python >= 3.13 (none given: --py313, or make compare finds one)"
        probe = subprocess.run(
            [py313, "-c", f"import {lo.module}, PIL, numpy"], capture_output=True, text=True
        )
        if probe.returncode != 0:
            last = (probe.stderr.strip().splitlines() or ["?"])[-1]
            return False, f"not importable by {py313}: {last}"
        return True, f"in {py313}"
    if not lo.module:
        return True, ""
    if importlib.util.find_spec(lo.module.split(".")[0]) is None:
        return False, f"{lo.module.split('.')[0]} is not installed"
    return runs_here(lo.probe or f"import {lo.module}")


@functools.cache
def runs_here(code: str) -> tuple[bool, str]:
    """Whether ``code`` runs in a fresh interpreter, and if not, its last error line."""
    probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return False, f"fails here: {last}"
    return True, ""


def version_of(dist: str, python: str | None = None) -> str | None:
    if python:
        probe = subprocess.run(
            [python, "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
            capture_output=True,
            text=True,
        )
        return probe.stdout.strip() or None if probe.returncode == 0 else None
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def run_one(
    lo: Loader, job: str, base: dict[str, Any], workdir: str, args: argparse.Namespace
) -> dict[str, Any]:
    """One (job, loader) in a fresh interpreter, with the tree's CPU time and PSS samples."""
    spec = {**base, "loader": lo.key, "job": job}
    python = args.py313 if lo.python == "py313" else sys.executable
    r = run_fresh(
        __file__, spec, workdir, args.timeout, pss_interval=args.pss_interval, python=python
    )
    r["cpu_s_per_1000"] = r["cpu_loader_s"] / r["images"] * 1000
    samples = [v for _, v in r.pop("pss_series")] + r["pss_epoch_end"]
    r["peak_pss"] = max(samples)
    r["peak_pss_added"] = r["peak_pss"] - r["pss_before_loader"]
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


def ratios(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Each ferrofeed configuration against each peer, per job, round by round."""
    out: dict[str, Any] = {}
    for job, by_loader in runs.items():
        ours = [k for k in by_loader if BY_KEY[k].ferrofeed]
        peers = [k for k in by_loader if not BY_KEY[k].ferrofeed]
        out[job] = {}
        for f in ours:
            for p in peers:
                rounds = min(len(by_loader[f]), len(by_loader[p]))
                if not rounds:
                    continue
                per = [(by_loader[f][i], by_loader[p][i]) for i in range(rounds)]
                out[job][f"{f} vs {p}"] = {
                    # >1: ferrofeed better on each.
                    "throughput": med_range(
                        [a["images_per_s"] / b["images_per_s"] for a, b in per]
                    ),
                    "cpu_per_image_less": med_range(
                        [b["cpu_s_per_1000"] / a["cpu_s_per_1000"] for a, b in per]
                    ),
                    "ttfb_sooner": med_range([b["ttfb_s"] / a["ttfb_s"] for a, b in per]),
                    "pss_added_less": med_range(
                        [b["peak_pss_added"] / a["peak_pss_added"] for a, b in per]
                    ),
                }
    return out


def best_peer_ratios(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Each ferrofeed configuration's images/s against the fastest peer of each round (which
    peer that is may change from round to round), per job: median and range."""
    out: dict[str, Any] = {}
    for job, by_loader in runs.items():
        peers = [k for k in by_loader if not BY_KEY[k].ferrofeed and by_loader[k]]
        for f in [k for k in by_loader if BY_KEY[k].ferrofeed]:
            rounds = min([len(by_loader[f])] + [len(by_loader[p]) for p in peers])
            if not peers or not rounds:
                continue
            per = [
                by_loader[f][i]["images_per_s"]
                / max(by_loader[p][i]["images_per_s"] for p in peers)
                for i in range(rounds)
            ]
            out.setdefault(job, {})[f] = med_range(per)
    return out


def peer_ratios(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Each pair of `PEER_PAIRS` that ran, per job, round by round (>1: the first better)."""
    out: dict[str, Any] = {}
    for job, by_loader in runs.items():
        for a, b in PEER_PAIRS:
            rounds = min(len(by_loader.get(a, [])), len(by_loader.get(b, [])))
            if not rounds:
                continue
            per = [(by_loader[a][i], by_loader[b][i]) for i in range(rounds)]
            out.setdefault(job, {})[f"{a} vs {b}"] = {
                "throughput": med_range([x["images_per_s"] / y["images_per_s"] for x, y in per]),
                "cpu_per_image_less": med_range(
                    [y["cpu_s_per_1000"] / x["cpu_s_per_1000"] for x, y in per]
                ),
            }
    return out


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "images_per_s": med_range([r["images_per_s"] for r in runs]),
        "ttfb_s": med_range([r["ttfb_s"] for r in runs]),
        "cpu_s_per_1000": med_range([r["cpu_s_per_1000"] for r in runs]),
        "peak_pss": med_range([r["peak_pss"] for r in runs]),
        "peak_pss_added": med_range([r["peak_pss_added"] for r in runs]),
        "pss_growth": med_range([r["pss_growth"] for r in runs]),
    }


# --- report: markdown tables and plots ---------------------------------------------------------


def markdown(results: dict[str, Any]) -> str:
    """The tables BENCHMARKS.md quotes, from the results."""
    lines: list[str] = []
    # Results written before the CPU had a field of its own name it in "machine".
    cpu = results.get("cpu") or results["machine"]
    for job, summary in results["summary"].items():
        lines += [
            f"#### {JOB_TITLES[job]}, on {cpu}",
            "",
            "| loader | images/s | first batch (ms) | CPU s / 1000 images | peak PSS (MiB) "
            "| added by the loader (MiB) | growth, epoch 1→3 (MiB) |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for key, s in summary.items():
            label = BY_KEY[key].label
            label = f"**{label}**" if BY_KEY[key].ferrofeed else label
            lines.append(
                f"| {label} | {fmt(s['images_per_s'])} | {fmt(s['ttfb_s'], 1e3)} "
                f"| {fmt(s['cpu_s_per_1000'], digits=2)} | {fmt(s['peak_pss'], 1 / MIB)} "
                f"| {fmt(s['peak_pss_added'], 1 / MIB)} | {fmt(s['pss_growth'], 1 / MIB, 1)} |"
            )
        lines.append("")
        table = results["ratios"].get(job, {})
        peers = [k for k in summary if not BY_KEY[k].ferrofeed]
        native = HEADLINE[job]
        if native in summary and peers:
            lines += [
                f"{BY_KEY[native].label} against each peer, from the same rounds (per round, "
                "then median and range; above 1 is better for ferrofeed):",
                "",
                "| peer | images/s | less CPU per image | first batch sooner | less memory added |",
                "|---|---:|---:|---:|---:|",
            ]
            for p in peers:
                r = table[f"{native} vs {p}"]
                lines.append(
                    f"| {BY_KEY[p].label} | {fmt_ratio(r['throughput'])} "
                    f"| {fmt_ratio(r['cpu_per_image_less'])} | {fmt_ratio(r['ttfb_sooner'])} "
                    f"| {fmt_ratio(r['pss_added_less'])} |"
                )
            lines.append("")
            bests = results.get("best_peer", {}).get(job, {})
            if bests:
                lines += ["Images/s against the fastest peer of each round:", ""]
                lines += [f"- {BY_KEY[k].label}: {fmt_ratio(r)}" for k, r in bests.items()]
                lines.append("")
        pairs = results.get("peer_ratios", {}).get(job, {})
        if pairs:
            lines += [
                "Pairs from the same rounds (per round, then median and range; above 1 is "
                "better for the first):",
                "",
                "| loader | against | images/s | less CPU per image |",
                "|---|---|---:|---:|",
            ]
            for pair, r in pairs.items():
                a, b = pair.split(" vs ")
                lines.append(
                    f"| {BY_KEY[a].label} | {BY_KEY[b].label} | {fmt_ratio(r['throughput'])} "
                    f"| {fmt_ratio(r['cpu_per_image_less'])} |"
                )
            lines.append("")
        same = [k for k in ("ferrofeed-threads", "ferrofeed-w2") if k in summary]
        if same and peers:
            lines += [
                "ferrofeed running the same Pillow transform as PyTorch, against each peer "
                "(images/s ratio; CPU per image, less):",
                "",
                "| peer | " + " | ".join(BY_KEY[k].label for k in same) + " |",
                "|---|" + "---:|" * len(same),
            ]
            for p in peers:
                cells = [
                    f"{fmt_ratio(table[f'{k} vs {p}']['throughput'])}; CPU "
                    f"{fmt_ratio(table[f'{k} vs {p}']['cpu_per_image_less'])}"
                    for k in same
                ]
                lines.append(f"| {BY_KEY[p].label} | " + " | ".join(cells) + " |")
            lines.append("")
    not_run = results["not_run"]
    if not_run:
        lines += ["Not run:", ""]
        lines += [f"- {BY_KEY[k].label}: {why}" for k, why in not_run.items()]
        lines.append("")
    if results.get("warnings"):
        lines += ["Warnings:", ""] + [f"- {w}" for w in results["warnings"]] + [""]
    ram = results.get("ram")
    if ram:
        lines += [
            f"#### metadata only: {ram['runs'][0]['n']:,} COCO-like annotations, "
            f"{ram['layout']}, each reads every item, on {cpu}",
            "",
            "| loader | peak total PSS (MiB) | steady total PSS (MiB) "
            "| job footprint, no data (MiB) | wall time (s) |",
            "|---|---:|---:|---:|---:|",
        ]
        for r in ram["runs"]:
            name = r["container"]
            name = f"**{name}**" if name.startswith("ferrofeed") else name
            bound = " (stopped: a lower bound)" if r.get("lower_bound") else ""
            footprint = r.get("footprint")
            lines.append(
                f"| {name}{bound} | {r['peak_total_pss'] / MIB:,.1f} "
                f"| {r['total_pss_end'] / MIB:,.1f} "
                f"| {'-' if footprint is None else f'{footprint / MIB:,.1f}'} "
                f"| {r['iterate_s']:.1f} |"
            )
        lines.append("")
        for t in ram.get("targets") or []:
            method = t.get("method", "?")
            one = t.get("same_libs_one_copy_ratio") or t.get("steady_one_copy_ratio")
            torch_ratio = t.get("steady_torch_ratio")
            parts = []
            if one is not None:
                parts.append(f"ferrofeed's steady PSS is {one:.3f}x one copy + footprint")
            if torch_ratio is not None:
                parts.append(f"{torch_ratio:.3f}x PyTorch's")
            if parts:
                lines.append(f"- {method}: " + ", ".join(parts))
        lines.append("")
    return "\n".join(lines)


PLOT_METRICS = [
    ("images_per_s", 1.0, "images/s (higher is better)", "throughput"),
    ("cpu_s_per_1000", 1.0, "CPU s per 1000 images, whole process tree (lower is better)", "cpu"),
    ("peak_pss_added", 1 / MIB, "peak PSS added by the loader, MiB (lower is better)", "pss"),
]
JOB_COLORS = {"exact": "#1b9e77", "train": "#d95f02", "shards": "#7570b3"}


def _bars(
    ax: Any, summary: dict[str, Any], jobs: list[str], keys: list[str], metric: str, scale: float
) -> None:
    """One horizontal bar per (loader, job) of ``metric``: the median, min-max whiskers."""
    height = 0.8 / max(len(jobs), 1)
    top = 0.0
    for n, job in enumerate(jobs):
        ys, med, lo, hi = [], [], [], []
        for y, key in enumerate(keys):
            if key not in summary[job]:
                continue
            stat = summary[job][key][metric]
            ys.append(y + ((len(jobs) - 1) / 2 - n) * height)
            med.append(stat["median"] * scale)
            lo.append((stat["median"] - stat["min"]) * scale)
            hi.append((stat["max"] - stat["median"]) * scale)
        ax.barh(
            ys,
            med,
            height,
            xerr=[lo, hi],
            color=JOB_COLORS[job],
            capsize=2,
            error_kw={"lw": 0.8},
            label=JOB_TITLES[job],
        )
        for y, m, h in zip(ys, med, hi, strict=True):
            ax.text(m + h, y, f" {m:,.0f}" if m >= 10 else f" {m:.2f}", va="center", fontsize=7)
            top = max(top, m + h)
    ax.set_xlim(0, top * 1.15)
    ax.grid(axis="x", alpha=0.3)


def _loader_ticks(ax: Any, keys: list[str]) -> None:
    ax.set_yticks(range(len(keys)), [BY_KEY[k].label for k in keys], fontsize=8)
    for tick, key in zip(ax.get_yticklabels(), keys, strict=True):
        if BY_KEY[key].ferrofeed:
            tick.set_fontweight("bold")


def plots(results: dict[str, Any], out_dir: Path, stem: str = "compare") -> list[Path]:
    """PNG plots of images/s, CPU per image and memory per loader and job; PSS over time
    (RAM job).

    Several jobs: one plot per metric, a bar per job (``{stem}_throughput.png``,
    ``{stem}_cpu.png``, ``{stem}_pss.png``). One job (e.g. ``--jobs shards``): one plot,
    ``{stem}.png``, with the three metrics side by side.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    summary = results["summary"]
    jobs = [j for j in JOBS if j in summary]
    keys = [lo.key for lo in LOADERS if any(lo.key in summary[j] for j in jobs)][::-1]
    # The machine (its CPU first) on a line of its own, so that it is never cut off.
    title = results["title"].replace("; ", "\n", 1)
    if len(jobs) == 1 and keys:
        fig, axes = plt.subplots(
            1, len(PLOT_METRICS), figsize=(15, 0.45 * len(keys) + 1.8), sharey=True
        )
        for ax, (metric, scale, xlabel, _name) in zip(axes, PLOT_METRICS, strict=True):
            _bars(ax, summary, jobs, keys, metric, scale)
            ax.set_xlabel(xlabel, fontsize=8)
            ax.tick_params(axis="x", labelsize=7)
        _loader_ticks(axes[0], keys)
        fig.suptitle(
            f"{JOB_TITLES[jobs[0]]}; median of the rounds, bars: min-max\n{title}", fontsize=8
        )
        fig.tight_layout()
        path = out_dir / f"{stem}.png"
        fig.savefig(path, dpi=72)
        plt.close(fig)
        written.append(path)
    for metric, scale, xlabel, name in PLOT_METRICS if keys and len(jobs) > 1 else []:
        fig, ax = plt.subplots(figsize=(8.5, 0.5 * len(keys) + 1.5))
        _bars(ax, summary, jobs, keys, metric, scale)
        _loader_ticks(ax, keys)
        ax.set_xlabel(f"{xlabel}; median of the rounds, bars: min-max", fontsize=8)
        ax.legend(fontsize=8, loc="lower right")
        ax.set_title(title, fontsize=8)
        fig.tight_layout()
        path = out_dir / f"{stem}_{name}.png"
        fig.savefig(path, dpi=72)
        plt.close(fig)
        written.append(path)
    ram = results.get("ram")
    if ram:
        fig, ax = plt.subplots(figsize=(7, 3.6))
        for r in ram["runs"]:
            t = [s[0] for s in r["series"]]
            v = [s[1] / MIB for s in r["series"]]
            ax.plot(t, v, label=r["container"], lw=1.5)
        ax.set_xlabel("seconds since the workers started", fontsize=8)
        ax.set_ylabel("total PSS, MiB", fontsize=8)
        ax.set_title(
            f"{ram['runs'][0]['n']:,} COCO-like annotations, {ram['layout']}: "
            f"PSS of all processes over time\n{results['machine']}",
            fontsize=8,
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / f"{stem}_ram.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(path)
    return written


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
    p.add_argument("--timeout", type=float, default=1200.0, help="per run, seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a short run: small sizes, 1 round")
    p.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="where results go (default benches/results; --quick: bench-results/compare-quick)",
    )
    p.add_argument(
        "--replot",
        type=Path,
        default=None,
        help="only redraw the tables and plots of a compare.json (into --out-dir)",
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
    # --quick: small sizes and one round; what is given explicitly stays.
    defaults = (96, 1, 20_000, 2, 16) if args.quick else (2000, 3, 1_000_000, 4, 200)
    names = ("n", "rounds", "ram_n", "ram_workers", "shard_size")
    for name, value in zip(names, defaults, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.out_dir is None:  # a quick run leaves the committed results alone
        args.out_dir = QUICK_OUT if args.quick else DEFAULT_OUT
    args.ram_methods = tuple(m.strip() for m in args.ram_methods.split(",") if m.strip())
    if unknown := set(args.ram_methods) - {"fork", "forkserver"}:
        p.error(f"unknown start methods: {sorted(unknown)}")
    args.jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
    if unknown := set(args.jobs) - {*JOBS, "ram"}:
        p.error(f"unknown jobs: {sorted(unknown)}")
    if args.loaders == "all":
        args.loaders = list(BY_KEY)
    else:
        args.loaders = [k.strip() for k in args.loaders.split(",") if k.strip()]
        if unknown := set(args.loaders) - set(BY_KEY):
            p.error(f"unknown loaders: {sorted(unknown)}")
    if args.n < BATCH or args.epochs < 2 or args.rounds < 1:
        p.error(f"--n must be >= {BATCH}, --epochs >= 2, --rounds >= 1")
    if args.shard_size < 1 or args.shuffle_window < 1:
        p.error("--shard-size and --shuffle-window must be >= 1")
    return args


def versions(py313: str | None) -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in (
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
    ):
        out[dist] = version_of(dist)
    out["matplotlib"] = version_of("matplotlib")
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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv if argv is None else argv
    if child_entry(argv, child_main):
        return 0
    args = parse_args(argv[1:])
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

    loaders = [BY_KEY[k] for k in args.loaders]
    not_run: dict[str, str] = {}
    runnable = []
    for lo in loaders:
        ok, why = available(lo, args.py313)
        if ok:
            runnable.append(lo)
        else:
            not_run[lo.key] = why
            print(f"skipped {lo.key} ({lo.label}): {why}", flush=True)
    load_start = [round(x, 2) for x in os.getloadavg()]
    results: dict[str, Any] = {
        "cpu": cpu_model(),
        "machine": f"{cpu_model()}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB",
        "versions": versions(args.py313),
        "command": "python benches/compare.py " + " ".join(argv[1:]),
        "args": {k: str(v) for k, v in vars(args).items()},
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "loadavg_start": load_start,
        "not_run": not_run,
    }
    # The image jobs that a loader asked for runs (the shards job has loaders of its own).
    image_jobs = [j for j in args.jobs if j in JOBS and any(j in lo.jobs for lo in runnable)]
    plan = [
        (rnd, lo, job)
        for rnd in range(args.rounds)
        for job in image_jobs
        for lo in [lo for lo in runnable if job in lo.jobs]
    ]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        job: {lo.key: [] for lo in runnable if job in lo.jobs} for job in image_jobs
    }
    workdir = tempfile.mkdtemp(
        prefix="ferrofeed-compare-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    )
    try:
        if image_jobs:
            t = time.perf_counter()
            image_dir = os.path.join(workdir, "images")
            os.makedirs(image_dir)
            files, info = make_jpegs(image_dir, args.n, args.seed, varied=True)
            results["data"] = {**info, "n": args.n, "made_s": round(time.perf_counter() - t, 1)}
            kib = info["mean_file_bytes"] / 1024
            print(
                f"{args.n} JPEGs from scikit-image's photos, {kib:.0f} KiB on average: "
                f"{info['sizes']}; load average {load_start}",
                flush=True,
            )
            base = {
                "files": files,
                "root": image_dir,
                "seed": args.seed,
                "epochs": args.epochs,
                "import_torch": not args.no_torch_import,
            }
            if "shards" in image_jobs:
                base["shards"] = pack_shards(files, workdir, runnable, args)
                results["data"]["shards"] = {
                    k: v for k, v in base["shards"].items() if k not in ("tar", "parquet")
                }
            bar = tqdm(total=len(plan), unit="run", disable=args.no_progress, dynamic_ncols=True)
            for rnd in range(args.rounds):
                # Rotate the order each round so that no loader always follows the same one.
                order = [(lo, job) for r, lo, job in plan if r == rnd]
                shift = rnd % max(len(order), 1)
                for lo, job in order[shift:] + order[:shift]:
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
    results["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
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
    files: list[tuple[str, int]], workdir: str, runnable: list[Loader], args: argparse.Namespace
) -> dict[str, Any]:
    """The shards job's data: the JPEGs packed as tar shards and, where a loader reads
    them, Parquet shards; the Arrow cache of Hugging Face's map-style dataset made once.

    Returns the spec's ``shards``: the shard paths, the shuffle window and what was made.
    """
    t = time.perf_counter()
    keys = {lo.key for lo in runnable if "shards" in lo.jobs}
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


def report(results: dict[str, Any], out_dir: Path, name: str = "compare") -> None:
    """Write ``{name}.md`` and the plots into ``out_dir``; print the tables."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md = markdown(results)
    (out_dir / f"{name}.md").write_text(md + "\n")
    written = plots(results, out_dir, name)
    print()
    print(md)
    print(f"results: {out_dir / f'{name}.json'}, {out_dir / f'{name}.md'}")
    print("plots: " + ", ".join(str(p) for p in written))


if __name__ == "__main__":
    sys.exit(main())
