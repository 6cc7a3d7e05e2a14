"""The pipeline engine through its Python API: results, order, errors, stats, arguments.

Shutdown, threads, signals, fork, interpreter exit and memory bounds are in
``test_pipeline_shutdown.py``.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import random
import threading
import time
import traceback
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from ferrofeed import Pipeline, PipelineBuilder, PipelineError, ops
from pipelines import drain

LOGGER = "ferrofeed.pipeline"
STAT_KEYS = {
    "items_in",
    "items_out",
    "dropped",
    "failures",
    "busy_s",
    "busy_per_item_s",
    "wait_upstream_s",
    "wait_downstream_s",
    "queue_mean",
    "queue_capacity",
    "concurrency",
}


def consume_into(p: Pipeline, got: list[Any]) -> None:
    """Append the pipeline's items to ``got`` until it ends (or raises)."""
    for x in p:
        got.append(x)


class InFlight:
    """Counts calls in progress (thread-safe) and remembers the most at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.finished: list[Any] = []

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def leave(self, item: Any) -> None:
        with self.lock:
            self.now -= 1
            self.finished.append(item)


# --------------------------------------------------------------------------------------
# order


@pytest.mark.timeout(30)
def test_order_preserved_sync_random_delays_concurrency_8() -> None:
    rng = random.Random(1234)
    delays = [rng.random() * 0.004 for _ in range(300)]
    track = InFlight()

    def work(i: int) -> tuple[int, str]:
        track.enter()
        time.sleep(delays[i])
        track.leave(i)
        return (i, f"item-{i}")

    p = PipelineBuilder().add_source(list(range(300))).pipe(work, concurrency=8).add_sink().build()
    out = drain(p)
    assert out == [(i, f"item-{i}") for i in range(300)]
    # The test means something only if items really ran at once and finished out of order.
    assert track.most > 1
    assert track.finished != sorted(track.finished)
    assert sorted(track.finished) == list(range(300))


@pytest.mark.timeout(30)
def test_order_preserved_async_random_delays_concurrency_8() -> None:
    rng = random.Random(99)
    delays = [rng.random() * 0.01 for _ in range(300)]
    track = InFlight()

    async def work(i: int) -> int:
        track.enter()
        await asyncio.sleep(delays[i])
        track.leave(i)
        return i * 10

    p = PipelineBuilder().add_source(range(300)).pipe(work, concurrency=8).add_sink().build()
    out = drain(p)
    assert out == [i * 10 for i in range(300)]
    assert 2 <= track.most <= 8
    assert track.finished != sorted(track.finished)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_unordered_yields_faster_items_first(kind: str) -> None:
    # All four items run at once. Item 3 finishes at once; item k finishes only after the
    # consumer has received item k + 1 (or, in ordered mode, after a 2 s timeout). So
    # unordered output is [3, 2, 1, 0] whatever the machine's load, and a stage that held
    # items back in source order would need 3 timeouts (6 s) to get there.
    gates = {i: threading.Event() for i in range(4)}
    gates[3].set()
    timeouts: list[int] = []

    def sync_work(i: int) -> int:
        if not gates[i].wait(timeout=30.0):
            timeouts.append(i)
        return i

    async def async_work(i: int) -> int:
        deadline = time.monotonic() + 30.0
        while not gates[i].is_set():
            if time.monotonic() > deadline:
                timeouts.append(i)
                break
            await asyncio.sleep(0.002)
        return i

    work: Callable[[int], Any] = sync_work if kind == "sync" else async_work
    p = (
        PipelineBuilder()
        .add_source([0, 1, 2, 3])
        .pipe(work, concurrency=4, ordered=False)
        .add_sink()
        .build()
    )
    out = []
    with p.auto_stop():
        for x in p:
            out.append(x)
            if x > 0:
                gates[x - 1].set()
    assert out == [3, 2, 1, 0]
    assert timeouts == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_unordered_with_timed_delays(kind: str) -> None:
    # The same with plain sleeps (well apart, for a loaded machine): fastest first.
    delays = {0: 0.9, 1: 0.6, 2: 0.3, 3: 0.0}

    def sync_work(i: int) -> int:
        time.sleep(delays[i])
        return i

    async def async_work(i: int) -> int:
        await asyncio.sleep(delays[i])
        return i

    work: Callable[[int], Any] = sync_work if kind == "sync" else async_work
    builder = PipelineBuilder().add_source([0, 1, 2, 3])
    p = builder.pipe(work, concurrency=4, ordered=False).add_sink().build()
    out = drain(p)
    assert out[0] == 3
    assert out[-1] == 0
    assert sorted(out) == [0, 1, 2, 3]
    ordered = PipelineBuilder().add_source([0, 1, 2, 3]).pipe(work, concurrency=4).add_sink()
    assert drain(ordered.build()) == [0, 1, 2, 3]


# --------------------------------------------------------------------------------------
# what stages do


@pytest.mark.timeout(30)
def test_none_drops_items() -> None:
    p = (
        PipelineBuilder()
        .add_source(list(range(100)))
        .pipe(lambda x: x if x % 3 else None, concurrency=3, name="keep")
        .pipe(lambda x: -x, name="neg")
        .add_sink()
        .build()
    )
    assert drain(p) == [-x for x in range(100) if x % 3]
    stats = p.stats()
    assert stats["keep"]["items_in"] == 100
    assert stats["keep"]["dropped"] == 34
    assert stats["keep"]["items_out"] == 66
    assert stats["neg"]["items_in"] == 66
    assert stats["neg"]["dropped"] == 0


@pytest.mark.timeout(30)
@pytest.mark.parametrize("source", [range(10), list(range(10))], ids=["native", "list"])
def test_aggregate(source: Any) -> None:
    def build(**kw: Any) -> Pipeline:
        return PipelineBuilder().add_source(source).aggregate(4, **kw).add_sink().build()

    assert drain(build()) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert drain(build(drop_last=True)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    exact = PipelineBuilder().add_source(range(8)).aggregate(4, drop_last=True).add_sink()
    assert drain(exact.build()) == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.timeout(30)
def test_aggregate_after_stage_and_stage_after_aggregate() -> None:
    p = (
        PipelineBuilder()
        .add_source(range(7))
        .pipe(lambda x: x * x, concurrency=2)
        .aggregate(3)
        .pipe(sum)
        .add_sink()
        .build()
    )
    assert drain(p) == [0 + 1 + 4, 9 + 16 + 25, 36]


@pytest.mark.timeout(30)
def test_native_range_source_and_native_op_chain() -> None:
    p = (
        PipelineBuilder()
        .add_source(range(5, 20_005, 2))
        .pipe(ops.identity())
        .pipe(ops.identity(), concurrency=4)
        .pipe(ops.identity())
        .add_sink()
        .build()
    )
    out = drain(p)
    assert out == list(range(5, 20_005, 2))
    assert all(type(x) is int for x in out[:10])
    stats = p.stats()
    assert list(stats) == ["source", "identity", "identity#2", "identity#3", "sink"]
    for name in ("identity", "identity#2", "identity#3"):
        assert stats[name]["items_in"] == stats[name]["items_out"] == 10_000
    assert stats["identity#2"]["concurrency"] == 4


@pytest.mark.timeout(30)
def test_native_ops_mixed_with_python_stages_and_native_batches() -> None:
    p = (
        PipelineBuilder()
        .add_source(range(10))
        .pipe(ops.identity())
        .aggregate(4)
        .pipe(ops.identity())
        .add_sink()
        .build()
    )
    assert drain(p) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    p = (
        PipelineBuilder()
        .add_source(range(10))
        .pipe(ops.identity())
        .pipe(lambda x: x * 3)
        .pipe(ops.identity())
        .add_sink()
        .build()
    )
    assert drain(p) == [x * 3 for x in range(10)]
    assert ops.identity().name == "identity"
    assert "identity" in repr(ops.identity())


@pytest.mark.timeout(30)
def test_negative_step_range_source() -> None:
    assert drain(PipelineBuilder().add_source(range(10, 0, -3)).add_sink().build()) == [
        10,
        7,
        4,
        1,
    ]
    assert drain(PipelineBuilder().add_source(range(0)).add_sink().build()) == []


@pytest.mark.timeout(30)
def test_async_generator_source() -> None:
    async def gen() -> AsyncIterator[int]:
        for i in range(50):
            await asyncio.sleep(0)
            yield i

    p = PipelineBuilder().add_source(gen()).pipe(lambda x: x + 1).add_sink().build()
    assert drain(p) == list(range(1, 51))


@pytest.mark.timeout(30)
def test_async_iterable_class_source() -> None:
    class Countdown:
        def __init__(self, n: int) -> None:
            self.n = n

        def __aiter__(self) -> Countdown:
            return self

        async def __anext__(self) -> int:
            await asyncio.sleep(0.001)
            if self.n == 0:
                raise StopAsyncIteration
            self.n -= 1
            return self.n

    async def halve(x: int) -> float:
        await asyncio.sleep(0)
        return x / 2

    p = PipelineBuilder().add_source(Countdown(20)).pipe(halve, concurrency=4).add_sink().build()
    assert drain(p) == [x / 2 for x in range(19, -1, -1)]


@pytest.mark.timeout(30)
def test_generator_source_and_callable_object_stages() -> None:
    class Scale:
        def __init__(self, k: int) -> None:
            self.k = k

        def __call__(self, x: int) -> int:
            return x * self.k

    class AsyncAdd:
        async def __call__(self, x: int) -> int:
            await asyncio.sleep(0)
            return x + 1

    p = (
        PipelineBuilder()
        .add_source(x for x in range(30))
        .pipe(Scale(3), concurrency=2)
        .pipe(AsyncAdd(), concurrency=3)
        .add_sink()
        .build()
    )
    assert drain(p) == [3 * x + 1 for x in range(30)]
    assert list(p.stats()) == ["source", "Scale", "AsyncAdd", "sink"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("concurrency", [1, 4])
def test_slow_stage_streams_items_as_they_finish(concurrency: int) -> None:
    # Each item is handed on when it is done, not held back for a batch: the calls after
    # item k wait until the consumer has received item k (a stage that held items back
    # would leave them waiting, 30 s each, and `held` would say so).
    received = {x: threading.Event() for x in range(40)}
    held: list[int] = []

    def slow(x: int) -> int:
        time.sleep(0.01)
        if x >= 3:
            return x
        if x > 0 and not received[x - 1].wait(timeout=30):
            held.append(x)
        return x

    p = PipelineBuilder().add_source(list(range(40))).pipe(slow, concurrency=concurrency)
    pipeline = p.add_sink().build()
    arrivals = []
    with pipeline.auto_stop():
        for x in pipeline:
            arrivals.append(x)
            received[x].set()
            if len(arrivals) == 3:
                break
    assert arrivals == [0, 1, 2]
    assert held == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize("concurrency", [2, 8])
def test_sync_stage_runs_concurrency_items_at_once(concurrency: int) -> None:
    # Every call waits at a barrier for `concurrency` calls: the pipeline completes only
    # if that many items really are in flight at once (on as many threads).
    barrier = threading.Barrier(concurrency, timeout=5)
    names: set[str] = set()

    def meet(x: int) -> int:
        names.add(threading.current_thread().name)
        barrier.wait()
        return x

    n = 4 * concurrency
    p = PipelineBuilder().add_source(range(n)).pipe(meet, concurrency=concurrency).add_sink()
    assert drain(p.build()) == list(range(n))
    assert len(names) == concurrency


@pytest.mark.timeout(30)
@pytest.mark.parametrize("concurrency", [4, 8])
def test_sync_stage_sleeping_calls_overlap(concurrency: int) -> None:
    # time.sleep releases the GIL: the calls of 0.25 s overlap on `concurrency` threads.
    track = InFlight()

    def nap(x: int) -> int:
        track.enter()
        time.sleep(0.25)
        track.leave(x)
        return x

    n = 2 * concurrency
    p = PipelineBuilder().add_source(range(n)).pipe(nap, concurrency=concurrency).add_sink()
    assert drain(p.build()) == list(range(n))
    # Every thread was inside a sleep at once: the calls overlapped (not a timing).
    assert track.most == concurrency


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ordered", [True, False])
def test_sync_stage_cheap_calls_mixed_with_sleeps_keep_order(ordered: bool) -> None:
    # Most calls are cheap (run many per GIL acquisition); every 5th sleeps, releasing
    # the GIL, so the threads overtake each other. Ordered output is still source order.
    # (An ordered stage holds a bounded window of items behind its oldest unfinished one,
    # so slow items overlap only if they are that close: here they are.)
    track = InFlight()

    def work(x: int) -> int:
        if x % 5 == 0:
            track.enter()
            time.sleep(0.002)
            track.leave(x)
        return x * 3

    n = 2000
    p = PipelineBuilder().add_source(range(n)).pipe(work, concurrency=4, ordered=ordered)
    out = drain(p.add_sink().build())
    expected = [x * 3 for x in range(n)]
    if ordered:
        assert out == expected
    else:
        assert sorted(out) == expected
    assert track.most > 1


@pytest.mark.timeout(60)
def test_sync_stage_runs_cheap_calls_in_runs_on_one_thread() -> None:
    # Cheap calls are batched: a thread that holds the GIL runs the items waiting for it
    # one after another, so the thread that runs consecutive items rarely changes (it
    # changed on nearly every item when each item was handed to a thread on its own).
    callers: list[int] = []

    def record(x: int) -> int:
        callers.append(threading.get_ident())
        return x

    n = 20_000
    p = PipelineBuilder().add_source(range(n)).pipe(record, concurrency=4).add_sink(64)
    assert drain(p.build()) == list(range(n))
    switches = sum(1 for a, b in itertools.pairwise(callers) if a != b)
    assert switches < n / 8, f"the calling thread changed {switches} times in {n} calls"


@pytest.mark.timeout(120)
def test_async_stage_concurrency_1000_sleeps_overlap() -> None:
    track = InFlight()

    async def nap(x: int) -> int:
        track.enter()
        await asyncio.sleep(0.05)
        track.leave(x)
        return x

    p = PipelineBuilder().add_source(range(1000)).pipe(nap, concurrency=1000).add_sink().build()
    t0 = time.perf_counter()
    with p.auto_stop():
        out = list(p)
    elapsed = time.perf_counter() - t0
    assert out == list(range(1000))
    # Sequentially this takes 50 s (a hang guard, not a speed test: the overlap is what
    # `track` shows).
    assert elapsed < 45, f"1000 concurrent 50 ms sleeps took {elapsed:.3f} s"
    assert track.most >= 100, f"at most {track.most} coroutines were in flight at once"


# --------------------------------------------------------------------------------------
# epochs, finished pipelines


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "source", [range(20), list(range(20)), (0, 1, 2)], ids=["range", "list", "tuple"]
)
def test_builder_builds_again_for_a_second_epoch(source: Any) -> None:
    builder = PipelineBuilder().add_source(source).pipe(lambda x: x + 100).aggregate(3)
    builder.add_sink()
    first = drain(builder.build())
    second = drain(builder.build())
    expected = [list(source[i : i + 3]) for i in range(0, len(source), 3)]
    assert first == [[x + 100 for x in g] for g in expected]
    assert second == first


@pytest.mark.timeout(30)
def test_finished_pipeline_iterated_again_raises() -> None:
    p = PipelineBuilder().add_source(range(5)).pipe(lambda x: x).add_sink().build()
    assert not p.finished
    assert list(p) == [0, 1, 2, 3, 4]
    assert p.finished
    with pytest.raises(RuntimeError, match="finished"):
        list(p)
    with pytest.raises(RuntimeError, match="finished"):
        iter(p)


@pytest.mark.timeout(30)
def test_failed_pipeline_iterated_again_raises() -> None:
    def bad(x: int) -> int:
        raise ValueError(x)

    p = PipelineBuilder().add_source(range(5)).pipe(bad).add_sink().build()
    with pytest.raises(PipelineError):
        list(p)
    assert p.finished
    with pytest.raises(RuntimeError, match="finished"):
        list(p)


@pytest.mark.timeout(30)
def test_stopped_pipeline_iterated_again_raises() -> None:
    """After ``break`` inside ``auto_stop()`` the pipeline is finished: what it had finished
    (in its sink) can still be read, then iterating it again says so."""
    p = PipelineBuilder().add_source(range(1000)).pipe(lambda x: x).add_sink().build()
    with p.auto_stop():
        for x in p:
            if x == 3:
                time.sleep(0.2)  # the sink fills meanwhile
                break
    assert p.finished
    rest = list(p)
    assert len(rest) >= 3  # the sink's buffer_size
    assert rest == list(range(4, 4 + len(rest)))
    with pytest.raises(RuntimeError, match="finished"):
        list(p)


@pytest.mark.timeout(30)
def test_start_then_iterate_and_stop_is_idempotent() -> None:
    p = PipelineBuilder().add_source(range(10)).pipe(lambda x: x * 2).add_sink().build()
    p.start()
    # A pipeline runs once (as SPDL's): a second start() is refused, and changes nothing.
    with pytest.raises(RuntimeError, match="started already"):
        p.start()
    assert list(p) == [x * 2 for x in range(10)]
    p.stop()
    p.stop()
    assert p.finished
    with pytest.raises(RuntimeError, match="started already"):
        p.start()


# --------------------------------------------------------------------------------------
# errors


def parse_record(x: int) -> int:
    if x == 5:
        raise ValueError(f"bad record {x}")
    return x


async def fetch_record(x: int) -> int:
    await asyncio.sleep(0)
    if x == 7:
        raise LookupError(f"missing {x}")
    return x


def failing_source() -> Iterator[int]:
    yield from range(10)
    raise KeyError("source broke")


async def failing_async_source() -> AsyncIterator[int]:
    for i in range(10):
        yield i
    raise KeyError("async source broke")


def check_pipeline_error(
    e: PipelineError, stage: str, etype: type[BaseException], func: str
) -> BaseException:
    assert isinstance(e, ExceptionGroup)
    assert e.stage == stage
    assert stage in str(e)
    assert len(e.exceptions) == 1
    inner = e.exceptions[0]
    assert type(inner) is etype
    notes = getattr(inner, "__notes__", [])
    assert any(stage in n for n in notes), notes
    frames = [f.name for f in traceback.extract_tb(inner.__traceback__)]
    assert func in frames, frames
    return inner


@pytest.mark.timeout(30)
@pytest.mark.parametrize("concurrency", [1, 4])
def test_error_propagates_with_user_frame_and_stage(concurrency: int) -> None:
    p = (
        PipelineBuilder()
        .add_source(range(100))
        .pipe(parse_record, concurrency=concurrency, name="parse")
        .pipe(lambda x: x)
        .add_sink()
        .build()
    )
    got = []
    with pytest.raises(PipelineError) as info:
        consume_into(p, got)
    inner = check_pipeline_error(info.value, "parse", ValueError, "parse_record")
    assert str(inner) == "bad record 5"
    assert got == list(range(len(got)))
    assert len(got) <= 5
    assert p.finished


@pytest.mark.timeout(30)
def test_error_in_async_stage_propagates() -> None:
    p = PipelineBuilder().add_source(range(50)).pipe(fetch_record, concurrency=8).add_sink()
    with pytest.raises(PipelineError) as info:
        drain(p.build())
    inner = check_pipeline_error(info.value, "fetch_record", LookupError, "fetch_record")
    assert str(inner) == "missing 7"


@pytest.mark.timeout(30)
def test_except_star_catches_original_type() -> None:
    p = PipelineBuilder().add_source(range(100)).pipe(parse_record, name="parse").add_sink()
    caught: list[BaseException] = []
    try:
        drain(p.build())
    except* ValueError as group:
        caught.append(group)
    assert len(caught) == 1
    group = caught[0]
    assert isinstance(group, PipelineError)
    assert group.stage == "parse"
    assert [str(e) for e in group.exceptions] == ["bad record 5"]


@pytest.mark.timeout(30)
def test_traceback_printout_names_function_and_stage() -> None:
    p = PipelineBuilder().add_source(range(100)).pipe(parse_record, name="parse").add_sink()
    with pytest.raises(PipelineError) as info:
        drain(p.build())
    text = "".join(traceback.format_exception(info.value))
    assert "parse_record" in text
    assert "bad record 5" in text
    assert any("parse" in line and "stage" in line for line in text.splitlines()), text


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("source", "func", "message"),
    [
        (failing_source, "failing_source", "'source broke'"),
        (failing_async_source, "failing_async_source", "'async source broke'"),
    ],
    ids=["sync", "async"],
)
def test_source_exception_surfaces(source: Callable[[], Any], func: str, message: str) -> None:
    p = PipelineBuilder().add_source(source()).pipe(lambda x: x, concurrency=2).add_sink().build()
    got = []
    t0 = time.monotonic()
    with pytest.raises(PipelineError) as info:
        consume_into(p, got)
    elapsed = time.monotonic() - t0
    assert elapsed < 5, f"took {elapsed:.2f} s"
    inner = check_pipeline_error(info.value, "source", KeyError, func)
    assert str(inner) == message
    assert got == list(range(len(got)))
    # Whether the async source's event loop is closed is test_async_source_closes_its_event_loop's
    # business: collect it here so that its ResourceWarning cannot fail a later test.
    del info, inner, p
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", ["source-error", "break"])
def test_async_source_closes_its_event_loop(how: str) -> None:
    """The async source's private event loop is closed however the pipeline ends."""

    async def endless() -> AsyncIterator[int]:
        i = 0
        while True:
            await asyncio.sleep(0)
            yield i
            i += 1

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if how == "source-error":
            p = PipelineBuilder().add_source(failing_async_source()).add_sink().build()
            with pytest.raises(PipelineError):
                drain(p)
        else:
            p = PipelineBuilder().add_source(endless()).add_sink().build()
            with p.auto_stop():
                for x in p:
                    if x == 5:
                        break
        del p
        gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaks == []


