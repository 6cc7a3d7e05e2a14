"""The `DataLoader`'s executors: threads, worker processes and the native image chain.

One contract for all three: `Executor.run` takes an epoch's groups (`Group`: a batch
number, its samples' ids and where they come from) from the loader's source, and yields
one `Done` per group, in order, carrying the group's number and ids with the batch and the
samples skipped. The loader keeps the state (epoch, position), the failure budget, the
progress and the framework handoff; an executor only turns groups into batches, getting
each sample from its group (``group.sample(i)``, ``group.native(skip)``). A new data
source only has to produce groups.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from . import _core
from ._collate import describe_entries
from ._config import Config
from ._errors import PipelineError, WorkerError
from ._group import Group
from ._pipeline import PipelineBuilder
from ._sample import sample_scope
from ._worker_process import _Setup, seeded_modules
from ._workers import Loaded, WorkerPool, stream_batches, worker_batches


@dataclasses.dataclass
class Done:
    """One group of the plan, loaded.

    Attributes:
        batch_no: the group's number in the epoch.
        indices: the dataset indices of its samples, in order.
        batch: the collated batch of the samples that loaded (`_core.Tensor` leaves on the
            native chain), or ``None`` when every sample was skipped.
        skipped: the samples left out under ``on_error="skip"``: ``(index, reason)``.
    """

    batch_no: int
    indices: list[int]
    batch: Any
    skipped: list[tuple[int, str]]


class Executor(Protocol):
    """What turns the groups of an epoch into batches."""

    pipeline: _core.Pipeline | None

    def run(self, epoch: int, start: int, groups: Iterator[Group]) -> Iterator[Done]:
        """Yield a `Done` for each group, in order; errors are raised at their batch.

        ``start`` is the number of the epoch's first group (the resume point).
        """
        ...

    def stats(self) -> dict[str, Any]:
        """Counters of the executor's own resources (buffers, workers), by name."""
        ...

    def shutdown(self) -> None:
        """Release what outlives an epoch (worker processes); idempotent."""
        ...


@dataclasses.dataclass(frozen=True)
class _Skipped:
    """A sample that failed under ``on_error="skip"`` (left out of its batch)."""

    index: int
    reason: str


@dataclasses.dataclass(frozen=True)
class _Task:
    """One sample of a group, on its way through the thread executor's load stage."""

    group: Group
    position: int

    @property
    def index(self) -> int:
        return self.group.ids[self.position]


@dataclasses.dataclass(frozen=True)
class _GroupEnd:
    """Follows a group's samples through the load stage, which passes it on at once.

    It reaches the assembler after every sample of its group that loaded, so the group can
    be closed even when its last samples (or all of them) were lost to a timeout.
    """

    group: Group


