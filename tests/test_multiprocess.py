"""SharedList across processes: multiprocessing workers, torch DataLoader, shared() ranks."""

from __future__ import annotations

import gc
import hashlib
import json
import multiprocessing as mp
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ferrofeed import ArenaTimeoutError, SharedList

N_ITEMS = 3000


# ------------------------------------------------------------------ helpers (also run in workers)


def _canon(x: Any) -> Any:
    """A picklable canonical form: arrays by dtype/shape/bytes (not by writeable flag)."""
    if isinstance(x, np.ndarray):
        return ("ndarray", x.dtype.str, x.shape, x.tobytes())
    if isinstance(x, dict):
        return ("dict", tuple((k, _canon(v)) for k, v in x.items()))
    if isinstance(x, list | tuple):
        return (type(x).__name__, tuple(_canon(v) for v in x))
    return x


def _digest(items: Iterable[Any]) -> tuple[int, str]:
    h = hashlib.sha256()
    n = 0
    for x in items:
        h.update(pickle.dumps(_canon(x), protocol=5))
        n += 1
    return n, h.hexdigest()


def _mapped_paths() -> str:
    with open("/proc/self/maps") as f:
        return f.read()


def _digest_worker(sl: SharedList) -> dict[str, Any]:
    """Runs in a pool worker: reads every item (iteration and indexing)."""
    n, digest = _digest(sl)
    n_idx, digest_idx = _digest(sl[i] for i in range(len(sl)))
    arrays_read_only = all(
        not x["pixels"].flags.writeable for x in sl if isinstance(x, dict) and "pixels" in x
    )
    return {
        "pid": os.getpid(),
        "n": n,
        "digest": digest,
        "n_idx": n_idx,
        "digest_idx": digest_idx,
        "path": sl.path,
        "owner": sl.owner,
        "mapped": sl.path in _mapped_paths(),
        "arrays_read_only": arrays_read_only,
    }


def _make_items(coco: Callable[..., Iterator[dict[str, Any]]]) -> list[Any]:
    items: list[Any] = list(coco(N_ITEMS))
    for i in range(0, N_ITEMS, 500):  # a few items with zero-copy numpy payloads
        items[i] = {
            "id": i,
            "pixels": np.arange(i, i + 4096, dtype=np.float32).reshape(64, 64),
            "label": i % 7,
        }
    return items


@pytest.fixture
def items(coco: Callable[..., Iterator[dict[str, Any]]]) -> list[Any]:
    return _make_items(coco)


# ------------------------------------------------------------------ multiprocessing contexts


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_workers_read_everything(arena_dir: Path, items: list[Any], method: str) -> None:
    expected_n, expected = _digest(items)
    assert expected_n == N_ITEMS
    sl = SharedList(items, path=arena_dir)
    try:
        ctx = mp.get_context(method)
        with ctx.Pool(2) as pool:
            results = pool.map(_digest_worker, [sl] * 4, chunksize=1)
            pool.close()
            pool.join()
        assert len(results) == 4
        for r in results:
            assert r["pid"] != os.getpid()
            assert r["n"] == r["n_idx"] == N_ITEMS
            assert r["digest"] == expected
            assert r["digest_idx"] == expected
            assert r["path"] == sl.path
            assert r["owner"] is False
            assert r["mapped"] is True
            assert r["arrays_read_only"] is True
        # the owner keeps working after its workers are gone, and the file is still there
        assert os.path.exists(sl.path)
        assert sl.owner is True
        assert not sl.closed
        assert _digest(sl) == (N_ITEMS, expected)
        assert sl[-1] == items[-1]
    finally:
        sl.close()
    assert not os.path.exists(sl.path)


def _read_inherited(sl: SharedList, queue: Any) -> None:
    queue.put((sl[1], sl.owner, len(sl)))
    sl.close()  # in a forked child this must not remove the owner's file
    del sl
    gc.collect()


