#!/usr/bin/env python3
"""RAM usage of multi-process data loading: NaiveList vs NumpySerializedList vs SharedList.

Reproduces the experiment of "Demystify RAM Usage in Multi-Process Data Loaders"
(ppwwyyxx/RAM-multiprocess-dataloader) with ``ferrofeed.SharedList`` side by side:

* a main process builds a list of COCO-like annotation dicts in one of three containers,
* it launches ``--workers`` worker processes (``multiprocessing``, start method fork / spawn and,
  with ``--all-methods``, forkserver) that read every item ``--passes`` times and
  ``pickle.dumps`` it, like the study's worker,
* the main process samples PSS/USS of itself and of every worker about every ``--interval``
  seconds (``ferrofeed.memory.process_memory``) until the workers are done.

Every configuration runs in a fresh "driver" interpreter (this script re-executed with an
internal flag), so that no configuration sees memory left behind by another one. A "baseline"
configuration (same modules imported, an empty dataset) measures the processes' own import
footprint, which gives the target for SharedList:

    total PSS (main + workers)  ~=  arena size + import footprint   (within 10% with spawn)

A second part measures random-access latency: ``SharedList[i]`` vs ``pickle.loads`` of the same
bytes vs ``NumpySerializedList[i]``, and ``SharedList.raw(i)``.

Run ``python benches/ram_study.py --quick`` for a smoke run, ``python benches/ram_study.py`` for
the full one. Results go to stdout (tables) and to ``--out`` (JSON, with the time series).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import multiprocessing as mp
import os
import pickle
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import ferrofeed
from _ram_common import (
    Json,
    Mem,
    cmdline,
    machine_info,
    mib,
    raise_system_exit,
    read_mem,
    render,
    stop_process,
)
from _ram_containers import GETITEM_RATIO_TARGET, RAW_TARGET_NS, build_container, run_latency
from _rounds import LOCAL_RESULTS, add_run_options
from _runs import child_pids
from bench_machine import loadavg

DEFAULT_OUT = LOCAL_RESULTS / "ram_study.json"
DRIVER_FLAG = "--_driver"

CONTAINERS = ("baseline", "naive", "numpy", "shared")
CONTAINER_NAMES = {
    "baseline": "baseline (empty)",
    "naive": "NaiveList",
    "numpy": "NumpySerializedList",
    "shared": "SharedList",
}
FORKSERVER_PRELOAD = ["numpy", "ferrofeed", "ferrofeed.memory"]

PSS_TARGET = 0.10  # SharedList/spawn total PSS within 10% of arena + import footprint


def sum_field(mems: Iterable[Mem | None], field: str) -> int:
    return sum(m[field] for m in mems if m is not None)


# --------------------------------------------------------------------------------------------
# Worker and driver (one configuration = one driver process)
# --------------------------------------------------------------------------------------------


def worker_main(rank: int, ds: Any, passes: int, events: Any, release: Any) -> None:
    """Read every item ``passes`` times, like the study's worker; then wait for release."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver stops us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # fork children inherit the driver's handler
    events.put(("ready", rank, time.monotonic(), 0))
    dumps = pickle.dumps
    n = len(ds)
    checksum = 0
    for _ in range(passes):
        for i in range(n):
            checksum += len(dumps(ds[i]))
    events.put(("done", rank, time.monotonic(), checksum))
    # Stay alive (memory intact) until the driver has taken its final sample.
    parent = mp.parent_process()
    while not release.wait(0.5):
        if parent is not None and not parent.is_alive():
            return


@dataclass(frozen=True)
class RunConfig:
    container: str
    method: str
    n: int
    seed: int
    workers: int
    passes: int
    interval: float
    timeout: float
    arena_dir: str
    result_path: str

    @property
    def label(self) -> str:
        return f"{self.method}/{self.container}"


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """Start children with SIGINT ignored (spawned interpreters keep an inherited SIG_IGN)."""
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def stop_workers(procs: list[BaseProcess], release: Any, *, graceful: bool) -> list[int | None]:
    """Stop all started workers (release, then terminate, then kill); return exit codes."""
    started = [p for p in procs if p.pid is not None]
    if graceful:
        release.set()
        deadline = time.monotonic() + 30.0
        for p in started:
            p.join(max(0.0, deadline - time.monotonic()))
    for p in started:
        if p.exitcode is None:
            p.terminate()
    for p in started:
        p.join(5.0)
        if p.exitcode is None:
            p.kill()
            p.join()
    return [p.exitcode for p in procs]


