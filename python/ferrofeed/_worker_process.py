"""What runs in a `DataLoader` worker process: its loop, its samples, its batch headers.

The main process's side (`ferrofeed._workers`: the pool, dispatch, results, faults) starts
`_worker_main` in each worker with a `_Setup`; the worker then answers tasks, one batch
each, until told to stop or its parent dies. The batch header format (`_encode` here,
`_decode` in the main process) lives here too, with what writes it.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import logging
import multiprocessing.connection
import os
import pickle
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing import reduction
from typing import Any

from . import _core
from ._collate import collating_into, describe_entries
from ._group import Group, in_worker
from ._iterable import SampleStream, StreamSpec
from ._sample import sample_scope, seed_generators
from ._slot_writer import SlotWriter

__all__ = ["WorkerInfo", "get_worker_info"]

_log = logging.getLogger("ferrofeed.loader")

# The worker seed of worker `id` is sample_seed(seed, _WORKER_EPOCH, id).
_WORKER_EPOCH = 2**64 - 1
# Seconds a worker may take to start (see `_time_left`) when `timeout=` is shorter.
WORKER_START_TIMEOUT = 60.0


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    """What a `DataLoader` worker process knows about itself (see `get_worker_info`).

    Attributes:
        id: the worker's number, ``0 <= id < num_workers``.
        num_workers: how many workers the loader runs.
        seed: this worker's seed, derived from the loader's ``seed`` and ``id`` (the
            generators are seeded with it before ``worker_init_fn``; each sample then
            reseeds them from the loader's seed, the epoch and its index).
        dataset: the worker's copy of the dataset (the same object under fork).
    """

    id: int
    num_workers: int
    seed: int
    dataset: Any


_WORKER_INFO: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """Return this worker's `WorkerInfo` in a `DataLoader` worker process, else ``None``.

    In a worker, ``torch.utils.data.get_worker_info()`` answers the same (id,
    num_workers, seed, dataset), so a torch ``IterableDataset`` that splits its work by it
    works unchanged.

    Example:
        >>> import ferrofeed
        >>> ferrofeed.get_worker_info() is None  # the main process
        True
    """
    return _WORKER_INFO


# -- batch headers ------------------------------------------------------------------------
# A header is a tree of tuples:
#   ("a", offset, shape, dtype)      a NumPy array in the slot
#   ("t", offset, shape, dtype)      a torch tensor in the slot
#   ("d", [(key, node), ...])        a dict
#   ("n", cls, [node, ...])          a named tuple
#   ("u", [node, ...]) / ("l", ...)  a tuple / a list
#   ("p", value)                     anything else, pickled in the header


def _is_shareable(arr: Any) -> bool:
    return bool(arr.dtype.kind in "biufc" and arr.dtype.fields is None and arr.size > 0)


def _encode(obj: Any, slot: SlotWriter | None) -> tuple[Any, ...]:
    np = sys.modules.get("numpy")
    torch = sys.modules.get("torch")
    if np is not None and isinstance(obj, np.ndarray):
        return _encode_array(obj, "a", slot)
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.device.type == "cpu" and not obj.is_sparse:
            try:
                arr = obj.detach().numpy()
            except (TypeError, RuntimeError):  # bfloat16 and others NumPy lacks
                return ("p", obj)
            return _encode_array(arr, "t", slot)
        return ("p", obj)
    if type(obj) is dict:
        items = [(k, _encode(v, slot)) for k, v in obj.items()]
        if all(node[0] == "p" for _, node in items):
            return ("p", obj)
        return ("d", items)
    named = isinstance(obj, tuple) and hasattr(type(obj), "_fields")
    if named or type(obj) in (tuple, list):
        nodes = [_encode(v, slot) for v in obj]
        if all(node[0] == "p" for node in nodes):
            return ("p", obj)
        if named:
            return ("n", type(obj), nodes)
        return ("u" if type(obj) is tuple else "l", nodes)
    return ("p", obj)


def _encode_array(arr: Any, kind: str, slot: SlotWriter | None) -> tuple[Any, ...]:
    if slot is None or not _is_shareable(arr):
        return ("p", arr)
    offset = slot.offset_of(arr)
    if offset is None:
        # Made outside the slot (a collate of the user's own): one copy into it.
        out = slot.array(arr.shape, arr.dtype)
        out[...] = arr
        offset = slot.offset_of(out)
        assert offset is not None
    return (kind, offset, arr.shape, arr.dtype.str)


def _decode(node: tuple[Any, ...], lease: Any) -> Any:
    tag = node[0]
    if tag == "p":
        return node[1]
    if tag in ("a", "t"):
        import numpy as np

        _, offset, shape, dtype = node
        dt = np.dtype(dtype)
        count = 1
        for n in shape:
            count *= n
        arr = np.frombuffer(lease, dt, count, offset).reshape(shape)
        if tag == "t":
            import torch

            return torch.from_numpy(arr)
        return arr
    if tag == "d":
        return {k: _decode(v, lease) for k, v in node[1]}
    if tag == "n":
        return node[1](*(_decode(v, lease) for v in node[2]))
    values = [_decode(v, lease) for v in node[1]]
    return tuple(values) if tag == "u" else values


# -- the worker process ---------------------------------------------------------------------


@dataclasses.dataclass
class _Setup:
    """What every worker gets once, at start."""

    dataset: Any
    transform: Callable[[Any], Any] | None
    collate: Callable[[list[Any]], Any]
    skip: bool
    seed: int
    num_workers: int
    worker_init_fn: Callable[[int], None] | None
    parent_pid: int
    start_method: str | None
    # The random generators' modules (numpy, torch) the main process had imported: a
    # spawned or forkserver worker imports them before its first sample, so that each
    # sample, the first included, starts from its own seed in them (a dataset that imports
    # torch inside __getitem__ would otherwise draw its first sample unseeded).
    seeded_modules: tuple[str, ...] = ()
    # An iterable dataset's batching: each worker then iterates its own copy of the
    # dataset and makes a batch of its stream per task (see `_iterable`).
    stream: StreamSpec | None = None


def seeded_modules() -> tuple[str, ...]:
    """The random generators' modules that this process has imported."""
    return tuple(m for m in ("numpy", "torch") if m in sys.modules)


def _watch_parent(parent_pid: int) -> None:
    """Exit this worker at once when the main process dies (even by SIGKILL)."""

    def watch() -> None:
        try:
            fd = os.pidfd_open(parent_pid)
        except (AttributeError, OSError):
            fd = None
        if fd is not None:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            poller.poll()  # readable when the process has exited
            os._exit(1)
        while os.getppid() == parent_pid or (os.getppid() != 1 and _pid_alive(parent_pid)):
            time.sleep(0.5)
        os._exit(1)

    if not _pid_alive(parent_pid):
        os._exit(1)
    threading.Thread(target=watch, name="ferrofeed-parent-watch", daemon=True).start()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _exception_payload(exc: BaseException) -> tuple[bytes | None, str, str]:
    """The exception pickled (or None when it cannot be), its type name and traceback."""
    text = "".join(traceback.format_exception(exc))
    data: bytes | None
    try:
        pickled = pickle.dumps(exc, protocol=5)
        pickle.loads(pickled)  # an exception that pickles may still fail to unpickle
        data = pickled
    except Exception:
        data = None
    return data, f"{type(exc).__module__}.{type(exc).__qualname__}", text


def _worker_main(setup: _Setup, conn: multiprocessing.connection.Connection, wid: int) -> None:
    """The entry point of a worker process."""
    global _WORKER_INFO
    if setup.start_method in ("fork", "forkserver"):
        # A forked worker shares its parent's heap copy-on-write. The garbage collector's
        # full collections write to the header of every container object they visit, so
        # they would copy, page by page, all that the worker inherited (the modules a
        # training process imports, torch's included: tens of MiB per worker). Inherited
        # objects go to the permanent generation, which the collector never visits; what
        # the worker allocates from here on is collected as usual. (What Python's
        # documentation of gc.freeze recommends for fork without exec.)
        gc.freeze()
    # Ctrl-C goes to the whole process group: the main process decides what happens.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch_parent(setup.parent_pid)
    worker_seed = _core.sample_seed(setup.seed, _WORKER_EPOCH, wid)
    _WORKER_INFO = WorkerInfo(wid, setup.num_workers, worker_seed, setup.dataset)
    in_worker(setup.dataset)  # what a map-style dataset's groups index here
    try:
        for name in setup.seeded_modules:
            importlib.import_module(name)
        _tell_torch(_WORKER_INFO)
        seed_generators(worker_seed)
        if setup.worker_init_fn is not None:
            setup.worker_init_fn(wid)
    except Exception as e:
        conn.send(("init_error", *_exception_payload(e)))
        return
    conn.send(("ready", os.getpid()))
    slots: dict[int, SlotWriter] = {}
    size_hint = 0
    # An iterable dataset's stream of the current epoch ("begin" starts a new one).
    stream: SampleStream | None = None
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] == "stop":
            return
        if msg[0] == "slot":
            slots[msg[1]] = SlotWriter(reduction.recv_handle(conn))
            continue
        if msg[0] == "begin":
            assert setup.stream is not None
            _tell_torch(_WORKER_INFO)  # torch may have been imported since the start
            stream = SampleStream(
                setup.dataset,
                setup.stream,
                msg[1],
                worker=wid,
                num_workers=setup.num_workers,
                seed_globals=True,
            )
            continue
        tail: tuple[Any, ...] = ()
        if msg[0] == "next":
            _, task_id, slot_id, replay = msg
            assert stream is not None
            slot = slots.get(slot_id)
            reply, ids = _run_stream_task(setup, stream, task_id, slot, size_hint, replay)
            tail = (ids,)  # a stream task's replies end with the ids of its samples
        else:
            _, task_id, epoch, group, slot_id = msg
            slot = slots.get(slot_id) if slot_id is not None else None
            reply = _run_task(setup, task_id, epoch, group, slot, size_hint)
        if slot is not None:
            size_hint = max(size_hint, slot.used)
        try:
            conn.send(reply + tail)
        except (BrokenPipeError, ConnectionResetError):
            return
        except Exception as e:  # the header does not pickle
            conn.send(("error", task_id, None, "collate", *_exception_payload(e), *tail))


