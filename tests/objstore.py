"""Real servers for the object-storage tests and benchmarks, all on 127.0.0.1.

* ``S3Server``: moto's S3-compatible server, started as a subprocess on a free port.
* ``HttpFileServer``: a plain HTTP/1.1 file server with single byte ranges, ETag and
  Last-Modified (what ``object_store``'s HTTP store needs to read a file in ranges).
* ``FaultProxy``: a small HTTP/1.1 reverse proxy put in front of either; it forwards
  requests unchanged (``Host`` included, so signatures stay valid) and injects the faults a
  test programs: dropped connections, error statuses, delays, truncated and slow bodies, and
  a constant added latency.

Plain Python and the standard library (boto3 only for the ``S3Server`` helpers, imported
when first used), so the benchmarks can import it too. Every server is a context manager
that leaves no process, thread or socket behind when it exits.

Example::

    with S3Server() as s3, FaultProxy(s3.endpoint) as proxy:
        s3.create_bucket("shards")
        s3.put("shards", "a.tar", data)
        proxy.add("status", status=503)  # the next request is throttled
        env = s3.env(endpoint=proxy.url)  # what a client in a subprocess needs
"""

from __future__ import annotations

import contextlib
import email.utils
import hashlib
import http.client
import importlib
import os
import re
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any, Final, Literal, Self
from xml.sax.saxutils import escape as xml_escape

__all__ = [
    "FaultKind",
    "FaultProxy",
    "HttpFileServer",
    "Match",
    "S3Server",
    "free_port",
    "python_http_server",
    "ranged_get",
    "server_threads",
    "whole_get",
]

HOST: Final = "127.0.0.1"

#: Test credentials: moto accepts any (it does not check signatures).
ACCESS_KEY_ID: Final = "testing"
SECRET_ACCESS_KEY: Final = "testing"
REGION: Final = "us-east-1"

# Response bodies are moved in pieces of this size (the proxy's throughput depends on it).
_CHUNK: Final = 1 << 20
# How long close() waits for one connection thread to end.
_JOIN_TIMEOUT: Final = 10.0

FaultKind = Literal["drop", "status", "delay", "truncate", "slow"]
#: A predicate on (method, path, headers) choosing the requests a fault applies to.
#: ``headers`` is case-insensitive: ``"range" in headers`` and ``headers.get("Range")`` work.
Match = Callable[[str, str, Message], bool]

_FAULT_KINDS: Final = frozenset({"drop", "status", "delay", "truncate", "slow"})

# Headers that belong to one connection, never forwarded (RFC 9110 section 7.6.1). Expect is
# answered by the proxy itself (the body is read before forwarding).
_HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
    }
)

# S3 error codes and messages for the statuses the "status" fault answers.
_S3_ERRORS: Final[dict[int, tuple[str, str]]] = {
    400: ("InvalidRequest", "Invalid Request"),
    403: ("AccessDenied", "Access Denied"),
    404: ("NoSuchKey", "The specified key does not exist."),
    429: ("SlowDown", "Please reduce your request rate."),
    500: ("InternalError", "We encountered an internal error. Please try again."),
    502: ("BadGateway", "Bad Gateway"),
    503: ("SlowDown", "Please reduce your request rate."),
    504: ("GatewayTimeout", "Gateway Timeout"),
}


