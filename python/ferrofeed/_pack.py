"""Writing shards: `write_shards` and ``ferrofeed pack``.

An image folder (one subfolder per class), any ferrofeed source (to re-shard, or convert tar
<-> Parquet) or a sequence of dict samples, packed into WebDataset tar shards or Parquet files
in the Hugging Face image layout, locally or straight into object storage. The writer is Rust
(`_core._Packer`, ``src/pack``): an image folder's files are read, checked and written by its
threads with the GIL released, never becoming Python objects; other samples are handed over in
batches. The same input and options give byte-identical shards whatever ``workers``; a shard
appears whole or not at all; a pack that was killed and is run again keeps its finished
shards and goes on after them; and the sample index (``_ferrofeed-index.json``) is written
next to the shards at the end.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import numbers
import os
import re
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, TextIO

from . import _core, _remote
from ._images import ImageFiles, ImageFolder
from ._shards import (
    JsonLines,
    MDSShards,
    ParquetShards,
    ShardedSource,
    TarShards,
    _all_or_none,
    _patterns,
    _restore,
    expand_shards,
)

__all__ = ["PackSummary", "SkippedSample", "index_shards", "parse_size", "write_shards"]

# Samples handed to Rust at a time (sources other than an image folder).
_BATCH = 256
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.I)


def parse_size(size: int | str) -> int:
    """A byte count from an int or a text such as ``"256MB"`` (10^6) or ``"1GiB"`` (2^30).

    Example:
        >>> parse_size("256MB"), parse_size("1GiB"), parse_size(4096)
        (256000000, 1073741824, 4096)
    """
    if isinstance(size, bool) or not isinstance(size, int | str):
        raise TypeError(f"a size is an int or a text such as '256MB', not {size!r}")
    if isinstance(size, int):
        n = size
    else:
        m = _SIZE.match(size)
        if m is None:
            raise ValueError(f"{size!r} is not a size (such as 4096, '256MB' or '1GiB')")
        power = "kmgt".find(m.group(2).lower()) + 1 if m.group(2) else 0
        n = int(float(m.group(1)) * (1024 if m.group(3) else 1000) ** power)
    if n <= 0:
        raise ValueError(f"a shard size must be positive, not {size!r}")
    return n


class SkippedSample(NamedTuple):
    """A sample left out under ``on_error="skip"``: its position, file (or key) and why."""

    position: int
    name: str
    reason: str


@dataclass(frozen=True)
class PackSummary:
    """What a pack wrote: the totals of the destination's shards.

    Shards kept from an earlier run of the same pack (``resumed``) count in the totals;
    ``seconds`` is this run's time.
    """

    samples: int
    shards: int
    bytes: int
    seconds: float
    skipped: int
    skipped_samples: tuple[SkippedSample, ...]
    resumed: int
    dest: str
    index: str

    def __str__(self) -> str:
        from .memory import format_bytes

        s = "" if self.shards == 1 else "s"
        lines = [
            f"packed {self.samples:,} samples into {self.shards:,} shard{s} "
            f"({format_bytes(self.bytes)}) in {self.seconds:.2f} s: {self.dest}"
        ]
        if self.resumed:
            lines.append(f"resumed: {self.resumed:,} shards were there from an earlier run")
        if self.skipped:
            lines.append(f"skipped {self.skipped:,} samples:")
            lines += [f"  {k.name}: {k.reason}" for k in self.skipped_samples[:20]]
            if self.skipped > 20:
                lines.append(f"  ... and {self.skipped - 20:,} more")
        lines.append(f"index: {self.index}")
        return "\n".join(lines)


class _Bar:
    """A one-line progress bar on a terminal (stderr), at most 5 redraws a second."""

    def __init__(self, total: int | None, stream: TextIO) -> None:
        self.total = total
        self.stream = stream
        self.start = time.monotonic()
        self.last = 0.0

    def __call__(self, done: int, samples: int, nbytes: int, skipped: int, shards: int) -> None:
        now = time.monotonic()
        if now - self.last < 0.2:
            return
        self.last = now
        from .memory import format_bytes

        parts = [f"{done:,}" + (f"/{self.total:,}" if self.total else "") + " samples"]
        if self.total:
            parts.insert(0, f"{100 * done / self.total:3.0f}%")
        parts.append(f"{shards:,} shards ({format_bytes(nbytes)})")
        if skipped:
            parts.append(f"{skipped:,} skipped")
        parts.append(f"{done / max(now - self.start, 1e-9):,.0f}/s")
        self.stream.write("\rpacking " + "  ".join(parts) + "\x1b[K")
        self.stream.flush()

    def close(self) -> None:
        if self.last:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


class _Files(NamedTuple):
    """An image folder's files: read in Rust."""

    paths: list[str]
    stored: list[str]
    labels: list[int] | None
    classes: list[str] | None
    input: dict[str, Any]


