"""`Mix`: several datasets drawn at set proportions, given to a `DataLoader` as one.

The order is the core's `MixPlan` (``src/plan/mix.rs``): each source in its own order
(its shuffle, its shuffle window for shards, its share of the ranks), and each position
of the epoch drawn from one source by a low-discrepancy interleave of the weights, a pure
function of ``(seed, epoch, position)``. The loader reads it through
`ferrofeed._mix_source.MixSource`.
"""

from __future__ import annotations

import bisect
import math
import numbers
import os
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from ._images import ImageFolder
from ._iterable import is_iterable_dataset
from ._shards import ShardedSource

__all__ = ["Mix"]


class Mix:
    """Several datasets drawn at set proportions, as one source of a `DataLoader`.

    Args:
        sources: what the loader reads, two or more (one works too): sequences and
            map-style datasets (``len(ds)`` and ``ds[i]``, `SharedList`, image paths,
            a folder of class subfolders as a path), and sharded sources (`TarShards`,
            `ParquetShards`, `JsonLines`, `MDSShards`), local or in object storage.
            Iterable datasets (``__iter__`` alone) cannot be mixed: their samples cannot
            be drawn at a position.
        weights: one per source, any scale (normalized); 0 leaves a source out. By
            default, proportional to the sources' sizes.
        stop: where an epoch ends. ``"shortest"``: when a source would have to repeat a
            sample, so no sample appears twice. ``"longest"``: when every sample of the
            source that takes longest has appeared once; the others start over, each
            pass shuffled anew.
        samples_per_epoch: the epoch's samples across all ranks, whatever ``stop``
            says; sources start over as they run out.

    Each source keeps its own order: the loader's ``shuffle``, its own seed (drawn
    from the loader's), ``shuffle_window`` for shards, and its share of the ranks. Each
    position of a rank's epoch draws from one source by an interleave of the weights
    (not independent coin flips): the proportions hold to a sample over any stretch of
    the epoch, the same on 1 or N threads, in worker processes, and after a resume,
    exact or on another world size (`DataLoader.load_state_dict`). Samples reach the
    transform, the collate and the native image chain as they come from their source;
    with the native chain, ``image=`` and ``label=`` take alternatives
    (``image="jpg;image", label="cls;label"``) so that sources with other field names
    mix. A sample's index (``stats()["skipped"]``, the random crops' seed) is its place
    in the sources laid end to end (``pass * total`` added for the passes after the
    first): see `locate`. ``loader.stats()["sources"]`` counts each source's samples
    and skips.

    Example:
        >>> import ferrofeed
        >>> mix = ferrofeed.Mix([list(range(100)), list(range(1000, 1050))], weights=[2, 1])
        >>> loader = ferrofeed.DataLoader(mix, batch_size=6, shuffle=True, seed=0)
        >>> batch = next(iter(loader))
        >>> int((batch >= 1000).sum())  # a third of each batch from the second source
        2
    """

    def __init__(
        self,
        sources: Sequence[Any],
        weights: Sequence[float] | None = None,
        stop: Literal["shortest", "longest"] = "shortest",
        samples_per_epoch: int | None = None,
    ) -> None:
        if isinstance(sources, str | bytes | os.PathLike) or not isinstance(sources, Sequence):
            raise TypeError(f"sources must be a list of datasets, not {type(sources).__name__}")
        if not sources:
            raise ValueError("a Mix needs at least one source")
        self.sources: tuple[Any, ...] = tuple(_source(s, k) for k, s in enumerate(sources))
        lens = []
        for k, s in enumerate(self.sources):
            n = len(s)
            if n == 0:
                raise ValueError(f"source {k} ({type(s).__name__}) is empty")
            lens.append(n)
        self.lens: tuple[int, ...] = tuple(lens)
        self.weights: tuple[float, ...] = _weights(weights, lens)
        if stop not in ("shortest", "longest"):
            raise ValueError(f"stop must be 'shortest' or 'longest', not {stop!r}")
        self.stop: Literal["shortest", "longest"] = stop
        if samples_per_epoch is not None and (
            isinstance(samples_per_epoch, bool)
            or not isinstance(samples_per_epoch, int)
            or samples_per_epoch < 1
        ):
            raise ValueError(
                f"samples_per_epoch must be an int >= 1 or None, not {samples_per_epoch!r}"
            )
        self.samples_per_epoch = samples_per_epoch
        # The first index of each source, the sources laid end to end.
        self._offsets = [0]
        for n in lens:
            self._offsets.append(self._offsets[-1] + n)

    @property
    def total(self) -> int:
        """The samples of all sources (a pass ``q`` numbers its samples from ``q * total``)."""
        return self._offsets[-1]

    def locate(self, index: int) -> tuple[int, int, int]:
        """Return ``(source, pass, index in the source)`` of a sample's index in the mix.

        Example:
            >>> import ferrofeed
            >>> ferrofeed.Mix([[0] * 3, [1] * 5]).locate(9)
            (0, 1, 1)
        """
        if not index >= 0:
            raise IndexError(f"a Mix's index is >= 0, not {index}")
        passes, rest = divmod(index, self.total)
        k = bisect.bisect_right(self._offsets, rest) - 1
        return k, passes, rest - self._offsets[k]

    def __getitem__(self, index: int) -> Any:
        """Return the sample of index ``index`` from its map-style source.

        A sharded source's samples are read by the loader, window by window: asking one
        here raises `TypeError`.
        """
        k, _, i = self.locate(index)
        source = self.sources[k]
        if isinstance(source, ShardedSource):
            raise TypeError(
                f"sample {index} is in source {k}, a {type(source).__name__}, which is read "
                "by the DataLoader window by window, not by index"
            )
        return source[i]

    def __iter__(self) -> Iterator[Any]:
        """Refuse: a Mix is read through a `DataLoader`, which draws its positions."""
        raise TypeError("a Mix is read through a DataLoader: DataLoader(mix, batch_size=...)")

    def __repr__(self) -> str:
        names = ", ".join(type(s).__name__ for s in self.sources)
        weights = ", ".join(f"{w:.4g}" for w in self.weights)
        extra = (
            ""
            if self.samples_per_epoch is None
            else f", samples_per_epoch={self.samples_per_epoch}"
        )
        return f"Mix([{names}], weights=[{weights}], stop={self.stop!r}{extra})"


