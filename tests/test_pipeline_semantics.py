"""Pipeline semantics that SPDL users expect (issue 11's pipeline half, issue 12's fork item).

Async stages whose call fails at once, what reaches the consumer before a failure,
executors, per-stage timeouts and stall warnings, generator stages (flat map),
``disaggregate()``, items left readable after ``stop()``, and ``stop()`` in a forked child.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import pytest
from conftest import TESTS_DIR
from ferrofeed import Pipeline, PipelineBuilder, PipelineError
from pipelines import assert_fails_as_programming_error, drain


def fail_at(n: int, error: type[Exception]) -> Callable[[int], int]:
    """A stage function named ``fail_at_<n>``: each item as it is, ``error(n)`` at item ``n``."""

    def fail(x: int) -> int:
        if x == n:
            raise error(x)
        return x

    fail.__name__ = fail.__qualname__ = f"fail_at_{n}"
    return fail


def stuck_at(items: tuple[int, ...], release: threading.Event) -> Callable[[int], int]:
    """A stage function: each item as it is, after waiting (20 s at most) for ``release`` at
    each of ``items``: a call that does not return while a test runs."""

    def stuck(x: int) -> int:
        if x in items:
            release.wait(20)
        return x

    stuck.__name__ = stuck.__qualname__ = f"stuck_at_{items[0]}"
    return stuck


def take_until_error(p: Pipeline) -> tuple[list[Any], BaseException | None]:
    """The items the consumer receives, and the error that ends them (if any)."""
    got: list[Any] = []
    try:
        with p.auto_stop():
            for x in p:
                got.append(x)
    except PipelineError as e:
        return got, e
    return got, None


# --------------------------------------------------------------------------------------
# async stages whose call raises before it makes a coroutine


async def two_args(x: int, y: int) -> int:
    return x + y


async def add(x: int, *, k: int) -> int:
    return x + k


BAD_ASYNC_OPS = {
    "wrong arity": two_args,
    "partial with a bad keyword": functools.partial(add, nope=1),  # type: ignore[call-arg]
}


@pytest.mark.timeout(20)
@pytest.mark.parametrize("op", list(BAD_ASYNC_OPS.values()), ids=list(BAD_ASYNC_OPS))
def test_async_stage_failing_at_call_raises(op: Any) -> None:
    p = PipelineBuilder().add_source(range(3)).pipe(op).add_sink().build()
    with pytest.raises(PipelineError) as info:
        drain(p)
    (inner,) = info.value.exceptions
    assert isinstance(inner, TypeError)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("op", list(BAD_ASYNC_OPS.values()), ids=list(BAD_ASYNC_OPS))
def test_async_stage_failing_at_call_is_not_skipped(op: Any) -> None:
    # A call that fails before the op runs is a programming error, not a bad item: it
    # fails the pipeline even under on_error="skip".
    p = PipelineBuilder().add_source(range(3)).pipe(op, on_error="skip").add_sink().build()
    assert_fails_as_programming_error(p)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_async_stage_failing_at_call_with_many_in_flight(on_error: Any) -> None:
    p = (
        PipelineBuilder()
        .add_source(range(500))
        .pipe(two_args, concurrency=16, on_error=on_error)  # type: ignore[arg-type]
        .add_sink()
        .build()
    )
    got, err = take_until_error(p)
    assert got == []
    # Raised under either policy: the call itself failed (a programming error).
    assert isinstance(err, PipelineError)
    assert isinstance(err.exceptions[0], TypeError)


# --------------------------------------------------------------------------------------
# failure delivers what came before it

RUNS = 50


def odd_fails(x: int) -> int:
    if x % 2:
        raise ValueError(f"odd {x}")
    return x


async def odd_fails_async(x: int) -> int:
    return odd_fails(x)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("concurrency", [1, 4])
@pytest.mark.parametrize("op", [odd_fails, odd_fails_async], ids=["sync", "async"])
def test_max_failures_trip_delivers_every_item_before_it(op: Any, concurrency: int) -> None:
    """Items 1 and 3 are skipped, 5 trips ``max_failures=2``: 0, 2 and 4 come first."""
    for _ in range(RUNS):
        p = (
            PipelineBuilder()
            .add_source(range(10))
            .pipe(op, on_error="skip", max_failures=2, concurrency=concurrency)
            .add_sink()
            .build()
        )
        got, err = take_until_error(p)
        assert got == [0, 2, 4]
        assert isinstance(err, PipelineError)
        assert "max_failures=2" in str(err)
        (inner,) = err.exceptions
        assert str(inner) == "odd 5"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("concurrency", [1, 3])
def test_raise_delivers_every_item_before_the_failing_one_through_later_stages(
    concurrency: int,
) -> None:
    fail_at_7 = fail_at(7, KeyError)
    for _ in range(RUNS):
        p = (
            PipelineBuilder()
            .add_source(range(100))
            .pipe(fail_at_7, concurrency=concurrency)
            .pipe(lambda x: x * 10, concurrency=2)
            .add_sink(buffer_size=1)
            .build()
        )
        got, err = take_until_error(p)
        assert got == [x * 10 for x in range(7)]
        assert isinstance(err, PipelineError)
        assert err.stage.endswith("fail_at_7")
        assert isinstance(err.exceptions[0], KeyError)


def ten_then_raise() -> Any:
    yield from range(10)
    raise OSError("the source broke")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stages", ["none", "sync", "async", "sync+native"])
def test_source_failure_delivers_the_items_it_yielded_first(stages: str) -> None:
    async def same(x: int) -> int:
        return x

    for _ in range(RUNS):
        b = PipelineBuilder().add_source(ten_then_raise())
        if stages in ("sync", "sync+native"):
            b.pipe(lambda x: x, concurrency=2)
        if stages == "async":
            b.pipe(same, concurrency=4)
        if stages == "sync+native":
            from ferrofeed import ops

            b.pipe(ops.identity())
        got, err = take_until_error(b.add_sink().build())
        assert got == list(range(10))
        assert isinstance(err, PipelineError)
        assert err.stage == "source"
        assert isinstance(err.exceptions[0], OSError)


@pytest.mark.timeout(60)
def test_source_failure_after_aggregate_delivers_complete_groups() -> None:
    """Complete groups go on before the failure; the partial group (items 8 and 9, whose
    group never ended) does not."""
    for _ in range(RUNS):
        p = PipelineBuilder().add_source(ten_then_raise()).aggregate(4).add_sink().build()
        got, err = take_until_error(p)
        assert got == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert isinstance(err, PipelineError)


@pytest.mark.timeout(60)
def test_unordered_stage_failure_delivers_what_finished_before_it() -> None:
    fail_at_5 = fail_at(5, ValueError)
    for _ in range(RUNS):
        p = (
            PipelineBuilder()
            .add_source(range(50))
            .pipe(fail_at_5, concurrency=1, ordered=False)
            .add_sink()
            .build()
        )
        got, err = take_until_error(p)
        assert got == [0, 1, 2, 3, 4]
        assert isinstance(err, PipelineError)


# --------------------------------------------------------------------------------------
# stop() leaves finished items readable


@pytest.mark.timeout(30)
def test_stop_leaves_the_finished_items_readable() -> None:
    p = (
        PipelineBuilder()
        .add_source(range(1000))
        .pipe(lambda x: x, name="same")
        .add_sink(buffer_size=5)
        .build()
    )
    it = iter(p)
    assert next(it) == 0
    deadline = time.monotonic() + 10
    # Wait until the sink is full: five finished items nobody has read.
    while p.stats()["sink"]["items_in"] < 1 or p.stats()["same"]["items_out"] < 6:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.05)
    p.stop()
    assert p.finished
    rest = list(p)
    assert len(rest) >= 5
    assert rest == list(range(1, 1 + len(rest)))
    with pytest.raises(RuntimeError, match="finished"):
        list(p)


@pytest.mark.timeout(30)
def test_stop_before_start_leaves_nothing_to_read() -> None:
    p = PipelineBuilder().add_source(range(10)).pipe(lambda x: x).add_sink().build()
    p.stop()
    with pytest.raises(RuntimeError, match="finished"):
        list(p)


# --------------------------------------------------------------------------------------
# fork: stop() and garbage collection of the parent's pipeline in the child

FORK_STOP_SNIPPET = r"""
import asyncio, gc, json, os, time
from ferrofeed import PipelineBuilder
from forking import HUNG, wait_or_kill

