"""Fault tests (issue 12): signals, killed processes, a full /dev/shm, abandoned iterators,
interpreter exit. Each probe runs in a subprocess, so a crash fails one test, not the suite.

Time bounds here are hang guards, never speed targets (the machine running the suite may
be loaded): a test shows that something did not wait for a call in progress by making the
call wait for the test, not by timing it.
RELIABILITY.md lists each fault with its promise, what was observed before and after, and
the command that reproduces it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from conftest import Procs, last_json_line, process_gone, run_python, wait_gone
from thread_counts import SNIPPET_IMPORT

SHM = Path("/dev/shm")
# OpenBLAS (NumPy's) runs a thread pool of its own, which it ends before a fork and starts
# again at the next use: one thread would come and go with the worker processes. Counts of
# ferrofeed's threads need it off.
ENV = {"OPENBLAS_NUM_THREADS": "1"}
POPEN_ENV = {**os.environ, **ENV}

# Helpers every snippet below starts with: the process's OS threads (with their names),
# its Python threads, its open fds and its live (not zombie) children.
PROBES = (
    SNIPPET_IMPORT
    + r"""
import json, os, signal, sys, threading, time


def thread_names():
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:  # ended meanwhile
            pass
    return sorted(names)

def py_threads():
    # Without the _DummyThread entries that native threads calling into Python leave.
    return sum(1 for t in threading.enumerate() if not isinstance(t, threading._DummyThread))

def fds():
    return len(os.listdir("/proc/self/fd"))

def live_children():
    pids = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                pids += [int(p) for p in f.read().split()]
        except FileNotFoundError:
            pass
    live = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] not in "ZX":
                    live.append(pid)
        except FileNotFoundError:
            pass
    return live

def shm_names():
    # This process's files only: other processes (a test run beside this one) come and go
    # in /dev/shm too. Folders are never this process's; arenas are named ferrofeed-PID-*.
    mine = f"ferrofeed-{os.getpid()}-"
    names = []
    for e in os.scandir("/dev/shm"):
        if e.is_dir(follow_symlinks=False):
            continue
        if e.name.split("-")[0] == "ferrofeed" and not e.name.startswith(mine):
            continue
        names.append(e.name)
    return sorted(names)
