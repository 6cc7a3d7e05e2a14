"""The ``ferrofeed`` command line.

``ferrofeed demo`` runs the main job end to end and prints what it measured;
``ferrofeed inspect ARENA`` validates an arena file and prints its header;
``ferrofeed clean [DIR ...]`` removes the orphaned arenas (no process holds them) of the
arena directory, or of each ``DIR``, and prints what it removed;
``ferrofeed pack SRC DEST`` packs an image folder (or shards, to re-shard or convert) into
tar or Parquet shards (see `ferrofeed.write_shards`); ``ferrofeed index PATTERN`` writes the
sample index of tar shards made by other tools (see `ferrofeed.index_shards`).
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["main"]


def _inspect(argv: list[str]) -> int:
    from . import ArenaError, SharedList
    from .memory import format_bytes

    parser = argparse.ArgumentParser(
        prog="ferrofeed inspect", description="Validate an arena file and print its header."
    )
    parser.add_argument("arena", help="path of the arena file")
    args = parser.parse_args(argv)
    try:
        sl: SharedList[object] = SharedList.open(args.arena)
    except ArenaError as e:
        print(f"ferrofeed inspect: {e}", file=sys.stderr)
        return 1
    with sl:
        header = sl.header()
        print(f"arena      {sl.path}")
        print(f"valid      yes (format version {header['format_version']})")
        print(f"items      {header['item_count']:,}")
        print(f"file size  {format_bytes(sl.nbytes)} ({sl.nbytes:,} bytes)")
        print(f"data       bytes {header['data_offset']:,} to {header['index_offset']:,}")
        print(f"index      bytes {header['index_offset']:,} to {header['file_len']:,}")
        if len(sl):
            sizes = [len(sl.raw(i)) for i in range(len(sl))]
            print(
                f"item size  min {min(sizes):,} / mean {sum(sizes) / len(sizes):,.0f} / "
                f"max {max(sizes):,} bytes"
            )
    return 0


def _clean(argv: list[str]) -> int:
    from . import _core
    from ._shared_list import default_arena_dir

    parser = argparse.ArgumentParser(
        prog="ferrofeed clean",
        description=(
            "Remove orphaned arenas: arena files that no process maps any more (their "
            "owner was killed before it could remove them), and half-written ones of dead "
            "writers. Arenas in use are never touched."
        ),
    )
    parser.add_argument(
        "dirs",
        nargs="*",
        metavar="DIR",
        help="directories to clean (default: the arena directory, $FERROFEED_ARENA_DIR or "
        "/dev/shm)",
    )
    args = parser.parse_args(argv)
    dirs = args.dirs or [str(default_arena_dir())]
    status = 0
    total = 0
    for d in dirs:
        if not os.path.isdir(d):
            print(f"ferrofeed clean: {d}: not a directory", file=sys.stderr)
            status = 1
            continue
        for path in _core.sweep(d):
            print(f"removed {path}")
            total += 1
    print(f"ferrofeed clean: removed {total} orphaned arena file{'s' if total != 1 else ''}")
    return status


def _storage_option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _with_storage_options(p: argparse.ArgumentParser, whose: str) -> argparse.ArgumentParser:
    """``p`` with ``--storage-option KEY=VALUE`` (repeatable): the options of ``whose`` store."""
    p.add_argument(
        "--storage-option",
        type=_storage_option,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"an option of {whose} store (repeatable)",
    )
    return p


def _pack_arguments() -> argparse.ArgumentParser:
    """``ferrofeed pack``'s arguments: named as `ferrofeed.write_shards`' keywords."""
    from ._pack import parse_size

    p = argparse.ArgumentParser(
        prog="ferrofeed pack",
        description=(
            "Pack an image folder (one subfolder per class), or shards (.tar, .parquet, "
            ".jsonl, an MDS folder: re-shard or convert), into WebDataset tar shards or "
            "Parquet files in the Hugging Face image layout, in parallel, locally or into "
            "object storage. Run again after an interruption, it resumes."
        ),
    )
    p.add_argument("src", help="image folder, or shards (path or pattern)")
    p.add_argument("dest", help="a new or empty folder, or s3://bucket/prefix (gs://, az://)")
    p.add_argument("--format", choices=("tar", "parquet"), default="tar")
    p.add_argument("--shard-size", type=parse_size, help="bytes per shard at most (256MB, 1GiB)")
    p.add_argument("--samples-per-shard", type=int, help="samples per shard at most")
    p.add_argument("--workers", type=int, help="threads (default: the CPUs)")
    p.add_argument(
        "--on-error",
        choices=("raise", "skip"),
        default="raise",
        help="stop at a bad image (default), or skip it and count it",
    )
    p.add_argument("--resize", type=int, help="re-encode: shorter side to this many pixels")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality of --resize")
    p.add_argument("--prefix", default="shard", help="shard names: PREFIX-000000.tar")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return _with_storage_options(p, "DEST's")


def _pack(argv: list[str]) -> int:
    from . import PackError, write_shards

    keywords = vars(_pack_arguments().parse_args(argv))
    src, dest = keywords.pop("src"), keywords.pop("dest")
    storage = dict(keywords.pop("storage_option"))
    progress = False if keywords.pop("no_progress") else None
    try:
        summary = write_shards(src, dest, storage_options=storage, progress=progress, **keywords)
    except (PackError, FileNotFoundError, ValueError, TypeError) as e:
        print(f"ferrofeed pack: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("ferrofeed pack: interrupted (run it again to resume)", file=sys.stderr)
        return 130
    print(summary)
    return 0


def _index(argv: list[str]) -> int:
    from . import ShardError, index_shards

    what = (
        "Write the sample index (_ferrofeed-index.json) of tar shards made by any tool, into "
        "their folder: TarShards then opens them without counting, and remote ranks fetch "
        "only their samples' bytes."
    )
    p = _with_storage_options(
        argparse.ArgumentParser(prog="ferrofeed index", description=what), "the shards'"
    )
    p.add_argument("pattern", nargs="+", help="tar shards: paths, URLs, braces or globs")
    p.add_argument("--threads", type=int, help="shards scanned at once")
    args = p.parse_args(argv)
    try:
        where = index_shards(
            args.pattern, storage_options=dict(args.storage_option), threads=args.threads
        )
    except (ShardError, FileNotFoundError, ValueError) as e:
        print(f"ferrofeed index: {e}", file=sys.stderr)
        return 1
    print(f"index: {where}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the ``ferrofeed`` command line."""
    argv = sys.argv[1:] if argv is None else argv
    commands = {
        "demo": "run the main job on generated data and print what it measured",
        "inspect": "validate an arena file and print its header",
        "clean": "remove orphaned arenas (that no process holds) and print what went",
        "pack": "pack an image folder or shards into tar or Parquet shards",
        "index": "write the sample index of tar shards made by other tools",
    }
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        print("usage: ferrofeed {demo,inspect,clean,pack,index} ...\n")
        for name, text in commands.items():
            print(f"  {name:<9}{text}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    if argv[0] == "demo":
        from ._demo import main as demo

        return demo(argv[1:])
    if argv[0] == "clean":
        return _clean(argv[1:])
    if argv[0] == "pack":
        return _pack(argv[1:])
    if argv[0] == "index":
        return _index(argv[1:])
    return _inspect(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
