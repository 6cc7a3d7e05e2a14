"""Shared fixtures and helpers for the ferrofeed test-suite.

* ``arena_dir``: a fresh directory under /dev/shm, removed after the test. The test fails
  (at teardown) when it leaves files behind in it, unless it is marked ``leftovers_ok``.
* ``coco`` / ``coco_annotation``: deterministic COCO-like annotation dicts (~300-600 bytes
  pickled each).
* ``run_python``: runs a snippet in a fresh ``sys.executable`` subprocess with a timeout.
* ``import_bench``: a module of benches/ (a script, or a module the scripts share).
* ``Indexed``: a dataset whose sample ``i`` is ``i``, for datasets with a special sample;
  ``Stalls``, one whose sample ``at`` takes long.
* ``assert_slots_reused``: a worker loader's shared slots were reused, not one per batch.
* an autouse guard that fails a test which leaves a ``/dev/shm/ferrofeed-<our pid>-*`` file
  behind (an owner that was never closed and was not garbage collected either).
"""

from __future__ import annotations

import gc
import importlib
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
SHM = Path("/dev/shm")
BENCHES = REPO_ROOT / "benches"

# Worker functions defined in the test modules are pickled by reference for spawn and
# forkserver children; those children inherit sys.path, so make the test modules importable
# by name whatever import mode pytest runs in.
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))


def import_bench(name: str) -> ModuleType:
    """A module of benches/ (the scripts import each other as siblings, from their folder)."""
    sys.path.insert(0, str(BENCHES))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHES))


class Indexed:
    """A map-style dataset of ``n`` samples whose sample ``i`` is ``i``. Subclasses say
    what is special about some samples (one that fails, stalls, is slow).
    """

    n = 32

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class Stalls(Indexed):
    """Sample ``at`` takes ``seconds``, or less when ``release`` (a `threading.Event`, for
    threads: not for worker processes) is set before."""

    def __init__(
        self, n: int, at: int, seconds: float, release: threading.Event | None = None
    ) -> None:
        self.n, self.at, self.seconds, self.release = n, at, seconds, release

    def __getitem__(self, i: int) -> int:
        if i == self.at:
            if self.release is None:
                time.sleep(self.seconds)
            else:
                self.release.wait(self.seconds)
        return i


def assert_slots_reused(loader: Any, batches: int, *, workers: int = 2, prefetch: int = 2) -> None:
    """After an epoch of a loader's worker batches: its shared slots are those in flight
    (``prefetch`` a worker) plus the one the consumer holds, each reused, not one slot a
    batch; ``batches`` leases were taken."""
    slots = loader.stats()["workers"]["slots"]
    assert slots["slots"] <= workers * prefetch + 2, slots
    assert slots["leases"] == batches


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "leftovers_ok: the arena_dir fixture does not fail on files left behind"
    )
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped without one")
    config.addinivalue_line(
        "markers",
        "slow: the slow tier (soak, multi-node, object storage, the benchmarks' smoke runs), "
        "which `make test` leaves out and `make test-slow` runs",
    )
    # A shell starts background jobs (`make test &`) with SIGINT ignored, and an ignored
    # signal stays ignored across exec: every interpreter the tests start would then ignore
    # Ctrl-C, and the tests of what Ctrl-C does would hang. A handled signal is reset to
    # its default at exec, so Python in the child installs its own handler again.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


def _test_failed(request: pytest.FixtureRequest) -> bool:
    rep = getattr(request.node, "rep_call", None)
    return rep is None or rep.failed


# --------------------------------------------------------------------------------------
# directories


