"""A `Mix` as the `DataLoader` reads it: the core's mixture plan over its sources.

`MixSource` makes each epoch's `_core.MixPlan` (one per world of an elastic resume): it
yields each batch's ids and the source each was drawn from. A map-style source's samples
are ``mix[id]`` (its own ``dataset[i]``); a sharded source is read by its own
`ShardSource`, in batches of one sample, pass after pass, each pass planned by the
mixture (its seed, its history of worlds), a window ahead as any sharded source. A group
holds its samples' places (`_MixSamples`), so executors, worker processes and the native
image chain take them as they take any group's.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Generator, Iterator, Sequence
from typing import Any

from . import _core
from ._config import Config
from ._errors import ShardError
from ._group import Carried, Failed, Group, Indexed, Samples, Skipped
from ._images import ImageFiles
from ._mix import Mix
from ._shard_source import ShardSource
from ._shards import ShardedSource
from ._source import ElasticSource, History, check_image_items

__all__ = ["MixSource"]


class MixSource(ElasticSource):
    """A `Mix`, in the order of the core's mixture plan."""

    def __init__(self, mix: Mix, config: Config) -> None:
        super().__init__(mix, config)
        self.mix = mix
        if config.bucket_by is not None:
            raise TypeError("bucket_by= does not apply to a Mix (its batches mix sources)")
        native = self._wants_native()
        if not native:
            for name in ("image", "label"):
                if getattr(config, name) is not None:
                    raise TypeError(f"{name}= names the field for transform=ops.decode_image(...)")
        self._resolve(native)
        if native:
            for k, s in enumerate(mix.sources):
                if not isinstance(s, ShardedSource):
                    check_image_items(s, f"source {k}")
        # A sharded source is read by its own ShardSource, one sample a group: the
        # mixture batches them. It refuses, now, what it cannot read (damaged shards
        # under on_error="raise"); with the native chain it takes the resolved transform.
        part_config = dataclasses.replace(
            config, batch_size=1, drop_last=True, transform=self.transform
        )
        self._parts: list[ShardSource | None] = [
            ShardSource(s, part_config) if isinstance(s, ShardedSource) else None
            for s in mix.sources
        ]
        self._specs: list[int | tuple[list[int], int]] = [
            len(s) if part is None else (list(part.shards._counts), config.shuffle_window)
            for s, part in zip(mix.sources, self._parts, strict=True)
        ]
        self._indexed = Indexed(mix)
        # Refuses, now rather than at the first batch, a mixture it cannot plan.
        self.plan(0)

    def _wants_native(self) -> bool:
        """Whether the native image chain reads it: a native transform, or image files."""
        transform = self.config.transform
        return isinstance(transform, _core.NativeOp) or (
            transform is None and any(isinstance(s, ImageFiles) for s in self.mix.sources)
        )

    def plan(self, epoch: int, start: int = 0, history: History = ()) -> _core.MixPlan:
        """Return the core's plan of ``epoch`` for this rank, from batch ``start``."""
        c, mix = self.config, self.mix
        stop: str | int = mix.stop if mix.samples_per_epoch is None else mix.samples_per_epoch
        return _core.MixPlan(
            self._specs,
            list(mix.weights),
            stop,
            c.batch,
            epoch=epoch,
            **c.plan_args(),
            history=list(history),
            start=start,
        )

    def groups(self, epoch: int, start: int, history: History) -> Iterator[Group]:
        """Return the plan's groups from ``start`` (the plan is made now)."""
        plan = self.plan(epoch, start, history)
        return self._read(plan, epoch)

    def _read(self, plan: _core.MixPlan, epoch: int) -> Iterator[Group]:
        """The plan's groups; a sharded source's samples read by its own plan, in order."""
        counts = plan.counts_at(plan.start * self.config.batch)
        streams = {
            k: _PartStream(part, plan, k, counts[k], epoch, self.mix._offsets[k])
            for k, part in enumerate(self._parts)
            if part is not None and self.mix.weights[k] > 0
        }
        indexed = self._indexed
        try:
            for batch_no, ids, parts in plan:
                placed: dict[int, tuple[Samples, int]] = {}
                if streams:
                    for i, k in zip(ids, parts, strict=True):
                        stream = streams.get(k)
                        if stream is not None:
                            placed[i] = stream.take(i)
                yield Group(batch_no, ids, _MixSamples(indexed, placed))
        finally:
            for stream in streams.values():
                stream.close()

    def state(self, history: History) -> dict[str, Any]:
        """Return the mixture's description and the epoch's elastic history."""
        mix = self.mix
        sources = []
        for s, spec in zip(mix.sources, self._specs, strict=True):
            if isinstance(spec, int):
                sources.append({"kind": "map", "samples": spec})
            else:
                counts = spec[0]
                digest = hashlib.blake2b(
                    b"".join(n.to_bytes(8, "little") for n in counts), digest_size=8
                ).hexdigest()
                sources.append(
                    {
                        "kind": type(s).__name__,
                        "samples": sum(counts),
                        "shards": len(counts),
                        "counts_digest": digest,
                    }
                )
        return {
            "mix": {
                "sources": sources,
                "weights": list(mix.weights),
                "stop": mix.stop,
                "samples_per_epoch": mix.samples_per_epoch,
                "shuffle_window": self.config.shuffle_window,
            },
            "history": [list(h) for h in history],
        }

    def checked_keys(self) -> list[str]:
        """Return the mixture (the world may differ: an elastic resume)."""
        return ["mix"]

    def stats(
        self, epoch: int, history: History, done: int, skipped: Sequence[tuple[int, str]]
    ) -> dict[str, Any]:
        """Return each source's figures, and the sharded ones' remote counters and damage.

        ``sources[k]``: its ``weight``, the ``samples`` it gave this rank in ``epoch`` up
        to the loader's position, and the samples of it ``skipped`` so far.
        """
        plan = self.plan(epoch, 0, history)
        drawn = plan.drawn(min(done * self.config.batch, plan.samples))
        failed = [0] * len(self.mix.sources)
        for index, _ in skipped:
            failed[self.mix.locate(index)[0]] += 1
        remote: dict[str, Any] = {}
        damaged: list[tuple[str, str]] = []
        for part in self._parts:
            if part is not None:
                figures = part.stats(epoch, history, done, skipped)
                for key, value in figures["remote"].items():
                    remote[key] = remote.get(key, 0) + value
                damaged.extend(figures["skipped_shards"])
        sources = [
            {"source": k, "kind": type(s).__name__, "weight": w, "samples": n, "skipped": f}
            for k, (s, w, n, f) in enumerate(
                zip(self.mix.sources, self.mix.weights, drawn, failed, strict=True)
            )
        ]
        return {"remote": remote, "skipped_shards": damaged, "sources": sources}


