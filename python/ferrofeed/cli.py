"""The ``ferrofeed`` command line.

``ferrofeed demo`` runs the main job end to end and prints what it measured;
``ferrofeed inspect ARENA`` validates an arena file and prints its header.
"""

from __future__ import annotations

import argparse
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


def main(argv: list[str] | None = None) -> int:
    """Run the ``ferrofeed`` command line."""
    argv = sys.argv[1:] if argv is None else argv
    commands = {
        "demo": "run the main job on generated data and print what it measured",
        "inspect": "validate an arena file and print its header",
    }
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        print("usage: ferrofeed {demo,inspect} ...\n")
        for name, text in commands.items():
            print(f"  {name:<9}{text}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    if argv[0] == "demo":
        from ._demo import main as demo

        return demo(argv[1:])
    return _inspect(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
