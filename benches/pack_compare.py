"""Packing an image folder into tar shards: ``ferrofeed pack`` against the loops users write.

Run: python benches/pack_compare.py [--n 2000] [--repeats 5] [--litdata DIR] [--quick]

Side by side in one run, on the same machine and the same folder:

* Data: ``--n`` JPEGs cut from scikit-image's photos (``_common.make_jpegs``: about
  500x375, Pillow quality 75 to 95), in an image folder (a subfolder per class), on
  ``/dev/shm`` when there is one, so that the figures are the packing's CPU work and not a
  disk's; the shards go to the same file system.
* Copying the bytes (the images unchanged, one label each, shards of 256 MB):

  - ferrofeed: ``ferrofeed.write_shards(folder, dest)`` (its threads: the machine's CPUs);
  - webdataset: ``webdataset.ShardWriter`` in the loop its users write: the folder listed
    (sorted, classes numbered as torchvision's ImageFolder), each file read and written as
    ``{"__key__", "jpg": bytes, "cls": label}``;
  - LitData: ``litdata.optimize(fn, inputs, output_dir, chunk_bytes="256MB")`` with ``fn``
    returning ``{"jpg": bytes, "cls": label}`` (its worker processes: the CPUs), when
    ``litdata`` imports (``--litdata DIR`` adds a folder where it is installed to the path:
    ``make bench-pack`` installs it there, apart from the virtual environment).

* Re-encoding (``--resize 256 --quality 90``, the usual ImageNet preprocessing):

  - ferrofeed: ``write_shards(folder, dest, resize=256, quality=90)``;
  - Pillow in the webdataset loop: ``Image.open(path).convert("RGB")``, ``resize`` of the
    shorter side to 256 (bilinear, as torchvision's ``Resize(256)``), ``save(JPEG,
    quality=90)`` into the sample.

Each figure is the wall time of the packing call alone (the work, not the interpreter's
start; a contender's imports are done before), the median and range over ``--repeats`` runs,
the contenders interleaved, each run into a fresh folder. Ratios are of medians (ferrofeed's
time over the other's: below 1 is faster). Results go to stdout and to
benches/results/pack_compare.json and .md, with the CPU named.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import make_jpegs
from _rounds import med_range
from bench_machine import cpu_model

RESULTS = Path(__file__).resolve().parent / "results"


def list_folder(root: str) -> list[tuple[str, int]]:
    """The folder's images, sorted, classes numbered in sorted order (torchvision's rule)."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    return [
        (os.path.join(root, c, name), label)
        for label, c in enumerate(classes)
        for name in sorted(os.listdir(os.path.join(root, c)))
    ]


def ferrofeed_pack(root: str, dest: str, resize: int | None) -> None:
    import ferrofeed

    kw: dict[str, Any] = {"resize": resize, "quality": 90} if resize else {}
    ferrofeed.write_shards(root, dest, shard_size="256MB", progress=False, **kw)


def webdataset_pack(root: str, dest: str, resize: int | None) -> None:
    import webdataset as wds

    os.makedirs(dest)
    pattern = os.path.join(dest, "shard-%06d.tar")
    with wds.ShardWriter(pattern, maxsize=256_000_000, verbose=0) as sink:
        for i, (path, label) in enumerate(list_folder(root)):
            if resize is None:
                with open(path, "rb") as f:
                    data = f.read()
            else:
                data = pillow_resize(path, resize)
            sink.write({"__key__": f"{i:08d}", "jpg": data, "cls": label})


def pillow_resize(path: str, short: int) -> bytes:
    from PIL import Image

    with Image.open(path) as im:
        rgb = im.convert("RGB")
    w, h = rgb.size
    size = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
    out = io.BytesIO()
    rgb.resize(size, Image.Resampling.BILINEAR).save(out, "JPEG", quality=90)
    return out.getvalue()


def _litdata_sample(item: tuple[str, int]) -> dict[str, Any]:
    path, label = item
    with open(path, "rb") as f:
        return {"jpg": f.read(), "cls": label}


def litdata_pack(root: str, dest: str, resize: int | None) -> None:
    from litdata import optimize

    assert resize is None
    optimize(
        fn=_litdata_sample,
        inputs=list_folder(root),
        output_dir=dest,
        chunk_bytes="256MB",
        num_workers=os.cpu_count() or 1,
    )


