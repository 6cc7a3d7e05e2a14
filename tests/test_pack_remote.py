"""Writing shards straight into object storage, against the S3 test server (moto).

The same pack into ``s3://`` as into a local folder: the same bytes, read back by
`TarShards` and `ParquetShards` from the bucket; shards past one upload part go up as
multipart uploads, completed only when whole (a pack killed midway leaves no object of the
shard it was writing, and resumes from its records in the bucket); a missing bucket, or a
prefix holding other objects, is refused before anything is written.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import ferrofeed as ff
import pytest
from conftest import run_python
from objstore import S3Server
from test_pack import make_folder, shard_bytes

# The slow tier (object storage): `make test-slow`, not `make test`.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

BUCKET = "packs"


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with S3Server() as server:
        server.create_bucket(BUCKET)
        yield server


@pytest.fixture(autouse=True)
def s3_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("FERROFEED_CACHE_DIR", str(tmp_path / "ffcache"))


def objects(s3: S3Server, prefix: str) -> dict[str, bytes]:
    """The objects under ``prefix/`` by name (relative), with their bytes."""
    listed = s3.client.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/").get("Contents", [])
    out = {}
    for o in listed:
        body = s3.client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"]
        out[o["Key"][len(prefix) + 1 :]] = body.read()
        body.close()
    return out


def test_a_folder_packed_into_s3_is_the_local_pack_byte_for_byte(
    s3: S3Server, tmp_path: Path
) -> None:
    root = make_folder(tmp_path / "images", per_class=5)
    local = ff.write_shards(root, tmp_path / "local", samples_per_shard=4)
    remote = ff.write_shards(root, f"s3://{BUCKET}/folder", samples_per_shard=4)
    assert (remote.samples, remote.shards, remote.bytes) == (10, 3, local.bytes)
    assert remote.index == f"s3://{BUCKET}/folder/_ferrofeed-index.json"
    stored = objects(s3, "folder")
    assert sorted(stored) == ["_ferrofeed-index.json", *sorted(shard_bytes(tmp_path / "local"))]
    assert {k: v for k, v in stored.items() if k.endswith(".tar")} == shard_bytes(
        tmp_path / "local"
    )
    expected = list(ff.TarShards(str(tmp_path / "local" / "*.tar")))
    got = list(ff.TarShards(f"s3://{BUCKET}/folder/*.tar"))
    assert [(s["jpg"], s["cls"]) for s in got] == [(s["jpg"], s["cls"]) for s in expected]

    # Parquet too.
    ff.write_shards(root, f"s3://{BUCKET}/pq", format="parquet")
    rows = list(ff.ParquetShards(f"s3://{BUCKET}/pq/*.parquet"))
    assert [r["label"] for r in rows] == [0] * 5 + [1] * 5


def test_a_shard_larger_than_a_part_goes_up_in_parts(s3: S3Server, tmp_path: Path) -> None:
    blobs = [os.urandom(3 << 20) for _ in range(4)]  # 12 MiB: two parts of 8 MiB
    samples = [{"bin": b, "cls": i} for i, b in enumerate(blobs)]
    ff.write_shards(samples, tmp_path / "local")
    summary = ff.write_shards(samples, f"s3://{BUCKET}/big")
    assert summary.shards == 1
    (name, data), *_ = shard_bytes(tmp_path / "local").items()
    head = s3.client.head_object(Bucket=BUCKET, Key=f"big/{name}")
    assert head["ETag"].strip('"').endswith("-2"), "a multipart upload of two parts"
    assert objects(s3, "big")[name] == data


def test_a_missing_bucket_or_a_busy_prefix_is_refused_at_once(s3: S3Server, tmp_path: Path) -> None:
    root = make_folder(tmp_path / "images", per_class=1)
    with pytest.raises(ff.PackDestinationError, match="the bucket does not exist") as e:
        ff.write_shards(root, "s3://no-such-bucket/x")
    assert e.value.filename == "s3://no-such-bucket/x"
    s3.put(BUCKET, "busy/readme.txt", b"someone else's")
    with pytest.raises(ff.PackConflictError, match="not empty"):
        ff.write_shards(root, f"s3://{BUCKET}/busy")
    assert list(objects(s3, "busy")) == ["readme.txt"]


KILLED = """
import os, signal, sys
import ferrofeed as ff
from ferrofeed import _pack

def kill(self, done, samples, nbytes, skipped, shards):
    if shards >= 3:
        os.kill(os.getpid(), signal.SIGKILL)

_pack._Bar.__call__ = kill
ff.write_shards(sys.argv[1], sys.argv[2], samples_per_shard=8, workers=2, progress=True)
"""


def test_a_pack_into_s3_killed_midway_resumes(s3: S3Server, tmp_path: Path) -> None:
    root = make_folder(tmp_path / "images", per_class=50)
    dest = f"s3://{BUCKET}/killed"
    proc = run_python(KILLED, args=[str(root), dest], env=s3.env(), check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    before = objects(s3, "killed")
    finished = sorted(k for k in before if k.endswith(".tar"))
    assert len(finished) >= 3
    assert any(k.startswith(".ferrofeed-pack/") for k in before), "its records"
    etags = {k: s3.client.head_object(Bucket=BUCKET, Key=f"killed/{k}")["ETag"] for k in finished}

    summary = ff.write_shards(root, dest, samples_per_shard=8, workers=2)
    assert (summary.samples, summary.resumed) == (100, len(finished))
    after = objects(s3, "killed")
    assert not [k for k in after if k.startswith(".")], "the records are gone"
    for k in finished:
        assert s3.client.head_object(Bucket=BUCKET, Key=f"killed/{k}")["ETag"] == etags[k]
    ff.write_shards(root, tmp_path / "fresh", samples_per_shard=8)
    assert {k: v for k, v in after.items() if k.endswith(".tar")} == shard_bytes(tmp_path / "fresh")
