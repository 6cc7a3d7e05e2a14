"""The servers of tests/objstore.py, tested with http.client and boto3 alone.

They are what the object-storage tests and benchmarks run against, so each behaviour those
rely on is pinned here: byte ranges, 404/403/416 of the file server; moto's S3 API through
its endpoint; every fault of the proxy happening exactly as programmed and the next request
being clean; nothing (process, thread) left behind.
"""

from __future__ import annotations

import email.utils
import hashlib
import http.client
import os
import random
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from email.message import Message
from pathlib import Path
from typing import Any

import pytest
from objstore import (
    FaultProxy,
    HttpFileServer,
    S3Server,
    free_port,
    ranged_get,
    server_threads,
)

boto3 = pytest.importorskip("boto3")
botocore_exceptions = pytest.importorskip("botocore.exceptions")
pytest.importorskip("moto.server")

# The slow tier (object storage): `make test-slow`, not `make test`.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

SIZE = 1 << 20
DATA = random.Random(26).randbytes(SIZE)
BUCKET = "ferrofeed-test"


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def connect(url: str, timeout: float = 10.0) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", port_of(url), timeout=timeout)


def fetch(
    conn: http.client.HTTPConnection,
    path: str,
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    body: bytes | Iterable[bytes] | None = None,
) -> tuple[int, Message, bytes]:
    conn.request(method, path, body=body, headers=headers or {})
    resp = conn.getresponse()
    return resp.status, resp.headers, resp.read()


def get(url: str, path: str, **kwargs: Any) -> tuple[int, Message, bytes]:
    conn = connect(url)
    try:
        return fetch(conn, path, **kwargs)
    finally:
        conn.close()


