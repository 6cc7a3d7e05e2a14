"""The sample index (``_ferrofeed-index.json``): written by ``ferrofeed pack`` and
``ferrofeed index``, used by `TarShards`.

With an index, opening counts nothing (a shard replaced by garbage of the same size still
opens), and remote ranks fetch only their samples' byte ranges: at world size 4 each rank
fetches about a quarter of the bytes, never a whole shard it reads a part of; opening costs
the index's GET and one listing. An index that no longer matches its shards is refused, and
the error says how to rebuild it.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ferrofeed as ff
import pytest
from objstore import FaultProxy, S3Server
from test_pack import wds_samples

INDEX = "_ferrofeed-index.json"
BUCKET = "indexed"


def samples(n: int, seed: int = 3) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {"__key__": f"{i:06d}", "bin": rng.randbytes(rng.randrange(2000, 9000)), "cls": i}
        for i in range(n)
    ]


def digest(s: dict[str, Any]) -> tuple[int, int]:
    return int(s["cls"]), zlib.crc32(s["bin"])


def webdataset_shards(root: Path, n_shards: int = 3, per: int = 7) -> list[dict[str, Any]]:
    """Shards written by webdataset's own TarWriter (another tool's shards)."""
    import webdataset as wds

    root.mkdir(parents=True)
    written = samples(n_shards * per)
    for k in range(n_shards):
        with wds.TarWriter(str(root / f"part-{k:03d}.tar")) as w:
            for s in written[k * per : (k + 1) * per]:
                w.write(s)
    return written


def index_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(Path(ff.__file__).parent.parent))
    return subprocess.run(
        [sys.executable, "-m", "ferrofeed", "index", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


# -- local -------------------------------------------------------------------------------------


def test_index_of_other_tools_shards_reads_as_counting_does(tmp_path: Path) -> None:
    written = webdataset_shards(tmp_path / "wds")
    pattern = str(tmp_path / "wds" / "part-*.tar")
    counted = ff.TarShards(pattern, index=False)
    proc = index_cli(pattern)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"index: {tmp_path / 'wds' / INDEX}"
    indexed = ff.TarShards(pattern, index=True)
    assert indexed.shards == counted.shards
    assert [digest(s) for s in indexed] == [digest(s) for s in written]
    doc = json.loads((tmp_path / "wds" / INDEX).read_text())
    assert (doc["format"], doc["version"]) == ("ferrofeed-index", 1)
    entry = doc["shards"][1]
    assert (entry["name"], entry["samples"], entry["first_key"]) == ("part-001.tar", 7, "000007")
    assert entry["size"] == (tmp_path / "wds" / "part-001.tar").stat().st_size
    # Each sample's bytes, cut out by its offsets, read as that sample alone.
    data = (tmp_path / "wds" / "part-001.tar").read_bytes()
    bounds = [*entry["offsets"], entry["end"]]
    piece = tmp_path / "piece.tar"
    piece.write_bytes(data[bounds[2] : bounds[3]])
    assert [digest(s) for s in ff.TarShards(str(piece), index=False)] == [digest(written[9])]


def test_the_index_a_pack_writes_is_the_one_index_writes(tmp_path: Path) -> None:
    ff.write_shards(samples(30), tmp_path / "out", samples_per_shard=8)
    packed = json.loads((tmp_path / "out" / INDEX).read_text())
    assert packed["pack"]["samples"] == 30
    os.remove(tmp_path / "out" / INDEX)
    ff.index_shards(str(tmp_path / "out" / "*.tar"))
    rebuilt = json.loads((tmp_path / "out" / INDEX).read_text())
    assert "pack" not in rebuilt
    assert rebuilt["shards"] == packed["shards"]
    assert len(wds_samples(str(tmp_path / "out" / "shard-{000000..000003}.tar"))) == 30


def test_with_an_index_opening_counts_nothing(tmp_path: Path) -> None:
    ff.write_shards(samples(20), tmp_path / "out", samples_per_shard=10)
    shard = tmp_path / "out" / "shard-000001.tar"
    size = shard.stat().st_size
    shard.write_bytes(b"\0" * size)  # the same size: the index does not see it
    source = ff.TarShards(str(tmp_path / "out" / "*.tar"))
    assert [n for _, n in source.shards] == [10, 10], "counted from the index"
    with pytest.raises(ff.ShardCorruptError):
        list(source)  # reading does
    assert [n for _, n in ff.TarShards(str(shard.parent / "*.tar"), index=False).shards][:1] == [10]


def test_a_stale_index_is_refused_saying_how_to_rebuild_it(tmp_path: Path) -> None:
    ff.write_shards(samples(20), tmp_path / "out", samples_per_shard=10)
    shard = tmp_path / "out" / "shard-000001.tar"
    shard.write_bytes(shard.read_bytes()[:-1024])  # its end-of-archive blocks cut off
    pattern = str(tmp_path / "out" / "*.tar")
    with pytest.raises(ff.ShardCorruptError, match="stale") as e:
        ff.TarShards(pattern)
    assert "ferrofeed index" in str(e.value)
    assert str(shard) in str(e.value)
    assert len(ff.TarShards(pattern, index=False)) == 20
    assert index_cli(pattern).returncode == 0
    assert len(ff.TarShards(pattern, index=True)) == 20

    (tmp_path / "out" / "shard-000002.tar").write_bytes(shard.read_bytes())
    with pytest.raises(ff.ShardCorruptError, match="does not list it"):
        ff.TarShards(pattern)


def test_index_refuses_what_it_cannot_describe(tmp_path: Path) -> None:
    webdataset_shards(tmp_path / "a", n_shards=1)
    webdataset_shards(tmp_path / "b", n_shards=1)
    with pytest.raises(ValueError, match="one folder"):
        ff.index_shards([str(tmp_path / "a" / "*.tar"), str(tmp_path / "b" / "*.tar")])
    ff.write_shards(samples(3), tmp_path / "pq", format="parquet")
    proc = index_cli(str(tmp_path / "pq" / "*.parquet"))
    assert proc.returncode == 1
    assert "not a tar shard" in proc.stderr
    cut = tmp_path / "a" / "part-000.tar"
    cut.write_bytes(cut.read_bytes()[:5000])
    proc = index_cli(str(cut))
    assert proc.returncode == 1
    assert str(cut) in proc.stderr
    with pytest.raises(FileNotFoundError, match="index=True"):
        ff.TarShards(str(tmp_path / "b" / "*.tar"), index=True)


# -- object storage (the slow tier) ------------------------------------------------------------


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with S3Server() as server:
        server.create_bucket(BUCKET)
        yield server


@pytest.fixture
def s3_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> S3Server:
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("FERROFEED_CACHE_DIR", str(tmp_path / "ffcache"))
    return s3


def tar_requests(log: list[tuple[str, str, str | None]]) -> list[tuple[str, str, str | None]]:
    return [(m, p, r) for m, p, r in log if p.split("?")[0].endswith(".tar")]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_remote_ranks_fetch_only_their_samples_bytes(s3_env: S3Server, tmp_path: Path) -> None:
    data = samples(800)
    dest = f"s3://{BUCKET}/ranks"
    summary = ff.write_shards(data, dest, samples_per_shard=100)
    total = summary.bytes
    local = tmp_path / "local"
    ff.write_shards(data, local, samples_per_shard=100)
    with FaultProxy(s3_env.endpoint) as proxy:
        options = {"endpoint": proxy.url}
        source = ff.TarShards(f"{dest}/*.tar", storage_options=options)
        assert [n for _, n in source.shards] == [100] * 8
        assert tar_requests(proxy.log) == [], "opening fetches no shard"
        assert sum(1 for m, p, _ in proxy.log if "list-type" in p) == 1, "one listing"
        # A rank reads its quarter of the stream, and the next epoch's first window ahead
        # (one window of slack: 16 samples of its 200).
        kw: dict[str, Any] = {"shuffle": True, "seed": 5, "shuffle_window": 16, "world_size": 4}
        seen = []
        for rank in range(4):
            before = len(proxy.log)
            dl = ff.DataLoader(
                ff.TarShards(f"{dest}/*.tar", storage_options=options),
                10,
                rank=rank,
                transform=digest,
                collate=list,
                **kw,
            )
            got = [s for batch in dl for s in batch]
            want = [
                s
                for batch in ff.DataLoader(
                    ff.TarShards(str(local / "*.tar")),
                    10,
                    rank=rank,
                    transform=digest,
                    collate=list,
                    **kw,
                )
                for s in batch
            ]
            assert got == want, rank
            seen += got
            fetched = 0
            for m, _, r in tar_requests(proxy.log[before:]):
                assert m == "GET"
                assert r is not None, "ranged GETs only"
                a, b = r.removeprefix("bytes=").split("-")
                fetched += int(b) - int(a) + 1
            assert 0.2 * total < fetched <= 0.35 * total, (rank, fetched / total)
        assert sorted(seen) == sorted(digest(s) for s in data)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_pieces_a_window_fetched_serve_the_next_epochs(
    s3_env: S3Server, tmp_path: Path
) -> None:
    data = samples(400)
    dest = f"s3://{BUCKET}/kept"
    ff.write_shards(data, dest, samples_per_shard=100)
    kw: dict[str, Any] = {"shuffle": True, "seed": 3, "shuffle_window": 32}
    with FaultProxy(s3_env.endpoint) as proxy:

        def epochs(
            prefetch_bytes: int | None,
        ) -> tuple[list[list[tuple[int, int]]], list[int], Any]:
            """Two epochs; the tar requests of each; the source's reader."""
            options = {"endpoint": proxy.url}
            shards = ff.TarShards(
                f"{dest}/*.tar", storage_options=options, prefetch_bytes=prefetch_bytes
            )
            dl = ff.DataLoader(shards, 10, transform=digest, collate=list, **kw)
            got, requests = [], []
            for _ in range(2):
                before = len(proxy.log)
                got.append(sorted(s for batch in dl for s in batch))
                requests.append(len(tar_requests(proxy.log[before:])))
            return got, requests, shards._reader

        # Within the budget (the default), the second epoch's samples all come from the
        # pieces the first one fetched (its windows cut the shards elsewhere: a piece is a
        # slice of a kept one, or kept ones put together): no fetch at all.
        got, requests, reader = epochs(None)
        hits, held = reader.kept
        assert requests[0] > 0
        assert requests[1] == 0, requests
        assert hits > 0
        assert 0 < held <= sum(len(d["bin"]) + 4096 for d in data)
        # A budget of 1 byte keeps nothing: every epoch fetches its samples again.
        again, requests_1, reader_1 = epochs(1)
        assert reader_1.kept == (0, 0)
        assert requests_1[1] > 0, requests_1
        assert again == got  # the same samples either way
        assert got[0] == got[1] == sorted(digest(d) for d in data)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_remote_stale_index_is_refused_and_index_rebuilds_it(
    s3_env: S3Server, tmp_path: Path
) -> None:
    dest = f"s3://{BUCKET}/stale"
    ff.write_shards(samples(20), dest, samples_per_shard=10)
    # The second shard again, each payload changed in place: the same size, another ETag.
    changed = [{**s, "bin": bytes(b ^ 1 for b in s["bin"])} for s in samples(20)[10:]]
    ff.write_shards(changed, tmp_path / "other")
    local = tmp_path / "other" / "shard-000000.tar"
    s3_env.put_file(BUCKET, "stale/shard-000001.tar", local)
    with pytest.raises(ff.ShardCorruptError, match="ETag") as e:
        ff.TarShards(f"{dest}/*.tar")
    assert f"ferrofeed index '{dest}/*.tar'" in str(e.value)
    ff.index_shards(f"{dest}/*.tar")
    source = ff.TarShards(f"{dest}/*.tar", index=True)
    assert [digest(s) for s in source][10:] == [digest(s) for s in changed]
