"""SPDL parity of the stage layer: task hooks, call failures, start, errors; typed specs."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import typing
from collections.abc import AsyncIterator, Iterator
from typing import Any

import ferrofeed
import pytest
from ferrofeed import PipelineBuilder, PipelineError, _core, ops
from pipelines import assert_fails_as_programming_error, drain


class ItemRecorder:
    """A hook whose task_hook takes the item, as SPDL passes it."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.stages = 0

    @contextlib.contextmanager
    def stage_hook(self) -> Iterator[None]:
        self.stages += 1
        yield

    @contextlib.contextmanager
    def task_hook(self, input_item: Any) -> Iterator[None]:
        self.items.append(input_item)
        yield


class AsyncItemRecorder(ItemRecorder):
    @contextlib.asynccontextmanager
    async def task_hook(self, input_item: Any) -> AsyncIterator[None]:  # type: ignore[override]
        self.items.append(input_item)
        yield


class NoArgHook:
    """A task_hook without the item (hooks written before SPDL passed it)."""

    def __init__(self) -> None:
        self.calls = 0

    @contextlib.contextmanager
    def stage_hook(self) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def task_hook(self) -> Iterator[None]:
        self.calls += 1
        yield


async def async_double(x: int) -> int:
    await asyncio.sleep(0)
    return 2 * x


# --------------------------------------------------------------------------------------
# task_hook(input_item)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("hook_kind", [ItemRecorder, AsyncItemRecorder], ids=["sync", "async"])
@pytest.mark.parametrize("op", [lambda x: 2 * x, async_double], ids=["sync-op", "async-op"])
def test_task_hook_receives_the_item_being_processed(hook_kind: Any, op: Any) -> None:
    hook = hook_kind()
    p = PipelineBuilder().add_source(range(10)).pipe(op, hooks=[hook], concurrency=3)
    assert drain(p.add_sink().build()) == [2 * x for x in range(10)]
    assert sorted(hook.items) == list(range(10))
    assert hook.stages == 1


@pytest.mark.timeout(60)
def test_a_task_hook_without_an_argument_still_works() -> None:
    hook = NoArgHook()
    p = PipelineBuilder().add_source(range(7)).pipe(str, hooks=[hook])  # type: ignore[list-item]
    assert drain(p.add_sink().build()) == [str(x) for x in range(7)]
    assert hook.calls == 7


def test_a_task_hook_that_takes_two_arguments_is_refused() -> None:
    class TwoArgs(NoArgHook):
        def task_hook(self, a: Any, b: Any) -> Any:  # type: ignore[override]
            return contextlib.nullcontext()

    with pytest.raises(TypeError, match="task_hook"):
        PipelineBuilder().add_source(range(3)).pipe(str, hooks=[TwoArgs()])  # type: ignore[list-item]


# --------------------------------------------------------------------------------------
# hooks on aggregate stages


@pytest.mark.timeout(60)
def test_hooks_wrap_aggregate_stages() -> None:
    hook = ItemRecorder()
    p = PipelineBuilder().add_source(range(7)).aggregate(3, hooks=[hook]).add_sink().build()
    assert drain(p) == [[0, 1, 2], [3, 4, 5], [6]]
    assert hook.items == [[0, 1, 2], [3, 4, 5], [6]]  # the task hook sees each group
    assert hook.stages == 1


@pytest.mark.timeout(60)
def test_hooks_wrap_custom_aggregators_and_can_drop() -> None:
    class Pairs:
        def __init__(self) -> None:
            self.held: list[int] = []

        def accumulate(self, item: int) -> list[int] | None:
            if item == 3:
                raise ValueError("three")
            self.held.append(item)
            if len(self.held) == 2:
                out, self.held = self.held, []
                return out
            return None

        def flush(self) -> list[int] | None:
            return self.held or None

    class Swallow(ItemRecorder):
        @contextlib.contextmanager
        def task_hook(self, input_item: Any) -> Iterator[None]:
            self.items.append(input_item)
            with contextlib.suppress(ValueError):
                yield

    hook = Swallow()
    p = PipelineBuilder().add_source(range(6)).aggregate(Pairs(), hooks=[hook])
    assert drain(p.add_sink().build()) == [[0, 1], [2, 4], [5]]
    assert hook.items == list(range(6))


def test_hooks_on_a_native_grouping_op_are_refused() -> None:
    with pytest.raises(ValueError, match="native"):
        PipelineBuilder().add_source([]).pipe(ops.collate(4), hooks=[ItemRecorder()])


# --------------------------------------------------------------------------------------
# hooks that are not context manager factories


class GeneratorStageHook(NoArgHook):
    def stage_hook(self) -> Iterator[None]:  # type: ignore[override]
        yield  # a generator function, not decorated


class CoroutineTaskHook(ItemRecorder):
    async def task_hook(self, input_item: Any) -> None:  # type: ignore[override]
        return None  # a coroutine function, no @asynccontextmanager