"""
)


def probe_snippet(body: str) -> str:
    return PROBES + textwrap.dedent(body)


# --------------------------------------------------------------------------------------
# Ctrl-C while a transform sleeps (issue 12, item 9)

CTRL_C = probe_snippet(
    r"""
    import itertools, tempfile
    from ferrofeed import DataLoader, PipelineBuilder

    kind, conc, catch = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    # The user's calls wait for the `release` file, made once KeyboardInterrupt is caught
    # (never without `catch`), for at most GIVE_UP seconds: a loader that waited for the
    # calls in progress would be seen waiting, whatever the machine's speed. Each call
    # appends one byte to `started` as it starts and to `returned` as it returns (appends
    # of one byte are atomic, from threads and worker processes alike).
    GIVE_UP = 30.0
    scratch = tempfile.mkdtemp()
    release, started, returned = (os.path.join(scratch, n)
                                  for n in ("release", "started", "returned"))
    for path in (started, returned):
        open(path, "wb").close()

    def mark(path):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"x")
        os.close(fd)

    def slow(x):
        mark(started)
        if catch == "nocatch":
            # Never released: one sleep, which takes the GIL again only once it is over.
            time.sleep(GIVE_UP)
        give_up = time.monotonic() + GIVE_UP
        while not os.path.exists(release) and time.monotonic() < give_up:
            time.sleep(0.01)  # cannot be interrupted: not on the main thread
        mark(returned)
        return x

    base = [py_threads(), os_threads()]
    if kind == "pipeline":
        it = PipelineBuilder().add_source(itertools.count()).pipe(slow, concurrency=conc)
        it = it.add_sink().build()
    elif kind == "loader-threads":
        it = DataLoader(list(range(1000)), 2, transform=slow, num_threads=conc)
    else:
        it = DataLoader(list(range(1000)), 2, transform=slow, num_workers=conc,
                        worker_start_method="fork")
    fired = []

    def fire():
        # Ctrl-C once `conc` calls are in progress (a hang guard of 20 s).
        deadline = time.monotonic() + 20
        while os.path.getsize(started) < conc and time.monotonic() < deadline:
            time.sleep(0.005)
        fired.append(time.monotonic())
        print(json.dumps({"fired_at": time.time()}), flush=True)
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Thread(target=fire)
    timer.start()
    if catch == "nocatch":
        for _ in it:
            pass
        raise SystemExit("the loop ended without KeyboardInterrupt")
    caught = None
    try:
        for _ in it:
            pass
    except KeyboardInterrupt:
        caught = time.monotonic()
    timer.join()
    # The timer's OS thread outlives join() by a moment: wait for it alone to be gone.
    gone_by = time.monotonic() + 10
    while os.path.exists(f"/proc/self/task/{timer.native_id}") and time.monotonic() < gone_by:
        time.sleep(0.001)
    at_catch = {"py": py_threads(), "os": os_threads(), "names": thread_names(),
                "children": live_children(), "started": os.path.getsize(started),
                "returned": os.path.getsize(returned)}
    open(release, "wb").close()  # the calls in progress return now
    released = time.monotonic()
    back = None
    deadline = released + 30
    while time.monotonic() < deadline:
        if [py_threads(), os_threads()] == base:
            back = time.monotonic() - released
            break
        time.sleep(0.005)
    print(json.dumps({
        "base": base, "latency": None if caught is None else caught - fired[0],
        "at_catch": at_catch, "threads_back_after": back,
    }))
    """
)

# The threads of a stage are named ff-<stage, cut to 8 characters>-<i>.
STAGE_THREAD_PREFIX = {"pipeline": "ff-slow-", "loader-threads": "ff-load-"}


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("kind", "conc"),
    [
        ("pipeline", 1),  # the case
        ("pipeline", 3),
        ("loader-threads", 2),
        ("loader-workers", 1),
        ("loader-workers", 2),
    ],
)
def test_ctrl_c_during_a_long_call_raises_at_once_with_every_other_thread_joined(
    kind: str, conc: int
) -> None:
    """Promise: KeyboardInterrupt at once (0.5 s: RELIABILITY.md), without waiting for the
    calls in progress; before it reaches the caller, every thread ferrofeed owns is joined
    except those inside the user's calls, which end when the calls return; worker processes
    are ended. The calls return only when the probe releases them, after the catch: the
    test proves the loader did not wait for them without timing it."""
    proc = run_python(CTRL_C, args=[kind, str(conc), "catch"], timeout=75, env=ENV)
    r = last_json_line(proc.stdout)
    assert r["latency"] is not None, proc.stdout
    at = r["at_catch"]
    assert at["started"] >= conc, r  # Ctrl-C came with `conc` calls in progress
    assert at["returned"] == 0, r  # and was raised before any of them returned
    base_py, base_os = r["base"]
    assert at["py"] == base_py, r  # no Python thread of ferrofeed's is left
    assert at["children"] == [], r  # the worker processes are gone already
    if kind == "loader-workers":
        assert at["os"] == base_os, r
    else:
        # Exactly the threads inside the user's call are left, named after the stage:
        # not the source thread, a stage task or the stall watch.
        assert at["os"] == base_os + conc, r
        # (The process's runtime and CPU pool, "ferrofeed-rt" and "ferrofeed-cpu-N", are
        # kept for the process's life: not a pipeline's.)
        kept = ("ferrofeed-rt", "ferrofeed-cpu")
        left = [
            n
            for n in at["names"]
            if (n.startswith("ff-") or n.startswith("ferrofeed")) and not n.startswith(kept)
        ]
        assert len(left) == conc, r
        assert all(n.startswith(STAGE_THREAD_PREFIX[kind]) for n in left), r
    # The abandoned threads end once their calls return (a hang guard of 30 s).
    assert r["threads_back_after"] is not None, r
    assert "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ["pipeline", "loader-threads", "loader-workers"])
def test_uncaught_ctrl_c_during_a_long_call_ends_the_process_at_once(kind: str) -> None:
    """The process ends by SIGINT (CPython's way for an uncaught KeyboardInterrupt) without
    waiting for the calls in progress, which are never released (they give up after 30 s)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CTRL_C, kind, "2", "nocatch"],
        env=POPEN_ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"{kind}: the process did not end after Ctrl-C")
    ended = time.time()
    fired = last_json_line(out)["fired_at"]
    assert proc.returncode == -signal.SIGINT, (proc.returncode, err)
    assert "KeyboardInterrupt" in err
    for bad in ("panicked", "Fatal", "Segmentation"):
        assert bad not in err, err
    # A hang guard: the calls in progress would have held the process 30 s.
    assert ended - fired < 20, ended - fired


