"""One run of a benchmark: one configuration in a fresh interpreter (`run_fresh`, and
`run_script`, every script's entry point, in the child), what it reads there (`read_epoch`)
and what it costs: the CPU time and PSS of its process tree (`LoaderCosts`, `PssSampler`).

Like `_common`, importing it imports neither torch nor ferrofeed.
"""

from __future__ import annotations

import contextlib
import gc
import json
import multiprocessing
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from _common import CROP, native_op

CHILD_FLAG = "--_child"


# --- reading an epoch in the child -------------------------------------------------------------


def first_item(batch: Any) -> Any:
    """The images of an ``(images, labels)`` batch."""
    return batch[0]


def read_epoch(
    batches: Iterable[Any],
    key: str,
    *,
    since: float | None = None,
    images_of: Callable[[Any], Any] = first_item,
) -> tuple[int, float]:
    """Read one epoch of image batches; return its images and the seconds to its first batch.

    The first batch's images (``images_of(batch)``) must be uint8 ``CROP x CROP x 3``, or
    the run fails naming ``key``. The time to the first batch counts from ``since`` (a
    ``time.perf_counter()``: before the loader was built, say), else from this call.
    """
    t0 = time.perf_counter() if since is None else since
    first, count = 0.0, 0
    for batch in batches:
        images = images_of(batch)
        if not count:
            first = time.perf_counter() - t0
            shape, dtype = tuple(images.shape[1:]), str(images.dtype)
            if shape != (CROP, CROP, 3) or "uint8" not in dtype:
                raise AssertionError(f"{key}: batches of {shape} {dtype}")
        count += len(images)
        del batch, images
    return count, first