def first_error(group: PipelineError) -> BaseException:
    """The user's own exception inside the pipeline's group (the first, when several)."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        others = len(exc.exceptions) - 1
        exc = exc.exceptions[0]
        if others:
            exc.add_note(f"({others} more samples failed at the same time)")
    return exc


def _collate_noting(
    collate: Callable[[list[Any]], Any], samples: list[Any], batch_no: int, indices: list[int]
) -> Any:
    """``collate(samples)``; an error is noted with the batch and its samples' indices.

    ``indices[k]`` is the dataset index of ``samples[k]``.
    """
    try:
        return collate(samples)
    except Exception as e:
        if getattr(e, "entries", None):
            describe_entries(e, indices)  # default_collate's: names the entries it saw
        else:
            e.add_note(f"samples {indices} of the dataset, in this order, were collated")
        e.add_note(f"while collating batch {batch_no} of the epoch")
        raise


class ThreadExecutor:
    """A group's samples and ``transform`` on ``num_threads`` threads, then ``collate``.

    Samples, not batches, wait between the two stages, so the read-ahead stays a few
    samples plus ``prefetch`` batches. Each sample is loaded inside its sample scope (see
    `ferrofeed._sample`); with one thread the global generators are seeded per sample, as
    in a worker process.
    """

    def __init__(
        self,
        transform: Callable[[Any], Any] | None,
        collate: Callable[[list[Any]], Any],
        config: Config,
    ) -> None:
        self.transform = transform
        self.collate = collate
        # Its seed, threads, prefetch, timeout and on_error.
        self.config = config
        self.pipeline: _core.Pipeline | None = None
        # Samples being loaded, with when they started (to name the ones a timeout caught).
        self._loading: dict[int, float] = {}

    def _load(self, task: Any, epoch: int) -> Any:
        if isinstance(task, _GroupEnd):
            return task
        index = task.index
        loading = self._loading
        loading[index] = time.monotonic()
        try:
            with sample_scope(
                self.config.seed, epoch, index, seed_globals=self.config.num_threads == 1
            ):
                sample = task.group.sample(index)
                if self.transform is not None:
                    sample = self.transform(sample)
        except Exception as e:
            if not self.config.skip:
                e.add_note(f"while loading sample {index} of the dataset")
                raise
            sample = _Skipped(index, f"{type(e).__name__}: {e}")
        finally:
            loading.pop(index, None)
        return task, sample

    def run(self, epoch: int, start: int, groups: Iterator[Group]) -> Iterator[Done]:
        def tasks() -> Iterator[Any]:
            for group in groups:
                for position in range(len(group.ids)):
                    yield _Task(group, position)
                yield _GroupEnd(group)

        assembler = _Assembler(self.collate, self._timed_out)
        pipeline = (
            PipelineBuilder()
            .add_source(tasks())
            .pipe(
                lambda task: self._load(task, epoch),
                concurrency=self.config.num_threads,
                name="load",
                timeout=self.config.timeout,
                # A sample whose load times out is dropped by the stage under skip: the
                # assembler notices the gap in the order and records it.
                on_error="skip"
                if self.config.skip and self.config.timeout is not None
                else "raise",
            )
            .pipe(assembler.feed, name="collate")
            .add_sink(self.config.prefetch)
            .build()
        )
        self.pipeline = pipeline
        self._loading.clear()
        with pipeline.auto_stop():
            try:
                yield from pipeline
            except PipelineError as group:
                error = first_error(group)
                if isinstance(error, TimeoutError) and self.config.timeout is not None:
                    self._name_stuck_samples(error, self.config.timeout)
                raise error from None

    def _timed_out(self, index: int) -> _Skipped:
        return _Skipped(
            index,
            f"TimeoutError: loading it took longer than timeout={self.config.timeout} s (its "
            "thread is left behind)",
        )

    def _name_stuck_samples(self, error: TimeoutError, timeout: float) -> None:
        """Add a note naming the samples whose load ran past ``timeout``."""
        now = time.monotonic()
        stuck = sorted(i for i, t in list(self._loading.items()) if now - t >= timeout)
        if stuck:
            error.add_note(
                f"while loading sample{'s' if len(stuck) > 1 else ''} "
                f"{', '.join(map(str, stuck))} of the dataset (a stuck thread is left "
                "behind: it cannot be interrupted; the loader does not wait for it)"
            )

    def stats(self) -> dict[str, Any]:
        return {}

    def shutdown(self) -> None:
        pass


class _Assembler:
    """Puts the loaded samples of each group back together, and collates the group.

    A stage of concurrency 1 in an ordered pipeline: the samples of a group arrive in
    order, then its `_GroupEnd`. A sample that does not arrive was dropped by the load
    stage (a timeout under ``on_error="skip"``): the next sample of its group, or the
    group's end, shows the gap, and ``lost(index)`` stands in for it.
    """

    def __init__(
        self, collate: Callable[[list[Any]], Any], lost: Callable[[int], _Skipped]
    ) -> None:
        self._collate = collate
        self._lost = lost
        self._samples: list[Any] = []  # of the group being filled

    def feed(self, item: Any) -> Done | None:
        if isinstance(item, _GroupEnd):
            return self._close(item.group.batch_no, item.group.ids)
        task, sample = item
        self._fill_lost(task.group.ids, task.position)
        self._samples.append(sample)
        return None

    def _fill_lost(self, indices: list[int], upto: int) -> None:
        samples = self._samples
        while len(samples) < upto:
            samples.append(self._lost(indices[len(samples)]))

    def _close(self, batch_no: int, indices: list[int]) -> Done:
        self._fill_lost(indices, len(indices))
        samples, self._samples = self._samples, []
        skipped = [(s.index, s.reason) for s in samples if isinstance(s, _Skipped)]
        kept = [s for s in samples if not isinstance(s, _Skipped)]
        batch = None
        if kept:
            kept_indices = [
                i for i, s in zip(indices, samples, strict=True) if not isinstance(s, _Skipped)
            ]
            batch = _collate_noting(self._collate, kept, batch_no, kept_indices)
        return Done(batch_no, indices, batch, skipped)


class NativeExecutor:
    """Image files through the native batch op: each group decodes into one pooled buffer.

    The op takes the group's ``_PlanGroup(batch_no, indices, files)`` (`Group.native`:
    files, or a shard window's image bytes and labels) and gives back ``(batch_no, indices,
    images, labels, skipped)``: a batch crosses from Python to Rust once (its files) and
    back once (its tensors). Every sample's random crop and flip come from ``(seed,
    epoch, index)``. The op the user passed is the op that runs: the batch op is built
    from it (and refuses, at construction, the options a loader cannot honour).
    """

    def __init__(
        self, decode: _core.NativeOp, collate: _core.NativeOp | None, config: Config
    ) -> None:
        self.decode = decode
        # Samples left out before the op (a shard's sample unreadable, or without the image
        # or label field), by batch number.
        self._pre_skipped: dict[int, list[tuple[int, str]]] = {}
        self.collate = collate
        # Its seed, batch size, drop_last, threads, on_error, prefetch and timeout.
        self.config = config
        num_threads, prefetch = config.num_threads, config.prefetch
        # The loader's decode threads (the process's pool of num_threads threads, shared
        # by the loaders of that many threads) and their busy and idle time per pass.
        self.lanes = _core._Lanes(num_threads)
        self.concurrency = _batches_in_flight(num_threads, config.batch)
        # No bound on buffers (the pipeline's queues bound the read-ahead, and a consumer
        # may keep batches), a few kept for reuse from batch to batch; page-locked when the
        # batches go to a CUDA device.
        self.pool = _core.BufferPool(
            None,
            max_idle=2 * (prefetch + 4),
            pinned=None if config.pinned else False,
            timeout=None,
        )
        self.pipeline: _core.Pipeline | None = None
        # Built once now, so a transform that is not ops.decode_image(...), one without a
        # fixed output size, or an option of the ops that the loader cannot honour (a seed
        # of their own, another batch size or drop_last) fails at construction rather than
        # at the first batch.
        self._op(0)

    def _op(self, epoch: int) -> _core.NativeOp:
        """The batch op of ``epoch``."""
        return _core._op_load_batch(
            self.decode,
            self.collate,
            seed=self.config.seed,
            epoch=epoch,
            lanes=self.lanes,
            skip=self.config.skip,
            pool=self.pool,
            batch_size=self.config.batch,
            drop_last=self.config.drop_last,
        )

    def run(self, epoch: int, start: int, groups: Iterator[Group]) -> Iterator[Done]:
        def files() -> Iterator[_core._PlanGroup]:
            for group in groups:
                native, skipped = group.native(self.config.skip)
                if skipped:
                    self._pre_skipped[group.batch_no] = skipped
                yield native

        pipeline = (
            PipelineBuilder()
            .add_source(files())
            .pipe(
                self._op(epoch),
                concurrency=self.concurrency,
                name="decode_batch",
                timeout=self.config.timeout,
            )
            .add_sink(self.config.prefetch)
            # The batch op holds no thread while its images decode on the loader's pool:
            # the stage keeps `concurrency` batches in flight, handed over as they finish.
            .build()
        )
        self.pipeline = pipeline
        self._pre_skipped.clear()
        self.lanes.start_pass()
        with pipeline.auto_stop():
            try:
                yield from self._results(pipeline)
            except PipelineError as group:
                raise first_error(group) from None
            finally:
                self.lanes.end_pass()

    def _results(self, pipeline: _core.Pipeline) -> Iterator[Done]:
        """The op's results as `Done` (a method of its own, so errors can be unwrapped)."""
        for batch_no, indices, images, labels, skipped in pipeline:
            batch = None if images is None else images if labels is None else (images, labels)
            before = self._pre_skipped.pop(batch_no, None)
            if before:
                skipped = before + list(skipped)
            yield Done(batch_no, indices, batch, skipped)

    def stats(self) -> dict[str, Any]:
        decode = self.lanes.stats()
        decode["batches_in_flight"] = self.concurrency
        decode["images_in_flight"] = self.concurrency * self.config.batch
        return {"buffers": self.pool.stats(), "pools": {"decode": decode}}

    def shutdown(self) -> None:
        pass


