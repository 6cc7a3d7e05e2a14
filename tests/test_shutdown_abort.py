"""Interpreter exit while a stage thread is inside a Python call: no SIGABRT.

On Python < 3.14, once the interpreter finalizes, a thread that takes the GIL again (its
call wakes from ``time.sleep``, or the eval loop hands the GIL back and forth while it runs
pure-Python code) is ended with ``pthread_exit``. On Linux that is a forced unwind, and a
forced unwind that reaches the Rust frame calling into Python (``call_python`` in
``src/py/pipeline/spec.rs``, the source's ``next`` in ``src/py/pipeline/source.rs``) ends
in ``abort()`` (exit status -6), or in "Fatal Python error: PyGILState_Release" when pyo3's
attach guard is dropped on the way. The threads at risk are those that stopping left
inside a call of user code (still running after the engine's 0.25 s grace): the pipeline
was left running (stopped at exit by ``_stop_live_pipelines``), stopped, or collected.

Each case runs in a fresh interpreter and only ends once a stage thread is inside its call;
the call outlasts the process, so the thread is still in it when the interpreter
finalizes. A passing case takes about half a second.
"""

from __future__ import annotations

import subprocess
import textwrap
import time
from collections.abc import Callable

import pytest

RunPython = Callable[..., subprocess.CompletedProcess[str]]

# Every case: how many fresh interpreters run it (the crash has been deterministic on
# Linux + CPython 3.11; more than one run catches a fix that only narrows the window).
RUNS = 2

PRELUDE = r"""
import sys, threading, time
from ferrofeed import DataLoader, PipelineBuilder

inside = threading.Event()  # set once a stage thread is inside its long call

def spin(seconds):
    # Pure-Python work: the eval loop hands the GIL to other threads every 5 ms, and
    # takes it back.
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass

def nap(seconds):
    # Short sleeps: each wake-up takes the GIL back.
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.001)

def heavy(x):
    inside.set()
    spin(30)
    return x

def napping(x):
    inside.set()
    nap(30)
    return x

def slow_4_5(x):
    # A DataLoader transform: samples 4 and 5 hold two of the four threads; the others
    # deliver the first batch (samples 0-3) at once.
    if x in (4, 5):
        napping(x)
    return x

def busy_source():
    yield 0
    inside.set()
    spin(30)
    yield 1

def wait_inside():
    if not inside.wait(20):
        sys.exit("no stage thread entered its call")
"""

CASES = {
    # A pipeline left running (never stopped): `_stop_live_pipelines` stops it at exit and
    # leaves the threads that are inside a call.
    "pipeline-left-running-spin": """
        p = PipelineBuilder().add_source(range(100)).pipe(heavy, concurrency=2).add_sink().build()
        p.start()
        wait_inside()
    """,
    "pipeline-left-running-sleep": """
        p = PipelineBuilder().add_source(range(100)).pipe(napping, concurrency=2).add_sink().build()
        p.start()
        wait_inside()
    """,
    # Stopped by the user: stop() returns after its grace, the call goes on.
    "pipeline-stopped": """
        p = PipelineBuilder().add_source(range(100)).pipe(heavy, concurrency=2).add_sink().build()
        p.start()
        wait_inside()
        p.stop()
    """,
    # Dropped: the pipeline's destructor stops it.
    "pipeline-deleted": """
        p = PipelineBuilder().add_source(range(100)).pipe(napping, concurrency=2).add_sink().build()
        p.start()
        wait_inside()
        del p
    """,
    # The source thread inside the user's generator.
    "pipeline-source": """
        p = PipelineBuilder().add_source(busy_source()).pipe(lambda x: x).add_sink().build()
        it = iter(p)
        next(it)
        wait_inside()
    """,
    # A training loop that leaves the epoch early (the loader stays alive in a global).
    "loader-break": """
        loader = DataLoader(list(range(64)), 4, transform=slow_4_5, num_threads=4)
        for batch in loader:
            wait_inside()
            break
    """,
    # The loader goes out of scope with its function.
    "loader-in-function": """
        def main():
            loader = DataLoader(list(range(64)), 4, transform=slow_4_5, num_threads=4)
            next(iter(loader))
            wait_inside()
        main()
    """,
    # An uncaught exception in the training loop: exit status 1, not an abort.
    "loader-exception": """
        loader = DataLoader(list(range(64)), 4, transform=slow_4_5, num_threads=4)
        for batch in loader:
            wait_inside()
            raise RuntimeError("boom in the training loop")
    """,
}


def _run_case(run_python: RunPython, body: str) -> tuple[subprocess.CompletedProcess[str], float]:
    code = PRELUDE + textwrap.dedent(body) + '\nprint("main done", flush=True)\n'
    t0 = time.monotonic()
    try:
        proc = run_python(code, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("the interpreter hung at exit with a stage thread inside a call")
    return proc, time.monotonic() - t0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(CASES))
def test_exit_while_a_stage_thread_is_inside_a_python_call(
    case: str, run_python: RunPython
) -> None:
    expected = 1 if case == "loader-exception" else 0
    for run in range(RUNS):
        proc, wall = _run_case(run_python, CASES[case])
        detail = (
            f"run {run + 1}/{RUNS} of {case!r}: exit status {proc.returncode} "
            f"(-6 is SIGABRT)\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
        )
        assert proc.returncode == expected, detail
        for bad in ("Fatal Python error", "panicked", "Aborted"):
            assert bad not in proc.stderr, detail
        if expected == 0:
            assert "main done" in proc.stdout, detail
            assert "Traceback" not in proc.stderr, detail
        else:
            assert "RuntimeError: boom in the training loop" in proc.stderr, detail
        # A thread stuck in a 30 s call is not waited for at exit.
        assert wall < 15, detail
