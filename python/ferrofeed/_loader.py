"""`DataLoader`: batches from a map-style dataset, shuffled, sharded and resumable.

One batch's way: `DataLoader.__iter__` makes the epoch's plan in the core
(`_core.EpochPlan`: numbered groups of dataset indices for this rank, from the resume
point); an executor (`ferrofeed._executors`: threads, worker processes or the native image
chain) turns each group into a `Done` (the batch with its number, indices and skipped
samples); the loader counts skips against the budget, converts the batch for the framework
(`ferrofeed._output`) and yields it.
"""

from __future__ import annotations

import importlib
import logging
import operator
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, Protocol

from . import _core
from ._collate import default_collate
from ._errors import TooManyFailuresError
from ._executors import (
    Executor,
    NativeExecutor,
    StreamWorkerExecutor,
    ThreadExecutor,
    WorkerExecutor,
)
from ._images import ImageFiles, ImageFolder
from ._iterable import StreamPlan, StreamSpec, batches_in, check_arguments, is_iterable_dataset
from ._output import Output, Progress, check_device, convert, default_rank_and_world
from ._shards import ShardedSource
from ._workers import _Setup

__all__ = ["DataLoader"]

StartMethod = Literal["fork", "spawn", "forkserver"]

_log = logging.getLogger("ferrofeed.loader")


class MapDataset(Protocol):
    """What `DataLoader` reads: ``len(ds)`` and ``ds[i]`` (a torch Dataset qualifies)."""

    def __len__(self) -> int: ...
    def __getitem__(self, index: int, /) -> Any: ...


# Stands for a batch whose every sample was skipped.
_EMPTY = object()

