"""Thread counts of this process, for tests that check a pipeline leaves none behind.

The process keeps two sets of native threads that outlive every pipeline: the one async
runtime that every pipeline's stage tasks and every remote source's fetches run on (its
workers, and blocking-pool threads that end after 10 s idle) and the CPU pools of batch
decodes. They are made on first use, once per process, and are the library's, not a
pipeline's: ``os_threads`` leaves them out, and ``thread_counts`` also requires that no
task ferrofeed started (stage task, stats reporter, fetch) is still alive on the runtime,
so a "back to the baseline" check still catches a pipeline that left a thread or a task
behind.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from ferrofeed import _core


def all_os_threads() -> int:
    """Threads of this process as the kernel counts them (Python's and native ones)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads: line in /proc/self/status")


def os_threads(*, with_tasks: bool = False) -> int:
    """OS threads of this process, less those of the process's runtime and CPU pool;
    with ``with_tasks``, plus one for each stage task still alive on the runtime.

    The library's counts and the kernel's are read apart: a runtime thread ending (10 s
    idle) between the reads would put the difference off by one. So the reads are taken
    again until two snapshots in a row agree (at most 100 tries, 1 ms apart).

    The subprocess snippets of the tests import this module too (see ``SNIPPET_IMPORT``).
    """

    def snapshot() -> tuple[int, int, int, int]:
        runtime, tasks, pool = _core._native_threads()
        return runtime, tasks, pool, all_os_threads()

    last = snapshot()
    for _ in range(100):
        now = snapshot()
        if now == last:
            break
        last = now
        time.sleep(0.001)
    runtime, tasks, pool, total = last
    return total - runtime - pool + (tasks if with_tasks else 0)


def python_threads() -> int:
    """Threads started with `threading` that are running.

    A native thread (a pipeline's stage threads) that ran Python code which asked for
    ``threading.current_thread()`` (``logging`` does) leaves a ``_DummyThread`` entry
    behind on Python 3.11, never removed; a later thread that reuses its id replaces it,
    and the count drops when that one ends. Such entries are not counted: the OS count
    covers native threads.
    """
    dummy = threading._DummyThread  # the only way to tell them apart
    return sum(1 for t in threading.enumerate() if not isinstance(t, dummy))


def thread_counts() -> tuple[int, int]:
    """(Python threads, OS threads less the runtime's and the pool's); the OS count is
    one more for each stage task still alive on the runtime."""
    return python_threads(), os_threads(with_tasks=True)


def settle_threads(base: tuple[int, int], within: float = 30.0) -> tuple[int, int]:
    """The thread counts once back to ``base``, or as they are after ``within`` seconds.

    ``within`` is a hang guard, not a speed target: the wait ends as soon as the counts are
    back, and a loaded machine may take a while to end and reap threads.
    """
    deadline = time.monotonic() + within
    while True:
        now = thread_counts()
        if now == base or time.monotonic() > deadline:
            return now
        time.sleep(0.005)


# The first lines of a test's ``python -c`` snippet that counts threads: it makes this
# module importable there and defines ``os_threads()`` as `thread_counts` counts them (less
# the runtime's and the pool's threads, plus the live stage tasks).
SNIPPET_IMPORT = f"""\
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
from thread_counts import os_threads as _os_threads

def os_threads():
    return _os_threads(with_tasks=True)
"""
