"""Two nodes under torchrun, on one machine, reading tar shards from S3 (issue 26).

Two torchrun launches are the two nodes of one job (``--nnodes 2``, node ranks 0 and 1,
static rendezvous on 127.0.0.1) of 2 processes each. Each node has its own shared-memory
directory (``FERROFEED_ARENA_DIR``), its own cache directory, and reaches moto's S3 server
through its own `FaultProxy`, so the requests of each node are counted apart. The job is
tests/multinode_job.py: every rank maps its node's `SharedList`, reads the shards through
`TarShards("s3://...", cache_dir=...)` and a `DataLoader` that takes its rank and world size
from torch.distributed, all-reduces once per batch (as DDP does) and writes the keys of each
batch and its loader's state after it.

Checked here: per epoch the four ranks yield every sample exactly once, the same number of
batches each, and the very batches a single process computes for ranks 0..3 of 4 over the
same shards on local disk; each node's ranks map one arena file in their node's directory,
the two nodes different ones; each node lists the shards once and downloads each shard once
into its own cache. Then node 1's processes are killed with SIGKILL in the middle of epoch
0; the job is started again on both nodes with every rank loading its own state from the
last step all ranks had checkpointed, and the samples before the kill plus those after the
restart are the uninterrupted run's batches, exactly.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import io
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ferrofeed as ff
import pytest
from objstore import FaultProxy, S3Server, free_port

pytest.importorskip("boto3")
pytest.importorskip("moto.server")

# The slow tier (multi-node): `make test-slow`, not `make test`.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TESTS = Path(__file__).resolve().parent
JOB = TESTS / "multinode_job.py"
BUCKET = "multinode"
PREFIX = "train"
URL = f"s3://{BUCKET}/{PREFIX}/*.tar"
# Six shards, one of them shorter: 237 samples, split 60/59/59/59 over 4 ranks.
SHARD_SIZES = [40, 40, 40, 40, 37, 40]
NODES, PER_NODE = 2, 2
WORLD = NODES * PER_NODE
EPOCHS, BATCH, WINDOW, SEED = 2, 4, 16, 11
BATCHES = math.ceil(math.ceil(sum(SHARD_SIZES) / WORLD) / BATCH)  # 15
DIE_AT_STEP = 5  # node 1 kills itself after its 5th checkpoint, in epoch 0
RUN_TIMEOUT = 100.0  # seconds a launch of both nodes may take (a hang guard)


def _distributed_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    # In a subprocess: the pytest process imports no framework it does not need.
    probe = (
        "import torch.distributed as d, torch.distributed.run; "
        "assert d.is_available() and d.is_gloo_available()"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=60)
    return proc.returncode == 0


def shard_name(k: int) -> str:
    return f"part-{k:03d}.tar"


def sample_key(k: int, i: int) -> str:
    return f"s{k}_{i:03d}"


def all_keys() -> list[str]:
    return sorted(sample_key(k, i) for k, n in enumerate(SHARD_SIZES) for i in range(n))


def make_shard(k: int) -> bytes:
    """Shard ``k``: per sample, ``KEY.bin`` (the key three times) and ``KEY.cls`` (i % 10)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(SHARD_SIZES[k]):
            key = sample_key(k, i)
            for ext, data in (("bin", key.encode() * 3), ("cls", str(i % 10).encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# --------------------------------------------------------------------------------------------
# Running the job on two nodes
# --------------------------------------------------------------------------------------------


@dataclass
class Launch:
    """What one launch of both nodes left behind."""

    tag: str
    returncodes: list[int | None]  # per node; None: killed by the test after the hang guard
    output: list[str]  # per node: torchrun's stdout and stderr
    requests: list[list[tuple[str, str, str | None]]]  # per node: its proxy's log
    info: dict[int, dict[str, Any]] = field(default_factory=dict)  # per global rank
    records: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    ckpts: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    def report(self) -> str:
        """Each node's return code, the errors its ranks raised, and its output's end."""
        parts = []
        for k, (rc, out) in enumerate(zip(self.returncodes, self.output, strict=True)):
            errors = [line for line in out.splitlines() if "Error: " in line]
            parts.append(f"--- {self.tag} node {k}: rc {rc}; errors:")
            parts.extend(errors)
            parts.append(f"--- {self.tag} node {k}: the end of its output:\n{out[-4000:]}")
        ranks = {r: (i["pid"], i["arena_path"], i["built_by"]) for r, i in self.info.items()}
        parts.append(f"--- {self.tag}: rank -> (pid, arena, pid that built it): {ranks}")
        return "\n".join(parts)


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (children first found through /proc's parent ids)."""
    parents: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents[ppid].append(int(entry))
    out, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        out.extend(children)
        todo.extend(children)
    return out


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL torchrun (the process we started) and every process below it."""
    for pid in [*_descendants(proc.pid), proc.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The whole lines of a JSON-lines file (a process killed mid-write leaves a part line)."""
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8")
    return [json.loads(line) for line in text.split("\n")[:-1]]


def run_job(
    s3: S3Server,
    nodes: list[Path],
    out: Path,
    tag: str,
    extra: list[str],
) -> Launch:
    """Start both nodes at once, wait for them (killing what outlives the hang guard)."""
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    logs = [out / f"{tag}-node{k}.log" for k in range(NODES)]
    proxies = [FaultProxy(s3.endpoint) for _ in range(NODES)]
    try:
        for k, (root, proxy) in enumerate(zip(nodes, proxies, strict=True)):
            (root / "shm").mkdir(parents=True, exist_ok=True)
            env = {
                **os.environ,
                **s3.env(endpoint=proxy.url),
                "FERROFEED_ARENA_DIR": str(root / "shm"),
                "OMP_NUM_THREADS": "1",
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p
                ),
            }
            cmd = [
                sys.executable, "-m", "torch.distributed.run",
                "--nnodes", str(NODES), "--nproc-per-node", str(PER_NODE),
                "--node-rank", str(k), "--master-addr", "127.0.0.1",
                "--master-port", str(port), "--max-restarts", "0",
                str(JOB), "--url", URL, "--cache-dir", str(root / "cache"), "--out", str(out),
                "--tag", tag, "--epochs", str(EPOCHS), "--batch-size", str(BATCH),
                "--shuffle-window", str(WINDOW), "--seed", str(SEED), *extra,
            ]  # fmt: skip
            with open(logs[k], "wb") as log:
                procs.append(
                    subprocess.Popen(
                        cmd,
                        cwd=out,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + RUN_TIMEOUT
        codes: list[int | None] = []
        for proc in procs:
            try:
                codes.append(proc.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
    finally:
        for proc in procs:
            _kill_tree(proc)
            proc.wait()
        requests = [p.log for p in proxies]
        for p in proxies:
            p.close()
    launch = Launch(
        tag, codes, [log.read_text(errors="replace") for log in logs], requests=requests
    )
    for rank in range(WORLD):
        info = out / f"{tag}-rank{rank}.info.json"
        if info.exists():
            launch.info[rank] = json.loads(info.read_text())
        launch.records[rank] = _read_jsonl(out / f"{tag}-rank{rank}.records.jsonl")
        launch.ckpts[rank] = _read_jsonl(out / f"{tag}-rank{rank}.ckpt.jsonl")
    return launch


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    if not _distributed_available():
        pytest.skip("torch.distributed with the gloo backend (and torchrun) is not available")
    with S3Server() as server:
        server.create_bucket(BUCKET)
        for k in range(len(SHARD_SIZES)):
            server.put(BUCKET, f"{PREFIX}/{shard_name(k)}", make_shard(k))
        yield server


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("multinode")


@pytest.fixture(scope="module")
def clean(s3: S3Server, workdir: Path) -> tuple[Launch, list[Path]]:
    """One uninterrupted run of the job on two nodes."""
    nodes = [workdir / "clean" / f"node{k}" for k in range(NODES)]
    launch = run_job(s3, nodes, workdir / "out", "clean", [])
    assert launch.returncodes == [0, 0], launch.report()
    return launch, nodes


@pytest.fixture(scope="module")
def killed(s3: S3Server, workdir: Path) -> tuple[Launch, Launch, int, list[Path]]:
    """A run whose node 1 is killed in epoch 0, then the job started again from checkpoints."""
    nodes = [workdir / "killed" / f"node{k}" for k in range(NODES)]
    first = run_job(s3, nodes, workdir / "out", "killed", ["--die-at-step", str(DIE_AT_STEP)])
    # Node 1's ranks died by SIGKILL; node 0's then lost their peers in the all-reduce.
    assert first.returncodes[1] not in (0, None), first.report()
    assert first.returncodes[0] != 0, first.report()
    for rank in (2, 3):
        assert [c["step"] for c in first.ckpts[rank]] == list(range(1, DIE_AT_STEP + 1))
    # The last step every rank checkpointed: the job's checkpoint (a rank of node 0 may have
    # saved no later step, since the step after needs node 1's ranks in its all-reduce).
    step = min(first.ckpts[rank][-1]["step"] for rank in range(WORLD))
    assert DIE_AT_STEP - 1 <= step <= DIE_AT_STEP, first.report()
    second = run_job(
        s3,
        nodes,
        workdir / "out",
        "resumed",
        ["--resume-from", "killed", "--resume-step", str(step)],
    )
    assert second.returncodes == [0, 0], second.report()
    return first, second, step, nodes


def epoch_keys(records: dict[int, list[dict[str, Any]]], epoch: int) -> list[str]:
    return sorted(
        k for rs in records.values() for r in rs if r["epoch"] == epoch for k in r["keys"]
    )


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------


def test_every_sample_once_per_epoch_over_two_nodes(clean: tuple[Launch, list[Path]]) -> None:
    launch, _ = clean
    assert sorted(launch.info) == list(range(WORLD))
    for rank, info in launch.info.items():
        # torchrun's static rendezvous numbers node k's processes k * 2, k * 2 + 1, and the
        # loader takes its rank and world size from torch.distributed.
        assert info["node"] == rank // PER_NODE
        assert info["env"]["RANK"] == str(rank)
        assert info["env"]["WORLD_SIZE"] == str(WORLD)
        assert info["env"]["LOCAL_RANK"] == str(rank % PER_NODE)
        assert (info["loader_rank"], info["loader_world_size"]) == (rank, WORLD)
        assert info["batches"] == BATCHES
        assert [n for _, n in info["shards"]] == SHARD_SIZES
    for epoch in range(EPOCHS):
        for rank in range(WORLD):
            # Every rank yields the same number of batches (none runs out and hangs DDP).
            batches = [r["batch"] for r in launch.records[rank] if r["epoch"] == epoch]
            assert batches == list(range(BATCHES)), (rank, epoch)
        assert epoch_keys(launch.records, epoch) == all_keys(), epoch
    # The two epochs are two different orders.
    assert launch.records[0][0]["keys"] != launch.records[0][BATCHES]["keys"]


def test_ranks_split_the_shards_as_on_one_node(
    clean: tuple[Launch, list[Path]], tmp_path: Path
) -> None:
    """Rank r of the two-node job yields what rank r of 4 yields in one process."""
    launch, _ = clean
    for k in range(len(SHARD_SIZES)):
        (tmp_path / shard_name(k)).write_bytes(make_shard(k))
    local = ff.TarShards(str(tmp_path / "*.tar"))
    for rank in range(WORLD):
        loader = ff.DataLoader(
            local,
            batch_size=BATCH,
            shuffle=True,
            shuffle_window=WINDOW,
            seed=SEED,
            rank=rank,
            world_size=WORLD,
            num_threads=1,
        )
        for epoch in range(EPOCHS):
            want = [list(b["__key__"]) for b in loader.epoch_batches(epoch)]
            got = [r["keys"] for r in launch.records[rank] if r["epoch"] == epoch]
            assert got == want, (rank, epoch)


def _check_arenas(launch: Launch, nodes: list[Path]) -> None:
    files = []
    for k, root in enumerate(nodes):
        infos = [launch.info[rank] for rank in range(k * PER_NODE, (k + 1) * PER_NODE)]
        paths = {info["arena_path"] for info in infos}
        assert len(paths) == 1, paths
        (path,) = paths
        assert Path(path).parent == root / "shm"
        assert [info["arena_owner"] for info in infos] == [True, False]  # local rank 0 built it
        # Both ranks mapped one and the same file of their node's directory, and no other.
        mapped = [[tuple(m[1:]) for m in info["mapped"]] for info in infos]
        assert len(mapped[0]) == 1, mapped
        assert mapped[0] == mapped[1], mapped
        assert [m[0] for info in infos for m in info["mapped"]] == [path] * PER_NODE
        assert all(info["class_names"][3] == "class-03" for info in infos)
        # Both read the arena this run's local rank 0 built (not one of an earlier run).
        assert [info["built_by"] for info in infos] == [[infos[0]["pid"]]] * PER_NODE
        files.append(mapped[0][0])
        # Closed by its owner at the end of the job: nothing left in the node's directory.
        assert not list((root / "shm").glob("*.arena"))
    assert files[0] != files[1]


def test_each_node_maps_one_arena(clean: tuple[Launch, list[Path]]) -> None:
    launch, nodes = clean
    _check_arenas(launch, nodes)


def _shard_gets(requests: list[tuple[str, str, str | None]]) -> dict[str, list[tuple[int, int]]]:
    """The byte ranges fetched per shard, ``[start, end)``, in request order."""
    out: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for method, path, range_ in requests:
        if method != "GET" or "?" in path:
            continue
        name = path.rsplit("/", 1)[1]
        if range_ is None:
            out[name].append((0, len(make_shard(int(name[5:8])))))
            continue
        start, end = range_.removeprefix("bytes=").split("-")
        out[name].append((int(start), int(end) + 1))
    return out


def test_each_node_lists_once_and_downloads_each_shard_once(
    clean: tuple[Launch, list[Path]],
) -> None:
    launch, nodes = clean
    names = [shard_name(k) for k in range(len(SHARD_SIZES))]
    for k, root in enumerate(nodes):
        requests = launch.requests[k]
        lists = [r for r in requests if r[0] == "GET" and "list-type=2" in r[1]]
        assert len(lists) == 1, requests
        gets = _shard_gets(requests)
        assert sorted(gets) == names, requests
        for name, ranges in gets.items():
            # The ranges of a shard's GETs, put end to end, are the shard once: no byte twice.
            ranges.sort()
            size = len(make_shard(int(name[5:8])))
            assert ranges[0][0] == 0, (name, ranges)
            assert ranges[-1][1] == size, (name, ranges)
            assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges)), (name, ranges)
        # The node's cache holds every shard, whole, under a name ending in the shard's.
        cached = [p for p in (root / "cache" / "shards").iterdir() if not p.name.startswith(".")]
        assert sorted(p.name.split("-", 1)[1] for p in cached) == names
        for p in cached:
            assert p.read_bytes() == make_shard(int(p.name.split("-", 1)[1][5:8]))


def test_exact_resume_after_one_node_is_killed(
    clean: tuple[Launch, list[Path]],
    killed: tuple[Launch, Launch, int, list[Path]],
) -> None:
    reference, _ = clean
    first, second, step, _ = killed
    # The killed run went as the uninterrupted one up to the checkpoint.
    before = {rank: [r for r in first.records[rank] if r["step"] <= step] for rank in range(WORLD)}
    for rank in range(WORLD):
        assert before[rank] == reference.records[rank][:step], rank
        assert first.ckpts[rank][step - 1]["step"] == step
    # Every rank resumed from its own state of that step, and went on to the end exactly as
    # the uninterrupted run did.
    for rank in range(WORLD):
        info = second.info[rank]
        assert (info["start_epoch"], info["start_step"]) == (0, step)
        assert second.records[rank] == reference.records[rank][step:], rank
    # So, per epoch, before the kill plus after the restart: every sample exactly once.
    for epoch in range(EPOCHS):
        keys = epoch_keys(before, epoch) + epoch_keys(second.records, epoch)
        assert sorted(keys) == all_keys(), epoch
    # The restart fetched no shard: each node's cache held them all.
    for k in range(NODES):
        assert _shard_gets(second.requests[k]) == {}, second.requests[k]


def test_restart_after_a_kill_maps_one_new_arena_per_node(
    killed: tuple[Launch, Launch, int, list[Path]],
) -> None:
    """Node 1's arena, left behind by its SIGKILLed owner, does not stop the restart."""
    first, second, _, nodes = killed
    stale = first.info[2]["arena_path"]
    assert Path(stale).parent == nodes[1] / "shm"
    assert first.info[2]["arena_owner"]
    assert first.info[2]["built_by"] == [first.info[2]["pid"]]
    # In the restarted job each node's ranks map the arena their local rank 0 built in this
    # run, one file per node, closed at the end (the stale one swept away too).
    _check_arenas(second, nodes)