def slow(x):
    time.sleep(0.001)
    return x

async def inc(x):
    await asyncio.sleep(0)
    return x + 1

parent = (
    PipelineBuilder().add_source(range(100000)).pipe(slow, concurrency=4)
    .pipe(inc, concurrency=8).add_sink(buffer_size=2).build()
)
it = iter(parent)
head = [next(it) for _ in range(20)]
time.sleep(0.05)  # every thread busy or blocked on a full queue when the process forks
pid = os.fork()
if pid == 0:
    code = 1
    try:
        t = time.monotonic()
        parent.stop()
        parent.stop()
        del it, parent
        gc.collect()
        child = PipelineBuilder().add_source(range(50)).pipe(inc, concurrency=3).add_sink().build()
        ok = list(child) == [x + 1 for x in range(50)]
        print("CHILD " + json.dumps({"ok": ok, "stop_s": time.monotonic() - t}), flush=True)
        code = 0
    finally:
        os._exit(code)
status = wait_or_kill(pid, 30)
more = [next(it) for _ in range(20)]
parent.stop()
print(json.dumps({
    "child_exit": os.waitstatus_to_exitcode(status) if status != HUNG else "hung",
    "parent_ok": head + more == [x + 1 for x in range(40)],
}))
"""


@pytest.mark.timeout(90)
def test_stop_in_forked_child_does_not_touch_the_parents_runtime(
    run_python: Any, last_json_line: Any
) -> None:
    proc = run_python(FORK_STOP_SNIPPET, timeout=60, cwd=TESTS_DIR)
    r = last_json_line(proc.stdout)
    assert r["child_exit"] == 0, (r, proc.stdout, proc.stderr)
    child = [ln for ln in proc.stdout.splitlines() if ln.startswith("CHILD ")]
    assert len(child) == 1, proc.stdout
    c = json.loads(child[0][len("CHILD ") :])
    assert c["ok"] is True
    assert c["stop_s"] < 5
    assert r["parent_ok"] is True
    assert "Traceback" not in proc.stderr, proc.stderr


# --------------------------------------------------------------------------------------
# executors


def square_or_fail(x: int) -> int:
    """Module level, so that it pickles into a process pool's workers."""
    if x == 13:
        raise KeyError(f"no {x}")
    time.sleep(0.002 * (x % 3))
    return x * x


