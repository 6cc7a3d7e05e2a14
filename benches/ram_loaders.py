#!/usr/bin/env python3
"""RAM of real loaders: 2 ranks x 4 workers over 1M COCO-like annotations.

The RAM study's experiment (``reference/000_*.txt``; ``benches/ram_study.py`` reproduces it
with plain ``multiprocessing`` workers) with the loaders themselves, as a DDP job on one node
runs them:

* ``--ranks`` rank processes (fresh interpreters, as torchrun starts them, with
  ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``/``RANK``/``WORLD_SIZE`` set), each importing torch (a
  training process does) and building its dataset the way a user would:

  - ferrofeed: ``SharedList.shared(build, name=...)``: local rank 0 builds the arena from
    the generator, the other ranks wait for it and map it (``SharedList.open``);
    ``ferrofeed.DataLoader(shared_list, batch_size, shuffle=True, collate=coco_collate,
    num_workers=--workers, worker_start_method=METHOD, persistent_workers=True, rank=r,
    world_size=R)``;
  - PyTorch: every rank builds its own Python list of the dicts (as ``json.load`` would);
    ``torch.utils.data.DataLoader(the_list, batch_size, sampler=DistributedSampler(...),
    collate_fn=coco_collate, num_workers=--workers, multiprocessing_context=METHOD,
    persistent_workers=True)``;

* ``__getitem__`` returns the annotation dict; the same ``coco_collate`` in both loaders
  reduces a batch to NumPy arrays, touching every field of every item (so with a Python
  list every object's reference count is written, as any Python code reading it does);
* each rank iterates ``--epochs`` epochs over its shard and keeps its workers alive until
  the last sample has been taken;
* this process (the "launcher", not counted, like torchrun's agent) samples PSS of every
  process in the ranks' trees (ranks, workers, forkserver and resource-tracker processes)
  every ``--interval`` seconds from ``/proc/PID/smaps_rollup``;
* a "baseline" run of each loader and start method (same imports, same loader, a dataset
  of ``ranks x workers x batch_size`` items, so that each worker loads one batch) gives
  the job's own footprint (interpreters, imported modules, worker start-up, buffers).

Targets (issue 10), per start method, on the steady total PSS (median over the last epoch,
when every rank is iterating, through the final sample):

* ferrofeed within 10% of one copy of the data (the arena file) + the baseline footprint;
  reported as measured, and with the libraries' file-backed PSS taken from the data run on
  both sides (PSS divides a library's pages among every process on the machine that maps
  them, so other jobs importing the same torch move that part between two runs);
* ferrofeed <= 0.5x PyTorch's DataLoader over a Python list (a PyTorch run stopped by the
  memory floor counts with its peak so far, a lower bound: the ratio is then an upper bound).

Run ``python benches/ram_loaders.py`` (full: 1M items, fork and forkserver) or ``--quick``
(a smoke run, < 1 min). Other scripts call `run_loader_ram`. A memory floor
(``--mem-floor-gib``) stops a configuration whose tree leaves less than that much memory
available; its figures are then lower bounds, marked as such.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:  # imported from another directory (benches/compare.py)
    sys.path.insert(0, str(BENCH_DIR))

from _ram_common import (  # noqa: E402  (after the sys.path line above)
    Json,
    Mem,
    cmdline,
    machine_info,
    meminfo,
    mib,
    process_tree,
    raise_system_exit,
    smaps_rollup,
    stop_process,
)
from _ram_loaders_report import format_report, results  # noqa: E402
from _ram_rank import EVENT_PREFIX, RANK_BOOT, RankConfig  # noqa: E402
from _rounds import LOCAL_RESULTS, add_run_options, subset  # noqa: E402

DEFAULT_OUT = LOCAL_RESULTS / "ram_loaders.json"
LOADERS = ("ferrofeed", "torch")
METHODS = ("fork", "forkserver", "spawn")
SPLIT_FIELDS = ("uss", "pss_anon", "pss_file", "pss_shmem")
FULL = {"n": 1_000_000, "epochs": 2, "batch_size": 256}
QUICK = {"n": 20_000, "epochs": 1, "batch_size": 128, "workers": 2}


# --------------------------------------------------------------------------------------------
# The launcher: one configuration (all ranks), sampled
# --------------------------------------------------------------------------------------------


def read_rollup(pid: int) -> Mem | None:
    """``/proc/PID/smaps_rollup`` (PSS, USS and PSS by backing), None when ``pid`` is gone."""
    try:
        return smaps_rollup(pid)
    except (OSError, ValueError):
        return None


def _role(pid: int, depth: int, ranks: set[int], cmds: dict[int, str]) -> str:
    if pid in ranks:
        return "rank"
    cmd = cmds[pid]
    if "resource_tracker" in cmd:
        return "aux"
    # A forkserver's server is a rank's child; the workers it forks are its children (and
    # carry the same command line).
    if "multiprocessing.forkserver" in cmd and depth == 1:
        return "aux"
    return "worker"


def smaps_profile(pid: int, top: int = 8) -> Json | None:
    """PSS of ``pid`` by mapping (arena file, heap, anonymous, shared libraries...)."""
    groups: dict[str, int] = {}
    current = "?"
    try:
        text = Path(f"/proc/{pid}/smaps").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        head = line.split(maxsplit=5)
        if not head:
            continue
        if "-" in head[0] and not head[0].endswith(":"):  # a mapping's header line
            path = head[5] if len(head) > 5 else ""
            if path.endswith(".arena"):
                current = "SharedList arena (file)"
            elif path.startswith("/memfd:") or path.startswith("/dev/shm/"):
                current = f"shared memory {path.split('/')[-1].split(' ')[0][:40]}"
            elif path.startswith("["):
                current = path
            elif path == "":
                current = "anonymous (Python heap: objects, arenas)"
            elif ".so" in path:
                current = "shared libraries (.so)"
            else:
                current = f"file {Path(path).name}"
        elif head[0] == "Pss:":
            groups[current] = groups.get(current, 0) + int(head[1]) * 1024
    ranked = sorted(groups.items(), key=lambda kv: -kv[1])
    return {"pss": sum(groups.values()), "top": [[k, v] for k, v in ranked[:top]]}


def _reader(rank: int, stream: Any, events: queue.Queue[tuple[int, Json]]) -> None:
    for line in stream:
        if line.startswith(EVENT_PREFIX):
            events.put((rank, json.loads(line[len(EVENT_PREFIX) :])))
        else:
            sys.stderr.write(f"[rank {rank}] {line}")
    events.put((rank, {"ev": "eof", "t": time.time()}))


def run_config(cfg: RankConfig, *, interval: float, mem_floor: int, verbose: bool = True) -> Json:
    """Start the ranks of one configuration, sample their process tree until they are done."""
    env = dict(os.environ)  # PYTHONPATH included: the ranks import the same ferrofeed
    env.update(
        {
            "LOCAL_WORLD_SIZE": str(cfg.ranks),
            "WORLD_SIZE": str(cfg.ranks),
            "MASTER_ADDR": "127.0.0.1",
            "OMP_NUM_THREADS": "1",
        }
    )
    procs: list[subprocess.Popen[str]] = []
    events: queue.Queue[tuple[int, Json]] = queue.Queue()
    state: dict[int, dict[str, Any]] = {r: {} for r in range(cfg.ranks)}
    series: list[Json] = []
    result: Json = {**asdict(replace(cfg, rank=0)), "label": cfg.label}
    t0 = time.time()
    last_epoch = cfg.epochs - 1
    try:
        for r in range(cfg.ranks):
            rank_env = {**env, "LOCAL_RANK": str(r), "RANK": str(r)}
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        RANK_BOOT,
                        str(BENCH_DIR),
                        json.dumps(asdict(replace(cfg, rank=r))),
                    ],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    env=rank_env,
                    start_new_session=True,  # the launcher can end a rank's whole group
                )
            )
            threading.Thread(
                target=_reader, args=(r, procs[-1].stdout, events), daemon=True
            ).start()
        rank_pids = {p.pid for p in procs}

        def sample(final: bool = False) -> Json:
            tree = process_tree(rank_pids)
            cmds = {pid: cmdline(pid) for pid in tree}
            mems: dict[int, Mem | None] = {pid: read_rollup(pid) for pid in tree}
            roles = {pid: _role(pid, d, rank_pids, cmds) for pid, d in tree.items()}
            by_role = dict.fromkeys(("rank", "worker", "aux"), 0)
            for pid, m in mems.items():
                if m is not None:
                    by_role[roles[pid]] += m["pss"]
            live = [m for m in mems.values() if m is not None]
            rec: Json = {
                "t": round(time.time() - t0, 3),
                "total_pss": sum(by_role.values()),
                **{f"{k}_pss": v for k, v in by_role.items()},
                **{f"total_{f}": sum(m[f] for m in live) for f in SPLIT_FIELDS},
                "procs": sum(m is not None for m in mems.values()),
                "steady": all(s.get("last_epoch_started") for s in state.values()),
                "mem_available": meminfo().get("MemAvailable", 0),
            }
            if final:
                rec["final"] = True
                rec["processes"] = [
                    {
                        "pid": pid,
                        "role": roles[pid],
                        "depth": tree[pid],
                        "cmd": cmds[pid][:100],
                        **m,
                    }
                    for pid, m in mems.items()
                    if m is not None
                ]
            series.append(rec)
            return rec

        def handle(rank: int, ev: Json) -> None:
            st = state[rank]
            kind = ev["ev"]
            if kind == "built":
                st["built_s"] = round(ev["t"] - t0, 3)
                st["build_s"] = ev["build_s"]
                st["arena_bytes"] = ev["arena_bytes"]
            elif kind == "first_batch":
                st.setdefault("first_batch_s", []).append(ev["s"])
                if ev["epoch"] == last_epoch:
                    st["last_epoch_started"] = True
            elif kind == "epoch_done":
                st.setdefault("epochs", []).append(
                    {k: ev[k] for k in ("epoch", "s", "batches", "items", "id_sum", "points")}
                )
            elif kind == "done":
                st["done"] = True
            elif kind == "error":
                st["error"] = ev["error"]
                sys.stderr.write(f"[rank {rank}] {ev['traceback']}")
            elif kind == "eof":
                st["eof"] = True

        sample()
        next_t = time.monotonic() + interval
        deadline = time.monotonic() + cfg.timeout
        while not all(s.get("done") for s in state.values()):
            now = time.monotonic()
            if now >= next_t:
                rec = sample()
                next_t = max(next_t + interval, now)
                if rec["mem_available"] and rec["mem_available"] < mem_floor:
                    result["aborted"] = (
                        f"memory available fell to {mib(rec['mem_available'])} MiB (floor "
                        f"{mib(mem_floor)} MiB) at a total PSS of {mib(rec['total_pss'])} MiB: "
                        "stopped; its figures are lower bounds"
                    )
                    break
            if now > deadline:
                raise TimeoutError(f"{cfg.label}: not done after {cfg.timeout:.0f} s")
            failed = [r for r, s in state.items() if s.get("error") or s.get("eof")]
            if failed:
                r = failed[0]
                raise RuntimeError(
                    f"{cfg.label}: rank {r} failed: "
                    f"{state[r].get('error') or f'exited with code {procs[r].poll()}'}"
                )
            with contextlib.suppress(queue.Empty):
                handle(*events.get(timeout=max(0.01, next_t - time.monotonic())))
                while True:
                    handle(*events.get_nowait())
        if "aborted" not in result:
            final = sample(final=True)
            result["processes_end"] = final.pop("processes")
            result["profiles"] = _profiles(result["processes_end"], rank_pids)
        result["ok"] = "aborted" not in result
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["ok"] = False
    except BaseException:  # Ctrl-C, SIGTERM: end the ranks at once, then stop
        result["error"] = "interrupted"
        raise
    finally:
        for p in procs:  # release the ranks; they end their workers and exit
            with contextlib.suppress(OSError):
                assert p.stdin is not None
                p.stdin.write("release\n")
                p.stdin.close()
        hard = "aborted" in result or "error" in result
        for p in procs:
            if hard:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            stop_process(p, grace=60.0)  # type: ignore[arg-type]
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # anything the rank left behind
    result["ranks"] = [state[r] for r in range(cfg.ranks)]
    result["exit_codes"] = [p.returncode for p in procs]
    result.update(_summarise(series, cfg))
    result["series"] = series
    if verbose:
        print(f"  {cfg.label}: {_one_line(result)}", flush=True)
    return result


def _profiles(processes: list[Json], rank_pids: set[int]) -> Json:
    """smaps of rank 0's main process and of its first worker, by mapping."""
    out: Json = {}
    ranks = sorted(rank_pids)
    if ranks:
        out["rank0"] = smaps_profile(ranks[0])
    workers = [p["pid"] for p in processes if p["role"] == "worker"]
    if workers:
        out["worker"] = smaps_profile(min(workers))
    return out


