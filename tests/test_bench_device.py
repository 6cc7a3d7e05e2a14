"""What a lent GPU machine runs (benches/device_check.sh) and what it is given
(benches/device_pack.py): the bench photos read from PNGs are scikit-image's, pixel for
pixel, and the script names only files that exist."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import BENCHES, import_bench

ROOT = BENCHES.parent


def test_photos_saved_as_png_read_back_as_scikit_images(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("PIL")
    pytest.importorskip("skimage")
    common = import_bench("_common")
    monkeypatch.delenv(common.PHOTOS_ENV, raising=False)
    from_skimage = common._photos()
    saved = common.save_photos(tmp_path / "photos")
    assert [p.name for p in saved] == [f"{n}.png" for n in common.PHOTOS]
    monkeypatch.setenv(common.PHOTOS_ENV, str(tmp_path / "photos"))
    from_png = common._photos()
    assert len(from_png) == len(from_skimage) == len(common.PHOTOS)
    for a, b in zip(from_png, from_skimage, strict=True):
        assert a.mode == b.mode == "RGB"
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # The JPEGs the benches make from them are the same bytes.
    made = common.make_jpegs(str(tmp_path / "png"), 6, 0, varied=True)[0]
    monkeypatch.delenv(common.PHOTOS_ENV)
    again = common.make_jpegs(str(tmp_path / "sk"), 6, 0, varied=True)[0]
    assert [Path(p).read_bytes() for p, _ in made] == [Path(p).read_bytes() for p, _ in again]


def test_the_device_script_parses_and_names_files_that_exist() -> None:
    script = BENCHES / "device_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    named = set(re.findall(r"\b((?:benches|tests)/[\w./]+\.(?:py|sh))", text))
    assert {"tests/test_gpu.py", "benches/scaling.py", "benches/gpu_feed.py"} <= named
    for path in named:
        assert (ROOT / path).is_file(), path
    # Every step the machine runs is bounded, so the run fits one call.
    steps = [line for line in text.splitlines() if '"$PY"' in line and "timeout" not in line]
    assert [s for s in steps if "-c" not in s] == [], steps