def free_port() -> int:
    """Returns a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def ranged_get(method: str, path: str, headers: Message) -> bool:
    """A ``Match`` for GET requests with a ``Range`` header (the reads of a shard's bytes)."""
    return method == "GET" and headers.get("Range") is not None


def whole_get(method: str, path: str, headers: Message) -> bool:
    """A ``Match`` for GET requests without a ``Range`` header."""
    return method == "GET" and headers.get("Range") is None


@contextlib.contextmanager
def python_http_server(root: str | os.PathLike[str]) -> Iterator[str]:
    """``python -m http.server`` serving ``root`` on 127.0.0.1 (it ignores ``Range``: every
    GET is answered 200 with the whole file); yields its URL and stops it on exit.

    Example::

        with python_http_server(shard_dir) as url:
            src = ferrofeed.TarShards(f"{url}/shard-0.tar")
    """
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", HOST, "--directory", root],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        if not _wait_listening(port, time.monotonic() + 30, lambda: proc.poll() is None):
            raise RuntimeError(f"python -m http.server did not start (exit {proc.poll()})")
        yield f"http://{HOST}:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def _wait_listening(port: int, deadline: float, alive: Callable[[], bool]) -> bool:
    """Waits until something answers HTTP on ``port``; False when ``alive`` turns false."""
    while time.monotonic() < deadline:
        if not alive():
            return False
        conn = http.client.HTTPConnection(HOST, port, timeout=2.0)
        try:
            conn.request("GET", "/")
            conn.getresponse().read()
            return True
        except OSError:
            time.sleep(0.05)
        finally:
            conn.close()
    return False


# --------------------------------------------------------------------------------------------
# S3 (moto)
# --------------------------------------------------------------------------------------------


class S3Server:
    """moto's S3-compatible server in a subprocess on 127.0.0.1, for the duration of a block.

    moto keeps every bucket and object in the server process's memory; they are gone when it
    stops. It does not check request signatures (any access key and secret are accepted), but
    it does refuse anonymous (unsigned) requests to private objects with 403. It answers single
    byte ranges with 206 and ``Content-Range`` (416 ``InvalidRange`` when unsatisfiable), sends
    an ``ETag`` (the MD5 of a single-part object) and ``Last-Modified``, and honours
    ``If-Match`` (412). It closes the connection after every response (no keep-alive).

    Args:
        port: the port to listen on; by default a free one (retried when taken meanwhile).
        startup_timeout: seconds to wait for the server to answer before giving up.

    Example::

        with S3Server() as s3:
            s3.create_bucket("data")
            s3.put("data", "train/shard-0.tar", payload)
            env = {**os.environ, **s3.env()}  # for a client in a subprocess
    """

    def __init__(self, *, port: int | None = None, startup_timeout: float = 20.0) -> None:
        self._requested_port = port
        self._startup_timeout = startup_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._client: Any = None
        self._last_stderr = b""
        self.port = 0

    @property
    def endpoint(self) -> str:
        """The server's URL, ``http://127.0.0.1:PORT``."""
        if self._proc is None:
            raise RuntimeError("S3Server is not running")
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        """The server process's id."""
        if self._proc is None:
            raise RuntimeError("S3Server is not running")
        return self._proc.pid

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """The environment an S3 client needs to reach this server (or ``endpoint``).

        Args:
            endpoint: another URL to point the client at, e.g. a ``FaultProxy`` in front of
                this server; by default the server itself.
        """
        return {
            "AWS_ENDPOINT_URL": endpoint if endpoint is not None else self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
        }

    def start(self) -> Self:
        """Starts the server and waits until it answers (the context manager calls this)."""
        if self._proc is not None:
            raise RuntimeError("S3Server is already running")
        # A free port can be taken between free_port() and moto's bind: then try another.
        attempts = 1 if self._requested_port is not None else 3
        for attempt in range(attempts):
            port = self._requested_port if self._requested_port is not None else free_port()
            if self._spawn(port):
                return self
            code = self._proc.poll() if self._proc is not None else None
            self.stop()
            err = self._last_stderr
            if attempt + 1 == attempts or b"Address already in use" not in err:
                how = (
                    f"exited with status {code}"
                    if code is not None
                    else f"did not answer within {self._startup_timeout:g} s"
                )
                raise RuntimeError(
                    f"moto's S3 server on {HOST}:{port} ({sys.executable} -m moto.server) "
                    f"{how}; its output:\n" + err.decode("utf-8", "replace")[-4000:]
                )
        raise AssertionError("unreachable")

    def _spawn(self, port: int) -> bool:
        # stderr goes to a file, not a pipe: the server logs every request there, and a pipe
        # nobody reads would fill up and block it.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop())
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=self._stderr,
            stderr=self._stderr,
        )
        self.port = port
        proc = self._proc
        deadline = time.monotonic() + self._startup_timeout
        return _wait_listening(port, deadline, lambda: proc.poll() is None)

    def stop(self) -> None:
        """Stops the server: SIGTERM, then SIGKILL after 5 s; waits for the process to end."""
        proc, self._proc = self._proc, None
        self._client = None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._stderr is not None:
            self._stderr.seek(0)
            self._last_stderr = self._stderr.read()
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- boto3 helpers -------------------------------------------------------------------------

    @property
    def client(self) -> Any:
        """A boto3 S3 client for this server (made on first use)."""
        if self._client is None:
            boto3 = importlib.import_module("boto3")
            botocore_config = importlib.import_module("botocore.config")
            self._client = boto3.client(
                "s3",
                endpoint_url=self.endpoint,
                aws_access_key_id=ACCESS_KEY_ID,
                aws_secret_access_key=SECRET_ACCESS_KEY,
                region_name=REGION,
                config=botocore_config.Config(s3={"addressing_style": "path"}),
            )
        return self._client

    def create_bucket(self, name: str) -> None:
        """Creates bucket ``name`` (3 to 63 characters, S3's naming rules)."""
        self.client.create_bucket(Bucket=name)

    def put(self, bucket: str, key: str, data: bytes) -> str:
        """Stores ``data`` as ``bucket/key``; returns its ETag (quoted, as S3 sends it)."""
        etag: str = self.client.put_object(Bucket=bucket, Key=key, Body=data)["ETag"]
        return etag

    def put_file(self, bucket: str, key: str, path: str | os.PathLike[str]) -> str:
        """Stores the file at ``path`` as ``bucket/key`` (one PUT); returns its ETag."""
        with open(path, "rb") as f:
            etag: str = self.client.put_object(Bucket=bucket, Key=key, Body=f)["ETag"]
        return etag

    def delete(self, bucket: str, key: str) -> None:
        """Deletes ``bucket/key`` (no error when it does not exist, as in S3)."""
        self.client.delete_object(Bucket=bucket, Key=key)


