"""Type stubs of the compiled core: what the sources read and their order.

The arena (a `SharedList`'s file), the plans (an epoch's order), shuffles and seeds, and the
sharded sources (windows, object storage, the sample index, the pack).

Stub-only: the names are `ferrofeed._core`'s, and `_core.pyi` re-exports them.
"""

from collections.abc import Callable, Iterable, Iterator, Sequence
from os import PathLike
from typing import Any, Literal, Self, final

class Arena:
    """A memory-mapped arena of pickled items (the engine behind `ferrofeed.SharedList`)."""

    def __new__(cls, items: Iterable[Any], /, *, path: str | PathLike[str] | None = None) -> Self:
        """Build an arena from ``items`` (see `ferrofeed.SharedList`)."""
    @classmethod
    def open(cls, path: str | PathLike[str]) -> Self:
        """Map an existing arena read-only (not owned)."""
    def __len__(self) -> int: ...
    def __getitem__(self, index: int | slice, /) -> Any: ...
    def __iter__(self) -> Iterator[Any]: ...
    def raw(self, index: int) -> memoryview:
        """Return item ``index``'s stored bytes, zero-copy and read-only."""
    def span(self, index: int) -> tuple[int, int]:
        """Return ``(start, end)`` of item ``index`` within `memoryview`."""
    def memoryview(self) -> memoryview:
        """Return a read-only view of the whole file."""
    def header(self) -> dict[str, int]:
        """Return the header fields and layout."""
    def close(self) -> None:
        """Unmap (once no view remains) and, in the owner, remove the file."""
    def _unlink(self) -> None:
        """In the owner, remove the file now but keep the mapping (internal)."""
    @property
    def path(self) -> str:
        """The file's path."""
    @property
    def nbytes(self) -> int:
        """Size of the file in bytes."""
    @property
    def owner(self) -> bool:
        """Whether this process created the arena (and removes its file)."""
    @property
    def closed(self) -> bool:
        """Whether `close` was called."""

@final
class _OpenRequest:
    """A request to map an existing arena (internal; made by `Arena.open`)."""

@final
class _ArenaBuffer:
    """The whole mapping, exported read-only through the buffer protocol (internal)."""

def sweep(dir: str | PathLike[str]) -> list[str]:
    """Remove the arenas in ``dir`` that no process holds any more."""

def default_arena_dir() -> str:
    """Return the directory new arenas go to when no path is given."""

@final
class Permutation:
    """A seekable pseudo-random permutation of ``range(n)`` keyed by ``(seed, epoch)``."""

    def __new__(
        cls, n: int, *, seed: int = 0, epoch: int = 0, shuffle: bool = True
    ) -> Permutation: ...
    def __len__(self) -> int: ...
    def __getitem__(self, i: int, /) -> int: ...
    def take(self, start: int, end: int, stride: int = 1) -> list[int]:
        """Return the elements at ``start, start + stride, ...`` below ``end``, modulo len."""

def shuffle_order(
    n: int,
    *,
    seed: int,
    epoch: int,
    index: int,
    stream: Literal["shards", "window", "bucket"],
) -> list[int]:
    """Return the order of ``range(n)`` item ``index`` draws in ``epoch`` (pinned).

    The permutation of `Permutation`, keyed by ``mix_seed(seed, epoch, index, stream)``: a
    sharded source's ``bucket_by`` orders a window's batches with it (``stream="bucket"``,
    ``index`` the window's first batch).

    Example:
        >>> from ferrofeed import _core
        >>> _core.shuffle_order(8, seed=0, epoch=0, index=0, stream="bucket")
        [1, 2, 5, 6, 7, 3, 4, 0]
    """

@final
class _ShuffleBuffer(Iterator[Any]):
    """``items`` shuffled through a buffer of ``window`` items (internal; pinned).

    Once the buffer is full, each item read takes the place of one drawn from the buffer,
    which is yielded; at the end the rest comes in a random order. The draws come from
    ``mix_seed(seed, epoch, index, "buffer")`` (``index``: the worker reading the stream).
    An error of ``items`` is raised and ends the iteration.
    """

    def __new__(
        cls, items: Iterable[Any], window: int, *, seed: int, epoch: int, index: int
    ) -> _ShuffleBuffer: ...
    def __iter__(self) -> _ShuffleBuffer: ...
    def __next__(self) -> Any: ...