# moto does not check signatures, but it does refuse anonymous requests to private objects.
FAKE_AUTH = {
    "Authorization": "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/s3/aws4_request, "
    "SignedHeaders=host, Signature=0000"
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("objstore")
    (base / "secret.txt").write_bytes(b"outside the root")
    root = base / "root"
    (root / "sub").mkdir(parents=True)
    (root / "a.bin").write_bytes(DATA)
    (root / "empty.bin").write_bytes(b"")
    (root / "sub" / "b.txt").write_bytes(b"hello")
    (root / "escape.txt").symlink_to(base / "secret.txt")
    return root


@pytest.fixture(scope="module")
def files(root: Path) -> Iterator[HttpFileServer]:
    with HttpFileServer(root) as server:
        yield server


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with S3Server() as server:
        server.create_bucket(BUCKET)
        server.put(BUCKET, "a.bin", DATA)
        yield server


@pytest.fixture
def proxy(files: HttpFileServer) -> Iterator[FaultProxy]:
    with FaultProxy(files.url) as p:
        yield p
    assert server_threads(p.url) == []


def boto3_client(env: dict[str, str], **overrides: str) -> Any:
    cfg = {**env, **overrides}
    return boto3.client(
        "s3",
        endpoint_url=cfg["AWS_ENDPOINT_URL"],
        aws_access_key_id=cfg["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=cfg["AWS_SECRET_ACCESS_KEY"],
        region_name=cfg["AWS_REGION"],
    )


# --------------------------------------------------------------------------------------------
# HttpFileServer
# --------------------------------------------------------------------------------------------


def test_file_server_get_and_head(files: HttpFileServer, root: Path) -> None:
    status, headers, body = get(files.url, "/a.bin")
    assert status == 200
    assert body == DATA
    assert headers["Content-Length"] == str(SIZE)
    assert headers["Accept-Ranges"] == "bytes"
    mtime = email.utils.parsedate_to_datetime(headers["Last-Modified"]).timestamp()
    assert mtime == int((root / "a.bin").stat().st_mtime)
    etag = headers["ETag"]
    assert len(etag) > 2
    assert etag[0] == etag[-1] == '"'

    status, head_headers, body = get(files.url, "/a.bin", method="HEAD")
    assert (status, body) == (200, b"")
    assert head_headers["Content-Length"] == str(SIZE)
    assert head_headers["ETag"] == etag
    assert head_headers["Last-Modified"] == headers["Last-Modified"]

    assert get(files.url, "/sub/b.txt")[2] == b"hello"
    assert get(files.url, "/sub/b.txt?x=1")[2] == b"hello"
    assert get(files.url, "/empty.bin")[:3:2] == (200, b"")


@pytest.mark.parametrize(
    ("spec", "first", "last"),
    [
        ("bytes=10-19", 10, 19),
        ("bytes=0-0", 0, 0),
        ("bytes=100-", 100, SIZE - 1),
        ("bytes=-7", SIZE - 7, SIZE - 1),
        ("bytes=5-99999999", 5, SIZE - 1),
        ("bytes=-99999999", 0, SIZE - 1),
        ("bytes=1048575-", SIZE - 1, SIZE - 1),
    ],
)
def test_file_server_ranges(files: HttpFileServer, spec: str, first: int, last: int) -> None:
    status, headers, body = get(files.url, "/a.bin", headers={"Range": spec})
    assert status == 206
    assert headers["Content-Range"] == f"bytes {first}-{last}/{SIZE}"
    assert headers["Content-Length"] == str(last - first + 1)
    assert body == DATA[first : last + 1]


@pytest.mark.parametrize(
    ("path", "spec", "size"),
    [
        ("/a.bin", f"bytes={SIZE}-", SIZE),
        ("/a.bin", f"bytes={SIZE + 10}-{SIZE + 20}", SIZE),
        ("/a.bin", "bytes=-0", SIZE),
        ("/empty.bin", "bytes=0-", 0),
        ("/empty.bin", "bytes=-5", 0),
    ],
)
def test_file_server_unsatisfiable_range(
    files: HttpFileServer, path: str, spec: str, size: int
) -> None:
    status, headers, body = get(files.url, path, headers={"Range": spec})
    assert status == 416
    assert headers["Content-Range"] == f"bytes */{size}"
    assert body == b""


@pytest.mark.parametrize("spec", ["bytes=9-2", "bytes=0-1,5-6", "items=0-1", "bytes=x-"])
def test_file_server_ignores_other_ranges(files: HttpFileServer, spec: str) -> None:
    status, headers, body = get(files.url, "/a.bin", headers={"Range": spec})
    assert status == 200
    assert "Content-Range" not in headers
    assert body == DATA


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/missing.bin", 404),
        ("/sub/missing", 404),
        ("/sub", 404),
        ("/sub/", 404),
        ("/", 404),
        ("/../secret.txt", 403),
        ("/sub/../../secret.txt", 403),
        ("/%2e%2e/secret.txt", 403),
        ("/sub/%2E%2E/%2E%2E/secret.txt", 403),
        ("/escape.txt", 403),
    ],
)
def test_file_server_refuses(files: HttpFileServer, path: str, status: int) -> None:
    got, _, body = get(files.url, path)
    assert got == status
    assert b"outside the root" not in body
    assert get(files.url, path, method="HEAD")[0] == status


def test_file_server_keeps_connections_and_counts(files: HttpFileServer) -> None:
    before = files.requests
    conn = connect(files.url)
    try:
        assert fetch(conn, "/a.bin", headers={"Range": "bytes=0-9"})[2] == DATA[:10]
        sock = conn.sock
        assert fetch(conn, "/missing")[0] == 404
        assert fetch(conn, "/a.bin", method="HEAD")[0] == 200
        assert fetch(conn, "/a.bin", headers={"Range": "bytes=-3"})[2] == DATA[-3:]
        assert conn.sock is sock  # one connection for all four
    finally:
        conn.close()
    assert files.requests == before + 4
    assert files.log[-4:] == [
        ("GET", "/a.bin", "bytes=0-9"),
        ("GET", "/missing", None),
        ("HEAD", "/a.bin", None),
        ("GET", "/a.bin", "bytes=-3"),
    ]


