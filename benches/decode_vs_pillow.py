"""JPEG decode + Resize(256) + CenterCrop(224): ferrofeed vs Pillow and SPDL (when it loads).

Run: python benches/decode_vs_pillow.py [--n 200] [--repeats 5] [--batch 32] [--quick]

Side by side in one run, on the same machine and the same files:

* Data: ``--n`` JPEGs written by Pillow (quality 75 to 95, its default 4:2:0 subsampling),
  about 500x375 like ImageNet (70% 500x375, 15% 375x500, 15% 500x333), into a temporary
  directory on ``/dev/shm`` when there is one. ``--source generated`` (the default): photo-like
  content made here (a gradient, soft-edged shapes, a multi-octave texture, sensor noise); it
  compresses better than most real photos (the mean file size is printed). ``--source
  skimage``: random crops of the six sample photos bundled with scikit-image, resized to the
  target size.
* Per core (one thread), every path ends in a ``(224, 224, 3)`` uint8 NumPy array per image,
  as torchvision's ``Resize(256)`` + ``CenterCrop(224)`` would produce:

  - Pillow: ``Image.open(path).convert("RGB")``, ``resize`` (shorter side 256, the longer
    truncated as torchvision does) with ``Image.BILINEAR``, ``crop`` (torchvision's rounding),
    ``np.asarray``; once without and once with ``draft("RGB", size after the resize)``,
    Pillow's own DCT scaling (1/2, 1/4 or 1/8 only);
  - ferrofeed: ``np.from_dlpack(ferrofeed.io.decode_image(path, resize_shorter=256,
    crop=(224, 224)))``, with DCT scaling (the default) and without; and ``load_images``
    with ``threads=1`` on batches of ``--batch`` paths;
  - SPDL's ``spdl.io.load_image_batch`` on the same batches, with FFmpeg filters doing the
    same Resize(256) + CenterCrop(224) (bilinear ``scale`` of the shorter side to 256, centre
    crops), when it works: it needs FFmpeg's shared libraries (``make bench-deps``); 0.8
    decodes a batch serially on the calling thread, with FFmpeg's JPEG decoder. When it does
    not work, the reason is printed and saved.
  - For every per-core path, the process CPU time over the wall time is printed: about 1.0
    when the path keeps to one core.

* Batch path (``--threads``, default 2), batches of ``--batch`` paths, each batch ending in one
  ``(B, 224, 224, 3)`` array: ferrofeed's ``load_images(paths, size=224, resize_shorter=256,
  crop=(224, 224), threads=...)``; Pillow (the per-image code above) on a
  ``ThreadPoolExecutor`` of the same size, then ``np.stack``.

Each figure is the median (and the best) over ``--repeats`` passes over all the files, with
the order of the paths rotated from one pass to the next, after one warm-up pass each.
Results go to stdout and to bench-results/decode_vs_pillow.json.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ferrofeed
import ferrofeed.io
import numpy as np
import PIL
from bench_machine import cpu_model
from PIL import Image, features

RESIZE = 256
CROP = 224


# --- data ---------------------------------------------------------------------------------


def value_noise(rng: np.random.Generator, w: int, h: int, cell: int) -> np.ndarray:
    """Gaussian values on a grid of ``cell`` pixels, bilinearly interpolated: one octave."""
    g = rng.standard_normal((h // cell + 2, w // cell + 2)).astype(np.float32)
    ys = np.arange(h, dtype=np.float32) / cell
    xs = np.arange(w, dtype=np.float32) / cell
    y0, x0 = ys.astype(np.intp), xs.astype(np.intp)
    fy, fx = (ys - y0)[:, None], (xs - x0)[None, :]
    top = g[y0][:, x0] * (1 - fx) + g[y0][:, x0 + 1] * fx
    bottom = g[y0 + 1][:, x0] * (1 - fx) + g[y0 + 1][:, x0 + 1] * fx
    return top * (1 - fy) + bottom * fy


def photo(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    """Photo-like RGB pixels, ``(h, w, 3)`` uint8.

    A two-colour gradient, 60 soft-edged ellipses and rectangles (8 large, 52 small) with
    some shading, a multi-octave (1/f-like) texture that is strong in some regions and absent
    in others, a little chroma texture, and Gaussian sensor noise.
    """
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    top, bottom, side = rng.uniform(0, 255, (3, 3)).astype(np.float32)
    t = (y / h)[..., None]
    s = (x / w * 0.4)[..., None]
    img = (top * (1 - t) + bottom * t) * (1 - s) + side * s
    for k in range(60):
        lo, hi = (0.08, 0.3) if k < 8 else (0.01, 0.08)
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        rx, ry = rng.uniform(lo, hi) * w, rng.uniform(lo, hi) * h
        ellipse = rng.random() < 0.6
        edge = rng.uniform(0.7, 3.0)
        alpha = rng.uniform(0.5, 1.0)
        color = rng.uniform(0, 255, 3).astype(np.float32)
        # Only the shape's bounding box (plus the soft edge) is touched.
        y1, y2 = max(int(cy - ry - 4), 0), min(int(cy + ry + 5), h)
        x1, x2 = max(int(cx - rx - 4), 0), min(int(cx + rx + 5), w)
        if y1 >= y2 or x1 >= x2:
            continue
        dx = (x[y1:y2, x1:x2] - cx) / rx
        dy = (y[y1:y2, x1:x2] - cy) / ry
        if ellipse:
            d = (np.sqrt(dx * dx + dy * dy) - 1) * min(rx, ry)
        else:
            d = (np.maximum(np.abs(dx), np.abs(dy)) - 1) * min(rx, ry)
        cover = (np.clip(0.5 - d / edge, 0, 1) * alpha)[..., None]
        shade = (1 - 0.25 * np.clip(dy * 0.5 + 0.5, 0, 1))[..., None]
        box = img[y1:y2, x1:x2]
        img[y1:y2, x1:x2] = box * (1 - cover) + color * shade * cover
    mask = np.clip(value_noise(rng, w, h, 96) * 0.8 + 0.5, 0, 1)
    octaves = [(32, 12.0), (16, 10.0), (8, 9.0), (4, 8.0), (2, 7.0)]
    lum = sum(a * value_noise(rng, w, h, c) for c, a in octaves)
    img += (3.0 * mask * lum)[..., None]
    for ch in range(3):
        img[..., ch] += 8.0 * mask * sum(value_noise(rng, w, h, c) for c in (8, 4, 2))
    img += rng.normal(0, 3, img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


REAL_PHOTOS = ["astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "retina"]


def real_photo(rng: np.random.Generator, index: int, w: int, h: int) -> np.ndarray:
    """A ``w`` x ``h`` view of one of scikit-image's bundled photos, in turn.

    A random crop of the photo's aspect ``w:h`` (60 to 100% of the largest that fits),
    resized with Lanczos, as an image dataset's preprocessing might have done.
    """
    import skimage.data

    src = Image.fromarray(getattr(skimage.data, REAL_PHOTOS[index % len(REAL_PHOTOS)])())
    sw, sh = src.size
    scale = min(sw / w, sh / h) * rng.uniform(0.6, 1.0)
    cw, ch = round(w * scale), round(h * scale)
    left, top = int(rng.integers(0, sw - cw + 1)), int(rng.integers(0, sh - ch + 1))
    box = (left, top, left + cw, top + ch)
    return np.asarray(src.convert("RGB").resize((w, h), Image.Resampling.LANCZOS, box=box))


def make_jpegs(
    directory: Path, n: int, source: str = "generated", seed: int = 0
) -> tuple[list[str], dict[str, Any]]:
    rng = np.random.default_rng(seed)
    paths = []
    sizes: dict[str, int] = {}
    total = 0
    for i in range(n):
        r = rng.random()
        w, h = (500, 375) if r < 0.7 else (375, 500) if r < 0.85 else (500, 333)
        quality = int(rng.integers(75, 96))
        path = directory / f"img{i:04d}_q{quality}.jpg"
        pixels = photo(rng, w, h) if source == "generated" else real_photo(rng, i, w, h)
        Image.fromarray(pixels).save(path, quality=quality)
        paths.append(str(path))
        sizes[f"{w}x{h}"] = sizes.get(f"{w}x{h}", 0) + 1
        total += path.stat().st_size
    return paths, {"sizes": sizes, "mean_file_bytes": total / max(n, 1)}


# --- the paths measured -------------------------------------------------------------------


def resized_size(w: int, h: int) -> tuple[int, int]:
    """torchvision's ``Resize(256)``: the shorter side to 256, the longer truncated."""
    if w <= h:
        return RESIZE, int(RESIZE * h / w)
    return int(RESIZE * w / h), RESIZE


