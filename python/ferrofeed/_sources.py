"""The kinds of source a `DataLoader` reads, and `choose_source`, which picks one.

`choose_source` is the one place that looks at what the loader was given: it picks the
class, refuses the arguments that kind cannot take, and hands back the class to be built
with the loader's checked `Config`. Each class honours the `Source` protocol
(`ferrofeed._source`):

* `MapSource`: a map-style dataset (a sequence, a `SharedList`, image files), ordered by
  the core's `EpochPlan`; image files go through the native image chain.
* `SamplerSource`: a map-style dataset batched by a ``batch_sampler``.
* `ShardSource`: a `ShardedSource` (tar, Parquet, JSON lines), ordered by the core's
  `ShardPlan`, read a window ahead (`ferrofeed._shard_source`).
* `StreamSource`: an iterable dataset, read as PyTorch reads one (`ferrofeed._iterable`).
* `MixSource`: a `Mix` of any of the map-style and sharded kinds, ordered by the core's
  `MixPlan` (`ferrofeed._mix_source`).

A new kind of data is a new class, and the line of `choose_source` that picks it.
"""

from __future__ import annotations

import functools
import operator
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from . import _core
from ._config import Arguments, Config
from ._executors import Executor, StreamWorkerExecutor
from ._group import Group, Indexed
from ._images import ImageFolder
from ._iterable import StreamSpec, batches_in, check_arguments, is_iterable_dataset, stream_groups
from ._mix import Mix
from ._mix_source import MixSource
from ._shard_source import ShardSource
from ._shards import ShardedSource
from ._source import BaseSource, History, Source, check_image_items

__all__ = [
    "MapDataset",
    "MapSource",
    "SamplerSource",
    "ShardSource",
    "Source",
    "StreamSource",
    "choose_source",
]


class MapDataset(Protocol):
    """What `DataLoader` reads: ``len(ds)`` and ``ds[i]`` (a torch Dataset qualifies)."""

    def __len__(self) -> int: ...
    def __getitem__(self, index: int, /) -> Any: ...


def choose_source(source: Any, args: Arguments) -> Callable[[Config], Source]:
    """Pick the class that reads ``source``; return it, to be built with the loader's config.

    The one place that looks at what the loader was given. It refuses, before the loader's
    common checks (`Config.check`), the arguments that this kind of source cannot take.
    """
    shuffle, shuffle_window = args["shuffle"], args["shuffle_window"]
    transform, collate, batches_per_epoch = (
        args["transform"],
        args["collate"],
        args["batches_per_epoch"],
    )
    image, label, bucket_by = args["image"], args["label"], args["bucket_by"]
    batch_sampler = args["batch_sampler"]
    if isinstance(source, str | os.PathLike):
        source = ImageFolder(source)
    if isinstance(source, Mix):
        for name, given in (
            ("batch_sampler", batch_sampler),
            ("batches_per_epoch", batches_per_epoch),
            ("bucket_by", bucket_by),
        ):
            if given is not None:
                raise TypeError(
                    f"{name}= does not apply to a Mix: its epoch is what Mix(stop=..., "
                    "samples_per_epoch=...) says, its batches draw from every source"
                )
        _check_window(shuffle_window)
        return functools.partial(MixSource, source)
    sharded = isinstance(source, ShardedSource)
    iterable = not sharded and is_iterable_dataset(source)
    if iterable and isinstance(source, Iterator):
        # A generator or another iterator is spent after one pass: every epoch after the
        # first would be silently empty.
        raise TypeError(
            f"source is an iterator ({type(source).__name__}): it can be read once, so "
            "every epoch after the first would be empty; pass an object whose __iter__ "
            "starts a new pass (a class with __iter__, a torch IterableDataset), or a list"
        )
    if iterable:
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
    elif not sharded and not (hasattr(source, "__len__") and hasattr(source, "__getitem__")):
        raise TypeError(
            "source must be a map-style dataset (len(ds) and ds[i]), an iterable dataset "
            "(__iter__), a sharded source (TarShards, ParquetShards, JsonLines), a "
            "sequence of image paths, or a folder of class subfolders, not "
            f"{type(source).__name__}"
        )
    _check_window(shuffle_window)
    if bucket_by is not None and not callable(bucket_by):
        raise TypeError(f"bucket_by must be a function of a sample, not {bucket_by!r}")
    if batch_sampler is not None:
        if sharded:
            raise TypeError(
                "batch_sampler= is for map-style datasets; a sharded source batches its "
                "shuffle windows (bucket_by= sorts them by a key)"
            )
        if args["batch_size"] != 1 or shuffle or args["drop_last"] or batches_per_epoch is not None:
            raise ValueError(
                "batch_sampler is mutually exclusive with batch_size, shuffle, drop_last "
                "and batches_per_epoch (the sampler decides the batches)"
            )
        if not hasattr(batch_sampler, "__iter__"):
            raise TypeError(
                f"batch_sampler must be an iterable of index lists, not {batch_sampler!r}"
            )
    if not sharded and not iterable:
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
    kind: type[ShardSource | StreamSource | SamplerSource | MapSource]
    if sharded:
        kind = ShardSource
    elif iterable:
        kind = StreamSource
    elif batch_sampler is not None:
        kind = SamplerSource
    else:
        kind = MapSource
    return functools.partial(kind, source)


