"""A folder's sample index (``_ferrofeed-index.json``), as a tar source opens with it.

``ferrofeed pack`` writes the index next to its shards and ``ferrofeed index`` writes it
for shards made by other tools (the format: ``src/shards/index.rs``, read by Rust's one
parser, `_core._read_index`). When the folder of a `TarShards` source's shards holds one:

- opening makes no counting pass: the samples of each shard, and the keys at its ends,
  come from the index. Remote shards cost the index's GET and one listing of the folder,
  not a download per shard;
- each remote tar shard's sample offsets go to the reader, which then fetches a window's
  samples' byte ranges alone (`RemoteShards::fetch_ranges`), never whole shards;
- an index that no longer describes a shard (its size, or its store's ETag, differ; a
  shard it does not list) is refused with an error that says how to rebuild it.
  A local shard's modification time is not compared: copying a folder changes it.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import posixpath
from collections.abc import Sequence
from typing import NamedTuple

from . import _core, _remote
from ._errors import ShardCorruptError, ShardNotFoundError

__all__ = ["INDEX_NAME", "Found", "Indexed", "local", "remote"]

INDEX_NAME = "_ferrofeed-index.json"

# (name, size, etag, mtime_ns, samples, first_key, last_key, offsets, end)
Entry = tuple[
    str, int, str | None, int | None, int, str | None, str | None, list[int] | None, int | None
]
Offsets = tuple[list[int], int] | None


class Found(NamedTuple):
    """What local indexes give a source: each shard's count, and the indexes read."""

    counted: list[_remote.Counted]
    indexes: list[str]


#: What remote indexes give a source: each shard's count and sample offsets.
Indexed = tuple[list[_remote.Counted], list[Offsets]]


def _entries(data: bytes, where: str) -> dict[str, Entry]:
    try:
        entries, _ = _core._read_index(data, where)
    except ValueError as e:
        raise ShardCorruptError(str(e), where, None) from None
    return {e[0]: e for e in entries}


def _stale(where: str, shard: str, why: str, rebuild: str) -> ShardCorruptError:
    return ShardCorruptError(
        f"{where} is stale for {shard}: {why} (it changed since the index was written); "
        f"rebuild the index with `ferrofeed index '{rebuild}'`, or pass index=False",
        shard,
        "index",
    )


def _missing(where: str, required: bool) -> None:
    if required:
        raise FileNotFoundError(
            f"no sample index {where} (index=True): write it with `ferrofeed index`"
        )


def _counted(e: Entry) -> _remote.Counted:
    return (e[4], e[5], e[6], None)


def local(paths: Sequence[str], *, required: bool = False) -> Found | None:
    """The counts of local tar shards from their folders' indexes, or None without one."""
    found: dict[str, dict[str, Entry]] = {}
    for folder in sorted({os.path.dirname(os.path.abspath(p)) for p in paths}):
        where = os.path.join(folder, INDEX_NAME)
        try:
            with open(where, "rb") as f:
                found[folder] = _entries(f.read(), where)
        except FileNotFoundError:
            _missing(where, required)
            return None
    counted: list[_remote.Counted] = []
    for p in paths:
        full = os.path.abspath(p)
        folder, name = os.path.split(full)
        where = os.path.join(folder, INDEX_NAME)
        entry = found[folder].get(name)
        rebuild = os.path.join(folder, "*.tar")
        if entry is None:
            raise _stale(where, p, "the index does not list it", rebuild)
        size = os.stat(full).st_size
        if size != entry[1]:
            raise _stale(where, p, f"it is {size:,} bytes, the index says {entry[1]:,}", rebuild)
        counted.append(_counted(entry))
    return Found(counted, sorted(found))


def remote(
    patterns: Sequence[str], config: _remote.RemoteConfig, *, required: bool = False
) -> tuple[list[_remote.Listed], Indexed | None]:
    """The objects ``patterns`` name, and what their folders' indexes say (None without).

    A folder that a glob names is listed once, as it would be anyway, and the listing shows
    whether it holds an index; a folder of plain URLs is asked for its index (one request),
    and when it has one, listed once instead of a HEAD per URL. Without an index (in any of
    the folders) the objects are looked up as `_remote.list_objects` does.
    """
    folders: dict[str, list[str]] = {}
    for p in patterns:
        folders.setdefault(posixpath.dirname(p), []).append(p)
    listed: dict[str, dict[str, _remote.Listed]] = {}
    indexes: dict[str, dict[str, Entry]] = {}
    for folder, named in folders.items():
        where = f"{folder}/{INDEX_NAME}"
        http = folder.startswith(("http://", "https://"))
        if not http and any(glob.has_magic(posixpath.basename(p)) for p in named):
            objects = _remote.list_objects([f"{folder}/*"], config)
            listed[folder] = {posixpath.basename(u): (u, n, e) for u, n, e in objects}
            if INDEX_NAME not in listed[folder]:
                _missing(where, required)
                continue
        try:
            indexes[folder] = _entries(_core._remote_get(where, config.options()), where)
        except ShardNotFoundError:
            _missing(where, required)
            continue
        if http:
            # Plain HTTP lists nothing: the index's sizes and ETags stand (a changed
            # shard fails its first ranged GET, which asks for its ETag).
            entries = indexes[folder].values()
            listed[folder] = {e[0]: (f"{folder}/{e[0]}", e[1], e[2]) for e in entries}
        elif folder not in listed:
            objects = _remote.list_objects([f"{folder}/*"], config)
            listed[folder] = {posixpath.basename(u): (u, n, e) for u, n, e in objects}
    if len(indexes) < len(folders):
        # No index (for some folder): every object as the source finds it without one.
        out: list[_remote.Listed] = []
        for p in patterns:
            folder, pattern = posixpath.split(p)
            if folder in listed and glob.has_magic(pattern):
                out.extend(_matching(listed[folder], p))
            else:
                out.extend(_remote.list_objects([p], config))
        return out, None
    out = [o for p in patterns for o in _matching(listed[posixpath.dirname(p)], p)]
    counted: list[_remote.Counted] = []
    offsets: list[Offsets] = []
    for url, size, etag in out:
        folder, name = posixpath.split(url)
        where, rebuild = f"{folder}/{INDEX_NAME}", f"{folder}/*.tar"
        entry = indexes[folder].get(name)
        if entry is None:
            raise _stale(where, url, "the index does not list it", rebuild)
        if size != entry[1]:
            raise _stale(where, url, f"it is {size:,} bytes, the index says {entry[1]:,}", rebuild)
        if etag is not None and entry[2] is not None and etag != entry[2]:
            raise _stale(where, url, f"its ETag is {etag}, the index says {entry[2]}", rebuild)
        counted.append(_counted(entry))
        starts, end = entry[7], entry[8]
        offsets.append((starts, end) if starts is not None and end is not None else None)
    return out, (counted, offsets)


def _matching(listed: dict[str, _remote.Listed], pattern: str) -> list[_remote.Listed]:
    """The listed objects whose names match ``pattern``'s last part, sorted by name.

    Globs do not cross ``/`` (the listing is of one folder), as in `_remote.list_objects`.
    """
    name = posixpath.basename(pattern)
    found = [listed[n] for n in sorted(listed) if fnmatch.fnmatchcase(n, name)]
    if not found:
        raise ShardNotFoundError(f"no shard matches {pattern!r}", pattern, None)
    return found
