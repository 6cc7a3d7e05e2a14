"""The `Source` protocol: what a `DataLoader` reads, whatever the kind of data.

One contract for every kind: a source turns the loader's position (the epoch, its first
batch, the epoch's elastic history) into the epoch's groups (`Group`: a batch number, its
samples' ids and where they come from), and answers for what differs between kinds: its
length, its entries of the state and how a saved state fits it, the executor that runs
its groups (what a worker process gets, the native image chain's specifics), and its
figures. The loader keeps the position, iteration, skips and output, and never asks which
kind it holds. `BaseSource` is what the kinds share; they are `ferrofeed._sources`'s and
`ferrofeed._shard_source`'s classes.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Protocol

from . import _core, ops
from ._collate import default_collate
from ._config import Config
from ._executors import Executor, NativeExecutor, ThreadExecutor, WorkerExecutor
from ._group import Group
from ._images import ImageFiles
from ._iterable import StreamSpec
from ._worker_process import _Setup

__all__ = ["BaseSource", "ElasticSource", "History", "Source", "check_image_items"]

# An epoch's elastic history: (world_size, batches_done) of each world it ran on before.
History = Sequence[tuple[int, int]]


class Source(Protocol):
    """What a `DataLoader` reads: the groups of each epoch, and what differs by kind.

    ``history`` is the current epoch's elastic history, ``(world_size, batches_done)`` of
    the worlds it ran on before (see `resume`); empty unless a sharded source's state was
    loaded on another world size, and for any other epoch than the current one.
    """

    #: The loader's ``source`` (an `ImageFolder` for a path), as ``loader.dataset``.
    dataset: Any
    #: Whether batches go through the native image chain.
    native: bool
    #: The transform and collate that run (defaults filled in), as the loader shows them.
    transform: Callable[[Any], Any] | _core.NativeOp | None
    collate: Callable[[list[Any]], Any] | _core.NativeOp | None
    #: Informational: a sharded source; an iterable dataset.
    sharded: ClassVar[bool]
    iterable: ClassVar[bool]

    def batches(self, epoch: int, history: History) -> int:
        """Return the batches of ``epoch`` on this rank (`TypeError` when unknown)."""
        ...

    def sized(self) -> bool:
        """Return whether the number of batches is known before the epoch runs."""
        ...

    def samples_per_rank(self, epoch: int, history: History) -> int:
        """Return the samples this rank reads per pass over the data."""
        ...

    def batches_per_pass(self, epoch: int, history: History) -> int:
        """Return the batches this rank yields per pass over the data."""
        ...

    def groups(self, epoch: int, start: int, history: History) -> Iterator[Group]:
        """Return the groups of ``epoch`` from batch ``start`` on, in order.

        The order is fixed now (a plan that cannot be made raises here); each group is
        made when the executor takes it.
        """
        ...

    def state(self, history: History) -> dict[str, Any]:
        """Return this kind's entries of `DataLoader.state_dict`."""
        ...

    def checked_keys(self) -> list[str]:
        """Return the entries of a state, past the common ones, that must equal this one's."""
        ...

    def resume(self, state: Mapping[str, Any], epoch: int, done: int) -> tuple[int, History]:
        """Return where ``state`` resumes ``epoch`` (batches done, history), or refuse it.

        Raises:
            ValueError: the position does not fit this source.
        """
        ...

    def executor(self) -> Executor:
        """Return the executor that turns this source's groups into batches."""
        ...

    def stats(
        self, epoch: int, history: History, done: int, skipped: Sequence[tuple[int, str]]
    ) -> dict[str, Any]:
        """Return the source's entries of `DataLoader.stats` at the loader's position.

        ``remote`` (object storage counters), ``skipped_shards`` and ``sources`` (a
        mixture's figures per source); ``done``: the batches done in ``epoch``, ``skipped``
        the samples skipped so far.
        """
        ...