@pytest.mark.timeout(30)
def test_error_while_sink_is_full_does_not_hang() -> None:
    def late_failure(x: int) -> int:
        if x == 30:
            raise RuntimeError("late")
        return x

    p = (
        PipelineBuilder()
        .add_source(range(1000))
        .pipe(late_failure, concurrency=4, name="late_failure")
        .add_sink(buffer_size=1)
        .build()
    )
    got = []
    with pytest.raises(PipelineError) as info:  # noqa: PT012 - the loop is the point
        for x in p:
            got.append(x)
            time.sleep(0.002)  # a slow consumer: every queue is full when the error comes
    assert info.value.stage == "late_failure"
    assert got == list(range(len(got)))
    assert len(got) <= 30


@pytest.mark.timeout(60)
def test_error_with_slow_sibling_items_surfaces_promptly() -> None:
    def work(x: int) -> int:
        if x == 3:
            raise ValueError("fast failure")
        time.sleep(0.2)
        return x

    p = PipelineBuilder().add_source(range(10_000)).pipe(work, concurrency=8, name="work")
    p = p.add_sink().build()
    with pytest.raises(PipelineError):
        drain(p)
    # The failure comes after one round of 0.2 s sleeps (the test's timeout guards against
    # a hang); the remaining 10k items are not processed.
    assert p.stats()["work"]["items_in"] < 100


