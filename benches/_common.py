"""What the Python benchmarks share: the JPEGs made from real photos (and packed as tar or
Parquet shards) and the Pillow transforms every loader runs. Beside it: `_runs` (one
configuration in a fresh interpreter, and what it costs), `_rounds` (the rounds, their
medians and ratios, the tables) and `bench_machine` (the machine).

The scripts in this folder import it as a sibling module (``python benches/NAME.py`` puts
this folder first on ``sys.path``). Importing it imports neither torch nor ferrofeed, so
that a child interpreter measuring one loader holds only what that loader needs.
"""

from __future__ import annotations

import io
import json
import math
import os
import random
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from bench_machine import loadavg
from PIL import Image, ImageEnhance

# scikit-image's bundled photos (camera is greyscale, saved as RGB).
PHOTOS = [
    "astronaut",
    "coffee",
    "chelsea",
    "rocket",
    "immunohistochemistry",
    "hubble_deep_field",
    "retina",
    "camera",
]


# --- data ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JpegPlan:
    """One JPEG to write: which photo, which crop of it, and how to encode it."""

    path: str
    label: int
    size: tuple[int, int]  # width, height
    box: tuple[int, int, int, int]  # the crop of the source photo, resized to ``size``
    mirror: bool
    quality: int
    # Only in the varied set: colour jitter factors (brightness, contrast, saturation),
    # greyscale, progressive, chroma subsampling (Pillow's 0 = 4:4:4, 1 = 4:2:2, 2 = 4:2:0).
    jitter: tuple[float, float, float] | None = None
    grey: bool = False
    progressive: bool = False
    subsampling: int = 2


#: A folder of the photos as ``NAME.png`` (``benches/device_pack.py`` writes it), read in
#: place of scikit-image's: a lent GPU machine has no network to install scikit-image.
PHOTOS_ENV = "FERROFEED_BENCH_PHOTOS"


def _photos() -> list[Image.Image]:
    folder = os.environ.get(PHOTOS_ENV)
    if folder:
        return [Image.open(Path(folder) / f"{name}.png").convert("RGB") for name in PHOTOS]
    import skimage.data

    return [Image.fromarray(getattr(skimage.data, name)()).convert("RGB") for name in PHOTOS]


def save_photos(folder: str | Path) -> list[Path]:
    """Write scikit-image's photos into ``folder`` as ``NAME.png`` (lossless); return them."""
    import skimage.data

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in PHOTOS:
        path = out / f"{name}.png"
        Image.fromarray(getattr(skimage.data, name)()).save(path)
        paths.append(path)
    return paths


def _varied_size(rng: random.Random) -> tuple[int, int]:
    """ImageNet's mix, roughly: mostly 500x375 or 500x333, some portrait, some large."""
    r = rng.random()
    if r < 0.55:
        return 500, 375
    if r < 0.70:
        return 500, 333
    if r < 0.85:
        return 375, 500
    long_side = rng.randint(600, 1000)  # the large ones, up to 1000 px
    short_side = round(long_side * rng.choice((0.75, 2 / 3)))
    return (long_side, short_side) if rng.random() < 0.7 else (short_side, long_side)


def plan_jpegs(
    root: str, n: int, seed: int, *, varied: bool, folders: bool = False
) -> list[JpegPlan]:
    """Decide, from ``seed`` alone, what each of ``n`` JPEGs will be (see `make_jpegs`)."""
    sizes = [im.size for im in _photos()]
    rng = random.Random(seed)
    plans = []
    for i in range(n):
        if varied:
            w, h = _varied_size(rng)
        else:
            r = rng.random()
            w, h = (500, 375) if r < 0.7 else (375, 500) if r < 0.85 else (500, 333)
        label = i % len(sizes)
        sw, sh = sizes[label]
        scale = min(sw / w, sh / h) * rng.uniform(0.5, 1.0)
        cw, ch = round(w * scale), round(h * scale)
        left, top = rng.randint(0, sw - cw), rng.randint(0, sh - ch)
        mirror = rng.random() < 0.5
        quality = rng.randint(75, 95)
        extra: dict[str, Any] = {}
        if varied:
            extra["jitter"] = (rng.uniform(0.9, 1.1), rng.uniform(0.9, 1.1), rng.uniform(0.9, 1.1))
            extra["grey"] = rng.random() < 0.05
            extra["progressive"] = rng.random() < 0.10
            s = rng.random()
            extra["subsampling"] = 2 if s < 0.85 else 0 if s < 0.95 else 1
        name = f"{i:05d}.jpg"
        path = os.path.join(root, f"class_{label}", name) if folders else os.path.join(root, name)
        plans.append(
            JpegPlan(
                path, label, (w, h), (left, top, left + cw, top + ch), mirror, quality, **extra
            )
        )
    return plans