def _tell_torch(info: WorkerInfo) -> None:
    """Have ``torch.utils.data.get_worker_info()`` answer as `get_worker_info` does.

    A torch ``IterableDataset`` splits its work by torch's ``get_worker_info()``, which
    reads a module global that only torch's own workers set: it is set here, in a
    `DataLoader` worker, when torch is imported (its dataclass takes the same fields).
    """
    worker = sys.modules.get("torch.utils.data._utils.worker")
    if worker is None:
        return
    try:
        worker._worker_info = worker.WorkerInfo(  # type: ignore[attr-defined]
            id=info.id, num_workers=info.num_workers, seed=info.seed, dataset=info.dataset
        )
    except Exception as e:  # another torch's layout: its get_worker_info() stays None
        _log.debug("torch.utils.data.get_worker_info() not set in the worker: %r", e)


def _run_task(
    setup: _Setup,
    task_id: int,
    epoch: int,
    group: Group,
    slot: SlotWriter | None,
    size_hint: int,
) -> tuple[Any, ...]:
    samples = []
    kept: list[int] = []  # the dataset index of each of samples
    skipped: list[tuple[int, str]] = []
    for i in group.ids:
        try:
            # One thread loads at a time here: the global generators are the sample's too.
            with sample_scope(setup.seed, epoch, i, seed_globals=True):
                sample = group.sample(i)
                if setup.transform is not None:
                    sample = setup.transform(sample)
        except Exception as e:
            if not setup.skip:
                return ("error", task_id, i, "load", *_exception_payload(e))
            skipped.append((i, f"{type(e).__name__}: {e}"))
            continue
        samples.append(sample)
        kept.append(i)
    return _collate_reply(setup, task_id, samples, kept, skipped, slot, size_hint)