@pytest.mark.timeout(60)
def test_forked_child_does_not_remove_file(arena_dir: Path, items: list[Any]) -> None:
    sl = SharedList(items, path=arena_dir)
    try:
        # 1. multiprocessing fork: the object is inherited, not pickled
        ctx = mp.get_context("fork")
        queue = ctx.Queue()
        proc = ctx.Process(target=_read_inherited, args=(sl, queue))
        proc.start()
        got, child_owner, child_len = queue.get(timeout=30)
        proc.join(30)
        assert proc.exitcode == 0
        assert got == items[1]
        assert child_len == N_ITEMS
        assert child_owner is False  # an inherited object is no owner in the child
        assert os.path.exists(sl.path)

        # 2. a bare os.fork(): close, drop and collect the inherited object in the child
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            code = 1
            try:
                ok = sl[2] == items[2]
                sl.close()
                gc.collect()
                code = 0 if ok else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert os.path.exists(sl.path)
        assert sl.owner is True
        assert not sl.closed
        assert _digest(sl) == _digest(items)
    finally:
        sl.close()
    assert not os.path.exists(sl.path)


FORK_AT_EXIT = """
    import gc, json, os, sys
    from ferrofeed import SharedList

    sl = SharedList([{"i": i} for i in range(100)], path=sys.argv[1])
    report = {"path": sl.path}
    for mode in ("close", "gc", "exit"):
        pid = os.fork()
        if pid == 0:
            assert sl[5] == {"i": 5}
            if mode == "close":
                sl.close()
            elif mode == "gc":
                del sl
                gc.collect()
            # "exit": fall off the end with the object alive -> interpreter exit in the child
            break
        _, status = os.waitpid(pid, 0)
        report[mode] = {"exit": os.waitstatus_to_exitcode(status),
                        "exists": os.path.exists(sl.path)}
    else:
        report["parent_reads"] = sl[99] == {"i": 99}
        print(json.dumps(report), flush=True)
    # the parent exits with the owner alive: interpreter exit removes the file
"""


@pytest.mark.timeout(60)
def test_forked_children_exiting_normally_keep_file(
    arena_dir: Path,
    run_python: Callable[..., subprocess.CompletedProcess[str]],
    last_json_line: Callable[[str], Any],
) -> None:
    proc = run_python(FORK_AT_EXIT, args=[str(arena_dir)])
    report = last_json_line(proc.stdout)
    for mode in ("close", "gc", "exit"):
        assert report[mode] == {"exit": 0, "exists": True}, (mode, proc.stderr)
    assert report["parent_reads"] is True
    assert Path(report["path"]).parent == arena_dir
    # the owner (parent) removed its file at interpreter exit
    assert not os.path.exists(report["path"])
    assert list(arena_dir.iterdir()) == []


# ------------------------------------------------------------------ torch


@pytest.mark.timeout(240)
def test_torch_dataloader_spawn(
    arena_dir: Path, coco: Callable[..., Iterator[dict[str, Any]]]
) -> None:
    pytest.importorskip("torch")
    from ff_torch_dataset import SharedListDataset
    from torch.utils.data import DataLoader

    items = list(coco(2000))
    expected = [hashlib.sha256(pickle.dumps(x, protocol=5)).hexdigest() for x in items]
    with SharedList(items, path=arena_dir) as sl:
        loader = DataLoader(
            SharedListDataset(sl),
            batch_size=None,
            shuffle=False,
            num_workers=2,
            multiprocessing_context="spawn",
        )
        seen: dict[int, str] = {}
        pids: set[int] = set()
        for index, digest, pid in loader:
            index = int(index)
            assert index not in seen
            seen[index] = digest
            pids.add(int(pid))
        assert sorted(seen) == list(range(len(items)))
        assert [seen[i] for i in range(len(items))] == expected
        assert len(pids) == 2
        assert os.getpid() not in pids
        assert os.path.exists(sl.path)
        assert sl[3] == items[3]


# ------------------------------------------------------------------ shared(): two "ranks"

