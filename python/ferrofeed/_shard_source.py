"""A sharded source as the `DataLoader` reads it: the core's sharded plan, a window ahead.

`ShardSource` wraps a `ShardedSource` (`TarShards`, `ParquetShards`, `JsonLines`): each
epoch's order is the core's `ShardPlan` (shards permuted per epoch, a contiguous range of
them per rank, windows shuffled, an elastic history of the worlds the epoch ran on), whose
windows the core's feed (`_core._ShardFeed`) reads one window ahead, on the runtime's
blocking pool (and the next epoch's first window at an epoch's end), fetching remote shards
ahead in the plan's order. A group's samples are its window's (`_Window`): Python
objects for a transform, image bytes and labels for the native image chain, and shipped
with the group to a worker process. ``bucket_by`` remakes a window's batches by a key.
Damaged shards are refused under ``on_error="raise"`` and read up to the damage under
``"skip"``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any

from . import _core
from ._config import Config
from ._errors import ShardError
from ._group import Carried, Failed, Group, Samples, Skipped
from ._shards import ShardedSource
from ._source import ElasticSource, History

__all__ = ["DEFAULT_IMAGE_FIELDS", "ShardSource"]

_log = logging.getLogger("ferrofeed.loader")

# The fields a sharded source's image comes from on the native chain by default.
DEFAULT_IMAGE_FIELDS = ("jpg", "jpeg", "png", "webp")


class ShardSource(ElasticSource):
    """A `ShardedSource` in the order of the core's sharded plan, read a window ahead."""

    sharded = True

    def __init__(self, shards: ShardedSource, config: Config) -> None:
        super().__init__(shards, config)
        self.shards = shards
        # The process's remote counters when the loader was made: stats() reports since then.
        self._remote_base = _core._remote_stats() if shards._remote is not None else None
        # Damaged shards (see ShardedSource.damaged): refused, or logged once and read up to
        # the damage.
        damaged = shards.damaged
        if damaged and config.on_error == "raise":
            damaged[0].add_note("on_error='skip' reads the samples before it and the others")
            raise damaged[0]
        for e in damaged:
            _log.warning("damaged shard, read up to the damage (on_error='skip'): %s", e)
        self._skipped_shards = [(e.shard, str(e)) for e in damaged]
        native = self._wants_native()
        image = config.image
        if image is not None and not native:
            raise TypeError("image= names the field for transform=ops.decode_image(...)")
        if config.label is not None and not native:
            raise TypeError("label= names the field for transform=ops.decode_image(...)")
        if image is None:
            self._fields = list(DEFAULT_IMAGE_FIELDS)
        elif isinstance(image, str):
            self._fields = [f for f in image.split(";") if f]
        else:
            self._fields = list(image)
        if native and not self._fields:
            raise ValueError(f"image= names no field: {image!r}")
        self._resolve(native)
        # The windows, read ahead in the core (see `read`); it keeps the next epoch's first
        # window between epochs. For the native chain, a window of local tar shards leaves
        # the image members' bytes in their files: each decode thread reads its image's, so
        # the one thread that reads a window only walks its headers.
        labels = set((config.label or "").split(";"))
        located = [f for f in self._fields if f not in labels] if native else []
        self._feed = _core._ShardFeed(shards._reader, located)
        # The plan refuses, now rather than at the first batch, a split it cannot make
        # (batches of 1 over an uneven split, fewer samples than ranks).
        self.plan(0)

    def plan(
        self, epoch: int, start: int = 0, history: History = (), seed: int | None = None
    ) -> _core.ShardPlan:
        """Return the core's plan of ``epoch`` for this rank, from batch ``start``.

        ``seed``: another seed than the loader's (a pass over a part of a `Mix`).
        """
        c = self.config
        args = c.plan_args()
        if seed is not None:
            args["seed"] = seed
        return _core.ShardPlan(
            self.shards._counts,
            c.batch,
            epoch=epoch,
            window=c.shuffle_window,
            **args,
            history=list(history),
            start=start,
        )

    def groups(self, epoch: int, start: int, history: History) -> Iterator[Group]:
        """Return the plan's groups, read a window ahead."""
        return self.read(self.plan(epoch, start, history), epoch)

    def state(self, history: History) -> dict[str, Any]:
        """Return the shard counts, the window and the epoch's elastic history."""
        return {
            "shard_counts": list(self.shards._counts),
            "shuffle_window": self.config.shuffle_window,
            "history": [list(h) for h in history],
        }

    def checked_keys(self) -> list[str]:
        """Return the shards and the window (the world may differ: an elastic resume)."""
        return ["shard_counts", "shuffle_window"]

    def resume(self, state: Mapping[str, Any], epoch: int, done: int) -> tuple[int, History]:
        """Return the position: exact on the same world; elastic on another.

        With ``bucket_by``, a position on another world is refused: which samples a
        window's first batches held depends on their keys.
        """
        c = self.config
        world = state["world_size"]
        if world != c.world_size and done > 0 and c.bucket_by is not None:
            raise ValueError(
                f"the state was saved on {world} ranks, this loader has "
                f"world_size={c.world_size}: with bucket_by, which samples a window's "
                "first batches held depends on their keys, so the epoch cannot go on on "
                "another world; resume on the same world size, or at an epoch's start"
            )
        return super().resume(state, epoch, done)

    def stats(
        self, epoch: int, history: History, done: int, skipped: Sequence[tuple[int, str]]
    ) -> dict[str, Any]:
        """Return the remote counters since the loader was made, and the damaged shards."""
        remote: dict[str, Any] = {}
        if self._remote_base is not None:
            now = _core._remote_stats()
            remote = {k: now[k] - self._remote_base[k] for k in now}
        return {"remote": remote, "skipped_shards": list(self._skipped_shards), "sources": []}

    def read(
        self, plan: _core.ShardPlan, epoch: int, read_ahead: bool = True
    ) -> Generator[Group, None, None]:
        """Return the plan's groups, each with the window holding its samples.

        The core's feed (`_core._ShardFeed`) reads the windows in the plan's order, the next
        one while the current one's batches are loaded, and fetches remote shards ahead in
        that order; a window is freed once no group in flight holds it. Once the last window
        is reached, the first window of the next epoch's plan is read ahead too (unless
        ``read_ahead`` is false: a pass over a part of a `Mix`, whose next pass the mixture
        plans), so that the next epoch's first batch does not wait for a whole window to be
        read. With ``bucket_by``, each window's batches are remade from its samples sorted
        by that key (see `_buckets`).
        """
        c = self.config
        batches = self._feed.epoch(plan, read_ahead)
        buckets: dict[int, list[int]] = {}
        bucketed = -1  # the window `buckets` holds
        try:
            for batch_no, w, ids, window in batches:
                if c.bucket_by is not None:
                    if w != bucketed:
                        buckets = _buckets(
                            plan, w, batch_no, window, c.bucket_by, c.seed, epoch, c.shuffle
                        )
                        bucketed = w
                    ids = buckets[batch_no]
                yield Group(batch_no, ids, _Window(window, self._fields, c.label))
        finally:
            # Reads no longer wanted are dropped; the next epoch's goes on.
            batches.close()