def _check_window(shuffle_window: Any) -> None:
    """Refuse a ``shuffle_window`` that is not a number of samples."""
    if shuffle_window is not None and (
        isinstance(shuffle_window, bool)
        or not isinstance(shuffle_window, int)
        or shuffle_window < 1
    ):
        raise ValueError(f"shuffle_window must be an int >= 1, not {shuffle_window!r}")


class MapSource(BaseSource):
    """A map-style dataset (``len(ds)`` and ``ds[i]``), in the order of the core's plan.

    Image files (`ImageFiles`, `ImageFolder`, or paths with ``transform=ops.decode_image``)
    go through the native image chain: a group's files are decoded in Rust.
    """

    def __init__(self, dataset: Any, config: Config) -> None:
        super().__init__(dataset, config)
        self._resolve(self._wants_native())
        if self.native and len(dataset) > 0:
            check_image_items(dataset, "the source")
        self._samples = Indexed(dataset)

    def plan(self, epoch: int, start: int = 0) -> _core.EpochPlan | _SamplerPlan:
        """Return the core's plan of ``epoch`` for this rank, from batch ``start``."""
        c = self.config
        return _core.EpochPlan(
            len(self.dataset),
            c.batch,
            epoch=epoch,
            batches_per_epoch=c.batches_per_epoch,
            **c.plan_args(),
            start=start,
        )

    def batches(self, epoch: int, history: History) -> int:
        """Return the plan's batches."""
        return len(self.plan(epoch))

    def sized(self) -> bool:
        """Return True: the plan knows its length."""
        return True

    def samples_per_rank(self, epoch: int, history: History) -> int:
        """Return the plan's samples per rank (after padding or dropping)."""
        plan = self.plan(epoch)
        assert isinstance(plan, _core.EpochPlan)
        return plan.samples_per_rank

    def batches_per_pass(self, epoch: int, history: History) -> int:
        """Return the plan's batches per pass over the dataset."""
        plan = self.plan(epoch)
        assert isinstance(plan, _core.EpochPlan)
        return plan.batches_per_pass

    def groups(self, epoch: int, start: int, history: History) -> Iterator[Group]:
        """Return the plan's groups, whose samples are ``dataset[i]``."""
        samples = self._samples
        return (Group(batch_no, ids, samples) for batch_no, ids in self.plan(epoch, start))

    def resume(self, state: Mapping[str, Any], epoch: int, done: int) -> tuple[int, History]:
        """Return ``(done, [])``; refuse a position past the end of an epoch."""
        self._check_sampler(state)
        if self.sized() and done > self.batches(epoch, []):
            raise ValueError(
                f"the state's batches_done={done} is past the end of an epoch of "
                f"{self.batches(epoch, [])} batches"
            )
        return done, []


