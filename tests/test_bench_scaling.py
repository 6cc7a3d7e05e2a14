"""benches/scaling.py (``make bench-scaling``): a smoke run on tiny sizes produces its results.

The run goes through the script's own path (a fresh interpreter per row, the rounds, the
per-thread CPU of the decode pool, the JSON, the tables); the figures themselves are not
checked (benchmarks are not tests), but their presence and consistency are. The split of a
process's CPU between the pool and the rest is checked on made-up thread samples.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from conftest import BENCHES, import_bench

# The slow tier (a benchmark's smoke run): `make test-slow`, not `make test`.
pytestmark = pytest.mark.slow

pytest.importorskip("PIL")
pytest.importorskip("skimage")

N = 64  # images: two batches of 32


def run_scaling(out: Path, *args: str) -> tuple[dict[str, Any], str]:
    """Run scaling.py ``--quick`` on `N` images (shards of 16) with ``args`` into ``out``;
    return its scaling.json and what it printed."""
    cmd = [
        sys.executable,
        str(BENCHES / "scaling.py"),
        "--quick",
        f"--n={N}",
        "--shard-size=16",
        f"--out={out}",
        *args,
    ]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return json.loads((out / "scaling.json").read_text()), proc.stdout


class Smoke(NamedTuple):
    results: dict[str, Any]
    out: Path
    stdout: str


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> Smoke:
    out = tmp_path_factory.mktemp("scaling")
    # Both sources at 1, 2 and 4 threads, and the proxy rows (batches of 2 on 1 thread and
    # of 4 on 2 threads; their batches of 32 are rows of the grid already).
    results, stdout = run_scaling(out, "--threads=1,2,4", "--batch-sizes=32", "--jobs=train")
    return Smoke(results, out, stdout)


def test_every_row_ran_once_with_consistent_figures(smoke: Smoke) -> None:
    results = smoke.results
    grid = {f"ferrofeed/{s}/train/t{t}/b32" for s in ("folder", "tar") for t in (1, 2, 4)}
    proxy = {"ferrofeed/folder/train/t1/b2", "ferrofeed/folder/train/t2/b4"}
    assert set(results["configs"]) == grid | proxy
    assert set(results["runs"]) == grid | proxy
    assert results["cores"] == os.cpu_count()
    assert results["ferrofeed"]["version"]
    for key, runs in results["runs"].items():
        cfg = results["configs"][key]
        assert len(runs) == 1, key  # --quick: one round
        r = runs[0]
        assert r["images_per_epoch"] == [N, N], key  # the warm-up and one timed epoch
        assert r["images"] == N
        assert r["images_per_s"] == pytest.approx(N / r["wall_s"])
        assert r["cpu_s"] > 0
        assert r["threads_busy"] > 0
        assert r["threads_busy"] == pytest.approx(r["cpu_s"] / r["wall_s"] / cfg["threads"])
        assert r["cpu_ms_per_image"] == pytest.approx(r["cpu_s"] / N * 1e3)
        assert r["images_per_thread_per_batch"] == cfg["batch"] / cfg["threads"]
        assert r["children_left"] == 0
        assert 0 <= r["serial_share"] <= 1
        assert isinstance(r["decode_pool"], dict)
        # Every CPU second of the process is somewhere in the split by thread.
        assert sum(r["cpu_by_thread"].values()) >= r["cpu_process_s"] - 0.01
        if cfg["threads"] >= 2:
            # The batch fans out to the decode pool: the script finds its threads.
            assert r["decode_in_pool"], key
            assert r["pool_threads"] >= 2
            assert r["pool_busy"] > 0
            assert r["serial_share"] < 0.5


def test_rows_say_when_threads_exceed_cores(smoke: Smoke) -> None:
    results = smoke.results
    cores = results["cores"]
    for key, cfg in results["configs"].items():
        assert (f"T > {cores} cores" in results["notes"][key]) == (cfg["threads"] > cores), key


def test_proxy_ratios_pair_small_batches_with_batches_of_32(smoke: Smoke) -> None:
    results = smoke.results
    pairs = {(p["threads"], p["batch"], p["base_batch"]) for p in results["proxy"]}
    assert pairs == {(1, 2, 32), (2, 4, 32)}
    for p in results["proxy"]:
        small = results["runs"][p["small"]][0]["images_per_s"]
        base = results["runs"][p["base"]][0]["images_per_s"]
        assert p["ratio"]["median"] == pytest.approx(small / base)
    assert any("2 per thread" in t for t in results["targets"])


def test_tables_name_the_cpu_and_are_printed(smoke: Smoke) -> None:
    cpu_model = import_bench("bench_machine").cpu_model
    results, out = smoke.results, smoke.out
    md = (out / "scaling.md").read_text()
    heading = f"#### Scaling of the native chain, on {cpu_model()} ({results['cores']} cores)"
    assert md.startswith(heading)
    assert heading in smoke.stdout
    rows = [line for line in md.splitlines() if line.startswith("| **ferrofeed native chain**")]
    assert len(rows) == len(results["configs"])
    assert "Two images per thread per batch" in md
    assert "Targets:" in md


def test_compare_runs_the_peers_or_says_why(tmp_path: Path) -> None:
    """With --compare, PyTorch's loaders run at the same threads and batch (where torch and
    torchvision run here), or are listed with the reason."""
    results, stdout = run_scaling(
        tmp_path,
        "--compare",
        "--threads=1",
        "--batch-sizes=32",
        "--jobs=train",
        "--sources=folder",
        "--proxy-threads=",
    )
    ours = "ferrofeed/folder/train/t1/b32"
    # Where torch is installed, the PyTorch + Pillow loader runs; torchvision's may be left
    # out (none built for the installed torch), as compare.py's own probe decides.
    if importlib.util.find_spec("torch") is not None:
        assert "pytorch" not in results["not_run"]
    for peer in ("pytorch", "torchvision"):
        key = f"{peer}/folder/train/t1/b32"
        if peer not in results["not_run"]:
            (r,) = results["runs"][key]
            assert r["images_per_epoch"] == [N, N]
            assert r["children_left"] == 0
            assert r["cpu_s"] > 0
            assert r["serial_share"] is None  # a process tree: no per-thread split
            ratio = results["peer_ratios"][ours][peer]["throughput"]["median"]
            mine = results["runs"][ours][0]["images_per_s"]
            assert ratio == pytest.approx(mine / r["images_per_s"])
        else:
            assert key not in results["runs"]
            assert results["not_run"][peer]
            assert f"skipped {peer} (" in stdout
            assert "Not run:" in (tmp_path / "scaling.md").read_text()


def sample(comm: str, cpu: float, wait: float | None = 0.0) -> Any:
    return import_bench("_scaling_threads").ThreadSample(comm, cpu, wait)


def test_thread_figures_split_the_pool_from_the_rest() -> None:
    threads = import_bench("_scaling_threads")
    before = {
        1: sample("python", 1.0),
        10: sample("ferrofeed-cpu-0", 0.5, 0.1),
        11: sample("ferrofeed-cpu-1", 0.5, 0.1),
        12: sample("ferrofeed-rt", 0.2),
    }
    after = {
        1: sample("python", 1.1),
        10: sample("ferrofeed-cpu-0", 1.4, 0.2),
        11: sample("ferrofeed-cpu-1", 1.3, 0.2),
        12: sample("ferrofeed-rt", 0.25),
        13: sample("ferrofeed-cpu-2", 0.0),  # started in between, idle
    }
    # 2.0 s of process CPU: 1.7 in the pool, 0.1 main, 0.05 runtime, 0.15 in threads that
    # ended in between.
    f = threads.thread_figures(before, after, main_tid=1, process_cpu_s=2.0, wall_s=1.0, threads=2)
    assert f["pool_threads"] == 3
    assert f["pool_cpu_s"] == pytest.approx(1.7)
    assert f["pool_busy"] == pytest.approx(1.7 / 2)  # over the 2 threads at work
    assert f["pool_runnable"] == pytest.approx((1.7 + 0.2) / 2)
    assert f["serial_share"] == pytest.approx(0.3 / 2.0)
    assert f["decode_in_pool"]
    assert f["cpu_by_thread"] == pytest.approx(
        {"main": 0.1, "ferrofeed-cpu": 1.7, "ferrofeed-rt": 0.05, "ended in between": 0.15}
    )
    # One thread: the batch decodes on the op's thread, not in the pool.
    f = threads.thread_figures(
        {1: sample("python", 0.0), 12: sample("ferrofeed-rt", 0.0)},
        {1: sample("python", 0.1), 12: sample("ferrofeed-rt", 0.9, None)},
        main_tid=1,
        process_cpu_s=1.0,
        wall_s=1.0,
        threads=1,
    )
    assert f["pool_busy"] is None
    assert f["pool_runnable"] is None
    assert f["serial_share"] == pytest.approx(1.0)
    assert not f["decode_in_pool"]
