"""What a Python stage calls: the builder's wrappers around a user's function.

The wrappers are classes at module level (not closures), so that a stage run in a
``ProcessPoolExecutor`` pickles them by reference. `_call_failed` tells the engine whether
a stage's `TypeError` came from calling the function itself (a programming error, which
fails the pipeline even under ``on_error="skip"``); the engine imports it from here
(``src/py/pipeline/calls.rs``), so this module imports nothing of the engine (``_core``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from ._pipeline_hooks import _AsyncTaskHooks, _SyncTaskHooks

if TYPE_CHECKING:
    from concurrent.futures import Executor
    from types import TracebackType

__all__: list[str] = []


def _is_async(op: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(op) or inspect.iscoroutinefunction(
        getattr(op, "__call__", None)  # noqa: B004 - an instance with an async __call__
    )


def _is_generator(op: Callable[..., Any]) -> bool:
    return inspect.isgeneratorfunction(op) or inspect.isgeneratorfunction(
        getattr(op, "__call__", None)  # noqa: B004 - an instance with a generator __call__
    )


def _is_async_generator(op: Callable[..., Any]) -> bool:
    return inspect.isasyncgenfunction(op) or inspect.isasyncgenfunction(
        getattr(op, "__call__", None)  # noqa: B004
    )


class _Collect:
    """Calls a generator function and returns what it yields, as a list.

    A class at module level, not a closure, so that it pickles (by reference to the
    function) into the worker processes of a ``ProcessPoolExecutor``.
    """

    def __init__(self, op: Callable[[Any], Iterable[Any]]) -> None:
        self.op = op

    def __call__(self, item: Any) -> list[Any]:
        return list(self.op(item))


class _CollectAsync:
    """Calls an async generator function and returns what it yields, as a list."""

    def __init__(self, op: Callable[[Any], AsyncIterable[Any]]) -> None:
        self.op = op

    async def __call__(self, item: Any) -> list[Any]:
        return [x async for x in self.op(item)]


class _InExecutor:
    """Runs a plain function in a `concurrent.futures.Executor`.

    Awaited on the pipeline's event loop: the stage's ``concurrency`` bounds the calls in
    flight.
    """

    def __init__(self, op: Callable[[Any], Any], executor: Executor) -> None:
        self.op = op
        self.executor = executor

    async def __call__(self, item: Any) -> Any:
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(self.executor, self.op, item)


class _Timeout:
    """Bounds each call of an async stage.

    Past ``timeout`` seconds the coroutine is cancelled and the call fails with
    `TimeoutError`.
    """

    def __init__(self, op: Callable[[Any], Any], timeout: float, stage: str) -> None:
        self.op = op
        self.timeout = timeout
        self.stage = stage

    async def __call__(self, item: Any) -> Any:
        import asyncio

        scope = asyncio.timeout(self.timeout)
        try:
            async with scope:
                return await self.op(item)
        except TimeoutError:
            if not scope.expired():
                raise  # the stage's own TimeoutError
            raise TimeoutError(
                f"a call of stage {self.stage!r} ran longer than timeout={self.timeout} s"
            ) from None


# What the builder wraps a user's function in: `_code_of` sees through them.
_WRAPPERS = (_SyncTaskHooks, _AsyncTaskHooks, _Collect, _CollectAsync, _InExecutor, _Timeout)


def _code_of(op: Any) -> Any:
    """The code object of the user's function behind ``op`` (through the builder's wrappers)."""
    for _ in range(64):
        if isinstance(op, _WRAPPERS):
            op = op.op
        elif isinstance(op, functools.partial):
            op = op.func
        else:
            break
    if inspect.ismethod(op):
        op = op.__func__
    code = getattr(op, "__code__", None)
    if code is None and not inspect.isroutine(op) and not isinstance(op, type):
        call = getattr(type(op), "__call__", None)  # noqa: B004 - the class's own __call__
        code = getattr(call, "__code__", None)
    return code


def _call_failed(exc: BaseException, op: Any, tb: TracebackType | None = None) -> bool:
    """Whether ``exc`` is a `TypeError` from calling ``op`` itself, before its body ran.

    The engine asks this of a stage's failures (``op`` is what the stage calls): such a call
    (wrong arity, a bad ``functools.partial``) is a programming error, which fails the
    pipeline even under ``on_error="skip"``. Where ``op``'s code is unknown (a builtin, a
    lookup table) the failure is the item's. ``tb`` is the traceback when the exception
    does not hold it yet.
    """
    if not isinstance(exc, TypeError):
        return False
    code = _code_of(op)
    if code is None:
        return False
    if tb is None:
        tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            return False
        tb = tb.tb_next
    cause = exc.__cause__
    if type(cause).__name__ == "_RemoteTraceback":
        # From a ProcessPoolExecutor: the worker's traceback, as text.
        text = str(cause)
        return not (f'"{code.co_filename}"' in text and f"in {code.co_name}" in text)
    return True
