"""benches/compare.py (``make compare``): a smoke run on tiny sizes produces its results.

The run goes through the script's own path (fresh interpreters per loader, alternating
rounds, the RAM job through benches/ram_loaders.py, the JSON, the tables, the plots), with
only the loaders installed here; the figures themselves are not checked (benchmarks are not
tests), but their presence, shapes and consistency are.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("PIL")
pytest.importorskip("skimage")
pytest.importorskip("matplotlib")
pytest.importorskip("tqdm")

BENCHES = Path(__file__).resolve().parent.parent / "benches"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def runs_here(key: str) -> bool:
    """Whether compare.py finds loader ``key`` usable here (installed, and SPDL's FFmpeg)."""
    sys.path.insert(0, str(BENCHES))
    try:
        import compare
    finally:
        sys.path.remove(str(BENCHES))
    return compare.available(compare.BY_KEY[key], None)[0]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, list[str]]:
    out = tmp_path_factory.mktemp("compare")
    loaders = ["ferrofeed-native", "ferrofeed-native-flip"]
    loaders += [k for k in ("pytorch-w0", "spdl") if runs_here(k)]
    # Never installed in the test environment's interpreter: it must be reported, not run.
    loaders.append("dataloader-rs")
    cmd = [
        sys.executable,
        str(BENCHES / "compare.py"),
        "--quick",
        "--n=32",
        "--epochs=2",
        "--ram-n=3000",
        "--ram-ranks=1",
        "--ram-workers=2",
        "--pss-interval=0.05",
        f"--loaders={','.join(loaders)}",
        f"--out-dir={out}",
        "--no-progress",
        "--no-torch-import",
    ]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return json.loads((out / "compare.json").read_text()), out, loaders


def test_every_installed_loader_ran_both_jobs(
    smoke: tuple[dict[str, Any], Path, list[str]],
) -> None:
    results, _, loaders = smoke
    ran = [k for k in loaders if k != "dataloader-rs"]
    assert set(results["summary"]) == {"exact", "train"}
    assert set(results["summary"]["train"]) == set(ran)
    # The native chain's flip variant is a training-job configuration only.
    assert set(results["summary"]["exact"]) == set(ran) - {"ferrofeed-native-flip"}
    for job, by_loader in results["runs"].items():
        for key, runs in by_loader.items():
            assert len(runs) == 1, (job, key)
            r = runs[0]
            assert r["images"] == 32 * 2
            assert len(r["epoch_s"]) == 2
            assert len(r["pss_epoch_end"]) == 2
            assert r["images_per_s"] > 0
            assert r["ttfb_s"] > 0
            # The whole tree's CPU time, seen from outside (exit included), covers the
            # loader's, seen from inside.
            assert r["cpu_tree_s"] >= r["cpu_loader_s"] + r["cpu_before_loader_s"] - 0.05
            assert r["cpu_s_per_1000"] > 0
            assert r["peak_pss"] >= max(r["pss_epoch_end"]) > 0


def test_ratios_pair_ferrofeed_with_each_peer(
    smoke: tuple[dict[str, Any], Path, list[str]],
) -> None:
    results, _, loaders = smoke
    peers = [k for k in loaders if not k.startswith("ferrofeed") and k != "dataloader-rs"]
    if not peers:
        pytest.skip("no peer loader installed (torch, spdl)")
    for job, table in results["ratios"].items():
        ours = [k for k in results["summary"][job] if k.startswith("ferrofeed")]
        assert set(table) == {f"{f} vs {p}" for f in ours for p in peers}
        for f_vs_p, r in table.items():
            f, p = f_vs_p.split(" vs ")
            mine = results["runs"][job][f][0]["images_per_s"]
            theirs = results["runs"][job][p][0]["images_per_s"]
            assert r["throughput"]["median"] == pytest.approx(mine / theirs)


def test_missing_loader_is_said_not_faked(
    smoke: tuple[dict[str, Any], Path, list[str]],
) -> None:
    results, out, _ = smoke
    assert "Python >= 3.13" in results["not_run"]["dataloader-rs"]
    assert "dataloader-rs" not in results["summary"]["exact"]
    said = [
        line for line in (out / "compare.md").read_text().splitlines() if "needs Python" in line
    ]
    assert len(said) == 1
    assert said[0].startswith("- dataloader-rs")


def test_ram_job_and_outputs(smoke: tuple[dict[str, Any], Path, list[str]]) -> None:
    results, out, _ = smoke
    ram = results["ram"]
    expected = {"ferrofeed DataLoader + SharedList, fork"}
    if importlib.util.find_spec("torch") is not None:
        expected.add("PyTorch DataLoader + list, fork")
    assert {r["container"] for r in ram["runs"]} == expected
    assert ram["layout"] == "1 ranks x 2 workers"
    for r in ram["runs"]:
        assert r["footprint"] is not None
        assert r["footprint"] > 0
        assert r["n"] == 3000
        assert len(r["series"]) >= 2
        assert r["peak_total_pss"] >= r["total_pss_end"] > 0
    md = (out / "compare.md").read_text()
    assert "#### exact 224" in md
    assert "#### training" in md
    assert "#### metadata only" in md
    for name in ("throughput", "cpu", "pss", "ram"):
        png = out / f"compare_{name}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC, name


def test_varied_jpegs_are_seeded_and_mixed(tmp_path: Path) -> None:
    sys.path.insert(0, str(BENCHES))
    try:
        from _common import make_jpegs
    finally:
        sys.path.remove(str(BENCHES))
    from PIL import Image

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    files, info = make_jpegs(str(tmp_path / "a"), 60, seed=5, varied=True)
    again, _ = make_jpegs(str(tmp_path / "b"), 60, seed=5, varied=True)
    assert [label for _, label in files] == [label for _, label in again]
    assert all(
        Path(a).read_bytes() == Path(b).read_bytes()
        for (a, _), (b, _) in zip(files, again, strict=True)
    )
    modes, progressive, large = set(), 0, 0
    for path, _ in files:
        with Image.open(path) as im:
            modes.add(im.mode)
            progressive += bool(im.info.get("progressive"))
            large += max(im.size) > 500
            assert max(im.size) <= 1000
    assert modes == {"RGB", "L"}
    assert progressive > 0
    assert large > 0
    assert info["grey"] > 0
    assert info["subsampling"]["4:2:0"] > 40