@final
class EpochPlan:
    """One epoch's batches on one rank: numbered groups of dataset indices.

    The loader's order in one place: pass ``p`` over the data reads it in the order of a
    permutation keyed by ``(seed, p)`` (or in order without ``shuffle``); rank ``r`` takes
    positions ``r, r + W, ...`` of it (wrapping round to pad, or cut with ``drop_last``);
    a rank's share is cut into batches; with ``batches_per_epoch`` an epoch has that many
    and continues where the last one stopped. Iterating yields ``(batch_no, indices)``
    from batch ``start`` (the resume point) to the end.

    Example:
        >>> from ferrofeed import _core
        >>> list(_core.EpochPlan(5, 2))
        [(0, [0, 1]), (1, [2, 3]), (2, [4])]
    """

    def __new__(
        cls,
        len: int,
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        epoch: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        batches_per_epoch: int | None = None,
        start: int = 0,
    ) -> EpochPlan: ...
    def __len__(self) -> int:
        """Return the batches in the whole epoch (those before ``start`` included)."""
    def __iter__(self) -> Iterator[tuple[int, list[int]]]: ...
    @property
    def epoch(self) -> int:
        """The epoch."""
    @property
    def start(self) -> int:
        """The first batch the plan yields (the resume point)."""
    @property
    def remaining(self) -> int:
        """Batches from ``start`` to the end of the epoch."""
    @property
    def samples_per_rank(self) -> int:
        """Samples each rank reads per pass over the data."""
    @property
    def batches_per_pass(self) -> int:
        """Batches each rank yields per pass over the data."""
    def batch(self, batch_no: int) -> list[int]:
        """Return the dataset indices of batch ``batch_no`` of the epoch."""
    def batch_len(self, batch_no: int) -> int:
        """Return the number of samples in batch ``batch_no`` of the epoch."""

@final
class _PlanGroup:
    """A group of an epoch plan for the DataLoader's batch op (internal).

    ``items`` (paths or bytes, with labels) are made native when it is made; a pipeline's
    source hands the group to the op without the GIL.
    """

    def __new__(cls, batch_no: int, indices: Sequence[int], items: Iterable[Any]) -> Self: ...
    @staticmethod
    def merge(
        batch_no: int, ids: Sequence[int], parts: Sequence[tuple[_PlanGroup, int]]
    ) -> _PlanGroup:
        """Return one group of the parts' items, in the order of ``ids``.

        Each part's indices plus its offset are some of ``ids``; an id no part holds is
        left out; each part is used up.
        """

@final
class EpochPlanIterator:
    """The iterator of an `EpochPlan`."""

    def __iter__(self) -> Self: ...
    def __next__(self) -> tuple[int, list[int]]: ...

@final
class ShardPlan:
    """One epoch's batches of a sharded source on one rank (see ``src/plan/sharded.rs``).

    The shards, permuted by ``(seed, epoch)`` (stored order without ``shuffle``), laid
    end to end; rank ``r`` takes a contiguous range of that stream; every rank yields the
    same number of batches without repeating a sample (full batches, then batches short
    by one at the end of a rank with fewer samples; ``drop_last``: ``N // W`` samples per
    rank in full batches); a rank's range is cut into windows of ``window`` samples (a
    multiple of the batch size), each permuted by ``(seed, epoch, window)``. ``history``
    lists the ``(world_size, batches_done)`` of the worlds the epoch ran on before (an
    elastic resume). Iterating yields ``(batch_no, window, ids)`` from ``start``; ids are
    positions in the shards' stored order, counted across shards.

    Example:
        >>> from ferrofeed import _core
        >>> [ids for _, _, ids in _core.ShardPlan([2, 3], 2)]
        [[0, 1], [2, 3], [4]]
    """

    def __new__(
        cls,
        counts: Sequence[int],
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        epoch: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        window: int = 1024,
        history: Sequence[tuple[int, int]] = ...,
        start: int = 0,
    ) -> ShardPlan: ...
    def __len__(self) -> int:
        """Return the batches of this rank's share (those before ``start`` included)."""
    def __iter__(self) -> ShardPlanIterator: ...
    @property
    def epoch(self) -> int:
        """The epoch."""
    @property
    def start(self) -> int:
        """The first batch the plan yields (the resume point)."""
    @property
    def samples(self) -> int:
        """Samples this rank yields in the current world."""
    @property
    def remaining(self) -> int:
        """Samples left to all ranks of the current world."""
    @property
    def window(self) -> int:
        """Samples per window (a multiple of the batch size)."""
    @property
    def windows(self) -> int:
        """Windows in this rank's share."""
    def window_of(self, batch_no: int) -> int:
        """Return the window batch ``batch_no`` lies in."""
    def window_pieces(self, window: int) -> list[tuple[int, int, int]]:
        """Return ``(shard, lo, hi)`` of each piece of shards window ``window`` holds."""
    def batch(self, batch_no: int) -> list[int]:
        """Return the global ids of batch ``batch_no``'s samples."""