# --------------------------------------------------------------------------------------------
# Threaded HTTP/1.1 servers that can be closed with their connections
# --------------------------------------------------------------------------------------------


class _Conn:
    """One client connection of a ``_Server``: its socket and, for the proxy, its upstream."""

    __slots__ = ("sock", "upstream")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.upstream: http.client.HTTPConnection | None = None

    def abort(self) -> None:
        """Shuts both sockets down, so that a thread blocked on either wakes up."""
        for s in (self.sock, self.upstream.sock if self.upstream is not None else None):
            if s is not None:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


class _Server(ThreadingHTTPServer):
    """A ThreadingHTTPServer on 127.0.0.1:0 that tracks its connection threads.

    ``stop()`` stops accepting, shuts every open connection down (keep-alive ones included)
    and joins their threads, so nothing is left running afterwards.
    """

    daemon_threads = True

    def __init__(self, handler: type[BaseHTTPRequestHandler], name: str) -> None:
        super().__init__((HOST, 0), handler)
        self.name = name
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        # Requests answered and (method, path, Range header) of each: under `_lock`.
        self.requests = 0
        self.log: list[tuple[str, str, str | None]] = []
        self._conns: dict[threading.Thread, _Conn] = {}
        self._serve_thread = threading.Thread(
            target=self.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"{name}:{self.server_port} accept",
        )

    def server_bind(self) -> None:
        # HTTPServer.server_bind would look the host name up (getfqdn): not needed here.
        socketserver.TCPServer.server_bind(self)
        self.server_name = HOST
        self.server_port = int(self.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.server_port}"

    def start(self) -> None:
        self._serve_thread.start()

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self._serve_connection,
            args=(request, client_address),
            name=f"{self.name}:{self.server_port} conn",
            daemon=True,
        )
        with self._lock:
            self._conns[thread] = _Conn(request)
        thread.start()

    def _serve_connection(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except OSError:
            pass  # the client went away, or stop() shut the connection down
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            with self._lock:
                conn = self._conns.pop(threading.current_thread(), None)
            if conn is not None and conn.upstream is not None:
                conn.upstream.close()

    def current_conn(self) -> _Conn:
        """The ``_Conn`` of the calling connection thread."""
        with self._lock:
            return self._conns[threading.current_thread()]

    def stop(self) -> None:
        if self.stopping.is_set():
            return
        self.stopping.set()
        if self._serve_thread.is_alive():
            self.shutdown()
            self._serve_thread.join()
        self.server_close()
        with self._lock:
            conns = list(self._conns.items())
        for _, conn in conns:
            conn.abort()
        for thread, _ in conns:
            thread.join(_JOIN_TIMEOUT)
        left = [t.name for t, _ in conns if t.is_alive()]
        if left:
            raise RuntimeError(f"{self.name}: connection threads did not end: {left}")


class _Handler(BaseHTTPRequestHandler):
    """Common settings: HTTP/1.1 keep-alive, no Nagle delay, no request log on stderr."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    # An idle keep-alive connection is closed after this many seconds.
    timeout = 120.0

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def read_body(self) -> bytes:
        """Reads the request body (Content-Length or chunked), so the connection stays usable."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while True:
                size_line = self.rfile.readline(1 << 16)
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(1 << 16).strip():
                        pass  # trailers
                    break
                parts.append(self.rfile.read(size))
                self.rfile.readline(1 << 16)  # the CRLF after the chunk
            return b"".join(parts)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""


# --------------------------------------------------------------------------------------------
# Plain HTTP file server
# --------------------------------------------------------------------------------------------

_RANGE_RE: Final = re.compile(r"^bytes=(\d*)-(\d*)$")


def _parse_range(value: str, size: int) -> tuple[int, int] | Literal["unsatisfiable"] | None:
    """Parses a single byte range against a file of ``size`` bytes.

    Returns the inclusive ``(first, last)`` to send, ``None`` to ignore the header (not a
    single well-formed byte range: the whole file is sent, as RFC 9110 allows), or
    ``"unsatisfiable"`` (416).
    """
    m = _RANGE_RE.match(value.strip())
    if m is None:
        return None
    first_s, last_s = m.groups()
    if not first_s:
        if not last_s:
            return None
        suffix = int(last_s)
        if suffix == 0 or size == 0:
            return "unsatisfiable"
        return max(0, size - suffix), size - 1
    first = int(first_s)
    last = int(last_s) if last_s else size - 1
    if last_s and last < first:
        return None
    if first >= size:
        return "unsatisfiable"
    return first, min(last, size - 1)


class _FileHandler(_Handler):
    server: _FileServer

    def do_GET(self) -> None:
        self._serve(head=False)

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def _error(self, status: int, head: bool) -> None:
        body = f"{status} {http.client.responses.get(status, '')}\n".encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _resolve(self) -> Path | int:
        """The file the request names, or the status to answer (403, 404)."""
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        parts = [p for p in path.split("/") if p]
        if "\x00" in path or any(p in ("..", ".") or "\\" in p for p in parts):
            return 403
        root = self.server.root
        target = root.joinpath(*parts).resolve()
        if not target.is_relative_to(root):
            return 403  # a symlink out of the root
        if not target.is_file():
            return 404
        return target

    def _serve(self, head: bool) -> None:
        self.server.count(self.command, self.path, self.headers.get("Range"))
        self.read_body()
        target = self._resolve()
        if isinstance(target, int):
            self._error(target, head)
            return
        try:
            f = open(target, "rb")  # noqa: SIM115 (closed below, after sendfile)
        except OSError:
            self._error(404, head)
            return
        with f:
            st = os.fstat(f.fileno())
            size = st.st_size
            asked = self.server.ranges and "Range" in self.headers
            rng = _parse_range(self.headers["Range"], size) if asked else None
            if rng == "unsatisfiable":
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if rng is None:
                first, last = 0, size - 1
                self.send_response(200)
            else:
                first, last = rng
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
            length = last - first + 1
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(length))
            self.send_header("Accept-Ranges", "bytes" if self.server.ranges else "none")
            self.send_header("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))
            if self.server.etag:
                tag = f"{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"
                self.send_header("ETag", f'"{hashlib.sha1(tag.encode()).hexdigest()[:20]}"')
            self.end_headers()
            if not head and length > 0:
                self.connection.sendfile(f, first, length)


class _FileServer(_Server):
    def __init__(self, root: Path, etag: bool, ranges: bool) -> None:
        super().__init__(_FileHandler, "HttpFileServer")
        self.root = root
        self.etag = etag
        self.ranges = ranges

    def count(self, method: str, path: str, range_header: str | None) -> None:
        with self._lock:
            self.requests += 1
            self.log.append((method, path, range_header))


class _Running:
    """What a running `HttpFileServer` and `FaultProxy` share: their URL, request counter
    and log, and stopping (also as a context manager)."""

    _server: _Server

    @property
    def url(self) -> str:
        """The server's URL, ``http://127.0.0.1:PORT``."""
        return self._server.url

    @property
    def requests(self) -> int:
        """How many requests it has received."""
        with self._server._lock:
            return self._server.requests

    @property
    def log(self) -> list[tuple[str, str, str | None]]:
        """A copy of (method, path, Range header or None) of every request so far."""
        with self._server._lock:
            return list(self._server.log)

    def close(self) -> None:
        """Stops the server and ends every connection and thread it had."""
        self._server.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class HttpFileServer(_Running):
    """A plain HTTP/1.1 file server for the files under ``root``, on 127.0.0.1 and a free port.

    GET and HEAD; a single byte range (``bytes=a-b``, ``bytes=a-``, ``bytes=-n``) is answered
    206 with ``Content-Range``, an unsatisfiable one 416 (``Content-Range: bytes */SIZE``), any
    other ``Range`` value is ignored (200, the whole file), and with ``ranges=False`` every
    ``Range`` is (as ``python -m http.server`` does). Every file answer has
    ``Content-Length``, ``Last-Modified`` and, unless ``etag=False``, an ``ETag`` that changes
    when the file does. A missing file or a directory is 404 (no listings); a path with
    ``..`` or leading out of ``root`` is 403. Connections are kept alive, each served by its
    own thread.

    Args:
        root: the directory served as ``/``.
        etag: whether responses carry an ``ETag`` (object_store resumes an interrupted body
            only when they do).
        ranges: whether a ``Range`` header is honoured (206) or ignored (200, the whole file).

    Example::

        with HttpFileServer(shard_dir) as http_server:
            url = f"{http_server.url}/shard-0.tar"
    """

    _server: _FileServer

    def __init__(
        self, root: str | os.PathLike[str], *, etag: bool = True, ranges: bool = True
    ) -> None:
        self._server = _FileServer(Path(root).resolve(), etag, ranges)
        self._server.start()


# --------------------------------------------------------------------------------------------
# Fault-injecting reverse proxy
# --------------------------------------------------------------------------------------------


@dataclass
class _Fault:
    kind: FaultKind
    times: int
    match: Match | None
    status: int
    code: str | None
    message: str | None
    seconds: float
    fraction: float
    nbytes: int | None
    rate: float


def _s3_error_body(status: int, code: str | None, message: str | None, path: str) -> bytes:
    default_code, default_message = _S3_ERRORS.get(
        status, (http.client.responses.get(status, "Error").replace(" ", ""), "Error")
    )
    resource = path.split("?", 1)[0]
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{xml_escape(code or default_code)}</Code>"
        f"<Message>{xml_escape(message or default_message)}</Message>"
        f"<Resource>{xml_escape(resource)}</Resource>"
        "<RequestId>FAULTPROXY</RequestId></Error>"
    ).encode()


