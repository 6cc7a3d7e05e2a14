"""`PipelineBuilder`: assemble a pipeline of Python and native stages."""

from __future__ import annotations

import atexit
import contextlib
import functools
import inspect
import json
import os
import threading
import weakref
from collections.abc import (
    AsyncIterable,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import TYPE_CHECKING, Any, Literal, Protocol, Self

from . import _core
from ._errors import PipelineError

if TYPE_CHECKING:
    import asyncio
    from concurrent.futures import Executor
    from types import TracebackType

__all__ = ["Aggregator", "Pipeline", "PipelineBuilder", "TaskHook"]

Pipeline = _core.Pipeline
"""A built pipeline: iterate it, or use ``with pipeline.auto_stop():``."""

OnError = Literal["raise", "skip"]

_Spec = _core.MapSpec | _core.AggregateSpec | _core.AccumulateSpec | _core.DisaggregateSpec


class Aggregator(Protocol):
    """A custom aggregation for `PipelineBuilder.aggregate` (as SPDL's ``Aggregator``).

    ``accumulate(item)`` is called with every item, in order, one at a time; it returns a
    result to send on, or ``None`` for "nothing yet". ``flush()`` is called once when the
    input ends, for what is still held (``None``: nothing).

    Example:
        >>> class Pairs:
        ...     def __init__(self):
        ...         self.held = []
        ...     def accumulate(self, item):
        ...         self.held.append(item)
        ...         if len(self.held) == 2:
        ...             out, self.held = self.held, []
        ...             return out
        ...         return None
        ...     def flush(self):
        ...         return self.held or None
        >>> list(PipelineBuilder().add_source(range(5)).aggregate(Pairs()).add_sink().build())
        [[0, 1], [2, 3], [4]]
    """

    def accumulate(self, item: Any, /) -> Any:
        """Take the next item; return a result to send on, or ``None`` for nothing yet."""

    def flush(self) -> Any:
        """At the end of the input: return what is still held, or ``None``."""


# Pipelines not yet garbage collected: stopped at interpreter exit, before the
# interpreter ends the threads that run Python stages.
_LIVE: weakref.WeakSet[_core.Pipeline] = weakref.WeakSet()

os.register_at_fork(after_in_child=_core._after_fork_in_child)


@atexit.register
def _stop_live_pipelines() -> None:
    for pipeline in list(_LIVE):
        with contextlib.suppress(Exception):
            pipeline.stop()


# How long stopping waits for the event loop's thread to end; with the engine's own
# grace for stage threads (0.25 s: STOP_GRACE in src/pipeline/engine.rs) it keeps Ctrl-C
# within half a second even when user code blocks the loop.
_LOOP_JOIN_GRACE = 0.2


class _AsyncRunner:
    """The event loop on which a pipeline's ``async def`` stages run, on its own thread."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    def start(self) -> None:
        import asyncio  # imported here: `import ferrofeed` stays light

        if self._thread is not None:
            return
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            try:
                loop.run_forever()  # until `stop`
            finally:
                # Here, not in `stop`: a loop that `stop` stopped waiting for (blocked
                # in user code) is closed too, when it ends.
                loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="ferrofeed-asyncio", daemon=True)
        self._thread.start()
        ready.wait()

    def submit(
        self,
        op: Callable[[Any], Coroutine[Any, Any, Any]],
        item: Any,
        done: Callable[[asyncio.Future[Any]], object],
    ) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            raise RuntimeError("the pipeline's event loop is not running")

        def start() -> None:
            try:
                task = loop.create_task(op(item))
            except BaseException as exc:  # every failure reaches the stage
                # The call failed before it made a coroutine (wrong arity, a bad
                # ``functools.partial``, a non-awaitable result): fail the item as a
                # coroutine raising it would, rather than leave it unanswered.
                failed: asyncio.Future[Any] = loop.create_future()
                if isinstance(exc, StopIteration):  # a future refuses StopIteration
                    exc = RuntimeError(f"the stage raised StopIteration: {exc!r}")
                failed.set_exception(exc)
                done(failed)
                return
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            task.add_done_callback(done)

        loop.call_soon_threadsafe(start)

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self._loop = self._thread = None

        def cancel_all() -> None:
            for task in list(self._tasks):
                task.cancel()
            # Let the cancellations run, then stop.
            loop.call_soon(loop.stop)

        if not loop.is_closed():
            loop.call_soon_threadsafe(cancel_all)
        # The loop ends at once unless a coroutine blocks it in a synchronous call
        # (user code that cannot be interrupted): then, like a stage thread stuck in a
        # call, the loop's (daemon) thread is left to end when that call returns, so
        # that stopping (and Ctrl-C) stays prompt.
        thread.join(timeout=_LOOP_JOIN_GRACE)


class _AsyncIterBridge(Iterator[Any]):
    """A sync iterator over an async iterable, driven by a private loop on the source thread.

    The loop is closed (and the async generator finalized) when the source ends, fails,
    or is dropped because the pipeline stopped.
    """

    def __init__(self, source: AsyncIterable[Any]) -> None:
        self._source = source
        self._iter: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __next__(self) -> Any:
        if self._loop is None:
            import asyncio

            self._loop = asyncio.new_event_loop()
            self._iter = self._source.__aiter__()
        try:
            return self._loop.run_until_complete(self._iter.__anext__())
        except StopAsyncIteration:
            self.close()
            raise StopIteration from None
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None or loop.is_closed():
            return
        try:
            aclose = getattr(self._iter, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    loop.run_until_complete(aclose())
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()

    def __del__(self) -> None:
        self.close()


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


def _op_name(op: Any) -> str:
    if isinstance(op, _core.NativeOp):
        return op.name
    name = getattr(op, "__qualname__", None) or getattr(op, "__name__", None)
    return str(name or type(op).__name__)


class PipelineBuilder:
    """Assemble a pipeline: a source, stages, a sink; then `build` it.

    Stages run concurrently on background threads, linked by bounded queues, so a slow
    consumer throttles the source and memory stays bounded. Python callables run on
    threads of their own and hold the GIL only for the call; ``async def`` functions run
    on an event loop the pipeline owns; native ops (`ferrofeed.ops`) run in Rust without
    the GIL. Output order equals source order unless a stage says ``ordered=False``.

    When a stage or the source fails, the consumer first receives every item that precedes
    the failing one in output order, then `PipelineError`. Stages may also be generator
    functions (flat maps), calls in a `concurrent.futures.Executor`, lookup tables, custom
    aggregators and `disaggregate`; ``pipe`` stages may carry a ``timeout`` and SPDL-style
    task ``hooks``.

    Stopping (``stop()``, leaving ``auto_stop()``, dropping the pipeline, Ctrl-C while
    iterating) takes about 0.25 s at most: every thread the pipeline owns is joined before
    it returns (or before `KeyboardInterrupt` reaches you), except a thread still inside a
    call of your function (or of the source's ``next``) after 0.25 s. Such a call cannot
    be interrupted (a ``time.sleep``, a blocking read): it is left to finish on its own,
    its result is thrown away and its thread ends when it returns.

    Example:
        >>> from ferrofeed import PipelineBuilder
        >>> pipeline = (
        ...     PipelineBuilder()
        ...     .add_source(range(10))
        ...     .pipe(lambda x: x * x, concurrency=4)
        ...     .aggregate(4)
        ...     .add_sink(buffer_size=2)
        ...     .build(num_threads=2)
        ... )
        >>> with pipeline.auto_stop():
        ...     [batch for batch in pipeline]
        [[0, 1, 4, 9], [16, 25, 36, 49], [64, 81]]
    """

    def __init__(self) -> None:
        self._source: Any = None
        self._stages: list[_Spec] = []
        self._names: set[str] = set()
        self._sink_buffer: int | None = None
        self._hooks: list[tuple[str, TaskHook]] = []
        self._epoch = 0

    def add_source(self, source: Iterable[Any] | AsyncIterable[Any], /) -> Self:
        """Set where items come from: any iterable or async iterable.

        A ``range`` is generated natively (no GIL). Other sync iterables are pulled on a
        thread of their own, several items per GIL acquisition (at least half of the
        first stage's input queue, so the source may run that much ahead of the queue);
        async iterables through a private event loop on that thread. The source is
        iterated afresh by each `build`, so a list or a range gives every epoch the same
        items.
        """
        if self._source is not None:
            raise ValueError("the pipeline already has a source")
        if not isinstance(source, Iterable | AsyncIterable):
            raise TypeError(f"a source must be iterable, not {type(source).__name__}")
        self._source = source
        return self

    def pipe(
        self,
        op: Callable[[Any], Any] | _core.NativeOp | Mapping[Any, Any] | Sequence[Any],
        /,
        *,
        concurrency: int = 1,
        name: str | None = None,
        on_error: OnError = "raise",
        max_failures: int | None = None,
        ordered: bool = True,
        executor: Executor | None = None,
        timeout: float | None = None,
        hooks: Sequence[TaskHook] | None = None,
    ) -> Self:
        """Add a stage that applies ``op`` to each item.

        Args:
            op: a callable, an ``async def`` function, a generator function (sync or async),
                a native op from `ferrofeed.ops`, or a lookup table: a mapping (``dict``) or a
                sequence (``list``, ``tuple``) maps each item to ``op[item]`` (a missing key
                raises ``KeyError`` or ``IndexError``, raised or skipped per ``on_error``).
                Returning ``None`` drops the item. A
                generator function is a flat map: each item it yields goes downstream, in
                order, once the call has returned (if it raises, the item fails as a whole
                and nothing it yielded goes on); stats show a companion stage
                ``"<name>/flat"`` that splits its results.
            concurrency: items processed at once (threads for a callable, coroutines in
                flight for an async function, calls in flight in ``executor``).
            name: the stage's name in stats and errors (default: ``op``'s name, made
                unique with a numeric suffix).
            on_error: ``"raise"`` stops the pipeline and raises `PipelineError` (holding
                the original exception) in the consumer, after every item that precedes
                the failing one; ``"skip"`` drops the item, logs it at WARNING on the
                ``ferrofeed.pipeline`` logger and counts it.
            max_failures: with ``"skip"``, the number of failures tolerated; one more
                stops the pipeline with `PipelineError` (after the items before it).
            ordered: keep source order (default); ``False`` yields items as they finish.
            executor: run each call of ``op`` (a plain function or generator function) in
                this `concurrent.futures.Executor`: a ``ProcessPoolExecutor`` (``op`` and
                the items must pickle; define ``op`` at module level) or a
                ``ThreadPoolExecutor``. ``concurrency`` bounds the calls in flight; order,
                error types and ``on_error`` work as for any stage. The pipeline neither
                starts nor shuts down the executor.
            timeout: seconds one call may run. A call that runs longer fails with
                `TimeoutError` (raised or skipped per ``on_error``) as soon as the time is
                up, and the items after it go on. An ``async def`` call is cancelled; a
                call in a thread (a plain function, a native op, a call in ``executor``)
                cannot be interrupted: it runs on and its result is thrown away. On the
                stage's own threads, a new thread takes the stuck one's place at once (the
                stuck one leaves when its call returns), so the stage keeps its
                concurrency; in an ``executor`` the stuck call holds its worker until it
                returns (a stage whose every worker is stuck stalls: see
                ``stall_warning_after`` in `build`).
            hooks: task hooks, as SPDL's ``TaskHook`` (see `TaskHook`): each hook's
                ``stage_hook()`` context manager is entered when the pipeline starts and
                exited when it stops; its ``task_hook(input_item)`` context manager wraps
                every call of the stage on ``input_item`` (for stats and tracing).

        A call that fails before ``op`` runs (a `TypeError` from the call itself: wrong
        arity, a bad ``functools.partial``) is a programming error, not a bad item: it fails
        the pipeline even under ``on_error="skip"`` (a note on the error says so). A
        `TypeError` raised inside ``op`` is the item's, as any other error.

        Example:
            >>> from concurrent.futures import ThreadPoolExecutor
            >>> def pair(x):
            ...     yield x
            ...     yield -x
            >>> with ThreadPoolExecutor(2) as pool:
            ...     p = (
            ...         PipelineBuilder()
            ...         .add_source(range(3))
            ...         .pipe(pair, executor=pool, concurrency=2)
            ...         .add_sink()
            ...         .build()
            ...     )
            ...     list(p)
            [0, 0, 1, -1, 2, -2]
        """
        if self._source is None:
            raise ValueError("add_source() comes first")
        if self._sink_buffer is not None:
            raise ValueError("the pipeline already has a sink")
        if not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be a positive int, not {concurrency!r}")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        if max_failures is not None:
            if on_error != "skip":
                raise ValueError("max_failures applies to on_error='skip'")
            if not isinstance(max_failures, int) or max_failures < 0:
                raise ValueError(f"max_failures must be an int >= 0, not {max_failures!r}")
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 0 < timeout < float("inf")
        ):
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        if executor is not None:
            from concurrent.futures import Executor

            if not isinstance(executor, Executor):
                raise TypeError(
                    f"executor must be a concurrent.futures.Executor, not {type(executor).__name__}"
                )
            if isinstance(op, _core.NativeOp):
                raise ValueError("a native op runs in Rust: executor= takes a Python function")
            if callable(op) and (_is_async(op) or _is_async_generator(op)):
                raise ValueError(
                    "an async function runs on the pipeline's event loop: "
                    "executor= takes a plain function or a generator function"
                )
        if isinstance(op, Mapping | Sequence) and not isinstance(op, str | bytes | bytearray):
            # A lookup table: each item maps to op[item], looked up on the stage's threads.
            table = op
            op = table.__getitem__
            default_name = f"lookup({type(table).__name__})"
        else:
            default_name = None
        if isinstance(op, _core.NativeOp) and op.group_size is not None:
            # A grouping op (ops.collate): an aggregate stage with a native combine.
            if hooks:
                raise ValueError("hooks= applies to Python stages, not to native ops")
            stage_name = self._unique(name or op.name, explicit=name is not None)
            self._stages.append(
                _core.AggregateSpec(
                    stage_name, op.group_size, drop_last=bool(op.drop_last), combine=op
                )
            )
            return self
        call: Any = op
        flat = False
        kind: Literal["sync", "async", "native"]
        if isinstance(op, _core.NativeOp):
            kind = "native"
        elif callable(op):
            if _is_async_generator(op):
                call, kind, flat = _CollectAsync(op), "async", True
            elif _is_generator(op):
                call, kind, flat = _Collect(op), "sync", True
            else:
                kind = "async" if _is_async(op) else "sync"
            if executor is not None:
                call, kind = _InExecutor(call, executor), "async"
        else:
            raise TypeError(
                f"op must be callable, a native op or a lookup table, not {type(op).__name__}"
            )
        stage_name = self._unique(name or default_name or _op_name(op), explicit=name is not None)
        engine_timeout = None if timeout is None else float(timeout)
        if kind == "async" and timeout is not None:
            # Bounded on the event loop, where the coroutine can be cancelled.
            call, engine_timeout = _Timeout(call, float(timeout), stage_name), None
        if hooks:
            hooks = self._checked_hooks(hooks)
            if kind == "native":
                raise ValueError("hooks= applies to Python stages, not to native ops")
            call = (_AsyncTaskHooks if kind == "async" else _SyncTaskHooks)(call, hooks)
            self._hooks.extend((stage_name, hook) for hook in hooks)
        self._stages.append(
            _core.MapSpec(
                stage_name,
                call,
                kind=kind,
                concurrency=concurrency,
                on_error=on_error,
                max_failures=max_failures,
                ordered=ordered,
                timeout=engine_timeout,
            )
        )
        if flat:
            self._stages.append(_core.DisaggregateSpec(self._unique(f"{stage_name}/flat")))
        return self

    @staticmethod
    def _checked_hooks(hooks: Sequence[TaskHook]) -> list[TaskHook]:
        hooks = list(hooks)
        for hook in hooks:
            if not callable(getattr(hook, "task_hook", None)) or not callable(
                getattr(hook, "stage_hook", None)
            ):
                raise TypeError(
                    "a hook needs stage_hook() and task_hook() methods (as SPDL's "
                    f"TaskHook), not {type(hook).__name__}"
                )
            _takes_item(hook)  # a task_hook that takes neither the item nor nothing fails here
        return hooks

    def aggregate(
        self,
        n: int | Aggregator,
        /,
        *,
        drop_last: bool = False,
        hooks: Sequence[TaskHook] | None = None,
    ) -> Self:
        """Group items: every ``n`` consecutive items into a list, or with a custom aggregator.

        Args:
            n: the group size (the last group may be short), or a custom aggregator (as
                SPDL's ``Aggregator``): an object whose ``accumulate(item)`` is called with
                every item, in order, one at a time, and returns a result to send on, or
                ``None`` for "nothing yet"; and whose ``flush()`` is called once when the
                input ends, for what it still holds (``None``: nothing).
            drop_last: drop the last, short group; for an aggregator, ``flush()`` is not
                called. After a failure upstream, neither the short group nor ``flush()``
                goes on (the failure does, after the complete groups).
            hooks: task hooks, as for `pipe` (see `TaskHook`): ``task_hook(group)`` wraps
                the sending on of each group (the list), or, with an aggregator, each call
                of ``accumulate(item)``; ``stage_hook()`` wraps the pipeline's run.

        Example:
            >>> class Upto10:
            ...     def __init__(self):
            ...         self.held = []
            ...     def accumulate(self, item):
            ...         self.held.append(item)
            ...         if sum(self.held) >= 10:
            ...             out, self.held = self.held, []
            ...             return out
            ...         return None
            ...     def flush(self):
            ...         return self.held or None
            >>> p = PipelineBuilder().add_source([3, 4, 5, 9, 1]).aggregate(Upto10())
            >>> list(p.add_sink().build())
            [[3, 4, 5], [9, 1]]
        """
        if self._source is None:
            raise ValueError("add_source() comes first")
        if self._sink_buffer is not None:
            raise ValueError("the pipeline already has a sink")
        checked = self._checked_hooks(hooks) if hooks else []
        if not isinstance(n, int):
            accumulate = getattr(n, "accumulate", None)
            flush = getattr(n, "flush", None)
            if not callable(accumulate) or not callable(flush):
                raise TypeError(
                    "aggregate() takes a group size (int) or an aggregator with accumulate() "
                    f"and flush() methods, not {type(n).__name__}"
                )
            stage_name = self._unique(f"aggregate({type(n).__name__})")
            if checked:
                accumulate = _SyncTaskHooks(accumulate, checked)
            self._stages.append(
                _core.AccumulateSpec(stage_name, accumulate, None if drop_last else flush)
            )
        else:
            if isinstance(n, bool) or n < 1:
                raise ValueError(f"n must be a positive int, not {n!r}")
            stage_name = self._unique(f"aggregate({n})")
            combine = _SyncTaskHooks(_group, checked) if checked else None
            self._stages.append(
                _core.AggregateSpec(stage_name, n, drop_last=drop_last, combine=combine)
            )
        self._hooks.extend((stage_name, hook) for hook in checked)
        return self

    def disaggregate(self, *, name: str | None = None) -> Self:
        """Send on, one by one, the elements of each item (a list, or any iterable).

        The inverse of `aggregate`: ``.aggregate(4).disaggregate()`` gives back the
        items. An item that is not iterable fails the pipeline (`PipelineError` holding
        the ``TypeError``), after every item before it.

        Example:
            >>> p = PipelineBuilder().add_source([[1, 2], [], [3]]).disaggregate().add_sink()
            >>> list(p.build())
            [1, 2, 3]
        """
        if self._source is None:
            raise ValueError("add_source() comes first")
        if self._sink_buffer is not None:
            raise ValueError("the pipeline already has a sink")
        self._stages.append(
            _core.DisaggregateSpec(self._unique(name or "disaggregate", explicit=name is not None))
        )
        return self

    def add_sink(self, buffer_size: int = 3) -> Self:
        """Set how many finished items wait for the consumer."""
        if not isinstance(buffer_size, int) or buffer_size < 1:
            raise ValueError(f"buffer_size must be a positive int, not {buffer_size!r}")
        self._sink_buffer = buffer_size
        return self

    def build(
        self,
        *,
        num_threads: int | None = None,
        report_stats_interval: float | None = None,
        stall_warning_after: float | None = 120.0,
        epoch: int | None = None,
    ) -> _core.Pipeline:
        """Build a new pipeline (one pass over the source); call again for each epoch.

        Each build is the next epoch: the first is epoch 0, then 1, 2, ...; ``epoch=k``
        builds epoch ``k`` (and the next build is ``k + 1``). The epoch keys the random
        draws of native ops: with ``ops.decode_image(crop="random", seed=s)`` (and
        ``flip="random"``) the item at position ``i`` of the source (0, 1, ...) draws its
        crop and flip from ``(s, epoch, i)``. So every epoch gets new crops, building the
        same epoch again gives the same ones, and neither the files' folder nor the
        threads' timing changes them.

        Args:
            num_threads: the most native ops (``ops.read_file``, ``ops.decode_image``, ...)
                this pipeline runs at once, over all its stages (default: the number of
                CPUs, at most 8), as SPDL's ``num_threads`` sizes the executor of its
                synchronous stages. Python stages have threads of their own (each stage's
                ``concurrency``). Every pipeline's stages run as tasks on one async
                runtime per process, made with the first pipeline and kept.
            report_stats_interval: if set, log the stats table at INFO on the
                ``ferrofeed.pipeline`` logger every this many seconds.
            stall_warning_after: when no stage takes, passes on, drops or fails an item
                for this many seconds while the consumer waits (its buffer is not full),
                log a WARNING on the ``ferrofeed.pipeline`` logger naming the stage that
                holds the pipeline (the furthest downstream with items in flight; the
                source when none has), and again every as many seconds while it stays
                stuck. ``None`` turns the watch off. A stalled pipeline can always be
                stopped with ``stop()``.
            epoch: the epoch to build (an int >= 0; default: the one after the last build,
                0 for the first).

        Raises:
            ValueError: a bad argument, or a hook's ``stage_hook``/``task_hook`` that is not
                a context manager factory (see `TaskHook`).

        Example:
            >>> b = PipelineBuilder().add_source(range(2)).add_sink()
            >>> [b.build().epoch, b.build().epoch, b.build(epoch=7).epoch, b.build().epoch]
            [0, 1, 7, 8]
        """
        if self._source is None:
            raise ValueError("the pipeline has no source: call add_source() first")
        if num_threads is not None and (not isinstance(num_threads, int) or num_threads < 1):
            raise ValueError(f"num_threads must be a positive int, not {num_threads!r}")
        if stall_warning_after is not None and (
            isinstance(stall_warning_after, bool)
            or not isinstance(stall_warning_after, int | float)
            or not 0 < stall_warning_after < float("inf")
        ):
            raise ValueError(
                f"stall_warning_after must be a positive number of seconds or None, "
                f"not {stall_warning_after!r}"
            )
        if epoch is None:
            epoch = self._epoch
        elif isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, not {epoch!r}")
        for stage, hook in self._hooks:
            _check_hook_factories(stage, hook)
        source = self._source
        if not isinstance(source, range) and isinstance(source, AsyncIterable):
            source = _AsyncIterBridge(source)
        runner = (
            _AsyncRunner()
            if any(isinstance(s, _core.MapSpec) and s.kind == "async" for s in self._stages)
            else None
        )
        pipeline = _core.Pipeline(
            source,
            list(self._stages),
            sink_buffer=self._sink_buffer or 3,
            num_threads=num_threads,
            runner=runner,
            report_interval=report_stats_interval,
            stall_warning=None if stall_warning_after is None else float(stall_warning_after),
            stage_hooks=_StageHooks(self._hooks) if self._hooks else None,
            epoch=epoch,
        )
        self._epoch = epoch + 1
        _LIVE.add(pipeline)
        return pipeline

    def _unique(self, name: str, *, explicit: bool = False) -> str:
        if name in self._names or name in ("source", "sink"):
            if explicit:
                raise ValueError(f"a stage named {name!r} exists already (or is reserved)")
            k = 2
            while f"{name}#{k}" in self._names:
                k += 1
            name = f"{name}#{k}"
        self._names.add(name)
        return name
