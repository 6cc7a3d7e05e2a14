"""Worker processes for the `DataLoader`: Python transforms without the GIL's contention.

The main process keeps the sampler, the order, the resume state and the handoff; N worker
processes run ``dataset[i]``, the transform and the collate. What crosses between them:

* at start, once per worker: the dataset, transform and collate (inherited under fork,
  pickled once under spawn and forkserver; a `SharedList` pickles to its path, so every
  worker maps the same arena pages);
* per batch, main to worker: a task (the epoch, the batch's `Group` and a slot number): a
  few hundred bytes for a map-style dataset's group (its ids: the worker indexes its own
  copy of the dataset), a sharded source's with its samples; for an iterable dataset,
  "begin" once per epoch (the worker starts a new pass over its copy of the dataset) and
  then "next" tasks (the next batch of that pass; the reply names the samples' ids), taken
  round-robin by `stream_batches`;
* per batch, worker to main: a small header (the batch's structure: containers, dtypes,
  shapes and offsets). The arrays themselves are written by the worker's collate straight
  into a *slot*, an anonymous shared memory file (memfd) that the main process maps once
  and hands out as NumPy arrays without a copy; torch and JAX take those by DLPack. The
  slot is free for the next batch when the last array of the batch is gone.
* a slot's file descriptor, once per (slot, worker), over the worker's socket
  (``SCM_RIGHTS``), so the same works under fork, spawn and forkserver.

Leaves that are not numeric arrays (strings, arbitrary objects) travel pickled in the
header.

Randomness is per sample: before each ``dataset[i]``, the worker seeds `random`,
`numpy.random` and torch's generator (when torch is imported) from ``(seed, epoch, i)``,
so augmentations do not depend on which worker ran a sample, nor on how many there are.

The worker's side (its loop, its samples, the headers it writes) is
`ferrofeed._worker_process`; this module is the main process's.

Faults: a worker's exception comes back as itself with the worker's traceback in a note;
a worker that dies is noticed through its process sentinel, and the error names its pid,
the signal and the samples it held; workers watch the main process (a pidfd) and exit at
once when it dies; memfds leave nothing behind in any file system.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import multiprocessing
import multiprocessing.connection
import pickle
import signal
import sys
import time
import weakref
from collections.abc import Callable, Container, Iterator, Sequence
from multiprocessing import reduction
from typing import Any

from . import _core
from ._errors import WorkerDiedError, WorkerError, WorkerTimeoutError
from ._group import Group
from ._worker_process import (
    WORKER_START_TIMEOUT,
    WorkerInfo,
    _decode,
    _Setup,
    _worker_main,
    get_worker_info,
)

# WorkerInfo and get_worker_info, the workers' public face, are named here too.
__all__ = [
    "Loaded",
    "WorkerInfo",
    "WorkerPool",
    "get_worker_info",
    "stream_batches",
    "worker_batches",
]

_log = logging.getLogger("ferrofeed.loader")

# -- the main process side ------------------------------------------------------------------


@dataclasses.dataclass
class _Task:
    id: int
    worker: int
    indices: list[int]
    slot: int
    # The iteration it belongs to; results of an earlier one are dropped.
    generation: int
    # A task of an iterable dataset: "the worker's next batch" (its ids come back with
    # the reply); a replay one is read and dropped (a resumed epoch).
    stream: bool = False
    replay: bool = False


@dataclasses.dataclass
class _Worker:
    id: int
    process: Any
    conn: multiprocessing.connection.Connection
    pid: int
    slots: set[int] = dataclasses.field(default_factory=set)
    tasks: collections.OrderedDict[int, _Task] = dataclasses.field(
        default_factory=collections.OrderedDict
    )
    ready: bool = False
    # When it reported ready (time.monotonic()); batch timeouts count from then on.
    ready_at: float = 0.0


@dataclasses.dataclass
class Loaded:
    """A batch (or why there is none) as it comes back from a worker."""

    batch: Any
    skipped: list[tuple[int, str]]
    empty: bool = False
    # An iterable dataset's worker has no batch left this epoch.
    ended: bool = False


class WorkerPool:
    """N worker processes, their sockets and the shared slot ring (main process side)."""

    def __init__(
        self, setup: _Setup, num_workers: int, prefetch_factor: int, pin_memory: bool = False
    ) -> None:
        self.setup = setup
        self.prefetch_factor = prefetch_factor
        self.ring = _core._SlotRing()
        self.workers: list[_Worker] = []
        self.tasks: dict[int, _Task] = {}
        self.next_task = 0
        self.generation = 0
        self.closed = False
        if setup.start_method is None:
            setup.start_method = default_start_method()
        ctx: Any = multiprocessing.get_context(setup.start_method)
        try:
            for wid in range(num_workers):
                ours, theirs = ctx.Pipe(duplex=True)
                process = ctx.Process(
                    target=_worker_main,
                    args=(setup, theirs, wid),
                    name=f"ferrofeed-worker-{wid}",
                    daemon=True,
                )
                try:
                    process.start()
                except (pickle.PicklingError, AttributeError, TypeError) as e:
                    if setup.start_method != "fork":
                        e.add_note(
                            f"worker_start_method={setup.start_method!r} pickles the dataset, "
                            "transform, collate and worker_init_fn once per worker: they must "
                            "be picklable (module-level functions, not lambdas or local ones)"
                        )
                    raise
                finally:
                    theirs.close()
                self.workers.append(_Worker(wid, process, ours, process.pid))
        except BaseException:
            self.shutdown(force=True)
            raise
        if pin_memory:
            # Batches bound for a GPU: page-lock the slots (as PyTorch's pin_memory=True
            # does with a copy), so that each one is copied there asynchronously, by DMA.
            # After the workers have started: this may initialize CUDA, and the first
            # pool's workers are then forked from a process without it (later pools'
            # are not; the workers never touch CUDA either way).
            why = self.ring.pin_for_cuda()
            if why is not None:
                _log.info("worker batch slots stay unpinned: %s", why)
        # Ends the workers when the pool is garbage collected, and at interpreter exit.
        self._finalizer = weakref.finalize(self, _terminate, list(self.workers))

    # -- dispatch ---------------------------------------------------------------------

    def in_flight(self) -> int:
        return len(self.tasks)

    def capacity(self) -> int:
        return self.prefetch_factor * len(self.workers)

    def submit(self, epoch: int, group: Group) -> int:
        """Send a batch's group to the least busy worker; return the task's id."""
        worker = min(self.workers, key=lambda w: (len(w.tasks), w.id))
        task = self._task(worker, group.ids)
        return self._send(worker, task, ("task", task.id, epoch, group, task.slot))

    def begin_stream(self, epoch: int) -> None:
        """Have every worker start a new pass over its copy of an iterable dataset."""
        for worker in self.workers:
            # A worker that is gone is noticed at the next receive.
            with contextlib.suppress(OSError):
                worker.conn.send(("begin", epoch))

    def submit_next(self, wid: int, replay: bool) -> int:
        """Ask worker ``wid`` for the next batch of its stream; return the task's id.

        With ``replay``, the worker reads the batch's samples and drops them.
        """
        worker = self.workers[wid]
        task = self._task(worker, [])
        task.stream, task.replay = True, replay
        return self._send(worker, task, ("next", task.id, task.slot, replay))

    def _task(self, worker: _Worker, indices: list[int]) -> _Task:
        """A new task for ``worker``, with a slot for its batch."""
        slot = self.ring.acquire()
        if slot is None:
            slot = self.ring.create()
            self.ring.acquire()
        task = _Task(self.next_task, worker.id, indices, slot, self.generation)
        self.next_task += 1
        return task

    def _send(self, worker: _Worker, task: _Task, message: tuple[Any, ...]) -> int:
        """Send ``task`` (``message``) to ``worker``, with its slot's fd the first time."""
        slot = task.slot
        try:
            if slot not in worker.slots:
                worker.conn.send(("slot", slot))
                reduction.send_handle(worker.conn, self.ring.fd(slot), worker.pid)
                worker.slots.add(slot)
            worker.conn.send(message)
        except OSError:
            # The worker is gone: its sentinel tells why at the next receive.
            self.ring.release(slot)
            worker.tasks[task.id] = task
            self.tasks[task.id] = task
            return task.id
        worker.tasks[task.id] = task
        self.tasks[task.id] = task
        return task.id

    def new_generation(self) -> None:
        """Start a new iteration: results of the tasks still in flight will be dropped."""
        self.generation += 1

    # -- results ---------------------------------------------------------------------------

    def receive(self, timeout: float | None) -> list[tuple[_Task, Loaded | BaseException]]:
        """Wait up to ``timeout`` for results; return those of the current generation.

        Raises:
            WorkerDiedError: a worker died.
        """
        alive = {w.conn: w for w in self.workers}
        sentinels = {w.process.sentinel: w for w in self.workers}
        ready = multiprocessing.connection.wait([*alive, *sentinels], timeout)
        out: list[tuple[_Task, Loaded | BaseException]] = []
        dead: list[_Worker] = []
        for obj in ready:
            if obj in sentinels:
                dead.append(sentinels[obj])
                continue
            worker = alive[obj]  # type: ignore[index]
            while True:
                try:
                    msg = worker.conn.recv()
                except (EOFError, OSError):
                    dead.append(worker)
                    break
                result = self._handle(worker, msg)
                if result is not None:
                    out.append(result)
                if not worker.conn.poll():
                    break
        for worker in dead:
            # Results it sent before it died come first (they may be what it held).
            with contextlib.suppress(EOFError, OSError):
                while worker.conn.poll():
                    result = self._handle(worker, worker.conn.recv())
                    if result is not None:
                        out.append(result)
            worker.process.join(timeout=1.0)
            self._died(worker)
        return out

    def _handle(
        self, worker: _Worker, msg: tuple[Any, ...]
    ) -> tuple[_Task, Loaded | BaseException] | None:
        kind = msg[0]
        if kind == "ready":
            worker.ready = True
            worker.ready_at = time.monotonic()
            return None
        if kind == "init_error":
            _, data, type_name, text = msg
            exc = _rebuild(data, type_name, text)
            exc.add_note(
                f"in worker_init_fn of DataLoader worker {worker.id} (pid {worker.pid}):\n{text}"
            )
            raise exc
        task = self.tasks.pop(msg[1])
        del worker.tasks[task.id]
        if task.stream:
            # The ids of the samples the worker read for it close a stream task's reply.
            task.indices = list(msg[-1])
            msg = msg[:-1]
        result: Loaded | BaseException
        if kind == "batch":
            _, _, nbytes, data, skipped = msg
            lease = self.ring.lease(task.slot, nbytes)
            header = pickle.loads(data)
            result = Loaded(_decode(header, lease), skipped)
            del lease  # the arrays keep it; the slot is free when they are gone
        else:
            self.ring.release(task.slot)
            if kind == "empty":
                result = Loaded(None, msg[2], empty=True)
            elif kind == "end":
                result = Loaded(None, [], empty=True, ended=True)
            else:
                _, _, index, stage, data, type_name, text = msg
                result = _rebuild(data, type_name, text)
                if stage == "iterate":
                    what = "while iterating the dataset"
                else:
                    where = f"sample {index}" if index is not None else f"samples {task.indices}"
                    what = f"while running {stage} on {where}"
                result.add_note(
                    f"{what}, in DataLoader worker {worker.id} "
                    f"(pid {worker.pid}); the worker's traceback:\n{text}"
                )
                _add_cuda_note(result, self.setup.start_method or "")
        if task.generation != self.generation:
            return None  # a result of an iteration that was left early
        return task, result

    def _died(self, worker: _Worker) -> None:
        exitcode = worker.process.exitcode
        held = [i for t in worker.tasks.values() for i in t.indices]
        if exitcode is not None and exitcode < 0:
            try:
                name = signal.Signals(-exitcode).name
            except ValueError:
                name = f"signal {-exitcode}"
            how = f"was killed by {name}"
            if -exitcode == signal.SIGKILL:
                how += " (the OOM killer sends SIGKILL: check `dmesg` for memory)"
        elif exitcode is None:
            how = "closed its connection and stopped responding"
        else:
            how = f"exited with code {exitcode}"
        holding = f"holding samples {held}"
        if any(t.stream for t in worker.tasks.values()):
            holding = "making the next batch of its pass over the dataset"
        raise WorkerDiedError(
            f"DataLoader worker {worker.id} (pid {worker.pid}) {how} while {holding}",
            pid=worker.pid,
            exitcode=exitcode,
            indices=held,
        )

    def describe(self, task_id: int) -> str:
        task = self.tasks.get(task_id)
        if task is None:
            return "a batch"
        w = self.workers[task.worker]
        if task.stream:
            return f"the next batch of worker {w.id} (pid {w.pid})"
        return f"the batch of samples {task.indices} (worker {w.id}, pid {w.pid})"

    # -- shutdown ---------------------------------------------------------------------------

    def alive(self) -> bool:
        return not self.closed and all(w.process.is_alive() for w in self.workers)

    def shutdown(self, force: bool = False) -> None:
        """End every worker: ask them to stop (or, with ``force``, terminate at once)."""
        if self.closed:
            return
        self.closed = True
        if not force:
            for w in self.workers:
                with contextlib.suppress(OSError):
                    w.conn.send(("stop",))
            deadline = time.monotonic() + 2.0
            for w in self.workers:
                w.process.join(timeout=max(0.0, deadline - time.monotonic()))
        _terminate(self.workers)
        for w in self.workers:
            w.conn.close()
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer.detach()

    def stats(self) -> dict[str, Any]:
        return {
            "workers": [
                {"id": w.id, "pid": w.pid, "alive": w.process.is_alive(), "in_flight": len(w.tasks)}
                for w in self.workers
            ],
            "slots": self.ring.stats(),
        }