class AsyncGeneratorStageHook(ItemRecorder):
    async def stage_hook(self) -> AsyncIterator[None]:  # type: ignore[override]
        yield  # an async generator function, not decorated


@pytest.mark.parametrize(
    ("hook", "match"),
    [
        (GeneratorStageHook(), r"stage_hook .* is a generator function"),
        (CoroutineTaskHook(), r"task_hook .* is a coroutine function"),
        (AsyncGeneratorStageHook(), r"stage_hook .* is an async generator function"),
    ],
    ids=["generator", "coroutine", "async-generator"],
)
@pytest.mark.parametrize("where", ["pipe", "aggregate"])
def test_hooks_that_are_not_context_manager_factories_are_refused_at_build(
    hook: Any, match: str, where: str
) -> None:
    b = PipelineBuilder().add_source(range(3))
    b = b.pipe(str, hooks=[hook]) if where == "pipe" else b.aggregate(2, hooks=[hook])
    b.add_sink()
    with pytest.raises(ValueError, match=match):
        b.build()


# --------------------------------------------------------------------------------------
# stage hooks that fail


class FailingStageHook(NoArgHook):
    def __init__(self, *, on_enter: bool) -> None:
        super().__init__()
        self.on_enter = on_enter
        self.ran = 0

    @contextlib.contextmanager
    def stage_hook(self) -> Iterator[None]:
        if self.on_enter:
            raise TypeError("cannot enter")
        yield
        raise TypeError("cannot leave")

    @contextlib.contextmanager
    def task_hook(self) -> Iterator[None]:
        self.ran += 1
        yield


def fmt_pipeline(hook: FailingStageHook) -> Any:
    """``range(5)`` through ``str`` in a stage named "fmt" that has ``hook``."""
    return (
        PipelineBuilder()
        .add_source(range(5))
        .pipe(str, name="fmt", hooks=[hook])  # type: ignore[list-item]
        .add_sink()
        .build()
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["start", "iterate", "auto_stop"])
def test_a_stage_hook_failing_to_enter_reaches_the_consumer_as_pipeline_error(how: str) -> None:
    hook = FailingStageHook(on_enter=True)
    p = fmt_pipeline(hook)

    def start() -> None:
        if how == "start":
            p.start()
        elif how == "iterate":
            next(iter(p))
        else:
            with p.auto_stop():
                pass

    with pytest.raises(PipelineError) as info:
        start()
    assert info.value.stage == "fmt"
    assert str(info.value).startswith('stage "fmt" failed')
    assert 'raised in pipeline stage "fmt"' in info.value.__notes__
    (inner,) = info.value.exceptions
    assert isinstance(inner, TypeError)
    assert "cannot enter" in str(inner)
    assert hook.ran == 0  # nothing ran
    with pytest.raises(RuntimeError, match="finished"):
        list(p)
    p.stop()


@pytest.mark.timeout(60)
def test_a_stage_hook_failing_to_leave_reaches_the_consumer_as_pipeline_error() -> None:
    hook = FailingStageHook(on_enter=False)
    p = fmt_pipeline(hook)
    got: list[str] = []
    with pytest.raises(PipelineError) as info:
        got.extend(p)
    assert got == [str(x) for x in range(5)]
    assert info.value.stage == "fmt"
    assert "cannot leave" in str(info.value.exceptions[0])
    p.stop()  # left already: nothing more


# --------------------------------------------------------------------------------------
# a call that fails before the op runs is not a bad item


def one_arg(x: int) -> int:
    if x == 2:
        raise TypeError("a bad item, raised inside the function")
    return x


def two_args(x: int, y: int) -> int:
    return x + y


def gen_two_args(x: int, y: int) -> Iterator[int]:
    yield x + y


class CallableTwoArgs:
    def __call__(self, x: int, y: int) -> int:
        return x + y