class _Samples(NamedTuple):
    """Samples handed over from Python: the iterable, its length if known, its identity."""

    items: Iterable[Any]
    length: int | None
    input: dict[str, Any]


def _folder(files: ImageFiles, root: str | None) -> _Files:
    """The files of an image folder (or an `ImageFiles`) and their identity."""
    paths = [os.fspath(p) for p in files.paths]
    stored = [os.path.relpath(p, root) if root is not None else p for p in paths]
    labels = [int(x) for x in files.labels] if files.labels is not None else None
    digest = hashlib.sha256()
    for i, (p, s) in enumerate(zip(paths, stored, strict=True)):
        try:
            size = os.stat(p).st_size
        except OSError:
            size = -1  # the pack names it when it reads it
        label = labels[i] if labels is not None else None
        digest.update(f"{s}\0{size}\0{label}\n".encode())
    classes = list(getattr(files, "classes", [])) or None
    return _Files(
        paths,
        stored,
        labels,
        classes,
        {"kind": "files", "files": len(paths), "digest": digest.hexdigest()},
    )


def _source_of(pattern: str) -> ShardedSource | None:
    """The sharded source a path or pattern names, by its ending (None: not shards)."""
    bare = pattern.rstrip("/")
    if bare.endswith((".tar", ".tar.gz", ".tgz")):
        return TarShards(bare, decode=False)
    if bare.endswith(".parquet"):
        return ParquetShards(bare)
    if bare.endswith((".jsonl", ".jsonl.gz", ".jsonl.zst")):
        return JsonLines(bare)
    if bare.endswith("index.json") or os.path.isfile(os.path.join(bare, "index.json")):
        return MDSShards(bare)
    return None


def _plan(source: Any) -> _Files | _Samples:
    """What ``source`` is: image files, or samples with their count and identity."""
    if isinstance(source, str | os.PathLike):
        where = os.fspath(source)
        shards = _source_of(where)
        if shards is not None:
            source = shards
        elif os.path.isdir(where):
            folder = ImageFolder(where)
            return _folder(folder, folder.root)
        else:
            raise FileNotFoundError(
                f"{where!r} is neither an image folder (root/<class>/<image>) nor shards "
                "(.tar, .tar.gz, .parquet, .jsonl[.gz|.zst], an MDS folder)"
            )
    if isinstance(source, ImageFolder):
        return _folder(source, source.root)
    if isinstance(source, ImageFiles):
        return _folder(source, None)
    if isinstance(source, ShardedSource):
        if isinstance(source, TarShards) and source._decode:
            # Re-read without decoding: every member's bytes as they are.
            cls, paths, columns, counted, objects, config, _ = source.__reduce__()[1]
            source = _restore(cls, paths, columns, counted, objects, config, decode=False)
        identity = {"kind": type(source).__name__, "shards": source.shards}
        return _Samples(source, len(source), identity)
    if isinstance(source, Mapping) or not isinstance(source, Iterable):
        raise TypeError(
            "source must be an image folder, a ferrofeed source (TarShards, ParquetShards, "
            f"...) or a sequence of dict samples, not {type(source).__name__}"
        )
    length = len(source) if isinstance(source, Sequence) else None
    identity = {"kind": "samples", "type": type(source).__qualname__, "len": length}
    return _Samples(source, length, identity)


