"""The loaders of benches/compare.py, each as its child interpreter builds it.

`LOADERS` lists every configuration (`Loader`: its key, its label in the tables, its family,
its workers or threads, its jobs, what must import for it to run); `build` makes one of them
for a job in the child that measures it; `available` says whether one can run here. The
PyTorch-based builders (`torch_loader`, `webdataset_loader`) and the torchvision job
(`TorchvisionJob`) serve benches/scaling.py, benches/remote_compare.py and
benches/loader_workers.py too. The module docstring of benches/compare.py says what each
loader runs and how it is measured.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import random
import re
import subprocess
import sys
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from _common import (
    CROP,
    SHORT,
    FileDataset,
    PillowExact,
    PillowTrain,
    native_op,
    native_train_decode,
    rrc_params,
    shutdown_workers,
)

BATCH = 32
# The jobs over image files, and the training job over the same images packed as shards.
FOLDER_JOBS = ("exact", "train")
JOBS = (*FOLDER_JOBS, "shards")


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
