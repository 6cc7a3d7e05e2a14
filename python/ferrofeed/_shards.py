"""Sharded sources: WebDataset tar shards, Parquet files and JSON lines, read in Rust.

A sharded source counts its shards once, when it is made (tar headers, Parquet footers,
lines), and is then read in order, a window of samples at a time, never per sample. On its
own it iterates its samples in stored order; given to a `DataLoader`, it is ordered by the
core's sharded plan (`_core.ShardPlan`: shards permuted per epoch, a contiguous range of
them per rank, windows shuffled) and read a window ahead on a thread of its own. The bytes
stay in Rust until a Python transform asks for a sample, and with the native image chain
they go from the shard to the decode without becoming Python objects.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar, Literal

from . import _core, _remote, _shard_index
from ._errors import ShardCorruptError

__all__ = [
    "JsonLines",
    "MDSShards",
    "ParquetShards",
    "ShardedSource",
    "TarShards",
    "expand_shards",
]

Urls = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]

# Samples read at a time when a source is iterated on its own.
_ITER_CHUNK = 1024

_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(\d+)\.\.(\d+)$")


def _braces(pattern: str) -> list[str]:
    """Expand the first ``{a..b}`` range or ``{x,y}`` list of ``pattern``, recursively.

    A range keeps the zero padding of its first bound (``{000..012}``: 000, 001, ...).
    """
    m = _BRACE.search(pattern)
    if m is None:
        return [pattern]
    head, body, tail = pattern[: m.start()], m.group(1), pattern[m.end() :]
    r = _RANGE.match(body)
    if r is not None:
        lo, hi = int(r.group(1)), int(r.group(2))
        if hi < lo:
            raise ValueError(f"{pattern!r}: the range {{{body}}} runs backwards")
        width = len(r.group(1))
        parts = [str(i).zfill(width) for i in range(lo, hi + 1)]
    elif "," in body:
        parts = body.split(",")
    else:
        raise ValueError(f"{pattern!r}: {{{body}}} is neither a range a..b nor a list x,y")
    return [p for part in parts for p in _braces(head + part + tail)]


def _patterns(urls: Urls) -> list[str]:
    """``urls`` as a list of patterns, brace ranges and lists expanded (globs kept)."""
    items = [urls] if isinstance(urls, str | os.PathLike) else list(urls)
    if not items:
        raise ValueError("no shards given")
    return [p for item in items for p in _braces(os.fspath(item))]


def expand_shards(urls: Urls, *, storage_options: Mapping[str, str] | None = None) -> list[str]:
    """The shard paths (or URLs) that ``urls`` names, in the order given.

    ``urls`` is a path, a URL, a pattern or a list of them. A pattern may hold brace ranges
    (``train-{000000..000099}.tar``, zero padding kept) or lists (``{train,val}``) and glob
    wildcards (``*``, ``?``, ``[...]``: matches sorted by name; in a URL they do not cross a
    ``/``, and the directory is listed once). A pattern that names nothing is an error,
    naming it. URLs are looked up in their store (``storage_options`` as for `TarShards`).

    Example:
        >>> expand_shards("shard-{0..2}.tar")  # doctest: +SKIP
        ['shard-0.tar', 'shard-1.tar', 'shard-2.tar']
    """
    patterns = _patterns(urls)
    remote = [_remote.is_url(p) for p in patterns]
    if any(remote):
        _all_or_none(patterns, remote)
        config = _remote.RemoteConfig(storage_options=dict(storage_options or {}))
        return [url for url, _, _ in _remote.list_objects(patterns, config)]
    out: list[str] = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = sorted(glob.glob(pattern))
            if not matches:
                raise FileNotFoundError(f"no shard matches {pattern!r}")
            out.extend(matches)
        else:
            if not os.path.exists(pattern):
                raise FileNotFoundError(f"shard {pattern!r} does not exist")
            out.append(pattern)
    return out


def _all_or_none(patterns: list[str], remote: list[bool]) -> None:
    """Refuse a source that mixes URLs and local paths."""
    if not all(remote):
        local = patterns[remote.index(False)]
        url = patterns[remote.index(True)]
        raise ValueError(
            f"a source's shards are all URLs or all local paths: {url!r} and {local!r} mix them"
        )


class ShardedSource:
    """What `TarShards`, `ParquetShards` and `JsonLines` share.

    ``len(source)`` is its samples, ``source.shards`` its ``(path, samples)`` in stored
    order, and iterating it yields the samples in stored order (a window of them read at a
    time, in Rust). Pass it to `DataLoader` for shuffled, sharded, resumable batches.

    A `DataLoader` reads a sharded source in order, a window at a time, never per sample.
    The rule (the core's ``ShardPlan``): every epoch permutes the shards by ``(seed,
    epoch)`` and lays them end to end; rank ``r`` takes a contiguous range of that stream
    (``N // world_size`` samples, one more for the first ``N % world_size`` ranks), so it
    reads about its share of the bytes; every rank yields the same number of batches,
    ``ceil(ceil(N / world_size) / batch_size)``, each sample exactly once (a rank with a
    sample less gives one up from its last batches; with ``drop_last``, every rank takes
    ``N // world_size`` samples in full batches); a rank's range is cut into windows of
    ``shuffle_window`` samples, each shuffled and cut into batches. The order depends on
    ``(seed, epoch)``, the shards and the world, never on ``num_threads`` or
    ``num_workers``. `DataLoader.state_dict` resumes exactly, and a state loaded into a
    loader of another world size (rank 0's, in every rank) finishes the epoch with every
    remaining sample exactly once.
    """

    _kind: ClassVar[Literal["tar", "jsonl", "parquet", "mds"]]

    def __init__(
        self,
        urls: Urls,
        *,
        columns: Sequence[str] | None = None,
        decode: bool = True,
        count_threads: int | None = None,
        storage_options: Mapping[str, str] | None = None,
        prefetch_bytes: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
        index: bool | None = None,
        _counted: list[_remote.Counted] | None = None,
        _objects: list[_remote.Listed] | None = None,
        _config: _remote.RemoteConfig | None = None,
    ) -> None:
        self._columns = list(columns) if columns is not None else None
        self._decode = decode
        # Remote shards: how they are reached, `(url, size, etag)` of each, and the Rust side.
        self._config = _config
        self._objects = _objects
        self._remote: _core._RemoteShards | None = None
        # Each remote tar shard's sample offsets, from its folder's index: windows then
        # fetch their samples' bytes alone (see _shard_index).
        self._sample_offsets: list[_shard_index.Offsets] | None = None
        use_index = self._kind == "tar" and index is not False and _counted is None
        if _objects is None:
            patterns = _patterns(urls)
            flags = [_remote.is_url(p) for p in patterns]
            if any(flags):
                _all_or_none(patterns, flags)
            self._config = _remote.RemoteConfig.of(
                any(flags), storage_options, prefetch_bytes, cache_dir, cache_limit
            )
        if self._config is not None:
            config = self._config
            # The shards counting fetched (tar and JSON lines: whole) stay in memory within
            # prefetch_bytes, so when counting covered them all, the source reads through
            # the same _RemoteShards and its first epoch does not fetch them again.
            counted_with: list[tuple[list[_remote.Listed], _core._RemoteShards]] = []
            if _objects is None:

                def count(objects: list[_remote.Listed]) -> list[_remote.Counted]:
                    # A Parquet file is counted from its footer; a tar or JSON lines shard
                    # is fetched whole, and each counting thread holds one in memory.
                    most = 16 if self._kind == "parquet" else 4
                    threads = count_threads or min(most, len(objects))
                    shards = config.shards(objects)
                    counted_with.append((objects, shards))
                    urls = [u for u, _, _ in objects]
                    reader = _core._ShardReader(self._kind, urls, self._columns, shards)
                    return reader.count(threads)

                def lister(
                    patterns: Sequence[str],
                ) -> tuple[list[_remote.Listed], _shard_index.Indexed | None]:
                    return _shard_index.remote(patterns, config, required=index is True)

                self._objects, _counted, self._sample_offsets = _remote.resolve(
                    self._kind,
                    self._columns,
                    patterns,
                    config,
                    count,
                    lister if use_index else None,
                )
            assert self._objects is not None
            self._paths = [u for u, _, _ in self._objects]
            if counted_with and counted_with[0][0] == self._objects:
                self._remote = counted_with[0][1]
            else:
                self._remote = config.shards(self._objects)
        else:
            self._paths = expand_shards(urls) if _objects is None else []
            found = _shard_index.local(self._paths, required=index is True) if use_index else None
            if found is not None:
                _counted = found.counted
        self._reader = _core._ShardReader(
            self._kind,
            self._paths,
            self._columns,
            self._remote,
            self._decode,
            self._sample_offsets,
        )
        if _counted is None:
            threads = count_threads or min(8, os.cpu_count() or 2, len(self._paths))
            _counted = self._reader.count(threads)
        self._counted = _counted
        self._counts = [n for n, *_ in _counted]
        self._offsets: list[int] = []
        total = 0
        for n in self._counts:
            self._offsets.append(total)
            total += n
        self._len = total
        damaged = self.damaged
        if damaged and total == 0:
            raise damaged[0]  # nothing at all is readable: not a source to skip through
        self._check_splits()

    def _check_splits(self) -> None:
        """Refuse a sample whose members straddle two shards (tar only: keys are equal)."""
        for k in range(1, len(self._paths)):
            a, b = self._paths[k - 1], self._paths[k]
            last, first = self._counted[k - 1][2], self._counted[k][1]
            if last is not None and last == first:
                raise ShardCorruptError(
                    f"{b}: sample {first} is split across shards: its members are at the end "
                    f"of {a} and at the start of {b} (pack every sample's members into one "
                    "shard)",
                    b,
                    f"sample {first}",
                )

    @property
    def damaged(self) -> list[ShardCorruptError]:
        """The errors of the shards whose content breaks off (truncated, corrupt), in order.

        Counting stops at the damage: such a shard's samples are those complete before it.
        (A source with no readable sample at all is refused when made, with the first.)
        A `DataLoader` with ``on_error="raise"`` refuses the source with the first of these
        errors; with ``on_error="skip"`` it reads the samples before the damage and every
        other shard, and counts the damaged shards in ``stats()["skipped_shards"]``.
        Iterating the source on its own yields the samples before the damage, then raises.
        """
        return [
            ShardCorruptError(message, self._paths[k], at)
            for k, (*_, damage) in enumerate(self._counted)
            if damage is not None
            for at, message in [damage]
        ]

    # -- the public face ------------------------------------------------------------------

    def __len__(self) -> int:
        return self._len

    @property
    def shards(self) -> list[tuple[str, int]]:
        """``(path or URL, samples)`` of every shard, in stored order."""
        return list(zip(self._paths, self._counts, strict=True))

    @property
    def _ranged(self) -> bool:
        """Whether windows fetch their samples' byte ranges (remote, with an index)."""
        return self._reader.ranged

    def __iter__(self) -> Iterator[Any]:
        if self._remote is not None and not self._ranged:
            self._remote.prefetch(list(range(len(self._counts))))
        for shard, n in enumerate(self._counts):
            for lo in range(0, n, _ITER_CHUNK):
                hi = min(n, lo + _ITER_CHUNK)
                window = self._window([(shard, lo, hi)])
                first = self._offsets[shard] + lo
                for i in range(first, first + hi - lo):
                    yield window.sample(i)
            damage = self._counted[shard][3]
            if damage is not None:
                at, message = damage
                raise ShardCorruptError(message, self._paths[shard], at)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self._paths)} shards, {self._len} samples)"

    def __reduce__(self) -> tuple[Any, ...]:
        # To worker processes (spawn) without listing or counting the shards again.
        return (
            _restore,
            (
                type(self),
                self._paths,
                self._columns,
                self._counted,
                self._objects,
                self._config,
                self._decode,
            ),
        )

    # -- for the DataLoader -----------------------------------------------------------------

    def _window(self, pieces: list[tuple[int, int, int]]) -> _core._ShardWindow:
        """The samples of ``pieces`` (``(shard, lo, hi)``), read in Rust without the GIL."""
        firsts = [self._offsets[s] + lo for s, lo, _ in pieces]
        return self._reader.read(pieces, firsts)