@pytest.mark.timeout(60)
def test_skip_counts_exact_over_10k_items(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)

    def flaky(x: int) -> int:
        if x % 100 == 37:
            raise ValueError(f"flaky item {x}")
        return x

    p = (
        PipelineBuilder()
        .add_source(range(10_000))
        .pipe(flaky, concurrency=4, on_error="skip", name="flaky")
        .add_sink()
        .build()
    )
    out = drain(p)
    assert out == [x for x in range(10_000) if x % 100 != 37]
    assert len(out) == 9900
    stats = p.stats()["flaky"]
    assert stats["failures"] == 100
    assert stats["items_in"] == 10_000
    assert stats["items_out"] == 9900
    assert stats["dropped"] == 0
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warnings) == 100
    messages = sorted(r.getMessage() for r in warnings)
    assert all("flaky" in m and "ValueError" in m for m in messages), messages[:3]
    assert sum(m.endswith("flaky item 37") for m in messages) == 1
    assert sum(m.endswith("flaky item 9937") for m in messages) == 1


@pytest.mark.timeout(30)
def test_skip_in_async_stage() -> None:
    async def flaky(x: int) -> int:
        await asyncio.sleep(0)
        if x % 10 == 0:
            raise ValueError(x)
        return x

    p = PipelineBuilder().add_source(range(200))
    p = p.pipe(flaky, concurrency=16, on_error="skip", name="flaky")
    pipeline = p.add_sink().build()
    assert drain(pipeline) == [x for x in range(200) if x % 10]
    assert pipeline.stats()["flaky"]["failures"] == 20