@final
class MixPlan:
    """One epoch's batches of a `ferrofeed.Mix` on one rank (see ``src/plan/mix.rs``).

    ``parts``: each source as its length (map-style) or ``(shard counts, window)``
    (sharded); ``stop``: ``"shortest"``, ``"longest"`` or a number of samples across
    ranks. Each position of the epoch draws from one part by a low-discrepancy
    interleave of the weights keyed by ``(seed, epoch, segment)``; each part is read in
    its own order, pass after pass (``pass_seed``, ``pass_history``). Iterating yields
    ``(batch_no, ids, parts)`` from ``start``; an id is ``pass * total + the part's
    offset + the sample's index in its part``.

    Example:
        >>> from ferrofeed import _core
        >>> plan = _core.MixPlan([4, 2], [2.0, 1.0], "shortest", 3)
        >>> [(ids, parts) for _, ids, parts in plan]
        [([0, 1, 4], [0, 0, 1]), ([2, 3, 5], [0, 0, 1])]
    """

    def __new__(
        cls,
        parts: Sequence[int | tuple[Sequence[int], int]],
        weights: Sequence[float],
        stop: str | int,
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        epoch: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        history: Sequence[tuple[int, int]] = ...,
        start: int = 0,
    ) -> MixPlan: ...
    def __len__(self) -> int:
        """Return the batches of the current world (those before ``start`` included)."""
    def __iter__(self) -> MixPlanIterator: ...
    @property
    def epoch(self) -> int:
        """The epoch."""
    @property
    def start(self) -> int:
        """The first batch the plan yields (the resume point)."""
    @property
    def samples(self) -> int:
        """Samples a rank draws in the current world."""
    @property
    def total(self) -> int:
        """The samples of all parts (pass ``q``'s ids start at ``q * total``)."""
    def batch(self, batch_no: int) -> list[int]:
        """Return the ids of batch ``batch_no``."""
    def counts_at(self, p: int) -> list[int]:
        """Return how many samples each part gave before position ``p`` of this world."""
    def drawn(self, p: int) -> list[int]:
        """Return each part's samples before position ``p``, earlier worlds included."""
    def locate(self, part: int, n: int) -> tuple[int, int]:
        """Return ``(pass, position in the pass)`` of part ``part``'s ``n``-th sample."""
    def pass_seed(self, part: int, pass_no: int) -> int:
        """Return the seed of pass ``pass_no`` over part ``part``."""
    def pass_history(self, part: int, pass_no: int) -> list[tuple[int, int]]:
        """Return the ``(world_size, samples per rank)`` worlds of that pass before this."""

@final
class MixPlanIterator:
    """The iterator of a `MixPlan`."""

    def __iter__(self) -> Self: ...
    def __next__(self) -> tuple[int, list[int], list[int]]: ...

@final
class ShardPlanIterator:
    """The iterator of a `ShardPlan`."""

    def __iter__(self) -> Self: ...
    def __next__(self) -> tuple[int, int, list[int]]: ...