def _restore(
    cls: type[ShardedSource],
    paths: list[str],
    columns: list[str] | None,
    counted: list[_remote.Counted],
    objects: list[_remote.Listed] | None = None,
    config: _remote.RemoteConfig | None = None,
    decode: bool = True,
) -> ShardedSource:
    source = cls.__new__(cls)
    ShardedSource.__init__(
        source,
        paths,
        columns=columns,
        decode=decode,
        _counted=counted,
        _objects=objects,
        _config=config,
    )
    return source


class TarShards(ShardedSource):
    """WebDataset tar shards (``.tar``, and gzip-compressed ``.tar.gz``/``.tgz``).

    A sample is a dict in the WebDataset layout: the members sharing a key (the member
    path up to the first dot of its base name) grouped, one entry per extension, plus
    ``"__key__"`` and ``"__shard__"``. Fields decode as webdataset's default decoder does,
    by the last part of the extension (``seg.json`` as ``json``): ``cls``, ``cls2``,
    ``index``, ``inx`` and ``id`` to `int` (Python's ``int()`` of the bytes), ``txt`` and
    ``text`` to `str` (UTF-8), ``json`` and ``jsn`` by Python's ``json.loads`` (key order,
    exact floats, ``NaN``, big integers as Python reads them); everything else stays
    `bytes` (never unpickled or ``torch.load``-ed: a shard is data, not code). With
    ``decode=False`` every field is its member's `bytes`. A field that does not decode is
    that sample's `ShardCorruptError`.

    Members are grouped as webdataset groups them, with these rules of their own: hidden
    names (a base name starting with a dot: ``.DS_Store``, ``dir/.x.jpg``, macOS's
    ``._NAME``) and anything under a top-level ``__MACOSX/`` are passed over (webdataset
    makes samples keyed ``dir/`` of those); a member named ``KEY.__key__`` or
    ``KEY.__shard__`` makes its sample a `ShardCorruptError` (it would replace the
    metadata); a PAX sparse member (``tar --sparse --format=posix``) is refused the same
    way; bzip2 and xz shards are refused, naming the compression. A tar without its
    end-of-archive blocks is read whole, as GNU tar reads it.

    Args:
        urls: a path or URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``), a pattern
            with brace ranges (``train-{000000..000099}.tar``) or globs, or a list of them.
        decode: decode fields by their extension (default), or give every field as the
            `bytes` of its member (``cls`` too).
        count_threads: threads that count the shards' samples (default: up to 8; for
            URLs 4, each holding a shard it fetched whole).
        storage_options: for shards in object storage (URLs): options of the store, over
            its environment (``AWS_*`` with ``AWS_ENDPOINT_URL`` for an S3-compatible
            server, ``GOOGLE_*``, ``AZURE_*``): the keys of the ``object_store`` crate
            (``endpoint``, ``region``, ``access_key_id``, ``allow_http``, ``timeout``, ...)
            and ``max_retries`` / ``retry_timeout`` (seconds).
        prefetch_bytes: bytes of the next shards fetched ahead of the one being read
            (default 512 MiB; at least the next shard unless 0). With a sample index
            (nothing fetched whole), the bytes of the samples fetched, kept for later
            epochs.
        cache_dir: a local directory keeping fetched shards, shared by the node's ranks and
            workers (one download per shard); without it, shards are fetched again each
            epoch.
        cache_limit: the cache's size limit in bytes, least recently used evicted past it
            (default: half the free space of its disk when the source is made).
        index: use the shards' folder's sample index (``_ferrofeed-index.json``, written by
            ``ferrofeed pack`` and ``ferrofeed index``) when there is one (None, the
            default), require it (True), or ignore it (False). With it, opening counts
            nothing, and remote windows fetch only their samples' byte ranges; an index
            that no longer matches a shard (size, ETag) is a `ShardCorruptError`.

    Raises:
        FileNotFoundError: a pattern names no file (`ShardNotFoundError` for a missing
            object or bucket).
        ShardPermissionError: the store refused the credentials.
        ShardCorruptError: no shard has a readable sample (a truncated or corrupt shard
            among others is counted up to the damage: see `ShardedSource.damaged`), or a
            sample's members straddle two shards.
        ShardReadError: a shard cannot be read (or fetched, once retries are spent).

    Example:
        >>> shards = TarShards("data/train-{000000..000009}.tar")  # doctest: +SKIP
        >>> next(iter(shards))["cls"]  # doctest: +SKIP
        3
    """

    _kind = "tar"

    def __init__(
        self,
        urls: Urls,
        *,
        decode: bool = True,
        count_threads: int | None = None,
        storage_options: Mapping[str, str] | None = None,
        prefetch_bytes: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
        index: bool | None = None,
    ) -> None:
        super().__init__(
            urls,
            decode=decode,
            count_threads=count_threads,
            storage_options=storage_options,
            prefetch_bytes=prefetch_bytes,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            index=index,
        )