def pillow_one(path: str, draft: bool) -> np.ndarray:
    with Image.open(path) as im:
        if draft:
            im.draft("RGB", resized_size(*im.size))
        rgb = im.convert("RGB")
    nw, nh = resized_size(*rgb.size)
    rgb = rgb.resize((nw, nh), Image.BILINEAR)
    left = round((nw - CROP) / 2.0)
    top = round((nh - CROP) / 2.0)
    return np.asarray(rgb.crop((left, top, left + CROP, top + CROP)))


def draft_reduces(path: str) -> bool:
    """Whether ``draft()`` makes Pillow decode this file at a reduced scale."""
    with Image.open(path) as im:
        before = im.size
        im.draft("RGB", resized_size(*before))
        return im.size != before


def ferrofeed_one(path: str, dct: bool) -> np.ndarray:
    t = ferrofeed.io.decode_image(path, resize_shorter=RESIZE, crop=(CROP, CROP), dct_scaling=dct)
    return np.from_dlpack(t)


def batches(paths: Sequence[str], size: int) -> list[Sequence[str]]:
    return [paths[i : i + size] for i in range(0, len(paths), size)]


def ferrofeed_batch(paths: Sequence[str], threads: int) -> np.ndarray:
    t = ferrofeed.io.load_images(
        paths, size=CROP, resize_shorter=RESIZE, crop=(CROP, CROP), threads=threads
    )
    return np.from_dlpack(t)


