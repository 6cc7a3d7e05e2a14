"""How long the README's two commands take on a fresh clone, as a new user runs them.

``python benches/fresh_clone.py [--ref HEAD] [--targets demo,test] [--out
benches/results/fresh_clone.json]``

For each make target in ``--targets`` (default ``demo`` and ``test``), a fresh clone of
this repository at ``--ref`` is made in a temporary folder, and ``make TARGET`` runs there
from scratch, alone: its venvs, its build, the packages it installs, its tests. One clone
per target, so each is timed as a new user who runs only that command would see it (a user
who runs ``make demo`` first finds ``make test`` quicker: the wheel is built already).
What a fresh machine's caches would hold anyway is left as it is: cargo's registry of
downloaded crates and pip's cache of downloaded wheels (so the figures leave out download
time, which depends on the network).

Results: ``--out`` gets the machine (CPU model, cores), the commit, and each target's wall
seconds and CPU seconds (user + system of make and everything it ran); the README's quick
start quotes these figures, and ``tests/test_packaging.py`` checks that it quotes the latest.
Each target's output goes to ``--logs``/fresh_clone-TARGET.log. Run it with nothing
else running: the figures are the machine's, not a share of it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _runs import cpu_children
from bench_machine import cpu_model

REPO = Path(__file__).resolve().parent.parent


def run_target(commit: str, target: str, log: Path, timeout: float) -> dict[str, float | int]:
    """``make TARGET`` in a fresh clone at ``commit``: wall and CPU seconds, exit code."""
    work = Path(tempfile.mkdtemp(prefix=f"ff-fresh-{target}-"))
    try:
        clone = work / "ferrofeed"
        subprocess.run(["git", "clone", "-q", "--no-checkout", str(REPO), str(clone)], check=True)
        subprocess.run(["git", "-C", str(clone), "checkout", "-q", commit], check=True)
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        cpu0, t0 = cpu_children(), time.perf_counter()
        with log.open("w") as f:
            proc = subprocess.run(
                ["make", target],
                cwd=clone,
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
        wall, cpu = time.perf_counter() - t0, cpu_children() - cpu0
        return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "returncode": proc.returncode}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ref", default="HEAD", help="the commit to clone (default HEAD)")
    p.add_argument("--targets", default="demo,test", help="make targets, one clone each")
    p.add_argument("--out", default="benches/results/fresh_clone.json")
    p.add_argument("--logs", default="bench-results", help="folder of the make logs")
    p.add_argument("--timeout", type=float, default=3600.0, help="per target, seconds")
    args = p.parse_args()

    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", args.ref], check=True, capture_output=True, text=True
    ).stdout.strip()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, object] = {
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "machine": platform.platform(),
    }
    targets: dict[str, object] = {}
    for target in args.targets.split(","):
        log = Path(args.logs) / f"fresh_clone-{target}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        res = run_target(commit, target, log, args.timeout)
        targets[target] = res
        print(
            f"make {target}: {res['wall_s'] / 60:.1f} min wall, {res['cpu_s'] / 60:.1f} min CPU, "
            f"exit {res['returncode']} (log: {log})",
            flush=True,
        )
        if res["returncode"] != 0:
            sys.exit(f"make {target} failed: see {log}")
    result["targets"] = targets
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
