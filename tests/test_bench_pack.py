"""benches/pack_compare.py (``make bench-pack``): a smoke run on tiny sizes produces its results.

The run goes through the script's own path (the folder of photo crops, every contender
packing it, the JSON and the table); the figures themselves are not checked (benchmarks are
not tests), but their presence and consistency are.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The slow tier (a benchmark's smoke run): `make test-slow`, not `make test`.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

pytest.importorskip("skimage")
pytest.importorskip("webdataset")

BENCHES = Path(__file__).resolve().parent.parent / "benches"


def test_pack_compare_smoke_run(tmp_path: Path) -> None:
    out = tmp_path / "pack"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}  # the installed ferrofeed
    proc = subprocess.run(
        [sys.executable, str(BENCHES / "pack_compare.py"), "--n", "24", "--repeats", "1",
         "--out", str(out)],
        capture_output=True, text=True, timeout=280, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["images"] == 24
    assert result["cpu"]
    names = set(result["seconds"])
    assert {"ferrofeed", "webdataset ShardWriter", "ferrofeed --resize 256 --quality 90"} <= names
    assert all(s["median"] > 0 for s in result["seconds"].values())
    assert "copy: ferrofeed / webdataset" in result["ratios"]
    assert ("LitData optimize()" in names) == (result["litdata"] == "used")
    table = out.with_suffix(".md").read_text()
    assert "| ferrofeed |" in table
    assert result["cpu"] in table
