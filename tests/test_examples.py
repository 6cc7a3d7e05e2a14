"""The examples run (in a small, fast configuration)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SHM = Path("/dev/shm")


@pytest.mark.timeout(120)
def test_coco_metadata_example(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "coco_metadata.py"), "--n", "5000", "--workers", "2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode == 0, proc.stderr
    assert "all workers agree" in proc.stdout
    assert proc.stdout.count("read all 5,000 items") == 2


@pytest.mark.timeout(300)
@pytest.mark.parametrize("script", ["torch_train.py", "jax_train.py"])
def test_training_examples_smoke(tmp_path: Path, script: str) -> None:
    # find_spec, not importorskip: importing JAX here would make later fork tests warn.
    framework = "torch" if script.startswith("torch") else "jax"
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not installed")
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--smoke"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=290,
    )
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("trained "), proc.stdout
    first_loss = float(last.split("first loss ")[1].split(",")[0])
    last_loss = float(last.split("last ")[1])
    # The model learns from the batches (a broken loader would feed it noise or repeats).
    assert last_loss < 0.5 * first_loss, proc.stdout


def _gloo_available() -> bool:
    # In a subprocess: the pytest process imports no framework it does not need.
    probe = "import torch.distributed as d; assert d.is_available() and d.is_gloo_available()"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=60)
    return proc.returncode == 0


@pytest.mark.timeout(120)
def test_torchrun_shared_arena_example(tmp_path: Path, arena_dir: Path) -> None:
    """Two torchrun ranks map one arena for the node and read disjoint shards of it."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    if not _gloo_available():
        pytest.skip("torch.distributed with the gloo backend is not available")
    name = f"torchrun-test-{uuid.uuid4().hex[:12]}"
    report = tmp_path / "report.json"
    n, world, batch_size = 1001, 2, 64  # 1001 = 2 * 501 - 1: one padding sample
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
        str(EXAMPLES / "torchrun_shared_arena.py"), "--smoke", "--items", str(n),
        "--batch-size", str(batch_size), "--epochs", "2", "--threads", "1",
        "--arena-dir", str(arena_dir), "--name", name, "--timeout", "60", "--report", str(report),
    ]  # fmt: skip
    # Any other arena the run made would land in the private dir too, and be seen there.
    env = {**os.environ, "FERROFEED_ARENA_DIR": str(arena_dir), "OMP_NUM_THREADS": "1"}
    # A session of its own: on a timeout, the ranks (torchrun's children) die with it.
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=100)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"torchrun timed out\n{out}\n{err}")
    assert proc.returncode == 0, f"{out}\n{err}"
    assert "ok: 2 ranks, 2 epoch(s) checked, one arena, nothing left" in out, out

    facts = json.loads(report.read_text())
    assert facts["problems"] == []
    ranks = facts["ranks"]
    assert facts["world_size"] == world
    assert [r["rank"] for r in ranks] == [0, 1]
    assert len({r["pid"] for r in ranks}) == world
    assert [r["owner"] for r in ranks] == [True, False]  # local rank 0 built it

    # One arena file for the node, mapped by both ranks: the same (device, inode) in each
    # rank's /proc/self/smaps, and the directory (private to this test) held exactly that
    # file, no claim or partial file, whenever a rank listed it: after every rank had mapped
    # it, and again after training, both times between barriers, so both ranks were running.
    arena_name = f"ferrofeed-shared-{name}.arena"
    assert facts["arena_name"] == arena_name
    file_id = ranks[0]["stat"]
    for r in ranks:
        assert r["path"] == str(arena_dir / arena_name)
        assert r["mapped"] == [file_id]
        assert r["stat"] == file_id
        assert r["entries_start"] == [arena_name] == r["entries_end"]
    # Both read every item: each maps the whole file, and PSS charges each page half to
    # each, so together they hold one copy (separate copies would add up to two).
    pages = math.ceil(facts["nbytes"] / 4096) * 4096
    assert all(r["arena_rss"] > 0 for r in ranks)
    assert sum(r["arena_pss"] for r in ranks) <= pages
    assert len({r["crc"] for r in ranks}) == 1  # the same metadata in every rank

    # Shards: rank r took positions r, r + 2, ... of each epoch's order, so interleaving
    # them rebuilds it: every index once, then the one wrap-around padding sample, which
    # repeats the order's first; every rank had the same number of batches.
    per_rank = math.ceil(n / world)
    orders = []
    for epoch in facts["epochs"]:
        seen = epoch["seen"]
        assert epoch["batches"] == [math.ceil(per_rank / batch_size)] * world
        assert [len(s) for s in seen] == [per_rank] * world
        order = [seen[k % world][k // world] for k in range(world * per_rank)]
        assert sorted(order[:n]) == list(range(n))
        assert order[n:] == order[: world * per_rank - n]
        orders.append(order)
    assert orders[0] != orders[1]  # reshuffled every epoch

    # Nothing left behind: the owner removed the arena, the claim went after the build,
    # and nothing of this run went to /dev/shm (the arena_dir fixture checks its dir too).
    assert facts["entries_after"] == []
    assert list(arena_dir.iterdir()) == []
    assert [p for p in SHM.iterdir() if name in p.name] == []