def native_epochs(source: Any, spec: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """ferrofeed's native chain for ``spec["job"]`` over ``source``: batches of
    ``spec["batch_size"]`` on ``spec["threads"]`` threads, shuffled with seed 0 (``fields``:
    a sharded source's image and label fields). One warm-up epoch (page cache, pools), then
    ``spec["epochs"]`` timed ones; returns their images, images/s and this process's CPU ms
    per image (the runs of benches/build_ab.py and benches/mix_cost.py)."""
    import ferrofeed

    loader = ferrofeed.DataLoader(
        source,
        spec["batch_size"],
        shuffle=True,
        seed=0,
        transform=native_op(spec["job"]),
        num_threads=spec["threads"],
        **fields,
    )
    n = 0
    for _ in loader:  # warm-up: page cache, the pools
        pass
    cpu0, t0 = cpu_self(), time.perf_counter()
    for epoch in range(spec["epochs"]):
        loader.set_epoch(epoch + 1)
        for batch in loader:
            n += len(batch[0])
    wall, cpu = time.perf_counter() - t0, cpu_self() - cpu0
    return {"images": n, "images_per_s": n / wall, "cpu_ms_per_image": 1000 * cpu / n}


# --- CPU time and memory of a process tree ---------------------------------------------------


def cpu_self() -> float:
    """CPU seconds (user + system) of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def cpu_children() -> float:
    """CPU seconds of this process's children (and theirs) that have ended and been reaped."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def child_pids(ppid: int) -> list[int]:
    """Direct children of ``ppid``.

    From ``/proc/PID/task/*/children`` (each thread's children: a worker may be forked by
    any thread), which costs far less than reading every ``/proc/*/stat`` on a busy
    machine; that scan is the fallback where the kernel lacks those files.
    """
    out: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{ppid}/task")
    except OSError:
        return []
    try:
        for tid in tasks:
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                out.update(
                    int(p) for p in Path(f"/proc/{ppid}/task/{tid}/children").read_text().split()
                )
        return sorted(out)
    except OSError:
        pass  # no such files (CONFIG_PROC_CHILDREN off): scan every process
    return sorted(pid for pid, parent in parent_pids().items() if parent == ppid)


def stat_fields(text: str) -> list[str]:
    """The fields of a ``/proc/.../stat`` line after ``pid (comm)``: index 0 is the state,
    1 the parent's pid, 11 and 12 utime and stime (``comm`` may hold spaces and
    parentheses, so the fields start after its last ``)``)."""
    return text[text.rfind(")") + 2 :].split()


def parent_pids() -> dict[int, int]:
    """Every live process's parent: {pid: ppid} (from /proc/*/stat)."""
    out: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat_fields(stat)
        if len(fields) > 1:
            out[int(entry)] = int(fields[1])
    return out


def tree_pids(root: int) -> list[int]:
    """``root`` and all its descendants alive now (worker processes, their helpers)."""
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(child_pids(pid))
    return pids


def pss(pid: int) -> int:
    """PSS of ``pid`` in bytes (``/proc/PID/smaps_rollup``), 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def tree_pss(root: int) -> int:
    """Total PSS of ``root`` and its descendants, in bytes (shared pages counted once)."""
    return sum(pss(p) for p in tree_pids(root))


class PssSampler:
    """Samples the total PSS of a process tree every ``interval`` seconds, on a thread.

    Run from the parent, so that the sampling costs the measured processes nothing.
    """

    def __init__(self, root: int, interval: float) -> None:
        self.root, self.interval = root, interval
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            value = tree_pss(self.root)
            if value:
                self.samples.append((round(time.perf_counter() - self._t0, 3), value))
            self._stop.wait(self.interval)

    def stop(self) -> list[tuple[float, int]]:
        self._stop.set()
        self._thread.join()
        return self.samples


def reap_children() -> int:
    """Once a loader's workers were told to end and the loader dropped: collect it, reap the
    workers that ended, and return how many child processes are still alive (their CPU time
    would be missing from ``getrusage``'s)."""
    gc.collect()
    multiprocessing.active_children()  # reaps the workers that ended
    return len(child_pids(os.getpid()))


class LoaderCosts:
    """What a loader costs the child that runs it, from just before it is built until its
    workers are ended and reaped: the CPU seconds of this interpreter (all its threads) and
    of its reaped children (``getrusage``), and the process tree's PSS before it and at the
    end of each epoch (`epoch_end`).
    """

    def __init__(self) -> None:
        gc.collect()
        self.pid = os.getpid()
        self.pss_before = tree_pss(self.pid)
        self.cpu_before = cpu_self() + cpu_children()
        self.pss_epoch_end: list[int] = []

    def epoch_end(self) -> None:
        """Take the tree's PSS at the end of an epoch."""
        self.pss_epoch_end.append(tree_pss(self.pid))

    def end(self) -> dict[str, Any]:
        """The figures, once the loader's workers are ended and the loader dropped: the
        workers that ended are reaped here; those still alive (``children_left``) would
        leave their CPU time out."""
        children_left = reap_children()
        return {
            "cpu_before_loader_s": self.cpu_before,
            "cpu_loader_s": cpu_self() + cpu_children() - self.cpu_before,
            "pss_before_loader": self.pss_before,
            "pss_epoch_end": self.pss_epoch_end,
            "children_left": children_left,
        }


def run_fresh(
    script: str | Path,
    spec: dict[str, Any],
    workdir: str,
    timeout: float,
    *,
    pss_interval: float | None = None,
    python: str = sys.executable,
) -> dict[str, Any]:
    """Run ``python script --_child SPEC OUT`` in a fresh interpreter; return OUT's JSON.

    Adds ``cpu_tree_s``: the CPU seconds of the whole process tree (the interpreter and
    every worker it reaped, from ``getrusage(RUSAGE_CHILDREN)`` here), and with
    ``pss_interval``, ``pss_series``: (seconds, total PSS of the tree) sampled from here.
    The script's entry point, `run_script`, answers ``CHILD_FLAG`` with its child's part.
    """
    out_path = os.path.join(workdir, "child-result.json")
    spec_path = os.path.join(workdir, "child-spec.json")
    Path(spec_path).write_text(json.dumps(spec))
    if os.path.exists(out_path):
        os.unlink(out_path)
    before = cpu_children()
    proc = subprocess.Popen([python, str(Path(script).resolve()), CHILD_FLAG, spec_path, out_path])
    sampler = PssSampler(proc.pid, pss_interval) if pss_interval else None
    try:
        rc = proc.wait(timeout)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        series = sampler.stop() if sampler else []
    tree = cpu_children() - before
    if rc != 0 or not os.path.exists(out_path):
        what = spec.get("config") or "/".join(str(spec.get(k, "?")) for k in ("job", "loader"))
        raise RuntimeError(f"{what}: the child exited with code {rc}")
    result: dict[str, Any] = json.loads(Path(out_path).read_text())
    os.unlink(out_path)
    result["cpu_tree_s"] = tree
    if sampler:
        result["pss_series"] = series
    return result


def add_tree_figures(r: dict[str, Any]) -> dict[str, Any]:
    """Add to a `run_fresh` result with `LoaderCosts`' figures (and ``pss_interval``) the
    loader's CPU seconds per 1000 images (``cpu_s_per_1000``), the tree's peak PSS over the
    samples and the epochs' ends (``peak_pss``) and what the loader added to it
    (``peak_pss_added``); the PSS samples themselves are dropped. Returns ``r``."""
    r["cpu_s_per_1000"] = r["cpu_loader_s"] / r["images"] * 1000
    samples = [v for _, v in r.pop("pss_series")] + r["pss_epoch_end"]
    r["peak_pss"] = max(samples)
    r["peak_pss_added"] = r["peak_pss"] - r["pss_before_loader"]
    return r


def run_script(
    parent: Callable[[list[str]], int | None], child: Callable[[dict[str, Any]], dict[str, Any]]
) -> int:
    """A benchmark script's entry point; returns its exit status. In a child interpreter that
    `run_fresh` started (``SCRIPT --_child SPEC OUT``): ``child(spec)``, its result written
    to ``OUT``. Else ``parent`` on the command line's arguments."""
    argv = sys.argv
    if len(argv) >= 4 and argv[1] == CHILD_FLAG:
        spec = json.loads(Path(argv[2]).read_text())
        Path(argv[3]).write_text(json.dumps(child(spec)))
        return 0
    return parent(argv[1:]) or 0
