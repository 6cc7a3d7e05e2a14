"""The event loops of a pipeline's async parts: ``async def`` stages and async sources.

`_AsyncRunner` is the loop, on a thread of its own, on which a pipeline's ``async def``
stages run (the engine submits each call to it: ``src/py/pipeline/bridge.rs``);
`_AsyncIterBridge` turns an async iterable source into the sync iterator the engine's
source thread pulls from.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterable, Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

__all__ = ["_AsyncIterBridge", "_AsyncRunner"]


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