def pillow_batch(pool: ThreadPoolExecutor, paths: Sequence[str]) -> np.ndarray:
    return np.stack(list(pool.map(lambda p: pillow_one(p, False), paths)))


def spdl_filter() -> str:
    """FFmpeg filters for torchvision's Resize(256) + CenterCrop(224), bilinear.

    SPDL's own default for ``width``/``height`` is a letterbox (bicubic fit, black padding);
    ``scale_mode="crop"`` scales the shorter side to 256 and crops the centre, then a 224 crop.
    """
    import spdl.io

    desc = spdl.io.get_video_filter_desc(
        scale_width=RESIZE,
        scale_height=RESIZE,
        scale_algo="bilinear",
        scale_mode="crop",
        crop_width=CROP,
        crop_height=CROP,
        pix_fmt="rgb24",
    )
    assert desc is not None
    return desc


def spdl_batch(paths: Sequence[str]) -> np.ndarray:
    import spdl.io

    buf = spdl.io.load_image_batch(paths, width=None, height=None, filter_desc=spdl_filter())
    return np.asarray(spdl.io.to_numpy(buf))


def spdl_status(path: str) -> tuple[bool, str]:
    """Whether ``spdl.io.load_image_batch`` works here, and what happened."""
    try:
        import spdl.io  # noqa: F401
    except ImportError as e:
        return False, f"import spdl.io failed: {e}"
    try:
        version = importlib.metadata.version("spdl_io")
    except importlib.metadata.PackageNotFoundError:
        version = "(version unknown)"
    # load_image_batch logs why an image failed and raises a bare RuntimeError: keep the log.
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("spdl")
    logger.addHandler(handler)
    try:
        out = spdl_batch([path])
    except Exception as e:
        why = "; ".join(r.getMessage() for r in records) or "no log message"
        return False, f"spdl_io {version}: load_image_batch raised {e!r}; logged: {why}"
    finally:
        logger.removeHandler(handler)
    if out.shape != (1, CROP, CROP, 3):
        return False, f"spdl_io {version}: unexpected output shape {out.shape}"
    return True, f"spdl_io {version}"


# --- timing -------------------------------------------------------------------------------


def rotated(items: Sequence[Any], k: int) -> list[Any]:
    k %= max(len(items), 1)
    return list(items[k:]) + list(items[:k])


def measure(
    methods: dict[str, tuple[Callable[[list[Any]], int], Sequence[Any]]],
    repeats: int,
    cores: dict[str, float] | None = None,
) -> dict[str, list[float]]:
    """Images/s of each method, per pass; the methods take turns within every pass.

    ``methods`` maps a name to the function and the items (paths or batches) it runs over.
    ``cores``, when given, receives each method's process CPU time over wall time across
    its passes: about 1.0 for a path that keeps to one core.
    """
    for fn, items in methods.values():  # warm-up: page cache, pools, allocator
        fn(list(items))
    rates: dict[str, list[float]] = {name: [] for name in methods}
    cpu = dict.fromkeys(methods, 0.0)
    wall = dict.fromkeys(methods, 0.0)
    for r in range(repeats):
        for name in rotated(list(methods), r):
            fn, items = methods[name]
            work = rotated(items, r * 7)
            c = time.process_time()
            t = time.perf_counter()
            count = fn(work)
            dt = time.perf_counter() - t
            cpu[name] += time.process_time() - c
            wall[name] += dt
            rates[name].append(count / dt)
    if cores is not None:
        cores.update({name: cpu[name] / wall[name] for name in methods})
    return rates