class BaseSource:
    """What the kinds of source share; each kind adds its order (`groups`) and its length.

    A subclass calls `_resolve` in its constructor once it knows whether the native image
    chain reads it.
    """

    sharded: ClassVar[bool] = False
    iterable: ClassVar[bool] = False

    def __init__(self, dataset: Any, config: Config) -> None:
        self.dataset = dataset
        self.config = config
        self.native = False
        self.transform: Callable[[Any], Any] | _core.NativeOp | None = config.transform
        self.collate: Callable[[list[Any]], Any] | _core.NativeOp | None = config.collate

    def _wants_native(self) -> bool:
        """Whether the native image chain reads this source (a native transform, or none)."""
        transform = self.config.transform
        return isinstance(transform, _core.NativeOp) or (
            transform is None and isinstance(self.dataset, ImageFiles)
        )

    def _resolve(self, native: bool) -> None:
        """Settle the transform and collate that run; refuse, now, what cannot."""
        c = self.config
        self.native = native
        if native:
            # ImageNet's evaluation preprocessing when none is given: the shorter side to
            # 256, a center crop of 224.
            self.transform = (
                c.transform
                if c.transform is not None
                else ops.decode_image(resize_shorter=256, crop=224)
            )
            self.collate = c.collate
            if c.batch_size is None:
                raise TypeError("batch_size=None needs a Python transform, not image files")
            if isinstance(self.collate, _core.NativeOp):
                if self.collate.group_size is None:
                    raise TypeError("collate must be ops.collate(...) or None with image files")
            elif self.collate is not None:
                raise TypeError(
                    "with the native image chain, collate is ops.collate(...) or None "
                    "(a Python collate needs a Python transform)"
                )
            return
        if isinstance(c.collate, _core.NativeOp):
            raise TypeError(
                "collate=ops.collate(...) needs the native image chain: image files "
                "as the source, and transform=ops.decode_image(...) (or None)"
            )
        self.transform = c.transform
        if c.batch_size is None and c.collate is not None:
            raise TypeError("batch_size=None hands out samples as they are: no collate")
        self.collate = c.collate or (_single if c.batch_size is None else default_collate)

    def state(self, history: History) -> dict[str, Any]:
        """Return no entries of the state past the common ones."""
        return {}

    def checked_keys(self) -> list[str]:
        """Return the rank and the world: a position is this rank's."""
        return ["rank", "world_size"]

    def _check_sampler(self, state: Mapping[str, Any]) -> None:
        """Refuse a state saved with a ``batch_sampler`` here without one, or the reverse."""
        saved, has = state.get("batch_sampler", False), self.state([]).get("batch_sampler", False)
        if saved != has:
            raise ValueError(
                "the state was saved with"
                + ("" if saved else "out")
                + " a batch_sampler, this loader has"
                + ("" if has else " none")
            )

    def stats(
        self, epoch: int, history: History, done: int, skipped: Sequence[tuple[int, str]]
    ) -> dict[str, Any]:
        """Return no remote counters, no damaged shards and no per-source figures."""
        return {"remote": {}, "skipped_shards": [], "sources": []}

    def executor(self) -> Executor:
        """Return the native batch op, worker processes, or threads, as the config says."""
        c = self.config
        if self.native:
            assert isinstance(self.transform, _core.NativeOp)
            assert self.collate is None or isinstance(self.collate, _core.NativeOp)
            return NativeExecutor(self.transform, self.collate, c)
        if c.num_workers > 0:
            return WorkerExecutor(self._worker_setup(None), c)
        transform, collate = self._python_steps()
        return ThreadExecutor(transform, collate, c)

    def _python_steps(
        self,
    ) -> tuple[Callable[[Any], Any] | None, Callable[[list[Any]], Any]]:
        """The Python transform and collate (off the native chain)."""
        transform, collate = self.transform, self.collate
        assert callable(collate)
        assert not isinstance(collate, _core.NativeOp)
        assert not isinstance(transform, _core.NativeOp)
        return transform, collate

    def _worker_setup(self, stream: StreamSpec | None) -> _Setup:
        """What every worker process gets at start (``stream``: an iterable dataset's)."""
        c = self.config
        transform, collate = self._python_steps()
        return _Setup(
            dataset=self.dataset,
            transform=transform,
            collate=collate,
            skip=c.skip,
            seed=c.seed,
            num_workers=c.num_workers,
            worker_init_fn=c.worker_init_fn,
            parent_pid=os.getpid(),
            start_method=c.worker_start_method,
            stream=stream,
        )


class ElasticSource(BaseSource, abc.ABC):
    """A source whose epoch is one plan of the core: sharded sources and mixtures.

    Its length is known, and it resumes on another world size. A subclass gives `plan`:
    the core's plan of an epoch for this rank from a batch, after a history of worlds,
    with ``len()`` (batches) and ``samples`` (this rank's).
    """

    @abc.abstractmethod
    def plan(self, epoch: int, start: int = 0, history: History = ()) -> Any:
        """Return the core's plan of ``epoch`` for this rank, from batch ``start``."""

    def batches(self, epoch: int, history: History) -> int:
        """Return the batches of this world's part of the epoch."""
        return len(self.plan(epoch, 0, history))

    def sized(self) -> bool:
        """Return True: the plan knows its length."""
        return True

    def samples_per_rank(self, epoch: int, history: History) -> int:
        """Return the samples this rank yields in the current world."""
        return int(self.plan(epoch, 0, history).samples)

    def batches_per_pass(self, epoch: int, history: History) -> int:
        """Return the batches of this world's part of the epoch (an epoch is one pass)."""
        return self.batches(epoch, history)

    def resume(self, state: Mapping[str, Any], epoch: int, done: int) -> tuple[int, History]:
        """Return the position: exact on the same world; elastic on another.

        On another world size, what the saved world did becomes the epoch's history, and
        the new world's share starts at batch 0. Checked by making the epoch's plan.
        """
        self._check_sampler(state)
        history = [(int(w), int(d)) for w, d in state.get("history", [])]
        world = state["world_size"]
        if world != self.config.world_size and done > 0:
            history.append((world, done))
            done = 0
        try:
            # Refuses a history or a position that does not fit the source.
            self.plan(epoch, done, history)
        except ValueError as e:
            raise ValueError(f"the state does not fit this loader: {e}") from None
        return done, history


def check_image_items(dataset: Any, what: str) -> None:
    """Refuse a map-style dataset of the native chain whose items are not image paths.

    ``what`` names it in the message ("the source", "source 2" of a `Mix`).
    """
    first = dataset[0]
    pair = isinstance(first, tuple | list) and len(first) == 2
    path = first[0] if pair else first
    if not isinstance(path, str | os.PathLike):
        raise TypeError(
            f"with a native transform, {what}'s items are image paths or (path, label) "
            f"pairs, not {type(first).__name__}"
        )


def _single(samples: list[Any]) -> Any:
    """The "collate" of ``batch_size=None``: the one sample, as it is."""
    return samples[0]