@pytest.mark.timeout(30)
@pytest.mark.parametrize("limit", [0, 3])
def test_max_failures_trips(limit: int) -> None:
    def flaky(x: int) -> int:
        if x % 10 == 9:
            raise ValueError(f"flaky {x}")
        return x

    p = (
        PipelineBuilder()
        .add_source(range(1000))
        .pipe(flaky, on_error="skip", max_failures=limit, name="flaky")
        .add_sink()
        .build()
    )
    got = []
    with pytest.raises(PipelineError) as info:
        consume_into(p, got)
    e = info.value
    assert e.stage == "flaky"
    assert "max_failures" in str(e)
    inner = check_pipeline_error(e, "flaky", ValueError, "flaky")
    # The error that tripped the limit is the (limit + 1)-th failure: item 10 * limit + 9.
    assert str(inner) == f"flaky {10 * limit + 9}"
    assert p.stats()["flaky"]["failures"] == limit + 1
    assert len(got) <= 9 * (limit + 1)


@pytest.mark.timeout(30)
def test_max_failures_not_reached_does_not_trip() -> None:
    def flaky(x: int) -> int:
        if x in (10, 20, 30):
            raise ValueError(x)
        return x

    p = PipelineBuilder().add_source(range(100))
    p = p.pipe(flaky, on_error="skip", max_failures=3, name="flaky")
    pipeline = p.add_sink().build()
    assert drain(pipeline) == [x for x in range(100) if x not in (10, 20, 30)]
    assert pipeline.stats()["flaky"]["failures"] == 3