def measure(
    cfg: RunConfig, ctx: Any, ds: Any, events: Any, release: Any, procs: list[BaseProcess]
) -> Json:
    """Start the workers, sample memory until they are all done, take the final sample."""
    main_pid = os.getpid()
    pids: dict[int, int] = {}
    ready: dict[int, float] = {}
    done: dict[int, float] = {}
    checksums: dict[int, int] = {}
    series: list[Json] = []
    t0 = time.monotonic()

    def sample() -> Json:
        main = read_mem(main_pid)
        workers = [read_mem(pids[r]) if r in pids else None for r in range(cfg.workers)]
        rec: Json = {
            "t": round(time.monotonic() - t0, 3),
            "ready": len(ready),
            "done": len(done),
            "main": main,
            "workers": workers,
            "total_pss": sum_field([main, *workers], "pss"),
        }
        series.append(rec)
        return rec

    def handle(msg: tuple[str, int, float, int]) -> None:
        kind, rank, t, checksum = msg
        if kind == "ready":
            ready[rank] = t - t0
        else:
            done[rank] = t - t0
            checksums[rank] = checksum

    sample()
    for rank in range(cfg.workers):
        p = ctx.Process(
            target=worker_main,
            args=(rank, ds, cfg.passes, events, release),
            name=f"ram-study-worker-{rank}",
            daemon=True,
        )
        procs.append(p)
        with sigint_ignored():
            p.start()
        pids[rank] = p.pid
        sample()
    start_s = time.monotonic() - t0

    next_t = time.monotonic() + cfg.interval
    while len(done) < cfg.workers:
        now = time.monotonic()
        if now >= next_t:
            sample()
            next_t = max(next_t + cfg.interval, now)
        if now - t0 > cfg.timeout:
            raise TimeoutError(f"{cfg.label}: workers not done after {cfg.timeout:.0f} s")
        for rank, p in enumerate(procs):
            if p.exitcode is not None and rank not in done:
                raise RuntimeError(f"{cfg.label}: worker {rank} exited with code {p.exitcode}")
        try:
            msg = events.get(timeout=max(0.01, next_t - time.monotonic()))
        except queue.Empty:
            continue
        handle(msg)
        while True:  # drain whatever else arrived
            try:
                handle(events.get_nowait())
            except queue.Empty:
                break

    end = sample()
    end["final"] = True
    worker_pids = set(pids.values())
    aux: list[Json] = []
    for pid in child_pids(main_pid):
        if pid not in worker_pids:
            aux.append({"pid": pid, "cmd": cmdline(pid), "mem": read_mem(pid)})
    worker_end: list[Mem | None] = end["workers"]
    return {
        "start_s": round(start_s, 3),
        "ready_s": [round(ready[r], 3) for r in range(cfg.workers)],
        "done_s": [round(done[r], 3) for r in range(cfg.workers)],
        "iterate_s": round(max(done[r] - ready[r] for r in range(cfg.workers)), 3),
        "checksums": [checksums[r] for r in range(cfg.workers)],
        "main_pid": main_pid,
        "worker_pids": [pids[r] for r in range(cfg.workers)],
        "end": {"main": end["main"], "workers": worker_end, "aux": aux},
        "total_pss_end": end["total_pss"],
        "max_worker_uss_end": max(sum_field([m], "uss") for m in worker_end),
        "mean_worker_pss_end": sum_field(worker_end, "pss") // cfg.workers,
        "aux_pss_end": sum_field([a["mem"] for a in aux], "pss"),
        "peak_total_pss": max(rec["total_pss"] for rec in series),
        "peak_worker_uss": max(sum_field([m], "uss") for rec in series for m in rec["workers"]),
        "series": series,
    }


