"""CPU per image of ``decode_image`` with and without the crop-window decode.

Data: 60 ImageNet-like JPEGs (500x375, quality 75-95, every tenth progressive, 4:2:0) cut
from scikit-image's photos (a random 60-100% crop of the largest 4:3 window, Lanczos).
Jobs: the training transform (``size=224, crop="random"``, a new crop per image and pass,
flip on odd seeds) and the evaluation one (``resize_shorter=256, crop=224``). For each job
the two settings (``crop_decode=True``, the default, and ``False``) alternate over
``--reps`` passes over the set (order swapped every pass); each pass's CPU time
(``time.process_time``, one thread) is divided by the images, and the medians are printed
with their ratio. CPU time rather than wall time, so that other work on a shared machine
changes the figures less.

With ``--format png`` the same images go in as PNGs (Pillow, compression level 6): the
window of a PNG is its rows down to the crop's last, and only its columns are kept.

Run: ``python benches/crop_decode_ab.py [--reps 9] [--format png]``.
"""

from __future__ import annotations

import argparse
import io
import random
import statistics
import time
from collections.abc import Callable

import ferrofeed.io as fio
import numpy as np
import skimage.data
from PIL import Image

PHOTOS = [
    "astronaut",
    "coffee",
    "chelsea",
    "rocket",
    "hubble_deep_field",
    "retina",
    "immunohistochemistry",
]


def make_jpegs(n: int, seed: int = 0) -> list[bytes]:
    """``n`` 500x375 JPEGs cut from the photos (quality 75-95, every tenth progressive)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        arr = np.asarray(getattr(skimage.data, PHOTOS[i % len(PHOTOS)])())
        im = Image.fromarray(arr).convert("RGB")
        w, h = im.size
        side = min(w, h * 4 / 3) * rng.uniform(0.6, 1.0)
        cw, ch = int(side), int(side * 3 / 4)
        x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
        im = im.crop((x, y, x + cw, y + ch)).resize((500, 375), Image.Resampling.LANCZOS)
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=rng.randint(75, 95), progressive=i % 10 == 0)
        out.append(buf.getvalue())
    return out


def as_png(jpeg: bytes) -> bytes:
    """The pixels of ``jpeg`` as a PNG (Pillow, compression level 6)."""
    buf = io.BytesIO()
    Image.open(io.BytesIO(jpeg)).convert("RGB").save(buf, "PNG", compress_level=6)
    return buf.getvalue()


def train(data: bytes, seed: int, crop_decode: bool) -> object:
    return fio.decode_image(
        data, size=224, crop="random", seed=seed, flip=bool(seed & 1), crop_decode=crop_decode
    )


def evaluate(data: bytes, seed: int, crop_decode: bool) -> object:
    return fio.decode_image(data, resize_shorter=256, crop=224, crop_decode=crop_decode)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=9, help="passes per setting")
    parser.add_argument("--format", choices=["jpeg", "png"], default="jpeg")
    args = parser.parse_args()
    files = make_jpegs(60)
    if args.format == "png":
        files = [as_png(f) for f in files]
    jobs: dict[str, Callable[[bytes, int, bool], object]] = {
        "train (RandomResizedCrop 224 + flip)": train,
        "exact 224 (Resize 256, CenterCrop 224)": evaluate,
    }
    for name, job in jobs.items():
        cpu: dict[bool, list[float]] = {True: [], False: []}
        for r in range(args.reps):
            for crop_decode in (True, False) if r % 2 == 0 else (False, True):
                t = time.process_time()
                for k, data in enumerate(files):
                    job(data, r * 1000 + k, crop_decode)
                cpu[crop_decode].append((time.process_time() - t) / len(files) * 1e3)
        on, off = statistics.median(cpu[True]), statistics.median(cpu[False])
        print(
            f"{name}: crop_decode {on:.3f} ms CPU/image, full decode {off:.3f} ms; "
            f"ratio {on / off:.2f}"
        )


if __name__ == "__main__":
    main()
