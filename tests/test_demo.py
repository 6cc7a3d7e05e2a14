"""`ferrofeed demo`, the README's main job, runs end to end (in a small configuration)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ferrofeed.samples import image_folder

SMALL = ["--n-images", "24", "--batch-size", "8", "--epochs", "2"]
EPOCH = r"epoch (\d): (\d+) images in [\d.]+ s = [\d,]+ images/s .*first batch after \d+ ms"


def epochs_of(out: str, prefix: str = "") -> list[tuple[str, str]]:
    """(epoch, images) of each epoch line of the folder run (or of the run ``prefix`` names)."""
    return re.findall(rf"^  {re.escape(prefix)}{EPOCH}", out, re.MULTILINE)


def demo(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ferrofeed", "demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.timeout(180)
def test_demo_on_generated_images_prints_its_figures() -> None:
    proc = demo(*SMALL, "--annotations", "3000", "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    made = re.search(r"24 generated ImageNet-like JPEGs .* in (\S+) \(", out)
    assert made, out
    # The generated sample lives in a temporary folder that is gone afterwards.
    assert not os.path.exists(made.group(1))
    assert "24 image records" in out
    assert epochs_of(out) == [("0", "24"), ("1", "24")], out
    # Per-stage figures: the native batch op saw 3 batches of 8.
    row = next(line for line in out.splitlines() if line.strip().startswith("decode_batch"))
    assert row.split()[2:4] == ["3", "3"], row
    assert re.search(r"batch buffers: \d+ allocated", out), out
    # Side by side, each loader in its own interpreter; torch and Pillow are installed with
    # the test extras, so PyTorch's DataLoader is among them, with ratios to it.
    figures = r"\s+[\d,]+\s+[\d,]+ ms\s+[\d.]+ [KMG]iB"
    for label in (
        "ferrofeed, native chain",
        "ferrofeed, Python transform, 2 workers",
        "PyTorch DataLoader + Pillow, 2 workers",
    ):
        assert re.search(re.escape(label) + figures, out), out
    ratios = re.findall(
        r"x PyTorch's images/s, first batch [\d.]+x sooner, [\d.]+x its memory", out
    )
    assert len(ratios) == 2, out
    # The memory picture: a plain list against a SharedList in worker processes.
    assert "plain Python list" in out
    assert "ferrofeed.SharedList" in out
    assert re.search(r"total PSS: .* \([\d.]+x less\)", out), out


@pytest.mark.timeout(120)
def test_demo_on_a_users_folder_reports_unreadable_images(tmp_path: Path) -> None:
    image_folder(tmp_path, 10, classes=2, size=(96, 64))
    (tmp_path / "class_1" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    proc = demo(
        "--images", str(tmp_path), "--batch-size", "4", "--epochs", "1", "--annotations", "0"
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"11 images in 2 classes from {tmp_path}" in out
    assert "epoch 0: 10 images" in out, out
    assert "skipped 1 unreadable image(s)" in out, out
    assert "broken.jpg" in out, out
    assert "plain Python list" not in out  # --annotations 0 skips the memory study
    assert "shards:" not in out  # a user's folder is packed as shards only with --shards
    # The user's folder is left as it was.
    assert len(list(tmp_path.rglob("*.jpg"))) == 11


def test_demo_refuses_a_folder_without_images(tmp_path: Path) -> None:
    proc = demo("--images", str(tmp_path / "missing"), "--annotations", "0")
    assert proc.returncode == 2
    assert "is not a folder" in proc.stderr
    (tmp_path / "empty_class").mkdir()
    proc = demo("--images", str(tmp_path), "--annotations", "0")
    assert proc.returncode == 2
    assert "no images" in proc.stderr


def test_demo_help_and_bad_arguments() -> None:
    proc = demo("--help")
    assert proc.returncode == 0
    assert "--images DIR" in proc.stdout
    proc = demo("--batch-size", "0")
    assert proc.returncode == 2
    assert "--batch-size must be at least 1" in proc.stderr


@pytest.mark.timeout(180)
def test_demo_without_torch_says_so() -> None:
    # torch made unimportable in the demo's interpreter, as on a machine without it.
    code = (
        "import sys; sys.modules['torch'] = sys.modules['pyarrow'] = None\n"
        "from ferrofeed._demo import main\n"
        f"sys.exit(main({[*SMALL, '--annotations', '0']!r}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    # The shards are written and read in Rust (write_shards, TarShards): nothing else needed.
    assert "TarShards read 24 samples' counts from its index" in out, out
    assert "ferrofeed, Python transform, 2 workers" in out, out
    assert "PyTorch DataLoader + Pillow" not in out, out
    assert re.search(
        r"PyTorch's DataLoader: not run \(torch not installed here; pip install "
        r"'ferrofeed\[torch\]' pillow",
        out,
    ), out


@pytest.mark.timeout(180)
def test_demo_packs_its_images_as_tar_shards_and_reads_them_back() -> None:
    proc = demo(*SMALL, "--shard-size", "10", "--annotations", "0", "--no-compare")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    packed = re.search(
        r"shards: the 24 images packed as 3 WebDataset tar shards of up to 10 "
        r"\([\d.]+ [KMG]iB, in [\d.]+ s\) in (\S+) by write_shards \(ferrofeed pack\); "
        r"TarShards read 24 samples' counts from its index",
        out,
    )
    assert packed, out
    assert "shuffle_window=20, image='jpg', label='cls'" in out, out
    # Every image read back, each epoch, through the native chain.
    assert epochs_of(out, "shards, ") == [("0", "24"), ("1", "24")], out
    assert epochs_of(out) == [("0", "24"), ("1", "24")], out
    assert "skipped" not in out
    # The shards lived in the demo's temporary folder, gone afterwards.
    assert not os.path.exists(packed.group(1))