class ParquetShards(ShardedSource):
    """Parquet files, every Hugging Face dataset's format: a sample is a row.

    A sample is a dict of the projected columns (all without ``columns``). A Hugging Face
    image column (a struct of ``bytes`` and ``path``) is its bytes. Only the row groups a
    window needs, and only the projected columns, are read.

    Args:
        urls: paths, patterns or a list of them (as for `TarShards`).
        columns: the columns to read (default: all).
        count_threads: threads that read the footers (default: up to 8; 16 for URLs).
        storage_options, prefetch_bytes, cache_dir, cache_limit: for URLs, as for
            `TarShards`.

    Raises:
        ShardCorruptError: a file is not Parquet (a corrupt footer), or lacks a column.

    Example:
        >>> rows = ParquetShards("data/*.parquet", columns=["image", "label"])  # doctest: +SKIP
        >>> sorted(next(iter(rows)))  # doctest: +SKIP
        ['image', 'label']
    """

    _kind = "parquet"

    def __init__(
        self,
        urls: Urls,
        *,
        columns: Sequence[str] | None = None,
        count_threads: int | None = None,
        storage_options: Mapping[str, str] | None = None,
        prefetch_bytes: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
    ) -> None:
        if columns is not None and (isinstance(columns, str) or not columns):
            raise TypeError("columns must be a non-empty list of column names, or None")
        super().__init__(
            urls,
            columns=columns,
            count_threads=count_threads,
            storage_options=storage_options,
            prefetch_bytes=prefetch_bytes,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
        )