def _write(plan: JpegPlan, src: Image.Image) -> int:
    im = src.resize(plan.size, Image.Resampling.LANCZOS, box=plan.box)
    if plan.mirror:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    if plan.jitter is not None:
        b, c, s = plan.jitter
        im = ImageEnhance.Brightness(im).enhance(b)
        im = ImageEnhance.Contrast(im).enhance(c)
        im = ImageEnhance.Color(im).enhance(s)
    if plan.grey:
        im = im.convert("L")
    os.makedirs(os.path.dirname(plan.path), exist_ok=True)
    im.save(
        plan.path,
        quality=plan.quality,
        progressive=plan.progressive,
        subsampling=plan.subsampling,
    )
    return os.path.getsize(plan.path)


def make_jpegs(
    root: str,
    n: int,
    seed: int,
    *,
    varied: bool = False,
    folders: bool = False,
    threads: int | None = None,
) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """Write ``n`` JPEGs cut from scikit-image's photos into ``root``; return (path, label)s.

    Each is a random crop (50 to 100% of the largest crop of its aspect) of one of the
    photos (its label), randomly mirrored, resized with Lanczos, saved by Pillow with
    quality 75 to 95. Plain set (``varied=False``): 70% 500x375, 15% 375x500, 15% 500x333,
    all 4:2:0 baseline RGB. Varied set: 55% 500x375, 15% 500x333, 15% 375x500, 15% larger
    (long side 600 to 1000 px, 70% of them landscape); mild colour jitter (brightness,
    contrast and saturation x0.9 to x1.1); 5% greyscale, 10% progressive; subsampling 85%
    4:2:0, 10% 4:4:4, 5% 4:2:2. Everything follows from ``seed``; the files are written on
    ``threads`` threads (Pillow's resize and encoder release the GIL). With ``folders``
    each goes into a subfolder ``class_<label>`` of ``root`` (an image folder, whose sorted
    class names give the same labels), else straight into ``root``.
    """
    plans = plan_jpegs(root, n, seed, varied=varied, folders=folders)
    photos = _photos()
    with ThreadPoolExecutor(threads or os.cpu_count() or 1) as pool:
        sizes_on_disk = list(pool.map(lambda p: _write(p, photos[p.label]), plans))
    counts: dict[str, int] = {}
    for p in plans:
        kind = "large" if varied and max(p.size) > 500 else f"{p.size[0]}x{p.size[1]}"
        counts[kind] = counts.get(kind, 0) + 1
    info: dict[str, Any] = {
        "sizes": counts,
        "mean_file_bytes": round(sum(sizes_on_disk) / max(n, 1)),
    }
    if varied:
        info["grey"] = sum(p.grey for p in plans)
        info["progressive"] = sum(p.progressive for p in plans)
        info["subsampling"] = {
            name: sum(p.subsampling == k for p in plans)
            for k, name in ((2, "4:2:0"), (1, "4:2:2"), (0, "4:4:4"))
        }
    return [(p.path, p.label) for p in plans], info


def pack_tar_shards(files: list[tuple[str, int]], root: str, per_shard: int) -> list[str]:
    """Pack ``files`` (path, label), in order, as WebDataset tar shards of ``per_shard`` samples.

    Sample ``i`` is ``{i:06d}.jpg`` (the file's bytes) and ``{i:06d}.cls`` (its label as
    text), as webdataset's writers store them; shard ``k`` is ``root/train-{k:06d}.tar``.
    Written with Python's ``tarfile`` (POSIX ustar headers).
    """
    os.makedirs(root, exist_ok=True)
    paths = []
    for k, start in enumerate(range(0, len(files), per_shard)):
        path = os.path.join(root, f"train-{k:06d}.tar")
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i, (src, label) in enumerate(files[start : start + per_shard], start):
                tar.add(src, arcname=f"{i:06d}.jpg")
                info = tarfile.TarInfo(f"{i:06d}.cls")
                text = str(label).encode()
                info.size = len(text)
                tar.addfile(info, io.BytesIO(text))
        paths.append(path)
    return paths