class _PartStream:
    """A sharded source's samples in a mixture, in its own order, pass after pass.

    Each pass is the source's `ShardSource` reading the plan the mixture gives it (the
    pass's seed and history of worlds, batches of one sample), a window ahead.
    """

    def __init__(
        self, part: ShardSource, plan: _core.MixPlan, k: int, n: int, epoch: int, offset: int
    ) -> None:
        self.part, self.plan, self.k, self.epoch = part, plan, k, epoch
        self.offset, self.total = offset, plan.total
        self.pass_, j = plan.locate(k, n)
        self.groups = self._open(j)

    def _open(self, j: int) -> Generator[Group, None, None]:
        plan, k, q = self.plan, self.k, self.pass_
        shard_plan = self.part.plan(
            self.epoch, j, plan.pass_history(k, q), seed=plan.pass_seed(k, q)
        )
        return self.part.read(shard_plan, self.epoch, read_ahead=False)

    def take(self, index: int) -> tuple[Samples, int]:
        """Return the next sample's window and id there, checked to be sample ``index``."""
        group = next(self.groups, None)
        while group is None:
            # The pass is over: the next one, from its start.
            self.groups.close()
            self.pass_ += 1
            self.groups = self._open(0)
            group = next(self.groups, None)
        (local,) = group.ids
        expected = self.pass_ * self.total + self.offset + local
        if expected != index:
            raise RuntimeError(
                f"the mixture's plan drew sample {index} where source {self.k}'s own plan "
                f"gives {expected}: a bug in ferrofeed, please report it"
            )
        return group.samples, local

    def close(self) -> None:
        """Stop reading (the window reads in flight are dropped)."""
        self.groups.close()


class _MixSamples:
    """A mixture batch's samples, each where its source keeps it.

    A map-style source's by index in the `Mix`; a sharded source's in its window
    (``placed``: index -> (window, id in its source)).
    """

    def __init__(self, indexed: Indexed, placed: dict[int, tuple[Samples, int]]) -> None:
        self.indexed = indexed
        self.placed = placed

    def get(self, index: int) -> Any:
        """Return sample ``index``: from its window, or ``mix[index]``."""
        place = self.placed.get(index)
        if place is None:
            return self.indexed.get(index)
        samples, local = place
        return samples.get(local)

    def shipped(self, ids: list[int]) -> Samples:
        """Return these samples as a worker gets them.

        A sharded source's are carried along; a map-style source's are found in the
        worker's own copy of the `Mix`.
        """
        carried: dict[int, Any] = {}
        for i in ids:
            place = self.placed.get(i)
            if place is not None:
                try:
                    carried[i] = place[0].get(place[1])
                except ShardError as e:
                    carried[i] = Failed(e)
        bag = Carried(carried)
        return _MixSamples(self.indexed, {i: (bag, i) for i in carried})

    def native(self, batch_no: int, ids: list[int], skip: bool) -> tuple[_core._PlanGroup, Skipped]:
        """Return the batch op's group, and the samples left out.

        Each source's part is made as its source makes it, then merged in the batch's
        order.
        """
        placed = self.placed
        parts: list[tuple[_core._PlanGroup, int]] = []
        skipped: Skipped = []
        indexed = [i for i in ids if i not in placed]
        if indexed:
            parts.append((self.indexed.native(batch_no, indexed, skip)[0], 0))
        windows: dict[int, tuple[Samples, int, list[int]]] = {}
        for i in ids:
            place = placed.get(i)
            if place is not None:
                samples, local = place
                entry = windows.setdefault(id(samples), (samples, i - local, []))
                entry[2].append(local)
        for samples, offset, local_ids in windows.values():
            group, left_out = samples.native(batch_no, local_ids, skip)
            parts.append((group, offset))
            skipped.extend((local + offset, reason) for local, reason in left_out)
        return _core._PlanGroup.merge(batch_no, ids, parts), skipped