def pid_of(_: int) -> int:
    return os.getpid()


def split_digits(x: int) -> Iterator[int]:
    for d in str(x):
        yield int(d)


@pytest.fixture(scope="module")
def process_pool() -> Iterator[ProcessPoolExecutor]:
    # spawn: the workers start clean, whatever threads the test process runs.
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield pool


@pytest.mark.timeout(120)
def test_process_pool_executor_runs_calls_in_other_processes(
    process_pool: ProcessPoolExecutor,
) -> None:
    p = (
        PipelineBuilder()
        .add_source(range(13))
        .pipe(square_or_fail, executor=process_pool, concurrency=4)
        .add_sink()
        .build()
    )
    assert drain(p) == [x * x for x in range(13)]
    b = PipelineBuilder().add_source(range(20)).pipe(pid_of, executor=process_pool).add_sink()
    pids = set(drain(b.build()))
    assert os.getpid() not in pids
    p = (
        PipelineBuilder()
        .add_source([12, 305])
        .pipe(split_digits, executor=process_pool)
        .add_sink()
        .build()
    )
    assert drain(p) == [1, 2, 3, 0, 5]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_process_pool_executor_errors_keep_their_type(
    process_pool: ProcessPoolExecutor, on_error: Any
) -> None:
    p = (
        PipelineBuilder()
        .add_source(range(20))
        .pipe(square_or_fail, executor=process_pool, concurrency=3, on_error=on_error)
        .add_sink()
        .build()
    )
    got, err = take_until_error(p)
    if on_error == "skip":
        assert err is None
        assert got == [x * x for x in range(20) if x != 13]
    else:
        assert got == [x * x for x in range(13)]
        assert isinstance(err, PipelineError)
        with pytest.raises(ExceptionGroup) as info:
            raise err
        assert info.group_contains(KeyError, match="no 13")
        try:
            raise err
        except* KeyError as ke:
            (inner,) = ke.exceptions
            assert inner.args == ("no 13",)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("concurrency", [1, 3])
