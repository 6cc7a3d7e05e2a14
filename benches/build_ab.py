"""Two or more builds of ferrofeed side by side: the same native-chain job, taking turns.

``python benches/build_ab.py --build NAME=PYTHON [--build NAME=PYTHON ...] [--rounds 8]
[--jobs train,exact] [--threads 2] [--batch-size 32] [--n 1000] [--env FERROFEED_CPU=baseline]
[--source folder|tar] [--shard-size 256] [--shuffle-window W]``

Each ``--build`` names a Python interpreter (a venv's ``bin/python``) with one build of
ferrofeed installed: the release wheel (``make wheel``: fat LTO, one codegen unit) in one,
the local build (``make install``: the ``fast`` profile) in another, say. The first build
is the reference the ratios are taken against.

Data: ``--n`` ImageNet-like JPEGs made from scikit-image's real photos
(``_common.make_jpegs(..., varied=True, folders=True)``) in an image folder on /dev/shm,
made once and read by every build (scikit-image and Pillow must be installed where this
script runs and in the builds' interpreters, which import ``_common``).

``--source tar`` packs the same JPEGs as WebDataset tar shards of ``--shard-size`` samples
(default 256; ``jpg``, ``cls``) and reads them with ``TarShards`` and the native chain
(``image="jpg", label="cls"``, ``shuffle_window=--shuffle-window`` when given) instead:
shards larger than the shuffle window are read a piece at a time.

Each run is a fresh interpreter of one build (``_runs.run_fresh``): ``DataLoader(folder,
batch_size, transform=_common.native_op(job), num_threads)``, one warm-up epoch, then
``--epochs`` timed epochs: images/s and the process's CPU ms per image (user + system,
``getrusage``). The builds take turns within a round (the order rotated each round), so
each round's ratio compares runs made one after the other on the same machine state: the
summary gives the median and the range of those per-round ratios, which a noisy VM moves
far less than it moves the figures themselves. ``--env NAME=VALUE`` is set in every run
(``FERROFEED_CPU=baseline`` compares the portable builds of two x86_64 wheels).

Results: ``--out`` (default bench-results/build_ab) gets ``{--name}.json`` (every run, the
machine, each build's ``ferrofeed.build_info()``) and ``{--name}.md`` (the table, also
printed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
import _rounds
import _runs
from bench_machine import cpu_model


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One run, in a fresh interpreter of one build."""
    import ferrofeed

    shards = spec.get("shards")
    if shards:
        window = {"shuffle_window": spec["shuffle_window"]} if spec.get("shuffle_window") else {}
        run = _runs.native_epochs(
            ferrofeed.TarShards(shards), spec, image="jpg", label="cls", **window
        )
    else:
        run = _runs.native_epochs(spec["folder"], spec)
    return {**run, "build_info": ferrofeed.build_info()}


def round_ratios(
    runs: list[dict[str, Any]], job: str, build: str, ref: str, key: str
) -> list[float]:
    """``key`` of ``build`` over ``ref``'s, round by round (rounds both ran), for ``job``."""
    by = {
        b: {r["round"]: r[key] for r in runs if r["job"] == job and r["build"] == b}
        for b in (build, ref)
    }
    return [by[build][k] / by[ref][k] for k in sorted(set(by[build]) & set(by[ref]))]