class WorkerExecutor:
    """``dataset[i]``, ``transform`` and ``collate`` in worker processes, a batch each.

    The workers are started at the first epoch (again after `shutdown`) and, with
    ``persistent``, kept from one epoch to the next.
    """

    def __init__(self, setup: _Setup, config: Config) -> None:
        self.setup = setup
        # Its workers, their prefetch, persistence and timeout, and the pinned memory.
        self.config = config
        self.workers: WorkerPool | None = None
        self.pipeline: _core.Pipeline | None = None

    def _pool(self) -> WorkerPool:
        """The running worker processes (started now unless persistent ones are alive)."""
        pool = self.workers
        if pool is not None and pool.alive():
            return pool
        if pool is not None:
            pool.shutdown(force=True)
        # A copy per pool: the pool settles its start method in it (the default can change
        # between pools: forkserver once JAX is imported).
        setup = dataclasses.replace(
            self.setup, parent_pid=os.getpid(), seeded_modules=seeded_modules()
        )
        self.workers = WorkerPool(
            setup,
            self.config.num_workers,
            self.config.prefetch_factor,
            pin_memory=self.config.pinned,
        )
        return self.workers

    def run(self, epoch: int, start: int, groups: Iterator[Group]) -> Iterator[Done]:
        return self._guarded(lambda pool: worker_batches(pool, epoch, groups, self.config.timeout))

    def _guarded(
        self, batches: Callable[[WorkerPool], Iterator[tuple[int, list[int], Loaded]]]
    ) -> Iterator[Done]:
        """The `Done` of ``batches(pool)``; the pool ended or kept as the way out says."""
        pool = self._pool()
        keep = clean = False
        try:
            for batch_no, indices, loaded in batches(pool):
                batch = None if loaded.empty else loaded.batch
                yield Done(batch_no, indices, batch, loaded.skipped)
            keep = self.config.persistent_workers
            clean = True
        except GeneratorExit:
            # The consumer left early: persistent workers stay (what they still hold for
            # this iteration is dropped when it comes back).
            keep = self.config.persistent_workers
            raise
        except (WorkerError, KeyboardInterrupt):
            # A worker died or stalled, or Ctrl-C: end them all, at once.
            keep = False
            raise
        except Exception:
            # The user's exception from a worker: the workers themselves are fine.
            keep = self.config.persistent_workers
            raise
        finally:
            if not keep:
                self.workers = None
                pool.shutdown(force=not clean)

    def stats(self) -> dict[str, Any]:
        return {"workers": self.workers.stats()} if self.workers is not None else {}

    def shutdown(self) -> None:
        pool, self.workers = self.workers, None
        if pool is not None:
            pool.shutdown()


