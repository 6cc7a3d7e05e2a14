"""What a `Mix` costs: the same native-chain job over one source and over a mixture of two.

``python benches/mix_cost.py [--rounds 6] [--sources folder,tar] [--jobs train]
[--threads 2] [--batch-size 32] [--n 1000] [--epochs 2]`` (``make bench-mix``)

Data: ``--n`` ImageNet-like JPEGs made from scikit-image's real photos
(``_common.make_jpegs(..., varied=True, folders=True)``) on /dev/shm; for ``tar``, the same
JPEGs packed as WebDataset tar shards of 256 (``jpg``, ``cls``; fewer per shard when
``--n`` is below 1,024, so that each half has two shards at least).

Two loaders over the same images, side by side:

- ``one``: ``DataLoader(source, ...)``, the images as one source (`ImageFiles` of every
  file; `TarShards` of every shard);
- ``mix``: ``DataLoader(Mix([first half, second half]), ...)``, the same images as two
  sources at weights proportional to their sizes (``stop="shortest"``, so the epoch is the
  same images less at most a batch).

Each run is a fresh interpreter (``_runs.run_fresh``): one warm-up epoch, then
``--epochs`` timed epochs, images/s and the process's CPU ms per image. ``one`` and ``mix``
take turns within a round (the order rotated each round); the summary gives the median and
range of the per-round ratios ``mix / one``, which a noisy VM moves far less than the
figures themselves.

Then the resume: two map-style sources of ``10^6`` and ``10^8`` samples each (``range``s: the
plan is the same whatever the samples are), a `DataLoader` of batches of 256 resumed at
the last batch of the epoch: the state's size (JSON bytes), the time ``load_state_dict``
takes, and the time to the first batch after it (the plan made and one batch drawn; the
samples are the ranges' ints, so this is the mixture's own cost).

Results: ``--out`` (default bench-results/mix_cost) gets ``mix_cost.json`` (every run, the
machine) and ``mix_cost.md`` (the tables, also printed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
import _rounds
import _runs
from bench_machine import cpu_model


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One run, in a fresh interpreter: ``one`` or ``mix`` over ``spec``'s images."""
    import ferrofeed

    shards, files = spec.get("shards"), spec["files"]
    if shards:
        half = len(shards) // 2
        whole: Any = ferrofeed.TarShards(shards)
        parts: list[Any] = [ferrofeed.TarShards(shards[:half]), ferrofeed.TarShards(shards[half:])]
        fields = {"image": "jpg", "label": "cls"}
    else:
        paths = [p for p, _ in files]
        labels = [c for _, c in files]
        half = len(paths) // 2
        whole = ferrofeed.ImageFiles(paths, labels=labels)
        parts = [
            ferrofeed.ImageFiles(paths[:half], labels=labels[:half]),
            ferrofeed.ImageFiles(paths[half:], labels=labels[half:]),
        ]
        fields = {}
    source = whole if spec["mode"] == "one" else ferrofeed.Mix(parts)
    return _runs.native_epochs(source, spec, **fields)


def resume_cost(samples: int, repeats: int = 5) -> dict[str, Any]:
    """State size and resume times of a mixture of two map-style sources of ``samples``."""
    import ferrofeed

    def loader() -> Any:
        mix = ferrofeed.Mix([range(samples), range(samples, 2 * samples)], weights=[1, 1])
        return ferrofeed.DataLoader(mix, batch_size=256, shuffle=True, seed=3)

    first = loader()
    state = {**first.state_dict(), "batches_done": len(first) - 1}
    size = len(json.dumps(state).encode())
    loads, firsts = [], []
    for _ in range(repeats):
        dl = loader()
        t0 = time.perf_counter()
        dl.load_state_dict(state)
        t1 = time.perf_counter()
        batch = next(iter(dl))
        t2 = time.perf_counter()
        assert len(batch) > 0
        loads.append(t1 - t0)
        firsts.append(t2 - t1)
    return {
        "samples_per_source": samples,
        "state_bytes": size,
        "load_state_dict_ms": 1000 * statistics.median(loads),
        "first_batch_ms": 1000 * statistics.median(firsts),
    }