def _source(source: Any, k: int) -> Any:
    """Source ``k`` as the loader reads it (a path as an `ImageFolder`), or refused."""
    if isinstance(source, str | os.PathLike):
        return ImageFolder(source)
    if isinstance(source, Mix):
        raise TypeError(f"source {k} is a Mix: give its sources to one Mix instead")
    if isinstance(source, ShardedSource):
        return source
    if isinstance(source, Iterator) or is_iterable_dataset(source):
        raise TypeError(
            f"source {k} is an iterable dataset ({type(source).__name__}): a Mix draws "
            "samples by position, so its sources are sequences, map-style datasets or "
            "sharded sources"
        )
    if not (hasattr(source, "__len__") and hasattr(source, "__getitem__")):
        raise TypeError(
            f"source {k} must be a sequence, a map-style dataset (len(ds) and ds[i]) or a "
            f"sharded source, not {type(source).__name__}"
        )
    return source


def _weights(weights: Sequence[float] | None, lens: list[int]) -> tuple[float, ...]:
    """The weights, normalized, or the sources' shares of the samples by default."""
    if weights is None:
        samples = sum(lens)
        return tuple(n / samples for n in lens)
    if isinstance(weights, str | bytes) or not isinstance(weights, Sequence):
        raise TypeError(f"weights must be a list of numbers, not {type(weights).__name__}")
    if len(weights) != len(lens):
        raise ValueError(f"{len(weights)} weights for {len(lens)} sources")
    out: list[float] = []
    for k, given in enumerate(weights):
        if isinstance(given, bool) or not isinstance(given, numbers.Real):
            raise TypeError(f"weight {k} must be a number, not {given!r}")
        w = float(given)
        if math.isnan(w) or math.isinf(w) or w < 0:
            raise ValueError(f"weight {k} is {w}: weights are finite numbers >= 0")
        out.append(w)
    total = math.fsum(out)
    if total == 0:
        raise ValueError("every weight is 0: at least one source must be drawn from")
    return tuple(w / total for w in out)