RANK_SCRIPT = """
import hashlib, json, os, pickle, sys, time
from pathlib import Path
from ferrofeed import SharedList

name, arena_dir, ctl, n = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
rank = int(os.environ["LOCAL_RANK"])

def item(i):
    return {"id": i, "image_id": i // 3, "bbox": [i * 0.5, 1.0, 2.0, 3.0],
            "segmentation": [[float(j) for j in range(i % 40)]], "caption": "c" * (i % 50)}

def build():
    (ctl / f"built-{rank}").write_text(str(os.getpid()))
    time.sleep(1.0)  # the other rank is waiting by now
    return (item(i) for i in range(n))

def barrier(tag, timeout=60.0):
    (ctl / f"{tag}-{rank}").touch()
    deadline = time.monotonic() + timeout
    while not all((ctl / f"{tag}-{r}").exists() for r in (0, 1)):
        if time.monotonic() > deadline:
            sys.exit(f"rank {rank}: timed out at barrier {tag}")
        time.sleep(0.02)

def digest(xs):
    h = hashlib.sha256()
    for x in xs:
        h.update(pickle.dumps(x, protocol=5))
    return h.hexdigest()

(ctl / f"started-{rank}").touch()
t0 = time.monotonic()
sl = SharedList.shared(build, name=name, dir=arena_dir, timeout=60)
elapsed = time.monotonic() - t0
st = os.stat(sl.path)
report = {
    "rank": rank, "path": sl.path, "ino": st.st_ino, "dev": st.st_dev, "len": len(sl),
    "owner": sl.owner, "digest": digest(sl), "expected": digest(item(i) for i in range(n)),
    "mapped": sl.path in open("/proc/self/maps").read(), "elapsed": elapsed,
}
barrier("ready")
report["arenas"] = sorted(f for f in os.listdir(arena_dir) if f.endswith(".arena"))
report["listing"] = sorted(os.listdir(arena_dir))
barrier("counted")
print(json.dumps(report), flush=True)
"""


def _communicate(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"process {proc.args} timed out\nstdout:\n{out}\nstderr:\n{err}")


def _wait_for(path: Path, timeout: float, procs: Iterable[subprocess.Popen[str]] = ()) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        for p in procs:
            if p.poll() is not None:
                out, err = p.communicate()
                pytest.fail(f"{p.args} exited early ({p.returncode}):\n{out}\n{err}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {path}")
        time.sleep(0.02)


