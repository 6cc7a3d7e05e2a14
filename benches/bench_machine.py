"""What the benchmark scripts record about the machine they ran on.

The scripts in this folder import it as a sibling module (``python benches/NAME.py`` puts
this folder first on ``sys.path``).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else ``platform.processor()``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> str:
    """``CPU, architecture, N CPUs, M GiB``: the machine as results, tables and plots name it."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{cpu_model()}, {platform.machine()}, {os.cpu_count()} CPUs, {memory:.0f} GiB"


def loadavg() -> list[float]:
    """The load averages over 1, 5 and 15 minutes, rounded to hundredths."""
    return [round(x, 2) for x in os.getloadavg()]


def stamp(script: str, argv: list[str]) -> dict[str, Any]:
    """What every result file of ``script`` starts with: the CPU, the machine, the command
    line, the time and the load average at the start."""
    return {
        "cpu": cpu_model(),
        "machine": machine(),
        "command": f"python benches/{script} " + " ".join(argv),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "loadavg_start": loadavg(),
    }


def version_of(dist: str, python: str | None = None) -> str | None:
    """The installed version of distribution ``dist`` (in the interpreter ``python``, when
    given), or None where it is not installed."""
    if python:
        probe = subprocess.run(
            [python, "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
            capture_output=True,
            text=True,
        )
        return probe.stdout.strip() or None if probe.returncode == 0 else None
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions(*dists: str) -> dict[str, str | None]:
    """Python's version, and the version of each distribution of ``dists`` (None where it
    is not installed)."""
    return {"python": platform.python_version(), **{d: version_of(d) for d in dists}}