def drive(cfg: RunConfig) -> Json:
    """Run one configuration in this (fresh) process; the caller is the orchestrator."""
    ctx = mp.get_context(cfg.method)
    if cfg.method == "forkserver":
        # As in the study: the server imports the heavy modules once and the workers share them
        # copy-on-write. (Python 3.11's default preload of __main__ does not take effect.)
        ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    t = time.perf_counter()
    ds, data_bytes = build_container(cfg.container, cfg.n, cfg.seed, cfg.arena_dir)
    build_s = time.perf_counter() - t
    gc.collect()
    result: Json = {
        **asdict(cfg),
        "label": cfg.label,
        "data_bytes": data_bytes,
        "arena_path": getattr(ds, "path", None),
        "build_s": round(build_s, 3),
        "main_pre": read_mem(os.getpid()),
    }
    release = ctx.Event()
    events = ctx.Queue()
    procs: list[BaseProcess] = []
    try:
        result.update(measure(cfg, ctx, ds, events, release, procs))
        result["exitcodes"] = stop_workers(procs, release, graceful=True)
        if isinstance(ds, ferrofeed.SharedList):
            result["arena_file_bytes"] = os.path.getsize(ds.path)
    finally:
        stop_workers(procs, release, graceful=False)
        events.close()
        events.cancel_join_thread()
        if isinstance(ds, ferrofeed.SharedList):
            ds.close()
    return result


def driver_entry(cfg_json: str) -> int:
    signal.signal(signal.SIGTERM, raise_system_exit)  # run the finally blocks on terminate
    cfg = RunConfig(**json.loads(cfg_json))
    try:
        result = drive(cfg)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # reported by the orchestrator, which goes on
        result = {
            **asdict(cfg),
            "label": cfg.label,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
        }
    Path(cfg.result_path).write_text(json.dumps(result))
    return 0 if "error" not in result else 1


def run_config(cfg: RunConfig) -> Json:
    """Run one configuration in a fresh driver interpreter and return its result."""
    cmd = [sys.executable, str(Path(__file__).resolve()), DRIVER_FLAG, json.dumps(asdict(cfg))]
    proc = subprocess.Popen(cmd)
    try:
        rc = proc.wait(cfg.timeout + 300.0)
    except subprocess.TimeoutExpired:
        stop_process(proc, grace=0.0)
        return {**asdict(cfg), "label": cfg.label, "error": "driver timed out"}
    except KeyboardInterrupt:
        stop_process(proc, grace=15.0)
        raise
    except BaseException:
        stop_process(proc, grace=0.0)
        raise
    path = Path(cfg.result_path)
    if not path.exists():
        return {**asdict(cfg), "label": cfg.label, "error": f"driver exited with code {rc}"}
    result: Json = json.loads(path.read_text())
    return result


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def compute_targets(results: list[Json]) -> list[Json]:
    by_label = {r["label"]: r for r in results if "error" not in r}
    targets = []
    for method in dict.fromkeys(r["method"] for r in results):
        sl, base = by_label.get(f"{method}/shared"), by_label.get(f"{method}/baseline")
        if sl is None or base is None:
            continue
        expected = sl["data_bytes"] + base["total_pss_end"]
        ratio = sl["total_pss_end"] / expected
        targets.append(
            {
                "method": method,
                "total_pss": sl["total_pss_end"],
                "arena_bytes": sl["data_bytes"],
                "footprint_pss": base["total_pss_end"],
                "expected": expected,
                "ratio": round(ratio, 4),
                "within_10pct": abs(ratio - 1.0) <= PSS_TARGET,
                "target_applies": method == "spawn",
                "worker_uss_excess": sl["max_worker_uss_end"] - base["max_worker_uss_end"],
            }
        )
    return targets


