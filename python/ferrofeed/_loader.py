"""`DataLoader`: batches from a map-style dataset, shuffled, sharded and resumable."""

from __future__ import annotations

import collections
import importlib
import itertools
import logging
import math
import operator
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from . import _core
from ._errors import PipelineError, TooManyFailuresError, WorkerError
from ._images import ImageFiles, ImageFolder
from ._pipeline import PipelineBuilder
from ._workers import WorkerPool, _Setup, seeded_modules, worker_batches

__all__ = ["DataLoader", "default_collate"]

Output = Literal["numpy", "torch", "jax"]
StartMethod = Literal["fork", "spawn", "forkserver"]

_log = logging.getLogger("ferrofeed.loader")

# dtypes a pooled, 64-byte aligned batch buffer can hold (what DLPack consumers take).
_POOLED_DTYPES = {"uint8", "int32", "int64", "float16", "float32"}

# In a worker process, while its collate runs: allocates an array of (shape, dtype) in the
# shared slot the batch goes back in (see _workers), so stacking writes straight into it.
_worker_alloc: Callable[[tuple[int, ...], Any], Any] | None = None


class MapDataset(Protocol):
    """What `DataLoader` reads: ``len(ds)`` and ``ds[i]`` (a torch Dataset qualifies)."""

    def __len__(self) -> int: ...
    def __getitem__(self, index: int, /) -> Any: ...


# Stands for a batch whose every sample was skipped.
_EMPTY = object()
_END = object()  # after an epoch's last sample, where the grouper must know the end


@dataclass(frozen=True)
class _Skipped:
    """A sample that failed under ``on_error="skip"`` (dropped from its batch by collate)."""

    index: int
    reason: str


def _stack(arrays: Sequence[Any]) -> Any:
    import numpy as np

    parts = [np.asarray(a) for a in arrays]
    dtype = np.result_type(*parts)  # promotes as np.stack would: [1, 2.5] -> float64
    shape = (len(parts), *parts[0].shape)
    alloc = _worker_alloc
    if alloc is not None and dtype.kind in "biufc" and parts[0].size > 0:
        out = alloc(shape, dtype)
        np.stack(parts, out=out)
        return out
    if dtype.name in _POOLED_DTYPES and parts[0].size > 0:
        # Straight into a 64-byte aligned, pooled buffer: JAX and torch then take the
        # batch by DLPack without a copy, and the buffer is reused once freed.
        out = np.from_dlpack(_core.empty(shape, dtype.name))
        np.stack(parts, out=out)
        return out
    return np.stack(parts).astype(dtype, copy=False)


def default_collate(samples: Sequence[Any]) -> Any:
    """Combine a list of samples into a batch, recursively, as NumPy arrays.

    Arrays and numbers are stacked along a new first axis (into a pooled, 64-byte aligned
    buffer for the common dtypes, or in a worker process straight into the shared slot the
    batch goes back in); dicts, named tuples, tuples, lists and other sequences are collated
    field by field (a list of numbers is stacked like an array); strings and bytes are
    returned as a list.

    Raises:
        TypeError: a sample of another type (``None``, an arbitrary object), as PyTorch's
            ``default_collate`` does; pass your own ``collate`` for those.
        ValueError: sequences of different lengths in one batch.

    Example:
        >>> batch = default_collate([{"x": [1.0, 2.0], "y": 0}, {"x": [3.0, 4.0], "y": 1}])
        >>> batch["x"].shape, batch["y"].tolist()
        ((2, 2), [0, 1])
    """
    import numpy as np

    first = samples[0]
    if isinstance(first, Mapping):
        return {key: default_collate([s[key] for s in samples]) for key in first}
    if isinstance(first, str | bytes):
        return list(samples)
    if isinstance(first, np.ndarray | np.generic | int | float | bool) or hasattr(
        first, "__array__"
    ):
        return _stack(samples)
    if isinstance(first, Sequence):
        if isinstance(first, list) and all(isinstance(v, int | float) for v in first):
            return _stack(samples)
        if any(len(s) != len(first) for s in samples):
            raise ValueError(
                "default_collate: the sequences of one batch must have the same length, "
                f"not {sorted({len(s) for s in samples})}"
            )
        fields = [default_collate(list(f)) for f in zip(*samples, strict=True)]
        if isinstance(first, tuple) and hasattr(type(first), "_fields"):  # a named tuple
            return type(first)(*fields)
        kind: Any = type(first)
        if kind in (tuple, list):
            return kind(fields)
        try:
            return kind(fields)  # e.g. a deque
        except TypeError:  # a sequence type that cannot be built from a list
            return fields
    raise TypeError(
        "default_collate: samples must be arrays, numbers, strings, dicts or sequences of "
        f"these, not {type(first).__module__}.{type(first).__qualname__}; pass collate= "
        "to batch them your own way"
    )