BAD_CALLS = {
    "function": two_args,
    "generator function": gen_two_args,
    "callable object": CallableTwoArgs(),
    "partial": functools.partial(one_arg, nope=1),  # type: ignore[call-arg]
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("op", list(BAD_CALLS.values()), ids=list(BAD_CALLS))
@pytest.mark.parametrize("with_hooks", [False, True], ids=["plain", "hooked"])
def test_a_call_that_fails_before_the_op_runs_fails_the_pipeline_under_skip(
    op: Any, with_hooks: bool
) -> None:
    hooks = [ItemRecorder()] if with_hooks else None
    p = (
        PipelineBuilder()
        .add_source(range(5))
        .pipe(op, on_error="skip", hooks=hooks, concurrency=2)
        .add_sink()
        .build()
    )
    assert_fails_as_programming_error(p)


@pytest.mark.timeout(60)
def test_a_type_error_raised_inside_the_op_is_still_skipped() -> None:
    p = PipelineBuilder().add_source(range(5)).pipe(one_arg, on_error="skip").add_sink().build()
    assert drain(p) == [0, 1, 3, 4]
    # A lookup table's own TypeError (an unhashable item) is the item's too.
    table = {1: "one", 2: "two"}
    p = PipelineBuilder().add_source([1, [2], 2]).pipe(table, on_error="skip").add_sink().build()
    assert drain(p) == ["one", "two"]


# --------------------------------------------------------------------------------------
# start() twice, and errors that name their stage


@pytest.mark.timeout(60)
def test_start_on_a_started_pipeline_raises_runtime_error() -> None:
    p = PipelineBuilder().add_source(range(3)).pipe(str).add_sink().build()
    with p.auto_stop():
        with pytest.raises(RuntimeError, match="started already"):
            p.start()
        assert list(p) == ["0", "1", "2"]


def broken_source() -> Iterator[int]:
    yield 1
    raise OSError("the disk went away")


def fail_at_2(x: int) -> int:
    if x == 2:
        raise ValueError("two")
    return x


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("builder", "stage"),
    [
        (lambda: PipelineBuilder().add_source(broken_source()), "source"),
        (lambda: PipelineBuilder().add_source(range(5)).pipe(fail_at_2, name="two"), "two"),
    ],
    ids=["source", "stage"],
)
def test_a_pipeline_error_carries_a_note_naming_its_stage(builder: Any, stage: str) -> None:
    p = builder().add_sink().build()
    with pytest.raises(PipelineError) as info:
        drain(p)
    assert info.value.stage == stage
    assert f'raised in pipeline stage "{stage}"' in info.value.__notes__
    assert any(stage in n for n in info.value.exceptions[0].__notes__)


def test_task_hook_and_aggregator_are_public_protocols() -> None:
    for name in ("TaskHook", "Aggregator"):
        assert name in ferrofeed.__all__
        cls = getattr(ferrofeed, name)
        assert getattr(cls, "_is_protocol", False)
    assert isinstance(ferrofeed.TaskHook, type)
    assert typing.get_type_hints(ferrofeed.TaskHook.task_hook)["return"] is Any


# --------------------------------------------------------------------------------------
# typed stage specs


def test_stage_specs_are_typed_frozen_and_checked() -> None:
    m = _core.MapSpec("m", str, concurrency=2, on_error="skip", max_failures=3, timeout=1.5)
    assert (m.name, m.op, m.kind, m.concurrency) == ("m", str, "sync", 2)
    assert (m.on_error, m.max_failures, m.ordered, m.timeout) == ("skip", 3, True, 1.5)
    assert repr(m) == (
        "MapSpec(\"m\", <class 'str'>, kind='sync', concurrency=2, on_error='skip', "
        "max_failures=3, ordered=True, timeout=1.5)"
    )
    assert type(m).__module__ == "ferrofeed._core"
    with pytest.raises(AttributeError):
        m.concurrency = 3  # type: ignore[misc]
    a = _core.AggregateSpec("a", 4, drop_last=True)
    assert (a.name, a.size, a.drop_last, a.combine) == ("a", 4, True, None)
    assert repr(a) == 'AggregateSpec("a", 4, drop_last=True, combine=None)'
    acc = _core.AccumulateSpec("acc", list.append)
    assert acc.flush is None
    assert repr(_core.DisaggregateSpec("d")) == 'DisaggregateSpec("d")'
    for bad, err in [
        (lambda: _core.MapSpec("m", str, kind="threads"), ValueError),  # type: ignore[arg-type]
        (lambda: _core.MapSpec("m", str, kind="native"), TypeError),
        (lambda: _core.MapSpec("m", ops.identity()), TypeError),
        (lambda: _core.MapSpec("m", 3), TypeError),  # type: ignore[arg-type]
        (lambda: _core.MapSpec("m", str, concurrency=0), ValueError),
        (lambda: _core.MapSpec("m", str, max_failures=2), ValueError),
        (lambda: _core.MapSpec("m", str, on_error="ignore"), ValueError),  # type: ignore[arg-type]
        (lambda: _core.MapSpec("m", str, timeout=0.0), ValueError),
        (lambda: _core.AggregateSpec("a", 0), ValueError),
        (lambda: _core.AggregateSpec("a", 2, combine=ops.identity()), ValueError),
        (
            lambda: _core.Pipeline([], [_core.AggregateSpec("a", 0, combine=ops.collate())]),
            ValueError,
        ),
        (lambda: _core.AccumulateSpec("a", 3), TypeError),  # type: ignore[arg-type]
    ]:
        with pytest.raises(err):
            bad()
    with pytest.raises(TypeError, match="MapSpec"):
        _core.Pipeline(range(3), [("map", "sync", str)])  # type: ignore[list-item]


@pytest.mark.timeout(60)
def test_a_pipeline_runs_from_specs_directly() -> None:
    stages = [
        _core.MapSpec("double", lambda x: 2 * x, concurrency=2),
        _core.AggregateSpec("pairs", 2),
        _core.MapSpec("sum", sum),
        _core.AggregateSpec("all", 10, combine=tuple),
        _core.DisaggregateSpec("split"),
    ]
    assert drain(_core.Pipeline(range(6), stages)) == [2, 10, 18]