# --------------------------------------------------------------------------------------
# SIGINT and SIGTERM mid-epoch of a DataLoader over a SharedList (threads, workers)

MID_EPOCH = probe_snippet(
    r"""
    from ferrofeed import DataLoader, SharedList

    mode, arena_dir = sys.argv[1], sys.argv[2]

    def load(x):
        time.sleep(0.01)
        return x

    records = SharedList(range(100_000), path=arena_dir)
    workers = 2 if mode == "workers" else 0
    loader = DataLoader(records, 8, transform=load, num_threads=2, num_workers=workers,
                        worker_start_method="fork" if workers else None)
    it = iter(loader)
    next(it)
    print(json.dumps({"pid": os.getpid(), "arena": records.path,
                      "workers": live_children()}), flush=True)
    for _ in it:  # mid-epoch when the signal comes
        pass
    """
)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["threads", "workers"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_mid_epoch_ends_the_process_and_leaves_nothing(
    mode: str, sig: int, arena_dir: Path
) -> None:
    """SIGINT (uncaught KeyboardInterrupt) or SIGTERM mid-epoch: the process ends by that
    signal (its epoch would last minutes), the `SharedList`'s arena file is removed (SIGTERM
    runs its cleanup), and the worker processes end with it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", MID_EPOCH, mode, str(arena_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("{"):
            proc.kill()
            pytest.fail(f"the loader did not start: {line!r} {proc.communicate()[1]}")
        info = json.loads(line)
        assert Path(info["arena"]).exists()
        assert len(info["workers"]) == (2 if mode == "workers" else 0)
        time.sleep(0.3)  # well into the epoch
        proc.send_signal(sig)
        # A hang guard: the loader would otherwise run for minutes.
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == -sig, (proc.returncode, err)
    for bad in ("panicked", "Fatal", "Segmentation"):
        assert bad not in err, err
    assert not Path(info["arena"]).exists(), "the arena was left in /dev/shm"
    assert wait_gone(info["workers"], 30), "worker processes outlived the main process"
    assert sorted(p.name for p in arena_dir.iterdir()) == []


# --------------------------------------------------------------------------------------
# the consumer abandons the iterator: nothing is left (threads, fds, /dev/shm, workers)

ABANDON = probe_snippet(
    r"""
    import gc, tempfile
    from ferrofeed import DataLoader, ImageFiles, PipelineBuilder, SharedList, ops
    from ferrofeed.samples import image_folder

    mode = sys.argv[1]
    files = image_folder(tempfile.mkdtemp(), 40, size=(64, 48))
    records = SharedList([p for p, _ in files])

    def load(path):
        with open(path, "rb") as f:
            return len(f.read())

    def make():
        if mode == "native":
            return DataLoader(ImageFiles([p for p, _ in files]), 4,
                              transform=ops.decode_image(size=(32, 32)), num_threads=2)
        if mode == "pipeline":
            return (PipelineBuilder().add_source(records).pipe(load, concurrency=2)
                    .aggregate(4).add_sink().build())
        workers = 2 if mode == "workers" else 0
        return DataLoader(records, 4, transform=load, num_threads=2, num_workers=workers)

    def take_some():
        it = iter(make())
        next(it)
        next(it)
        return live_children()  # dropped here, mid-epoch

    # A first round warms up what stays for the process's life (imports, pools).
    take_some()
    gc.collect()
    time.sleep(0.2)
    base = {"py": py_threads(), "os": os_threads(), "fds": fds(), "shm": shm_names()}
    rounds = []
    for _ in range(5):
        workers = take_some()
        gc.collect()
        deadline = time.monotonic() + 12  # a hang guard: the loop ends once all is back
        while time.monotonic() < deadline:
            now = {"py": py_threads(), "os": os_threads(), "fds": fds(), "shm": shm_names()}
            if now == base and not live_children():
                break
            time.sleep(0.01)
        rounds.append({**now, "children": live_children(), "workers": workers})
    records.close()
    print(json.dumps({"base": base, "rounds": rounds}))
    """
)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["pipeline", "threads", "native", "workers"])
def test_abandoned_iterator_leaves_no_threads_fds_shm_or_workers(mode: str) -> None:
    proc = run_python(ABANDON, args=[mode], timeout=75, env=ENV)
    r = last_json_line(proc.stdout)
    base = r["base"]
    for i, now in enumerate(r["rounds"]):
        assert now["children"] == [], (i, now)
        for key in ("py", "os", "fds", "shm"):
            assert now[key] == base[key], (key, i, now, base)
        if mode == "workers":
            assert len(now["workers"]) == 2, now  # the workers ran, then ended
    assert "Traceback" not in proc.stderr, proc.stderr


# --------------------------------------------------------------------------------------
# interpreter exit with a DataLoader mid-epoch (pipelines alone: test_pipeline_shutdown.py)

EXIT_MID_EPOCH = r"""
import sys, tempfile, time
from ferrofeed import DataLoader, ImageFiles, ops
from ferrofeed.samples import image_folder

mode = sys.argv[1]

def load(x):
    # "stuck": the first batch comes quickly, then every call sleeps for 120 s.
    time.sleep(120 if mode == "stuck" and x >= 8 else 0.001)
    return x

if mode == "native":
    files = image_folder(tempfile.mkdtemp(), 40, size=(64, 48))
    loader = DataLoader(ImageFiles([p for p, _ in files]), 4,
                        transform=ops.decode_image(size=(32, 32)), num_threads=2)
else:
    loader = DataLoader(list(range(10_000)), 4, transform=load, num_threads=2)
it = iter(loader)
next(it)
if mode == "stuck":
    time.sleep(0.3)  # both threads are inside 120 s calls (or about to be)
print("left running", flush=True)
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["threads", "native", "stuck"])
def test_interpreter_exits_with_a_loader_mid_epoch(mode: str) -> None:
    t0 = time.monotonic()
    try:
        proc = run_python(EXIT_MID_EPOCH, args=[mode], timeout=75, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the interpreter hung at exit with a {mode} loader mid-epoch")
    assert "left running" in proc.stdout
    assert proc.returncode == 0, proc.stderr
    for bad in ("Traceback", "panicked", "Fatal"):
        assert bad not in proc.stderr, proc.stderr
    # A hang guard, start-up included: not the 120 s of the stuck calls.
    assert time.monotonic() - t0 < 60


# --------------------------------------------------------------------------------------
# SIGKILL of a SharedList reader, and of its owner

READER = r"""
import sys, time
from ferrofeed import SharedList
sl = SharedList.open(sys.argv[1])
n = 0
print("reading", flush=True)
while True:  # reads until killed
    for i in range(len(sl)):
        assert sl[i]["id"] == i
        n += 1
"""

OWNER = r"""
import sys, time
from ferrofeed import SharedList
sl = SharedList(({"id": i, "data": "x" * 100} for i in range(20_000)), path=sys.argv[1])
print(sl.path, flush=True)
time.sleep(600)
"""


def _clean(*dirs: Path) -> str:
    return run_python(
        "import sys; from ferrofeed.cli import main; sys.exit(main())",
        args=["clean", *map(str, dirs)],
    ).stdout


@pytest.mark.timeout(60)
def test_sigkill_of_a_reader_leaves_the_owner_working(arena_dir: Path, procs: Procs) -> None:
    """The owner keeps reading, ``ferrofeed clean`` keeps its live arena, and its close()
    removes it; readers in other processes are unaffected too."""
    from ferrofeed import SharedList

    with SharedList(({"id": i} for i in range(5000)), path=arena_dir / "a.arena") as sl:
        reader, _ = procs.start(READER, sl.path)
        other, _ = procs.start(READER, sl.path)
        time.sleep(0.2)  # mid-read
        procs.kill9(reader)
        assert [sl[i]["id"] for i in range(len(sl))] == list(range(5000))
        assert other.poll() is None, "the other reader died with the killed one"
        out = _clean(arena_dir)
        assert "removed 0 orphaned arena files" in out, out
        assert Path(sl.path).exists()
        # A new reader after the kill sees every item.
        check = run_python(
            "import sys; from ferrofeed import SharedList; s = SharedList.open(sys.argv[1]); "
            "print(sum(1 for i in range(len(s)) if s[i]['id'] == i))",
            args=[sl.path],
        )
        assert check.stdout.strip() == "5000"
        procs.kill9(other)
    assert sorted(p.name for p in arena_dir.iterdir()) == []


@pytest.mark.timeout(60)
def test_sigkill_of_the_owner_leaves_readers_working_then_clean_removes_it(
    arena_dir: Path, procs: Procs
) -> None:
    """A reader keeps reading the arena of a killed owner (its mapping holds the pages);
    ``ferrofeed clean`` keeps the file while a reader holds it and removes it after."""
    owner, path = procs.start(OWNER, str(arena_dir / "owned.arena"))
    reader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from ferrofeed import SharedList\n"
            "s = SharedList.open(sys.argv[1]); print('opened', flush=True)\n"
            "sys.stdin.readline()\n"  # wait until the owner is dead
            "print(sum(1 for i in range(len(s)) if s[i]['id'] == i), flush=True)\n"
            "sys.stdin.readline()\n",
            path,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert reader.stdout is not None
        assert reader.stdin is not None
        assert reader.stdout.readline().strip() == "opened"
        procs.kill9(owner)
        assert Path(path).exists()  # no cleanup ran: SIGKILL
        reader.stdin.write("go\n")
        reader.stdin.flush()
        assert reader.stdout.readline().strip() == "20000"
        out = _clean(arena_dir)
        assert "removed 0 orphaned arena files" in out, out  # the reader holds it
        assert Path(path).exists()
        reader.stdin.write("done\n")
        reader.stdin.flush()
        reader.communicate(timeout=10)
        assert reader.returncode == 0
    finally:
        for p in (owner, reader):
            if p.poll() is None:
                p.kill()
                p.communicate()
    out = _clean(arena_dir)
    assert f"removed {path}" in out, out
    assert "removed 1 orphaned arena file\n" in out, out
    assert sorted(p.name for p in arena_dir.iterdir()) == []


# --------------------------------------------------------------------------------------
# /dev/shm full at creation and at growth: a real, small tmpfs

FULL_TMPFS = r"""
import errno, json, os, sys
from ferrofeed import ArenaFullError, SharedList

d = sys.argv[1]
out = {}
st = os.statvfs(d)
out["size"] = st.f_blocks * st.f_frsize

def attempt(items):
    try:
        with SharedList(items, path=d) as sl:
            return {"result": "ok", "n": len(sl)}
    except ArenaFullError as e:
        return {"result": "ArenaFullError", "msg": str(e), "oserror": isinstance(e, OSError)}
    except Exception as e:
        return {"result": type(e).__name__, "msg": str(e)}

# Full at creation: another file takes every byte first.
filler = os.path.join(d, "filler")
fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
try:
    while True:
        os.write(fd, b"\0" * 4096)
except OSError as e:
    out["filler_errno"] = e.errno
finally:
    os.close(fd)
out["creation"] = attempt([b"s" * 100 for _ in range(10)])
out["left_after_creation"] = sorted(os.listdir(d))
os.unlink(filler)
# Full while growing: an arena of ~10 MB into 1 MiB.
out["growth"] = attempt(b"x" * 10_000 for _ in range(1000))
out["left_after_growth"] = sorted(os.listdir(d))
st = os.statvfs(d)
out["free_after"] = st.f_bfree * st.f_frsize
# It fits once there is room.
out["fits"] = attempt([b"s" * 1000 for _ in range(100)])
out["left_at_end"] = sorted(os.listdir(d))
print(json.dumps(out))
"""


def _unshare_mount_cmd(mountpoint: Path, *python_args: str) -> list[str]:
    """Run Python in a new user and mount namespace with a 1 MiB tmpfs at ``mountpoint``:
    no root needed where unprivileged user namespaces are allowed, and nothing is mounted
    outside the child."""
    script = 'mount -t tmpfs -o size=1m tmpfs "$0" && exec "$@"'
    return [
        "unshare",
        "--user",
        "--map-root-user",
        "--mount",
        "sh",
        "-c",
        script,
        str(mountpoint),
        sys.executable,
        *python_args,
    ]


@pytest.mark.timeout(60)
def test_full_shm_at_creation_and_at_growth() -> None:
    """A real tmpfs of 1 MiB (as /dev/shm would be): full before the arena is created,
    then filled by the arena as it grows. Each time: `ArenaFullError` naming the place,
    no file left, the space back; the process goes on."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1)")
    d = Path(tempfile.mkdtemp(prefix="ff-fulltmpfs-"))
    try:
        probe = subprocess.run(
            _unshare_mount_cmd(d, "-c", "print('ok')"),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if probe.returncode != 0 or probe.stdout.strip() != "ok":
            pytest.skip(f"cannot mount a tmpfs in a user namespace: {probe.stderr.strip()}")
        proc = subprocess.run(
            _unshare_mount_cmd(d, "-c", FULL_TMPFS, str(d)),
            capture_output=True,
            text=True,
            timeout=45,
            check=False,
        )
        assert proc.returncode == 0, f"crashed: rc={proc.returncode}\n{proc.stderr}"
        r = last_json_line(proc.stdout)
        assert r["size"] == 1 << 20, r
        assert r["filler_errno"] == 28, r  # ENOSPC: the tmpfs really was full
        for case in ("creation", "growth"):
            got = r[case]
            assert got["result"] == "ArenaFullError", (case, got)
            assert got["oserror"] is True
            assert str(d) in got["msg"], got
        assert r["left_after_creation"] == ["filler"], r
        assert r["left_after_growth"] == [], r
        assert r["free_after"] >= (1 << 20) - (64 << 10), r  # the space came back
        assert r["fits"] == {"result": "ok", "n": 100}, r
        assert r["left_at_end"] == [], r
        assert not any(d.iterdir())  # nothing was mounted or written outside the child
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_helpers_can_fail() -> None:
    """The probes above can tell a live process from a gone one."""
    assert not process_gone(os.getpid())
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert process_gone(p.pid)