def test_file_server_etag_option_and_changes(tmp_path: Path) -> None:
    (tmp_path / "f.bin").write_bytes(b"one")
    with HttpFileServer(tmp_path) as server:
        etag1 = get(server.url, "/f.bin")[1]["ETag"]
        (tmp_path / "f.bin").write_bytes(b"two!")
        status, headers, body = get(server.url, "/f.bin")
        assert (status, body) == (200, b"two!")
        assert headers["ETag"] not in (None, etag1)
    with HttpFileServer(tmp_path, etag=False) as server:
        status, headers, body = get(server.url, "/f.bin", headers={"Range": "bytes=1-"})
        assert (status, body) == (206, b"wo!")
        assert "ETag" not in headers
        assert "Last-Modified" in headers
        assert server_threads(server.url) != []
    assert server_threads(server.url) == []


# --------------------------------------------------------------------------------------------
# S3Server (moto)
# --------------------------------------------------------------------------------------------


def test_s3_env(s3: S3Server) -> None:
    env = s3.env()
    assert env["AWS_ENDPOINT_URL"] == s3.endpoint == f"http://127.0.0.1:{s3.port}"
    assert env["AWS_REGION"] == "us-east-1"
    assert env["AWS_ALLOW_HTTP"] == "true"
    assert env["AWS_ACCESS_KEY_ID"]
    assert env["AWS_SECRET_ACCESS_KEY"]
    other = s3.env(endpoint="http://127.0.0.1:1")
    assert other["AWS_ENDPOINT_URL"] == "http://127.0.0.1:1"
    assert {k: v for k, v in other.items() if k != "AWS_ENDPOINT_URL"} == {
        k: v for k, v in env.items() if k != "AWS_ENDPOINT_URL"
    }