# Samples held for shuffling a sharded source when shuffle_window is not given.
DEFAULT_SHUFFLE_WINDOW = 2048
# The fields a sharded source's image comes from on the native chain by default.
DEFAULT_IMAGE_FIELDS = ("jpg", "jpeg", "png", "webp")


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
    `ops.collate` that says otherwise.

    Iterable datasets: a source with ``__iter__`` and no ``__getitem__`` (a
    ``torch.utils.data.IterableDataset`` too) is read as PyTorch reads it. With
    ``num_workers=0`` it is iterated once per epoch in this process and its samples are
    transformed on ``num_threads`` threads (the same batches whatever ``num_threads``);
    with ``num_workers=N`` each worker iterates its own copy and makes batches of its own
    stream (`get_worker_info` tells it which part to read: a dataset that does not split
    is read whole by every worker), taken from the workers in turn, in PyTorch's order.
    ``rank`` and ``world_size`` are the dataset's business too. ``shuffle=True`` needs
    ``shuffle_window=``: samples are shuffled through a buffer of that many, seeded from
    ``(seed, epoch)`` and the worker. A sample's index (for its random draws and in
    `stats`) is its position in its stream, ``position * num_workers + worker`` with
    workers: the draws depend on ``num_workers``, as in PyTorch. ``len(loader)`` comes
    from ``len(dataset)`` (`TypeError` without it). An error of the dataset's iterator
    ends the epoch, under ``on_error="skip"`` too. `load_state_dict` resumes by replaying
    the epoch's stream up to where it stopped (see there).

    Randomness, one rule for every path: each random draw of a sample comes from
    ``(seed, epoch, the sample's dataset index)``. Native random crops and flips do; so does
    ``ferrofeed.io.decode_image(..., crop="random", flip="random")`` called without
    ``seed=`` in a Python ``transform`` or ``dataset[i]`` (it gives exactly the native
    chain's crop and flip for that sample), and `ferrofeed.sample_rng` (a NumPy generator
    seeded for the sample, on any number of threads or workers). Where one thread loads at
    a time (worker processes, or ``num_threads=1``), Python's ``random``, NumPy's global
    generator and torch's are seeded per sample too, so one thread gives the batches any
    number of workers gives; several threads share one process's global generators, which
    then cannot be per sample: use `sample_rng` there. The draws are the same in every
    run, with any number of threads or workers, and wherever the files are mounted.

    Args:
        source: a map-style dataset: ``len(ds)`` and ``ds[i]`` (a ``torch.utils.data.Dataset``
            works unchanged, and so does a `SharedList` or a list); an iterable dataset;
            or images, as above.
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
            random draws as with any other number of workers (or one thread): each
            sample's ``random``, ``numpy.random`` and torch generators are seeded from
            ``(seed, epoch, index)``.
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
        shuffle_window: a sharded source's samples held for shuffling (default 2048; rounded
            up to a multiple of ``batch_size``). Memory is bounded by it (about three
            windows: the one being batched, the one read ahead and the end of the one
            before) and the batches in flight. With an
            iterable dataset, the shuffle buffer's samples (needed with ``shuffle=True``).
        image: with a sharded source and ``transform=ops.decode_image(...)``, the field
            holding the encoded image (``"jpg"``), or alternatives, the first a sample has
            taken (``"jpg;png;webp"``; default ``"jpg;jpeg;png;webp"``).
        label: with the native image chain over a sharded source, the integer field of the
            label (``"cls"``); batches are then ``(images, labels)``, else images alone.
        bucket_by: with a sharded source, a key of a sample (e.g. ``lambda s:
            len(s["tokens"])``): each shuffle window is sorted by it and cut into batches,
            which are then shuffled, as AllenNLP's bucket sampler does over
            ``max_instances_in_memory``. The key sees the sample before ``transform``.
        batch_sampler: with a map-style dataset, PyTorch's protocol: an iterable of index
            lists, one per batch (exclusive with ``batch_size``, ``shuffle`` and
            ``drop_last``, as in PyTorch; its ``set_epoch(epoch)`` is called when it has
            one). It decides the batches of every rank: ``world_size`` does not split them.
            `state_dict` resumes by skipping the batches it already gave.

    Sharded sources (`TarShards`, `ParquetShards`, `JsonLines`) are read in order, a window
    at a time, never per sample. The rule (the core's ``ShardPlan``): every epoch permutes
    the shards by ``(seed, epoch)`` and lays them end to end; rank ``r`` takes a contiguous
    range of that stream (``N // world_size`` samples, one more for the first ``N %
    world_size`` ranks), so it reads about its share of the bytes; every rank yields the same
    number of batches, ``ceil(ceil(N / world_size) / batch_size)``, each sample exactly once
    (a rank with a sample less gives one up from its last batches; with ``drop_last``, every
    rank takes ``N // world_size`` samples in full batches); a rank's range is cut into
    windows of ``shuffle_window`` samples, each shuffled and cut into batches. The order
    depends on ``(seed, epoch)``, the shards and the world, never on ``num_threads`` or
    ``num_workers``. `state_dict` resumes exactly, and a state loaded into a loader of
    another world size (rank 0's, in every rank) finishes the epoch with every remaining
    sample exactly once.

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
        source: MapDataset | Iterable[Any] | ShardedSource | str | os.PathLike[str],
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
        shuffle_window: int | None = None,
        image: str | Sequence[str] | None = None,
        label: str | None = None,
        bucket_by: Callable[[Any], Any] | None = None,
        batch_sampler: Iterable[Sequence[int]] | None = None,
    ) -> None:
        if isinstance(source, str | os.PathLike):
            source = ImageFolder(source)
        self.sharded = isinstance(source, ShardedSource)
        # The process's remote counters when this loader was made: stats() reports since then.
        self._remote_base = (
            _core._remote_stats()
            if isinstance(source, ShardedSource) and source._remote is not None
            else None
        )
        # An iterable dataset (as PyTorch's IterableDataset): see ferrofeed._iterable.
        self.iterable = not self.sharded and is_iterable_dataset(source)
        if self.iterable and isinstance(source, Iterator):
            # A generator or another iterator is spent after one pass: every epoch after
            # the first would be silently empty.
            raise TypeError(
                f"source is an iterator ({type(source).__name__}): it can be read once, so "
                "every epoch after the first would be empty; pass an object whose __iter__ "
                "starts a new pass (a class with __iter__, a torch IterableDataset), or a "
                "list"
            )
        if self.iterable:
            check_arguments(
                shuffle=shuffle,
                shuffle_window=shuffle_window,
                batches_per_epoch=batches_per_epoch,
                native=isinstance(transform, _core.NativeOp) or isinstance(collate, _core.NativeOp),
                image=image,
                label=label,
                bucket_by=bucket_by,
                batch_sampler=batch_sampler,
            )
        elif not self.sharded and not (
            hasattr(source, "__len__") and hasattr(source, "__getitem__")
        ):
            raise TypeError(
                "source must be a map-style dataset (len(ds) and ds[i]), an iterable dataset "
                "(__iter__), a sharded source (TarShards, ParquetShards, JsonLines), a "
                "sequence of image paths, or a folder of class subfolders, not "
                f"{type(source).__name__}"
            )
        if shuffle_window is not None and (
            isinstance(shuffle_window, bool)
            or not isinstance(shuffle_window, int)
            or shuffle_window < 1
        ):
            raise ValueError(f"shuffle_window must be an int >= 1, not {shuffle_window!r}")
        if bucket_by is not None and not callable(bucket_by):
            raise TypeError(f"bucket_by must be a function of a sample, not {bucket_by!r}")
        if batch_sampler is not None:
            if self.sharded:
                raise TypeError(
                    "batch_sampler= is for map-style datasets; a sharded source batches its "
                    "shuffle windows (bucket_by= sorts them by a key)"
                )
            if batch_size != 1 or shuffle or drop_last or batches_per_epoch is not None:
                raise ValueError(
                    "batch_sampler is mutually exclusive with batch_size, shuffle, drop_last "
                    "and batches_per_epoch (the sampler decides the batches)"
                )
            if not hasattr(batch_sampler, "__iter__"):
                raise TypeError(
                    f"batch_sampler must be an iterable of index lists, not {batch_sampler!r}"
                )
        if not self.sharded and not self.iterable:
            for name, value in (
                ("shuffle_window", shuffle_window),
                ("image", image),
                ("label", label),
                ("bucket_by", bucket_by),
            ):
                if value is not None:
                    raise TypeError(
                        f"{name}= is for sharded sources (TarShards, ParquetShards, JsonLines)"
                    )
        elif batches_per_epoch is not None:
            raise TypeError(
                "batches_per_epoch does not apply to a sharded source: an epoch is one pass "
                "over its shards"
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
        default_rank, default_world = default_rank_and_world()
        self.rank = default_rank if rank is None else rank
        self.world_size = default_world if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in [0, world_size={self.world_size})")
        if device is not None:
            check_device(output, device)
        self.dataset: Any = source
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
        self.shuffle_window = shuffle_window or DEFAULT_SHUFFLE_WINDOW
        self.bucket_by = bucket_by
        self.batch_sampler = batch_sampler
        self._epoch = 0
        self._resume_batches = 0
        # A sharded source's epoch so far on other worlds: (world_size, batches_done) each
        # (an elastic resume; see load_state_dict).
        self._history: list[tuple[int, int]] = []
        self._batches_done = 0
        self._skipped: list[tuple[int, str]] = []
        self._skipped_lock = threading.Lock()
        self._failures = 0  # samples skipped in the current iteration
        # Damaged shards (see ShardedSource.damaged): refused, or logged once and read up to
        # the damage.
        damaged = source.damaged if isinstance(source, ShardedSource) else []
        if damaged and on_error == "raise":
            damaged[0].add_note("on_error='skip' reads the samples before it and the others")
            raise damaged[0]
        for e in damaged:
            _log.warning("damaged shard, read up to the damage (on_error='skip'): %s", e)
        self._skipped_shards = [(e.shard, str(e)) for e in damaged]
        # The native image chain: image files with a native (or the default) transform.
        self.native = isinstance(transform, _core.NativeOp) or (
            transform is None and isinstance(source, ImageFiles)
        )
        self.image_fields: list[str] = []
        self.label_field = label
        if self.sharded:
            if image is not None and not self.native:
                raise TypeError("image= names the field for transform=ops.decode_image(...)")
            if label is not None and not self.native:
                raise TypeError("label= names the field for transform=ops.decode_image(...)")
            if image is None:
                self.image_fields = list(DEFAULT_IMAGE_FIELDS)
            elif isinstance(image, str):
                self.image_fields = [f for f in image.split(";") if f]
            else:
                self.image_fields = list(image)
            if self.native and not self.image_fields:
                raise ValueError(f"image= names no field: {image!r}")
        self.transform: Callable[[Any], Any] | _core.NativeOp | None
        self.collate: Callable[[list[Any]], Any] | _core.NativeOp | None
        if self.native:
            self.transform = transform if transform is not None else _default_image_transform()
            self.collate = collate
            if batch_size is None:
                raise TypeError("batch_size=None needs a Python transform, not image files")
            if batch_sampler is not None:
                raise TypeError(
                    "batch_sampler= needs a Python transform: the native image chain decodes "
                    "batches of batch_size"
                )
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
        if self.sharded:
            # The plan refuses, now rather than at the first batch, a split it cannot make
            # (batches of 1 over an uneven split, fewer samples than ranks).
            self._plan(0)
        self._executor = self._make_executor()

    def _check_native(self, source: Any, batch_size: int) -> None:
        """Refuse, at construction, what the native image chain cannot run."""
        if isinstance(self.collate, _core.NativeOp):
            if self.collate.group_size is None:
                raise TypeError("collate must be ops.collate(...) or None with image files")
        elif self.collate is not None:
            raise TypeError(
                "with the native image chain, collate is ops.collate(...) or None "
                "(a Python collate needs a Python transform)"
            )
        if not self.sharded and len(source) > 0:
            first = source[0]
            pair = isinstance(first, tuple | list) and len(first) == 2
            path = first[0] if pair else first
            if not isinstance(path, str | os.PathLike):
                raise TypeError(
                    "with a native transform, the source's items are image paths or "
                    f"(path, label) pairs, not {type(first).__name__}"
                )

    def _wants_pinned(self) -> bool:
        """Whether batches go to a CUDA device (their host memory is then page-locked)."""
        return self.device is not None and "cuda" in self.device

    def _make_executor(self) -> Executor:
        """The executor that turns this loader's groups into batches."""
        if self.native:
            assert isinstance(self.transform, _core.NativeOp)
            assert self.collate is None or isinstance(self.collate, _core.NativeOp)
            return NativeExecutor(
                self.dataset,
                self.transform,
                self.collate,
                seed=self.seed,
                batch_size=self._batch,
                drop_last=self.drop_last,
                num_threads=self.num_threads,
                skip=self.on_error == "skip",
                prefetch=self.prefetch,
                timeout=self.timeout,
                pinned=self._wants_pinned(),
                fields=(self.image_fields, self.label_field),
            )
        collate = self.collate
        assert callable(collate)
        assert not isinstance(collate, _core.NativeOp)
        transform = self.transform
        assert not isinstance(transform, _core.NativeOp)
        if self.num_workers > 0:
            spec = self._stream_spec() if self.iterable else None
            setup = _Setup(
                dataset=self.dataset,
                transform=transform,
                collate=collate,
                skip=self.on_error == "skip",
                seed=self.seed,
                num_workers=self.num_workers,
                worker_init_fn=self.worker_init_fn,
                parent_pid=os.getpid(),
                start_method=self.worker_start_method,
                stream=spec,
            )
            return (StreamWorkerExecutor if spec is not None else WorkerExecutor)(
                setup,
                num_workers=self.num_workers,
                prefetch_factor=self.prefetch_factor,
                persistent=self.persistent_workers,
                timeout=self.timeout,
                pin_memory=self._wants_pinned(),
            )
        # (An iterable dataset's groups carry their samples: threads run them as any.)
        return ThreadExecutor(
            self.dataset,
            transform,
            collate,
            seed=self.seed,
            num_threads=self.num_threads,
            prefetch=self.prefetch,
            timeout=self.timeout,
            skip=self.on_error == "skip",
        )

    def _stream_spec(self) -> StreamSpec:
        """How an iterable dataset's stream becomes batches."""
        window = self.shuffle_window if self.shuffle else None
        return StreamSpec(self._batch, self.drop_last, window, self.seed)

    def _shard_plan(self, epoch: int) -> _core.ShardPlan:
        """A sharded source's plan of ``epoch`` from its start."""
        plan = self._plan(epoch)
        assert isinstance(plan, _core.ShardPlan)
        return plan

    def _plan(self, epoch: int, start: int = 0) -> _core.EpochPlan | _core.ShardPlan | _SamplerPlan:
        """The core's plan of ``epoch`` for this rank, from its batch ``start``."""
        if self.batch_sampler is not None:
            return _SamplerPlan(self.batch_sampler, epoch, start)
        if isinstance(self.dataset, ShardedSource):
            return _core.ShardPlan(
                self.dataset._counts,
                self._batch,
                shuffle=self.shuffle,
                seed=self.seed,
                epoch=epoch,
                rank=self.rank,
                world_size=self.world_size,
                drop_last=self.drop_last,
                window=self.shuffle_window,
                # The elastic history is the current epoch's alone.
                history=self._history if epoch == self._epoch else [],
                start=start,
            )
        return _core.EpochPlan(
            len(self.dataset),
            self._batch,
            shuffle=self.shuffle,
            seed=self.seed,
            epoch=epoch,
            rank=self.rank,
            world_size=self.world_size,
            drop_last=self.drop_last,
            batches_per_epoch=self.batches_per_epoch,
            start=start,
        )

    # -- sizes ---------------------------------------------------------------------

    @property
    def samples_per_rank(self) -> int:
        """Samples each rank reads per pass over the data (after padding or dropping)."""
        if self.iterable:
            return len(self.dataset)  # TypeError without __len__, as PyTorch's
        plan = self._plan(self._epoch)
        if isinstance(plan, _SamplerPlan):
            return len(self.dataset)
        return plan.samples if isinstance(plan, _core.ShardPlan) else plan.samples_per_rank

    @property
    def batches_per_pass(self) -> int:
        """Batches each rank yields per pass over the data."""
        if self.iterable:
            return len(self)
        plan = self._plan(self._epoch)
        if isinstance(plan, _SamplerPlan | _core.ShardPlan):
            return len(plan)
        return plan.batches_per_pass

    def __len__(self) -> int:
        """Batches per epoch for this rank (0 when its shard cannot fill one).

        For a sharded source resumed on another world size (see `load_state_dict`), the
        batches of this world's part of the epoch. With a ``batch_sampler``, its length
        (`TypeError` when it has none).

        For an iterable dataset, as PyTorch counts: from ``len(dataset)`` (`TypeError`
        without it); workers that each read a part may make a few more.
        """
        if self.iterable:
            return batches_in(self.dataset, self._batch, self.drop_last)
        return len(self._plan(self._epoch))

    # -- epochs and state -------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Start the next iteration at the beginning of ``epoch``."""
        self._epoch = epoch
        self._resume_batches = 0
        self._history = []

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
        state: dict[str, Any] = {
            "version": 1,
            "epoch": self._epoch,
            "batches_done": self._batches_done,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "rank": self.rank,
            "world_size": self.world_size,
            "dataset_len": len(self.dataset) if hasattr(self.dataset, "__len__") else None,
            "batches_per_epoch": self.batches_per_epoch,
        }
        if self.batch_sampler is not None:
            state["batch_sampler"] = True
        if self.iterable:
            # Its order depends on the workers: each makes batches of its own stream.
            state["num_workers"] = self.num_workers
            state["shuffle_window"] = self.shuffle_window if self.shuffle else None
        if isinstance(self.dataset, ShardedSource):
            state["shard_counts"] = list(self.dataset._counts)
            state["shuffle_window"] = self.shuffle_window
            state["history"] = [list(h) for h in self._history]
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a `state_dict`.

        The next iteration yields exactly the batches the interrupted run would have
        yielded next.

        A sharded source's state may be loaded into a loader of another world size, or
        into any rank (ranks step in lockstep, so rank 0's state is every rank's position):
        the epoch then goes on with every sample its batches so far did not hold, each
        exactly once over the new world (an elastic resume). The worker and thread counts
        never matter.

        An iterable dataset resumes by replaying: the epoch's stream is read again from its
        start and its first ``batches_done`` batches are dropped (their samples are read,
        not transformed). That costs reading them, and is exact only where the order
        reproduces: the same ``seed``, ``shuffle_window`` and ``num_workers`` (checked),
        and a dataset that yields the same samples in the same order again.

        Raises:
            ValueError: the state comes from a loader configured differently.
        """
        if state.get("version") != 1:
            raise ValueError(f"unsupported state version {state.get('version')!r}")
        mine = self.state_dict()
        keys = ["seed", "shuffle", "batch_size", "drop_last", "dataset_len", "batches_per_epoch"]
        if self.sharded:
            keys += ["shard_counts", "shuffle_window"]
        else:
            keys += ["rank", "world_size"]
        if self.iterable:
            keys += ["num_workers", "shuffle_window"]
        for key in keys:
            if state[key] != mine[key]:
                raise ValueError(
                    f"the state was saved with {key}={state[key]!r}, this loader has "
                    f"{key}={mine[key]!r}"
                )
        epoch, done = state["epoch"], state["batches_done"]
        for key, value in (("epoch", epoch), ("batches_done", done)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"the state's {key} must be an int >= 0, not {value!r}")
        if state.get("batch_sampler", False) != (self.batch_sampler is not None):
            raise ValueError(
                "the state was saved with"
                + ("" if state.get("batch_sampler") else "out")
                + " a batch_sampler, this loader has"
                + ("" if self.batch_sampler is not None else " none")
            )
        if self.sharded:
            self._load_shard_state(state, epoch, done)
            return
        # (An iterable dataset's len() is PyTorch's estimate: workers may make more.)
        if not self.iterable and self._sized() and done > len(self):
            raise ValueError(
                f"the state's batches_done={done} is past the end of an epoch of "
                f"{len(self)} batches"
            )
        self._epoch = epoch
        self._resume_batches = done
        self._batches_done = done

    def _load_shard_state(self, state: Mapping[str, Any], epoch: int, done: int) -> None:
        """`load_state_dict` of a sharded source: exact on the same world, elastic else."""
        history = [(int(w), int(d)) for w, d in state.get("history", [])]
        world = state["world_size"]
        if world != self.world_size and done > 0:
            if self.bucket_by is not None:
                raise ValueError(
                    f"the state was saved on {world} ranks, this loader has "
                    f"world_size={self.world_size}: with bucket_by, which samples a window's "
                    "first batches held depends on their keys, so the epoch cannot go on on "
                    "another world; resume on the same world size, or at an epoch's start"
                )
            # The epoch goes on on another world: what this one did becomes history.
            history.append((world, done))
            done = 0
        previous = (self._epoch, self._history, self._resume_batches, self._batches_done)
        self._epoch, self._history = epoch, history
        try:
            # Refuses a history or a position that does not fit the shards.
            self._plan(epoch, done)
        except ValueError as e:
            self._epoch, self._history, self._resume_batches, self._batches_done = previous
            raise ValueError(f"the state does not fit this loader: {e}") from None
        self._resume_batches = self._batches_done = done

    def stats(self) -> dict[str, Any]:
        """Return the pipeline's figures and the samples skipped so far.

        ``pipeline``: the current (or last) pass's per-stage figures; ``skipped``: the
        samples left out under ``on_error="skip"``, as (index, reason), and
        ``skipped_shards`` the damaged shards read only up to the damage, as (shard, reason)
        (see `ShardedSource.damaged`); ``buffers``: the
        batch buffer pool's counters with the native image chain (see
        `BufferPool.stats`), else empty. ``pools``: with the native image chain,
        ``pools["decode"]``, the threads that decode its batches over the current (or last)
        pass: ``threads``, ``wall_s`` (the pass so far), ``busy_s`` and ``idle_s`` (thread
        seconds spent decoding and not: ``threads x wall_s`` in all), ``busy`` (the busy
        share, 0 to 1: below 1, the threads waited, for the source, a batch hand-over or
        the consumer), ``batches`` decoded, ``in_flight`` now and ``max_in_flight`` so far,
        and the bound, ``batches_in_flight`` (``images_in_flight`` images), which the
        thread count sets; else empty. With shards in object storage, ``remote``: since
        the loader was made, in this process, ``requests`` sent, ``retries`` (requests that
        failed and were retried, or resumed), ``bytes`` received, shards ``fetched`` from
        the store and found in the cache (``cache_hits``), and ``wait_s``, the time the
        reader waited for a shard's bytes.
        """
        with self._skipped_lock:
            skipped = list(self._skipped)
        pipeline = self._executor.pipeline
        remote: dict[str, Any] = {}
        if self._remote_base is not None:
            now = _core._remote_stats()
            remote = {k: now[k] - self._remote_base[k] for k in now}
        return {
            "pipeline": pipeline.stats() if pipeline is not None else {},
            "remote": remote,
            "skipped": skipped,
            "skipped_count": len(skipped),
            "skipped_shards": list(self._skipped_shards),
            "buffers": {},
            "pools": {},
            "workers": {},
            **self._executor.stats(),
        }

    def stats_table(self) -> str:
        """Return the current (or last) pass's per-stage figures as a text table."""
        pipeline = self._executor.pipeline
        return pipeline.stats_table() if pipeline is not None else ""

    # -- iteration ----------------------------------------------------------------------

    def _record_skip(self, index: int, reason: str) -> None:
        """Note a sample skipped under ``on_error="skip"``; raise past ``max_failures``."""
        _log.warning("skipped sample %d: %s", index, reason)
        with self._skipped_lock:
            self._skipped.append((index, reason))
            self._failures += 1
            failures = self._failures
        if self.max_failures is not None and failures > self.max_failures:
            raise TooManyFailuresError(
                f"{failures} samples failed in this epoch, more than max_failures="
                f"{self.max_failures} (the last: sample {index}: {reason}); see "
                "loader.stats()['skipped'], or raise max_failures (None: no limit)"
            )

    def _batches(self, epoch: int, start: int) -> Iterator[Any]:
        """Yield the batches of ``epoch`` from its batch ``start``, ready for the consumer.

        A batch whose every sample was skipped comes out as `_EMPTY`: it still counts as
        a position, so resuming stays exact.
        """
        plan: _core.EpochPlan | _core.ShardPlan | _SamplerPlan | StreamPlan
        if self.iterable:
            # A pass over the dataset, replayed up to `start`.
            plan = StreamPlan(self.dataset, self._stream_spec(), epoch, start)
        else:
            plan = self._plan(epoch, start)
        expected = start
        output, device = self.output, self.device
        groups: Iterator[Any]
        if isinstance(plan, _core.ShardPlan):
            assert isinstance(self.dataset, ShardedSource)
            groups = self.dataset._groups(
                plan,
                bucket_by=self.bucket_by,
                seed=self.seed,
                epoch=epoch,
                shuffle=self.shuffle,
                next_plan=lambda: self._shard_plan(epoch + 1),
            )
        else:
            groups = iter(plan)
        for done in self._executor.run(epoch, groups):
            if done.batch_no != expected:
                raise RuntimeError(
                    f"the executor gave batch {done.batch_no} where batch {expected} was due"
                )
            expected += 1
            for index, reason in done.skipped:
                self._record_skip(index, reason)
            yield _EMPTY if done.batch is None else convert(done.batch, output, device)

    def _sized(self) -> bool:
        """Whether the epoch's length is known (not without a len() of its sampler or data).

        Unknown with a batch sampler, or an iterable dataset, that has no ``len()``.
        """
        if self.iterable:
            return hasattr(self.dataset, "__len__")
        return self.batch_sampler is None or hasattr(self.batch_sampler, "__len__")

    def shutdown_workers(self) -> None:
        """End the worker processes now, persistent ones included.

        The next epoch starts new ones. This also happens when the loader is garbage
        collected, and at interpreter exit.
        """
        self._executor.shutdown()

    def __iter__(self) -> Iterator[Any]:
        epoch = self._epoch
        self._batches_done = self._resume_batches
        # A batch sampler or an iterable dataset without len(): as many batches as it gives.
        todo = len(self) - self._resume_batches if self._sized() else None
        bar = Progress(todo, f"epoch {epoch}") if self.progress else None
        finished = False
        self._failures = 0
        yielded = 0
        try:
            for batch in self._batches(epoch, self._resume_batches):
                self._batches_done += 1
                if bar is not None:
                    bar.update()
                if batch is not _EMPTY:
                    yielded += 1
                    yield batch
            if (todo is None or todo > 0) and yielded == 0 and self._failures > 0:
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
                self._history = []
            else:
                # Left early (break, an error): the next iteration resumes here,
                # as `state_dict` says.
                self._resume_batches = self._batches_done

    def epoch_batches(self, epoch: int) -> Iterator[Any]:
        """The batches of ``epoch`` (from its start), without changing the loader's state."""
        self._failures = 0
        yield from (b for b in self._batches(epoch, 0) if b is not _EMPTY)


class _SamplerPlan:
    """A batch sampler's batches of an epoch as a plan: ``(batch_no, indices)`` from ``start``.

    Resuming replays the sampler and skips the batches before ``start`` (cheap: they are
    index lists); its ``set_epoch(epoch)`` is called first when it has one.
    """

    def __init__(self, sampler: Iterable[Sequence[int]], epoch: int, start: int) -> None:
        self.sampler = sampler
        self.epoch = epoch
        self.start = start

    def __len__(self) -> int:
        if not hasattr(self.sampler, "__len__"):
            raise TypeError(f"the batch_sampler ({type(self.sampler).__name__}) has no len()")
        return len(self.sampler)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[tuple[int, list[int]]]:
        set_epoch = getattr(self.sampler, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(self.epoch)
        for batch_no, indices in enumerate(self.sampler):
            if batch_no >= self.start:
                yield batch_no, [operator.index(i) for i in indices]


def _single(samples: list[Any]) -> Any:
    """The "collate" of ``batch_size=None``: the one sample, as it is."""
    return samples[0]


def _default_image_transform() -> _core.NativeOp:
    """Return the native transform of image files when none is given.

    ImageNet's evaluation preprocessing: the shorter side to 256, a center crop of 224.
    """
    from . import ops

    return ops.decode_image(resize_shorter=256, crop=224)