@pytest.fixture
def arena_dir(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh, empty directory on /dev/shm (tmpfs); removed after the test."""
    d = Path(tempfile.mkdtemp(prefix="ff-test-", dir=SHM))
    try:
        yield d
        if not _test_failed(request) and request.node.get_closest_marker("leftovers_ok") is None:
            _collect_this_tests_garbage()
            left = sorted(p.name for p in d.iterdir())
            assert left == [], f"test left files behind in its arena dir {d}: {left}"
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _our_shm_files() -> set[str]:
    prefix = f"ferrofeed-{os.getpid()}-"
    try:
        return {name for name in os.listdir(SHM) if name.startswith(prefix)}
    except FileNotFoundError:  # pragma: no cover - no /dev/shm
        return set()


# The checks after each test collect the test's cyclic garbage first (an owner in a cycle
# unlinks its file when collected). A full collection visits every object the process holds:
# with torch and JAX imported, about 250,000 objects before the first test and more later,
# 0.1 to 0.3 s a time, more than half of the suite's time over its 2,200 tests. So after
# each collection the survivors are frozen (gc.freeze: the permanent generation, which the
# collector does not visit), and the next test's collection visits only what was made since:
# that test's objects. Once per module everything is unfrozen and collected in full, for what
# lived across tests (module fixtures) and has died since.


@pytest.fixture(autouse=True, scope="module")
def _full_collection_after_each_module() -> Iterator[None]:
    yield
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Nothing stays frozen past the tests: the interpreter's collections at exit visit
    # everything again (JAX's nanobind types report what is never freed as leaks).
    gc.unfreeze()
    gc.collect()


def _collect_this_tests_garbage() -> None:
    """Collect what was made since the last freeze (this test's objects), then freeze."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _no_leaked_default_arenas(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves one of this process's arenas behind in /dev/shm."""
    before = _our_shm_files()
    yield
    if _test_failed(request):
        return
    _collect_this_tests_garbage()
    leaked = sorted(_our_shm_files() - before)
    for name in leaked:  # do not let one leak fail every later test
        (SHM / name).unlink(missing_ok=True)
    assert leaked == [], f"test leaked arena files in {SHM}: {leaked}"


# --------------------------------------------------------------------------------------
# COCO-like data


def coco_annotation(i: int) -> dict[str, Any]:
    """A deterministic COCO-like annotation; ~330-610 bytes with pickle protocol 5."""
    k = (i * 2654435761 + 12345) % 4294967296
    x = float(k % 600) + 0.25
    y = float((k >> 10) % 400) + 0.5
    w = float(10 + (k >> 3) % 200) + 0.125
    h = float(10 + (k >> 7) % 150) + 0.75
    n = 20 + 2 * ((k >> 5) % 16)
    seg = [
        round(x + (j * 7 % 97) * w / 97, 2) if j % 2 == 0 else round(y + (j * 11 % 89) * h / 89, 2)
        for j in range(n)
    ]
    return {
        "id": i,
        "image_id": 100000 + i // 7,
        "category_id": 1 + k % 80,
        "bbox": [x, y, w, h],
        "area": round(w * h, 3),
        "iscrowd": int(k % 17 == 0),
        "segmentation": [seg],
    }


def coco_annotations(n: int, start: int = 0) -> Iterator[dict[str, Any]]:
    """``n`` consecutive annotations (a generator: nothing is kept alive)."""
    return (coco_annotation(i) for i in range(start, start + n))


@pytest.fixture
def coco() -> Callable[..., Iterator[dict[str, Any]]]:
    """``coco(n, start=0)`` -> generator of deterministic COCO-like annotation dicts."""
    return coco_annotations


@pytest.fixture
def coco_one() -> Callable[[int], dict[str, Any]]:
    """``coco_one(i)`` -> the i-th deterministic COCO-like annotation dict."""
    return coco_annotation


# --------------------------------------------------------------------------------------
# subprocesses


def run_python(
    code: str,
    *,
    args: Sequence[str] = (),
    timeout: float = 60.0,
    check: bool = True,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    **kw: Any,
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (dedented) with ``sys.executable -c`` in a fresh process.

    Returns the CompletedProcess (text mode, stdout/stderr captured). With ``check`` (the
    default) a non-zero exit status fails the test, showing the snippet's output.
    ``env`` entries are added to the current environment.
    """
    full_env = dict(os.environ)
    full_env["PYTHONDONTWRITEBYTECODE"] = "1"
    if env:
        full_env.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=cwd,
        check=False,
        **kw,
    )
    if check and proc.returncode != 0:
        pytest.fail(
            f"subprocess exited with {proc.returncode}\n--- stdout ---\n{proc.stdout}"
            f"\n--- stderr ---\n{proc.stderr}",
            pytrace=False,
        )
    return proc


@pytest.fixture(name="run_python")
def run_python_fixture() -> Callable[..., subprocess.CompletedProcess[str]]:
    return run_python


def last_json_line(text: str) -> Any:
    """Parse the last line of ``text`` that looks like a JSON object."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(f"no JSON line in output:\n{text}")


CTRL_C_SNIPPET = """
import importlib, json, os, signal, sys, threading, time
from ferrofeed import DataLoader

module, name, delay = sys.argv[1:]
dataset = getattr(importlib.import_module(module), name)(float(delay))
loader = DataLoader(dataset, 4, num_workers=2, persistent_workers=True)
it = iter(loader)
next(it)
pids = [w["pid"] for w in loader.stats()["workers"]["workers"]]
threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
t0 = time.monotonic()
try:
    for _ in it:
        pass
except KeyboardInterrupt:
    t1 = time.monotonic()
alive = [p for p in pids if os.path.exists(f"/proc/{p}")
         and open(f"/proc/{p}/stat").read().split(")")[-1].split()[0] not in "ZX"]
print(json.dumps({"pids": pids, "raised_after": t1 - t0, "alive": alive,
                  "stopped_in": time.monotonic() - t1}))
"""


def ctrl_c_with_workers(module: str, name: str, delay: float) -> Any:
    """Ctrl-C (SIGINT) 0.3 s into an epoch of two persistent worker processes.

    In a fresh interpreter (in the tests' folder), the dataset ``name(delay)`` of test module
    ``module`` is read in batches of 4 by ``num_workers=2``. Returns what it reports: the
    workers' ``pids``, ``raised_after`` (seconds from the iteration's start to the
    KeyboardInterrupt), the pids still ``alive`` (not zombies) after it, and ``stopped_in``
    (seconds from the KeyboardInterrupt to that check).
    """
    args = [module, name, str(delay)]
    proc = run_python(CTRL_C_SNIPPET, args=args, timeout=60, cwd=TESTS_DIR)
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(name="last_json_line")
def last_json_line_fixture() -> Callable[[str], Any]:
    return last_json_line


# --------------------------------------------------------------------------------------
# long-running snippets


class Procs:
    """Subprocesses started by one test; all killed at the end."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, code: str, *args: str) -> tuple[subprocess.Popen[str], str]:
        """Start a snippet and return it with the first line it prints."""
        p = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(p)
        assert p.stdout is not None
        line = p.stdout.readline().strip()
        if not line:
            _, err = p.communicate(timeout=10)
            pytest.fail(f"snippet printed nothing (rc={p.returncode}):\n{err}")
        return p, line

    @staticmethod
    def kill9(p: subprocess.Popen[str]) -> None:
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        assert p.returncode == -signal.SIGKILL

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.communicate(timeout=10)


@pytest.fixture
def procs() -> Iterator[Procs]:
    ps = Procs()
    yield ps
    ps.close()


def process_gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie not yet reaped counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0): it has exited, its parent just has not reaped it.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def run_spawned(
    n: int, target: Callable[..., None], *args: Any, timeout: float
) -> tuple[list[Any], list[int | None]]:
    """Run ``target(barrier, *args, out)`` in ``n`` spawned processes; return what they put
    on ``out`` and their exit codes.

    ``barrier`` is a barrier of ``n`` (for the processes to meet, as a node's ranks do) and
    ``out`` a queue, on which each puts one result, waited for ``timeout`` seconds. Each
    process is then joined, and killed if it is still alive 30 s later.
    """
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(n)
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(barrier, *args, out)) for _ in range(n)]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=timeout) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
    return results, [p.exitcode for p in procs]


def wait_gone(pids: Sequence[int], within: float) -> bool:
    """Wait up to ``within`` seconds for every process of ``pids`` to exit; whether they did."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if all(process_gone(p) for p in pids):
            return True
        time.sleep(0.02)
    return all(process_gone(p) for p in pids)
