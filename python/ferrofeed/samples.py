"""Deterministic sample data made at run time, for the demo, examples and benchmarks."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

__all__ = ["coco_like_annotations"]


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