def test_thread_pool_executor_bounds_calls_in_flight_and_keeps_order(concurrency: int) -> None:
    lock = threading.Lock()
    now = most = 0
    threads: set[int] = set()

    def work(x: int) -> int:
        nonlocal now, most
        with lock:
            now += 1
            most = max(most, now)
            threads.add(threading.get_ident())
        time.sleep(0.001 * ((x * 7) % 5))
        with lock:
            now -= 1
        return x

    with ThreadPoolExecutor(8, thread_name_prefix="user-pool") as pool:
        p = (
            PipelineBuilder()
            .add_source(range(60))
            .pipe(work, executor=pool, concurrency=concurrency)
            .add_sink()
            .build()
        )
        assert drain(p) == list(range(60))
    assert most == concurrency
    assert threading.get_ident() not in threads


@pytest.mark.timeout(60)
def test_executor_arguments_are_checked() -> None:
    async def coro(x: int) -> int:
        return x

    b = PipelineBuilder().add_source(range(3))
    with ThreadPoolExecutor(1) as pool:
        with pytest.raises(TypeError, match="Executor"):
            b.pipe(lambda x: x, executor=object())  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="async"):
            b.pipe(coro, executor=pool)
        from ferrofeed import ops

        with pytest.raises(ValueError, match="native"):
            b.pipe(ops.identity(), executor=pool)


# --------------------------------------------------------------------------------------
# generator stages and disaggregate


@pytest.mark.timeout(60)
@pytest.mark.parametrize("concurrency", [1, 4])
def test_generator_stage_is_a_flat_map(concurrency: int) -> None:
    def repeat(x: int) -> Iterator[int]:
        time.sleep(0.001 * (x % 3))
        for _ in range(x % 4):
            yield x

    p = (
        PipelineBuilder()
        .add_source(range(40))
        .pipe(repeat, concurrency=concurrency, name="repeat")
        .pipe(lambda x: -x)
        .add_sink()
        .build()
    )
    assert drain(p) == [-x for x in range(40) for _ in range(x % 4)]
    stats = p.stats()
    assert stats["repeat"]["items_in"] == 40
    assert stats["repeat/flat"]["items_out"] == sum(x % 4 for x in range(40))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("concurrency", [1, 8])