def test_s3_put_get_range_head_list_delete(s3: S3Server, tmp_path: Path) -> None:
    client = boto3_client(s3.env())
    etag = s3.put(BUCKET, "crud/x.bin", b"0123456789")
    assert etag == f'"{hashlib.md5(b"0123456789").hexdigest()}"'
    (tmp_path / "y.bin").write_bytes(DATA[:5000])
    s3.put_file(BUCKET, "crud/sub/y.bin", tmp_path / "y.bin")

    obj = client.get_object(Bucket=BUCKET, Key="crud/x.bin")
    assert obj["Body"].read() == b"0123456789"
    assert obj["ETag"] == etag

    part = client.get_object(Bucket=BUCKET, Key="crud/sub/y.bin", Range="bytes=100-199")
    assert part["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert part["ContentRange"] == "bytes 100-199/5000"
    assert part["Body"].read() == DATA[100:200]

    head = client.head_object(Bucket=BUCKET, Key="crud/sub/y.bin")
    assert head["ContentLength"] == 5000
    assert head["ETag"] == f'"{hashlib.md5(DATA[:5000]).hexdigest()}"'

    listed = client.list_objects_v2(Bucket=BUCKET, Prefix="crud/")
    assert [(o["Key"], o["Size"]) for o in listed["Contents"]] == [
        ("crud/sub/y.bin", 5000),
        ("crud/x.bin", 10),
    ]

    s3.delete(BUCKET, "crud/x.bin")
    s3.delete(BUCKET, "crud/x.bin")  # deleting a missing key is no error, as in S3
    with pytest.raises(botocore_exceptions.ClientError) as info:
        client.head_object(Bucket=BUCKET, Key="crud/x.bin")
    assert info.value.response["Error"]["Code"] == "404"


def test_s3_raw_http_ranges_etag_and_errors(s3: S3Server) -> None:
    etag = f'"{hashlib.md5(DATA).hexdigest()}"'
    status, headers, body = get(s3.endpoint, f"/{BUCKET}/a.bin", headers=FAKE_AUTH)
    assert (status, body == DATA, headers["ETag"]) == (200, True, etag)
    assert headers["Content-Length"] == str(SIZE)
    assert headers["Last-Modified"]

    for spec, first, last in [
        ("bytes=10-19", 10, 19),
        ("bytes=-5", SIZE - 5, SIZE - 1),
        ("bytes=1000-", 1000, SIZE - 1),
        ("bytes=5-99999999", 5, SIZE - 1),
    ]:
        status, headers, body = get(
            s3.endpoint, f"/{BUCKET}/a.bin", headers={**FAKE_AUTH, "Range": spec}
        )
        assert status == 206, spec
        assert headers["Content-Range"] == f"bytes {first}-{last}/{SIZE}"
        assert headers["ETag"] == etag
        assert body == DATA[first : last + 1]

    status, _, body = get(
        s3.endpoint, f"/{BUCKET}/a.bin", headers={**FAKE_AUTH, "Range": f"bytes={SIZE}-"}
    )
    assert status == 416
    assert b"<Code>InvalidRange</Code>" in body

    status, _, body = get(
        s3.endpoint,
        f"/{BUCKET}/a.bin",
        headers={**FAKE_AUTH, "Range": "bytes=0-3", "If-Match": '"0000"'},
    )
    assert status == 412
    assert b"<Code>PreconditionFailed</Code>" in body

    status, _, body = get(s3.endpoint, f"/{BUCKET}/missing", headers=FAKE_AUTH)
    assert (status, b"<Code>NoSuchKey</Code>" in body) == (404, True)
    status, _, body = get(s3.endpoint, "/no-such-bucket/a.bin", headers=FAKE_AUTH)
    assert (status, b"<Code>NoSuchBucket</Code>" in body) == (404, True)
    # Unsigned: refused. Signed with any secret: accepted (moto checks no signature).
    assert get(s3.endpoint, f"/{BUCKET}/a.bin")[0] == 403
    wrong = boto3_client(s3.env(), AWS_SECRET_ACCESS_KEY="not-the-secret")
    assert (
        wrong.get_object(Bucket=BUCKET, Key="a.bin", Range="bytes=0-2")["Body"].read() == (DATA[:3])
    )


def test_s3_server_stops_its_process() -> None:
    with S3Server() as server:
        pid = server.pid
        url = server.endpoint
        server.create_bucket("short-lived")
        server.put("short-lived", "k", b"v")
        assert server.client.get_object(Bucket="short-lived", Key="k")["Body"].read() == b"v"
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # ended and reaped
    with pytest.raises(OSError):
        get(url, "/")
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.endpoint


def test_s3_server_reports_a_failed_start() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        port = taken.getsockname()[1]
        server = S3Server(port=port, startup_timeout=15.0)
        with pytest.raises(RuntimeError, match=f"on 127.0.0.1:{port} .* exited") as info:
            server.start()
    assert "in use" in str(info.value)  # the server's own stderr is in the message
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.pid


# --------------------------------------------------------------------------------------------
# FaultProxy
# --------------------------------------------------------------------------------------------


def test_proxy_forwards_cleanly(proxy: FaultProxy, files: HttpFileServer) -> None:
    upstream_before = files.requests
    conn = connect(proxy.url)
    try:
        status, headers, body = fetch(conn, "/a.bin")
        assert (status, body == DATA) == (200, True)
        direct = get(files.url, "/a.bin")[1]
        assert headers["ETag"] == direct["ETag"]
        assert headers["Last-Modified"] == direct["Last-Modified"]
        sock = conn.sock
        status, headers, body = fetch(conn, "/a.bin", headers={"Range": "bytes=7-70"})
        assert (status, headers["Content-Range"], body) == (206, f"bytes 7-70/{SIZE}", DATA[7:71])
        status, headers, body = fetch(conn, "/a.bin", method="HEAD")
        assert (status, headers["Content-Length"], body) == (200, str(SIZE), b"")
        assert fetch(conn, "/missing")[0] == 404
        status, headers, _ = fetch(conn, "/a.bin", headers={"Range": f"bytes={SIZE}-"})
        assert (status, headers["Content-Range"]) == (416, f"bytes */{SIZE}")
        assert conn.sock is sock  # kept alive through every answer
    finally:
        conn.close()
    assert proxy.requests == 5
    assert proxy.injected == {}
    assert proxy.bytes == SIZE + 64 + len(b"404 Not Found\n")
    assert files.requests == upstream_before + 1 + 5
    assert proxy.log[1] == ("GET", "/a.bin", "bytes=7-70")


def test_proxy_drop(proxy: FaultProxy) -> None:
    proxy.add("drop")
    conn = connect(proxy.url)
    try:
        with pytest.raises(http.client.RemoteDisconnected):
            fetch(conn, "/a.bin")
    finally:
        conn.close()
    assert proxy.injected == {"drop": 1}
    status, _, body = get(proxy.url, "/a.bin", headers={"Range": "bytes=0-99"})
    assert (status, body) == (206, DATA[:100])
    assert proxy.requests == 2
    assert proxy.pending == 0


@pytest.mark.parametrize(
    ("status", "code"),
    [(503, "SlowDown"), (500, "InternalError"), (403, "AccessDenied"), (404, "NoSuchKey")],
)
def test_proxy_status(proxy: FaultProxy, files: HttpFileServer, status: int, code: str) -> None:
    proxy.add("status", status=status)
    upstream_before = files.requests
    conn = connect(proxy.url)
    try:
        got, headers, body = fetch(conn, "/a.bin", headers={"Range": "bytes=0-9"})
        assert got == status
        assert headers["Content-Type"] == "application/xml"
        assert f"<Error><Code>{code}</Code>".encode() in body
        assert b"<Resource>/a.bin</Resource>" in body
        assert "Retry-After" not in headers
        assert files.requests == upstream_before  # answered without forwarding
        # The connection stays usable, and the next request is clean.
        assert fetch(conn, "/a.bin", headers={"Range": "bytes=0-9"})[::2] == (206, DATA[:10])
    finally:
        conn.close()
    assert proxy.injected == {"status": 1}


def test_proxy_status_custom_code_and_head(proxy: FaultProxy) -> None:
    proxy.add("status", status=404, code="NoSuchBucket", message="gone", times=2)
    status, _, body = get(proxy.url, "/a.bin")
    assert status == 404
    assert b"<Code>NoSuchBucket</Code><Message>gone</Message>" in body
    status, _, body = get(proxy.url, "/a.bin", method="HEAD")
    assert (status, body) == (404, b"")
    assert get(proxy.url, "/a.bin", method="HEAD")[0] == 200
    assert proxy.injected == {"status": 2}


def test_proxy_delay(proxy: FaultProxy) -> None:
    proxy.add("delay", seconds=0.3)
    t0 = time.monotonic()
    status, _, body = get(proxy.url, "/a.bin", headers={"Range": "bytes=0-9"})
    assert time.monotonic() - t0 >= 0.3
    assert (status, body) == (206, DATA[:10])
    assert proxy.injected == {"delay": 1}
    assert proxy.pending == 0


def test_proxy_truncate_fraction(proxy: FaultProxy) -> None:
    proxy.add("truncate", fraction=0.25)
    conn = connect(proxy.url)
    try:
        conn.request("GET", "/a.bin")
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.headers["Content-Length"] == str(SIZE)  # the whole length is announced
        with pytest.raises(http.client.IncompleteRead) as info:
            resp.read()
        assert info.value.partial == DATA[: SIZE // 4]
    finally:
        conn.close()
    assert proxy.injected == {"truncate": 1}
    assert proxy.bytes == SIZE // 4
    assert get(proxy.url, "/a.bin")[2] == DATA


def test_proxy_truncate_nbytes_of_a_range(proxy: FaultProxy) -> None:
    proxy.add("truncate", nbytes=1000, match=ranged_get)
    conn = connect(proxy.url)
    try:
        conn.request("GET", "/a.bin", headers={"Range": "bytes=5000-14999"})
        resp = conn.getresponse()
        assert resp.status == 206
        assert resp.headers["Content-Range"] == f"bytes 5000-14999/{SIZE}"
        assert "Connection" not in resp.headers  # no warning: the body just stops
        with pytest.raises(http.client.IncompleteRead) as info:
            resp.read()
        assert info.value.partial == DATA[5000:6000]
    finally:
        conn.close()
    # Resumed where it stopped, as a client would:
    status, _, body = get(proxy.url, "/a.bin", headers={"Range": "bytes=6000-14999"})
    assert (status, body) == (206, DATA[6000:15000])


def test_proxy_slow(proxy: FaultProxy) -> None:
    proxy.add("slow", rate=200_000)
    t0 = time.monotonic()
    status, _, body = get(proxy.url, "/a.bin", headers={"Range": "bytes=0-99999"})
    assert time.monotonic() - t0 >= 0.45  # 100 kB at 200 kB/s
    assert (status, body) == (206, DATA[:100_000])
    assert proxy.injected == {"slow": 1}


def test_proxy_faults_apply_in_order_and_times(proxy: FaultProxy) -> None:
    proxy.add("status", status=500, times=2)
    proxy.add("drop")
    proxy.add("status", status=503)
    assert proxy.pending == 4
    assert get(proxy.url, "/a.bin")[0] == 500
    assert get(proxy.url, "/a.bin")[0] == 500
    with pytest.raises(http.client.RemoteDisconnected):
        get(proxy.url, "/a.bin")
    assert get(proxy.url, "/a.bin")[0] == 503
    assert get(proxy.url, "/a.bin", headers={"Range": "bytes=1-2"})[::2] == (206, DATA[1:3])
    assert proxy.injected == {"status": 3, "drop": 1}
    assert proxy.requests == 5
    assert proxy.pending == 0


def test_proxy_match_predicates(proxy: FaultProxy) -> None:
    proxy.add("status", status=503, match=ranged_get)
    proxy.add("drop", match=lambda method, path, headers: path.startswith("/sub/"))
    assert get(proxy.url, "/a.bin", method="HEAD")[0] == 200
    assert get(proxy.url, "/a.bin")[0] == 200
    assert get(proxy.url, "/a.bin", headers={"range": "bytes=0-1"})[0] == 503
    assert get(proxy.url, "/a.bin", headers={"Range": "bytes=0-1"})[0] == 206
    with pytest.raises(http.client.RemoteDisconnected):
        get(proxy.url, "/sub/b.txt")
    assert get(proxy.url, "/sub/b.txt")[2] == b"hello"
    assert proxy.injected == {"status": 1, "drop": 1}


def test_proxy_latency(proxy: FaultProxy) -> None:
    proxy.latency = 0.1
    conn = connect(proxy.url)
    try:
        for _ in range(3):
            t0 = time.monotonic()
            assert fetch(conn, "/sub/b.txt")[2] == b"hello"
            assert time.monotonic() - t0 >= 0.1
    finally:
        conn.close()
    proxy.latency = 0
    assert proxy.latency == 0
    with pytest.raises(ValueError):
        proxy.latency = -1


def test_proxy_clear_and_validation(proxy: FaultProxy) -> None:
    proxy.add("drop", times=3)
    proxy.add("status", status=500)
    proxy.clear()
    assert proxy.pending == 0
    assert get(proxy.url, "/sub/b.txt")[2] == b"hello"
    assert proxy.injected == {}
    with pytest.raises(ValueError, match="unknown fault kind"):
        proxy.add("explode")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="times"):
        proxy.add("drop", times=0)
    with pytest.raises(ValueError, match="fraction"):
        proxy.add("truncate", fraction=1.0)
    with pytest.raises(ValueError, match="rate"):
        proxy.add("slow", rate=0)
    with pytest.raises(ValueError, match="http://"):
        FaultProxy("https://127.0.0.1:1")


def test_proxy_passes_on_a_broken_upstream_body(proxy: FaultProxy) -> None:
    # A proxy in front of the proxy: the inner one truncates, the outer one must not hide it.
    proxy.add("truncate", nbytes=3000)
    with FaultProxy(proxy.url) as outer:
        conn = connect(outer.url)
        try:
            conn.request("GET", "/a.bin", headers={"Range": "bytes=0-9999"})
            resp = conn.getresponse()
            assert resp.status == 206
            with pytest.raises(http.client.IncompleteRead) as info:
                resp.read()
            assert info.value.partial == DATA[:3000]
        finally:
            conn.close()
        assert get(outer.url, "/a.bin", headers={"Range": "bytes=0-9999"})[2] == DATA[:10000]
    assert proxy.injected == {"truncate": 1}


def test_proxy_bad_gateway() -> None:
    with FaultProxy(f"http://127.0.0.1:{free_port()}") as proxy:
        status, _, body = get(proxy.url, "/x")
    assert status == 502
    assert b"upstream" in body


def test_proxy_in_front_of_s3_with_boto3(s3: S3Server) -> None:
    with FaultProxy(s3.endpoint) as proxy:
        client = boto3_client(s3.env(endpoint=proxy.url))
        # Host is forwarded unchanged: the request reaches moto as it was signed.
        big = DATA * 2
        etag = client.put_object(Bucket=BUCKET, Key="via-proxy.bin", Body=big)["ETag"]
        assert etag == f'"{hashlib.md5(big).hexdigest()}"'
        proxy.add("status", status=503, match=ranged_get)
        proxy.add("drop", match=ranged_get)
        part = client.get_object(Bucket=BUCKET, Key="via-proxy.bin", Range="bytes=10-1048585")
        assert part["ContentRange"] == f"bytes 10-1048585/{2 * SIZE}"
        assert part["Body"].read() == big[10:1048586]
        assert proxy.injected == {"status": 1, "drop": 1}  # boto3 retried both
        listed = client.list_objects_v2(Bucket=BUCKET, Prefix="via-")
        assert [o["Key"] for o in listed["Contents"]] == ["via-proxy.bin"]
        # moto closes each connection; the proxy keeps the client's open regardless.
        conn = connect(proxy.url)
        try:
            for spec in ("bytes=0-9", "bytes=-4"):
                status, headers, _ = fetch(
                    conn, f"/{BUCKET}/a.bin", headers={**FAKE_AUTH, "Range": spec}
                )
                assert status == 206
                assert "Connection" not in headers
            sock = conn.sock
            status, _, _ = fetch(
                conn,
                f"/{BUCKET}/chunked.bin",
                method="PUT",
                headers=FAKE_AUTH,
                body=iter([b"abc", b"defg"]),  # sent chunked
            )
            assert status == 200
            assert conn.sock is sock
        finally:
            conn.close()
        assert s3.client.get_object(Bucket=BUCKET, Key="chunked.bin")["Body"].read() == b"abcdefg"
        assert proxy.requests == 4 + 1 + 3


def test_proxy_close_ends_every_connection(files: HttpFileServer) -> None:
    idle = connect(files.url)
    errors: list[BaseException] = []
    started = threading.Event()

    def slow_reader(url: str) -> None:
        conn = connect(url, timeout=30.0)
        try:
            conn.request("GET", "/a.bin")
            resp = conn.getresponse()
            started.set()
            resp.read()
        except (http.client.IncompleteRead, OSError) as e:
            errors.append(e)
        finally:
            conn.close()

    with FaultProxy(files.url) as proxy:
        kept = connect(proxy.url)
        assert fetch(kept, "/sub/b.txt")[2] == b"hello"  # left open, idle
        assert fetch(idle, "/sub/b.txt")[2] == b"hello"
        proxy.add("slow", rate=10_000)  # 1 MiB would take 100 s
        reader = threading.Thread(target=slow_reader, args=(proxy.url,))
        reader.start()
        assert started.wait(10)
        names = server_threads(proxy.url)
        assert sorted(names) == sorted(
            [f"FaultProxy:{port_of(proxy.url)} {kind}" for kind in ("accept", "conn", "conn")]
        )
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 10  # a hang guard, not a speed check
    assert server_threads(proxy.url) == []
    reader.join(10)
    assert not reader.is_alive()
    assert len(errors) == 1
    # The upstream connections the proxy had are closed too: their file-server threads end.
    deadline = time.monotonic() + 10
    while len(server_threads(files.url)) > 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(server_threads(files.url)) == 2  # its accept thread and the idle connection
    kept.close()
    idle.close()