def summarize(runs: list[dict[str, Any]], builds: list[str], jobs: list[str]) -> str:
    """The markdown table: per job and build, images/s, CPU ms per image, and the per-round
    ratios to the first build."""
    ref = builds[0]
    lines = [
        f"| job | build | images/s | CPU ms per image | images/s / {ref}'s | "
        f"CPU per image / {ref}'s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for job in jobs:
        for b in builds:
            rs = [r for r in runs if r["job"] == job and r["build"] == b]
            ips = _rounds.med_range([r["images_per_s"] for r in rs])
            cpu = _rounds.med_range([r["cpu_ms_per_image"] for r in rs])
            ratios = [
                "1"
                if b == ref
                else _rounds.fmt_ratio(_rounds.med_range(round_ratios(runs, job, b, ref, key)))
                for key in ("images_per_s", "cpu_ms_per_image")
            ]
            lines.append(
                f"| {job} | {b} | {_rounds.fmt(ips)} | {_rounds.fmt(cpu, digits=3)} | "
                f"{ratios[0]} | {ratios[1]} |"
            )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--build",
        action="append",
        required=True,
        metavar="NAME=PYTHON",
        help="a build: its name and the interpreter it is installed in (twice or more)",
    )
    p.add_argument("--rounds", type=int, default=8, help="turns each build takes (default 8)")
    p.add_argument("--jobs", default="train", help="subset of train,exact")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--n", type=int, default=1000, help="JPEGs (default 1000)")
    p.add_argument("--epochs", type=int, default=2, help="timed epochs per run")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    _rounds.add_run_options(p, timeout=600.0)
    p.add_argument(
        "--source",
        choices=("folder", "tar"),
        default="folder",
        help="read the JPEGs from an image folder (default) or packed as tar shards",
    )
    p.add_argument("--shard-size", type=int, default=256, help="samples per tar shard (256)")
    p.add_argument(
        "--shuffle-window", type=int, default=None, help="tar shards' shuffle window (default)"
    )
    p.add_argument("--out", default="bench-results/build_ab")
    p.add_argument("--name", default="build_ab")
    args = p.parse_args(argv)

    builds: dict[str, str] = {}
    for b in args.build:
        name, sep, python = b.partition("=")
        if not sep or not name or not python:
            p.error(f"--build {b!r}: expected NAME=PYTHON")
        builds[name] = python
    if len(builds) < 2:
        p.error("give two builds or more")
    for e in args.env:
        name, sep, value = e.partition("=")
        if not sep:
            p.error(f"--env {e!r}: expected NAME=VALUE")
        os.environ[name] = value
    jobs = args.jobs.split(",")

    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="ff-build-ab-") as work:
        folder = os.path.join(work, "images")
        files, data = _common.make_jpegs(folder, args.n, args.seed, varied=True, folders=True)
        shards = None
        if args.source == "tar":
            shards = _common.pack_tar_shards(files, os.path.join(work, "tar"), args.shard_size)
        names = list(builds)
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for job in jobs:
                for b in order:
                    spec = {
                        "folder": folder,
                        "shards": shards,
                        "job": job,
                        "threads": args.threads,
                        "batch_size": args.batch_size,
                        "epochs": args.epochs,
                        "shuffle_window": args.shuffle_window,
                    }
                    res = _runs.run_fresh(__file__, spec, work, args.timeout, python=builds[b])
                    res.update(build=b, job=job, round=r)
                    runs.append(res)
                    print(
                        f"round {r} {job:5s} {b:>12s}: {res['images_per_s']:7,.0f} images/s, "
                        f"{res['cpu_ms_per_image']:.3f} CPU ms/image",
                        flush=True,
                    )

    table = summarize(runs, names, jobs)
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = {b: next(r["build_info"] for r in runs if r["build"] == b) for b in names}
    (out / f"{args.name}.json").write_text(
        json.dumps(
            {
                "machine": {
                    "cpu": cpu_model(),
                    "cores": os.cpu_count(),
                    "platform": platform.platform(),
                },
                "args": vars(args),
                "data": data,
                "builds": {b: {"python": builds[b], "build_info": info[b]} for b in names},
                "runs": runs,
                "median_ratios": {
                    job: {
                        b: statistics.median(round_ratios(runs, job, b, names[0], "images_per_s"))
                        for b in names[1:]
                    }
                    for job in jobs
                },
            },
            indent=1,
        )
    )
    (out / f"{args.name}.md").write_text(table + "\n")


if __name__ == "__main__":
    sys.exit(_runs.run_script(main, child))
