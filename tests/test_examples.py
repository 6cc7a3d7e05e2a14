"""The examples run (in a small, fast configuration)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


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