def _summarise(series: list[Json], cfg: RankConfig) -> Json:
    if not series:
        return {}
    totals = [s["total_pss"] for s in series]
    steady = [s["total_pss"] for s in series if s["steady"]]
    # Without file-backed pages (libraries: their PSS shrinks when processes outside the
    # job map the same files, e.g. other jobs importing the same torch).
    nonfile = [s["total_pss"] - s["total_pss_file"] for s in series if s["steady"]]
    return {
        "samples": len(series),
        "peak_total_pss": max(totals),
        "steady_total_pss": int(statistics.median(steady)) if steady else None,
        "steady_samples": len(steady),
        "steady_total_pss_nonfile": int(statistics.median(nonfile)) if nonfile else None,
        "peak_total_pss_nonfile": max(s["total_pss"] - s["total_pss_file"] for s in series),
        "end_total_pss": series[-1]["total_pss"] if series[-1].get("final") else None,
        "peak_rank_pss": max(s["rank_pss"] for s in series),
        "peak_worker_pss": max(s["worker_pss"] for s in series),
        "wall_s": series[-1]["t"],
    }


def _one_line(r: Json) -> str:
    if r.get("error"):
        return f"FAILED: {r['error']}"
    text = (
        f"peak {mib(r.get('peak_total_pss'))} MiB, steady {mib(r.get('steady_total_pss'))} MiB "
        f"({r.get('steady_samples', 0)} samples), {r.get('wall_s', 0):.0f} s"
    )
    if r.get("aborted"):
        text += f"; ABORTED: {r['aborted']}"
    return text