# --------------------------------------------------------------------------------------
# stats


@pytest.mark.timeout(30)
def test_stats_values_are_sane() -> None:
    def slow_source() -> Iterator[int]:
        for i in range(50):
            time.sleep(0.002)
            yield i

    def work(x: int) -> int:
        time.sleep(0.001)
        return x

    p = (
        PipelineBuilder()
        .add_source(slow_source())
        .pipe(work, concurrency=3, name="work")
        .aggregate(5)
        .add_sink(buffer_size=4)
        .build()
    )
    before = p.stats()
    assert list(before) == ["source", "work", "aggregate(5)", "sink"]
    assert all(set(s) == STAT_KEYS for s in before.values())
    assert before["work"]["items_in"] == 0
    out = drain(p)
    assert len(out) == 10
    s = p.stats()
    assert s["source"]["items_out"] == 50
    assert s["work"]["items_in"] == 50
    assert s["work"]["items_out"] == 50
    assert s["aggregate(5)"]["items_in"] == 50
    assert s["aggregate(5)"]["items_out"] == 10
    assert s["sink"]["items_in"] == 10
    assert s["work"]["concurrency"] == 3
    assert s["source"]["concurrency"] == 1
    # Queue capacities: each queue has room for what the next stage works on at once;
    # the last stage writes into the sink's buffer.
    assert s["source"]["queue_capacity"] >= 3
    assert s["work"]["queue_capacity"] >= 1
    assert s["aggregate(5)"]["queue_capacity"] == 4
    for name in ("source", "work", "aggregate(5)"):
        assert 0 <= s[name]["queue_mean"] <= s[name]["queue_capacity"], (name, s[name])
    # Busy time: 50 calls of a 1 ms sleep; the source sleeps 2 ms per item.
    assert s["work"]["busy_s"] >= 0.045
    assert s["work"]["busy_per_item_s"] == pytest.approx(s["work"]["busy_s"] / 50, rel=0.01)
    assert s["work"]["busy_per_item_s"] >= 0.0009
    assert s["source"]["busy_s"] >= 0.09
    # The stage waits for its slow source.
    assert s["work"]["wait_upstream_s"] >= 0.03
    for stats in s.values():
        for key in ("busy_s", "wait_upstream_s", "wait_downstream_s"):
            assert 0 <= stats[key] < 30, (key, stats)
        assert stats["failures"] == 0
        assert stats["dropped"] == 0