def test_async_generator_stage_is_a_flat_map(concurrency: int) -> None:
    async def expand(x: int) -> AsyncIterator[str]:
        for i in range(x % 3):
            await asyncio.sleep(0.001 * ((x + i) % 2))
            yield f"{x}.{i}"

    p = PipelineBuilder().add_source(range(30)).pipe(expand, concurrency=concurrency)
    assert drain(p.add_sink().build()) == [f"{x}.{i}" for x in range(30) for i in range(x % 3)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_generator_stage_that_raises_fails_the_item_as_a_whole(on_error: Any) -> None:
    def gen(x: int) -> Iterator[int]:
        yield x
        if x == 3:
            raise ValueError("three")
        yield x + 100

    p = PipelineBuilder().add_source(range(5)).pipe(gen, on_error=on_error).add_sink().build()
    got, err = take_until_error(p)
    before = [0, 100, 1, 101, 2, 102]
    if on_error == "skip":
        assert (got, err) == ([*before, 4, 104], None)
    else:
        assert got == before
        assert isinstance(err, PipelineError)
        assert isinstance(err.exceptions[0], ValueError)


@pytest.mark.timeout(60)
def test_generator_callable_object_and_partial() -> None:
    class Split:
        def __call__(self, s: str) -> Iterator[str]:
            yield from s.split()

    def upto(x: int, *, k: int) -> Iterator[int]:
        yield from range(min(x, k))

    p = PipelineBuilder().add_source(["a b", "", "c"]).pipe(Split()).add_sink().build()
    assert drain(p) == ["a", "b", "c"]
    b = PipelineBuilder().add_source([1, 5]).pipe(functools.partial(upto, k=3)).add_sink()
    assert drain(b.build()) == [0, 0, 1, 2]


@pytest.mark.timeout(60)
def test_disaggregate_inverts_aggregate_and_splits_iterables() -> None:
    p = PipelineBuilder().add_source(range(10)).aggregate(3).disaggregate().add_sink().build()
    assert drain(p) == list(range(10))
    # Native groups (an aggregate of a native range) split natively.
    p = PipelineBuilder().add_source(range(7)).aggregate(2).disaggregate().add_sink().build()
    assert drain(p) == list(range(7))
    b = PipelineBuilder().add_source([(1, 2), [], "ab", {3: 0}]).disaggregate().add_sink()
    assert drain(b.build()) == [1, 2, "a", "b", 3]


@pytest.mark.timeout(60)
def test_disaggregate_of_a_non_iterable_fails_after_the_items_before_it() -> None:
    p = PipelineBuilder().add_source([[1], [2, 3], 4, [5]]).disaggregate(name="split").add_sink()
    got, err = take_until_error(p.build())
    assert got == [1, 2, 3]
    assert isinstance(err, PipelineError)
    assert err.stage == "split"
    assert isinstance(err.exceptions[0], TypeError)


# --------------------------------------------------------------------------------------
# timeouts and stalls

LOGGER = "ferrofeed.pipeline"


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """An event that stuck calls wait on; set at teardown so that no thread lingers."""
    ev = threading.Event()
    yield ev
    ev.set()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("concurrency", [1, 2, 4])
def test_sync_stage_timeout_skips_a_stuck_call_and_goes_on(
    release: threading.Event, concurrency: int
) -> None:
    # Calls that never return while the test runs: each one's thread is replaced when
    # it times out, so the stage keeps its concurrency, with one thread too.
    stuck_at_3 = stuck_at((3, 7), release)

    p = (
        PipelineBuilder()
        .add_source(range(20))
        .pipe(stuck_at_3, concurrency=concurrency, timeout=0.2, on_error="skip", name="s")
        .add_sink()
        .build()
    )
    t0 = time.monotonic()
    got, err = take_until_error(p)
    elapsed = time.monotonic() - t0
    assert err is None
    assert got == [x for x in range(20) if x not in (3, 7)]
    assert elapsed < 5, elapsed
    assert p.stats()["s"]["failures"] == 2


@pytest.mark.timeout(30)
@pytest.mark.parametrize("concurrency", [1, 3])
def test_sync_stage_timeout_raises_timeout_error_after_the_items_before(
    release: threading.Event, concurrency: int
) -> None:
    stuck_at_3 = stuck_at((3,), release)

    p = (
        PipelineBuilder()
        .add_source(range(20))
        .pipe(stuck_at_3, concurrency=concurrency, timeout=0.2, name="s")
        .add_sink()
        .build()
    )
    t0 = time.monotonic()
    got, err = take_until_error(p)
    # Neither the error nor the stop that follows it waits for the stuck call (which
    # waits 20 s): a generous bound below that, not a speed test.
    assert time.monotonic() - t0 < 15
    assert got == [0, 1, 2]
    assert isinstance(err, PipelineError)
    (inner,) = err.exceptions
    assert isinstance(inner, TimeoutError)
    assert "timeout=0.2" in str(inner)
    assert err.stage == "s"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_async_stage_timeout_cancels_the_coroutine(on_error: Any) -> None:
    cancelled: list[int] = []

    async def slow_at_2(x: int) -> int:
        if x == 2:
            try:
                await asyncio.sleep(20)
            except asyncio.CancelledError:
                cancelled.append(x)
                raise
        return x

    p = (
        PipelineBuilder()
        .add_source(range(6))
        .pipe(slow_at_2, concurrency=3, timeout=0.2, on_error=on_error)
        .add_sink()
        .build()
    )
    t0 = time.monotonic()
    got, err = take_until_error(p)
    assert time.monotonic() - t0 < 5
    assert cancelled == [2]
    if on_error == "skip":
        assert (got, err) == ([0, 1, 3, 4, 5], None)
    else:
        assert got == [0, 1]
        assert isinstance(err, PipelineError)
        assert isinstance(err.exceptions[0], TimeoutError)


@pytest.mark.timeout(30)
def test_async_stage_own_timeout_error_is_not_reworded() -> None:
    async def own(x: int) -> int:
        raise TimeoutError("my own")

    p = PipelineBuilder().add_source(range(3)).pipe(own, timeout=5).add_sink().build()
    _, err = take_until_error(p)
    assert isinstance(err, PipelineError)
    assert str(err.exceptions[0]) == "my own"


@pytest.mark.timeout(30)
def test_executor_stage_timeout(release: threading.Event) -> None:
    stuck_at_1 = stuck_at((1,), release)

    with ThreadPoolExecutor(4) as pool:
        p = (
            PipelineBuilder()
            .add_source(range(5))
            .pipe(stuck_at_1, executor=pool, concurrency=2, timeout=0.2, on_error="skip")
            .add_sink()
            .build()
        )
        assert drain(p) == [0, 2, 3, 4]
        release.set()


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), "1", True])
def test_invalid_timeouts_are_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="timeout"):
        PipelineBuilder().add_source(range(3)).pipe(lambda x: x, timeout=bad)
    with pytest.raises(ValueError, match="stall_warning_after"):
        PipelineBuilder().add_source(range(3)).build(stall_warning_after=bad)


