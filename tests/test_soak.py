"""The soak (tests/soak.py), shortened for CI: 3 epochs over 500 generated images.

``make soak`` runs the full one (10 epochs over 20,000 images). ``FERROFEED_SOAK_IMAGES``
and ``FERROFEED_SOAK_EPOCHS`` change the sizes here too. Runs in a subprocess: the counts
of threads, fds and /dev/shm entries must be the soak's own, not the test session's.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from conftest import TESTS_DIR, last_json_line, run_python

# The slow tier (soak): `make test-slow`, not `make test`.
pytestmark = pytest.mark.slow


@pytest.mark.timeout(240)
def test_soak_short() -> None:
    images = os.environ.get("FERROFEED_SOAK_IMAGES", "500")
    epochs = os.environ.get("FERROFEED_SOAK_EPOCHS", "3")
    proc = run_python(
        "import sys, soak; sys.exit(soak.main())",
        args=["--images", images, "--epochs", epochs],
        timeout=230,
        check=False,
        cwd=TESTS_DIR,
        # As `make soak` (see the Makefile and RELIABILITY.md): NumPy's OpenBLAS pool
        # starts and ends threads around forks of its own accord, and glibc's per-thread
        # malloc arenas fragment as every epoch starts new threads.
        env={"OPENBLAS_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2"},
    )
    report = last_json_line(proc.stdout)
    assert report["failures"] == [], proc.stdout
    assert proc.returncode == 0, proc.stdout + proc.stderr
    samples = report["samples"]
    assert len(samples) == int(epochs)
    # Every epoch ran all three loaders over every image.
    per_loader = -(-int(images) // 64)
    assert all(s["batches"] == 3 * per_loader for s in samples), samples


def test_soak_report_fails_on_growth() -> None:
    """The verdict can fail: growth of each kind is caught."""
    import soak

    def sample(
        epoch: int, rss: int, fds: int = 10, threads: int = 1, shm: int = 0, pooled: int = 0
    ) -> Any:
        return soak.Sample(epoch, 1.0, 1, rss, pooled, 0, fds, threads, shm)

    base = {"rss": 100, "fds": 10, "threads": 1, "shm": 0}
    ok = soak.Report(10, 3, base, [sample(0, 1000), sample(1, 1040), sample(2, 1000)])
    assert ok.failures() == []
    assert soak.Report(10, 2, base, [sample(0, 1000), sample(1, 1060)]).failures()
    # Idle pooled buffers (a bounded cache) are not growth; anything else is.
    assert not soak.Report(10, 2, base, [sample(0, 1000), sample(1, 1060, pooled=60)]).failures()
    assert soak.Report(10, 2, base, [sample(0, 1000, pooled=60), sample(1, 1000)]).failures()
    assert soak.Report(10, 2, base, [sample(0, 1000), sample(1, 1000, fds=11)]).failures()
    assert soak.Report(10, 2, base, [sample(0, 1000), sample(1, 1000, threads=2)]).failures()
    assert soak.Report(10, 2, base, [sample(0, 1000), sample(1, 1000, shm=1)]).failures()
    # The CPU pool's threads start in the first epoch and stay: not growth.
    assert not soak.Report(10, 1, base, [sample(0, 1000, threads=3)]).failures()
    grown = [sample(0, 1000, threads=3), sample(1, 1000, threads=4)]
    assert soak.Report(10, 2, base, grown).failures()


def test_malloc_in_use_sees_an_allocation() -> None:
    import ctypes

    import soak

    before = soak.malloc_in_use()
    if before < 0:
        pytest.skip("no mallinfo2 (not glibc >= 2.33)")
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    block = libc.malloc(8 << 20)
    try:
        assert soak.malloc_in_use() - before >= 8 << 20
    finally:
        libc.free(block)