def _default_rank_and_world() -> tuple[int, int]:
    """Find the rank and world size.

    From torch.distributed or JAX when initialised, else ``RANK`` and ``WORLD_SIZE`` in the
    environment, else a single process. Never imports a framework.
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    jax = sys.modules.get("jax")
    if jax is not None:
        try:
            count = int(jax.process_count())
        except Exception:  # a JAX without a usable backend: fall through
            count = 1
        if count > 1:
            return int(jax.process_index()), count
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is not None and world is not None:
        return int(rank), int(world)
    return 0, 1


def _convert(batch: Any, output: Output, device: str | None) -> Any:
    if output == "numpy":
        return batch
    if isinstance(batch, dict):
        return {k: _convert(v, output, device) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(type(batch), "_fields"):  # a named tuple
        return type(batch)(*(_convert(v, output, device) for v in batch))
    if isinstance(batch, tuple | list) and not _is_array(batch):
        return type(batch)(_convert(v, output, device) for v in batch)
    if not _is_array(batch):
        return batch
    if output == "torch":
        import torch

        tensor = torch.from_numpy(batch)
        if not device:
            return tensor
        from .torch import _to_device

        # The batch's buffer stays out of its pool (or its worker slot) until the copy ends.
        return _to_device(tensor, device, non_blocking=True)
    import jax

    array = jax.dlpack.from_dlpack(batch) if batch.flags.c_contiguous else jax.numpy.asarray(batch)
    return jax.device_put(array, jax.devices(device)[0]) if device else array


def _is_array(x: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray)


class _Progress:
    """A progress bar: tqdm when installed, else a one-line bar on stderr."""

    def __init__(self, total: int, desc: str) -> None:
        self._n, self._total, self._desc = 0, total, desc
        self._start = time.monotonic()
        self._tqdm: Any = None
        try:
            from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]

            self._tqdm = tqdm(total=total, desc=desc, unit="batch")
        except ImportError:
            pass

    def update(self) -> None:
        self._n += 1
        if self._tqdm is not None:
            self._tqdm.update(1)
            return
        rate = self._n / max(time.monotonic() - self._start, 1e-9)
        width = 30
        filled = width * self._n // max(self._total, 1)
        bar = "#" * filled + "-" * (width - filled)
        print(
            f"\r{self._desc} [{bar}] {self._n}/{self._total} {rate:.1f} batch/s",
            end="",
            file=sys.stderr,
            flush=True,
        )

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
        else:
            print(file=sys.stderr, flush=True)


class DataLoader:
    """Batches from a map-style dataset: shuffled per epoch, sharded by rank, resumable.

    Samples are read and transformed concurrently on the pipeline's threads (``transform``
    holds the GIL only while it runs), collated into batches, and handed out as NumPy
    arrays, or as PyTorch or JAX arrays without a copy. Output order is deterministic: the
    same ``seed`` and epoch give the same batches whatever ``num_threads`` is.

    Sampling: every epoch is a new permutation of the dataset derived from ``(seed,
    epoch)``, computed on the fly (starting an epoch costs the same for ten samples or a
    billion). With ``world_size > 1`` each rank takes every ``world_size``-th sample of
    that order: ranks never overlap, together they cover the dataset, and all see the same
    number of batches (the shards are padded by wrapping around to the start, or with
    ``drop_last=True`` cut to equal length, which also drops a last, partial batch).

    Images: a folder laid out one subfolder per class (a path, or an `ImageFolder`), image
    files (`ImageFiles`), or a sequence of paths or ``(path, label)`` pairs with
    ``transform=ops.decode_image(...)`` go through the native image chain: each batch's
    files are read, decoded, resized and cropped in Rust on ``num_threads`` threads without
    the GIL, straight into one pooled batch buffer, handed out as ``(images, labels)``
    (``images`` alone when there are no labels), uint8 NHWC unless ``collate`` is an
    `ops.collate` that says otherwise. Random crops are drawn from ``seed``, the epoch and
    each file's path as the dataset gives it: the same in every run and with any number of
    threads (the same files under another folder get other crops).

    Args:
        source: a map-style dataset: ``len(ds)`` and ``ds[i]`` (a ``torch.utils.data.Dataset``
            works unchanged, and so does a `SharedList` or a list); or images, as above.
        batch_size: samples per batch (positional, as in PyTorch); ``None``: no batching,
            each sample is handed out on its own (converted to ``output``).
        shuffle: shuffle the order every epoch.
        seed: the shuffle's seed (and the random crops').
        drop_last: drop the uneven tail, so shards and batches are all full.
        transform: a function applied to each sample after ``ds[i]``, or for images an
            `ops.decode_image` op (default: ``ops.decode_image(resize_shorter=256,
            crop=224)``).
        collate: combines a list of samples into a batch (default: `default_collate`); for
            images, an `ops.collate` op with the same batch size (layout, dtype and
            normalization).
        num_threads: samples read at once (default: the number of CPUs, at most 8).
        prefetch: finished batches kept ready ahead of the training loop.
        rank: this process's rank (default: torch.distributed or JAX when initialised,
            else ``$RANK``, else 0).
        world_size: the number of ranks (default: as for ``rank``, else 1).
        batches_per_epoch: as AllenNLP defines it: every epoch yields exactly this many
            batches, continuing where the previous epoch stopped and going round the data
            as often as needed.
        output: ``"numpy"``, ``"torch"`` or ``"jax"``.
        device: move each batch there (e.g. ``"cuda:0"`` with torch, ``"gpu"`` with JAX).
        on_error: ``"raise"`` (a failing sample stops the epoch: after the batches before
            it, its own exception is raised, with a note naming the sample and the stage)
            or ``"skip"`` (the sample is left out of its batch, logged and listed in
            `stats`).
        max_failures: with ``on_error="skip"``, the samples that may fail in one epoch
            before `TooManyFailuresError` is raised (default 10; ``None``: no limit). An
            epoch in which every sample fails raises it too, instead of yielding nothing.
        progress: show a progress bar (tqdm when installed).
        num_workers: run ``dataset[i]``, ``transform`` and ``collate`` in this many worker
            processes (0: on ``num_threads`` threads in this process). Batches come back
            through shared memory without a copy, in the same order and with the same
            random draws as with any other number of workers: each sample's ``random``,
            ``numpy.random`` and torch generators are seeded from ``(seed, epoch, index)``.
            Not used by the native image chain, which needs no GIL.
        worker_start_method: ``"fork"``, ``"spawn"`` or ``"forkserver"``; ``None``:
            multiprocessing's default, or forkserver when JAX is imported.
        persistent_workers: keep the worker processes from one epoch to the next (end
            them with `shutdown_workers`, or by dropping the loader).
        worker_init_fn: called with the worker's id once in each worker at start.
        prefetch_factor: batches in flight per worker.
        timeout: seconds one unit of work may take (default: as long as it takes). On
            threads, one sample's ``dataset[i]`` + ``transform``: past it, the sample
            fails with `TimeoutError` (named in a note), raised or, under
            ``on_error="skip"``, skipped like any failing sample; the stuck call cannot
            be interrupted, so its thread is left behind and a new one takes its place.
            With workers, a batch, timed from when it is next due and its worker is up
            (a worker's start gets ``max(timeout, 60)`` s): `WorkerTimeoutError`, under
            either ``on_error`` (the worker holding it is stuck). On the native image
            chain, one batch's decode: `TimeoutError`.

    Ctrl-C while iterating raises `KeyboardInterrupt` within about 0.25 s. Before it
    reaches you, the worker processes are ended (terminated if busy), and on threads every
    thread of the loader is joined except those still inside a call of ``dataset[i]`` or
    ``transform``: such a call cannot be interrupted, so its thread is left to end when the
    call returns (its sample is thrown away).

    Raises (while iterating, with workers):
        WorkerDiedError: a worker was killed (a signal, the OOM killer) or exited; the
            error names its pid, the signal and the samples it held.
        WorkerTimeoutError: a worker's batch took longer than ``timeout``.
        TimeoutError: on threads, a sample (or a native batch) took longer than ``timeout``.
        The user's own exception, from ``dataset[i]``, ``transform`` or ``collate`` in a
        worker, with a note naming the sample and the worker's traceback.

    Example:
        >>> loader = DataLoader(list(range(10)), batch_size=4, shuffle=True, seed=1)
        >>> len(loader)
        3
        >>> [b.tolist() for b in loader] == [b.tolist() for b in loader.epoch_batches(0)]
        True
    """

    def __init__(
        self,
        source: MapDataset | str | os.PathLike[str],
        batch_size: int | None = 1,
        *,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        transform: Callable[[Any], Any] | _core.NativeOp | None = None,
        collate: Callable[[list[Any]], Any] | _core.NativeOp | None = None,
        num_threads: int | None = None,
        prefetch: int = 2,
        rank: int | None = None,
        world_size: int | None = None,
        batches_per_epoch: int | None = None,
        output: Output = "numpy",
        device: str | None = None,
        on_error: Literal["raise", "skip"] = "raise",
        max_failures: int | None = 10,
        progress: bool = False,
        num_workers: int = 0,
        worker_start_method: StartMethod | None = None,
        persistent_workers: bool = False,
        worker_init_fn: Callable[[int], None] | None = None,
        prefetch_factor: int = 2,
        timeout: float | None = None,
    ) -> None:
        if isinstance(source, str | os.PathLike):
            source = ImageFolder(source)
        if not (hasattr(source, "__len__") and hasattr(source, "__getitem__")):
            raise TypeError(
                "source must be a map-style dataset (len(ds) and ds[i]), a sequence of "
                f"image paths, or a folder of class subfolders, not {type(source).__name__}"
            )
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"batch_size must be an int >= 1 or None, not {batch_size!r}")
        if max_failures is not None and (not isinstance(max_failures, int) or max_failures < 0):
            raise ValueError(f"max_failures must be an int >= 0 or None, not {max_failures!r}")
        for name, value, low in (
            ("prefetch", prefetch, 1),
            ("num_workers", num_workers, 0),
            ("prefetch_factor", prefetch_factor, 1),
        ):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, not {value!r}")
        if batches_per_epoch is not None and (
            not isinstance(batches_per_epoch, int) or batches_per_epoch < 1
        ):
            raise ValueError(f"batches_per_epoch must be an int >= 1, not {batches_per_epoch!r}")
        try:
            seed = operator.index(seed)  # an int, or a NumPy integer
        except TypeError:
            raise TypeError(f"seed must be an int, not {type(seed).__name__}") from None
        if not 0 <= seed < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), not {seed}")
        if output not in ("numpy", "torch", "jax"):
            raise ValueError(f"output must be 'numpy', 'torch' or 'jax', not {output!r}")
        if output != "numpy":
            # Now, not at the first batch: without the framework this names the extra to
            # install (pip install 'ferrofeed[torch]').
            importlib.import_module(f"ferrofeed.{output}")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        if worker_start_method not in (None, "fork", "spawn", "forkserver"):
            raise ValueError(
                "worker_start_method must be 'fork', 'spawn', 'forkserver' or None, not "
                f"{worker_start_method!r}"
            )
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be a number of seconds > 0 or None, not {timeout!r}")
        default_rank, default_world = _default_rank_and_world()
        self.rank = default_rank if rank is None else rank
        self.world_size = default_world if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in [0, world_size={self.world_size})")
        if device is not None:
            _check_device(output, device)
        self.dataset = source
        self.batch_size = batch_size
        # Samples per batch; 1 with batch_size=None (each sample handed out on its own).
        self._batch = batch_size or 1
        self.max_failures = max_failures
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.num_threads = num_threads or min(os.cpu_count() or 2, 8)
        self.prefetch = prefetch
        self.batches_per_epoch = batches_per_epoch
        self.output: Output = output
        self.device = device
        self.on_error = on_error
        self.progress = progress
        self.num_workers = num_workers
        self.worker_start_method: StartMethod | None = worker_start_method
        self.persistent_workers = persistent_workers
        self.worker_init_fn = worker_init_fn
        self.prefetch_factor = prefetch_factor
        self.timeout = timeout
        self._workers: WorkerPool | None = None
        self._epoch = 0
        self._resume_batches = 0
        self._batches_done = 0
        self._skipped: list[tuple[int, str]] = []
        self._skipped_lock = threading.Lock()
        self._failures = 0  # samples skipped in the current iteration
        # Samples being loaded on threads, with when they started (to name the one a
        # `timeout` caught).
        self._loading: dict[int, float] = {}
        self._pipeline: _core.Pipeline | None = None
        self._pool: _core.BufferPool | None = None
        # The native image chain: image files with a native (or the default) transform.
        self.native = isinstance(transform, _core.NativeOp) or (
            transform is None and isinstance(source, ImageFiles)
        )
        self.transform: Callable[[Any], Any] | _core.NativeOp | None
        self.collate: Callable[[list[Any]], Any] | _core.NativeOp | None
        if self.native:
            self.transform = transform if transform is not None else _default_image_transform()
            self.collate = collate
            if batch_size is None:
                raise TypeError("batch_size=None needs a Python transform, not image files")
            self._check_native(source, batch_size)
        else:
            if isinstance(collate, _core.NativeOp):
                raise TypeError(
                    "collate=ops.collate(...) needs the native image chain: image files "
                    "as the source, and transform=ops.decode_image(...) (or None)"
                )
            self.transform = transform
            if batch_size is None and collate is not None:
                raise TypeError("batch_size=None hands out samples as they are: no collate")
            self.collate = collate or (_single if batch_size is None else default_collate)

    def _check_native(self, source: Any, batch_size: int) -> None:
        """Refuse, at construction, what the native image chain cannot run."""
        if isinstance(self.collate, _core.NativeOp):
            if self.collate.group_size is None:
                raise TypeError("collate must be ops.collate(...) or None with image files")
            if self.collate.group_size not in (0, batch_size):
                raise ValueError(
                    f"collate=ops.collate({self.collate.group_size}, ...) but "
                    f"batch_size={batch_size}: give both the same batch size"
                )
        elif self.collate is not None:
            raise TypeError(
                "with the native image chain, collate is ops.collate(...) or None "
                "(a Python collate needs a Python transform)"
            )
        if len(source) > 0:
            first = source[0]
            pair = isinstance(first, tuple | list) and len(first) == 2
            path = first[0] if pair else first
            if not isinstance(path, str | os.PathLike):
                raise TypeError(
                    "with a native transform, the source's items are image paths or "
                    f"(path, label) pairs, not {type(first).__name__}"
                )
        # Builds the batch op once, so a transform that is not ops.decode_image(...), or
        # one without a fixed output size, fails here rather than at the first batch.
        self._batch_op(0)

    def _wants_pinned(self) -> bool:
        """Whether batches go to a CUDA device (their host memory is then page-locked)."""
        return self.device is not None and "cuda" in self.device

    def _batch_op(self, epoch: int) -> _core.NativeOp:
        """The native op that turns a list of files into a batch, for ``epoch``."""
        assert isinstance(self.transform, _core.NativeOp)
        if self._pool is None:
            pinned = None if self._wants_pinned() else False
            # No bound on buffers (the pipeline's queues bound the read-ahead, and a
            # consumer may keep batches), a few kept for reuse from batch to batch.
            self._pool = _core.BufferPool(
                None, max_idle=2 * (self.prefetch + 4), pinned=pinned, timeout=None
            )
        collate = self.collate if isinstance(self.collate, _core.NativeOp) else None
        return _core._op_load_batch(
            self.transform,
            collate,
            seed=self.seed,
            epoch=epoch,
            threads=min(self.num_threads, self._batch),
            skip=self.on_error == "skip",
            pool=self._pool,
        )

    # -- sizes ---------------------------------------------------------------------

    @property
    def samples_per_rank(self) -> int:
        """Samples each rank reads per pass over the data (after padding or dropping)."""
        n = len(self.dataset)
        return n // self.world_size if self.drop_last else math.ceil(n / self.world_size)

    @property
    def batches_per_pass(self) -> int:
        """Batches each rank yields per pass over the data."""
        per_rank = self.samples_per_rank
        if self.drop_last:
            return per_rank // self._batch
        return math.ceil(per_rank / self._batch)

    def __len__(self) -> int:
        """Batches per epoch for this rank (0 when its shard cannot fill one)."""
        if self.batches_per_pass == 0:
            return 0
        return self.batches_per_epoch or self.batches_per_pass

    # -- epochs and state -------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Start the next iteration at the beginning of ``epoch``."""
        self._epoch = epoch
        self._resume_batches = 0

    @property
    def epoch(self) -> int:
        """The epoch the next iteration yields (advances after each full epoch)."""
        return self._epoch

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands, to resume with `load_state_dict` (in a new process too).

        Example:
            >>> loader = DataLoader(list(range(8)), batch_size=2, shuffle=True)
            >>> it = iter(loader); first = next(it)
            >>> state = loader.state_dict()
            >>> resumed = DataLoader(list(range(8)), batch_size=2, shuffle=True)
            >>> resumed.load_state_dict(state)
            >>> next(iter(resumed)).tolist() == next(it).tolist()
            True
        """
        return {
            "version": 1,
            "epoch": self._epoch,
            "batches_done": self._batches_done,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "rank": self.rank,
            "world_size": self.world_size,
            "dataset_len": len(self.dataset),
            "batches_per_epoch": self.batches_per_epoch,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a `state_dict`.

        The next iteration yields exactly the batches the interrupted run would have
        yielded next.

        Raises:
            ValueError: the state comes from a loader configured differently.
        """
        if state.get("version") != 1:
            raise ValueError(f"unsupported state version {state.get('version')!r}")
        mine = self.state_dict()
        for key in (
            "seed",
            "shuffle",
            "batch_size",
            "drop_last",
            "rank",
            "world_size",
            "dataset_len",
            "batches_per_epoch",
        ):
            if state[key] != mine[key]:
                raise ValueError(
                    f"the state was saved with {key}={state[key]!r}, this loader has "
                    f"{key}={mine[key]!r}"
                )
        epoch, done = state["epoch"], state["batches_done"]
        for key, value in (("epoch", epoch), ("batches_done", done)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"the state's {key} must be an int >= 0, not {value!r}")
        if done > len(self):
            raise ValueError(
                f"the state's batches_done={done} is past the end of an epoch of "
                f"{len(self)} batches"
            )
        self._epoch = epoch
        self._resume_batches = done
        self._batches_done = done

    def stats(self) -> dict[str, Any]:
        """Return the pipeline's figures and the samples skipped so far.

        ``pipeline``: the current (or last) pass's per-stage figures; ``skipped``: the
        samples left out under ``on_error="skip"``, as (index, reason); ``buffers``: the
        batch buffer pool's counters with the native image chain (see
        `BufferPool.stats`), else empty.
        """
        with self._skipped_lock:
            skipped = list(self._skipped)
        pipeline = self._pipeline.stats() if self._pipeline is not None else {}
        buffers = self._pool.stats() if self._pool is not None else {}
        workers = self._workers.stats() if self._workers is not None else {}
        return {
            "pipeline": pipeline,
            "skipped": skipped,
            "skipped_count": len(skipped),
            "buffers": buffers,
            "workers": workers,
        }

    def stats_table(self) -> str:
        """Return the current (or last) pass's per-stage figures as a text table."""
        return self._pipeline.stats_table() if self._pipeline is not None else ""

    # -- iteration ----------------------------------------------------------------------

    def _positions(self, epoch: int) -> Iterator[int]:
        """Dataset indices this rank reads in ``epoch``, from the resume point on."""
        per_pass = self.batches_per_pass
        if per_pass == 0:
            return
        if self.batches_per_epoch is None:
            first, count = epoch * per_pass, per_pass
        else:
            first, count = epoch * self.batches_per_epoch, self.batches_per_epoch
        first += self._resume_batches
        count -= self._resume_batches
        for g in range(first, first + count):  # g: a global batch number of this rank
            data_epoch, b = divmod(g, per_pass)
            perm = _core.Permutation(
                len(self.dataset), seed=self.seed, epoch=data_epoch, shuffle=self.shuffle
            )
            start = b * self._batch
            stop = min(start + self._batch, self.samples_per_rank)
            # Rank r takes positions r, r + W, r + 2W, ... of the epoch's order.
            w, r = self.world_size, self.rank
            yield from perm.take(r + start * w, r + stop * w, w)

    def _batch_sizes(self, epoch: int) -> Iterator[int]:
        per_pass = self.batches_per_pass
        if per_pass == 0:
            return
        first = (epoch * (self.batches_per_epoch or per_pass)) + self._resume_batches
        for g in range(first, first + len(self) - self._resume_batches):
            b = g % per_pass
            yield min(self._batch, self.samples_per_rank - b * self._batch)

    def _load(self, index: int, *, enforce: bool = True) -> Any:
        transform = self.transform
        assert not isinstance(transform, _core.NativeOp)  # the native chain has no _load
        loading = self._loading
        loading[index] = time.monotonic()
        try:
            sample = self.dataset[index]
            return transform(sample) if transform is not None else sample
        except Exception as e:
            if self.on_error == "raise":
                e.add_note(f"while loading sample {index} of the dataset")
                raise
            reason = f"{type(e).__name__}: {e}"
            self._record_skip(index, reason, enforce=enforce)
            return _Skipped(index, reason)
        finally:
            loading.pop(index, None)

    def _load_tagged(self, item: Any) -> Any:
        """``(index, sample)`` for the grouper that notices samples lost to a timeout.

        The end-of-epoch marker passes through; the failure budget is enforced by the
        grouper, since this stage skips what fails in it.
        """
        if item is _END:
            return item
        return item, self._load(item, enforce=False)

    def _timed_out(self, index: int) -> _Skipped:
        """Record sample ``index``, whose load ran past ``timeout``, as skipped."""
        reason = (
            f"TimeoutError: loading it took longer than timeout={self.timeout} s (its "
            "thread is left behind)"
        )
        self._record_skip(index, reason)
        return _Skipped(index, reason)

    def _record_skip(self, index: int, reason: str, *, enforce: bool = True) -> None:
        """Note a sample skipped under ``on_error="skip"``; raise past ``max_failures``.

        ``enforce=False`` only records it (where raising would be skipped too: a stage
        under ``on_error="skip"``); `_enforce_budget` raises later, downstream.
        """
        _log.warning("skipped sample %d: %s", index, reason)
        with self._skipped_lock:
            self._skipped.append((index, reason))
            self._failures += 1
        if enforce:
            self._enforce_budget(index, reason)

    def _enforce_budget(self, index: int, reason: str) -> None:
        """Raise `TooManyFailuresError` when the epoch's skips are past ``max_failures``."""
        with self._skipped_lock:
            failures = self._failures
        if self.max_failures is not None and failures > self.max_failures:
            raise TooManyFailuresError(
                f"{failures} samples failed in this epoch, more than max_failures="
                f"{self.max_failures} (the last: sample {index}: {reason}); see "
                "loader.stats()['skipped'], or raise max_failures (None: no limit)"
            )

    def _batches(self, epoch: int) -> Iterator[Any]:
        """Yield the epoch's batches from the resume point.

        A batch whose every sample was skipped comes out as `_EMPTY`: it still counts as
        a position, so resuming stays exact.
        """
        if self.native:
            yield from self._native_batches(epoch)
            return
        if self.num_workers > 0:
            yield from self._worker_batches(epoch)
            return
        collate, output, device = self.collate, self.output, self.device
        assert callable(collate)
        assert not isinstance(collate, _core.NativeOp)

        def finish(samples: list[Any]) -> Any:
            kept = [s for s in samples if not isinstance(s, _Skipped)]
            return _convert(collate(kept), output, device) if kept else _EMPTY

        # Grouping and collating in one stage: what waits between stages is samples, not
        # batches, so the read-ahead stays a few samples plus `prefetch` batches.
        source: Iterator[Any] = self._positions(epoch)
        load: Callable[[Any], Any] = self._load
        group: Callable[[Any], Any] = _Grouper(self._batch_sizes(epoch), finish)
        skip_timeouts = self.timeout is not None and self.on_error == "skip"
        if skip_timeouts:
            # A sample whose load times out is skipped by the stage and never comes out:
            # the grouper knows the order samples come in and counts the missing ones
            # (those at the end of the epoch when the marker after them arrives).
            gaps = _GapGrouper(
                self._positions(epoch),
                self._batch_sizes(epoch),
                finish,
                self._timed_out,
                self._enforce_budget,
            )
            source = itertools.chain(source, [_END])
            load, group = self._load_tagged, gaps.feed
        pipeline = (
            PipelineBuilder()
            .add_source(source)
            .pipe(
                load,
                concurrency=self.num_threads,
                name="load",
                timeout=self.timeout,
                on_error="skip" if skip_timeouts else "raise",
            )
            .pipe(group, name="collate")
            .add_sink(self.prefetch)
            .build()
        )
        self._pipeline = pipeline
        self._loading.clear()
        with pipeline.auto_stop():
            try:
                yield from pipeline
            except PipelineError as group:
                error = _first_error(group)
                if isinstance(error, TimeoutError) and self.timeout is not None:
                    self._name_stuck_samples(error, self.timeout)
                raise error from None

    def _name_stuck_samples(self, error: TimeoutError, timeout: float) -> None:
        """Add a note naming the samples whose load ran past ``timeout`` (threads)."""
        now = time.monotonic()
        stuck = sorted(i for i, t in list(self._loading.items()) if now - t >= timeout)
        if stuck:
            error.add_note(
                f"while loading sample{'s' if len(stuck) > 1 else ''} "
                f"{', '.join(map(str, stuck))} of the dataset (a stuck thread is left "
                "behind: it cannot be interrupted; the loader does not wait for it)"
            )

    def _worker_pool(self) -> WorkerPool:
        """The running worker processes (started now unless persistent ones are alive)."""
        pool = self._workers
        if pool is not None and pool.alive():
            return pool
        if pool is not None:
            pool.shutdown(force=True)
        collate = self.collate
        assert callable(collate)
        assert not isinstance(collate, _core.NativeOp)
        assert not isinstance(self.transform, _core.NativeOp)
        setup = _Setup(
            dataset=self.dataset,
            transform=self.transform,
            collate=collate,
            skip=self.on_error == "skip",
            seed=self.seed,
            num_workers=self.num_workers,
            worker_init_fn=self.worker_init_fn,
            parent_pid=os.getpid(),
            start_method=self.worker_start_method,
            seeded_modules=seeded_modules(),
        )
        self._workers = WorkerPool(
            setup, self.num_workers, self.prefetch_factor, pin_memory=self._wants_pinned()
        )
        return self._workers

    def _worker_batches(self, epoch: int) -> Iterator[Any]:
        """`_batches` on worker processes (``num_workers > 0``)."""
        pool = self._worker_pool()
        positions = self._positions(epoch)
        groups = (list(itertools.islice(positions, n)) for n in self._batch_sizes(epoch))
        output, device = self.output, self.device
        keep = clean = False
        try:
            for loaded in worker_batches(pool, epoch, groups, self.timeout):
                for index, reason in loaded.skipped:
                    self._record_skip(index, reason)
                if loaded.empty:
                    yield _EMPTY
                else:
                    yield _convert(loaded.batch, output, device)
            keep = self.persistent_workers
            clean = True
        except GeneratorExit:
            # The consumer left early: persistent workers stay (what they still hold for
            # this iteration is dropped when it comes back).
            keep = self.persistent_workers
            raise
        except (WorkerError, KeyboardInterrupt):
            # A worker died or stalled, or Ctrl-C: end them all, at once.
            keep = False
            raise
        except Exception:
            # The user's exception from a worker: the workers themselves are fine.
            keep = self.persistent_workers
            raise
        finally:
            if not keep:
                self._workers = None
                pool.shutdown(force=not clean)

    def shutdown_workers(self) -> None:
        """End the worker processes now, persistent ones included.

        The next epoch starts new ones. This also happens when the loader is garbage
        collected, and at interpreter exit.
        """
        pool, self._workers = self._workers, None
        if pool is not None:
            pool.shutdown()

    def _native_batches(self, epoch: int) -> Iterator[Any]:
        """`_batches` for image files, through the native batch op.

        Each batch's files go to it as one list; it decodes them in parallel into one
        pooled buffer.
        """
        dataset = self.dataset
        # The dataset indices of the batches sent and not yet received (source order is
        # kept, so they come back in the order they went out).
        pending: collections.deque[list[int]] = collections.deque()

        def groups() -> Iterator[list[Any]]:
            positions = self._positions(epoch)
            for size in self._batch_sizes(epoch):
                indices = list(itertools.islice(positions, size))
                pending.append(indices)
                # A [path, label] list (as JSON gives pairs) as the pair it stands for.
                yield [_as_pair(dataset[i]) for i in indices]

        at_once = _batches_in_flight(self.num_threads, self._batch, _core._cpu_pool_size())
        pipeline = (
            PipelineBuilder()
            .add_source(groups())
            .pipe(
                self._batch_op(epoch),
                concurrency=at_once,
                name="decode_batch",
                timeout=self.timeout,
            )
            .add_sink(self.prefetch)
            # The batch op is a blocking native call: as many at once as the stage runs.
            .build(num_threads=at_once)
        )
        self._pipeline = pipeline
        output, device = self.output, self.device
        with pipeline.auto_stop():
            try:
                yield from self._native_results(pipeline, pending, output, device)
            except PipelineError as group:
                raise _first_error(group) from None

    def _native_results(
        self,
        pipeline: _core.Pipeline,
        pending: collections.deque[list[int]],
        output: Output,
        device: str | None,
    ) -> Iterator[Any]:
        """The native op's results as batches (a method, so errors can be unwrapped)."""
        for images, labels, skipped in pipeline:
            indices = pending.popleft()
            for position, reason in skipped:
                self._record_skip(indices[position], reason)
            if images is None:
                yield _EMPTY
                continue
            batch = _from_tensor(images, output, device)
            yield batch if labels is None else (batch, _from_tensor(labels, output, device))

    def __iter__(self) -> Iterator[Any]:
        epoch = self._epoch
        self._batches_done = self._resume_batches
        todo = len(self) - self._resume_batches
        bar = _Progress(todo, f"epoch {epoch}") if self.progress else None
        finished = False
        self._failures = 0
        yielded = 0
        try:
            for batch in self._batches(epoch):
                self._batches_done += 1
                if bar is not None:
                    bar.update()
                if batch is not _EMPTY:
                    yielded += 1
                    yield batch
            if todo > 0 and yielded == 0 and self._failures > 0:
                raise TooManyFailuresError(
                    f"every sample of epoch {epoch} failed ({self._failures} skipped); see "
                    "loader.stats()['skipped']"
                )
            finished = True
        finally:
            if bar is not None:
                bar.close()
            if finished:
                # A complete epoch: the next iteration starts the next one.
                self._epoch = epoch + 1
                self._resume_batches = self._batches_done = 0
            else:
                # Left early (break, an error): the next iteration resumes here,
                # as `state_dict` says.
                self._resume_batches = self._batches_done

    def epoch_batches(self, epoch: int) -> Iterator[Any]:
        """The batches of ``epoch`` (from its start), without changing the loader's state."""
        saved = (self._epoch, self._resume_batches, self._batches_done)
        self._resume_batches = 0
        self._failures = 0
        try:
            yield from (b for b in self._batches(epoch) if b is not _EMPTY)
        finally:
            self._epoch, self._resume_batches, self._batches_done = saved


class _Grouper:
    """Groups samples into batches of the sizes given and finishes each batch.

    A stage of concurrency 1 in an ordered pipeline sees samples in order, so counting
    them is enough; returning ``None`` until a batch is full drops nothing else.
    """

    def __init__(self, sizes: Iterator[int], finish: Callable[[list[Any]], Any]) -> None:
        self._sizes = sizes
        self._finish = finish
        self._want = next(sizes, 0)
        self._group: list[Any] = []

    def __call__(self, sample: Any) -> Any:
        self._group.append(sample)
        if len(self._group) < self._want:
            return None
        group, self._group = self._group, []
        self._want = next(self._sizes, 0)
        return self._finish(group)


class _GapGrouper:
    """`_Grouper` for a load stage that skips what times out: it notices the lost samples.

    Samples arrive as ``(index, sample)`` in the order of ``positions``; an index that is
    passed over was lost to a timeout, and ``lost(index)`` stands in for it (it records the
    skip, and raises past the failure budget). `_END` after the last sample makes the ones
    still missing lost. `feed` is a generator (a flat map): one sample may finish several
    batches when the samples before it were lost.
    """

    def __init__(
        self,
        positions: Iterator[int],
        sizes: Iterator[int],
        finish: Callable[[list[Any]], Any],
        lost: Callable[[int], _Skipped],
        budget: Callable[[int, str], None],
    ) -> None:
        self._positions = positions
        self._sizes = sizes
        self._finish = finish
        self._lost = lost
        self._budget = budget
        self._want = next(sizes, 0)
        self._group: list[Any] = []

    def feed(self, item: Any) -> Iterator[Any]:
        if item is _END:
            for missing in self._positions:
                yield from self._add(self._lost(missing))
            return
        index, sample = item
        for expected in self._positions:
            if expected == index:
                break
            yield from self._add(self._lost(expected))
        if isinstance(sample, _Skipped):
            self._budget(sample.index, sample.reason)
        yield from self._add(sample)

    def _add(self, sample: Any) -> Iterator[Any]:
        self._group.append(sample)
        if len(self._group) >= self._want:
            group, self._group = self._group, []
            self._want = next(self._sizes, 0)
            yield self._finish(group)


def _batches_in_flight(num_threads: int, batch: int, pool: int) -> int:
    """How many batches the native path decodes at once.

    Each batch decodes on up to ``num_threads`` threads, as jobs of the process's CPU pool
    of ``pool`` threads, first come first served; with batches smaller than that, several
    batches decode at once (``num_threads // batch``). When one batch would be in flight,
    two are, so that the threads done with one batch's last images go on with the next at
    once instead of waiting for the batch's slowest image; but only where the pool itself
    keeps the threads at work within ``num_threads`` (``pool <= num_threads``: two
    batches' jobs can then not run on more threads than that). With one thread, a batch
    decodes on the calling thread: one at a time.
    """
    at_once = num_threads // min(num_threads, batch)
    if at_once == 1 and num_threads > 1 and pool <= num_threads:
        return 2
    return at_once


def _single(samples: list[Any]) -> Any:
    """The "collate" of ``batch_size=None``: the one sample, as it is."""
    return samples[0]


def _first_error(group: PipelineError) -> BaseException:
    """The user's own exception inside the pipeline's group (the first, when several)."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        others = len(exc.exceptions) - 1
        exc = exc.exceptions[0]
        if others:
            exc.add_note(f"({others} more samples failed at the same time)")
    return exc


def _as_pair(sample: Any) -> Any:
    return tuple(sample) if isinstance(sample, list) else sample


def _default_image_transform() -> _core.NativeOp:
    """Return the native transform of image files when none is given.

    ImageNet's evaluation preprocessing: the shorter side to 256, a center crop of 224.
    """
    from . import ops

    return ops.decode_image(resize_shorter=256, crop=224)


def _from_tensor(tensor: _core.Tensor, output: Output, device: str | None) -> Any:
    """A batch tensor of the native chain as ``output`` wants it, without a copy."""
    if output == "numpy":
        return tensor.numpy()
    if output == "torch":
        from .torch import to_torch

        return to_torch(tensor, device=device)
    from .jax import to_jax

    array = to_jax(tensor)
    if device is None:
        return array
    import jax

    return jax.device_put(array, jax.devices(device)[0])


def _check_device(output: Output, device: str) -> None:
    if output == "numpy":
        raise ValueError("device= needs output='torch' or output='jax'")
    if output == "torch":
        import torch

        dev = torch.device(device)
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError(f"device={device!r}: no CUDA device is available to PyTorch")
            count = torch.cuda.device_count()
            if dev.index is not None and dev.index >= count:
                raise ValueError(
                    f"device={device!r}: PyTorch sees {count} CUDA device(s), "
                    f"cuda:0 to cuda:{count - 1}"
                )
        return
    import jax

    try:
        jax.devices(device)
    except RuntimeError as e:
        raise ValueError(f"device={device!r}: JAX has no such backend ({e})") from None