def _iter_from(source: Iterable[Any], start: int) -> Iterator[Any]:
    """``source``'s samples from position ``start`` (a sharded source reads from there)."""
    if start == 0:
        yield from source
    elif isinstance(source, ShardedSource):
        if source._remote is not None and not source._ranged:
            source._remote.prefetch(list(range(len(source._counts))))
        for shard, n in enumerate(source._counts):
            first = source._offsets[shard]
            if first + n <= start:
                continue
            for lo in range(max(0, start - first), n, 1024):
                hi = min(n, lo + 1024)
                window = source._window([(shard, lo, hi)])
                for i in range(first + lo, first + hi):
                    yield window.sample(i)
    elif isinstance(source, Sequence):
        for i in range(start, len(source)):
            yield source[i]
    else:
        yield from itertools.islice(source, start, None)


def _field(name: str, value: Any) -> tuple[Any, str | None] | None:
    """A field's value as Rust takes it (bytes, str, int, float), and an image's path."""
    if value is None:
        return None
    if isinstance(value, bytes | str | int | float):
        return value, None
    if isinstance(value, bytearray | memoryview):
        return bytes(value), None
    if isinstance(value, numbers.Integral):
        return int(value), None
    if isinstance(value, numbers.Real):
        return float(value), None
    if isinstance(value, Mapping) and "bytes" in value and set(value) <= {"bytes", "path"}:
        data = value["bytes"]
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"field {name!r}: its 'bytes' is not bytes (an image by path only?)")
        path = value.get("path")
        return bytes(data), path if isinstance(path, str) else None
    if isinstance(value, Mapping | list | tuple):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")), None
    raise TypeError(
        f"field {name!r}: a {type(value).__name__} cannot be packed (give bytes, str, int, "
        "float, or a JSON-able dict or list)"
    )


def _sample(raw: Any) -> tuple[str | None, str | None, list[tuple[str, Any]]]:
    """A sample as ``(key, path, fields)``: dunder entries other than ``__key__`` left out."""
    if not isinstance(raw, Mapping):
        raw = {"json": raw}
    key = raw.get("__key__")
    if key is not None and not isinstance(key, str):
        raise TypeError(f"__key__ must be a str, not {type(key).__name__}")
    path = None
    fields = []
    for name, value in raw.items():
        if not isinstance(name, str):
            raise TypeError(f"field names are str, not {type(name).__name__}")
        if name.startswith("__") and name.endswith("__"):
            continue
        got = _field(name, value)
        if got is not None:
            fields.append((name, got[0]))
            path = path or got[1]
    return key, path, fields