class _ProxyHandler(_Handler):
    server: _ProxyServer

    def do_GET(self) -> None:
        self._proxy()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = do_OPTIONS = do_PROPFIND = do_GET

    # -- the request ---------------------------------------------------------------------------

    def _proxy(self) -> None:
        srv = self.server
        body = self.read_body()
        fault = srv.take_fault(self.command, self.path, self.headers)
        if srv.latency > 0 and srv.stopping.wait(srv.latency):
            self.close_connection = True
            return
        if fault is None:
            self._forward(body)
        elif fault.kind == "drop":
            self.close_connection = True
        elif fault.kind == "status":
            self._answer_error(fault)
        elif fault.kind == "delay":
            if srv.stopping.wait(fault.seconds):
                self.close_connection = True
                return
            self._forward(body)
        else:
            self._forward(body, fault)

    def _answer_error(self, fault: _Fault) -> None:
        payload = _s3_error_body(fault.status, fault.code, fault.message, self.path)
        self.send_response(fault.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.server.add_bytes(len(payload))
            self.wfile.write(payload)

    def _request_upstream(self, body: bytes) -> http.client.HTTPResponse:
        """Sends the request upstream on this connection's upstream connection.

        A kept-alive upstream connection may have been closed by the server meanwhile: then
        the request is sent once more on a fresh connection.
        """
        conn = self.server.current_conn()
        for attempt in (0, 1):
            if self.server.stopping.is_set():
                raise ConnectionAbortedError("FaultProxy is closing")
            reused = conn.upstream is not None and conn.upstream.sock is not None
            if conn.upstream is None:
                conn.upstream = http.client.HTTPConnection(
                    self.server.upstream_host, self.server.upstream_port, timeout=300.0
                )
            up = conn.upstream
            try:
                if up.sock is None:
                    up.connect()  # (http.client sets TCP_NODELAY)
                up.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in self.headers.items():
                    if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                        up.putheader(name, value)
                if body or self.command in ("PUT", "POST", "PATCH"):
                    up.putheader("Content-Length", str(len(body)))
                up.endheaders(body or None)
                return up.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                up.close()
                if not reused or attempt == 1 or self.server.stopping.is_set():
                    raise
        raise AssertionError("unreachable")

    # -- the response --------------------------------------------------------------------------

    def _forward(self, body: bytes, fault: _Fault | None = None) -> None:
        try:
            resp = self._request_upstream(body)
        except (OSError, http.client.HTTPException) as e:
            if self.server.stopping.is_set():
                self.close_connection = True
                return
            self._bad_gateway(e)
            return
        conn = self.server.current_conn()
        complete = False
        try:
            complete = self._relay(resp, fault)
        except http.client.HTTPException:
            self.close_connection = True  # the upstream broke off its body: so does the client
        finally:
            # An unread rest of the body, or the server closes: a fresh connection next.
            if (not complete or resp.will_close) and conn.upstream is not None:
                conn.upstream.close()
                conn.upstream = None

    def _bad_gateway(self, e: Exception) -> None:
        payload = f"FaultProxy: upstream {self.server.upstream}: {e!r}\n".encode()
        self.send_response(502)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _relay(self, resp: http.client.HTTPResponse, fault: _Fault | None) -> bool:
        """Sends ``resp`` to the client (as ``fault`` says); True when all of it was read."""
        headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP]
        no_body = self.command == "HEAD" or resp.status in (204, 304) or resp.status < 200
        if no_body:
            self._send_head(resp.status, resp.reason, headers)
            resp.read()
            if fault is not None and fault.kind == "truncate":
                self.close_connection = True
            return True
        length = resp.length
        prefix = b""
        if length is None:
            # Chunked or close-delimited upstream: read it all, send it with a length.
            prefix = resp.read()
            length = len(prefix)
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
            headers.append(("Content-Length", str(length)))
        self._send_head(resp.status, resp.reason, headers)

        limit = length
        if fault is not None and fault.kind == "truncate":
            limit = fault.nbytes if fault.nbytes is not None else int(length * fault.fraction)
            limit = max(0, min(limit, length - 1)) if length > 0 else 0
            self.close_connection = True
        rate = fault.rate if fault is not None and fault.kind == "slow" else 0.0

        sent = 0
        if prefix:
            sent = self._send(memoryview(prefix)[:limit], rate)
        else:
            buf = bytearray(_CHUNK)
            view = memoryview(buf)
            while sent < limit:
                n = resp.readinto(view[: min(_CHUNK, limit - sent)])
                if n == 0:
                    self.close_connection = True  # upstream ended early: so does the client
                    return False
                sent += self._send(view[:n], rate)
        return sent == length and resp.isclosed()

    def _send_head(self, status: int, reason: str, headers: list[tuple[str, str]]) -> None:
        self.send_response_only(status, reason)
        for k, v in headers:
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()

    def _send(self, data: memoryview, rate: float) -> int:
        """Writes ``data`` to the client (trickled at ``rate`` bytes/s when > 0)."""
        # Counted before the write: a client that has read the bytes sees them counted.
        if rate <= 0:
            self.server.add_bytes(len(data))
            self.wfile.write(data)
            return len(data)
        step = max(1, int(rate / 20))  # about 20 writes a second
        t0 = time.monotonic()
        done = 0
        while done < len(data):
            piece = data[done : done + step]
            self.server.add_bytes(len(piece))
            self.wfile.write(piece)
            done += len(piece)
            wait = t0 + done / rate - time.monotonic()
            if wait > 0 and self.server.stopping.wait(wait):
                raise ConnectionAbortedError("FaultProxy is closing")
        return done


