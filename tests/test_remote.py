"""Sharded sources in object storage, against real servers started here (tests/objstore.py).

moto's S3 server (a subprocess), a plain HTTP file server and a fault-injecting proxy in front
of either: no mock of the client. What is checked:

1. A remote source yields exactly the batches of the same shards read locally (tar, Parquet,
   JSON lines; glob and brace patterns; every rank of a world; resume mid-epoch; HTTP too).
2. Listing and counting cost a bounded number of requests, once per node (the index).
3. Faults (5xx, 503 SlowDown, drops, truncated and slow bodies, delays) lose nothing.
4. A missing object or bucket, a 403, a deleted or replaced object: a clear error naming the
   URL, fast; bad arguments are refused.
5. The cache directory: a second epoch fetches nothing; processes share one download; no
   temporary file is left; the size cap holds.
6. Worker processes under fork, spawn and forkserver; a forked child reads on its own.
7. A prefetch budget of 0, or smaller than a shard, still reads whole epochs.
8. No fetch outlives its source: dropping a source's remote shards ends the fetches it started
   on the runtime that pipelines share, and a remote epoch leaves no task there.

Every test gets its own ``FERROFEED_CACHE_DIR`` (the node's index), so tests do not share
listings and nothing is written under ``~/.cache``. No speed is asserted; bounds on time are
hang guards and the "fails within seconds" promise, with a wide margin.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import io
import json
import multiprocessing
import os
import queue
import random
import select
import signal
import socket
import tarfile
import threading
import time
import traceback
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from email.message import Message
from pathlib import Path
from typing import Any

import ferrofeed as ff
import pytest
from conftest import run_spawned
from ferrofeed import _core, _remote
from objstore import (
    FaultProxy,
    HttpFileServer,
    S3Server,
    python_http_server,
    ranged_get,
    whole_get,
)
from thread_counts import os_threads, python_threads

pytest.importorskip("boto3")
pytest.importorskip("moto.server")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

# The slow tier (object storage): `make test-slow`, not `make test`.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

BUCKET = "ff-shards"
TAR_SIZES = [30, 45, 20, 50, 35, 40]
PARQUET_SIZES = [40, 25, 50, 35]
JSONL_SIZES = [40, 25, 50, 35]
# Fails fast: a 404 or 403 is raised within this many seconds (it takes milliseconds; the
# bound only tells "no minutes of retries" apart from "at once" on a loaded machine).
FAST_S = 10.0
# Quick retries for the fault tests: object_store's backoff starts at 100 ms.
RETRIES = {"max_retries": "8", "retry_timeout": "60"}


# -- writing shards --------------------------------------------------------------------------------


def tar_bytes(ids: range, rng: random.Random) -> bytes:
    """A WebDataset tar of samples ``ids``: ``cls`` (the id) and ``bin`` (random bytes)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for i in ids:
            for ext, data in (
                ("cls", str(i).encode()),
                ("bin", rng.randbytes(rng.randint(1, 900))),
            ):
                info = tarfile.TarInfo(f"s{i:06d}.{ext}")
                info.size = len(data)
                info.mtime = 0
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def parquet_bytes(ids: range, rng: random.Random, *, payload: int = 300) -> bytes:
    """A Parquet file of rows ``id`` and ``payload`` (random bytes), row groups of 10."""
    table = pa.table(
        {
            "id": list(ids),
            "payload": [rng.randbytes(rng.randint(payload // 2, payload)) for _ in ids],
        }
    )
    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=10)
    return out.getvalue()


def jsonl_bytes(ids: range, rng: random.Random) -> bytes:
    """JSON lines ``{"id": i, "text": ...}``."""
    lines = [
        json.dumps({"id": i, "text": "w" * rng.randint(0, 200) + str(rng.random())}) for i in ids
    ]
    return ("\n".join(lines) + "\n").encode()


KINDS: dict[str, tuple[type[ff.TarShards | ff.ParquetShards | ff.JsonLines], str, list[int]]] = {
    "tar": (ff.TarShards, "tar", TAR_SIZES),
    "parquet": (ff.ParquetShards, "parquet", PARQUET_SIZES),
    "jsonl": (ff.JsonLines, "jsonl", JSONL_SIZES),
}


def shard_files(kind: str, seed: int = 26) -> dict[str, bytes]:
    """``{name: bytes}`` of a data set of ``kind``: ``{kind}/train-0000.{ext}``, ..."""
    _, ext, sizes = KINDS[kind]
    write = {"tar": tar_bytes, "parquet": parquet_bytes, "jsonl": jsonl_bytes}[kind]
    rng = random.Random(seed)
    out, start = {}, 0
    for k, n in enumerate(sizes):
        out[f"{kind}/train-{k:04d}.{ext}"] = write(range(start, start + n), rng)
        start += n
    return out


def digest(sample: dict[str, Any]) -> tuple[int, int]:
    """What the tests compare of a sample: its id and a CRC of its payload."""
    if "cls" in sample:
        return int(sample["cls"]), zlib.crc32(sample["bin"])
    if "payload" in sample:
        return int(sample["id"]), zlib.crc32(sample["payload"])
    return int(sample["id"]), zlib.crc32(sample["text"].encode())


def keep(samples: list[Any]) -> list[Any]:
    """A collate that keeps a batch as the list of its samples."""
    return list(samples)


def loader(source: Any, batch_size: int = 8, **kw: Any) -> ff.DataLoader:
    kw.setdefault("transform", digest)
    kw.setdefault("collate", keep)
    return ff.DataLoader(source, batch_size, **kw)


def epoch(dl: ff.DataLoader) -> list[list[tuple[int, int]]]:
    return [list(b) for b in dl]


def head_and_state(dl: ff.DataLoader, k: int) -> tuple[list[list[tuple[int, int]]], Any]:
    """The first ``k`` batches of an epoch of ``dl``, and its state after them."""
    it = iter(dl)
    head = [list(next(it)) for _ in range(k)]
    state = dl.state_dict()
    del it
    return head, state


def flat(batches: Sequence[Sequence[tuple[int, int]]]) -> list[tuple[int, int]]:
    return [s for b in batches for s in b]


def get_paths(log: Sequence[tuple[str, str, str | None]]) -> Counter[str]:
    """Ranged GETs by object path."""
    return Counter(p for m, p, r in log if m == "GET" and r is not None)


def range_bytes(log: Sequence[tuple[str, str, str | None]], path: str) -> int:
    """Bytes asked for by the ranged GETs of ``path`` (``bytes=a-b``)."""
    total = 0
    for m, p, r in log:
        if m == "GET" and p == path and r is not None:
            a, b = r.removeprefix("bytes=").split("-")
            total += int(b) - int(a) + 1
    return total


def listings(log: Sequence[tuple[str, str, str | None]]) -> int:
    return sum(1 for m, p, _ in log if m == "GET" and "list-type" in p)


def uncounted(cls: Callable[..., Any], pattern: str, **kw: Any) -> Any:
    """A source whose shards are not held in memory, so that its first epoch fetches them all.

    Counting a source may keep the shards it fetched whole for its first epoch; a second
    source made with the same arguments within the listing's TTL is made from the node's
    index, without fetching anything.
    """
    cls(pattern, **kw)
    return cls(pattern, **kw)


def _run_in_child(out: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        out.put((True, fn(*args)))
    except BaseException:
        out.put((False, traceback.format_exc()))


def in_child(fn: Callable[..., Any], *args: Any, timeout: float = 40.0) -> Any:
    """``fn(*args)`` in a forked child; its result, or a failure when it hangs or raises.

    Reading one source over several epochs (or loaders) runs here: a read that never ends
    leaves a thread behind that no timeout can stop, and the test process would never exit.
    """
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=_run_in_child, args=(out, fn, args))
    p.start()
    try:
        ok, value = out.get(timeout=timeout)
    except queue.Empty:
        pytest.fail(f"{fn.__name__}{args!r} hung: no result within {timeout:g} s")
    finally:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join()
    if not ok:
        pytest.fail(f"{fn.__name__} failed in the child:\n{value}")
    return value


# -- servers ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data() -> dict[str, dict[str, bytes]]:
    return {kind: shard_files(kind) for kind in KINDS}


@pytest.fixture(scope="module")
def local_root(tmp_path_factory: pytest.TempPathFactory, data: dict[str, dict[str, bytes]]) -> Path:
    """The same shards as in the bucket, as local files (``root/{kind}/train-NNNN.ext``)."""
    root = tmp_path_factory.mktemp("local")
    for files in data.values():
        for name, blob in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(blob)
    return root


@pytest.fixture(scope="module")
def s3(data: dict[str, dict[str, bytes]]) -> Iterator[S3Server]:
    with S3Server() as server:
        server.create_bucket(BUCKET)
        for files in data.values():
            for name, blob in files.items():
                server.put(BUCKET, name, blob)
        yield server


@pytest.fixture(autouse=True)
def node(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Every test: its own node index directory, and (with ``s3``) the S3 environment."""
    cache = tmp_path / "ffcache"
    monkeypatch.setenv("FERROFEED_CACHE_DIR", str(cache))
    if "s3" in request.fixturenames:
        server: S3Server = request.getfixturevalue("s3")
        for k, v in server.env().items():
            monkeypatch.setenv(k, v)
    return cache


@pytest.fixture
def proxy(s3: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy(s3.endpoint) as p:
        yield p


def via(proxy: FaultProxy, **extra: str) -> dict[str, str]:
    """storage_options reaching the bucket through ``proxy``."""
    return {"endpoint": proxy.url, **extra}


def url(kind: str, pattern: str = "glob") -> str:
    """The bucket's shards of ``kind``, by a glob or by a brace range."""
    _, ext, sizes = KINDS[kind]
    if pattern == "glob":
        return f"s3://{BUCKET}/{kind}/train-*.{ext}"
    return f"s3://{BUCKET}/{kind}/train-{{0000..{len(sizes) - 1:04d}}}.{ext}"


def local(root: Path, kind: str) -> str:
    _, ext, _ = KINDS[kind]
    return str(root / kind / f"train-*.{ext}")


def total_samples(kind: str) -> int:
    return sum(KINDS[kind][2])


# -- 1. the same as local --------------------------------------------------------------------------


@pytest.mark.parametrize("pattern", ["glob", "brace"])
@pytest.mark.parametrize("kind", ["tar", "parquet", "jsonl"])
def test_remote_batches_equal_local_batches_on_every_rank(
    s3: S3Server, local_root: Path, kind: str, pattern: str
) -> None:
    cls = KINDS[kind][0]
    remote_src = cls(url(kind, pattern))
    local_src = cls(local(local_root, kind))
    assert [n for _, n in remote_src.shards] == [n for _, n in local_src.shards] == KINDS[kind][2]
    assert [u.rsplit("/", 1)[1] for u, _ in remote_src.shards] == [
        p.rsplit("/", 1)[1] for p, _ in local_src.shards
    ]
    # On its own, a source yields its samples in stored order.
    assert [digest(s) for s in remote_src] == [digest(s) for s in local_src]
    n = total_samples(kind)
    for world in (1, 3):
        for drop_last in (False, True):
            kw: dict[str, Any] = {
                "shuffle": True,
                "seed": 11,
                "shuffle_window": 24,
                "drop_last": drop_last,
                "world_size": world,
            }
            seen: list[tuple[int, int]] = []
            for rank in range(world):
                want = epoch(loader(cls(local(local_root, kind)), rank=rank, **kw))
                dl = loader(cls(url(kind, pattern)), rank=rank, **kw)
                got = epoch(dl)
                assert got == want, (world, rank, drop_last)
                assert dl.stats()["remote"]["fetched"] >= 1
                seen += flat(got)
            assert len(seen) == len(set(seen))
            if not drop_last:
                assert sorted(i for i, _ in seen) == list(range(n))


@pytest.mark.parametrize("kind", ["tar", "parquet", "jsonl"])
def test_resume_mid_epoch_gives_the_same_rest(s3: S3Server, local_root: Path, kind: str) -> None:
    cls = KINDS[kind][0]
    kw: dict[str, Any] = {"shuffle": True, "seed": 5, "shuffle_window": 16}
    full = epoch(loader(cls(local(local_root, kind)), **kw))
    head, state = head_and_state(loader(cls(url(kind)), **kw), 4)
    resumed = loader(cls(url(kind, "brace")), **kw)
    resumed.load_state_dict(state)
    assert head + epoch(resumed) == full
    # Every rank of a world of 3 too, from rank 0's state.
    for rank in range(3):
        wkw = dict(kw, world_size=3, rank=rank)
        whole = epoch(loader(cls(local(local_root, kind)), **wkw))
        head, state = head_and_state(loader(cls(url(kind)), **wkw), 2)
        again = loader(cls(url(kind)), **wkw)
        again.load_state_dict(state)
        assert head + epoch(again) == whole, rank


def test_compressed_shards_read_remotely_as_locally(s3: S3Server, tmp_path: Path) -> None:
    rng = random.Random(8)
    files = {
        "gz/a.tar.gz": gzip.compress(tar_bytes(range(0, 20), rng), mtime=0),
        "gz/b.tar.gz": gzip.compress(tar_bytes(range(20, 33), rng), mtime=0),
        "gz/c.jsonl.gz": gzip.compress(jsonl_bytes(range(0, 30), rng), mtime=0),
        "gz/d.jsonl.gz": gzip.compress(jsonl_bytes(range(30, 41), rng), mtime=0),
    }
    for name, blob in files.items():
        s3.put(BUCKET, name, blob)
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(blob)
    kw: dict[str, Any] = {"shuffle": True, "seed": 3, "shuffle_window": 8}
    for cls, ext in ((ff.TarShards, "tar.gz"), (ff.JsonLines, "jsonl.gz")):
        remote = cls(f"s3://{BUCKET}/gz/*.{ext}")
        here = cls(str(tmp_path / "gz" / f"*.{ext}"))
        assert [n for _, n in remote.shards] == [n for _, n in here.shards]
        assert epoch(loader(remote, 4, **kw)) == epoch(loader(here, 4, **kw))


def test_http_shards_by_brace_range_equal_local(local_root: Path) -> None:
    with HttpFileServer(local_root) as server:
        n = len(TAR_SIZES)
        src = ff.TarShards(f"{server.url}/tar/train-{{0000..{n - 1:04d}}}.tar")
        assert [c for _, c in src.shards] == TAR_SIZES
        kw: dict[str, Any] = {"shuffle": True, "seed": 2, "shuffle_window": 16}
        want = epoch(loader(ff.TarShards(local(local_root, "tar")), **kw))
        assert epoch(loader(src, **kw)) == want
        rows = ff.ParquetShards(f"{server.url}/parquet/train-{{0000..0003}}.parquet")
        assert epoch(loader(rows, **kw)) == epoch(
            loader(ff.ParquetShards(local(local_root, "parquet")), **kw)
        )
        with pytest.raises(ValueError, match=r"cannot be listed") as e:
            ff.TarShards(f"{server.url}/tar/train-*.tar")
        assert f"{server.url}/tar/train-*.tar" in str(e.value)


def test_a_server_without_ranges_is_read_by_whole_gets(local_root: Path) -> None:
    """``python -m http.server`` answers a ranged GET with the whole file (200): every
    format reads as it does locally (Parquet's footers too), by GETs of the whole body."""
    kw: dict[str, Any] = {"shuffle": True, "seed": 5, "shuffle_window": 16}
    with python_http_server(local_root) as server:
        for kind in KINDS:
            cls, ext, sizes = KINDS[kind]
            src = cls(f"{server}/{kind}/train-{{0000..{len(sizes) - 1:04d}}}.{ext}")
            assert [c for _, c in src.shards] == sizes
            assert epoch(loader(src, **kw)) == epoch(loader(cls(local(local_root, kind)), **kw))


@pytest.mark.parametrize("etag", [True, False])
def test_without_ranges_a_range_is_asked_once_and_broken_bodies_lose_nothing(
    local_root: Path, etag: bool
) -> None:
    with (
        HttpFileServer(local_root, etag=etag, ranges=False) as server,
        FaultProxy(server.url) as proxy,
    ):
        kw: dict[str, Any] = {"shuffle": True, "seed": 9, "shuffle_window": 32}
        clean = epoch(loader(ff.TarShards(local(local_root, "tar")), **kw))
        n = len(TAR_SIZES)
        shards = f"{proxy.url}/tar/train-{{0000..{n - 1:04d}}}.tar"
        src = uncounted(ff.TarShards, shards, storage_options=RETRIES)
        gets = [r for m, _, r in proxy.log if m == "GET"]
        # Counting fetched every shard whole; a range was asked for only by the requests
        # that went out before the first answer came (at most one a shard).
        assert len(gets) >= n
        assert 1 <= sum(r is not None for r in gets) <= n, gets
        since = len(proxy.log)
        dl = loader(src, **kw)
        proxy.add("truncate", fraction=0.4, times=2, match=whole_get)
        proxy.add("drop", times=1, match=whole_get)
        assert epoch(dl) == clean
        assert proxy.pending == 0
        # The epoch asked for no range of its own; with ETags, object_store resumes a body
        # that broke off by a ranged GET from where it stopped (refused here, so read whole
        # again): at most one for each of the 3 faults, none from byte 0.
        ranged = [r for _, _, r in proxy.log[since:] if r is not None]
        assert len(ranged) <= (3 if etag else 0), ranged
        assert not any(r.startswith("bytes=0-") for r in ranged), ranged


def test_endpoint_and_credentials_from_storage_options_alone(
    s3: S3Server, local_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in s3.env():
        monkeypatch.delenv(key)
    opts = {
        "endpoint": s3.endpoint,
        "access_key_id": "testing",
        "secret_access_key": "testing",
        "region": "us-east-1",
    }
    src = ff.TarShards(url("tar", "brace"), storage_options=opts)
    assert [n for _, n in src.shards] == TAR_SIZES
    assert [digest(s) for s in src] == [digest(s) for s in ff.TarShards(local(local_root, "tar"))]


# -- 2. listing and the index ----------------------------------------------------------------------


def test_a_glob_lists_once_and_a_second_source_asks_nothing(
    s3: S3Server, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    opts = via(proxy)
    first = ff.TarShards(url("tar"), storage_options=opts)
    log = proxy.log
    assert listings(log) == 1, log
    # Counting a tar reads it once: one ranged GET per shard (each under one part).
    assert get_paths(log) == {f"/{BUCKET}/tar/train-{k:04d}.tar": 1 for k in range(6)}
    assert len(log) == 1 + 6, log
    before = proxy.requests
    second = ff.TarShards(url("tar"), storage_options=opts)
    assert proxy.requests == before
    assert second.shards == first.shards
    # Past the listing's TTL the directory is listed again, but unchanged objects are not
    # counted again.
    monkeypatch.setattr(_remote, "LIST_TTL", 0.0)
    third = ff.TarShards(url("tar"), storage_options=opts)
    new = proxy.log[before:]
    assert listings(new) == 1, new
    assert len(new) == 1, new
    assert third.shards == first.shards


def test_past_the_ttl_only_changed_objects_are_counted_again(
    s3: S3Server, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(12)
    for k, n in enumerate([10, 12, 9]):
        s3.put(BUCKET, f"relist/p-{k}.tar", tar_bytes(range(100 * k, 100 * k + n), rng))
    pattern = f"s3://{BUCKET}/relist/p-*.tar"
    assert [n for _, n in ff.TarShards(pattern, storage_options=via(proxy)).shards] == [10, 12, 9]
    s3.put(BUCKET, "relist/p-1.tar", tar_bytes(range(100, 107), rng))  # replaced
    s3.put(BUCKET, "relist/p-3.tar", tar_bytes(range(300, 304), rng))  # added
    monkeypatch.setattr(_remote, "LIST_TTL", 0.0)
    before = proxy.requests
    src = ff.TarShards(pattern, storage_options=via(proxy))
    assert [n for _, n in src.shards] == [10, 7, 9, 4]
    new = proxy.log[before:]
    assert listings(new) == 1, new
    assert get_paths(new) == {f"/{BUCKET}/relist/p-1.tar": 1, f"/{BUCKET}/relist/p-3.tar": 1}
    ids = sorted(i for i, _ in flat(epoch(loader(src, 4))))
    assert ids == [*range(10), *range(100, 107), *range(200, 209), *range(300, 304)]


def _make_source(
    barrier: Any, pattern: str, options: dict[str, str], out: Any
) -> None:  # in a spawned process
    barrier.wait(timeout=60)
    src = ff.TarShards(pattern, storage_options=options)
    out.put((os.getpid(), src.shards))


def test_processes_of_a_node_list_and_count_once(s3: S3Server, proxy: FaultProxy) -> None:
    results, exitcodes = run_spawned(4, _make_source, url("tar"), via(proxy), timeout=90)
    assert exitcodes == [0] * 4
    shards = [s for _, s in results]
    assert all(s == shards[0] for s in shards)
    assert [n for _, n in shards[0]] == TAR_SIZES
    log = proxy.log
    assert listings(log) == 1, log
    assert get_paths(log) == {f"/{BUCKET}/tar/train-{k:04d}.tar": 1 for k in range(6)}


def _shards_of(pattern: str) -> list[tuple[str, int]]:
    return ff.TarShards(pattern).shards


def test_the_node_index_tells_endpoints_apart(
    s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two S3-compatible servers holding the same bucket and keys, with other contents: the
    # endpoint comes from the environment (AWS_ENDPOINT_URL), as a job on another cluster
    # (or a dev and a prod MinIO) would have it. The node's index must not give one
    # server's listing and counts for the other's.
    pattern = f"s3://{BUCKET}/twin/p-*.tar"
    rng = random.Random(5)
    s3.put(BUCKET, "twin/p-0.tar", tar_bytes(range(0, 10), rng))
    with S3Server() as other:
        other.create_bucket(BUCKET)
        other.put(BUCKET, "twin/p-0.tar", tar_bytes(range(0, 25), rng))
        other.put(BUCKET, "twin/p-1.tar", tar_bytes(range(25, 30), rng))
        assert [n for _, n in ff.TarShards(pattern).shards] == [10]
        for k, v in other.env().items():
            monkeypatch.setenv(k, v)
        # In a new process (its clients are made from the environment it has).
        got = in_child(_shards_of, pattern)
    assert [n for _, n in got] == [25, 5]


def test_counting_parquet_fetches_only_the_footers(s3: S3Server, proxy: FaultProxy) -> None:
    # Files well over the 64 KiB tail read to find a footer.
    rng = random.Random(3)
    sizes = []
    for k in range(3):
        blob = parquet_bytes(range(k * 100, k * 100 + 100), rng, payload=8000)
        sizes.append(len(blob))
        s3.put(BUCKET, f"big/part-{k}.parquet", blob)
    assert min(sizes) > 300_000
    rows = ff.ParquetShards(f"s3://{BUCKET}/big/part-*.parquet", storage_options=via(proxy))
    assert [n for _, n in rows.shards] == [100, 100, 100]
    assert proxy.bytes < sum(sizes) / 3, (proxy.bytes, sizes)
    # Reading them fetches them (and gives every row).
    assert sorted(i for i, _ in flat(epoch(loader(rows)))) == list(range(300))
    assert proxy.bytes >= sum(sizes)


# -- 3. faults lose nothing ------------------------------------------------------------------------


FAULTS: dict[str, dict[str, Any]] = {
    "500": {"kind": "status", "status": 500, "times": 3},
    "503-slowdown": {"kind": "status", "status": 503, "times": 3},
    "drop": {"kind": "drop", "times": 3},
    "truncate": {"kind": "truncate", "fraction": 0.4, "times": 3},
    "truncate-early": {"kind": "truncate", "nbytes": 100, "times": 2},
    "delay": {"kind": "delay", "seconds": 1.5, "times": 2},
    "slow": {"kind": "slow", "rate": 128 * 1024, "times": 2},
}
FAILING = {"status", "drop", "truncate"}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_faults_on_reads_lose_no_sample(
    s3: S3Server, proxy: FaultProxy, local_root: Path, fault: str
) -> None:
    spec = dict(FAULTS[fault])
    kind = spec.pop("kind")
    kw: dict[str, Any] = {"shuffle": True, "seed": 7, "shuffle_window": 32}
    clean = epoch(loader(ff.TarShards(local(local_root, "tar")), **kw))
    src = uncounted(ff.TarShards, url("tar"), storage_options=via(proxy, **RETRIES))
    dl = loader(src, **kw)
    proxy.add(kind, match=ranged_get, **spec)
    got = epoch(dl)
    assert got == clean
    assert proxy.pending == 0
    injected = proxy.injected.get(kind, 0)
    assert injected == spec["times"]
    remote = dl.stats()["remote"]
    if kind in FAILING:
        assert remote["retries"] >= injected, remote
    # (Past the epoch's shards, the next epoch's first window may have been read ahead.)
    assert remote["fetched"] >= len(TAR_SIZES)


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_faults_lose_nothing_for_parquet_and_json_lines(
    s3: S3Server, proxy: FaultProxy, local_root: Path, kind: str
) -> None:
    cls = KINDS[kind][0]
    kw: dict[str, Any] = {"shuffle": True, "seed": 1, "shuffle_window": 16}
    clean = epoch(loader(cls(local(local_root, kind)), **kw))
    # Faults while counting too (the Parquet footers, the JSON lines shards).
    proxy.add("status", status=503, times=2, match=ranged_get)
    proxy.add("drop", times=1, match=ranged_get)
    counted = cls(url(kind), storage_options=via(proxy, **RETRIES))
    assert [n for _, n in counted.shards] == KINDS[kind][2]
    assert proxy.pending == 0
    src = cls(url(kind), storage_options=via(proxy, **RETRIES))  # from the node's index
    dl = loader(src, **kw)
    proxy.add("truncate", fraction=0.5, times=2, match=ranged_get)
    proxy.add("status", status=500, times=2, match=ranged_get)
    assert epoch(dl) == clean
    assert proxy.pending == 0
    assert dl.stats()["remote"]["retries"] >= 4


def test_faults_while_listing_and_counting(
    s3: S3Server, proxy: FaultProxy, local_root: Path
) -> None:
    def is_list(method: str, path: str, headers: Message) -> bool:
        return "list-type" in path

    proxy.add("status", status=503, times=2, match=is_list)
    proxy.add("truncate", fraction=0.5, times=1, match=is_list)
    proxy.add("drop", times=2, match=ranged_get)
    src = ff.TarShards(url("tar"), storage_options=via(proxy, **RETRIES))
    assert proxy.pending == 0
    assert src.shards == ff.TarShards(url("tar")).shards
    kw: dict[str, Any] = {"shuffle": True, "seed": 4, "shuffle_window": 8}
    assert epoch(loader(src, **kw)) == epoch(loader(ff.TarShards(local(local_root, "tar")), **kw))


@pytest.mark.parametrize("etag", [True, False])
def test_http_truncated_bodies_and_drops_lose_nothing(local_root: Path, etag: bool) -> None:
    with HttpFileServer(local_root, etag=etag) as server, FaultProxy(server.url) as proxy:
        kw: dict[str, Any] = {"shuffle": True, "seed": 9, "shuffle_window": 32}
        clean = epoch(loader(ff.TarShards(local(local_root, "tar")), **kw))
        src = uncounted(
            ff.TarShards, f"{proxy.url}/tar/train-{{0000..0005}}.tar", storage_options=RETRIES
        )
        dl = loader(src, **kw)
        proxy.add("truncate", fraction=0.3, times=3, match=ranged_get)
        proxy.add("status", status=503, times=2, match=ranged_get)
        proxy.add("drop", times=1, match=ranged_get)
        assert epoch(dl) == clean
        assert proxy.pending == 0
        assert dl.stats()["remote"]["retries"] >= 6, dl.stats()["remote"]


def test_retries_spent_fail_naming_the_url(s3: S3Server, proxy: FaultProxy) -> None:
    opts = via(proxy, max_retries="2", retry_timeout="20")
    src = uncounted(ff.TarShards, url("tar"), storage_options=opts)
    proxy.add("status", status=500, times=10_000, match=ranged_get)
    t0 = time.monotonic()
    with pytest.raises(ff.ShardReadError) as e:
        epoch(loader(src))
    assert time.monotonic() - t0 < 60
    assert not isinstance(e.value, ff.ShardNotFoundError | ff.ShardPermissionError)
    assert e.value.shard is not None
    assert e.value.shard.startswith(f"s3://{BUCKET}/tar/train-")
    assert e.value.shard in str(e.value)
    assert proxy.injected["status"] >= 3  # the first try and 2 retries


PART = 8 << 20  # the size of one ranged GET of a shard


@pytest.fixture(scope="module")
def big_tar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tar shard of about 17 MiB: three parts."""
    rng = random.Random(17)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for i in range(34):
            for ext, blob in (("cls", str(i).encode()), ("bin", rng.randbytes(512 * 1024 - 7))):
                info = tarfile.TarInfo(f"s{i:06d}.{ext}")
                info.size = len(blob)
                tar.addfile(info, io.BytesIO(blob))
    path = tmp_path_factory.mktemp("big") / "big.tar"
    path.write_bytes(buf.getvalue())
    assert 2 * PART < path.stat().st_size < 3 * PART
    return path


@pytest.mark.parametrize("server", ["s3", "http-without-etag"])
def test_broken_bodies_of_a_large_shard_resume_from_the_byte_they_stopped(
    s3: S3Server, big_tar: Path, server: str
) -> None:
    size = big_tar.stat().st_size
    want = [digest(s) for s in ff.TarShards(big_tar)]
    with contextlib.ExitStack() as stack:
        if server == "s3":
            s3.put_file(BUCKET, "big/big.tar", big_tar)
            proxy = stack.enter_context(FaultProxy(s3.endpoint))
            shard = f"s3://{BUCKET}/big/big.tar"
            opts = via(proxy, **RETRIES)
        else:
            files = stack.enter_context(HttpFileServer(big_tar.parent, etag=False))
            proxy = stack.enter_context(FaultProxy(files.url))
            shard = f"{proxy.url}/big.tar"
            opts = dict(RETRIES)
        proxy.add("truncate", fraction=0.5, times=2, match=ranged_get)
        proxy.add("truncate", nbytes=1, times=1, match=ranged_get)
        ff.TarShards(shard, storage_options=opts)  # counting reads it whole
        assert proxy.pending == 0
        src = ff.TarShards(shard, storage_options=opts)  # from the node's index
        proxy.add("truncate", fraction=0.7, times=2, match=ranged_get)
        proxy.add("drop", times=1, match=ranged_get)
        assert [digest(s) for s in src] == want
        assert proxy.pending == 0
        starts = [int(r.removeprefix("bytes=").split("-")[0]) for _, _, r in proxy.log if r]
        # Resumed where they broke off, not from the start of their part: ...
        assert any(a % PART != 0 for a in starts), starts
        # ... so the bytes sent are about the shard twice (counted, then read), not a part
        # more for every break.
        assert proxy.bytes < 2 * size + PART // 2, (proxy.bytes, size)


# -- 4. fails fast, naming the URL -----------------------------------------------------------------


def _raises_fast(error: type[BaseException], call: Callable[[], Any], name: str) -> BaseException:
    t0 = time.monotonic()
    with pytest.raises(error) as e:
        call()
    took = time.monotonic() - t0
    assert took < FAST_S, f"{error.__name__} after {took:.1f} s"
    assert name in str(e.value), str(e.value)
    return e.value


def no_request_twice(proxy: FaultProxy, since: int = 0) -> None:
    """Not retried: no request of the proxy's log (from ``since`` on) was made twice."""
    log = proxy.log[since:]
    repeated = [k for k, n in Counter(log).items() if n > 1]
    assert repeated == [], log


def test_a_missing_object_fails_fast_naming_the_url(s3: S3Server, proxy: FaultProxy) -> None:
    missing = f"s3://{BUCKET}/tar/nope.tar"
    e = _raises_fast(
        ff.ShardNotFoundError, lambda: ff.TarShards(missing, storage_options=via(proxy)), missing
    )
    assert isinstance(e, FileNotFoundError)
    assert isinstance(e, ff.ShardNotFoundError)
    assert e.shard == missing
    no_request_twice(proxy)
    # One missing among present ones (a brace range one too long). Each source asks for its
    # folder's sample index once (tests/test_shard_index.py), so only its own requests count.
    since = len(proxy.log)
    one_more = f"s3://{BUCKET}/tar/train-{{0000..0006}}.tar"
    e = _raises_fast(
        ff.ShardNotFoundError,
        lambda: ff.TarShards(one_more, storage_options=via(proxy)),
        "train-0006.tar",
    )
    assert isinstance(e, ff.ShardNotFoundError)
    assert e.shard == f"s3://{BUCKET}/tar/train-0006.tar"
    no_request_twice(proxy, since)
    # A glob that matches nothing in a bucket that exists.
    with pytest.raises(FileNotFoundError, match=r"no shard matches .*nothing-\*\.tar"):
        ff.TarShards(f"s3://{BUCKET}/tar/nothing-*.tar")


@pytest.mark.parametrize(
    "pattern", ["s3://no-such-bucket-26/a.tar", "s3://no-such-bucket-26/dir/*.tar"]
)
def test_a_missing_bucket_fails_fast_naming_it(
    s3: S3Server, proxy: FaultProxy, pattern: str
) -> None:
    e = _raises_fast(
        ff.ShardNotFoundError,
        lambda: ff.TarShards(pattern, storage_options=via(proxy)),
        "s3://no-such-bucket-26/",
    )
    assert isinstance(e, FileNotFoundError)
    no_request_twice(proxy)


def test_a_missing_http_file_fails_fast(local_root: Path) -> None:
    with HttpFileServer(local_root) as server:
        missing = f"{server.url}/tar/train-0099.tar"
        e = _raises_fast(ff.ShardNotFoundError, lambda: ff.TarShards(missing), missing)
        assert isinstance(e, FileNotFoundError)
        # The folder's sample index is asked for first (tests/test_shard_index.py).
        assert server.log == [
            ("HEAD", "/tar/_ferrofeed-index.json", None),
            ("HEAD", "/tar/train-0099.tar", None),
        ]


@pytest.mark.parametrize("pattern", ["glob", "brace"])
def test_a_403_while_listing_fails_fast_naming_the_url(
    s3: S3Server, proxy: FaultProxy, pattern: str
) -> None:
    proxy.add("status", status=403, times=1000)
    e = _raises_fast(
        ff.ShardPermissionError,
        lambda: ff.TarShards(url("tar", pattern), storage_options=via(proxy)),
        f"s3://{BUCKET}/tar",
    )
    assert isinstance(e, PermissionError)
    no_request_twice(proxy)


def test_a_403_while_reading_fails_fast_naming_the_url(s3: S3Server, proxy: FaultProxy) -> None:
    src = uncounted(ff.TarShards, url("tar"), storage_options=via(proxy))
    proxy.add("status", status=403, times=1000, match=ranged_get)
    dl = loader(src)
    e = _raises_fast(ff.ShardPermissionError, lambda: epoch(dl), f"s3://{BUCKET}/tar/")
    assert isinstance(e, ff.ShardPermissionError)
    assert isinstance(e, PermissionError)
    assert e.shard is not None
    assert e.shard.startswith(f"s3://{BUCKET}/tar/train-")
    assert dl.stats()["remote"]["retries"] == 0  # a 403 is not retried


def _put_set(s3: S3Server, prefix: str, sizes: Sequence[int]) -> list[bytes]:
    rng = random.Random(prefix)
    blobs, start = [], 0
    for k, n in enumerate(sizes):
        blobs.append(tar_bytes(range(start, start + n), rng))
        s3.put(BUCKET, f"{prefix}/p-{k}.tar", blobs[-1])
        start += n
    return blobs


def test_an_object_deleted_after_the_source_was_made(s3: S3Server) -> None:
    sizes = [10, 12, 9, 11]
    _put_set(s3, "deleted", sizes)
    pattern = f"s3://{BUCKET}/deleted/p-*.tar"
    src = uncounted(ff.TarShards, pattern)
    gone = f"s3://{BUCKET}/deleted/p-2.tar"
    s3.delete(BUCKET, "deleted/p-2.tar")
    e = _raises_fast(ff.ShardNotFoundError, lambda: epoch(loader(src, 4)), gone)
    assert isinstance(e, ff.ShardNotFoundError)
    assert e.shard == gone
    # Skipped: that shard's samples are lost and accounted for, the rest are read once. (A
    # source made again within the listing's TTL is the same source: the node's index.)
    again = ff.TarShards(pattern)
    assert again.shards == src.shards
    dl = loader(again, 4, on_error="skip", max_failures=None)
    seen = sorted(i for i, _ in flat(epoch(dl)))
    lost = set(range(22, 31))
    assert seen == [i for i in range(sum(sizes)) if i not in lost]
    skipped = dl.stats()["skipped"]
    assert sorted(i for i, _ in skipped) == sorted(lost)
    assert all(gone in str(err) for _, err in skipped), skipped


@pytest.mark.parametrize("same_size", [True, False])
def test_an_object_replaced_after_the_source_was_made(s3: S3Server, same_size: bool) -> None:
    blobs = _put_set(s3, f"replaced-{same_size}", [10, 12, 9])
    pattern = f"s3://{BUCKET}/replaced-{same_size}/p-{{0..2}}.tar"
    src = uncounted(ff.TarShards, pattern)
    target = f"s3://{BUCKET}/replaced-{same_size}/p-1.tar"
    if same_size:
        other = bytearray(blobs[1])
        other[-1024 - 1] ^= 0xFF  # a byte of the last member's data: another ETag
        new = bytes(other)
        assert len(new) == len(blobs[1])
    else:
        new = tar_bytes(range(10, 25), random.Random(0))
    s3.put(BUCKET, f"replaced-{same_size}/p-1.tar", new)
    e = _raises_fast(ff.ShardCorruptError, lambda: epoch(loader(src, 4)), target)
    assert isinstance(e, ff.ShardCorruptError)
    assert e.shard == target


def test_bad_arguments_are_value_errors_naming_what(s3: S3Server, local_root: Path) -> None:
    with pytest.raises(ValueError, match="bogus_option"):
        ff.TarShards(url("tar"), storage_options={"bogus_option": "1"})
    with pytest.raises(ValueError, match="max_retries"):
        ff.TarShards(url("tar"), storage_options={"max_retries": "many"})
    paths = local(local_root, "tar")
    for kw in (
        {"storage_options": {"region": "us-east-1"}},
        {"cache_dir": str(local_root / "cache")},
        {"prefetch_bytes": 1 << 20},
        {"cache_limit": 1 << 20},
    ):
        with pytest.raises(ValueError, match="local paths"):
            ff.TarShards(paths, **kw)
    with pytest.raises(ValueError, match="all URLs or all local paths"):
        ff.TarShards([str(local_root / "tar" / "train-0000.tar"), f"s3://{BUCKET}/tar/x.tar"])
    with pytest.raises(ValueError, match="cache_limit= needs cache_dir="):
        ff.TarShards(url("tar"), cache_limit=1 << 20)
    with pytest.raises(ValueError, match="prefetch_bytes"):
        ff.TarShards(url("tar"), prefetch_bytes=-1)
    with pytest.raises(ValueError, match=r"ftp://"):
        ff.TarShards("ftp://host/a.tar")


# -- 5. the cache ----------------------------------------------------------------------------------


def _shard_files(cache_dir: Path) -> dict[str, int]:
    """Sizes of the shard files in the cache, once no file came or went for 0.3 s.

    (A loader reads the next epoch's first window ahead at the end of an epoch: a fetch into
    the cache, and an eviction, may still be going on when the epoch ends.)
    """
    d = cache_dir / "shards"
    last: dict[str, int] | None = None
    deadline = time.monotonic() + 20
    while True:
        now: dict[str, int] = {}
        for p in d.iterdir():
            if not p.name.startswith("."):
                with contextlib.suppress(FileNotFoundError):
                    now[p.name] = p.stat().st_size
        if now == last or time.monotonic() > deadline:
            return now
        last = now
        time.sleep(0.3)


def _cached(cache_dir: Path) -> list[Path]:
    return [p for p in (cache_dir / "shards").iterdir() if not p.name.startswith(".")]


def _temporaries(cache_dir: Path) -> list[str]:
    return [p.name for p in cache_dir.rglob(".tmp-*")]


def _epochs(
    pattern: str, source_kw: dict[str, Any], loader_kw: list[dict[str, Any]], epochs: int
) -> list[tuple[list[list[tuple[int, int]]], dict[str, Any]]]:
    """One source read by each loader of ``loader_kw`` in turn, ``epochs`` epochs each:
    every epoch's batches, with the loader's remote counters after it."""
    src = uncounted(ff.TarShards, pattern, **source_kw)
    out = []
    for kw in loader_kw:
        dl = loader(src, **kw)
        for _ in range(epochs):
            batches = epoch(dl)
            out.append((batches, dl.stats()["remote"]))
    return out


def test_a_second_epoch_fetches_nothing_the_cache_holds(
    s3: S3Server, proxy: FaultProxy, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    kw = {"shuffle": True, "seed": 3, "shuffle_window": 32}
    source_kw = {"storage_options": via(proxy), "cache_dir": str(cache)}
    (first, after_first), (second, after_second) = in_child(_epochs, url("tar"), source_kw, [kw], 2)
    assert after_second["bytes"] == after_first["bytes"]
    assert after_second["fetched"] == after_first["fetched"]
    assert after_second["cache_hits"] > after_first["cache_hits"]
    assert sorted(map(tuple, flat(first))) == sorted(map(tuple, flat(second)))
    assert first != second
    # One download of each shard (when counted), never again.
    assert get_paths(proxy.log) == {f"/{BUCKET}/tar/train-{k:04d}.tar": 1 for k in range(6)}
    # The cache holds each shard whole, as stored.
    held = sorted(zlib.crc32(p.read_bytes()) for p in _cached(cache))
    assert held == sorted(zlib.crc32(b) for b in shard_files("tar").values())
    assert _temporaries(cache) == []


def test_a_failed_fetch_leaves_nothing_in_the_cache_or_the_index(
    s3: S3Server, proxy: FaultProxy, local_root: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    bad = f"/{BUCKET}/tar/train-0003.tar"

    def shard_3(method: str, path: str, headers: Message) -> bool:
        return method == "GET" and path == bad

    # Broken bodies until the retries are spent, while counting (which fetches into the cache).
    proxy.add("truncate", fraction=0.5, times=10_000, match=shard_3)
    opts = via(proxy, max_retries="1", retry_timeout="10")
    with pytest.raises(ff.ShardReadError, match=r"train-0003\.tar") as e:
        ff.TarShards(url("tar"), storage_options=opts, cache_dir=cache)
    assert e.value.shard == f"s3://{BUCKET}/tar/train-0003.tar"
    assert _temporaries(cache) == []
    sizes = {len(b) for b in shard_files("tar").values()}
    assert all(p.stat().st_size in sizes for p in _cached(cache))
    assert len(_cached(cache)) < len(TAR_SIZES)
    # Once the store answers again, the same source is made: nothing half-done was kept.
    proxy.clear()
    src = ff.TarShards(url("tar"), storage_options=opts, cache_dir=cache)
    assert [n for _, n in src.shards] == TAR_SIZES
    kw: dict[str, Any] = {"shuffle": True, "seed": 2, "shuffle_window": 32}
    assert epoch(loader(src, **kw)) == epoch(loader(ff.TarShards(local(local_root, "tar")), **kw))
    assert len(_cached(cache)) == len(TAR_SIZES)


def test_without_a_cache_a_second_epoch_fetches_again(s3: S3Server) -> None:
    kw = {"shuffle": True, "seed": 3, "shuffle_window": 32}
    (_, after_first), (_, after_second) = in_child(_epochs, url("tar"), {}, [kw], 2)
    # The shards a reader still holds when the next epoch's order is queued (during the
    # first epoch's last window: the last ones read, those fetched ahead) need not be
    # fetched again, and some of the second epoch's fetches happen before the first one
    # ends; the others are fetched again.
    assert after_first["fetched"] >= len(TAR_SIZES)
    assert after_second["fetched"] > len(TAR_SIZES)
    assert after_second["bytes"] > after_first["bytes"]
    assert after_second["cache_hits"] == 0


@pytest.mark.parametrize("then", ["next-epoch", "next-loader"])
def test_reading_a_source_again_while_its_read_ahead_is_on_its_way(
    s3: S3Server, proxy: FaultProxy, then: str
) -> None:
    # The end of an epoch reads the next epoch's first window ahead, on the ending epoch's
    # reader thread; the next epoch (or the next loader over the same source) starts its own
    # reads meanwhile. With latency, the read-ahead still waits for its shards then.
    proxy.latency = 0.15
    seeds = [1, 2, 3]
    if then == "next-epoch":
        loaders, epochs = [{"shuffle": True, "seed": 1, "shuffle_window": 32}], 3
    else:
        loaders, epochs = [{"shuffle": True, "seed": s, "shuffle_window": 32} for s in seeds], 1
    got = in_child(_epochs, url("tar"), {"storage_options": via(proxy)}, loaders, epochs)
    assert len(got) == 3
    for batches, _ in got:
        assert sorted(i for i, _ in flat(batches)) == list(range(sum(TAR_SIZES)))


def _read_epoch(
    barrier: Any, pattern: str, options: dict[str, str], cache_dir: str, out: Any
) -> None:  # in a spawned process
    barrier.wait(timeout=60)
    src = ff.TarShards(pattern, storage_options=options, cache_dir=cache_dir)
    dl = loader(src, shuffle=True, seed=os.getpid(), shuffle_window=32)
    out.put((os.getpid(), sorted(flat(epoch(dl))), dl.stats()["remote"]))


def test_processes_sharing_a_cache_download_each_shard_once(
    s3: S3Server, proxy: FaultProxy, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    results, exitcodes = run_spawned(3, _read_epoch, url("tar"), via(proxy), str(cache), timeout=90)
    assert exitcodes == [0] * 3
    everything = sorted((i, crc) for i, crc in flat(epoch(loader(ff.TarShards(url("tar"))))))
    assert all(samples == everything for _, samples, _ in results)
    log = proxy.log
    blobs = shard_files("tar")
    for name, blob in blobs.items():
        assert range_bytes(log, f"/{BUCKET}/{name}") == len(blob), name
    assert sum(r["fetched"] for _, _, r in results) == 0  # counting fetched them, once
    assert _temporaries(cache) == []
    assert sorted(_shard_files(cache).values()) == sorted(len(b) for b in blobs.values())


def test_a_cache_limit_keeps_the_directory_under_it(s3: S3Server, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    sizes = [len(b) for b in shard_files("tar").values()]
    limit = sum(sizes) // 3
    source_kw = {"cache_dir": str(cache), "cache_limit": limit}
    loaders = [{"shuffle": True, "seed": seed, "shuffle_window": 32} for seed in (1, 2)]
    for batches, _ in in_child(_epochs, url("tar"), source_kw, loaders, 1):
        assert sorted(i for i, _ in flat(batches)) == list(range(sum(TAR_SIZES)))
    held = sum(_shard_files(cache).values())
    assert held <= limit + max(sizes), (held, limit)
    assert _temporaries(cache) == []


# -- 6. processes ----------------------------------------------------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_worker_processes_read_every_sample_once(
    s3: S3Server, local_root: Path, method: str
) -> None:
    kw: dict[str, Any] = {"shuffle": True, "seed": 8, "shuffle_window": 32}
    want = epoch(loader(ff.TarShards(local(local_root, "tar")), **kw))
    dl = loader(ff.TarShards(url("tar")), num_workers=2, worker_start_method=method, **kw)
    assert epoch(dl) == want


def _child_reads(pattern: str, inherited: ff.TarShards | None) -> list[tuple[int, int]]:
    """In a forked child: a new source (its own listing and fetches) and the inherited one."""
    fresh = ff.TarShards(pattern)
    got = [digest(s) for s in fresh]
    if inherited is not None:
        assert [digest(s) for s in inherited] == got
    return got


def _fork_child(run: Callable[[], Any], alarm: int = 60) -> tuple[int, int]:
    """Fork a child that calls ``run`` and writes its JSON (or its error) to a pipe.

    Returns the child's pid and the read end of the pipe, for `_wait_child`. The child
    exits 0 once it has written its result, 1 on an error; SIGALRM ends it after ``alarm``
    seconds.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            os.close(r)
            signal.alarm(alarm)
            os.write(w, json.dumps(run()).encode())
            code = 0
        except BaseException as e:
            os.write(w, repr(e).encode())
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


def _fork_child_reads(pattern: str, inherited: ff.TarShards | None) -> tuple[int, int]:
    """Fork a child that runs `_child_reads` (see `_fork_child`)."""
    return _fork_child(lambda: _child_reads(pattern, inherited))


def _wait_child(pid: int, fd: int, timeout: float) -> bytes:
    """The child's output (until it closes ``fd``) and its exit status 0, within ``timeout``."""
    deadline = time.monotonic() + timeout
    chunks = []
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"the forked child {pid} hung (no exit in {timeout} s)")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"the forked child {pid} hung after closing its output")
            time.sleep(0.02)
        assert os.waitstatus_to_exitcode(status) == 0, b"".join(chunks).decode(errors="replace")
    except BaseException:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        raise
    finally:
        os.close(fd)
    return b"".join(chunks)


@pytest.mark.timeout(120)
def test_a_forked_child_reads_remote_shards_itself(s3: S3Server) -> None:
    # The parent has used the runtime (listing, counting, a whole epoch) before forking.
    parent = ff.TarShards(url("tar"))
    want = [digest(s) for s in parent]
    pattern = url("tar", "brace")  # another source: the child lists and fetches itself
    pid, r = _fork_child_reads(pattern, parent)
    out = _wait_child(pid, r, 90)
    assert [tuple(x) for x in json.loads(out)] == want


@pytest.mark.timeout(120)
def test_a_fork_while_fetches_are_in_flight(s3: S3Server, proxy: FaultProxy) -> None:
    want = [digest(s) for s in ff.TarShards(url("tar"))]
    src = ff.TarShards(url("tar"), storage_options=via(proxy))
    proxy.latency = 0.3  # the parent's fetches of the next shards are on their way
    it = iter(src)
    head = [digest(next(it))]
    # The child: the inherited source, read from its start, and a new one.
    pid, r = _fork_child_reads(url("tar", "brace"), src)
    # The parent goes on with its own iteration meanwhile.
    rest = [digest(s) for s in it]
    out = _wait_child(pid, r, 90)
    assert head + rest == want
    assert [tuple(x) for x in json.loads(out)] == want


@pytest.mark.timeout(180)
def test_a_forked_child_reads_its_epoch_itself_while_the_parents_read_ahead_waits(
    s3: S3Server, proxy: FaultProxy
) -> None:
    # Every fetch through the proxy takes a second, and no shard is kept ahead: when the
    # parent's epoch ends, the next epoch's first window is still being read, its shard on
    # its way. A child forked then reads that epoch itself (the parent's read runs on the
    # parent's runtime, whose threads the child does not have: waiting for it would hang).
    want = sorted(digest(s) for s in ff.TarShards(url("tar")))
    src = ff.TarShards(url("tar"), storage_options=via(proxy), prefetch_bytes=1)
    dl = loader(src, shuffle=True, seed=6, shuffle_window=64)
    proxy.latency = 1.0
    assert sorted(flat(epoch(dl))) == want
    assert dl._source._feed.ahead is not None  # read ahead, its fetch on its way
    pid, r = _fork_child(lambda: sorted(flat(epoch(dl))), alarm=90)
    # The parent's own next epoch takes the window it read ahead.
    assert sorted(flat(epoch(dl))) == want
    out = _wait_child(pid, r, 150)
    assert [tuple(x) for x in json.loads(out)] == want


def _mp_child(pattern: str, out: Any) -> None:  # in a multiprocessing fork child
    out.put(_child_reads(pattern, None))


@pytest.mark.timeout(120)
def test_a_multiprocessing_fork_child_reads_remote_shards(s3: S3Server) -> None:
    want = [digest(s) for s in ff.TarShards(url("tar"))]
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=_mp_child, args=(url("tar", "brace"), out))
    p.start()
    try:
        got = out.get(timeout=60)
    finally:
        p.join(30)
        if p.is_alive():
            p.kill()
            p.join()
    assert p.exitcode == 0
    assert got == want


# -- 7. prefetch budgets ---------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [0, 1, 40_000])
def test_any_prefetch_budget_reads_whole_epochs(
    s3: S3Server, local_root: Path, budget: int
) -> None:
    assert budget < min(len(b) for b in shard_files("tar").values())
    kw: dict[str, Any] = {"shuffle": True, "seed": 6, "shuffle_window": 16, "world_size": 2}
    for rank in range(2):
        reference = loader(ff.TarShards(local(local_root, "tar")), rank=rank, **kw)
        want = [epoch(reference), epoch(reference)]
        got = in_child(_epochs, url("tar"), {"prefetch_bytes": budget}, [dict(kw, rank=rank)], 2)
        assert [[list(map(tuple, b)) for b in batches] for batches, _ in got] == want


# -- 8. no fetch outlives its source ---------------------------------------------------------------


def runtime_tasks() -> int:
    """Tasks ferrofeed started on the process's runtime that have not ended (stage tasks,
    stats reporters, remote fetches)."""
    return _core._native_threads()[1]


@contextlib.contextmanager
def silent_server() -> Iterator[tuple[str, Callable[[], int]]]:
    """An HTTP server on localhost that reads requests and never answers: a fetch from it
    stays on its way. Yields its URL and a count of the requests it has read."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.05)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(5)
            with contextlib.suppress(OSError):
                if conn.recv(4096):
                    held.append(conn)
                    continue
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", lambda: len(held)
    finally:
        stop.set()
        thread.join(10)
        listener.close()
        for conn in held:
            conn.close()


def test_dropping_remote_shards_ends_the_fetches_on_their_way() -> None:
    gc.collect()
    base = runtime_tasks()
    with silent_server() as (server, asked):
        objects = [(f"{server}/train-{i}.tar", 1 << 20, None) for i in range(3)]
        shards = _core._RemoteShards(objects, [], 64 << 20, 8 << 20, 8)
        shards.prefetch([0, 1, 2])
        deadline = time.monotonic() + 30  # a hang guard
        while asked() < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert asked() == 3, "the fetches did not reach the server"
        # One task per shard, each waiting for an answer that never comes.
        assert runtime_tasks() == base + 3
        del shards
        # Dropped: every fetch was aborted, and its task ended before the drop returned.
        assert runtime_tasks() == base


def test_a_remote_epoch_leaves_no_task_on_the_runtime(s3: S3Server, proxy: FaultProxy) -> None:
    # The source's fetches share the runtime with every pipeline; a loader stopped mid-epoch
    # with the next shards on their way (a slow server), then dropped with its source, leaves
    # none of its tasks there, so the thread and task counts of the pipeline tests still hold.
    gc.collect()
    base = runtime_tasks()
    proxy.latency = 0.2
    # A budget of 1 byte: counting keeps no shard, and the reader fetches each next one ahead.
    src = ff.TarShards(url("tar"), storage_options=via(proxy), prefetch_bytes=1)
    dl = loader(src, shuffle=True, seed=4, shuffle_window=32)
    it = iter(dl)
    assert len(next(it)) == 8
    del it, dl, src
    gc.collect()
    deadline = time.monotonic() + 30  # a hang guard: the reader thread ends with its read
    while runtime_tasks() != base and time.monotonic() < deadline:
        time.sleep(0.005)
    assert runtime_tasks() == base


def runtime_threads_named() -> int:
    """Threads of this process named as the process's runtime names its threads."""
    n = 0
    for tid in os.listdir("/proc/self/task"):
        with (
            contextlib.suppress(FileNotFoundError),  # ended meanwhile
            open(f"/proc/self/task/{tid}/comm", encoding="ascii") as f,
        ):
            n += f.read().strip() == "ferrofeed-rt"
    return n


def _one_runtime_in_child(pattern: str) -> dict[str, Any]:  # in a forked child
    # The parent's runtime (and its fetches' tasks) is not the child's: it has no threads here.
    at_fork = _core._native_threads()[:2]
    dl = loader(ff.TarShards(pattern), shuffle=True, seed=5, shuffle_window=32)
    samples = sorted(flat(epoch(dl)))
    del dl
    gc.collect()
    # The epoch's end read the next epoch's first window ahead: its fetches end with the read
    # (the reader's thread holds the source until then). A hang guard, not a speed target.
    deadline = time.monotonic() + 30
    while runtime_tasks() and time.monotonic() < deadline:
        time.sleep(0.005)
    # Every runtime thread of the child is counted by the one runtime that the listing, the
    # counting, the fetches and the loader's pipeline all ran on (read again if a
    # blocking-pool thread ended between the two looks), and every other thread is Python's.
    for _ in range(100):
        counted, named = _core._native_threads()[0], runtime_threads_named()
        if counted == named == _core._native_threads()[0]:
            break
    return {
        "at_fork": list(at_fork),
        "samples": len(samples) == len(set(samples)) == sum(TAR_SIZES),
        "counted": counted,
        "named": named,
        "others": os_threads() - python_threads(),
        "tasks": runtime_tasks(),
    }


@pytest.mark.timeout(120)
def test_a_forked_child_makes_one_runtime_for_its_fetches_and_pipelines(
    s3: S3Server, proxy: FaultProxy
) -> None:
    # The parent reads with fetches on their way when it forks (a slow server).
    proxy.latency = 0.2
    src = ff.TarShards(url("tar"), storage_options=via(proxy), prefetch_bytes=1)
    it = iter(loader(src))
    next(it)
    got = in_child(_one_runtime_in_child, url("tar", "brace"), timeout=90)
    assert got["at_fork"] == [0, 0]
    assert got["samples"]
    assert got["counted"] == got["named"] > 0
    assert got["others"] == 0, "threads of neither Python nor the one runtime (nor the CPU pool)"
    assert got["tasks"] == 0
    assert len(list(it)) > 0  # the parent goes on