def per_image(fn: Callable[[str], np.ndarray]) -> Callable[[list[str]], int]:
    def run(paths: list[str]) -> int:
        for p in paths:
            out = fn(p)
            assert out.shape == (CROP, CROP, 3), out.shape
        return len(paths)

    return run


def per_batch(fn: Callable[[Sequence[str]], np.ndarray]) -> Callable[[list[Any]], int]:
    def run(groups: list[Sequence[str]]) -> int:
        count = 0
        for g in groups:
            out = fn(g)
            assert out.shape == (len(g), CROP, CROP, 3), out.shape
            count += len(g)
        return count

    return run


def mean_abs_diff(paths: Sequence[str], a: Callable[[str], np.ndarray], b: Any) -> float:
    diffs = [np.abs(a(p).astype(np.int16) - b(p).astype(np.int16)).mean() for p in paths]
    return float(np.mean(diffs))


def summary(rates: list[float]) -> dict[str, float]:
    return {"median": statistics.median(rates), "best": max(rates), "worst": min(rates)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=200, help="JPEG files")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32, help="images per batch")
    parser.add_argument("--threads", type=int, default=2, help="threads of the batch path")
    parser.add_argument(
        "--source",
        choices=["generated", "skimage"],
        default="generated",
        help="image content: generated photo-like, or views of scikit-image's sample photos",
    )
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--out", default="bench-results/decode_vs_pillow.json")
    args = parser.parse_args()
    if args.quick:
        args.n, args.repeats = 20, 1

    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(
        prefix="ferrofeed-bench-", dir=shm if shm.is_dir() else None
    ) as tmp:
        paths, data_info = make_jpegs(Path(tmp), args.n, args.source)
        spdl_ok, spdl_note = spdl_status(paths[0])

        groups = batches(paths, args.batch)
        single_methods: dict[str, tuple[Callable[[list[Any]], int], Sequence[Any]]] = {
            "Pillow (no draft)": (per_image(lambda p: pillow_one(p, False)), paths),
            "Pillow + draft()": (per_image(lambda p: pillow_one(p, True)), paths),
            "ferrofeed decode_image, DCT scaling": (
                per_image(lambda p: ferrofeed_one(p, True)),
                paths,
            ),
            "ferrofeed decode_image, no DCT scaling": (
                per_image(lambda p: ferrofeed_one(p, False)),
                paths,
            ),
            "ferrofeed load_images, 1 thread": (
                per_batch(lambda g: ferrofeed_batch(g, 1)),
                groups,
            ),
        }
        if spdl_ok:
            # SPDL 0.8's load_image_batch decodes the batch one image after the other on
            # the calling thread: a per-core path (the CPU/wall column checks it).
            single_methods["SPDL load_image_batch"] = (per_batch(spdl_batch), groups)
        cores: dict[str, float] = {}
        single = measure(single_methods, args.repeats, cores)
        with ThreadPoolExecutor(args.threads) as pool:
            multi_methods: dict[str, tuple[Callable[[list[Any]], int], Sequence[Any]]] = {
                f"ferrofeed load_images, {args.threads} threads": (
                    per_batch(lambda g: ferrofeed_batch(g, args.threads)),
                    groups,
                ),
                f"Pillow, {args.threads} threads + np.stack": (
                    per_batch(lambda g: pillow_batch(pool, g)),
                    groups,
                ),
            }
            multi_rates = measure(multi_methods, args.repeats)

        sample = paths[: min(20, len(paths))]
        mad = {
            **(
                {
                    "SPDL vs Pillow (no draft)": mean_abs_diff(
                        sample, lambda p: spdl_batch([p])[0], lambda p: pillow_one(p, False)
                    )
                }
                if spdl_ok
                else {}
            ),
            "ferrofeed DCT vs Pillow (no draft)": mean_abs_diff(
                sample, lambda p: ferrofeed_one(p, True), lambda p: pillow_one(p, False)
            ),
            "ferrofeed no DCT vs Pillow (no draft)": mean_abs_diff(
                sample, lambda p: ferrofeed_one(p, False), lambda p: pillow_one(p, False)
            ),
        }
        draft_scaled = sum(1 for p in paths if draft_reduces(p))

    content = (
        "generated, photo-like"
        if args.source == "generated"
        else "views of scikit-image's sample photos: " + ", ".join(REAL_PHOTOS)
    )
    pil = statistics.median(single["Pillow (no draft)"])
    pil_draft = statistics.median(single["Pillow + draft()"])
    pil_best = max(pil, pil_draft)
    print(
        f"ferrofeed {ferrofeed.__version__}, Pillow {PIL.__version__} (libjpeg-turbo "
        f"{features.version('libjpeg_turbo')}), numpy {np.__version__}, Python "
        f"{platform.python_version()}, {cpu_model()}, {os.cpu_count()} CPUs"
    )
    print(
        f"{args.n} JPEGs ({content}) {data_info['sizes']}, quality 75-95, mean "
        f"{data_info['mean_file_bytes'] / 1024:.1f} KiB; decode + Resize({RESIZE}) + "
        f"CenterCrop({CROP}) to a uint8 array; median (best) of {args.repeats} passes"
    )
    why = " (its scales are 1/2, 1/4, 1/8: too small here)" if draft_scaled == 0 else ""
    print(f"Pillow draft() reduced {draft_scaled} of {args.n} images{why}")
    print()
    header = f"{'per core (1 thread)':<50}{'images/s':>10}{'(best)':>9}{'ms/image':>10}"
    print(f"{header}{'vs Pillow':>11}{'CPU/wall':>10}")
    results: dict[str, Any] = {"per_core": {}, "batch": {}}
    for name, rates in single.items():
        s = summary(rates)
        ratio = s["median"] / pil
        results["per_core"][name] = {
            **s,
            "vs_pillow": ratio,
            "vs_best_pillow": s["median"] / pil_best,
            "cpu_over_wall": cores[name],
        }
        print(
            f"{name:<50}{s['median']:>10.0f}{s['best']:>9.0f}{1e3 / s['median']:>10.2f}"
            f"{ratio:>10.2f}x{cores[name]:>10.2f}"
        )
    print()
    header = f"{f'batch of {args.batch}, {args.threads} threads':<50}{'images/s':>10}{'(best)':>9}"
    print(f"{header}{'per core':>10}{'vs Pillow':>11}")
    pil_multi = statistics.median(multi_rates[f"Pillow, {args.threads} threads + np.stack"])
    for name, rates in multi_rates.items():
        s = summary(rates)
        ratio = s["median"] / pil_multi
        results["batch"][name] = {**s, "per_core": s["median"] / args.threads, "vs_pillow": ratio}
        print(
            f"{name:<50}{s['median']:>10.0f}{s['best']:>9.0f}"
            f"{s['median'] / args.threads:>10.0f}{ratio:>10.2f}x"
        )
    if spdl_ok:
        spdl = statistics.median(single["SPDL load_image_batch"])
        same = statistics.median(single["ferrofeed load_images, 1 thread"])
        print(f"SPDL ({spdl_note}): ferrofeed load_images is {same / spdl:.2f}x SPDL per core")
    else:
        print(f"SPDL not measured: {spdl_note}")
    print()
    for name, v in mad.items():
        print(
            f"mean absolute difference, {name}: {v:.2f} (0-255 scale, first {len(sample)} images)"
        )
    ff = statistics.median(single["ferrofeed decode_image, DCT scaling"])
    print(
        f"target >= 2x Pillow images/s per core: ferrofeed {ff / pil:.2f}x Pillow, "
        f"{ff / pil_best:.2f}x the faster Pillow variant: "
        f"{'met' if ff / pil_best >= 2 else 'NOT met'}"
    )

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "n": args.n,
                "repeats": args.repeats,
                "batch": args.batch,
                "threads": args.threads,
                "transform": f"Resize({RESIZE}) + CenterCrop({CROP})",
                "data": {**data_info, "quality": "75-95", "content": content},
                "images_per_s": results,
                "pillow_draft_reduced_images": draft_scaled,
                "mean_abs_diff_vs_pillow": mad,
                "spdl": {"measured": spdl_ok, "note": spdl_note},
                "versions": {
                    "ferrofeed": ferrofeed.__version__,
                    "pillow": PIL.__version__,
                    "pillow_libjpeg_turbo": features.version("libjpeg_turbo"),
                    "numpy": np.__version__,
                    "python": sys.version.split()[0],
                },
                "machine": {"cpu": cpu_model(), "cpus": os.cpu_count()},
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
