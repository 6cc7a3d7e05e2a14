"""Task hooks (SPDL's ``TaskHook``): what ``pipe(hooks=)`` and ``aggregate(hooks=)`` take.

`TaskHook` is the protocol; `_SyncTaskHooks` and `_AsyncTaskHooks` wrap a stage's call in
every hook's ``task_hook(item)``; `_StageHooks` enters every hook's ``stage_hook()`` when
the pipeline starts and leaves it when it stops (the engine calls its ``enter`` and
``exit``); `_check_hook_factories` refuses hooks that are not context manager factories.
"""

from __future__ import annotations

import contextlib
import inspect
import json
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ._errors import PipelineError

if TYPE_CHECKING:
    import asyncio

__all__ = ["TaskHook"]


class TaskHook(Protocol):
    """What ``pipe(hooks=[...])`` and ``aggregate(hooks=[...])`` take, as SPDL's ``TaskHook``.

    Both methods are context manager factories: methods decorated with
    ``@contextlib.contextmanager`` or ``@contextlib.asynccontextmanager`` (or returning a
    context manager object). A plain generator function or a coroutine function (``async
    def`` without ``@asynccontextmanager``) is not one, and `PipelineBuilder.build` refuses
    it with `ValueError`.

    ``stage_hook()`` returns a context manager (sync or async) entered once when the
    pipeline starts and exited once when it stops. An exception while entering or leaving
    it reaches the consumer as `PipelineError` naming the stage (from ``start()``, the
    first ``next()``, or the last one, or from ``stop()``); when entering fails, nothing
    runs.

    ``task_hook(input_item)`` returns a context manager entered around every call of the
    stage, given the item the call processes (as SPDL passes it): for an aggregate stage,
    the group (a list) about to be sent on; for a custom `Aggregator`, each item given to
    ``accumulate``. It sees the call's exception, if any; suppressing it drops the item. A
    ``task_hook`` that takes no argument (hooks written for ferrofeed's earlier
    ``task_hook()``) is still accepted and called without the item. On an ``async def``
    stage the task hook runs on the pipeline's event loop; elsewhere an async task hook runs
    on the stage's thread and must not await anything that suspends (stats and tracing
    hooks do not).

    Example:
        >>> import contextlib
        >>> from ferrofeed import PipelineBuilder
        >>> class Seen:
        ...     def __init__(self):
        ...         self.items = []
        ...     @contextlib.contextmanager
        ...     def stage_hook(self):
        ...         yield
        ...     @contextlib.contextmanager
        ...     def task_hook(self, input_item):
        ...         self.items.append(input_item)
        ...         yield
        >>> seen = Seen()
        >>> p = PipelineBuilder().add_source(range(3)).pipe(str, hooks=[seen]).add_sink()
        >>> list(p.build()), seen.items
        (['0', '1', '2'], [0, 1, 2])
    """

    def stage_hook(self) -> Any:
        """Return the context manager around the stage's life."""

    def task_hook(self, input_item: Any, /) -> Any:
        """Return the context manager around the call on ``input_item``."""


