"""`PipelineBuilder`: assemble a pipeline of Python and native stages."""

from __future__ import annotations

import atexit
import contextlib
import inspect
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

if TYPE_CHECKING:
    import asyncio
    from concurrent.futures import Executor

__all__ = ["Pipeline", "PipelineBuilder"]

Pipeline = _core.Pipeline
"""A built pipeline: iterate it, or use ``with pipeline.auto_stop():``."""

OnError = Literal["raise", "skip"]


class Aggregator(Protocol):
    """A custom aggregation for `PipelineBuilder.aggregate` (as SPDL's ``Aggregator``)."""

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
    """What ``pipe(..., hooks=[...])`` takes: an object like SPDL's ``TaskHook``.

    ``stage_hook()`` returns a context manager (sync or async) entered once when the
    pipeline starts and exited once when it stops; ``task_hook()`` returns one entered
    around every call of the stage (it sees the call's exception, if any; suppressing it
    drops the item). On an ``async def`` stage the task hook runs on the pipeline's event
    loop; on a sync stage an async task hook runs on the stage's thread and must not await
    anything that suspends (stats and tracing hooks do not).
    """

    def stage_hook(self) -> Any:
        """Return the context manager around the stage's life."""

    def task_hook(self) -> Any:
        """Return the context manager around one call."""


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


class _SyncTaskHooks:
    """Enters every hook's ``task_hook()`` around each call of a sync stage."""

    def __init__(self, op: Callable[[Any], Any], hooks: Sequence[TaskHook]) -> None:
        self.op = op
        self.hooks = hooks

    def __call__(self, item: Any) -> Any:
        with contextlib.ExitStack() as stack:
            for hook in self.hooks:
                stack.enter_context(_as_sync(hook.task_hook()))
            return self.op(item)
        return None  # a hook suppressed the call's exception: the item is dropped


class _AsyncTaskHooks:
    """Enters every hook's ``task_hook()`` around each call of an async stage."""

    def __init__(self, op: Callable[[Any], Any], hooks: Sequence[TaskHook]) -> None:
        self.op = op
        self.hooks = hooks

    async def __call__(self, item: Any) -> Any:
        async with contextlib.AsyncExitStack() as stack:
            for hook in self.hooks:
                cm = hook.task_hook()
                if hasattr(cm, "__aenter__"):
                    await stack.enter_async_context(cm)
                else:
                    stack.enter_context(cm)
            return await self.op(item)
        return None  # a hook suppressed the call's exception: the item is dropped


class _StageHooks:
    """The ``stage_hook()`` of every hook of a pipeline: entered at start, exited at stop.

    Async ones run on a private event loop that lives from enter to exit.
    """

    def __init__(self, hooks: Sequence[TaskHook]) -> None:
        self.hooks = list(hooks)
        self.stack: contextlib.ExitStack | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.done = False

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
        if self.done or self.stack is not None:
            return
        stack = contextlib.ExitStack()
        try:
            for hook in self.hooks:
                stack.enter_context(self._sync(hook.stage_hook()))
        except BaseException:
            self.done = True
            self._close(stack)
            raise
        self.stack = stack

    def exit(self) -> None:
        stack, self.stack = self.stack, None
        self.done = True
        if stack is not None:
            self._close(stack)

    def _close(self, stack: contextlib.ExitStack) -> None:
        try:
            stack.close()
        finally:
            loop, self.loop = self.loop, None
            if loop is not None:
                loop.close()


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
        self._stages: list[tuple[Any, ...]] = []
        self._names: set[str] = set()
        self._sink_buffer: int | None = None
        self._hooks: list[TaskHook] = []

    def add_source(self, source: Iterable[Any] | AsyncIterable[Any], /) -> Self:
        """Set where items come from: any iterable or async iterable.

        A ``range`` is generated natively (no GIL). Other sync iterables are pulled on a
        thread of their own; async iterables through a private event loop on that thread.
        The source is iterated afresh by each `build`, so a list or a range gives every
        epoch the same items.
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
                exited when it stops; its ``task_hook()`` context manager wraps every call
                of the stage (for stats and tracing).

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
            stage_name = self._unique(name or op.name, explicit=name is not None)
            self._stages.append(("aggregate_native", op, stage_name))
            return self
        call: Any = op
        flat = False
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
            hooks = list(hooks)
            for hook in hooks:
                if not callable(getattr(hook, "task_hook", None)) or not callable(
                    getattr(hook, "stage_hook", None)
                ):
                    raise TypeError(
                        "a hook needs stage_hook() and task_hook() methods (as SPDL's "
                        f"TaskHook), not {type(hook).__name__}"
                    )
            if kind == "native":
                raise ValueError("hooks= applies to Python stages, not to native ops")
            call = (_AsyncTaskHooks if kind == "async" else _SyncTaskHooks)(call, hooks)
            self._hooks.extend(hooks)
        self._stages.append(
            (
                "map",
                kind,
                call,
                concurrency,
                stage_name,
                on_error,
                max_failures,
                ordered,
                engine_timeout,
            )
        )
        if flat:
            self._stages.append(("disaggregate", self._unique(f"{stage_name}/flat")))
        return self

    def aggregate(self, n: int | Aggregator, /, *, drop_last: bool = False) -> Self:
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
        if not isinstance(n, int):
            accumulate = getattr(n, "accumulate", None)
            flush = getattr(n, "flush", None)
            if not callable(accumulate) or not callable(flush):
                raise TypeError(
                    "aggregate() takes a group size (int) or an aggregator with accumulate() "
                    f"and flush() methods, not {type(n).__name__}"
                )
            stage_name = self._unique(f"aggregate({type(n).__name__})")
            self._stages.append(
                ("accumulate", accumulate, None if drop_last else flush, stage_name)
            )
            return self
        if isinstance(n, bool) or n < 1:
            raise ValueError(f"n must be a positive int, not {n!r}")
        self._stages.append(("aggregate", n, drop_last, self._unique(f"aggregate({n})")))
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
            ("disaggregate", self._unique(name or "disaggregate", explicit=name is not None))
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
    ) -> _core.Pipeline:
        """Build a new pipeline (one pass over the source); call again for each epoch.

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
        source = self._source
        if not isinstance(source, range) and isinstance(source, AsyncIterable):
            source = _AsyncIterBridge(source)
        runner = _AsyncRunner() if any(s[:2] == ("map", "async") for s in self._stages) else None
        # A native first stage takes native items: the source converts paths and bytes.
        first = self._stages[0] if self._stages else None
        native_source = first is not None and (
            first[0] == "aggregate_native" or first[:2] == ("map", "native")
        )
        pipeline = _core.Pipeline(
            source,
            list(self._stages),
            sink_buffer=self._sink_buffer or 3,
            num_threads=num_threads,
            runner=runner,
            report_interval=report_stats_interval,
            native_source=native_source,
            stall_warning=None if stall_warning_after is None else float(stall_warning_after),
            stage_hooks=_StageHooks(self._hooks) if self._hooks else None,
        )
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
