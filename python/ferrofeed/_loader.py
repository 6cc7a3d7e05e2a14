"""`DataLoader`: batches from a dataset, shuffled, sharded and resumable.

The loader keeps what every kind of data shares: the argument checks (`Config`), the
position (epoch, batches done), iteration, the failure budget (`ferrofeed._failures`) and
the handoff to the framework (`ferrofeed._output.Handoff`: conversion, device placement and
prefetch). Its source (`ferrofeed._sources`: one class per kind,
chosen once) gives each epoch's groups and the executor (`ferrofeed._executors`) that turns
them into batches. The loader never asks which kind of source it holds.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal

from . import _core
from ._config import Arguments, Config, StartMethod
from ._failures import Failures
from ._mix import Mix
from ._output import Output, Progress, Sharding
from ._shards import ShardedSource
from ._source import History
from ._sources import MapDataset, choose_source

__all__ = ["DataLoader"]

# Stands for a batch whose every sample was skipped.
_EMPTY = object()


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
        sharding: with ``output="jax"``, a `jax.sharding.Sharding`: each array of a batch
            is one global `jax.Array` laid out by it, ``batch_size x jax.process_count()``
            rows, each process's own on its devices (see `ferrofeed.jax.shard_batch`).
        device_prefetch: with ``sharding``, batches laid out ahead of the one the step
            holds (not done for `state_dict` until handed out).
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
    at a time, never per sample; `ShardedSource` gives the rule of their order over epochs
    and ranks, and how they resume (on another world size too).

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
        source: MapDataset | Iterable[Any] | ShardedSource | Mix | str | os.PathLike[str],
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
        sharding: Sharding | None = None,
        device_prefetch: int = 2,
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
        args = Arguments(
            batch_size=batch_size,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            transform=transform,
            collate=collate,
            num_threads=num_threads,
            prefetch=prefetch,
            rank=rank,
            world_size=world_size,
            batches_per_epoch=batches_per_epoch,
            output=output,
            device=device,
            sharding=sharding,
            device_prefetch=device_prefetch,
            on_error=on_error,
            max_failures=max_failures,
            progress=progress,
            num_workers=num_workers,
            worker_start_method=worker_start_method,
            persistent_workers=persistent_workers,
            worker_init_fn=worker_init_fn,
            prefetch_factor=prefetch_factor,
            timeout=timeout,
            shuffle_window=shuffle_window,
            image=image,
            label=label,
            bucket_by=bucket_by,
            batch_sampler=batch_sampler,
        )
        # The kind of source first: it refuses the arguments it cannot take.
        build = choose_source(source, args)
        c = Config.check(args)
        self.rank, self.world_size, self.batch_size = c.rank, c.world_size, c.batch_size
        self.shuffle, self.seed, self.drop_last = c.shuffle, c.seed, c.drop_last
        self.num_threads, self.num_workers, self.prefetch = c.num_threads, c.num_workers, c.prefetch
        self.timeout, self.max_failures, self.progress = c.timeout, c.max_failures, c.progress
        self.output, self.device, self.on_error = c.output, c.device, c.on_error
        self.sharding, self.device_prefetch = c.sharding, c.device_prefetch
        self._handoff = c.handoff()
        self.worker_start_method, self.worker_init_fn = c.worker_start_method, c.worker_init_fn
        self.persistent_workers, self.prefetch_factor = c.persistent_workers, c.prefetch_factor
        self.batches_per_epoch, self.batch_sampler = c.batches_per_epoch, c.batch_sampler
        self.shuffle_window, self.bucket_by = c.shuffle_window, c.bucket_by
        self._epoch = self._resume_batches = self._batches_done = 0
        # The current epoch's elastic history, (world_size, batches_done) of each world it
        # ran on before (a sharded source's state loaded on another world size).
        self._history: History = []
        self._failures = Failures(c.max_failures)
        src = self._source = build(c)
        self.dataset: Any = src.dataset
        # A sharded source, an iterable dataset; the native image chain reads image files.
        self.sharded, self.iterable, self.native = src.sharded, src.iterable, src.native
        self.transform, self.collate = src.transform, src.collate
        self._executor = src.executor()

    # -- sizes ---------------------------------------------------------------------

    @property
    def samples_per_rank(self) -> int:
        """Samples each rank reads per pass over the data (after padding or dropping)."""
        return self._source.samples_per_rank(self._epoch, self._history)

    @property
    def batches_per_pass(self) -> int:
        """Batches each rank yields per pass over the data."""
        return self._source.batches_per_pass(self._epoch, self._history)

    def __len__(self) -> int:
        """Batches per epoch for this rank (0 when its shard cannot fill one).

        For a sharded source resumed on another world size (see `load_state_dict`), the
        batches of this world's part of the epoch. With a ``batch_sampler``, its length
        (`TypeError` when it has none).

        For an iterable dataset, as PyTorch counts: from ``len(dataset)`` (`TypeError`
        without it); workers that each read a part may make a few more.
        """
        return self._source.batches(self._epoch, self._history)

    # -- epochs and state -------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Start the next iteration at the beginning of ``epoch``."""
        self._epoch, self._resume_batches, self._history = epoch, 0, []

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
        state.update(self._source.state(self._history))
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
        for key in keys + self._source.checked_keys():
            if state[key] != mine[key]:
                raise ValueError(
                    f"the state was saved with {key}={state[key]!r}, this loader has "
                    f"{key}={mine[key]!r}"
                )
        epoch, done = state["epoch"], state["batches_done"]
        for key, value in (("epoch", epoch), ("batches_done", done)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"the state's {key} must be an int >= 0, not {value!r}")
        done, history = self._source.resume(state, epoch, done)
        self._epoch, self._history = epoch, history
        self._resume_batches = self._batches_done = done

    def stats(self) -> dict[str, Any]:
        """Return the pipeline's figures and the samples skipped so far.

        ``pipeline``: the current (or last) pass's per-stage figures; ``skipped``: the
        samples left out under ``on_error="skip"``, as (index, reason), and
        ``skipped_shards`` the damaged shards read only up to the damage, as (shard, reason)
        (see `ShardedSource.damaged`); ``sources``: with a `Mix`, each source's ``weight``,
        ``samples`` given this rank in the current epoch so far and samples ``skipped``,
        else empty; ``buffers``: the batch buffer pool's counters with the native image
        chain (see `BufferPool.stats`), else empty. ``pools``: with the native image chain,
        ``pools["decode"]``, the threads that decode its batches over the current (or last)
        pass: ``threads``, ``wall_s`` (the pass so far), ``busy_s`` and ``idle_s`` (thread
        seconds spent decoding and not: ``threads x wall_s`` in all), ``busy`` (the busy
        share, 0 to 1: below 1, the threads waited, for the source, a batch hand-over or the
        consumer), ``batches`` decoded, ``in_flight`` now and ``max_in_flight`` so far, and
        the bound, ``batches_in_flight`` (``images_in_flight`` images), which the thread
        count sets; else empty. With shards in object storage, ``remote``: since the loader
        was made, in this process, ``requests`` sent, ``retries`` (requests that failed and
        were retried, or resumed), ``bytes`` received, shards ``fetched`` from the store and
        found in the cache (``cache_hits``), and ``wait_s``, the time the reader waited for
        a shard's bytes.
        """
        skipped = self._failures.skipped()
        pipeline = self._executor.pipeline
        source = self._source.stats(self._epoch, self._history, self._batches_done, skipped)
        return {
            "pipeline": pipeline.stats() if pipeline is not None else {},
            **source,
            "skipped": skipped,
            "skipped_count": len(skipped),
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

    def _batches(self, epoch: int, start: int) -> Iterator[Any]:
        """Yield the batches of ``epoch`` from its batch ``start``, ready for the consumer.

        A batch whose every sample was skipped comes out as `_EMPTY`: it still counts as
        a position, so resuming stays exact.
        """
        # The elastic history is the current epoch's alone.
        history = self._history if epoch == self._epoch else []
        groups = self._source.groups(epoch, start, history)
        expected = start
        for done in self._executor.run(epoch, start, groups):
            if done.batch_no != expected:
                raise RuntimeError(
                    f"the executor gave batch {done.batch_no} where batch {expected} was due"
                )
            expected += 1
            for index, reason in done.skipped:
                self._failures.record(index, reason)
            yield _EMPTY if done.batch is None else self._handoff.convert(done.batch)

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
        todo = len(self) - self._resume_batches if self._source.sized() else None
        bar = Progress(todo, f"epoch {epoch}") if self.progress else None
        finished = False
        self._failures.new_epoch()
        yielded = 0
        try:
            for batch in self._handoff.ahead(self._batches(epoch, self._resume_batches)):
                self._batches_done += 1
                if bar is not None:
                    bar.update()
                if batch is not _EMPTY:
                    yielded += 1
                    yield batch
            self._failures.check_epoch(epoch, todo, yielded)
            finished = True
        finally:
            if bar is not None:
                bar.close()
            if finished:
                # A complete epoch: the next iteration starts the next one.
                self._epoch, self._history = epoch + 1, []
                self._resume_batches = self._batches_done = 0
            else:
                # Left early (break, an error): the next iteration resumes here,
                # as `state_dict` says.
                self._resume_batches = self._batches_done

    def epoch_batches(self, epoch: int) -> Iterator[Any]:
        """The batches of ``epoch`` (from its start), without changing the loader's state."""
        self._failures.new_epoch()
        yield from (b for b in self._handoff.ahead(self._batches(epoch, 0)) if b is not _EMPTY)