def litdata_status() -> str | None:
    """None when litdata imports, else why not."""
    try:
        import litdata  # noqa: F401
    except Exception as e:  # any failure to import is the reason to show
        return f"{type(e).__name__}: {e}"
    return None


def timed(
    fn: Callable[[str, str, int | None], None], root: str, work: str, resize: int | None
) -> float:
    dest = tempfile.mkdtemp(dir=work)
    shutil.rmtree(dest)
    start = time.perf_counter()
    fn(root, dest, resize)
    seconds = time.perf_counter() - start
    shutil.rmtree(dest, ignore_errors=True)
    # What a contender leaves running as it returns (LitData's worker processes ending)
    # must not land on the next one's clock.
    time.sleep(1.0)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="images in the folder")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--litdata", help="a folder where litdata is installed (added to the path)")
    parser.add_argument("--quick", action="store_true", help="200 images, 2 repeats")
    parser.add_argument(
        "--out", default=str(RESULTS / "pack_compare"), help="results, without suffix"
    )
    args = parser.parse_args()
    if args.quick:
        args.n, args.repeats = 200, 2
    if args.litdata:
        sys.path.insert(0, args.litdata)
    import ferrofeed
    import webdataset  # noqa: F401 - imported before any timing
    from PIL import Image  # noqa: F401

    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    work = tempfile.mkdtemp(prefix="pack-compare-", dir=base)
    try:
        root = os.path.join(work, "images")
        _, info = make_jpegs(root, args.n, seed=34, folders=True)
        folder_bytes = sum(os.path.getsize(p) for p, _ in list_folder(root))
        contenders: dict[str, tuple[Callable[[str, str, int | None], None], int | None]] = {
            "ferrofeed": (ferrofeed_pack, None),
            "webdataset ShardWriter": (webdataset_pack, None),
            "ferrofeed --resize 256 --quality 90": (ferrofeed_pack, 256),
            "webdataset ShardWriter + Pillow resize": (webdataset_pack, 256),
        }
        litdata = litdata_status()
        if litdata is None:
            contenders["LitData optimize()"] = (litdata_pack, None)
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for fn, resize in contenders.values():
            timed(fn, root, work, resize)  # warm-up: imports, page cache, pools
        for r in range(args.repeats):
            for name, (fn, resize) in contenders.items():
                times[name].append(timed(fn, root, work, resize))
            print(
                f"run {r + 1}/{args.repeats}: "
                + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in times.items()),
                flush=True,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)

    stats = {k: med_range(v) for k, v in times.items()}

    def ratio(a: str, b: str) -> float:
        return stats[a]["median"] / stats[b]["median"]

    ratios = {
        "copy: ferrofeed / webdataset": ratio("ferrofeed", "webdataset ShardWriter"),
        "resize: ferrofeed / webdataset + Pillow": ratio(
            "ferrofeed --resize 256 --quality 90", "webdataset ShardWriter + Pillow resize"
        ),
    }
    if "LitData optimize()" in stats:
        ratios["copy: ferrofeed / LitData"] = ratio("ferrofeed", "LitData optimize()")
    result = {
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "images": args.n,
        "folder_bytes": folder_bytes,
        "data": info,
        "repeats": args.repeats,
        "ferrofeed": ferrofeed.build_info(),
        "litdata": "used" if litdata is None else f"not run: {litdata}",
        "seconds": stats,
        "ratios": ratios,
    }
    lines = [
        f"Packing {args.n:,} JPEGs ({folder_bytes / 1e6:,.0f} MB, scikit-image photo crops) into "
        f"tar shards on {result['cpu']} ({result['cpus']} CPUs), /dev/shm; median (min-max) of "
        f"{args.repeats} runs, ferrofeed {ferrofeed.__version__}.",
        "",
        "| packing | seconds | images/s |",
        "|---|---:|---:|",
    ]
    for name, s in stats.items():
        lines.append(
            f"| {name} | {s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f}) | "
            f"{args.n / s['median']:,.0f} |"
        )
    lines += ["", "| ratio of medians (time; below 1: ferrofeed faster) | |", "|---|---:|"]
    lines += [f"| {k} | {v:.2f} ({1 / v:.1f}x faster) |" for k, v in ratios.items()]
    if litdata is not None:
        lines += ["", f"LitData optimize(): not run ({litdata})."]
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(text + "\n")


if __name__ == "__main__":
    main()