def stall_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == LOGGER and r.levelno == logging.WARNING and "no progress" in r.message
    ]


@pytest.mark.timeout(30)
def test_stalled_stage_is_named_in_a_warning_and_stop_returns_promptly(
    release: threading.Event, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)

    hangs_at_5 = stuck_at((5,), release)

    p = (
        PipelineBuilder()
        .add_source(range(100))
        .pipe(lambda x: x, name="before")
        .pipe(hangs_at_5, name="hangs", concurrency=2)
        .pipe(lambda x: x, name="after")
        .add_sink(buffer_size=50)
        .build(stall_warning_after=0.3)
    )
    got: list[int] = []
    consumer = threading.Thread(target=lambda: got.extend(p), daemon=True)
    consumer.start()
    deadline = time.monotonic() + 10
    while not stall_records(caplog):
        assert time.monotonic() < deadline, "no stall warning"
        time.sleep(0.05)
    (rec, *_) = stall_records(caplog)
    assert "'hangs'" in rec.message
    assert got == [0, 1, 2, 3, 4]
    t0 = time.monotonic()
    p.stop()
    assert time.monotonic() - t0 < 3
    release.set()
    consumer.join(5)
    assert not consumer.is_alive()


@pytest.mark.timeout(30)
def test_stalled_source_is_named(
    release: threading.Event, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)

    def source() -> Iterator[int]:
        yield 1
        release.wait(20)
        yield 2

    p = (
        PipelineBuilder()
        .add_source(source())
        .pipe(lambda x: x)
        .add_sink()
        .build(stall_warning_after=0.2)
    )
    it = iter(p)
    assert next(it) == 1  # handed on at once, though the source then blocks
    deadline = time.monotonic() + 10
    while not stall_records(caplog):
        assert time.monotonic() < deadline, "no stall warning"
        time.sleep(0.05)
    assert "'source'" in stall_records(caplog)[0].message
    release.set()
    assert list(it) == [2]


@pytest.mark.timeout(120)
def test_a_slow_source_hands_each_item_on_as_it_comes() -> None:
    # Each item comes out when the source yields it, not when a batch of them is full:
    # the source yields item i + 1 only once the consumer has received item i (a pipeline
    # that waited for a batch would leave it waiting, 30 s, and `held` would say so).
    received = {i: threading.Event() for i in range(5)}
    held: list[int] = []

    def trickle() -> Iterator[int]:
        for i in range(5):
            if i > 0 and not received[i - 1].wait(timeout=30):
                held.append(i)
            yield i

    p = PipelineBuilder().add_source(trickle()).pipe(lambda x: x).add_sink().build()
    arrived = []
    with p.auto_stop():
        for x in p:
            arrived.append(x)
            received[x].set()
    assert arrived == [0, 1, 2, 3, 4]
    assert held == []


