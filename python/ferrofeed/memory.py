"""Per-process memory figures, read from ``/proc/PID/smaps_rollup`` (Linux).

USS (unique set size) is memory private to the process; PSS (proportional
set size) charges each shared page to every process that maps it in equal
parts, so the PSS of a group of processes adds up to what they use together.

Example:
    >>> from ferrofeed.memory import process_memory
    >>> m = process_memory()
    >>> m.uss <= m.rss
    True
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["MemoryInfo", "format_bytes", "process_memory"]


@dataclass(frozen=True)
class MemoryInfo:
    """Memory of one process, in bytes."""

    pid: int
    rss: int
    pss: int
    uss: int
    shared: int
    swap: int


def process_memory(pid: int | None = None) -> MemoryInfo:
    """Read the memory figures of process ``pid`` (this process by default).

    Raises:
        FileNotFoundError: the process does not exist (or this is not Linux).
        PermissionError: the process belongs to another user.

    Example:
        >>> process_memory().pss > 0
        True
    """
    pid = os.getpid() if pid is None else pid
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return MemoryInfo(
        pid=pid,
        rss=fields.get("Rss", 0),
        pss=fields.get("Pss", 0),
        uss=fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0),
        shared=fields.get("Shared_Clean", 0) + fields.get("Shared_Dirty", 0),
        swap=fields.get("Swap", 0),
    )


def format_bytes(n: float) -> str:
    """Format a byte count with a binary unit, e.g. ``'1.5 GiB'``.

    Example:
        >>> format_bytes(3 * 1024**2)
        '3.0 MiB'
    """
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
