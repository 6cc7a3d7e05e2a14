"""Every ```python block of README.md runs as written, each in a fresh interpreter."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)


def _blocks() -> list[tuple[int, str]]:
    """(line number, code) of every ```python block."""
    text = README.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in FENCE.finditer(text)]


def _params() -> list[object]:
    if not README.exists():
        return [pytest.param(None, id="README.md-missing")]
    return [pytest.param((line, code), id=f"line{line}") for line, code in _blocks()]


def test_readme_exists_and_has_python_blocks() -> None:
    assert README.is_file(), f"{README} does not exist"
    assert _blocks(), f"{README} has no ```python blocks"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("block", _params())
def test_readme_block_runs(block: tuple[int, str] | None, tmp_path: Path) -> None:
    if block is None:
        pytest.fail(f"{README} does not exist")
    line, code = block
    first = code.lstrip().splitlines()[0].strip() if code.strip() else ""
    if first == "# skip-test":
        pytest.skip(f"README.md line {line}: marked # skip-test")
    # run as a script file, like a user would: spawn-started workers can then import the
    # block's __main__ (classes and functions it defines)
    script = tmp_path / f"readme_block_line{line}.py"
    script.write_text(code, encoding="utf-8")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(
            f"README.md block at line {line} failed (exit {proc.returncode}):\n"
            f"{code}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}",
            pytrace=False,
        )