@pytest.mark.timeout(30)
def test_a_slow_consumer_is_not_a_stall(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    p = PipelineBuilder().add_source(range(20)).pipe(lambda x: x).add_sink(buffer_size=2)
    pipeline = p.build(stall_warning_after=0.1)
    got = []
    for x in pipeline:
        got.append(x)
        if x < 3:
            time.sleep(0.4)  # the pipeline waits for the consumer: not a stall
    assert got == list(range(20))
    assert stall_records(caplog) == []


@pytest.mark.timeout(30)
def test_stall_watch_off_with_none(
    release: threading.Event, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)

    def hangs(x: int) -> int:
        release.wait(0.5)
        return x

    p = PipelineBuilder().add_source(range(2)).pipe(hangs).add_sink()
    assert drain(p.build(stall_warning_after=None)) == [0, 1]
    assert stall_records(caplog) == []


# --------------------------------------------------------------------------------------
# lookup stages


@pytest.mark.timeout(30)
def test_dict_and_list_are_lookup_stages() -> None:
    names = {0: "zero", 1: "one", 2: "two"}
    squares = [x * x for x in range(10)]
    p = PipelineBuilder().add_source([2, 0, 1]).pipe(names).pipe(len).add_sink().build()
    assert drain(p) == [3, 4, 3]
    b = PipelineBuilder().add_source([3, 1]).pipe(squares).pipe(squares, concurrency=2)
    pipeline = b.add_sink().build()
    assert drain(pipeline) == [81, 1]
    assert set(pipeline.stats()) == {"source", "lookup(list)", "lookup(list)#2", "sink"}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_lookup_of_a_missing_key_follows_on_error(on_error: Any) -> None:
    table = {"a": 1, "c": 3}
    p = PipelineBuilder().add_source(["a", "b", "c"]).pipe(table, on_error=on_error).add_sink()
    got, err = take_until_error(p.build())
    if on_error == "skip":
        assert (got, err) == ([1, 3], None)
    else:
        assert got == [1]
        assert isinstance(err, PipelineError)
        assert err.stage == "lookup(dict)"
        assert isinstance(err.exceptions[0], KeyError)


# --------------------------------------------------------------------------------------
# custom aggregators


class UpTo:
    """Groups items until their sum reaches ``limit`` (SPDL's Aggregator protocol)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held: list[int] = []
        self.flushed = 0

    def accumulate(self, item: int) -> list[int] | None:
        self.held.append(item)
        if sum(self.held) >= self.limit:
            out, self.held = self.held, []
            return out
        return None

    def flush(self) -> list[int] | None:
        self.flushed += 1
        out, self.held = self.held, []
        return out or None


@pytest.mark.timeout(30)
def test_custom_aggregator_accumulates_in_order_and_flushes_at_the_end() -> None:
    agg = UpTo(10)
    src = [3, 4, 5, 9, 2, 8, 1, 1]
    p = PipelineBuilder().add_source(src).pipe(lambda x: x, concurrency=4).aggregate(agg)
    pipeline = p.add_sink().build()
    assert drain(pipeline) == [[3, 4, 5], [9, 2], [8, 1, 1]]
    assert agg.flushed == 1
    agg = UpTo(10)
    pipeline = PipelineBuilder().add_source([*src, 4]).aggregate(agg).add_sink().build()
    assert drain(pipeline) == [[3, 4, 5], [9, 2], [8, 1, 1], [4]]
    assert agg.flushed == 1


@pytest.mark.timeout(30)
def test_custom_aggregator_drop_last_does_not_flush() -> None:
    agg = UpTo(10)
    p = PipelineBuilder().add_source([6, 6, 1]).aggregate(agg, drop_last=True).add_sink()
    assert drain(p.build()) == [[6, 6]]
    assert agg.flushed == 0


@pytest.mark.timeout(30)
def test_custom_aggregator_errors_and_upstream_failures() -> None:
    class Bad:
        def accumulate(self, item: int) -> int | None:
            if item == 2:
                raise ZeroDivisionError("bad")
            return item

        def flush(self) -> None:
            raise AssertionError("never flushed after a failure")

    got, err = take_until_error(
        PipelineBuilder().add_source(range(5)).aggregate(Bad()).add_sink().build()
    )
    assert got == [0, 1]
    assert isinstance(err, PipelineError)
    assert isinstance(err.exceptions[0], ZeroDivisionError)
    agg = UpTo(10)
    got, err = take_until_error(
        PipelineBuilder().add_source(ten_then_raise()).aggregate(agg).add_sink().build()
    )
    assert got == [[0, 1, 2, 3, 4], [5, 6], [7, 8]]  # 9 was held: no flush
    assert agg.flushed == 0
    assert isinstance(err, PipelineError)
    assert err.stage == "source"
    with pytest.raises(TypeError, match="accumulate"):
        PipelineBuilder().add_source(range(3)).aggregate(object())  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------
# task hooks


class Recorder:
    """A hook with sync context managers that records what it sees."""

    def __init__(self, log: list[Any], tag: str) -> None:
        self.log = log
        self.tag = tag

    @contextlib.contextmanager
    def stage_hook(self) -> Iterator[None]:
        self.log.append((self.tag, "stage-start"))
        yield
        self.log.append((self.tag, "stage-end"))

    @contextlib.contextmanager
    def task_hook(self) -> Iterator[None]:
        self.log.append((self.tag, "task-start"))
        try:
            yield
        except Exception as e:
            self.log.append((self.tag, f"task-failed:{type(e).__name__}"))
            raise
        self.log.append((self.tag, "task-end"))


class AsyncRecorder(Recorder):
    """The same with async context managers, as SPDL's hooks are written."""

    @contextlib.asynccontextmanager
    async def stage_hook(self) -> AsyncIterator[None]:  # type: ignore[override]
        with Recorder.stage_hook(self):
            yield

    @contextlib.asynccontextmanager
    async def task_hook(self) -> AsyncIterator[None]:  # type: ignore[override]
        # A failure thrown in at the yield reaches the sync hook, which records it.
        with Recorder.task_hook(self):
            yield


def odd_fails_or_same(x: int) -> int:
    if x % 2:
        raise ValueError(x)
    return x


async def odd_fails_or_same_async(x: int) -> int:
    await asyncio.sleep(0)
    return odd_fails_or_same(x)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("hook_kind", [Recorder, AsyncRecorder], ids=["sync-hook", "async-hook"])
@pytest.mark.parametrize(
    "op", [odd_fails_or_same, odd_fails_or_same_async], ids=["sync-stage", "async-stage"]
)
def test_task_hooks_see_stage_start_end_and_every_call(hook_kind: Any, op: Any) -> None:
    log: list[Any] = []
    p = (
        PipelineBuilder()
        .add_source(range(6))
        .pipe(op, hooks=[hook_kind(log, "a")], on_error="skip", concurrency=2)
        .pipe(lambda x: x + 1, hooks=[hook_kind(log, "b")])
        .add_sink()
        .build()
    )
    assert log == []
    assert drain(p) == [1, 3, 5]
    a = [e for t, e in log if t == "a"]
    b = [e for t, e in log if t == "b"]
    assert (a[0], a[-1]) == ("stage-start", "stage-end")
    assert (b[0], b[-1]) == ("stage-start", "stage-end")
    assert a.count("task-start") == 6
    assert a.count("task-end") == 3
    assert a.count("task-failed:ValueError") == 3
    assert b.count("task-start") == b.count("task-end") == 3
    # Stage hooks: entered in stage order before any task, exited after every task.
    assert log.index(("a", "stage-start")) < log.index(("b", "stage-start")) < 2
    assert {log[-1], log[-2]} == {("a", "stage-end"), ("b", "stage-end")}


@pytest.mark.timeout(30)
def test_stage_hooks_end_when_the_pipeline_is_stopped_early() -> None:
    log: list[Any] = []
    p = (
        PipelineBuilder()
        .add_source(range(1000))
        .pipe(lambda x: x, hooks=[Recorder(log, "h")])
        .add_sink()
        .build()
    )
    with p.auto_stop():
        for x in p:
            if x == 3:
                break
    assert log[0] == ("h", "stage-start")
    assert log[-1] == ("h", "stage-end")
    assert log.count(("h", "stage-end")) == 1
    p.stop()
    assert log.count(("h", "stage-end")) == 1


@pytest.mark.timeout(30)
def test_a_task_hook_that_suppresses_drops_the_item() -> None:
    class Swallow:
        @contextlib.contextmanager
        def stage_hook(self) -> Iterator[None]:
            yield

        @contextlib.contextmanager
        def task_hook(self) -> Iterator[None]:
            with contextlib.suppress(ValueError):
                yield

    p = PipelineBuilder().add_source(range(5)).pipe(odd_fails_or_same, hooks=[Swallow()])
    assert drain(p.add_sink().build()) == [0, 2, 4]


def test_hooks_arguments_are_checked() -> None:
    from ferrofeed import ops

    b = PipelineBuilder().add_source(range(3))
    with pytest.raises(TypeError, match="task_hook"):
        b.pipe(lambda x: x, hooks=[object()])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="native"):
        b.pipe(ops.identity(), hooks=[Recorder([], "x")])
