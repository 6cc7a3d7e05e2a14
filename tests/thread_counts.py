"""Thread counts of this process, for tests that check a pipeline leaves none behind."""

from __future__ import annotations

import threading
import time


def os_threads() -> int:
    """Threads of this process as the kernel counts them (Python's and native ones)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads: line in /proc/self/status")


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
    """(Python threads, OS threads)."""
    return python_threads(), os_threads()


def settle_threads(base: tuple[int, int], within: float = 1.0) -> tuple[int, int]:
    """The thread counts once back to ``base``, or as they are after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        now = thread_counts()
        if now == base or time.monotonic() > deadline:
            return now
        time.sleep(0.005)