@pytest.mark.timeout(30)
def test_stats_show_a_slow_consumer_as_downstream_wait() -> None:
    p = PipelineBuilder().add_source(range(40)).pipe(lambda x: x, name="fast")
    pipeline = p.add_sink(buffer_size=2).build()
    with pipeline.auto_stop():
        for _ in pipeline:
            time.sleep(0.005)
    s = pipeline.stats()
    # 40 items at 5 ms each: the fast stage spends most of ~0.2 s waiting to send.
    assert s["fast"]["wait_downstream_s"] >= 0.08
    assert s["fast"]["queue_mean"] >= 1.0


@pytest.mark.timeout(30)
def test_stats_table_lists_every_stage() -> None:
    p = PipelineBuilder().add_source(range(10)).pipe(lambda x: x, name="decode").aggregate(2)
    pipeline = p.add_sink().build()
    drain(pipeline)
    table = pipeline.stats_table()
    assert isinstance(table, str)
    lines = table.strip().splitlines()
    assert len(lines) >= 5
    for name in ("source", "decode", "aggregate(2)", "sink"):
        assert any(line.startswith(name) for line in lines), table


@pytest.mark.timeout(30)
def test_report_stats_interval_logs_a_table(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)

    def work(x: int) -> int:
        time.sleep(0.01)
        return x

    p = PipelineBuilder().add_source(range(40)).pipe(work, name="work").add_sink()
    pipeline = p.build(report_stats_interval=0.05)
    assert drain(pipeline) == list(range(40))

    def reports() -> list[str]:
        return [
            r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.INFO
        ]

    got = reports()
    assert len(got) >= 3, got  # ~0.4 s of work, a report every 0.05 s
    assert all("source" in m and "work" in m and "sink" in m for m in got), got[0]
    # Once the pipeline is stopped, the reports stop.
    n = len(got)
    time.sleep(0.2)
    assert len(reports()) == n


