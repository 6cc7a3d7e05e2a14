"""benches/build_ab.py (builds side by side) and benches/fresh_clone.py (the README
commands' times on fresh clones) run, and record what they say they record.

Both run in a subprocess on something small: build_ab.py with this interpreter as both
"builds" (one round, a few images), fresh_clone.py with `make help` as the target (a clone,
a make run, no build). Their figures are the benchmarks' business, not asserted here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# The slow tier (a benchmark's smoke run): `make test-slow`, not `make test`.
pytestmark = pytest.mark.slow

BENCHES = Path(__file__).resolve().parents[1] / "benches"


def build_ab(out: Path, *args: str) -> dict[str, Any]:
    """Run benches/build_ab.py with two builds (both this interpreter), into ``out``."""
    pytest.importorskip("PIL")
    pytest.importorskip("skimage")
    builds = ["--build", f"a={sys.executable}", "--build", f"b={sys.executable}"]
    proc = subprocess.run(
        [sys.executable, str(BENCHES / "build_ab.py"), *builds, "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=220,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads((out / "build_ab.json").read_text())
    return result


@pytest.mark.timeout(240)
def test_build_ab_runs_every_build_every_round(tmp_path: Path) -> None:
    out = tmp_path / "ab"
    run = ["--rounds", "2", "--n", "48", "--epochs", "1", "--batch-size", "16"]
    result = build_ab(out, *run, "--jobs", "train,exact")
    runs = result["runs"]
    assert sorted((r["round"], r["job"], r["build"]) for r in runs) == sorted(
        (k, job, b) for k in range(2) for job in ("train", "exact") for b in ("a", "b")
    )
    for r in runs:
        # Every timed epoch reads all 48 images (batches of 16, none dropped).
        assert r["images"] == 48
        assert r["images_per_s"] > 0
        assert r["cpu_ms_per_image"] > 0
        assert r["build_info"]["version"]
    assert set(result["median_ratios"]) == {"train", "exact"}
    assert set(result["median_ratios"]["train"]) == {"b"}
    table = (out / "build_ab.md").read_text()
    assert table.count("\n| train |") == 2
    assert "| exact | b |" in table


@pytest.mark.timeout(240)
def test_build_ab_reads_tar_shards_of_the_size_and_window_given(tmp_path: Path) -> None:
    run = ["--rounds", "1", "--n", "48", "--epochs", "1", "--batch-size", "8"]
    tar = ["--source", "tar", "--shard-size", "20", "--shuffle-window", "16"]
    result = build_ab(tmp_path / "ab", *run, *tar)
    assert (result["args"]["shard_size"], result["args"]["shuffle_window"]) == (20, 16)
    assert [r["images"] for r in result["runs"]] == [48, 48]


def test_build_ab_refuses_a_single_build() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCHES / "build_ab.py"), "--build", f"a={sys.executable}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    assert "two builds or more" in proc.stderr


@pytest.mark.timeout(120)
def test_fresh_clone_times_a_target_in_a_clone_of_its_own(tmp_path: Path) -> None:
    out = tmp_path / "fresh.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCHES / "fresh_clone.py"),
            "--targets",
            "help",
            "--out",
            str(out),
            "--logs",
            str(tmp_path / "logs"),
        ],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    head = subprocess.run(
        ["git", "-C", str(BENCHES.parent), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert result["commit"] == head
    assert result["cores"] >= 1
    assert result["cpu"]
    (target,) = result["targets"].items()
    assert target[0] == "help"
    assert target[1]["returncode"] == 0
    assert target[1]["wall_s"] >= 0
    # The clone's `make help` listed the targets, into the log.
    log = (tmp_path / "logs" / "fresh_clone-help.log").read_text()
    assert "demo" in log
    assert "test-slow" in log