# The Hugging Face features of `pack_parquet_shards`' files, in the schema metadata where
# `datasets` writes and reads them: an ``Image`` column and an int64 label.
HF_FEATURES = {"image": {"_type": "Image"}, "label": {"dtype": "int64", "_type": "Value"}}


def pack_parquet_shards(
    files: list[tuple[str, int]], root: str, per_shard: int, row_group: int = 100
) -> list[str]:
    """Pack ``files`` as Parquet shards in the Hugging Face image layout (needs pyarrow).

    Columns: ``image``, a struct of the file's ``bytes`` and its ``path`` (the base name),
    and ``label`` (int64); ``per_shard`` rows a file (``root/train-{k:05d}.parquet``),
    ``row_group`` rows a row group (100: what `datasets` writes for image datasets), the
    features in the schema's ``huggingface`` metadata, so that `datasets` reads the column
    as an ``Image`` feature.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(root, exist_ok=True)
    schema = pa.schema(
        [
            ("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
            ("label", pa.int64()),
        ],
        metadata={"huggingface": json.dumps({"info": {"features": HF_FEATURES}})},
    )
    paths = []
    for k, start in enumerate(range(0, len(files), per_shard)):
        part = files[start : start + per_shard]
        images = [{"bytes": Path(p).read_bytes(), "path": os.path.basename(p)} for p, _ in part]
        table = pa.table({"image": images, "label": [label for _, label in part]}, schema=schema)
        path = os.path.join(root, f"train-{k:05d}.parquet")
        pq.write_table(table, path, row_group_size=row_group)
        paths.append(path)
    return paths


def make_images(
    workdir: str, n: int, seed: int, *, folders: bool = False, per_shard: int | None = None
) -> tuple[list[tuple[str, int]], list[str], dict[str, Any]]:
    """A run's images: ``n`` JPEGs of the varied set (`make_jpegs`) in ``workdir/images`` (an
    image folder with ``folders``) and, with ``per_shard``, the same packed as tar shards in
    ``workdir/tar``; a line says what was made.

    Returns the files (path, label), the shards, and what the results say of them: the
    figures of `make_jpegs`, ``n``, the shards' ``per_shard``, number (``shards``) and mean
    size (``mean_tar_bytes``), and the seconds it all took (``made_s``).
    """
    t = time.perf_counter()
    image_dir = os.path.join(workdir, "images")
    os.makedirs(image_dir, exist_ok=True)
    files, info = make_jpegs(image_dir, n, seed, varied=True, folders=folders)
    data: dict[str, Any] = {**info, "n": n}
    shards = pack_tar_shards(files, os.path.join(workdir, "tar"), per_shard) if per_shard else []
    if shards:
        mean = round(sum(os.path.getsize(p) for p in shards) / len(shards))
        data.update(per_shard=per_shard, shards=len(shards), mean_tar_bytes=mean)
    data["made_s"] = round(time.perf_counter() - t, 1)
    packed = (
        f", in {len(shards)} tar shards of {per_shard} ({data['mean_tar_bytes'] / 1e6:.1f} MB "
        "each) too"
        if shards
        else ""
    )
    print(
        f"{n} JPEGs from scikit-image's photos, {info['mean_file_bytes'] / 1024:.0f} KiB on "
        f"average: {info['sizes']}{packed}; made in {data['made_s']} s; load average "
        f"{loadavg()}",
        flush=True,
    )
    return files, shards, data


def scratch_dir(prefix: str) -> str:
    """A new temporary folder for a run's data, on /dev/shm (in memory) where there is one."""
    return tempfile.mkdtemp(prefix=prefix, dir="/dev/shm" if os.path.isdir("/dev/shm") else None)


# --- the transforms (module level: the same code in every loader and worker) ------------------

SHORT, CROP = 256, 224


def resize_shorter_box(w: int, h: int, short: int = SHORT) -> tuple[int, int]:
    """torchvision's ``Resize(int)``: the shorter side to ``short``, the other truncated."""
    return (short, int(short * h / w)) if w <= h else (int(short * w / h), short)


