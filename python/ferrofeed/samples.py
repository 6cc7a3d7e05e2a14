"""Deterministic sample data made at run time, for the demo, examples and benchmarks."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from . import _core

__all__ = ["coco_like_annotations", "image_folder", "synthetic_jpeg"]


def coco_like_annotations(n: int, seed: int = 0) -> Iterator[dict[str, Any]]:
    """Yield ``n`` deterministic annotation dicts shaped like COCO's ``instances`` entries.

    Example:
        >>> next(coco_like_annotations(1))["id"]
        0
    """
    rng = random.Random(seed)
    for i in range(n):
        x, y = rng.uniform(0, 600), rng.uniform(0, 400)
        w, h = rng.uniform(4, 200), rng.uniform(4, 200)
        poly = [round(rng.uniform(0, 640), 2) for _ in range(2 * rng.randint(6, 24))]
        yield {
            "id": i,
            "image_id": rng.randrange(118_287),
            "category_id": rng.randint(1, 90),
            "bbox": [round(x, 2), round(y, 2), round(w, 2), round(h, 2)],
            "area": round(w * h, 2),
            "iscrowd": 0,
            "segmentation": [poly],
        }


def synthetic_jpeg(width: int, height: int, *, seed: int, quality: int = 85) -> bytes:
    """Return a photo-like JPEG (4:2:0) made at run time, deterministic in ``seed``.

    Gradients, soft-edged shapes, a multi-octave texture and sensor-like noise, encoded by
    libjpeg-turbo; made without the GIL, so threads make several at once. Such images
    compress somewhat better than real photos.

    Example:
        >>> data = synthetic_jpeg(64, 48, seed=1)
        >>> data[:2] == bytes([0xFF, 0xD8]) and data == synthetic_jpeg(64, 48, seed=1)
        True
    """
    return _core._synthetic_jpeg(width, height, seed=seed, quality=quality)


def image_folder(
    root: str | os.PathLike[str],
    n: int,
    *,
    classes: int = 4,
    size: tuple[int, int] = (500, 375),
    quality: tuple[int, int] = (75, 95),
    seed: int = 0,
    threads: int | None = None,
) -> list[tuple[str, int]]:
    """Write ``n`` ImageNet-like JPEGs into ``root``, one subfolder per class.

    Image ``i`` goes to ``root/class_<i % classes>/<i>.jpg``; its size is ``size`` (width,
    height) with each side varied by up to 20% and, one time in four, portrait rather than
    landscape; its quality is drawn from ``quality``. Everything follows from ``seed``.
    Returns the ``(path, label)`` pairs in the order written.

    Example:
        >>> import tempfile
        >>> files = image_folder(tempfile.mkdtemp(), 4, classes=2, size=(64, 48))
        >>> [label for _, label in files]
        [0, 1, 0, 1]
    """
    if n < 0 or classes < 1:
        raise ValueError(f"n must be >= 0 and classes >= 1, not n={n}, classes={classes}")
    root = os.fspath(root)
    rng = random.Random(seed)
    plan = []
    for i in range(n):
        w = max(1, round(size[0] * rng.uniform(0.8, 1.0)))
        h = max(1, round(size[1] * rng.uniform(0.8, 1.0)))
        if rng.random() < 0.25:
            w, h = h, w
        label = i % classes
        path = os.path.join(root, f"class_{label}", f"{i:06d}.jpg")
        plan.append((path, label, w, h, rng.randint(*quality), rng.getrandbits(63)))
    for label in range(classes):
        os.makedirs(os.path.join(root, f"class_{label}"), exist_ok=True)

    def write(job: tuple[str, int, int, int, int, int]) -> None:
        path, _, w, h, q, image_seed = job
        data = synthetic_jpeg(w, h, seed=image_seed, quality=q)
        with open(path, "wb") as f:
            f.write(data)

    with ThreadPoolExecutor(threads or os.cpu_count() or 1) as pool:
        list(pool.map(write, plan))
    return [(path, label) for path, label, *_ in plan]