class JsonLines(ShardedSource):
    """JSON lines files (``.jsonl``, and ``.gz`` or ``.zst`` compressed): a sample is a line.

    A sample is the line's parsed value. Blank lines are skipped; errors name the line
    (counted from 1, blank ones included, as an editor shows it).

    Args:
        urls: paths, patterns or a list of them (as for `TarShards`).
        count_threads: threads that count the lines (default: up to 8; 4 for URLs).
        storage_options, prefetch_bytes, cache_dir, cache_limit: for URLs, as for
            `TarShards`.

    Example:
        >>> corpus = JsonLines("corpus/part-*.jsonl.zst")  # doctest: +SKIP
        >>> len(corpus)  # doctest: +SKIP
        1000000
    """

    _kind = "jsonl"

    def __init__(
        self,
        urls: Urls,
        *,
        count_threads: int | None = None,
        storage_options: Mapping[str, str] | None = None,
        prefetch_bytes: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
    ) -> None:
        super().__init__(
            urls,
            count_threads=count_threads,
            storage_options=storage_options,
            prefetch_bytes=prefetch_bytes,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
        )


# What MDSShards reads of an index.json shard entry: the compressions Rust decompresses.
_MDS_COMPRESSIONS = ("zstd", "gz")


class MDSShards(ShardedSource):
    """A MosaicML Streaming dataset in MDS format, as ``MDSWriter`` writes it.

    The dataset is a directory (local, or a URL prefix in object storage) holding
    ``index.json`` and the shards it names (``shard.00000.mds``, or ``.mds.zstd`` and
    ``.mds.gz`` when written with ``compression="zstd"`` or ``"gz"``). The index gives each
    shard's samples, so making the source reads the index alone (and, for URLs, one HEAD per
    shard), not the shards. A sample is a dict of its columns, decoded as `streaming`'s
    reader decodes them, except that nothing is unpickled and images stay encoded:

    - ``bytes``, ``jpeg``, ``png``: `bytes` (an image's encoded file: ``image="jpeg"`` feeds
      it to the native image chain); ``pkl``, ``jpeg_array`` and ``list[...]``: their bytes;
    - ``str``: `str`; ``int``, ``int8``..``uint64``, ``str_int``: `int`; ``float16``,
      ``float32``, ``float64``, ``str_float``: `float`; ``str_decimal``: its text;
    - ``json``: Python's ``json.loads`` of the text;
    - ``ndarray`` (any dtype and shape, fixed or stored): a writable ``numpy.ndarray``;
    - ``pil``: the image's pixels as ``numpy.asarray(image)`` gives them (``H x W`` or
      ``H x W x C``).

    Args:
        path: the dataset's directory or its ``index.json`` (a path or a URL: ``s3://``,
            ``gs://``, ``az://``, ``http(s)://``).
        storage_options, prefetch_bytes, cache_dir, cache_limit: for URLs, as for
            `TarShards`.

    Raises:
        FileNotFoundError: no ``index.json`` there, or a shard it names is missing
            (`ShardNotFoundError` for a URL).
        ValueError: the index is not an MDS index (another format, a compression other than
            zstd or gzip, a shard without its sample count).
        ShardCorruptError: a shard's header does not check out (when read).

    Example:
        >>> ds = MDSShards("s3://bucket/imagenet-mds/train")  # doctest: +SKIP
        >>> loader = DataLoader(ds, 256, transform=ops.decode_image(size=224),
        ...                     image="jpeg", label="class")  # doctest: +SKIP
    """

    _kind = "mds"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        storage_options: Mapping[str, str] | None = None,
        prefetch_bytes: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
    ) -> None:
        where = os.fspath(path)
        remote = _remote.is_url(where)
        index_at = where if where.endswith("index.json") else where.rstrip("/") + "/index.json"
        root = index_at[: -len("index.json")]
        config = _remote.RemoteConfig.of(
            remote, storage_options, prefetch_bytes, cache_dir, cache_limit
        )
        if config is not None:
            text = _core._remote_get(index_at, config.options())
        else:
            with open(index_at, "rb") as f:
                text = f.read()
        shards = _mds_shards(index_at, text)
        paths = [root + name for name, _ in shards]
        counted: list[_remote.Counted] = [(n, None, None, None) for _, n in shards]
        if config is None:
            super().__init__(paths, _counted=counted)
            return
        objects = _remote.list_objects(paths, config)
        super().__init__(paths, _counted=counted, _objects=objects, _config=config)


