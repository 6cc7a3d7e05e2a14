"""benches/mix_cost.py (``make bench-mix``): a smoke run on tiny sizes produces its results.

The run goes through the script's own path (a fresh interpreter per run, ``one`` and
``mix`` taking turns, the resume measures, the JSON and the tables); the figures are not
checked (benchmarks are not tests), their presence and consistency are.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The slow tier (a benchmark's smoke run): `make test-slow`, not `make test`.
pytestmark = pytest.mark.slow

pytest.importorskip("PIL")
pytest.importorskip("skimage")

BENCHES = Path(__file__).resolve().parent.parent / "benches"


def test_mix_cost_smoke_run(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        str(BENCHES / "mix_cost.py"),
        "--rounds=1",
        "--n=64",
        "--epochs=1",
        f"--out={tmp_path}",
    ]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    result = json.loads((tmp_path / "mix_cost.json").read_text())
    runs = result["runs"]
    assert {(r["source"], r["mode"]) for r in runs} == {
        (s, m) for s in ("folder", "tar") for m in ("one", "mix")
    }
    for r in runs:
        # Both read the same images: the mixture stops at its shortest half, within a batch.
        assert 64 - 32 <= r["images"] <= 64
        assert r["images_per_s"] > 0
        assert r["cpu_ms_per_image"] > 0
    sizes = [r["samples_per_source"] for r in result["resume"]]
    assert sizes == [10**6, 10**8]
    assert all(r["state_bytes"] < 4096 for r in result["resume"])
    table = (tmp_path / "mix_cost.md").read_text()
    assert "mix / one" in table
    assert "100,000,000" in table
    assert result["machine"]["cpu"]
