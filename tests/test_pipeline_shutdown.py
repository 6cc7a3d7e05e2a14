"""Pipeline shutdown and resources: threads, Ctrl-C, interpreter exit, fork, bounded memory.

Thread counts are checked twice: ``threading.active_count()`` (Python's view, which counts
the pipeline's event-loop thread) and ``Threads:`` in ``/proc/self/status`` (every OS
thread: the runtime's workers, the source thread, the stage threads).
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import os
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from ferrofeed import Pipeline, PipelineBuilder, PipelineError, _core, ops
from ferrofeed.memory import process_memory
from thread_counts import (
    SNIPPET_IMPORT,
    os_threads,
    python_threads,
    settle_threads,
    thread_counts,
)

MB = 1 << 20
RunPython = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def baseline() -> tuple[int, int]:
    """Thread counts before the test (after letting earlier tests' threads go)."""
    gc.collect()
    time.sleep(0.05)
    return thread_counts()


async def async_pass(x: Any) -> Any:
    await asyncio.sleep(0)
    return x


def full_pipeline(source: Any, sync_concurrency: int = 3) -> Pipeline:
    """Every kind of thread: source, Python stage threads, event loop, runtime workers."""
    return (
        PipelineBuilder()
        .add_source(source)
        .pipe(lambda x: x, concurrency=sync_concurrency)
        .pipe(async_pass, concurrency=4)
        .pipe(ops.identity())
        .aggregate(2)
        .add_sink(buffer_size=2)
        .build(num_threads=2)
    )


def assert_running_threads(base: tuple[int, int]) -> None:
    py, os_n = thread_counts()
    # The event loop is a Python thread; the source, a stage thread and the stage tasks on
    # the runtime count as at least 4 more. (Shows that the counts can tell a pipeline
    # is running.)
    assert py >= base[0] + 1
    assert os_n >= base[1] + 4


# --------------------------------------------------------------------------------------
# threads back to baseline


@pytest.mark.timeout(30)
@pytest.mark.parametrize("sync_concurrency", [1, 3])
def test_threads_back_to_baseline_after_stop(
    baseline: tuple[int, int], sync_concurrency: int
) -> None:
    p = full_pipeline(itertools.count(), sync_concurrency)
    it = iter(p)
    assert [next(it) for _ in range(5)] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    time.sleep(0.05)  # the queues fill up behind the idle consumer
    assert_running_threads(baseline)
    t0 = time.monotonic()
    p.stop()
    elapsed = time.monotonic() - t0
    assert elapsed < 30, f"took {elapsed:.2f} s"  # a hang guard, not a speed test
    assert settle_threads(baseline) == baseline
    assert p.finished


@pytest.mark.timeout(30)
@pytest.mark.parametrize("sync_concurrency", [1, 3])
def test_stop_with_a_slow_sync_stage_returns(
    baseline: tuple[int, int], sync_concurrency: int
) -> None:
    def slow(x: int) -> int:
        time.sleep(0.25)
        return x

    p = PipelineBuilder().add_source(itertools.count()).pipe(slow, concurrency=sync_concurrency)
    pipeline = p.add_sink().build()
    pipeline.start()
    time.sleep(0.6)  # a few calls done, one in progress on every stage thread
    t0 = time.monotonic()
    pipeline.stop()
    # Calls in progress end within 0.25 s; nothing new may start after stop(). (A hang
    # guard: an endless source of 0.25 s calls would never let a joining stop return.)
    elapsed = time.monotonic() - t0
    assert elapsed < 30, f"took {elapsed:.2f} s"
    assert settle_threads(baseline) == baseline


@pytest.mark.timeout(30)
def test_threads_back_to_baseline_after_break_in_auto_stop(baseline: tuple[int, int]) -> None:
    p = full_pipeline(itertools.count())
    with p.auto_stop():
        for batch in p:
            if batch[0] >= 20:
                assert_running_threads(baseline)
                t0 = time.monotonic()
                break
    elapsed = time.monotonic() - t0
    assert elapsed < 30, f"took {elapsed:.2f} s"  # a hang guard, not a speed test
    assert settle_threads(baseline) == baseline


@pytest.mark.timeout(30)
def test_threads_back_to_baseline_after_consumer_exception_in_auto_stop(
    baseline: tuple[int, int],
) -> None:
    p = full_pipeline(itertools.count())
    with pytest.raises(ZeroDivisionError), p.auto_stop():  # noqa: PT012
        for batch in p:
            if batch[0] >= 10:
                assert_running_threads(baseline)
                _ = 1 / 0
    assert settle_threads(baseline) == baseline


@pytest.mark.timeout(30)
def test_threads_back_to_baseline_after_consumer_exception_without_stop(
    baseline: tuple[int, int],
) -> None:
    """The exception leaves the function that owns the pipeline: dropping it stops it."""

    def consume() -> None:
        p = full_pipeline(itertools.count())
        for batch in p:
            if batch[0] >= 10:
                assert_running_threads(baseline)
                raise LookupError("consumer failed")

    try:  # noqa: SIM105 - the plain shape of user code
        consume()
    except LookupError:
        pass
    assert settle_threads(baseline) == baseline


@pytest.mark.timeout(30)
def test_threads_back_to_baseline_after_exhaustion(baseline: tuple[int, int]) -> None:
    p = full_pipeline(list(range(300)))
    out = []
    for batch in p:
        out.extend(batch)
        if len(out) == 100:
            assert_running_threads(baseline)
    assert out == list(range(300))
    # No stop(), no auto_stop(): running out of items stops and joins everything.
    assert settle_threads(baseline) == baseline
    assert p.finished


@pytest.mark.timeout(30)
@pytest.mark.parametrize("sync_concurrency", [1, 3])
def test_threads_back_to_baseline_after_del_and_gc(
    baseline: tuple[int, int], sync_concurrency: int
) -> None:
    p = full_pipeline(itertools.count(), sync_concurrency)
    it = iter(p)
    for _ in range(5):
        next(it)
    time.sleep(0.05)
    assert_running_threads(baseline)
    del p, it
    gc.collect()
    assert settle_threads(baseline) == baseline


@pytest.mark.timeout(30)
def test_threads_back_to_baseline_after_stage_error(baseline: tuple[int, int]) -> None:
    def fail_at_50(x: int) -> int:
        if x == 50:
            raise ValueError("boom")
        return x

    p = PipelineBuilder().add_source(itertools.count()).pipe(fail_at_50, concurrency=2)
    pipeline = p.pipe(async_pass, concurrency=2).add_sink().build()
    with pytest.raises(PipelineError):
        for _ in pipeline:
            pass
    assert settle_threads(baseline) == baseline


@pytest.mark.timeout(30)
def test_threads_back_to_baseline_after_source_error(baseline: tuple[int, int]) -> None:
    def source() -> Iterator[int]:
        yield from range(20)
        raise OSError("disk gone")

    p = full_pipeline(source())
    with pytest.raises(PipelineError) as info:
        for _ in p:
            pass
    assert info.value.stage == "source"
    assert settle_threads(baseline) == baseline


@pytest.mark.timeout(30)
def test_built_but_never_started_pipeline_leaves_no_threads(baseline: tuple[int, int]) -> None:
    p = full_pipeline(itertools.count())
    # (An async stage's feeder thread may exist from build() on; nothing else runs yet.)
    assert thread_counts()[1] <= baseline[1] + 1
    del p
    gc.collect()
    assert settle_threads(baseline) == baseline
    p = PipelineBuilder().add_source(itertools.count()).pipe(str, concurrency=4).add_sink().build()
    assert thread_counts() == baseline
    del p
    gc.collect()
    assert thread_counts() == baseline


# --------------------------------------------------------------------------------------
# Ctrl-C

SIGINT_SNIPPET = (
    SNIPPET_IMPORT
    + r"""
import asyncio, itertools, json, os, signal, sys, threading, time
from ferrofeed import PipelineBuilder


kind, catch = sys.argv[1], sys.argv[2] == "catch"
base = [threading.active_count(), os_threads()]

def slow(x):
    time.sleep(0.4)
    return x

async def stuck(x):
    await asyncio.sleep(3600)
    return x

op = slow if kind == "sync" else stuck
p = PipelineBuilder().add_source(itertools.count()).pipe(op).add_sink().build()
fired = []

def fire():
    fired.append(time.monotonic())
    os.kill(os.getpid(), signal.SIGINT)

# Sync items arrive every 0.4 s: fire half-way between two, while __next__ waits.
timer = threading.Timer(1.0, fire)
timer.start()
got = 0
if not catch:
    for _ in p:
        got += 1
    raise SystemExit("the loop ended without KeyboardInterrupt")
try:
    for _ in p:
        got += 1
    caught = None
except KeyboardInterrupt:
    caught = time.monotonic()
timer.join()
deadline = time.monotonic() + 30.0
while [threading.active_count(), os_threads()] != base and time.monotonic() < deadline:
    time.sleep(0.005)
after = [threading.active_count(), os_threads()]
print(json.dumps({
    "latency": None if caught is None else caught - fired[0],
    "base": base, "after": after, "got": got, "finished": p.finished,
}))
"""
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_keyboard_interrupt_while_waiting_on_sink_stops_promptly(
    kind: str, run_python: RunPython, last_json_line: Callable[[str], Any]
) -> None:
    t0 = time.monotonic()
    proc = run_python(SIGINT_SNIPPET, args=[kind, "catch"], timeout=30)
    wall = time.monotonic() - t0
    r = last_json_line(proc.stdout)
    assert r["latency"] is not None, proc.stdout
    assert r["latency"] < 20, r  # a hang guard: the async stage's call never returns
    assert r["after"] == r["base"], r
    assert r["finished"] is True
    if kind == "sync":
        assert r["got"] >= 1
    else:
        assert r["got"] == 0
    assert "Traceback" not in proc.stderr, proc.stderr
    assert wall < 15


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_uncaught_keyboard_interrupt_exits_promptly(kind: str, run_python: RunPython) -> None:
    t0 = time.monotonic()
    proc = run_python(SIGINT_SNIPPET, args=[kind, "nocatch"], timeout=30, check=False)
    wall = time.monotonic() - t0
    # An uncaught KeyboardInterrupt ends CPython by SIGINT, after printing the traceback.
    assert proc.returncode == -signal.SIGINT, (proc.returncode, proc.stderr)
    assert "KeyboardInterrupt" in proc.stderr
    assert "panicked" not in proc.stderr
    assert wall < 15


# --------------------------------------------------------------------------------------
# interpreter exit

EXIT_SNIPPET = r"""
import asyncio, itertools, sys, time
from ferrofeed import PipelineBuilder, ops

kind = sys.argv[1]

def quick(x):
    time.sleep(0.001)
    return x

def stuck(x):
    time.sleep(30)
    return x

async def aquick(x):
    await asyncio.sleep(0.001)
    return x

async def astuck(x):
    await asyncio.sleep(3600)
    return x

b = PipelineBuilder().add_source(itertools.count())
if kind == "sync":
    b.pipe(quick, concurrency=3)
elif kind == "async":
    b.pipe(aquick, concurrency=8)
elif kind == "native":
    b = PipelineBuilder().add_source(range(10**12)).pipe(ops.identity())
elif kind == "mixed":
    b.pipe(quick, concurrency=2).pipe(aquick, concurrency=4).pipe(ops.identity()).aggregate(4)
elif kind == "stuck-sync":
    b.pipe(stuck, concurrency=2)
elif kind == "stuck-async":
    b.pipe(astuck, concurrency=2)
p = b.add_sink().build()
if kind.startswith("stuck"):
    p.start()
    time.sleep(0.3)
else:
    it = iter(p)
    for _ in range(10):
        next(it)
print("left running", flush=True)
# The pipeline is left running, never stopped: the interpreter must still exit.
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["sync", "async", "native", "mixed", "stuck-sync", "stuck-async"])
def test_interpreter_exits_with_a_running_pipeline(kind: str, run_python: RunPython) -> None:
    t0 = time.monotonic()
    try:
        proc = run_python(EXIT_SNIPPET, args=[kind], timeout=20, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the interpreter hung at exit with a running {kind} pipeline")
    wall = time.monotonic() - t0
    assert "left running" in proc.stdout
    assert proc.returncode == 0, proc.stderr
    for bad in ("Traceback", "panicked", "Fatal"):
        assert bad not in proc.stderr, proc.stderr
    # A stage stuck in a 30 s call is left behind after a short deadline, not waited for.
    assert wall < 10


# --------------------------------------------------------------------------------------
# fork

FORK_SNIPPET = (
    SNIPPET_IMPORT
    + r"""
import asyncio, json, os, sys, threading, time
from ferrofeed import PipelineBuilder, ops
from forking import HUNG, wait_or_kill


def double(x):
    return 2 * x

async def inc(x):
    await asyncio.sleep(0)
    return x + 1

parent_async = sys.argv[1] == "async"
b = PipelineBuilder().add_source(range(1000)).pipe(double, concurrency=2)
if parent_async:
    b.pipe(inc, concurrency=3)
parent = b.pipe(ops.identity()).add_sink(buffer_size=2).build()
expected_parent = [2 * x + (1 if parent_async else 0) for x in range(1000)]
it = iter(parent)
head = [next(it) for _ in range(10)]
time.sleep(0.05)  # the parent's threads are busy, its queues full, when it forks

pid = os.fork()
if pid == 0:
    code = 1
    try:
        result = {}
        base = os_threads()
        result["threads_at_fork"] = base
        from ferrofeed import _core
        # The parent's runtime: none of its threads came along, and it is not this one's.
        result["runtime_at_fork"] = list(_core._native_threads()[:2])
        # The parent's pipeline, used in the child: what do five next() calls give?
        stale = []
        for _ in range(5):
            try:
                next(parent)
                stale.append("item")
            except RuntimeError:
                stale.append("RuntimeError")
                break
        result["stale"] = stale
        child = (
            PipelineBuilder()
            .add_source(range(200))
            .pipe(double, concurrency=3)
            .pipe(inc, concurrency=4)
            .pipe(ops.identity())
            .aggregate(50)
            .add_sink()
            .build()
        )
        out = list(child)
        expected = [[2 * x + 1 for x in range(i, i + 50)] for i in range(0, 200, 50)]
        result["child_ok"] = out == expected
        time.sleep(0.05)
        result["threads_after"] = os_threads()
        # The child made a runtime of its own for its pipelines, and kept it.
        result["runtime_after"] = _core._native_threads()[0]
        result["rt_named"] = sum(
            open(f"/proc/self/task/{t}/comm").read().strip() == "ferrofeed-rt"
            for t in os.listdir("/proc/self/task")
        )
        second = PipelineBuilder().add_source(list(range(30))).pipe(double).add_sink().build()
        result["second_ok"] = list(second) == [2 * x for x in range(30)]
        print("CHILD " + json.dumps(result), flush=True)
        code = 0
    finally:
        os._exit(code)

status = wait_or_kill(pid, 30)
rest = list(it)
print(json.dumps({
    "child_status": status,
    "child_exit": os.waitstatus_to_exitcode(status) if status != HUNG else "hung",
    "parent_ok": head + rest == expected_parent,
}))
"""
)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("parent_kind", ["sync", "async"])
def test_fork_then_build_in_child(
    parent_kind: str, run_python: RunPython, last_json_line: Callable[[str], Any]
) -> None:
    proc = run_python(FORK_SNIPPET, args=[parent_kind], timeout=60)
    r = last_json_line(proc.stdout)
    assert r["child_exit"] == 0, (r, proc.stdout, proc.stderr)
    child_lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("CHILD ")]
    assert len(child_lines) == 1, proc.stdout
    child = json.loads(child_lines[0][len("CHILD ") :])
    assert child["child_ok"] is True, child
    assert child["second_ok"] is True, child
    # The parent's pipeline cannot be used in the child: it says so instead of hanging
    # (whether it may first hand out items already buffered is the next test's business).
    assert child["stale"][-1] == "RuntimeError", child
    # Only the forking thread exists in the child, and the child's pipelines joined theirs.
    assert child["threads_at_fork"] == 1
    assert child["runtime_at_fork"] == [0, 0], child
    assert child["runtime_after"] >= 1, child
    assert child["runtime_after"] == child["rt_named"], child
    assert child["threads_after"] == 1, child
    # The parent's own pipeline, built and running before the fork, still works.
    assert r["parent_ok"] is True, r
    assert "panicked" not in proc.stderr


@pytest.mark.timeout(90)
def test_parent_pipeline_refused_in_forked_child_from_the_first_item(
    run_python: RunPython,
) -> None:
    """A pipeline inherited through fork hands out nothing: its buffered items are the
    parent's, and the parent yields them too (a forked data-loader worker would duplicate
    them)."""
    proc = run_python(FORK_SNIPPET, args=["sync"], timeout=60)
    child_lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("CHILD ")]
    assert len(child_lines) == 1, proc.stdout
    child = json.loads(child_lines[0][len("CHILD ") :])
    assert child["stale"] == ["RuntimeError"], child


# --------------------------------------------------------------------------------------
# bounded memory


@pytest.mark.timeout(60)
def test_bounded_memory_with_slow_consumer() -> None:
    n_items = 2000  # 2000 items of 1 MiB: 2 GiB if the source were drained eagerly
    consume = 150
    state = {"produced": 0, "consumed": 0}

    def source() -> Iterator[bytes]:
        for i in range(n_items):
            ahead = state["produced"] - state["consumed"]
            if ahead > 400:  # a guard: fail the test instead of exhausting the machine
                raise RuntimeError(f"the source ran {ahead} items ahead of the consumer")
            state["produced"] += 1
            yield bytes([i % 256]) * MB  # written, so really resident

    p = (
        PipelineBuilder()
        .add_source(source())
        .pipe(lambda b: b, concurrency=2, name="pass")
        .pipe(ops.identity())
        .add_sink(buffer_size=2)
        .build()
    )
    gc.collect()
    rss0 = process_memory().rss
    maxrss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    peak = rss0
    most_ahead = 0
    with p.auto_stop():
        for i, item in enumerate(p):
            assert len(item) == MB
            assert item[0] == item[-1] == i % 256
            state["consumed"] += 1
            del item
            time.sleep(0.005)  # slow consumer: ~1 s in all
            most_ahead = max(most_ahead, state["produced"] - state["consumed"])
            peak = max(peak, process_memory().rss)
            if state["consumed"] == consume:
                # How far the source ran ahead while the consumer read: taken here, since
                # a pull already under way may finish while the pipeline stops.
                produced = state["produced"]
                break
    maxrss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    # What the buffers can hold: every queue full, every stage with twice its concurrency
    # in flight, except the Python stage, which holds up to its window (max(2 *
    # concurrency, 32) items taken and not yet sent on: src/pipeline/threads.rs), a source
    # batch as large as its queue, and a few items in hand.
    stats = p.stats()
    stages = [s for name, s in stats.items() if name != "sink"]
    python_window = max(2 * stats["pass"]["concurrency"], 32)
    bound = (
        sum(s["queue_capacity"] for s in stages)
        + 2 * sum(s["concurrency"] for name, s in stats.items() if name not in ("sink", "pass"))
        + python_window
        + stats["source"]["queue_capacity"]
        + 4
    )
    assert bound < 100, stats  # the buffers themselves are small
    assert most_ahead <= bound, (most_ahead, bound)
    assert produced <= consume + bound, (produced, state, bound)
    assert stats["source"]["items_out"] <= consume + bound
    assert peak - rss0 < 150 * MB, f"RSS grew by {(peak - rss0) / MB:.0f} MiB"
    assert maxrss1 - maxrss0 < 150 * MB


@pytest.mark.timeout(60)
def test_bounded_run_ahead_with_native_source_and_aggregate() -> None:
    """A native source is throttled the same way: it cannot run off to the end."""
    p = (
        PipelineBuilder()
        .add_source(range(10**12))
        .pipe(ops.identity())
        .aggregate(10)
        .add_sink(buffer_size=2)
        .build()
    )
    it = iter(p)
    assert next(it) == list(range(10))
    time.sleep(0.3)  # a stalled consumer
    produced = p.stats()["source"]["items_out"]
    assert produced <= 200, produced
    time.sleep(0.2)
    assert p.stats()["source"]["items_out"] == produced
    p.stop()


# --------------------------------------------------------------------------------------
# helpers used above must themselves be able to fail


def test_os_thread_count_sees_new_threads() -> None:
    before = os_threads()
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert os_threads() == before + 1
    finally:
        stop.set()
        t.join()
    assert settle_threads((python_threads(), before)) == (python_threads(), before)


def runtime_thread_ids() -> set[int]:
    """Thread ids of this process's threads named after the process's runtime."""
    ids = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="ascii") as f:
                if f.read().strip() == "ferrofeed-rt":
                    ids.add(int(tid))
        except FileNotFoundError:  # ended meanwhile
            pass
    return ids


@pytest.mark.timeout(60)
def test_every_pipeline_runs_on_the_one_runtime_the_process_keeps() -> None:
    def epoch() -> None:
        p = (
            PipelineBuilder()
            .add_source(range(64))
            .pipe(ops.identity())
            .pipe(async_pass, concurrency=4)
            .aggregate(8)
            .add_sink()
            .build()
        )
        assert [x for group in p for x in group] == list(range(64))

    epoch()
    first = runtime_thread_ids()
    assert first, "no runtime thread"
    for _ in range(5):
        epoch()
        # No stage task outlives its pipeline, and no runtime thread is new: the later
        # pipelines ran on the threads already there (idle blocking-pool threads of
        # earlier tests may have ended meanwhile, after 10 s).
        assert _core._native_threads()[1] == 0
        assert runtime_thread_ids() <= first
    # The runtime's own count is what the kernel sees (read again if a blocking-pool
    # thread ended between the two looks).
    for _ in range(10):
        counted, named = _core._native_threads()[0], len(runtime_thread_ids())
        if counted == named == _core._native_threads()[0]:
            break
    assert counted == named