def _mds_shards(index_at: str, text: bytes) -> list[tuple[str, int]]:
    """``(file name relative to the index, samples)`` of each shard an MDS index names."""
    try:
        index = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{index_at}: not JSON ({e})") from None
    entries = index.get("shards") if isinstance(index, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{index_at}: not an MDS index (no list of shards)")
    out = []
    for k, entry in enumerate(entries):
        what = f"{index_at}: shard {k}"
        if not isinstance(entry, dict):
            raise ValueError(f"{what} is not an object")
        kind = entry.get("format")
        if kind != "mds":
            raise ValueError(
                f"{what} is in format {kind!r}: MDSShards reads 'mds' (for 'jsonl' shards, "
                "JsonLines reads the raw files)"
            )
        compression = entry.get("compression")
        algorithm = compression.split(":", 1)[0] if isinstance(compression, str) else None
        if compression is not None and algorithm not in _MDS_COMPRESSIONS:
            raise ValueError(
                f"{what} is compressed with {compression!r}: MDSShards reads plain, zstd and gz "
                "shards"
            )
        data = entry.get("zip_data" if compression is not None else "raw_data")
        name = data.get("basename") if isinstance(data, dict) else None
        samples = entry.get("samples")
        if not isinstance(name, str) or not isinstance(samples, int) or samples < 0:
            raise ValueError(f"{what} has no file name or sample count")
        out.append((name, samples))
    return out
