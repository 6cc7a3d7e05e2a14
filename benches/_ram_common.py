"""What the RAM benchmarks share (benches/ram_study.py, benches/ram_loaders.py): the COCO-like
annotations they hold, reading a process's memory (``ferrofeed.memory.process_memory`` and
``/proc``: smaps_rollup, meminfo, a process tree), the machine they ran on, text tables,
and stopping a driver process cleanly.
"""

from __future__ import annotations

import contextlib
import os
import platform
import random
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import ferrofeed
import numpy as np
from _runs import parent_pids
from bench_machine import cpu_model, loadavg
from ferrofeed.memory import process_memory

MIB = 1 << 20
MEM_FIELDS = ("rss", "pss", "uss", "shared", "swap")

Mem = dict[str, int]
Json = dict[str, Any]


def coco_annotations(n: int, seed: int = 0) -> Iterator[dict[str, Any]]:
    """Yield ``n`` deterministic COCO-like instance annotations (polygon segmentation)."""
    rng = random.Random(seed)
    uniform, randint = rng.uniform, rng.randint
    for k in range(n):
        w = round(uniform(2.0, 320.0), 2)
        h = round(uniform(2.0, 320.0), 2)
        x = round(uniform(0.0, 640.0 - w), 2)
        y = round(uniform(0.0, 480.0 - h), 2)
        polygon: list[float] = []
        for _ in range(randint(10, 30)):  # 20..60 coordinates
            polygon.append(round(x + uniform(0.0, w), 2))
            polygon.append(round(y + uniform(0.0, h), 2))
        yield {
            "id": k + 1,
            "image_id": 1 + k // 7,
            "category_id": randint(1, 90),
            "bbox": [x, y, w, h],
            "area": round(w * h * uniform(0.35, 0.95), 4),
            "iscrowd": 1 if rng.random() < 0.01 else 0,
            "segmentation": [polygon],
        }


def read_mem(pid: int) -> Mem | None:
    """PSS/USS/... of ``pid`` in bytes, or None when the process is gone."""
    try:
        m = process_memory(pid)
    except (OSError, LookupError, ValueError):
        return None
    return {f: int(getattr(m, f)) for f in MEM_FIELDS}


def process_tree(roots: Iterable[int]) -> dict[int, int]:
    """``roots`` and all their live descendants, each with its depth (0 for a root)."""
    children: dict[int, list[int]] = {}
    for pid, parent in parent_pids().items():
        children.setdefault(parent, []).append(pid)
    depth = {pid: 0 for pid in roots}
    todo = list(depth)
    while todo:
        pid = todo.pop()
        for child in children.get(pid, ()):
            if child not in depth:
                depth[child] = depth[pid] + 1
                todo.append(child)
    return depth


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes (MemTotal, MemAvailable, ...); empty where unreadable."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                out[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def cmdline(pid: int) -> str:
    """The command line of ``pid`` (its first 160 characters), ``?`` when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:160]


def smaps_rollup(pid: int) -> Mem:
    """Parse /proc/PID/smaps_rollup in Python (cross-checks ferrofeed.memory; adds Anonymous)."""
    kb: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            kb[key.strip()] = int(parts[0]) * 1024
    return {
        "rss": kb.get("Rss", 0),
        "pss": kb.get("Pss", 0),
        "uss": kb.get("Private_Clean", 0) + kb.get("Private_Dirty", 0),
        "shared": kb.get("Shared_Clean", 0) + kb.get("Shared_Dirty", 0),
        "swap": kb.get("Swap", 0),
        "anonymous": kb.get("Anonymous", 0),
        # PSS split by backing (Linux >= 5.9): private/anonymous, file pages (libraries),
        # shmem (tmpfs files such as /dev/shm arenas, memfds)
        "pss_anon": kb.get("Pss_Anon", 0),
        "pss_file": kb.get("Pss_File", 0),
        "pss_shmem": kb.get("Pss_Shmem", 0),
    }


def machine_info() -> Json:
    """The machine, the interpreter, ferrofeed's and NumPy's versions, the load and the time."""
    mem_total = meminfo().get("MemTotal", 0)
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)),
        "mem_total_bytes": mem_total,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "ferrofeed": getattr(ferrofeed, "__version__", "unknown"),
        "numpy": np.__version__,
        "loadavg_start": loadavg(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def mib(b: float | None) -> str:
    """Bytes as MiB with one decimal, ``-`` for None."""
    return "-" if b is None else f"{b / MIB:,.1f}"


def render(header: list[str], rows: list[list[str]], left: int = 1) -> str:
    """A plain-text table: the first ``left`` columns aligned left, the others right."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def raise_system_exit(signum: int, _frame: FrameType | None) -> None:
    """A signal handler (SIGTERM's) that ends the process as ``sys.exit`` does, so that
    its ``finally`` blocks run."""
    raise SystemExit(128 + signum)


def stop_process(proc: subprocess.Popen[bytes], grace: float) -> None:
    """Stop a driver: wait ``grace`` s (after Ctrl-C it got the SIGINT too and cleans up by
    itself), then SIGTERM (the driver turns it into SystemExit and cleans up), then SIGKILL."""
    for sig, wait_s in ((None, grace), (signal.SIGTERM, 15.0), (signal.SIGKILL, None)):
        if proc.poll() is not None:
            return
        if sig is not None:
            proc.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait_s)