def default_start_method() -> str:
    """The start method of workers when none is given.

    multiprocessing's default (fork on Linux before Python 3.14, forkserver from 3.14),
    except forkserver when JAX is imported: JAX runs threads that a fork would copy in the
    middle of their work, and warns that this will likely deadlock.
    """
    if "jax" in sys.modules:
        return "forkserver"
    return multiprocessing.get_start_method()


def _terminate(workers: Sequence[_Worker]) -> None:
    """SIGTERM the workers still running, then SIGKILL those that did not exit in 0.5 s."""
    for w in workers:
        if w.process.is_alive():
            with contextlib.suppress(OSError):
                w.process.terminate()
    deadline = time.monotonic() + 0.5
    for w in workers:
        w.process.join(timeout=max(0.0, deadline - time.monotonic()))
        if w.process.is_alive():
            with contextlib.suppress(OSError):
                w.process.kill()
            w.process.join(timeout=1.0)


def _rebuild(data: bytes | None, type_name: str, text: str) -> BaseException:
    if data is not None:
        try:
            exc = pickle.loads(data)
            if isinstance(exc, BaseException):
                return exc
        except Exception:
            pass
    last = text.strip().splitlines()[-1] if text.strip() else type_name
    return WorkerError(f"{type_name} in a DataLoader worker (it could not be sent back): {last}")


