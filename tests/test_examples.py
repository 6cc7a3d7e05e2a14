"""The examples run (in a small, fast configuration)."""

from __future__ import annotations

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