def _run_stream_task(
    setup: _Setup,
    stream: SampleStream,
    task_id: int,
    slot: SlotWriter | None,
    size_hint: int,
    replay: bool,
) -> tuple[tuple[Any, ...], list[int]]:
    """The next batch of this worker's stream: the reply and the ids of its samples.

    The reply is ``("end", task_id)`` past the stream's end (and to every task after it),
    and ``("empty", task_id, [])`` for a batch being replayed (a resumed epoch: read, not
    transformed). An error of the dataset's iterator ends the stream.
    """
    try:
        items = stream.next_batch()
    except Exception as e:
        return ("error", task_id, None, "iterate", *_exception_payload(e)), []
    if items is None:
        return ("end", task_id), []
    ids = [i for i, _ in items]
    if replay:
        return ("empty", task_id, []), ids
    if setup.transform is None:
        return _collate_reply(setup, task_id, [s for _, s in items], ids, [], slot, size_hint), ids
    samples = []
    kept: list[int] = []
    skipped: list[tuple[int, str]] = []
    for i, sample in items:
        try:
            with sample_scope(setup.seed, stream.epoch, i, seed_globals=True):
                sample = setup.transform(sample)
        except Exception as e:
            if not setup.skip:
                return ("error", task_id, i, "load", *_exception_payload(e)), ids
            skipped.append((i, f"{type(e).__name__}: {e}"))
            continue
        samples.append(sample)
        kept.append(i)
    return _collate_reply(setup, task_id, samples, kept, skipped, slot, size_hint), ids


def _collate_reply(
    setup: _Setup,
    task_id: int,
    samples: list[Any],
    kept: list[int],
    skipped: list[tuple[int, str]],
    slot: SlotWriter | None,
    size_hint: int,
) -> tuple[Any, ...]:
    """Collate ``samples`` (of ids ``kept``) into ``slot``; the reply to the main process."""
    if not samples:
        return ("empty", task_id, skipped)
    if slot is not None:
        slot.begin(size_hint)
    try:
        with collating_into(slot.array if slot is not None else None):
            batch = setup.collate(samples)
        header = _encode(batch, slot)
        del batch
    except Exception as e:
        describe_entries(e, kept)
        return ("error", task_id, None, "collate", *_exception_payload(e))
    used = slot.used if slot is not None else 0
    # Pickled here, not by send(): a batch that cannot be pickled is the user's error.
    try:
        data = pickle.dumps(header, protocol=5)
    except Exception as e:
        return ("error", task_id, None, "collate", *_exception_payload(e))
    return ("batch", task_id, used, data, skipped)