def _add_cuda_note(exc: BaseException, start_method: str) -> None:
    if start_method == "fork" and "CUDA" in str(exc):
        exc.add_note(
            "DataLoader workers started with fork cannot use CUDA: keep transforms on the "
            "CPU and let the DataLoader copy batches (device=...) in the main process, or "
            "use worker_start_method='spawn' or 'forkserver'"
        )


def _time_left(pool: WorkerPool, head: int, waited_since: float, timeout: float) -> float:
    """Seconds left before the batch ``head``, awaited since ``waited_since``, times out.

    A batch's clock starts when it is the next one due and its worker is up: a worker's
    start (the interpreter, unpickling the dataset, ``worker_init_fn``) is bounded by
    ``max(timeout, WORKER_START_TIMEOUT)`` instead, so a short ``timeout`` does not fail
    the first batches on a machine where starting a process takes seconds.
    """
    task = pool.tasks.get(head)
    worker = next((w for w in pool.workers if task is not None and w.id == task.worker), None)
    if worker is None or worker.ready:
        started = max(waited_since, worker.ready_at if worker is not None else 0.0)
        return timeout - (time.monotonic() - started)
    return max(timeout, WORKER_START_TIMEOUT) - (time.monotonic() - waited_since)


def _await_task(
    pool: WorkerPool,
    head: int,
    done: Container[int],
    arrived: Callable[[_Task, Loaded | BaseException], None],
    timeout: float | None,
) -> None:
    """Receive results, each passed to ``arrived``, until task ``head``'s is in ``done``.

    Raises:
        WorkerTimeoutError: ``head`` did not come back within ``timeout`` (see
            `_time_left`).
    """
    waited_since = time.monotonic()
    while head not in done:
        remaining = None
        if timeout is not None:
            remaining = _time_left(pool, head, waited_since, timeout)
            if remaining <= 0:
                raise WorkerTimeoutError(
                    f"{pool.describe(head)} did not come back within timeout={timeout} s"
                )
        for task, result in pool.receive(remaining):
            arrived(task, result)