def rrc_params(w: int, h: int) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params`` (scale 0.08-1, ratio 3/4-4/3): a box."""
    area = w * h
    log_lo, log_hi = math.log(3 / 4), math.log(4 / 3)
    for _ in range(10):
        target = area * random.uniform(0.08, 1.0)
        aspect = math.exp(random.uniform(log_lo, log_hi))
        cw = round(math.sqrt(target * aspect))
        ch = round(math.sqrt(target / aspect))
        if 0 < cw <= w and 0 < ch <= h:
            top = random.randint(0, h - ch)
            left = random.randint(0, w - cw)
            return left, top, left + cw, top + ch
    ratio = w / h  # the fallback: a center crop
    if ratio < 3 / 4:
        cw, ch = w, round(w / (3 / 4))
    elif ratio > 4 / 3:
        cw, ch = round(h * (4 / 3)), h
    else:
        cw, ch = w, h
    top, left = (h - ch) // 2, (w - cw) // 2
    return left, top, left + cw, top + ch


class FileDataset:
    """A map-style dataset over ``(path, label)`` pairs; subclasses write ``__getitem__``."""

    def __init__(self, files: list[tuple[str, int]]) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)


class PillowDataset(FileDataset):
    """A `FileDataset` that opens each file with Pillow, as RGB, and runs ``apply`` on it.

    A map-style dataset of ``(uint8 HWC array, label)`` (PyTorch's DataLoader and
    ferrofeed's take it as it is).
    """

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        path, label = self.files[i]
        with Image.open(path) as im:
            return self.apply(im.convert("RGB")), label

    def apply(self, im: Image.Image) -> np.ndarray:
        """The transform alone, on an RGB image."""
        raise NotImplementedError


def native_train_decode(path: str) -> Any:
    """``ferrofeed.io.decode_image`` doing the training job (RandomResizedCrop 224 and a
    random flip), its parameters drawn in Python from `random`: a DLPack tensor."""
    import ferrofeed.io

    return ferrofeed.io.decode_image(
        path, size=CROP, crop="random", seed=random.getrandbits(63), flip=random.random() < 0.5
    )


class PillowExact(PillowDataset):
    """torchvision's ``Resize(256)`` + ``CenterCrop(224)`` on PIL images, written out."""

    def __init__(self, files: list[tuple[str, int]], short: int = SHORT, crop: int = CROP) -> None:
        super().__init__(files)
        self.short, self.crop = short, crop

    def apply(self, im: Image.Image) -> np.ndarray:
        """The transform alone, on an RGB image."""
        im = im.resize(resize_shorter_box(*im.size, self.short), Image.Resampling.BILINEAR)
        w, h = im.size
        left = round((w - self.crop) / 2)
        top = round((h - self.crop) / 2)
        im = im.crop((left, top, left + self.crop, top + self.crop))
        return np.array(im)  # a writable copy, as torchvision's PILToTensor


class PillowTrain(PillowDataset):
    """torchvision's ``RandomResizedCrop(224)`` + ``RandomHorizontalFlip()`` on PIL images.

    The crop and the resize are one ``Image.resize(..., BILINEAR, box=...)``; uint8 HWC out.
    """

    def __init__(self, files: list[tuple[str, int]], crop: int = CROP) -> None:
        super().__init__(files)
        self.crop = crop

    def apply(self, im: Image.Image) -> np.ndarray:
        """The transform alone, on an RGB image."""
        box = rrc_params(*im.size)
        im = im.resize((self.crop, self.crop), Image.Resampling.BILINEAR, box=box)
        if random.random() < 0.5:
            im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return np.array(im)


def native_op(job: str) -> Any:
    """ferrofeed's native chain for ``job``: ``exact`` (Resize 256, CenterCrop 224) or
    ``train`` (RandomResizedCrop 224 + random horizontal flip; the DataLoader's seed seeds
    each sample's crop and flip)."""
    from ferrofeed import ops

    if job == "exact":
        return ops.decode_image(resize_shorter=SHORT, crop=CROP)
    return ops.decode_image(size=CROP, crop="random", flip="random")


def shutdown_workers(loader: Any) -> None:
    """End a loader's worker processes: ferrofeed's, or PyTorch's persistent ones."""
    stop = getattr(loader, "shutdown_workers", None)  # ferrofeed
    if stop is not None:
        stop()
    iterator = getattr(loader, "_iterator", None)  # PyTorch's persistent workers
    if iterator is not None:
        iterator._shutdown_workers()