class SamplerSource(MapSource):
    """A map-style dataset batched by a ``batch_sampler`` (PyTorch's protocol).

    Its batches are the sampler's index lists, for every rank; resuming replays the
    sampler and skips the batches it already gave.
    """

    def _wants_native(self) -> bool:
        if super()._wants_native():
            raise TypeError(
                "batch_sampler= needs a Python transform: the native image chain decodes "
                "batches of batch_size"
            )
        return False

    def plan(self, epoch: int, start: int = 0) -> _core.EpochPlan | _SamplerPlan:
        """Return the sampler's batches of ``epoch`` from ``start``, as a plan."""
        assert self.config.batch_sampler is not None
        return _SamplerPlan(self.config.batch_sampler, epoch, start)

    def sized(self) -> bool:
        """Return whether the sampler has a ``len()``."""
        return hasattr(self.config.batch_sampler, "__len__")

    def samples_per_rank(self, epoch: int, history: History) -> int:
        """Return the dataset's length (the sampler decides what a rank reads)."""
        return len(self.dataset)

    def batches_per_pass(self, epoch: int, history: History) -> int:
        """Return the sampler's batches."""
        return len(self.plan(epoch))

    def state(self, history: History) -> dict[str, Any]:
        """Return ``batch_sampler: True``: a state resumes only with a sampler."""
        return {"batch_sampler": True}


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


class StreamSource(BaseSource):
    """An iterable dataset: read in the order it yields, as PyTorch reads one.

    On threads, each epoch is one pass over it in this process, cut into groups that carry
    their samples; with workers, each worker reads its own copy and makes the batches
    (`StreamWorkerExecutor`). ``len(loader)`` comes from ``len(dataset)``; a resumed
    epoch replays the stream.
    """

    iterable = True

    def __init__(self, dataset: Any, config: Config) -> None:
        super().__init__(dataset, config)
        self._resolve(False)
        window = config.shuffle_window if config.shuffle else None
        self._spec = StreamSpec(config.batch, config.drop_last, window, config.seed)

    def batches(self, epoch: int, history: History) -> int:
        """Return the batches ``len(dataset)`` makes, as PyTorch counts (`TypeError` without)."""
        return batches_in(self.dataset, self.config.batch, self.config.drop_last)

    def sized(self) -> bool:
        """Return whether the dataset has a ``len()``."""
        return hasattr(self.dataset, "__len__")

    def samples_per_rank(self, epoch: int, history: History) -> int:
        """Return ``len(dataset)`` (`TypeError` without it, as PyTorch's)."""
        return len(self.dataset)

    def batches_per_pass(self, epoch: int, history: History) -> int:
        """Return the batches of an epoch."""
        return self.batches(epoch, history)

    def groups(self, epoch: int, start: int, history: History) -> Iterator[Group]:
        """Return a pass over the dataset from batch ``start`` (replayed up to it).

        The pass starts at the first ``next()``; with workers it never does (the workers
        make the groups).
        """
        return stream_groups(self.dataset, self._spec, epoch, start)

    def state(self, history: History) -> dict[str, Any]:
        """Return the workers and the shuffle buffer: the order depends on both."""
        c = self.config
        return {
            "num_workers": c.num_workers,
            "shuffle_window": c.shuffle_window if c.shuffle else None,
        }

    def checked_keys(self) -> list[str]:
        """Return the rank, the world, the workers and the shuffle buffer."""
        return [*super().checked_keys(), "num_workers", "shuffle_window"]

    def resume(self, state: Mapping[str, Any], epoch: int, done: int) -> tuple[int, History]:
        """Return ``(done, [])``: ``len()`` is an estimate, so any position is taken."""
        self._check_sampler(state)
        return done, []

    def executor(self) -> Executor:
        """Return threads over this process's pass, or workers that each make their own."""
        c = self.config
        if c.num_workers == 0:
            return super().executor()
        return StreamWorkerExecutor(self._worker_setup(self._spec), c)