def write_shards(
    source: Any,
    dest: str | os.PathLike[str],
    format: Literal["tar", "parquet"] = "tar",
    shard_size: int | str | None = None,
    samples_per_shard: int | None = None,
    workers: int | None = None,
    on_error: Literal["raise", "skip"] = "raise",
    storage_options: Mapping[str, str] | None = None,
    *,
    resize: int | None = None,
    quality: int = 90,
    prefix: str = "shard",
    progress: bool | None = None,
) -> PackSummary:
    """Pack ``source`` into shards under ``dest``, and return what was written.

    Args:
        source: an image folder (a path, or an `ImageFolder`: one subfolder per class,
            classes numbered in sorted order as torchvision's ``ImageFolder``), an
            `ImageFiles`, a ferrofeed source (`TarShards`, `ParquetShards`, `JsonLines`,
            `MDSShards`, or a path or pattern of such shards) to re-shard or convert, or a
            sequence (or iterable) of dict samples (``{"__key__": ..., "jpg": bytes, "cls":
            3}``; values bytes, str, int, float, or JSON-able dicts and lists).
        dest: a local folder (made if missing) or an object-storage prefix (``s3://``,
            ``gs://``, ``az://``). It must be empty, or hold an earlier run of this same pack,
            which is then resumed.
        format: ``"tar"``: WebDataset shards (``KEY.jpg`` with the image's bytes unchanged,
            ``KEY.cls``; any other field as ``KEY.FIELD``); ``"parquet"``: the Hugging Face
            image layout (``image`` {bytes, path}, ``label``; other fields as columns).
        shard_size: a shard takes samples until the next would take it past this many bytes
            (an int, or ``"256MB"``, ``"1GiB"``). Default 256 MiB unless
            ``samples_per_shard`` is given.
        samples_per_shard: a shard takes at most this many samples.
        workers: threads that read, check (and re-encode) samples (default: the CPUs).
        on_error: a file that is not an image or is truncated (or a sample that cannot be
            packed) stops the pack with `PackInputError` naming it (``"raise"``), or is left
            out and listed in the summary (``"skip"``). No partial shard is ever left.
        storage_options: for an object-storage ``dest``, as for `TarShards`.
        resize: re-encode each image with its shorter side this long (torchvision's
            ``Resize(resize)``), as a JPEG of ``quality``, in Rust.
        quality: the JPEG quality of re-encoded images (1 to 100).
        prefix: shards are named ``PREFIX-000000.tar`` (or ``.parquet``).
        progress: a progress bar on stderr (default: when stderr is a terminal).

    Returns:
        A `PackSummary`: samples, shards, bytes, seconds, skipped.

    Raises:
        PackInputError: a sample cannot be packed (``on_error="raise"``).
        PackDestinationError: ``dest`` cannot be written (raised before any shard when the
            folder or bucket is the problem: a missing bucket fails within seconds).
        PackConflictError: ``dest`` holds other files, or a pack of other input or options.

    Example:
        >>> import tempfile, os
        >>> out = os.path.join(tempfile.mkdtemp(), "shards")
        >>> samples = [{"txt": f"sample {i}", "cls": i % 2} for i in range(5)]
        >>> summary = write_shards(samples, out, samples_per_shard=2)
        >>> summary.samples, summary.shards
        (5, 3)
        >>> [s["cls"] for s in TarShards(os.path.join(out, "*.tar"))]
        [0, 1, 0, 1, 0]
    """
    if format not in ("tar", "parquet"):
        raise ValueError(f"format must be 'tar' or 'parquet', not {format!r}")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
    if samples_per_shard is not None and (
        isinstance(samples_per_shard, bool)
        or not isinstance(samples_per_shard, int)
        or samples_per_shard < 1
    ):
        raise ValueError(f"samples_per_shard must be a positive int, not {samples_per_shard!r}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)):
        raise TypeError(f"workers must be an int, not {workers!r}")
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    size = parse_size(shard_size) if shard_size is not None else None
    plan = _plan(source)
    files = plan if isinstance(plan, _Files) else None
    packer = _core._Packer(
        os.fspath(dest),
        format=format,
        shard_size=size,
        samples_per_shard=samples_per_shard,
        workers=workers if workers is not None else os.cpu_count() or 1,
        on_error=on_error,
        resize=resize,
        quality=quality,
        prefix=prefix,
        class_names=files.classes if files is not None else None,
        storage_options=sorted((str(k), str(v)) for k, v in (storage_options or {}).items()),
        input=json.dumps(plan.input, sort_keys=True, default=str),
    )
    total = len(plan.paths) if isinstance(plan, _Files) else plan.length
    show = sys.stderr.isatty() if progress is None else progress
    bar = _Bar(total, sys.stderr) if show else None
    try:
        if isinstance(plan, _Files):
            packer.add_files(plan.paths, plan.stored, plan.labels, bar)
        elif not packer.complete:
            position = packer.resume_at
            it = _iter_from(plan.items, position)
            while batch := [_sample(s) for s in itertools.islice(it, _BATCH)]:
                packer.add(batch, position)
                position += len(batch)
                if bar is not None:
                    bar(*packer.progress())
        done = packer.finish()
    except BaseException:
        packer.abort()
        raise
    finally:
        if bar is not None:
            bar.close()
    skipped = tuple(SkippedSample(*k) for k in done["skipped"])
    return PackSummary(
        samples=done["samples"],
        shards=done["shards"],
        bytes=done["bytes"],
        seconds=done["seconds"],
        skipped=len(skipped),
        skipped_samples=skipped,
        resumed=done["resumed"],
        dest=os.fspath(dest),
        index=done["index"],
    )


def index_shards(
    urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    storage_options: Mapping[str, str] | None = None,
    threads: int | None = None,
) -> str:
    """Write the sample index of tar shards made by any tool; return where it is.

    Every shard is read once (a remote one fetched whole) and scanned as `TarShards` reads
    it: its samples, the keys at its ends, and, for an uncompressed tar, where each sample's
    bytes start and end. The index (``_ferrofeed-index.json``, format version 1: see the
    README) goes into the shards' folder, which must be one; an index already there is
    replaced. `TarShards` then opens the shards without counting them, and remote ranks
    fetch only their samples' byte ranges.

    Args:
        urls: tar shards: a path, URL, pattern (braces, globs) or list, as for `TarShards`.
        storage_options: for URLs, as for `TarShards`.
        threads: shards scanned at once (default: up to 8; 4 for URLs).

    Raises:
        ValueError: the shards are in more than one folder, or are not tar shards.
        ShardCorruptError: a shard is damaged or splits a sample (its index would be wrong).

    Example:
        >>> import os, tempfile
        >>> out = os.path.join(tempfile.mkdtemp(), "shards")
        >>> _ = write_shards([{"txt": "a"}, {"txt": "b"}], out)
        >>> os.remove(os.path.join(out, "_ferrofeed-index.json"))
        >>> index_shards(os.path.join(out, "*.tar"))  # doctest: +ELLIPSIS
        '.../shards/_ferrofeed-index.json'
        >>> len(TarShards(os.path.join(out, "*.tar"), index=True))
        2
    """
    patterns = _patterns(urls)
    remote = [_remote.is_url(p) for p in patterns]
    if any(remote):
        _all_or_none(patterns, remote)
        config = _remote.RemoteConfig(storage_options=dict(storage_options or {}))
        objects = _remote.list_objects(patterns, config)
        paths = [u for u, _, _ in objects]
        stamps: list[tuple[int, str | None, int | None]] = [(n, e, None) for _, n, e in objects]
        shards: _core._RemoteShards | None = config.shards(objects)
        folders = {u.rsplit("/", 1)[0] for u in paths}
    else:
        if storage_options:
            raise ValueError("storage_options= are for shards in object storage (URLs)")
        paths = expand_shards(urls)
        stats = [os.stat(p) for p in paths]
        stamps = [(st.st_size, None, st.st_mtime_ns) for st in stats]
        shards = None
        folders = {os.path.dirname(os.path.abspath(p)) for p in paths}
    if len(folders) != 1:
        raise ValueError(
            f"an index describes one folder's shards; these are in {len(folders)} folders "
            f"({', '.join(sorted(folders)[:3])}, ...): index each folder on its own"
        )
    bare = [p.rsplit("/", 1)[-1] for p in paths]
    others = [p for p in bare if not p.endswith((".tar", ".tar.gz", ".tgz"))]
    if others:
        raise ValueError(
            f"{others[0]!r} is not a tar shard (.tar, .tar.gz, .tgz): an index describes tar "
            "shards (Parquet files hold their own in their footer)"
        )
    most = 4 if shards is not None else 8
    reader = _core._ShardReader("tar", paths, None, shards)
    scanned = _core._scan_shards(reader, threads or min(most, len(paths)))
    entries = sorted(
        (name, size, etag, mtime, *found)
        for name, (size, etag, mtime), found in zip(bare, stamps, scanned, strict=True)
    )
    (folder,) = folders
    return _core._write_index(
        folder, entries, sorted((str(k), str(v)) for k, v in (storage_options or {}).items())
    )