@pytest.mark.timeout(30)
def test_no_report_without_interval(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    p = PipelineBuilder().add_source(range(20)).pipe(lambda x: time.sleep(0.01) or x).add_sink()
    drain(p.build())
    assert [r for r in caplog.records if r.levelno >= logging.INFO] == []


# --------------------------------------------------------------------------------------
# arguments


def _builder() -> PipelineBuilder:
    return PipelineBuilder().add_source(range(3))


@pytest.mark.parametrize(
    ("make", "exc"),
    [
        (lambda: _builder().pipe(str, concurrency=0), ValueError),
        (lambda: _builder().pipe(str, concurrency=-2), ValueError),
        (lambda: _builder().pipe(str, concurrency=1.5), ValueError),
        (lambda: _builder().pipe(str, on_error="x"), ValueError),
        (lambda: _builder().pipe(str, max_failures=3), ValueError),
        (lambda: _builder().pipe(str, on_error="raise", max_failures=3), ValueError),
        (lambda: _builder().pipe(str, on_error="skip", max_failures=-1), ValueError),
        (lambda: PipelineBuilder().pipe(str), ValueError),
        (lambda: PipelineBuilder().aggregate(2), ValueError),
        (lambda: _builder().pipe(str, name="a").pipe(repr, name="a"), ValueError),
        (lambda: _builder().pipe(str, name="source"), ValueError),
        (lambda: _builder().pipe(str, name="sink"), ValueError),
        (lambda: _builder().pipe(42), TypeError),
        (lambda: _builder().aggregate(0), ValueError),
        (lambda: _builder().add_source(range(3)), ValueError),
        (lambda: _builder().add_sink(buffer_size=0), ValueError),
        (lambda: _builder().add_sink().pipe(str), ValueError),
        (lambda: PipelineBuilder().add_source(42), TypeError),
        (lambda: PipelineBuilder().build(), ValueError),
        (lambda: _builder().add_sink().build(num_threads=0), ValueError),
        (lambda: _builder().add_sink().build(report_stats_interval=0), ValueError),
        (lambda: _builder().add_sink().build(report_stats_interval=-1.0), ValueError),
    ],
    ids=[
        "concurrency-0",
        "concurrency-negative",
        "concurrency-float",
        "on_error-x",
        "max_failures-without-skip",
        "max_failures-with-raise",
        "max_failures-negative",
        "pipe-before-source",
        "aggregate-before-source",
        "duplicate-explicit-name",
        "reserved-name-source",
        "reserved-name-sink",
        "op-not-callable",
        "aggregate-0",
        "second-source",
        "sink-buffer-0",
        "pipe-after-sink",
        "source-not-iterable",
        "build-without-source",
        "num_threads-0",
        "report-interval-0",
        "report-interval-negative",
    ],
)
def test_invalid_arguments_rejected(make: Callable[[], Any], exc: type[Exception]) -> None:
    with pytest.raises(exc):
        make()


def test_default_names_made_unique() -> None:
    p = (
        PipelineBuilder()
        .add_source(range(4))
        .pipe(lambda x: x + 1)
        .pipe(lambda x: x * 2)
        .pipe(parse_record)
        .pipe(parse_record)
        .add_sink()
        .build()
    )
    names = list(p.stats())
    assert len(names) == 6
    assert names[0] == "source"
    assert names[-1] == "sink"
    # Default names are the function's (qualified) name, made unique with a suffix.
    assert names[1].endswith("<lambda>")
    assert names[2] == names[1] + "#2"
    assert names[3:5] == ["parse_record", "parse_record#2"]
    assert drain(p) == [2, 4, 6, 8]