def summarize(runs: list[dict[str, Any]], sources: list[str], jobs: list[str]) -> str:
    """The markdown table of ``mix`` against ``one``, per source and job."""
    lines = [
        "| source | job | one: images/s | mix: images/s | mix / one, images/s (median, "
        "range) | mix / one, CPU per image |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for source in sources:
        for job in jobs:
            rs = [r for r in runs if r["source"] == source and r["job"] == job]
            by = {m: {r["round"]: r for r in rs if r["mode"] == m} for m in ("one", "mix")}
            rounds = sorted(set(by["one"]) & set(by["mix"]))
            ratio = {
                key: _rounds.fmt_ratio(
                    _rounds.med_range([by["mix"][k][key] / by["one"][k][key] for k in rounds])
                )
                for key in ("images_per_s", "cpu_ms_per_image")
            }
            ips = {
                m: _rounds.fmt(_rounds.med_range([r["images_per_s"] for r in by[m].values()]))
                for m in ("one", "mix")
            }
            lines.append(
                f"| {source} | {job} | {ips['one']} | {ips['mix']} | "
                f"{ratio['images_per_s']} | {ratio['cpu_ms_per_image']} |"
            )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--sources", default="folder,tar", help="subset of folder,tar")
    p.add_argument("--jobs", default="train", help="subset of train,exact")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--n", type=int, default=1000, help="JPEGs (default 1000)")
    p.add_argument("--epochs", type=int, default=2, help="timed epochs per run")
    _rounds.add_run_options(p, timeout=600.0)
    p.add_argument("--out", default="bench-results/mix_cost")
    args = p.parse_args(argv)
    sources, jobs = args.sources.split(","), args.jobs.split(",")

    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="ff-mix-cost-") as work:
        folder = os.path.join(work, "images")
        files, _ = _common.make_jpegs(folder, args.n, args.seed, varied=True, folders=True)
        # Shards of 256 (fewer for a small --n: each half needs two at least).
        per_shard = max(1, min(256, args.n // 4))
        shards = _common.pack_tar_shards(files, os.path.join(work, "tar"), per_shard)
        for r in range(args.rounds):
            modes = ["one", "mix"] if r % 2 == 0 else ["mix", "one"]
            for source in sources:
                for job in jobs:
                    for mode in modes:
                        spec = {
                            "files": files,
                            "shards": shards if source == "tar" else None,
                            "mode": mode,
                            "job": job,
                            "threads": args.threads,
                            "batch_size": args.batch_size,
                            "epochs": args.epochs,
                        }
                        res = _runs.run_fresh(__file__, spec, work, args.timeout)
                        res.update(source=source, job=job, mode=mode, round=r)
                        runs.append(res)
                        print(
                            f"round {r} {source:6s} {job:5s} {mode}: "
                            f"{res['images_per_s']:7,.0f} images/s, "
                            f"{res['cpu_ms_per_image']:.3f} CPU ms/image",
                            flush=True,
                        )
    resumes = [resume_cost(n) for n in (10**6, 10**8)]
    table = summarize(runs, sources, jobs)
    resume_table = "\n".join(
        [
            "| samples per source | state (JSON bytes) | load_state_dict | first batch after it |",
            "|---:|---:|---:|---:|",
            *(
                f"| {r['samples_per_source']:,} | {r['state_bytes']:,} | "
                f"{r['load_state_dict_ms']:.2f} ms | {r['first_batch_ms']:.2f} ms |"
                for r in resumes
            ),
        ]
    )
    print(table)
    print()
    print(resume_table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version()}
    (out / "mix_cost.json").write_text(
        json.dumps(
            {"machine": machine, "args": vars(args), "runs": runs, "resume": resumes}, indent=1
        )
    )
    (out / "mix_cost.md").write_text(
        f"CPU: {machine['cpu']}, {machine['cores']} cores\n\n{table}\n\n{resume_table}\n"
    )


if __name__ == "__main__":
    sys.exit(_runs.run_script(main, child))
