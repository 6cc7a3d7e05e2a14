"""Where a child's CPU goes, thread by thread (benches/scaling.py): ferrofeed's decode pool
(threads named `POOL_PREFIX`-<i>) against everything else, from ``/proc/self/task``; and the
CPU of the whole process tree, worker processes included.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, NamedTuple

from _runs import cpu_children, cpu_self, stat_fields, tree_pids

POOL_PREFIX = "ferrofeed-cpu"  # the decode pool's threads, "ferrofeed-cpu-<i>" (comm: 15 chars)
CLK_TCK = os.sysconf("SC_CLK_TCK")


class ThreadSample(NamedTuple):
    """One thread's name and times so far (seconds)."""

    comm: str
    cpu_s: float
    wait_s: float | None  # time runnable but waiting for a core (schedstat), None without it


def thread_samples() -> dict[int, ThreadSample]:
    """Every live thread of this process: ``{tid: ThreadSample}``.

    CPU and wait times from ``/proc/self/task/TID/schedstat`` (ns: time on a CPU, time
    waiting on a run queue), else the CPU time from ``stat`` (utime + stime, in clock ticks).
    """
    out: dict[int, ThreadSample] = {}
    for entry in os.listdir("/proc/self/task"):
        base = f"/proc/self/task/{entry}"
        try:
            comm = Path(f"{base}/comm").read_text().strip()
            stat = Path(f"{base}/stat").read_text()
        except OSError:
            continue  # it ended meanwhile
        wait: float | None = None
        try:
            on_cpu, waited = Path(f"{base}/schedstat").read_text().split()[:2]
            cpu, wait = int(on_cpu) / 1e9, int(waited) / 1e9
        except (OSError, ValueError):
            fields = stat_fields(stat)
            cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
        out[int(entry)] = ThreadSample(comm, cpu, wait)
    return out


def _proc_cpu_s(pid: int) -> float:
    """CPU seconds of process ``pid`` and its reaped children (``stat``), 0 when it is gone."""
    try:
        fields = stat_fields(Path(f"/proc/{pid}/stat").read_text())
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / CLK_TCK  # utime, stime, cutime, cstime


def tree_cpu_s() -> float:
    """CPU seconds of this process tree so far: this process (all its threads), its reaped
    children, and its live descendants (worker processes)."""
    me = os.getpid()
    return cpu_self() + cpu_children() + sum(_proc_cpu_s(p) for p in tree_pids(me) if p != me)


def thread_figures(
    before: dict[int, ThreadSample],
    after: dict[int, ThreadSample],
    *,
    main_tid: int,
    process_cpu_s: float,
    wall_s: float,
    threads: int,
) -> dict[str, Any]:
    """Where the process's CPU went between two `thread_samples`, and how busy the decode
    pool's threads were.

    ``process_cpu_s`` is the process's CPU over the same span (``getrusage``: it counts the
    threads that ended in between, which the samples cannot). The pool's threads are those
    named `POOL_PREFIX`; its threads at work are ``min(threads, the pool's threads)``.
    """

    def delta(tid: int) -> tuple[float, float | None]:
        a, b = after[tid], before.get(tid)
        if b is None or b.comm != a.comm:  # started in between (or a reused tid)
            b = ThreadSample(a.comm, 0.0, None if a.wait_s is None else 0.0)
        wait = None if a.wait_s is None or b.wait_s is None else a.wait_s - b.wait_s
        return a.cpu_s - b.cpu_s, wait

    by_name: dict[str, float] = {}
    pool_cpu, pool_wait, pool_threads = 0.0, 0.0, 0
    waits_known = True
    for tid, sample in after.items():
        cpu, wait = delta(tid)
        name = "main" if tid == main_tid else re.sub(r"-\d+$", "", sample.comm)
        by_name[name] = by_name.get(name, 0.0) + cpu
        if sample.comm.startswith(POOL_PREFIX):
            pool_threads += 1
            pool_cpu += cpu
            if wait is None:
                waits_known = False
            else:
                pool_wait += wait
    # Threads that ended between the samples (an epoch's pipeline threads): the rest.
    by_name["ended in between"] = max(0.0, process_cpu_s - sum(by_name.values()))
    lanes = min(threads, pool_threads)
    busy = pool_cpu / (wall_s * lanes) if lanes and wall_s > 0 else None
    return {
        "pool_threads": pool_threads,
        "pool_cpu_s": pool_cpu,
        "pool_wait_s": pool_wait if waits_known else None,
        "cpu_by_thread": {k: round(v, 4) for k, v in sorted(by_name.items())},
        "pool_busy": busy,
        "pool_runnable": (
            (pool_cpu + pool_wait) / (wall_s * lanes) if busy is not None and waits_known else None
        ),
        "serial_share": (
            min(1.0, max(0.0, process_cpu_s - pool_cpu) / process_cpu_s)
            if process_cpu_s > 0
            else None
        ),
        "decode_in_pool": process_cpu_s > 0 and pool_cpu >= 0.5 * process_cpu_s,
    }
