"""Pipeline semantics that SPDL users expect (issue 11's pipeline half, issue 12's fork item).

Async stages whose call fails at once, what reaches the consumer before a failure,
executors, per-stage timeouts and stall warnings, generator stages (flat map),
``disaggregate()``, items left readable after ``stop()``, and ``stop()`` in a forked child.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
from ferrofeed import Pipeline, PipelineBuilder, PipelineError


def drain(p: Pipeline) -> list[Any]:
    with p.auto_stop():
        return list(p)


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
    "partial with a bad keyword": functools.partial(add, nope=1),
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
def test_async_stage_failing_at_call_is_skipped(op: Any) -> None:
    p = PipelineBuilder().add_source(range(3)).pipe(op, on_error="skip").add_sink().build()
    assert drain(p) == []
    assert p.stats()[next(iter(p.stats().keys() - {"source", "sink"}))]["failures"] == 3


@pytest.mark.timeout(20)
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_async_stage_failing_at_call_with_many_in_flight(on_error: Any) -> None:
    p = (
        PipelineBuilder()
        .add_source(range(500))
        .pipe(two_args, concurrency=16, on_error=on_error)
        .add_sink()
        .build()
    )
    got, err = take_until_error(p)
    assert got == []
    assert (err is None) == (on_error == "skip")