class StreamWorkerExecutor(WorkerExecutor):
    """An iterable dataset in worker processes: each iterates its own copy of it.

    The workers' batches are taken round-robin (see `ferrofeed._workers.stream_batches`).
    """

    def run(self, epoch: int, start: int, groups: Iterator[Group]) -> Iterator[Done]:
        """The batches of ``epoch`` from ``start``; the workers make the groups themselves.

        ``groups`` (this process's pass over the dataset) is never started. The epoch's
        first ``start`` batches are replayed: read by the workers, dropped.
        """
        return self._guarded(lambda pool: stream_batches(pool, epoch, start, self.config.timeout))


# Images queued or decoding per decode thread that the native path keeps in flight.
IMAGES_PER_THREAD = 8


def _batches_in_flight(num_threads: int, batch: int) -> int:
    """How many batches the native path decodes at once: sized by the threads, not fixed.

    Every batch in flight queues its images on the loader's pool of ``num_threads``
    threads, which take them first come first served and go from one batch's images to
    the next one's with no hand-over. Enough batches are in flight that each thread has
    about ``IMAGES_PER_THREAD`` images queued or decoding (``ceil(8 * threads / batch)``),
    plus one batch: the one being handed over (its last image finishing, its tensor
    made, the next group queued), so the threads never wait for a batch boundary, nor
    for a slow image at the end of a batch, nor for the threads that hand batches over
    to get a core when every core runs a decode (8 rather than 4 a thread: on 2 cores,
    16 threads' own busy share rose from 70% to 96%). At least two. The memory this
    holds is that many batch buffers (plus the ``prefetch`` finished batches waiting for
    the consumer): 5 batches of 32 at 16 threads, 17 at 64.
    """
    batch = max(batch, 1)
    return max(2, -(-IMAGES_PER_THREAD * max(num_threads, 1) // batch) + 1)