@final
class _ShardReader:
    """Counts a sharded source's shards and reads windows of them, in Rust (internal)."""

    def __new__(
        cls,
        kind: Literal["tar", "jsonl", "parquet", "mds"],
        paths: Sequence[str],
        columns: Sequence[str] | None = None,
        remote: _RemoteShards | None = None,
        decode: bool = True,
        offsets: Sequence[tuple[Sequence[int], int] | None] | None = None,
    ) -> Self: ...
    def count(
        self, threads: int
    ) -> list[tuple[int, str | None, str | None, tuple[str, str] | None]]:
        """Return ``(samples, first_key, last_key, damage)`` of every shard.

        Counted on ``threads`` threads; ``damage`` is ``(at, message)`` for a shard counted up
        to where it breaks off.
        """
    def read(
        self, pieces: Sequence[tuple[int, int, int]], first_ids: Sequence[int]
    ) -> _ShardWindow:
        """Return the samples of ``pieces`` (``(shard, lo, hi)``) as a window."""
    @property
    def ranged(self) -> bool:
        """Whether windows fetch their samples' byte ranges (remote, with an index)."""
    @property
    def kept(self) -> tuple[int, int]:
        """``(pieces served, bytes held)`` of the fetched pieces kept for later windows."""
    @property
    def paths(self) -> list[str]:
        """The shards' paths."""

@final
class _ShardFeed:
    """A sharded source's windows, read ahead of its batches in the core (internal)."""

    def __new__(cls, reader: _ShardReader, located: list[str] = ...) -> Self: ...
    def epoch(self, plan: ShardPlan, read_ahead: bool = True) -> _ShardEpoch:
        """Return ``plan``'s batches from its start, each with its window, read a window ahead."""
    @property
    def reads(self) -> int:
        """Window reads started so far."""
    @property
    def ahead(self) -> list[tuple[int, int, int]] | None:
        """The pieces of the window read ahead for the next epoch, until an epoch takes it."""

@final
class _ShardEpoch(Iterator[tuple[int, int, list[int], _ShardWindow]]):
    """One epoch of a `_ShardFeed`: ``(batch_no, window_no, ids, window)`` (internal)."""

    def __next__(self) -> tuple[int, int, list[int], _ShardWindow]: ...
    def close(self) -> None:
        """End the epoch: reads not started are cancelled."""

@final
class _RemoteShards:
    """A source's shards in object storage, fetched ahead and cached, in Rust (internal)."""

    def __new__(
        cls,
        objects: Sequence[tuple[str, int, str | None]],
        storage_options: Sequence[tuple[str, str]],
        prefetch_bytes: int,
        part_size: int,
        concurrency: int,
        cache_dir: str | None = None,
        cache_limit: int = 0,
    ) -> Self: ...
    def prefetch(self, order: Sequence[int], append: bool = False) -> None:
        """Set the shards the reader wants next, in order, and fetch ahead."""
    @property
    def objects(self) -> list[tuple[str, int, str | None]]:
        """``(url, size, etag)`` of every shard."""

def _remote_objects(
    patterns: Sequence[str], storage_options: Sequence[tuple[str, str]]
) -> list[tuple[str, int, str | None]]:
    """Return ``(url, size, etag)`` of the objects the URLs and globs name, in order."""

def _remote_defaults() -> tuple[int, int, int]:
    """Return a source's remote defaults: ``(prefetch_bytes, part_size, concurrency)``."""

def _swap_sample(sample: tuple[int, int, int] | None) -> tuple[int, int, int] | None:
    """Set the sample ``(seed, epoch, index)`` this thread loads; return the old one."""

def _remote_get(url: str, storage_options: Sequence[tuple[str, str]]) -> bytes:
    """Return the object ``url``'s bytes, whole."""

def _remote_environment(url: str) -> list[tuple[str, str]]:
    """Return the environment variables locating ``url``'s store, as ``(env:NAME, value)``."""

def _remote_stats() -> dict[str, Any]:
    """Return this process's counters of remote reads."""

_IndexEntry = tuple[
    str, int, str | None, int | None, int, str | None, str | None, list[int] | None, int | None
]