class _Window:
    """The samples of a window, as its groups get them.

    Python objects for a transform; image bytes and labels for the native image chain
    (moved out of the window into the batch without becoming Python objects); sent to a
    worker process, a group's samples themselves (read here, in the main process), so
    workers never read shards.
    """

    def __init__(self, window: _core._ShardWindow, image: list[str], label: str | None) -> None:
        self.window = window
        self.image = image
        self.label = label

    def get(self, index: int) -> Any:
        """Return sample ``index`` of the window; raise its error if it could not be read."""
        return self.window.sample(index)

    def shipped(self, ids: list[int]) -> Samples:
        """Return the samples ``ids`` themselves; one that cannot be read as its error."""
        samples: dict[int, Any] = {}
        for i in ids:
            try:
                samples[i] = self.window.sample(i)
            except ShardError as e:
                samples[i] = Failed(e)
        return Carried(samples)

    def native(self, batch_no: int, ids: list[int], skip: bool) -> tuple[_core._PlanGroup, Skipped]:
        """Return the batch op's group: the samples' image bytes and labels."""
        return self.window.plan_group(batch_no, ids, self.image, self.label, skip)


def _buckets(
    plan: _core.ShardPlan,
    window_no: int,
    batch_no: int,
    window: _core._ShardWindow,
    key: Callable[[Any], Any],
    seed: int,
    epoch: int,
    shuffle: bool,
) -> dict[int, list[int]]:
    """Window ``window_no``'s batches remade by ``key``, by batch number.

    The window's samples (those of all its batches, resumed ones too, so the buckets are
    the same wherever the epoch resumes) are sorted by ``key`` (stably, ties in the plan's
    order) and cut into the plan's batch sizes; with ``shuffle`` the batches are then
    permuted by ``(seed, epoch, the window's first batch)`` (`_core.shuffle_order`, stream
    ``"bucket"``: ferrofeed's pinned permutation): AllenNLP's bucket sampler over a
    window. A sample that cannot be read sorts last: its error is raised (or skipped) when
    it is loaded.
    """
    first = batch_no
    while first > 0 and plan.window_of(first - 1) == window_no:
        first -= 1
    numbers = []
    j = first
    while j < len(plan) and plan.window_of(j) == window_no:
        numbers.append(j)
        j += 1
    batches = [plan.batch(j) for j in numbers]
    ids = [i for b in batches for i in b]
    keys: list[tuple[int, Any]] = []
    for i in ids:
        try:
            sample = window.sample(i)
        except ShardError:
            keys.append((1, 0))
            continue
        try:
            keys.append((0, key(sample)))
        except Exception as e:
            e.add_note(f"while computing bucket_by of sample {i}")
            raise
    order = sorted(range(len(ids)), key=lambda t: keys[t])
    chunks, at = [], 0
    for b in batches:
        chunks.append([ids[t] for t in order[at : at + len(b)]])
        at += len(b)
    if shuffle and len(chunks) > 1:
        order = _core.shuffle_order(
            len(chunks), seed=seed, epoch=epoch, index=first, stream="bucket"
        )
        chunks = [chunks[k] for k in order]
    return dict(zip(numbers, chunks, strict=True))
