"""benches/ram_loaders.py (the RAM of 2 ranks x 4 workers, ferrofeed vs PyTorch) runs.

The quick mode runs in a subprocess: every configuration completes, every loader reads
each item once, the process trees hold what the job starts (ranks, workers, forkserver
helpers), and rank 1 maps the arena rank 0 built. The memory targets themselves are the
benchmark's business (BENCHMARKS.md), not asserted here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BENCHES, import_bench

# The slow tier (a benchmark's smoke run): `make test-slow`, not `make test`.
pytestmark = pytest.mark.slow


def test_coco_collate_reads_every_field() -> None:
    items = list(import_bench("_ram_common").coco_annotations(50, seed=3))
    batch = import_bench("_ram_rank").coco_collate(items)
    assert batch["id"].tolist() == [a["id"] for a in items]
    assert batch["category_id"].tolist() == [a["category_id"] for a in items]
    assert batch["bbox"].shape == (50, 4)
    assert batch["bbox"][7].tolist() == pytest.approx(items[7]["bbox"], rel=1e-6)
    flat = [x for a in items for poly in a["segmentation"] for x in poly]
    assert batch["points"].tolist() == pytest.approx(flat, rel=1e-6)
    assert batch["num_points"].sum() == len(flat)


# The quick mode with both loaders takes 60-100 s on a 2-core machine (8 configurations;
# each rank imports torch, and PyTorch's forkserver workers import it again): it runs when
# FERROFEED_BENCH_TESTS=1 (and in `make bench-ram-workers`). ferrofeed's side alone runs
# always (about 30 s).
BOTH = pytest.mark.skipif(
    os.environ.get("FERROFEED_BENCH_TESTS") != "1",
    reason="60-100 s: set FERROFEED_BENCH_TESTS=1 to run the quick mode with both loaders",
)


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "loaders",
    [pytest.param("ferrofeed", id="ferrofeed"), pytest.param(None, id="both", marks=BOTH)],
)
def test_quick_mode_runs(tmp_path: Path, loaders: str | None) -> None:
    out = tmp_path / "ram_loaders.json"
    cmd = [sys.executable, str(BENCHES / "ram_loaders.py"), "--quick", "--out", str(out)]
    if loaders is not None:
        cmd += ["--loaders", loaders]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=230)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    p = res["params"]
    have_torch = importlib.util.find_spec("torch") is not None
    expected_loaders = ["ferrofeed"] + (["torch"] if have_torch and loaders is None else [])
    assert p["loaders"] == expected_loaders
    labels = sorted(c["label"] for c in res["configs"])
    expected = sorted(
        f"{m}/{lo}{suffix}"
        for m in p["methods"]
        for lo in expected_loaders
        for suffix in ("", "/baseline")
    )
    assert labels == expected
    assert all(c["ok"] for c in res["checks"]), res["checks"]
    for c in res["configs"]:
        assert c["ok"], c.get("error") or c.get("aborted")
        roles = [q["role"] for q in c["processes_end"]]
        assert roles.count("rank") == p["ranks"]
        assert roles.count("worker") == p["ranks"] * p["workers"], c["processes_end"]
        if c["method"] == "forkserver":  # a server (and a resource tracker) per rank
            assert roles.count("aux") >= p["ranks"]
        assert c["steady_total_pss"] > 0
        assert c["peak_total_pss"] >= c["steady_total_pss"]
        if c["loader"] == "ferrofeed":  # rank 1 mapped the arena rank 0 built
            sizes = {r["arena_bytes"] for r in c["ranks"]}
            assert len(sizes) == 1
            assert sizes.pop() > 0
    assert [t["method"] for t in res["targets"]] == p["methods"]
    for t in res["targets"]:
        assert t["steady_one_copy_ratio"] > 0
        assert ("steady_torch_ratio" in t) == ("torch" in expected_loaders)
    assert "ferrofeed RAM of real loaders" in proc.stdout