# --------------------------------------------------------------------------------------------
# The experiment
# --------------------------------------------------------------------------------------------


def torch_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def run_loader_ram(
    n: int | None = None,
    ranks: int = 2,
    workers: int | None = None,
    methods: Sequence[str] = ("fork", "forkserver"),
    quick: bool = False,
    *,
    loaders: Sequence[str] = LOADERS,
    repeats: int = 1,
    epochs: int | None = None,
    batch_size: int | None = None,
    seed: int = 0,
    interval: float = 0.5,
    timeout: float = 1800.0,
    mem_floor_gib: float = 3.0,
    shm_dir: str | None = None,
    verbose: bool = True,
    partial_out: Path | None = None,
) -> Json:
    """Run the experiment; return the results (configurations, summary, targets, checks).

    ``n``, ``workers``, ``epochs`` and ``batch_size`` default to 1,000,000, 4, 2 and 256
    (``quick``: 20,000, 2, 1 and 128). Each (start method, loader) runs as a baseline and
    with the data, ``repeats`` rounds, the order rotated each round. PyTorch's loader is
    left out (and said so in ``notes``) where torch is not installed. With
    ``partial_out``, the results so far are written there after each configuration
    (``--report`` renders such a file).

    The returned dict has ``machine``, ``params``, ``configs`` (one per run, with the time
    series), ``summary`` (per method and loader: median peak / steady / end total PSS and
    the baseline's), ``targets`` (per method: ratio to one copy + footprint, ratio to
    PyTorch, met or not), ``checks`` and ``notes``; `format_report` renders it.
    """
    preset = QUICK if quick else FULL
    n = preset["n"] if n is None else n
    epochs = preset["epochs"] if epochs is None else epochs
    workers = preset.get("workers", 4) if workers is None else workers
    batch_size = preset["batch_size"] if batch_size is None else batch_size
    bad = [m for m in methods if m not in METHODS]
    if bad or min(n, ranks, workers, epochs, batch_size, repeats) < 1:
        raise ValueError(f"bad arguments: methods {bad}, n/ranks/workers/epochs/batch >= 1")
    notes: list[str] = []
    have_torch = torch_available()
    loaders = [x for x in loaders if x in LOADERS]
    if "torch" in loaders and not have_torch:
        loaders = [x for x in loaders if x != "torch"]
        notes.append("torch is not installed: PyTorch's DataLoader was not measured")
    info = machine_info()
    if have_torch:
        import importlib.metadata

        info["torch"] = importlib.metadata.version("torch")
    baseline_n = ranks * workers * batch_size
    shm = shm_dir or ("/dev/shm" if os.path.isdir("/dev/shm") else None)
    tmpdir = tempfile.mkdtemp(prefix="ferrofeed-ram-loaders-", dir=shm)
    configs: list[Json] = []
    t_start = time.perf_counter()
    params: Json = {
        "n": n,
        "ranks": ranks,
        "workers": workers,
        "methods": list(methods),
        "loaders": list(loaders),
        "repeats": repeats,
        "epochs": epochs,
        "batch_size": batch_size,
        "baseline_n": baseline_n,
        "seed": seed,
        "interval": interval,
        "quick": quick,
    }
    try:
        plan = [(m, lo, b) for m in methods for lo in loaders for b in (True, False)]
        for rep in range(repeats):
            # Alternate: every other round runs the configurations in the reverse order.
            for i, (method, loader, baseline) in enumerate(plan if rep % 2 == 0 else plan[::-1]):
                cfg = RankConfig(
                    loader=loader,
                    method=method,
                    baseline=baseline,
                    n=baseline_n if baseline else n,
                    ranks=ranks,
                    workers=workers,
                    epochs=epochs,
                    batch_size=batch_size,
                    seed=seed,
                    import_torch=have_torch,
                    arena_dir=tmpdir,
                    name=f"ram-loaders-{os.getpid()}-{rep}-{i}",
                    timeout=timeout,
                )
                if verbose:
                    print(f"[round {rep + 1}/{repeats}] {cfg.label} ...", flush=True)
                r = run_config(
                    cfg, interval=interval, mem_floor=int(mem_floor_gib * 2**30), verbose=verbose
                )
                r["round"] = rep
                configs.append(r)
                if partial_out is not None:
                    partial_out.parent.mkdir(parents=True, exist_ok=True)
                    partial_out.write_text(json.dumps(results(info, params, configs, notes, 0.0)))
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return results(info, params, configs, notes, time.perf_counter() - t_start)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--n", type=int, default=None, help="items (default 1,000,000; --quick 20,000)")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--workers", type=int, default=None, help="per rank (default 4; --quick 2)")
    p.add_argument("--epochs", type=int, default=None, help="default 2 (--quick: 1)")
    p.add_argument("--batch-size", type=int, default=None, help="default 256 (--quick: 128)")
    p.add_argument("--methods", default="fork,forkserver", help="comma-separated start methods")
    p.add_argument("--loaders", default=",".join(LOADERS), help="comma-separated: ferrofeed,torch")
    p.add_argument("--repeats", type=int, default=1, help="rounds, the order rotated each")
    add_run_options(p, timeout=1800.0, quick="a smoke run (< 1 min)")
    p.add_argument("--interval", type=float, default=0.5, help="sampling interval, s")
    p.add_argument(
        "--mem-floor-gib",
        type=float,
        default=3.0,
        help="stop a configuration when the machine's available memory falls below this",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    p.add_argument(
        "--report", type=Path, default=None, help="only render a results file (even a partial one)"
    )
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.report is not None:
        doc = json.loads(args.report.read_text())
        doc = results(doc["machine"], doc["params"], doc["configs"], doc["notes"], doc["wall_s"])
        print(format_report(doc))
        return 0
    # SIGTERM ends the run as Ctrl-C does: the ranks' process groups are killed, the arenas
    # removed.
    signal.signal(signal.SIGTERM, raise_system_exit)
    partial = args.out.with_suffix(".partial.json")
    # The options run_loader_ram takes as they are given.
    given = ("n", "ranks", "workers", "quick", "repeats", "epochs", "batch_size", "seed")
    res = run_loader_ram(
        methods=subset(args.methods, METHODS, "start methods", p),
        loaders=subset(args.loaders, LOADERS, "loaders", p),
        partial_out=partial,
        **{k: getattr(args, k) for k in (*given, "interval", "timeout", "mem_floor_gib")},
    )
    print()
    print(format_report(res))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    partial.unlink(missing_ok=True)
    print(f"\nJSON: {args.out}  (wall {res['wall_s']} s)")
    return 0 if all(c["ok"] for c in res["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