def worker_batches(
    pool: WorkerPool,
    epoch: int,
    groups: Iterator[Group],
    timeout: float | None,
) -> Iterator[tuple[int, list[int], Loaded]]:
    """Yield ``(batch_no, ids, loaded)`` for the groups of an epoch, in order.

    At most ``pool.capacity()`` batches
    are in flight; a batch that failed is raised when its turn comes, after every batch
    before it.
    """
    pool.new_generation()
    # (task id, batch number, dataset indices), in batch order.
    order: collections.deque[tuple[int, int, list[int]]] = collections.deque()
    done: dict[int, Loaded | BaseException] = {}
    exhausted = False

    def fill() -> None:
        nonlocal exhausted
        while not exhausted and len(order) < pool.capacity():
            group = next(groups, None)
            if group is None:
                exhausted = True
                return
            order.append((pool.submit(epoch, group), group.batch_no, group.ids))

    def arrived(task: _Task, result: Loaded | BaseException) -> None:
        done[task.id] = result

    fill()
    while order:
        head, batch_no, indices = order[0]
        _await_task(pool, head, done, arrived, timeout)
        order.popleft()
        result = done.pop(head)
        fill()
        if isinstance(result, BaseException):
            raise result
        yield batch_no, indices, result


def stream_batches(
    pool: WorkerPool, epoch: int, start: int, timeout: float | None
) -> Iterator[tuple[int, list[int], Loaded]]:
    """Yield ``(batch_no, ids, loaded)`` of an iterable dataset's epoch, from ``start``.

    Each worker makes batches from its own pass over the dataset; they are taken
    round-robin, as PyTorch does: worker 0's first batch, worker 1's first, ..., worker
    0's second, ...; a worker whose pass has ended drops out. Each worker has at most
    ``pool.prefetch_factor`` requests in flight. A resumed epoch (``start > 0``) replays
    its first ``start`` batches: the workers read their samples and drop them.
    """
    pool.new_generation()
    pool.begin_stream(epoch)
    # (task id, worker id) of the requests in flight, in the order their batches are due.
    order: collections.deque[tuple[int, int]] = collections.deque()
    done: dict[int, tuple[_Task, Loaded | BaseException]] = {}
    dropped: set[int] = set()  # requests to workers whose pass has ended
    position = 0  # the next batch's number in the epoch

    def request(wid: int) -> None:
        # The batch's number if no worker ahead of it ends: a worker's end only moves the
        # batches behind it forward, so a request made as a replay is always one; one that
        # turns out to fall before `start` is made in full and dropped.
        replay = position + len(order) < start
        order.append((pool.submit_next(wid, replay), wid))

    for _ in range(pool.prefetch_factor):
        for wid in range(len(pool.workers)):
            request(wid)

    def arrived(task: _Task, result: Loaded | BaseException) -> None:
        if task.id in dropped:
            dropped.discard(task.id)
        else:
            done[task.id] = (task, result)

    while order:
        head, wid = order[0]
        _await_task(pool, head, done, arrived, timeout)
        order.popleft()
        task, result = done.pop(head)
        if isinstance(result, BaseException):
            raise result
        if result.ended:
            # The worker's pass is over: its other requests will end too.
            for entry in [e for e in order if e[1] == wid]:
                order.remove(entry)
                if done.pop(entry[0], None) is None:
                    dropped.add(entry[0])
            continue
        batch_no, position = position, position + 1
        request(wid)
        if batch_no < start:
            continue  # replayed
        if task.replay:
            raise RuntimeError(f"batch {batch_no} was replayed, not made (a bug)")
        yield batch_no, task.indices, result