class _ProxyServer(_Server):
    def __init__(self, upstream: str) -> None:
        split = urllib.parse.urlsplit(upstream)
        if split.scheme != "http" or split.hostname is None:
            raise ValueError(f"FaultProxy forwards to http:// URLs, not {upstream!r}")
        super().__init__(_ProxyHandler, "FaultProxy")
        self.upstream = upstream
        self.upstream_host: str = split.hostname
        self.upstream_port: int = split.port or 80
        self.latency = 0.0
        self.faults: list[_Fault] = []
        self.injected: dict[str, int] = {}
        self.bytes = 0

    def take_fault(self, method: str, path: str, headers: Message) -> _Fault | None:
        """Counts a request; returns the first pending fault that matches it, if any."""
        with self._lock:
            self.requests += 1
            self.log.append((method, path, headers.get("Range")))
            for i, fault in enumerate(self.faults):
                if fault.match is None or fault.match(method, path, headers):
                    fault.times -= 1
                    if fault.times <= 0:
                        del self.faults[i]
                    self.injected[fault.kind] = self.injected.get(fault.kind, 0) + 1
                    return fault
            return None

    def add_bytes(self, n: int) -> None:
        with self._lock:
            self.bytes += n


class FaultProxy(_Running):
    """A fault-injecting HTTP/1.1 reverse proxy on 127.0.0.1, a free port, for ``upstream_url``.

    Each client connection is served by its own thread with one persistent connection to the
    upstream (opened again when the upstream closes it, as moto does after every response).
    Method, path, headers (``Host`` unchanged, so S3 signatures still match) and body are
    forwarded; response bodies are streamed in 1 MiB pieces (hundreds of MB/s on loopback).

    Faults are programmed with ``add``; each applies to the next requests it matches, in the
    order added, ``times`` times each:

    * ``"drop"``: close the client connection without any response.
    * ``"status"``: answer ``status`` without forwarding, with an S3-style XML error body
      (503 ``SlowDown``, 500 ``InternalError``, 403 ``AccessDenied``, 404 ``NoSuchKey``, ...;
      ``code=`` and ``message=`` override them).
    * ``"delay"``: wait ``seconds``, then forward.
    * ``"truncate"``: forward, send the headers (the full ``Content-Length``) and only
      ``fraction`` of the body (or ``nbytes`` bytes), then close the connection.
    * ``"slow"``: forward, trickling the body at ``rate`` bytes/s.

    ``latency`` adds a constant delay to every request. The counters ``requests``,
    ``injected`` (kind -> count) and ``bytes`` (response body bytes sent) are thread-safe.

    Args:
        upstream_url: the server to forward to, ``http://HOST:PORT``.

    Example::

        with S3Server() as s3, FaultProxy(s3.endpoint) as proxy:
            proxy.add("truncate", match=ranged_get, fraction=0.3)
            proxy.add("status", status=503, times=2)
            run_client(env=s3.env(endpoint=proxy.url))
            assert proxy.injected == {"truncate": 1, "status": 2}
    """

    _server: _ProxyServer

    def __init__(self, upstream_url: str) -> None:
        self._server = _ProxyServer(upstream_url)
        self._server.start()

    @property
    def upstream(self) -> str:
        """The URL requests are forwarded to."""
        return self._server.upstream

    @property
    def latency(self) -> float:
        """Seconds added before every request is handled (0 by default)."""
        return self._server.latency

    @latency.setter
    def latency(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"latency must be >= 0, not {seconds}")
        self._server.latency = float(seconds)

    def add(
        self,
        kind: FaultKind,
        *,
        times: int = 1,
        match: Match | None = None,
        status: int = 503,
        code: str | None = None,
        message: str | None = None,
        seconds: float = 1.0,
        fraction: float = 0.5,
        nbytes: int | None = None,
        rate: float = 64 * 1024,
    ) -> None:
        """Programs a fault for the next ``times`` requests that ``match`` accepts.

        Args:
            kind: ``"drop"``, ``"status"``, ``"delay"``, ``"truncate"`` or ``"slow"``.
            times: how many requests it applies to.
            match: a predicate on (method, path, headers); by default every request.
            status: the status a ``"status"`` fault answers.
            code: the S3 error code in its XML body (by default the one S3 uses).
            message: the message in its XML body.
            seconds: how long a ``"delay"`` fault waits.
            fraction: the part of the body a ``"truncate"`` fault sends.
            nbytes: the number of body bytes a ``"truncate"`` fault sends (instead of
                ``fraction``; always fewer than the whole body).
            rate: the bytes per second of a ``"slow"`` fault.
        """
        if kind not in _FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; one of {sorted(_FAULT_KINDS)}")
        if times < 1:
            raise ValueError(f"times must be >= 1, not {times}")
        if not 0.0 <= fraction < 1.0:
            raise ValueError(f"fraction must be in [0, 1), not {fraction}")
        if rate <= 0 or seconds < 0 or (nbytes is not None and nbytes < 0):
            raise ValueError("rate must be > 0, seconds and nbytes >= 0")
        if not 100 <= status <= 599:
            raise ValueError(f"not an HTTP status: {status}")
        fault = _Fault(kind, times, match, status, code, message, seconds, fraction, nbytes, rate)
        with self._server._lock:
            self._server.faults.append(fault)

    def clear(self) -> None:
        """Removes every pending fault (the counters are kept)."""
        with self._server._lock:
            self._server.faults.clear()

    @property
    def pending(self) -> int:
        """How many faulted requests are still programmed."""
        with self._server._lock:
            return sum(f.times for f in self._server.faults)

    @property
    def injected(self) -> dict[str, int]:
        """A copy of the number of faults injected, by kind."""
        with self._server._lock:
            return dict(self._server.injected)

    @property
    def bytes(self) -> int:
        """Response body bytes sent to clients (error bodies and partial bodies included)."""
        with self._server._lock:
            return self._server.bytes


def server_threads(url: str | None = None) -> list[str]:
    """Names of the live threads of ``HttpFileServer`` and ``FaultProxy`` objects.

    Args:
        url: only those of the server at this URL (``.url``); by default those of all.

    Names are ``"KIND:PORT accept"`` (the thread accepting connections) and
    ``"KIND:PORT conn"`` (one per open connection).
    """
    names = [
        t.name
        for t in threading.enumerate()
        if t.name.startswith(("HttpFileServer:", "FaultProxy:"))
    ]
    if url is None:
        return names
    port = url.rsplit(":", 1)[1]
    return [n for n in names if n.split(" ", 1)[0].endswith(f":{port}")]
