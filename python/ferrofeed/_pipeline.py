"""`PipelineBuilder`: assemble a pipeline of Python and native stages.

The builder checks the stages and hands them to the engine (``_core.Pipeline``) as typed
specs. What it wraps a Python stage's function in lives in `_pipeline_calls`, the task
hooks in `_pipeline_hooks`, the event loops of async stages and sources in
`_pipeline_async`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import weakref
from collections.abc import AsyncIterable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, Self

from . import _core
from ._pipeline_async import _AsyncIterBridge, _AsyncRunner

# Extensions built before `_call_failed` moved to _pipeline_calls import it from here.
from ._pipeline_calls import (
    _call_failed as _call_failed,
    _Collect,
    _CollectAsync,
    _InExecutor,
    _is_async,
    _is_async_generator,
    _is_generator,
    _Timeout,
)
from ._pipeline_hooks import (
    TaskHook,
    _AsyncTaskHooks,
    _check_hook_factories,
    _group,
    _StageHooks,
    _SyncTaskHooks,
    _takes_item,
)

if TYPE_CHECKING:
    from concurrent.futures import Executor

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