def report(
    args: argparse.Namespace,
    info: Json,
    results: list[Json],
    targets: list[Json],
    latency: Json | None,
) -> str:
    out: list[str] = []
    out.append(
        f"ferrofeed RAM study: N={args.n:,} COCO-like annotations, {args.workers} workers, "
        f"{args.passes} passes"
    )
    out.append(
        f"machine: {info['cpu_model']}, {info['cpu_count']} cores, "
        f"{info['mem_total_bytes'] / 2**30:.1f} GiB, Python {info['python']}, "
        f"ferrofeed {info['ferrofeed']}, numpy {info['numpy']}"
    )
    load = [info["loadavg_start"][0], info.get("loadavg_end", [0.0])[0]]
    if max(load) > 0.5 * (info["cpu_count"] or 1):
        out.append(
            f"WARNING: the machine was busy (load average {load[0]:.2f} at start, "
            f"{load[1]:.2f} at end): timings are noisy; memory figures are not affected"
        )
    out.append("")
    if results:
        out.append("Memory (MiB; PSS summed over main + workers at the end, after all passes)")
        header = [
            "method",
            "container",
            "data",
            "main pre",
            "total PSS",
            "peak PSS",
            "max wkr USS",
            "avg wkr PSS",
            "aux PSS",
            "build s",
            "start s",
            "iter s",
        ]
        rows = []
        for r in results:
            if "error" in r:
                rows.append(
                    [
                        r["method"],
                        CONTAINER_NAMES[r["container"]],
                        f"FAILED: {r['error']}"[:60],
                        *[""] * 9,
                    ]
                )
                continue
            main_pre = r["main_pre"]["pss"] if r.get("main_pre") else None
            rows.append(
                [
                    r["method"],
                    CONTAINER_NAMES[r["container"]],
                    mib(r["data_bytes"]),
                    mib(main_pre),
                    mib(r["total_pss_end"]),
                    mib(r["peak_total_pss"]),
                    mib(r["max_worker_uss_end"]),
                    mib(r["mean_worker_pss_end"]),
                    mib(r["aux_pss_end"]),
                    f"{r['build_s']:.1f}",
                    f"{r['start_s']:.1f}",
                    f"{r['iterate_s']:.1f}",
                ]
            )
        out.append(render(header, rows, left=2))
        out.append(
            "  data: arena file (SharedList) / serialized array (Numpy); main pre: main "
            "PSS before workers start;"
        )
        out.append(
            "  aux: forkserver / resource_tracker processes (not in the totals); "
            "iter s: slowest worker's read time"
        )
        out.append("")
    for t in targets:
        verdict = "PASS" if t["within_10pct"] else "FAIL"
        if not t["target_applies"]:
            verdict += " (informational)"
        out.append(
            f"SharedList/{t['method']}: total PSS {mib(t['total_pss'])} MiB vs arena "
            f"{mib(t['arena_bytes'])} + import footprint {mib(t['footprint_pss'])} = "
            f"{mib(t['expected'])} MiB -> {t['ratio']:.3f}x (target within 10%): {verdict}; "
            f"worker USS over baseline {mib(t['worker_uss_excess'])} MiB"
        )
    if targets:
        out.append("")
    if latency is not None:
        med = latency["median_ns"]
        out.append(
            f"Random access ({latency['iters']:,} ops over a random permutation of "
            f"{latency['n']:,} items, {latency['mean_item_bytes']:.0f} B/item; "
            f"median of {latency['repeats']} repeats, ns/op incl. loop)"
        )
        rows = []
        base = med["pickle.loads(bytes)"]
        for name, v in med.items():
            rows.append([name, f"{v:,.1f}", f"{v / base:.3f}" if name != "empty loop" else ""])
        out.append(render(["operation", "ns/op", "vs loads"], rows))
        ratio_verdict = "PASS" if latency["getitem_ratio_pass"] else "FAIL"
        raw_verdict = "PASS" if latency["raw_pass"] else "FAIL"
        out.append(
            f"SharedList[i] / pickle.loads = {latency['getitem_vs_loads_ratio']:.3f} "
            f"(net of loop {latency['getitem_vs_loads_ratio_net_of_loop']:.3f}; "
            f"target <= {GETITEM_RATIO_TARGET}): {ratio_verdict}"
        )
        out.append(
            f"SharedList.raw(i) = {med['SharedList.raw(i)']:.1f} ns "
            f"(target < {RAW_TARGET_NS:.0f}): {raw_verdict}"
        )
        out.append("")
        out.append("Checks")
        for c in latency["checks"]:
            show = c["detail"] and (not c["ok"] or c.get("show"))
            detail = f"  [{c['detail']}]" if show else ""
            out.append(f"  {'ok  ' if c['ok'] else 'FAIL'}  {c['name']}{detail}")
    consistency = checksum_check(results)
    if consistency is not None:
        out.append(
            f"  {'ok  ' if consistency['ok'] else 'FAIL'}  {consistency['name']}"
            + ("" if consistency["ok"] else f"  [{consistency['detail']}]")
        )
    return "\n".join(out)