def _read_index(data: bytes, what: str) -> tuple[list[_IndexEntry], bool]:
    """Return a sample index's entries, checked, and whether a pack wrote it.

    An entry: ``(name, size, etag, mtime_ns, samples, first_key, last_key, offsets, end)``.
    """

def _write_index(
    dest: str, entries: Sequence[_IndexEntry], storage_options: Sequence[tuple[str, str]] = ...
) -> str:
    """Write the sample index of ``entries`` into the folder or prefix ``dest``; return it."""

def _scan_shards(
    reader: _ShardReader, threads: int
) -> list[tuple[int, str | None, str | None, list[int] | None, int | None]]:
    """Return ``(samples, first_key, last_key, offsets, end)`` of each tar shard."""

@final
class _Packer:
    """The pack's writer, in Rust (internal: `ferrofeed.write_shards` drives it)."""

    def __new__(
        cls,
        dest: str,
        *,
        format: str,
        shard_size: int | None,
        samples_per_shard: int | None,
        workers: int,
        on_error: str,
        resize: int | None,
        quality: int,
        prefix: str,
        class_names: Sequence[str] | None,
        storage_options: Sequence[tuple[str, str]],
        input: str,
    ) -> Self: ...
    @property
    def resume_at(self) -> int:
        """The input position the pack goes on from (0 for a new pack)."""
    @property
    def complete(self) -> bool:
        """Whether the destination holds this whole pack already."""
    def progress(self) -> tuple[int, int, int, int, int]:
        """Return ``(done, samples, bytes, skipped, shards)``."""
    def add(
        self,
        samples: Sequence[
            tuple[str | None, str | None, Sequence[tuple[str, bytes | str | int | float]]]
        ],
        first: int,
    ) -> None:
        """Pack the next samples ``(key, path, fields)``, the first at position ``first``."""
    def add_files(
        self,
        paths: Sequence[str],
        stored: Sequence[str],
        labels: Sequence[int] | None,
        report: Callable[[int, int, int, int, int], object] | None = None,
    ) -> None:
        """Pack image files from where the pack resumes, reporting progress now and then."""
    def finish(self) -> dict[str, Any]:
        """Finish the pack (the last shard, the index); return its summary."""
    def abort(self) -> None:
        """Drop the pack unfinished: the shard being written is removed, finished ones kept."""

@final
class _ShardWindow:
    """The samples of one window of a sharded source, held in Rust (internal)."""

    def __len__(self) -> int: ...
    def sample(self, id: int) -> Any:
        """Return sample ``id`` as Python objects; raise its error if it could not be read."""
    def plan_group(
        self,
        batch_no: int,
        ids: Sequence[int],
        image: Sequence[str],
        label: str | None = None,
        skip: bool = False,
    ) -> tuple[_PlanGroup, list[tuple[int, str]]]:
        """Return the native group of a batch, and the samples left out under ``skip``."""

def sample_seed(seed: int, epoch: int, index: int) -> int:
    """Return the seed of one sample's random augmentations (fixed, pinned mixing)."""

def mix_seed(
    seed: int,
    epoch: int,
    index: int,
    stream: Literal["sample", "crop", "flip", "shards", "window", "bucket", "buffer"],
) -> int:
    """Return the seed of item ``index``'s draws of kind ``stream`` (ferrofeed's one mixer).

    ``mix_seed(s, e, i, "sample") == sample_seed(s, e, i)``; the values are pinned forever.

    Example:
        >>> from ferrofeed import _core
        >>> _core.mix_seed(0, 0, 0, "sample")
        16894410173589626229
    """

def crop_seed(seed: int, epoch: int, index: int) -> int:
    """Return the seed of one image's random crop and flip: the one crop-seed rule.

    ``mix_seed(seed, epoch, index, "crop")``. In a `DataLoader`: the loader's seed, the
    epoch and the sample's dataset index, whichever chain, thread or worker makes the
    image; in a pipeline: ``ops.decode_image``'s seed, the epoch and the item's position;
    in ``io.load_images(seed=s)``: ``(s, 0, position in the batch)``.

    Example:
        >>> from ferrofeed import _core
        >>> _core.crop_seed(7, 1, 3) == _core.mix_seed(7, 1, 3, "crop")
        True
    """
