"""A group: one batch of an epoch as a source hands it to an executor.

A `Group` is the batch's number, the ids of its samples (dataset indices, positions in a
stream, or positions in the shards' stored order: the "dataset index" of the seed rule) and
where its samples come from (`Samples`). Executors and worker processes get a sample with
``group.sample(i)``, and the native image chain gets the batch's files or image bytes with
``group.native(skip)``: none of them asks which kind of source made the group. Sent to a
worker process, a group takes along only what the worker cannot find on its own
(`Samples.shipped`): a map-style dataset's group its ids (the worker indexes its own copy
of the dataset), a sharded source's group its samples (workers never read shards).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from . import _core

__all__ = ["Carried", "Failed", "Group", "Indexed", "Samples", "in_worker"]

Skipped = list[tuple[int, str]]


class Samples(Protocol):
    """Where the samples of a group come from."""

    def get(self, index: int) -> Any:
        """Return the sample of id ``index`` as Python objects (raising its error)."""
        ...

    def shipped(self, ids: list[int]) -> Samples:
        """Return what a worker process gets in their place for the samples ``ids``."""
        ...

    def native(self, batch_no: int, ids: list[int], skip: bool) -> tuple[_core._PlanGroup, Skipped]:
        """Return the native image chain's group of ``ids``, and the samples left out.

        ``skip``: leave out, as ``(id, reason)``, the samples that cannot go to the batch
        op (unreadable, or without the image or label field) instead of raising.
        """
        ...


@dataclasses.dataclass(frozen=True)
class Group:
    """One batch of an epoch: its number, its samples' ids and where they come from."""

    batch_no: int
    ids: list[int]
    samples: Samples

    def sample(self, index: int) -> Any:
        """Return the sample of id ``index`` (one of `ids`) as Python objects."""
        return self.samples.get(index)

    def native(self, skip: bool) -> tuple[_core._PlanGroup, Skipped]:
        """Return the batch op's group (see `Samples.native`)."""
        return self.samples.native(self.batch_no, self.ids, skip)

    def __reduce__(self) -> tuple[Any, ...]:
        # To a worker process: what it needs of the samples, not the source itself.
        return (Group, (self.batch_no, self.ids, self.samples.shipped(self.ids)))


class Indexed:
    """A map-style dataset's samples: ``dataset[i]``.

    In a worker process the group's ids index the worker's own copy of the dataset (the
    one `in_worker` names), so the dataset is not sent with every batch.
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def get(self, index: int) -> Any:
        """Return ``dataset[index]``."""
        return self.dataset[index]

    def shipped(self, ids: list[int]) -> Samples:
        """Return these samples as a worker finds them: in its own copy of the dataset."""
        return self

    def native(self, batch_no: int, ids: list[int], skip: bool) -> tuple[_core._PlanGroup, Skipped]:
        """Return the group of the files ``dataset[i]`` (paths, or ``(path, label)`` pairs).

        `_PlanGroup` makes the files native here, on the pipeline source's thread, so the
        batch op never waits for the GIL.
        """
        return _core._PlanGroup(batch_no, ids, [_as_pair(self.dataset[i]) for i in ids]), []

    def __reduce__(self) -> tuple[Any, ...]:
        return (_worker_dataset, ())


def _as_pair(sample: Any) -> Any:
    """A ``[path, label]`` list (as JSON gives pairs) as the pair it stands for."""
    return tuple(sample) if isinstance(sample, list) else sample


# The dataset of this worker process (see `in_worker`); empty outside workers.
_WORKER_DATASET: list[Any] = []


def in_worker(dataset: Any) -> None:
    """Name this worker process's copy of the dataset, which `Indexed` groups index."""
    _WORKER_DATASET[:] = [dataset]


def _worker_dataset() -> Indexed:
    if not _WORKER_DATASET:
        raise RuntimeError("a map-style group was unpickled outside a DataLoader worker")
    return Indexed(_WORKER_DATASET[0])


@dataclasses.dataclass(frozen=True)
class Failed:
    """A sample that could not be read, carried as its error (raised when it is asked for)."""

    error: BaseException


class Carried:
    """Samples carried with their group, by id: an iterable dataset's, or shipped shards'.

    A `Failed` value is raised when its sample is asked for.
    """

    def __init__(self, samples: Mapping[int, Any]) -> None:
        self.samples = samples

    def get(self, index: int) -> Any:
        """Return the sample of id ``index``; raise its error if it could not be read."""
        sample = self.samples[index]
        if isinstance(sample, Failed):
            raise sample.error
        return sample

    def shipped(self, ids: list[int]) -> Samples:
        """Return these samples, as they travel: with the group."""
        return Carried({i: self.samples[i] for i in ids})

    def native(
        self, batch_no: int, ids: Sequence[int], skip: bool
    ) -> tuple[_core._PlanGroup, Skipped]:
        """Refuse: carried samples are Python objects, not files or image bytes."""
        raise TypeError("the native image chain reads image files or shards, not carried samples")