def _drive(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never suspends, without an event loop (async hooks on threads)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError(
        "an async task hook awaited something that suspends, on a sync stage's thread; "
        "use a sync context manager there, or put the hook on an async stage"
    )


class _DrivenAsync:
    """An async context manager used as a sync one, through `_drive`."""

    def __init__(self, cm: Any) -> None:
        self.cm = cm

    def __enter__(self) -> Any:
        return _drive(self.cm.__aenter__())

    def __exit__(self, *exc: Any) -> bool:
        return bool(_drive(self.cm.__aexit__(*exc)))


def _as_sync(cm: Any) -> Any:
    if hasattr(cm, "__enter__"):
        return cm
    if hasattr(cm, "__aenter__"):
        return _DrivenAsync(cm)
    raise TypeError(f"a hook must return a context manager, not {type(cm).__name__}")


def _takes_item(hook: TaskHook) -> bool:
    """Whether ``hook.task_hook`` takes the item (SPDL's signature) or nothing (older hooks)."""
    try:
        sig = inspect.signature(hook.task_hook)
    except (TypeError, ValueError):  # no signature to read (a builtin): give the item
        return True
    try:
        sig.bind(None)
    except TypeError:
        pass
    else:
        return True
    try:
        sig.bind()
    except TypeError:
        raise TypeError(
            f"{type(hook).__name__}.task_hook must take the item (task_hook(input_item), as "
            "SPDL's TaskHook) or nothing"
        ) from None
    return False


def _task_cm(hook: TaskHook, takes_item: bool, item: Any) -> Any:
    return hook.task_hook(item) if takes_item else hook.task_hook()  # type: ignore[call-arg]


class _SyncTaskHooks:
    """Enters every hook's ``task_hook(item)`` around each call of a sync stage."""

    def __init__(self, op: Callable[[Any], Any], hooks: Sequence[TaskHook]) -> None:
        self.op = op
        self.hooks = [(hook, _takes_item(hook)) for hook in hooks]

    def __call__(self, item: Any) -> Any:
        with contextlib.ExitStack() as stack:
            for hook, takes_item in self.hooks:
                stack.enter_context(_as_sync(_task_cm(hook, takes_item, item)))
            return self.op(item)
        return None  # a hook suppressed the call's exception: the item is dropped


class _AsyncTaskHooks:
    """Enters every hook's ``task_hook(item)`` around each call of an async stage."""

    def __init__(self, op: Callable[[Any], Any], hooks: Sequence[TaskHook]) -> None:
        self.op = op
        self.hooks = [(hook, _takes_item(hook)) for hook in hooks]

    async def __call__(self, item: Any) -> Any:
        async with contextlib.AsyncExitStack() as stack:
            for hook, takes_item in self.hooks:
                cm = _task_cm(hook, takes_item, item)
                if hasattr(cm, "__aenter__"):
                    await stack.enter_async_context(cm)
                else:
                    stack.enter_context(cm)
            return await self.op(item)
        return None  # a hook suppressed the call's exception: the item is dropped


def _group(items: list[Any]) -> list[Any]:
    """An aggregate stage's group, as it is (what task hooks wrap on an aggregate)."""
    return items


def _check_hook_factories(stage: str, hook: TaskHook) -> None:
    """Refuse a ``stage_hook``/``task_hook`` that is not a context manager factory."""
    for attr in ("stage_hook", "task_hook"):
        method = getattr(hook, attr)
        if inspect.isasyncgenfunction(method):
            kind, fix = "an async generator", "@contextlib.asynccontextmanager"
        elif inspect.isgeneratorfunction(method):
            kind, fix = "a generator", "@contextlib.contextmanager"
        elif inspect.iscoroutinefunction(method):
            kind, fix = "a coroutine", "@contextlib.asynccontextmanager (on an async generator)"
        else:
            continue
        raise ValueError(
            f"{type(hook).__name__}.{attr} (a hook of stage {stage!r}) is {kind} function, not "
            f"a context manager factory: decorate it with {fix}"
        )


def _stage_error(stage: str, exc: Exception) -> PipelineError:
    """The `PipelineError` a failure of ``stage`` (its hooks included) raises in the consumer."""
    quoted = json.dumps(stage)  # as the engine quotes it (Rust's {:?})
    exc.add_note(f"raised in pipeline stage {quoted}")
    error = PipelineError(f"stage {quoted} failed", [exc])
    error.stage = stage
    error.add_note(f"raised in pipeline stage {quoted}")
    return error


class _StageHooks:
    """The ``stage_hook()`` of every hook of a pipeline: entered at start, exited at stop.

    Async ones run on a private event loop that lives from enter to exit. A failure to
    enter or leave one raises `PipelineError` naming the hook's stage.
    """

    def __init__(self, hooks: Sequence[tuple[str, TaskHook]]) -> None:
        self.hooks = list(hooks)
        self.entered: list[tuple[str, Any]] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self.started = False

    def _sync(self, cm: Any) -> Any:
        if hasattr(cm, "__enter__"):
            return cm
        if not hasattr(cm, "__aenter__"):
            raise TypeError(f"stage_hook() must return a context manager, not {type(cm)}")
        if self.loop is None:
            import asyncio

            self.loop = asyncio.new_event_loop()
        loop = self.loop

        @contextlib.contextmanager
        def driven() -> Iterator[Any]:
            value = loop.run_until_complete(cm.__aenter__())
            try:
                yield value
            except BaseException as e:
                if not loop.run_until_complete(cm.__aexit__(type(e), e, e.__traceback__)):
                    raise
            else:
                loop.run_until_complete(cm.__aexit__(None, None, None))

        return driven()

    def enter(self) -> None:
        """Enter every stage hook, in stage order (once)."""
        if self.started:
            return
        self.started = True
        for stage, hook in self.hooks:
            try:
                cm = self._sync(hook.stage_hook())
                cm.__enter__()
            except Exception as exc:
                failure = _stage_error(stage, exc)
                try:
                    self.exit()
                except PipelineError as more:
                    failure.add_note(f"leaving the hooks entered before failed too: {more!r}")
                raise failure from None
            except BaseException:
                self.exit()
                raise
            self.entered.append((stage, cm))

    def exit(self) -> None:
        """Leave the stage hooks entered, in reverse order (once)."""
        self.started = True
        entered, self.entered = self.entered, []
        failures: list[tuple[str, Exception]] = []
        try:
            for stage, cm in reversed(entered):
                try:
                    cm.__exit__(None, None, None)
                except Exception as exc:
                    failures.append((stage, exc))
        finally:
            loop, self.loop = self.loop, None
            if loop is not None:
                loop.close()
        if failures:
            stage, first = failures[0]
            error = _stage_error(stage, first)
            for other_stage, other in failures[1:]:
                error.add_note(f"a hook of stage {other_stage!r} failed too: {other!r}")
            raise error
