"""Iterable datasets: a source read by iterating it, as PyTorch's ``IterableDataset``.

A dataset with ``__iter__`` and no ``__getitem__`` (or a ``torch.utils.data.IterableDataset``)
has no index to sample: the loader reads it in the order it yields, as PyTorch does.

* On threads (``num_workers=0``), it is iterated once per epoch in this process, on the
  pipeline's source thread, and cut into batches there; each group's ids are the samples'
  positions in the stream, and the group carries their samples (`Carried`), so the thread
  executor loads them as it loads any group.
* With ``num_workers=N``, each worker iterates its own copy (`get_worker_info` tells it
  which part to read) and makes batches from its own stream, one per request; the main
  process asks the workers in turn and takes their batches round-robin (see
  ``_workers.stream_batches``).

``shuffle=True`` shuffles through a buffer of ``shuffle_window`` samples (``_core``'s
``_ShuffleBuffer``, ferrofeed's own pinned generator), seeded from ``(seed, epoch)`` and
the worker's id. A sample's id is its position in its stream
(``position * num_workers + worker`` with workers): its random draws come from ``(seed,
epoch, id)``. A resumed epoch replays the stream up to where it stopped.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from collections.abc import Iterator
from typing import Any

from . import _core
from ._group import Carried, Group
from ._sample import sample_scope

__all__ = ["SampleStream", "StreamSpec", "is_iterable_dataset", "stream_groups"]


def is_iterable_dataset(source: Any) -> bool:
    """Whether ``source`` is read by iterating it.

    True for a ``torch.utils.data.IterableDataset`` (torch is not imported to find out: an
    object cannot be one unless torch is imported) and for any object with ``__iter__``
    and no ``__getitem__``.
    """
    data = sys.modules.get("torch.utils.data")
    iterable_dataset = getattr(data, "IterableDataset", None)
    if iterable_dataset is not None and isinstance(source, iterable_dataset):
        return True
    return hasattr(source, "__iter__") and not hasattr(source, "__getitem__")


def check_arguments(
    *,
    shuffle: bool,
    shuffle_window: int | None,
    batches_per_epoch: int | None,
    native: bool,
    image: Any,
    label: Any,
    bucket_by: Any,
    batch_sampler: Any,
) -> None:
    """Refuse, at construction, the `DataLoader` arguments an iterable dataset cannot take."""
    if shuffle and shuffle_window is None:
        raise ValueError(
            "shuffle=True with an iterable dataset needs shuffle_window= (the samples held "
            "for shuffling: the loader cannot index the dataset, it shuffles what it reads "
            "through a buffer of that many samples)"
        )
    if batches_per_epoch is not None:
        raise TypeError(
            "batches_per_epoch does not apply to an iterable dataset: an epoch is one pass "
            "over its iterator"
        )
    if native:
        raise TypeError(
            "the native image chain (ops.decode_image, ops.collate) reads image files or "
            "shards; an iterable dataset takes a Python transform and collate (e.g. "
            "ferrofeed.io.decode_image in the transform)"
        )
    for name, value in (("image", image), ("label", label), ("bucket_by", bucket_by)):
        if value is not None:
            raise TypeError(f"{name}= is for sharded sources (TarShards, ParquetShards, JsonLines)")
    if batch_sampler is not None:
        raise TypeError(
            "batch_sampler= is for map-style datasets: an iterable dataset has no indices "
            "(as in PyTorch)"
        )


def batches_in(dataset: Any, batch: int, drop_last: bool) -> int:
    """``len(loader)`` of an iterable dataset: from ``len(dataset)``, as PyTorch counts.

    Raises:
        TypeError: the dataset has no ``__len__``.
    """
    if not hasattr(dataset, "__len__"):
        raise TypeError(
            f"len(loader) needs len(dataset), and this iterable dataset "
            f"({type(dataset).__name__}) has no __len__"
        )
    n = len(dataset)
    return n // batch if drop_last else -(-n // batch)


@dataclasses.dataclass(frozen=True)
class StreamSpec:
    """How an iterable dataset's stream becomes batches (the same on threads and workers).

    Attributes:
        batch: samples per batch (1 with ``batch_size=None``).
        drop_last: drop a stream's last, short batch (each worker's, with workers).
        window: the shuffle buffer's samples; ``None``: no shuffle.
        seed: the loader's seed.
    """

    batch: int
    drop_last: bool
    window: int | None
    seed: int


class SampleStream:
    """One epoch's pass over an iterable dataset: ``(id, sample)`` pairs, shuffled or not.

    Worker ``worker`` of ``num_workers`` (0 of 1 on threads) numbers the samples it reads
    ``position * num_workers + worker``. Each ``next()`` of the dataset's iterator runs
    inside that sample's scope, so `sample_rng` works in ``__iter__`` and a replayed
    stream draws what the first pass drew. The global generators (`random`, NumPy's,
    torch's) are seeded for the sample too: before every ``next()`` with
    ``seed_globals`` (a worker process, where this thread is the only one loading), else
    before the first one only (on threads: no sample is being transformed yet then), so
    an ``__iter__`` that shuffles its files with `random` at its start reproduces.

    Iterating the dataset starts at the first `take`; an error of the iterator (its
    ``__iter__`` included) is raised there, and the stream ends with it.
    """

    def __init__(
        self,
        dataset: Any,
        spec: StreamSpec,
        epoch: int,
        *,
        worker: int = 0,
        num_workers: int = 1,
        seed_globals: bool = False,
    ) -> None:
        self.dataset = dataset
        self.spec = spec
        self.epoch = epoch
        self.worker = worker
        self.num_workers = num_workers
        self.seed_globals = seed_globals
        items = self._read()
        if spec.window is not None:
            # Ferrofeed's shuffle buffer (sampler::ShuffleBuffer, pinned), drawing from
            # (seed, epoch, worker).
            items = _core._ShuffleBuffer(
                items, spec.window, seed=spec.seed, epoch=epoch, index=worker
            )
        self._items = items

    def _read(self) -> Iterator[tuple[int, Any]]:
        seed, epoch, step = self.spec.seed, self.epoch, self.num_workers
        try:
            it = iter(self.dataset)
        except Exception as e:
            e.add_note("while starting to iterate the dataset (iter(dataset))")
            raise
        for position in itertools.count():
            index = position * step + self.worker
            try:
                globals_too = self.seed_globals or position == 0
                with sample_scope(seed, epoch, index, seed_globals=globals_too):
                    sample = next(it)
            except StopIteration:
                return
            except Exception as e:
                e.add_note(f"while reading sample {index} of the epoch from the dataset's iterator")
                raise
            yield index, sample

    def take(self, n: int) -> list[tuple[int, Any]]:
        """The stream's next ``n`` samples (fewer at its end, none past it)."""
        return list(itertools.islice(self._items, n))

    def next_batch(self) -> list[tuple[int, Any]] | None:
        """The samples of the stream's next batch; ``None`` at its end."""
        items = self.take(self.spec.batch)
        if not items or (self.spec.drop_last and len(items) < self.spec.batch):
            return None
        return items


def stream_groups(dataset: Any, spec: StreamSpec, epoch: int, start: int) -> Iterator[Group]:
    """The groups of an epoch on threads: one pass over the dataset, cut into batches.

    Each group carries its samples (`Carried`). The pass starts at the first ``next()``.
    The first ``start`` batches (a resumed epoch) are read and dropped before the first
    group: the stream is replayed, its samples are not transformed.
    """
    stream = SampleStream(dataset, spec, epoch)
    for batch_no in itertools.count():
        items = stream.next_batch()
        if items is None:
            return
        if batch_no >= start:
            yield Group(batch_no, [i for i, _ in items], Carried(dict(items)))