def checksum_check(results: list[Json]) -> Json | None:
    """All workers of all non-baseline configurations must have read identical data."""
    sums = {
        r["label"]: sorted(set(r["checksums"]))
        for r in results
        if "error" not in r and r["container"] != "baseline"
    }
    if not sums:
        return None
    distinct = {tuple(v) for v in sums.values()}
    return {
        "name": "workers of all containers read identical data (sum of dumps sizes)",
        "ok": len(distinct) == 1 and all(len(v) == 1 for v in sums.values()),
        "detail": json.dumps(sums),
    }


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="RAM of multi-process loaders: NaiveList vs NumpySerializedList vs "
        "ferrofeed.SharedList (fork / spawn), plus random-access latency."
    )
    p.add_argument("--n", type=int, default=None, help="items (default 300000; --quick: 20000)")
    p.add_argument("--passes", type=int, default=None, help="passes per worker (default 2)")
    p.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    add_run_options(p, timeout=1800.0, quick="small smoke run (< 30 s)")
    p.add_argument("--all-methods", action="store_true", help="also run forkserver")
    p.add_argument(
        "--containers",
        default=",".join(CONTAINERS),
        help=f"comma-separated subset of {','.join(CONTAINERS)}",
    )
    p.add_argument("--interval", type=float, default=0.5, help="sampling interval, s")
    p.add_argument(
        "--latency-iters",
        type=int,
        default=None,
        help="random accesses per repeat (default 200000; --quick: 20000)",
    )
    p.add_argument("--repeats", type=int, default=5, help="latency repeats (median reported)")
    p.add_argument("--skip-ram", action="store_true", help="only the latency part")
    p.add_argument("--skip-latency", action="store_true", help="only the memory part")
    p.add_argument(
        "--shm-dir",
        default="/dev/shm" if os.path.isdir("/dev/shm") else None,
        help="where the arenas go (a private temp dir is made inside)",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    args = p.parse_args(argv)
    if args.n is None:
        args.n = 20_000 if args.quick else 300_000
    if args.passes is None:
        args.passes = 1 if args.quick else 2
    if args.latency_iters is None:
        args.latency_iters = 20_000 if args.quick else 200_000
    args.containers = [c.strip() for c in args.containers.split(",") if c.strip()]
    unknown = set(args.containers) - set(CONTAINERS)
    if unknown:
        p.error(f"unknown containers: {sorted(unknown)}")
    if args.n < 1 or args.workers < 1 or args.passes < 1 or args.latency_iters < 1:
        p.error("--n, --workers, --passes and --latency-iters must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [DRIVER_FLAG]:
        return driver_entry(argv[1])
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, raise_system_exit)  # clean up (drivers, temp dir) on kill
    info = machine_info()
    methods = ["fork", "spawn"] + (["forkserver"] if args.all_methods else [])
    tmpdir = tempfile.mkdtemp(prefix="ferrofeed-ram-study-", dir=args.shm_dir)
    t_start = time.perf_counter()
    results: list[Json] = []
    latency: Json | None = None
    try:
        if not args.skip_ram:
            # What every configuration takes from the command line as it is given.
            given = ("n", "seed", "workers", "passes", "interval", "timeout")
            configs = [
                RunConfig(
                    container=c,
                    method=m,
                    arena_dir=tmpdir,
                    result_path=os.path.join(tmpdir, f"result-{m}-{c}.json"),
                    **{k: getattr(args, k) for k in given},
                )
                for m in methods
                for c in CONTAINERS
                if c in args.containers or c == "baseline"
            ]
            for k, cfg in enumerate(configs, 1):
                r = run_config(cfg)
                results.append(r)
                if "error" in r:
                    msg = f"FAILED: {r['error']}"
                    if "traceback" in r:
                        print(r["traceback"], file=sys.stderr)
                else:
                    msg = (
                        f"total PSS {mib(r['total_pss_end'])} MiB, max worker USS "
                        f"{mib(r['max_worker_uss_end'])} MiB, {len(r['series'])} samples"
                    )
                    if any(code != 0 for code in r["exitcodes"]):
                        msg += f" (worker exit codes {r['exitcodes']})"
                print(f"[{k}/{len(configs)}] {cfg.label}: {msg}", flush=True)
        if not args.skip_latency:
            print("random-access latency ...", flush=True)
            latency = run_latency(args.n, args.seed, args.latency_iters, args.repeats, tmpdir)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)

    info["loadavg_end"] = loadavg()
    targets = compute_targets(results)
    print()
    print(report(args, info, results, targets, latency))
    doc = {
        "machine": info,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "wall_s": round(time.perf_counter() - t_start, 1),
        "ram": {"configs": results, "targets": targets, "consistency": checksum_check(results)},
        "latency": latency,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print(f"\nJSON: {args.out}  (wall {doc['wall_s']} s)")
    failed = any("error" in r for r in results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
