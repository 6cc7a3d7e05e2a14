"""Sharded sources in object storage: which objects a source's URLs name, counted once per node.

A remote source's shards are listed (a glob pattern: one listing per directory) or looked up
(explicit URLs: one HEAD each), then counted (a Parquet footer: one or two ranged GETs; a tar
or JSON lines shard: fetched whole, into the cache directory when there is one). Every rank
and worker of a node would do the same, so the result is kept in a node-local index file
(under the cache directory, else ``$FERROFEED_CACHE_DIR`` or ``~/.cache/ferrofeed``) behind a
lock: the first process of a node lists and counts, the others wait and read its result. A
listing is trusted for `LIST_TTL` seconds (the ranks of one launch start within them); counts
are kept for as long as the object's URL, size and ETag are the same.

Fetching the shards while a source is read is Rust's business (`_core._RemoteShards`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _core

_log = logging.getLogger("ferrofeed")

# How long a node's listing of a source is reused by the node's other processes.
LIST_TTL = 60.0
# The node index's layout: 2 added each shard's damage, 3 the sample offsets a folder's
# sample index gives (an index of another version is listed and counted again).
INDEX_VERSION = 3
_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")

# A source's remote defaults, one copy, in Rust (RemoteOptions::default()).
_PREFETCH_BYTES, _PART_SIZE, _CONCURRENCY = _core._remote_defaults()

Listed = tuple[str, int, str | None]
# A shard's count: samples, first and last key (tar), and where it is damaged, ``(at,
# message)``, if it is (the samples are then those before the damage).
Counted = tuple[int, str | None, str | None, tuple[str, str] | None]
# A tar shard's sample offsets from its folder's sample index: each sample's start, and the
# last one's end (see _shard_index).
Offsets = tuple[list[int], int] | None
# Looks objects up as list_objects does, and says what their sample index gives, if any.
Lister = Callable[[Sequence[str]], tuple[list[Listed], tuple[list[Counted], list[Offsets]] | None]]


def is_url(text: str) -> bool:
    """Whether ``text`` is a URL (``scheme://...``) rather than a local path."""
    return _URL.match(text) is not None


@dataclass(frozen=True)
class RemoteConfig:
    """How a source reaches its remote shards (the arguments of the source)."""

    storage_options: Mapping[str, str] = field(default_factory=dict)
    prefetch_bytes: int = _PREFETCH_BYTES
    cache_dir: str | None = None
    cache_limit: int | None = None
    part_size: int = _PART_SIZE
    concurrency: int = _CONCURRENCY

    def __post_init__(self) -> None:
        for key, value in self.storage_options.items():
            if not isinstance(key, str) or not isinstance(value, str | int | float | bool):
                raise TypeError(
                    f"storage_options: {key!r}: keys are strings, values strings or numbers"
                )
        if self.prefetch_bytes < 0:
            raise ValueError(f"prefetch_bytes must be 0 or more, not {self.prefetch_bytes}")
        if self.cache_limit is not None and self.cache_limit <= 0:
            raise ValueError(
                f"cache_limit must be a positive number of bytes, not {self.cache_limit}"
            )
        if self.cache_limit is not None and self.cache_dir is None:
            raise ValueError("cache_limit= needs cache_dir=")

    @classmethod
    def of(
        cls,
        remote: bool,
        storage_options: Mapping[str, str] | None,
        prefetch_bytes: int | None,
        cache_dir: str | os.PathLike[str] | None,
        cache_limit: int | None,
    ) -> RemoteConfig | None:
        """The configuration a source's arguments give.

        ``None`` for local paths (which take none of them), else these, with defaults for
        those not given.
        """
        given = (storage_options, prefetch_bytes, cache_dir, cache_limit)
        if not remote:
            if any(a is not None for a in given):
                raise ValueError(
                    "storage_options=, prefetch_bytes=, cache_dir= and cache_limit= are for "
                    "shards in object storage (URLs); these are local paths"
                )
            return None
        return cls(
            storage_options=dict(storage_options or {}),
            prefetch_bytes=prefetch_bytes if prefetch_bytes is not None else cls.prefetch_bytes,
            cache_dir=os.fspath(cache_dir) if cache_dir is not None else None,
            cache_limit=cache_limit,
        )

    def options(self) -> list[tuple[str, str]]:
        """The storage options as sorted ``(key, value)`` strings (booleans as true/false)."""
        out = []
        for key, value in self.storage_options.items():
            text = str(value).lower() if isinstance(value, bool) else str(value)
            out.append((key, text))
        return sorted(out)

    def shards_dir(self) -> str | None:
        """Where fetched shards are kept (``cache_dir/shards``), if anywhere."""
        return os.path.join(self.cache_dir, "shards") if self.cache_dir is not None else None

    def limit(self) -> int:
        """The cache's size limit: ``cache_limit``, else half the free space of its disk now."""
        if self.cache_limit is not None:
            return self.cache_limit
        assert self.cache_dir is not None
        os.makedirs(self.cache_dir, exist_ok=True)
        return max(1, shutil.disk_usage(self.cache_dir).free // 2)

    def shards(self, objects: Sequence[Listed]) -> _core._RemoteShards:
        """The Rust side: ``objects`` with this prefetch, cache and client."""
        shards_dir = self.shards_dir()
        return _core._RemoteShards(
            list(objects),
            self.options(),
            self.prefetch_bytes,
            self.part_size,
            self.concurrency,
            shards_dir,
            self.limit() if shards_dir is not None else 0,
        )


def list_objects(patterns: Sequence[str], config: RemoteConfig) -> list[Listed]:
    """The objects ``patterns`` (brace-expanded URLs) name, in the order given.

    Listing and globbing are Rust's (``src/remote/list.rs``): a URL with glob characters is
    matched against one listing of its directory (sorted by key; ``*`` and ``?`` do not
    cross ``/``), a URL without is looked up with a HEAD. A pattern that matches nothing, or
    a missing object, is a `ShardNotFoundError` naming it; a URL of no store read here, or a
    glob over plain HTTP, a `ValueError`.
    """
    return _core._remote_objects(list(patterns), config.options())


def _key_of(url: str) -> str:
    """The object key of ``scheme://bucket/key``."""
    return url.split("://", 1)[1].partition("/")[2]


def store_environment(patterns: Sequence[str]) -> list[tuple[str, str]]:
    """The variables of the environment that locate the stores of ``patterns``, sorted.

    Part of the key of a node's index: two jobs whose environments point the same URLs at
    different servers (``AWS_ENDPOINT_URL``) must not share listings and counts. The same
    variables key the process's clients (``remote::store::store_environment``, asked here).
    """
    return sorted({item for url in patterns for item in _core._remote_environment(url)})


def index_dir(config: RemoteConfig) -> Path | None:
    """The node-local directory of index files, or None if none can be made."""
    if config.cache_dir is not None:
        base = Path(config.cache_dir)
    elif os.environ.get("FERROFEED_CACHE_DIR"):
        base = Path(os.environ["FERROFEED_CACHE_DIR"])
    else:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = Path(xdg) / "ferrofeed"
    d = base / "index"
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _log.warning("no index of remote shards kept on this node (%s: %s)", d, e)
        return None
    return d


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (made if missing) for the block."""
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _read_index(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("version") == INDEX_VERSION else None


def _write_index(path: Path, data: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-index-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _counted(row: list[Any]) -> Counted:
    """The count of an index row, ``[url, size, etag, samples, first, last, damage]``."""
    c, f, la, d = row[3:7]
    return int(c), f, la, (str(d[0]), str(d[1])) if d is not None else None


def resolve(
    kind: str,
    columns: Sequence[str] | None,
    patterns: Sequence[str],
    config: RemoteConfig,
    count: Callable[[list[Listed]], list[Counted]],
    lister: Lister | None = None,
) -> tuple[list[Listed], list[Counted], list[Offsets] | None]:
    """The objects ``patterns`` name, their counts and sample offsets, made once per node.

    ``count(objects)`` counts the given objects' samples (a fresh reader over them);
    ``lister`` looks the objects up instead of `list_objects` and gives their counts and
    offsets when their folders hold a sample index (tar: `_shard_index.remote`), so that
    nothing is counted. The first process of a node to get here lists and counts, and
    writes the node's index; the others wait on its lock and reuse the index while its
    listing is younger than `LIST_TTL`. Counts of objects whose URL, size and ETag did not
    change are reused from an older index.
    """

    def look() -> tuple[list[Listed], tuple[list[Counted], list[Offsets]] | None]:
        return (list_objects(patterns, config), None) if lister is None else lister(patterns)

    key_text = json.dumps(
        [
            kind,
            list(columns) if columns is not None else None,
            list(patterns),
            config.options(),
            store_environment(patterns),
        ]
    )
    key = hashlib.sha256(key_text.encode()).hexdigest()[:32]
    where = index_dir(config)
    if where is None:
        objects, indexed = look()
        if indexed is not None:
            return objects, *indexed
        return objects, count(objects), None
    path = where / f"{key}.json"
    with _locked(where / f".{key}.lock"):
        old = _read_index(path)
        if old is not None and time.time() - float(old.get("listed_at", 0)) < LIST_TTL:
            shards = old["shards"]
            kept = old.get("offsets")
            offsets = [(o[0], o[1]) if o else None for o in kept] if kept is not None else None
            objects = [(u, int(n), e) for u, n, e, *_ in shards]
            return objects, [_counted(r) for r in shards], offsets
        objects, indexed = look()
        offsets = None
        if indexed is not None:
            counted, offsets = indexed
        else:
            known: dict[tuple[str, int, str | None], Counted] = {}
            if old is not None:
                for row in old["shards"]:
                    u, n, e = row[:3]
                    known[(u, int(n), e)] = _counted(row)
            missing = [o for o in objects if o not in known]
            if missing:
                known.update(zip(missing, count(missing), strict=True))
            counted = [known[o] for o in objects]
        _write_index(
            path,
            {
                "version": INDEX_VERSION,
                "listed_at": time.time(),
                "patterns": list(patterns),
                "shards": [[*o, *c] for o, c in zip(objects, counted, strict=True)],
                "offsets": offsets,
            },
        )
        return objects, counted, offsets