@pytest.mark.timeout(120)
def test_shared_two_ranks(arena_dir: Path, tmp_path: Path) -> None:
    name = f"t-{uuid.uuid4().hex}"
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    n = 20_000

    def launch(rank: int) -> subprocess.Popen[str]:
        env = dict(os.environ, LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2")
        return subprocess.Popen(
            [sys.executable, str(script), name, str(arena_dir), str(ctl), str(n)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    procs: list[subprocess.Popen[str]] = []
    try:
        procs.append(launch(1))  # rank 1 first: it has to wait for rank 0
        _wait_for(ctl / "started-1", 30, procs)
        time.sleep(0.5)
        procs.append(launch(0))
        outs = [_communicate(p, 90) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    reports = {}
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, f"{p.args}: rc={p.returncode}\n{out}\n{err}"
        r = json.loads(out.strip().splitlines()[-1])
        reports[r["rank"]] = r
    r0, r1 = reports[0], reports[1]
    expected_path = str(arena_dir / f"ferrofeed-shared-{name}.arena")
    assert (ctl / "built-0").exists()
    assert not (ctl / "built-1").exists()  # only local rank 0 builds
    assert r0["path"] == r1["path"] == expected_path
    assert (r0["dev"], r0["ino"]) == (r1["dev"], r1["ino"])  # the very same file
    assert r0["len"] == r1["len"] == n
    assert r0["digest"] == r0["expected"]
    assert r1["digest"] == r0["expected"]
    assert r0["owner"] is True
    assert r1["owner"] is False
    assert r0["mapped"] is True
    assert r1["mapped"] is True
    assert r1["elapsed"] >= 0.5  # rank 1 really waited for rank 0
    for r in (r0, r1):
        assert r["arenas"] == [Path(expected_path).name], r["listing"]
    # rank 0 owned the arena and removed it at exit
    assert not os.path.exists(expected_path)


@pytest.mark.timeout(60)
def test_shared_waiter_times_out(arena_dir: Path) -> None:
    def build() -> list[int]:
        raise AssertionError("local rank 1 must never build")

    t0 = time.monotonic()
    with pytest.raises(ArenaTimeoutError) as info:
        SharedList.shared(
            build,
            name=f"t-{uuid.uuid4().hex}",
            local_rank=1,
            local_world_size=2,
            timeout=1.5,
            dir=arena_dir,
        )
    elapsed = time.monotonic() - t0
    assert isinstance(info.value, TimeoutError)
    assert elapsed >= 1.3, elapsed  # it waited for its timeout (1.5 s)
    assert elapsed < 45, elapsed  # a hang guard
    assert not any(p.suffix == ".arena" for p in arena_dir.iterdir())


def test_shared_single_rank_builds_and_owns(arena_dir: Path) -> None:
    calls: list[int] = []

    def build() -> Iterator[int]:
        calls.append(1)
        return iter(range(10))

    name = f"t-{uuid.uuid4().hex}"
    with SharedList.shared(build, name=name, local_rank=0, local_world_size=1, dir=arena_dir) as sl:
        assert calls == [1]
        assert list(sl) == list(range(10))
        assert sl.path == str(arena_dir / f"ferrofeed-shared-{name}.arena")
        assert sl.owner is True
    assert not (arena_dir / f"ferrofeed-shared-{name}.arena").exists()


def test_shared_reads_rank_from_env(arena_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    built: list[int] = []

    def build() -> list[int]:
        built.append(1)
        return [1]

    with pytest.raises(ArenaTimeoutError):
        SharedList.shared(build, name=f"t-{uuid.uuid4().hex}", timeout=0.5, dir=arena_dir)
    assert built == []  # LOCAL_RANK=1 from the environment: it waited instead of building


WAITER_SCRIPT = """
import json, sys, time
from ferrofeed import ArenaBuilderError, SharedList

name, d = sys.argv[1], sys.argv[2]

def build():
    raise SystemExit("local rank 1 must not build")

print("waiting", flush=True)
t0 = time.monotonic()
try:
    sl = SharedList.shared(build, name=name, dir=d, local_rank=1, local_world_size=2,
                           timeout=60)
    out = {"result": "ok", "len": len(sl)}
except Exception as e:
    out = {"result": type(e).__name__, "builder": isinstance(e, ArenaBuilderError),
           "runtime": isinstance(e, RuntimeError), "msg": str(e)}
out["elapsed"] = time.monotonic() - t0
print(json.dumps(out), flush=True)
"""

BUILDER_SCRIPT = """
import sys, time
from ferrofeed import SharedList

name, d, mode = sys.argv[1], sys.argv[2], sys.argv[3]

def build():
    print("building", flush=True)
    time.sleep(1.0)
    if mode == "call":
        raise RuntimeError("boom from build")

    def gen():
        for i in range(100_000):
            yield {"i": i, "payload": "p" * 200}
            if mode == "iter" and i == 500:
                raise RuntimeError("boom from build")
            if mode == "slow":
                if i % 10 == 0:
                    print("yielded", i, flush=True)
                time.sleep(0.02)
    return gen()

SharedList.shared(build, name=name, dir=d, local_rank=0, local_world_size=2, timeout=60)
print("rank 0 built (unexpected)", flush=True)
"""


def _popen(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _readline_until(proc: subprocess.Popen[str], prefix: str, timeout: float) -> str:
    """Read ``proc``'s stdout lines until one starts with ``prefix``."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            _, err = proc.communicate()
            pytest.fail(f"{proc.args[:3]} ended before printing {prefix!r}:\n{err}")
        if line.startswith(prefix):
            return line
    pytest.fail(f"no {prefix!r} line within {timeout}s")


def _kill_unfinished(*procs: subprocess.Popen[str] | None) -> None:
    """Kill and reap those of ``procs`` still running (a test's clean-up)."""
    for p in procs:
        if p is not None and p.poll() is None:
            p.kill()
            p.communicate()


def _retry_build_works(arena_dir: Path, name: str) -> None:
    """After a failed build, a new rank 0 with the same name can build (nothing is stuck)."""
    with SharedList.shared(
        lambda: ["again", "works"],
        name=name,
        local_rank=0,
        local_world_size=2,
        timeout=10,
        dir=arena_dir,
    ) as sl:
        assert list(sl) == ["again", "works"]


@pytest.mark.leftovers_ok
@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["call", "iter"])
def test_shared_builder_raises(arena_dir: Path, mode: str) -> None:
    name = f"t-{uuid.uuid4().hex}"
    waiter = _popen(WAITER_SCRIPT, name, str(arena_dir))
    builder: subprocess.Popen[str] | None = None
    try:
        _readline_until(waiter, "waiting", 30)
        time.sleep(0.5)  # the waiter is polling before rank 0 even starts
        builder = _popen(BUILDER_SCRIPT, name, str(arena_dir), mode)
        b_out, b_err = _communicate(builder, 60)
        w_out, w_err = _communicate(waiter, 60)
    finally:
        _kill_unfinished(waiter, builder)
    assert builder is not None
    assert builder.returncode != 0, b_out
    assert "boom from build" in b_err  # rank 0 itself sees its build() error
    assert waiter.returncode == 0, w_err
    out = json.loads(w_out.strip().splitlines()[-1])
    assert out["result"] == "ArenaBuilderError", out
    assert out["builder"] is True
    assert out["runtime"] is True
    assert out["elapsed"] < 45, out  # a hang guard, short of its 60 s timeout
    assert not any(p.suffix == ".arena" for p in arena_dir.iterdir())
    _retry_build_works(arena_dir, name)


@pytest.mark.leftovers_ok
@pytest.mark.timeout(120)
def test_shared_builder_killed(arena_dir: Path) -> None:
    name = f"t-{uuid.uuid4().hex}"
    waiter = _popen(WAITER_SCRIPT, name, str(arena_dir))
    builder: subprocess.Popen[str] | None = None
    try:
        _readline_until(waiter, "waiting", 30)
        time.sleep(0.5)
        builder = _popen(BUILDER_SCRIPT, name, str(arena_dir), "slow")
        _readline_until(builder, "yielded 50", 30)  # in the middle of a slow build
        assert waiter.poll() is None  # still waiting
        builder.send_signal(signal.SIGKILL)
        builder.communicate(timeout=10)
        killed_at = time.monotonic()
        w_out, w_err = _communicate(waiter, 60)
        waited = time.monotonic() - killed_at
    finally:
        _kill_unfinished(waiter, builder)
    assert builder is not None
    assert builder.returncode == -signal.SIGKILL
    assert waiter.returncode == 0, w_err
    out = json.loads(w_out.strip().splitlines()[-1])
    assert out["result"] == "ArenaBuilderError", out
    assert out["builder"] is True
    # Hang guards, short of the waiter's 60 s timeout (counted from before the builder
    # started): it noticed the death, it did not time out.
    assert waited < 40, waited
    assert out["elapsed"] < 55, out
    _retry_build_works(arena_dir, name)
    # the dead builder's partial file is swept by the next arena created in the dir
    with SharedList([1], path=arena_dir) as sl:
        assert sorted(p.name for p in arena_dir.iterdir() if "arena" in p.name) == [
            Path(sl.path).name
        ]


OWNER_THEN_KILLED_SCRIPT = """
import os, signal, sys
from ferrofeed import SharedList

name, d = sys.argv[1], sys.argv[2]
sl = SharedList.shared(lambda: ["old", "run"], name=name, dir=d, local_rank=0, local_world_size=2)
print("built", flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # a node killed after building: the arena stays behind
"""

LATE_BUILDER_SCRIPT = """
import sys, time
from ferrofeed import SharedList

name, d = sys.argv[1], sys.argv[2]

def build():
    time.sleep(1.0)  # the waiter polls meanwhile, with the dead run's arena in place
    return ["new", "run"]

sl = SharedList.shared(build, name=name, dir=d, local_rank=0, local_world_size=2)
print("built", flush=True)
sys.stdin.readline()  # hold the arena until the test has read the waiter's result
"""


@pytest.mark.timeout(120)
def test_shared_after_a_killed_owner_builds_anew(arena_dir: Path) -> None:
    """A job restarted after its node was killed maps this run's arena, not the dead one's.

    The dead owner's complete arena stays in the directory, mapped by no process. A waiting
    local rank must not map it (it would read the old run's items and keep rank 0 from
    sweeping it: ArenaExistsError); rank 0 sweeps it and builds again.
    """
    name = f"t-{uuid.uuid4().hex}"
    old = _popen(OWNER_THEN_KILLED_SCRIPT, name, str(arena_dir))
    _readline_until(old, "built", 30)
    old.communicate(timeout=30)
    assert old.returncode == -signal.SIGKILL
    stale = arena_dir / f"ferrofeed-shared-{name}.arena"
    assert stale.exists()

    waiter = _popen(
        WAITER_SCRIPT.replace('"len": len(sl)', '"items": list(sl)'), name, str(arena_dir)
    )
    builder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(LATE_BUILDER_SCRIPT), name, str(arena_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _readline_until(waiter, "waiting", 30)
        _readline_until(builder, "built", 60)
        w_out, w_err = _communicate(waiter, 60)
        _, b_err = builder.communicate("done\n", timeout=30)
    finally:
        for p in (waiter, builder):
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert builder.returncode == 0, b_err
    assert waiter.returncode == 0, w_err
    out = json.loads(w_out.strip().splitlines()[-1])
    assert out.get("items") == ["new", "run"], out
    assert not any(p.name.endswith(".arena") for p in arena_dir.iterdir())
