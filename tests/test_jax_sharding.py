"""``DataLoader(output="jax", sharding=...)``: global arrays laid out over many devices.

Each check runs in a fresh interpreter (`jax_sharding_checks.py`), where JAX starts with 8
CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=8``, ``JAX_PLATFORMS=cpu``):
JAX reads both once, at start, and JAX in the pytest process would make later fork-based
tests warn. Two processes joined by ``jax.distributed.initialize`` on localhost (4 devices
each) check that each process holds its own rank's rows of one global batch.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ferrofeed import DataLoader

TESTS = Path(__file__).resolve().parent
CHECKS = TESTS / "jax_sharding_checks.py"
EXAMPLES = TESTS.parent / "examples"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jax") is None, reason="jax is not installed"
)


def cpu_env(devices: int) -> dict[str, str]:
    return {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "JAX_PLATFORMS": "cpu",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def check(name: str, *, timeout: float = 240, env: dict[str, str] | None = None) -> Any:
    """Run one check of jax_sharding_checks.py on 8 CPU devices; its JSON line."""
    proc = subprocess.run(
        [sys.executable, str(CHECKS), name],
        cwd=TESTS,
        env=env or cpu_env(8),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, f"check {name} failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_a_collated_pytree_over_1d_and_2d_meshes_on_threads_and_workers() -> None:
    # Every array of every batch (2 epochs and epoch_batches) is a global array with the
    # sharding, equal to the numpy loader's batch, each device holding its rows; the
    # string and the named tuple stay as they are (asserted in the check).
    out = check("pytree")
    for name in ("1d", "2d", "1d_workers"):
        assert out[name] == {"batches": 12, "arrays": 12 * 5}, (name, out)


@pytest.mark.timeout(300)
def test_the_native_image_chain_is_laid_out_without_a_copy_and_resumes() -> None:
    out = check("native")
    for name in ("1d", "2d"):
        # 50 images, drop_last: 3 batches of 16; every image shard (8 a batch) aliases the
        # batch buffer at its rows; every buffer went back to the pool.
        assert out[name]["batches"] == 3
        assert out[name]["aliased"] == 3 * 8
        assert out[name]["buffers"]["in_use"] == 0


@pytest.mark.timeout(300)
def test_device_prefetch_places_that_many_batches_ahead() -> None:
    out = check("prefetch")
    # Placed ahead of the batch the step holds, for each of 10 batches.
    assert out["None"] == [2] * 8 + [1, 0]  # the default: 2
    assert out["0"] == [0] * 10
    assert out["1"] == [1] * 9 + [0]
    assert out["4"] == [4] * 6 + [3, 2, 1, 0]


@pytest.mark.timeout(300)
def test_a_batch_placed_ahead_is_not_done_and_the_resume_is_exact() -> None:
    assert check("resume") == {"state_batches_done": 3, "rest": 9}


@pytest.mark.timeout(300)
def test_errors_come_in_order_nothing_is_left_running_and_bad_input_is_named() -> None:
    out = check("errors_and_shutdown")
    assert out["error"] == "KeyError(27)"
    refusals = out["refusals"]
    assert "output='jax'" in refusals["output"]
    assert "jax.sharding.Sharding" in refusals["not_a_sharding"]
    assert "8 pieces" in refusals["indivisible"]
    assert "12 rows" in refusals["indivisible"]
    assert "batch_size" in refusals["no_batch"]
    assert "device=" in refusals["device"]
    assert "on_error='skip'" in refusals["skip"]
    assert "world_size 2" in refusals["ranks"]
    assert "process 0 of 1" in refusals["ranks"]
    assert refusals["depth"].startswith("device_prefetch must be an int >= 0")
    assert refusals["depth_type"].startswith("device_prefetch must be an int >= 0")
    assert "batch['x']" in out["partial"]
    assert "(4, 3)" in out["partial"]
    assert "drop_last=True" in out["partial"]
    assert "batch['count']" in out["scalar"]
    assert "no batch axis" in out["scalar"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(300)
def test_two_processes_each_hold_their_own_ranks_rows_of_one_global_batch() -> None:
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, str(CHECKS), "multiprocess", str(pid), port],
            cwd=TESTS,
            env=cpu_env(4),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for pid in (0, 1)
    ]
    outs = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=240)
            assert p.returncode == 0, f"{stdout}\n{stderr}"
            outs.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for p in procs:
            p.kill()
            p.wait()
    # What output="numpy" gives each rank (JAX's process index) of 2, as sample indices
    # (each sample's x holds its index): the global batch is rank 0's 8 rows, then rank 1's.
    refs = [
        list(DataLoader(list(range(96)), 8, shuffle=True, seed=4, rank=r, world_size=2))
        for r in (0, 1)
    ]
    assert [o["process"] for o in outs] == [0, 1]
    assert len(outs[0]["batches"]) == len(outs[1]["batches"]) == len(refs[0]) == 6
    seen = []
    for b, (r0, r1) in enumerate(zip(*refs, strict=True)):
        global_x = [float(i) for i in np.concatenate([r0, r1])]
        for pid, out in enumerate(outs):
            rows = {int(k): v for k, v in out["batches"][b].items()}
            assert sorted(rows) == list(range(8 * pid, 8 * pid + 8))
            assert all(v == global_x[k] for k, v in rows.items()), (b, pid)
        seen += global_x
    assert sorted(seen) == list(range(96))  # the two ranks together: every sample once


@pytest.mark.timeout(300)
def test_the_jax_training_example_runs_data_parallel_on_8_devices() -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "jax_train.py"), "--smoke"],
        cwd=TESTS,
        env=cpu_env(8),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert "on 8 device(s)" in last, proc.stdout
    first_loss = float(last.split("first loss ")[1].split(",")[0])
    last_loss = float(last.split("last ")[1])
    assert last_loss < 0.5 * first_loss, proc.stdout


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_on_the_gpus_jax_sees() -> None:
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    env.pop("JAX_PLATFORMS", None)
    out = check("gpu", env=env)
    if "skip" in out:
        pytest.skip(out["skip"])
    assert out["arrays"] == 4 * 5  # 4 batches of 5 arrays
    assert out["devices"] >= 1
