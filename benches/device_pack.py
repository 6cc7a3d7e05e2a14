"""Make what a lent GPU machine (no network) needs to run ``benches/device_check.sh``.

``python benches/device_pack.py [--wheel PATH] [--out target/device]`` (``make device-pack``
builds the release wheel first). Into ``--out``: ``wheels/`` (ferrofeed's abi3 wheel, and
pytest with the plugins the test configuration names, at the versions of this venv: the
machine has torch, torchvision, JAX and Pillow, not these) and ``photos/`` (scikit-image's
photos as PNG, which ``_common`` reads in place of scikit-image when
``FERROFEED_BENCH_PHOTOS`` names the folder). Carry that folder (``carry=["target/device"]``)
and run ``bash benches/device_check.sh`` there.
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

#: What the device's venv adds to the machine's packages, for ``pytest tests/test_gpu.py``
#: (pyproject's ``timeout`` option needs pytest-timeout).
TEST_TOOLS = ["pytest", "pytest-timeout", "pluggy", "iniconfig", "packaging"]


def newest_wheel() -> str:
    """The release wheel (``make wheel``), else the local build's (``make install``)."""
    for pattern in ("target/wheels/ferrofeed-*abi3*x86_64*.whl", "target/local-wheel/*.whl"):
        found = sorted(glob.glob(pattern), key=lambda p: Path(p).stat().st_mtime)
        if found:
            return found[-1]
    raise SystemExit("no ferrofeed wheel: run `make wheel` (or `make install`) first")


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--wheel", default=None, help="ferrofeed's wheel (default: the newest built)")
    p.add_argument("--out", default="target/device")
    args = p.parse_args(argv)
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    wheels = out / "wheels"
    wheels.mkdir(parents=True)
    wheel = Path(args.wheel or newest_wheel())
    shutil.copy2(wheel, wheels / wheel.name)
    pins = [f"{t}=={importlib.metadata.version(t)}" for t in TEST_TOOLS]
    pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    subprocess.run([*pip, "-d", str(wheels), *pins], check=True)
    photos = _common.save_photos(out / "photos")
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{out}: {wheel.name}, {', '.join(pins)}, {len(photos)} photos; {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main(sys.argv[1:])
