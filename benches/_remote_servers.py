"""The servers of benches/remote_compare.py in a process of their own: the HTTP file server
and a latency proxy in front of it and of moto's S3 server (``tests/objstore.py``'s
``HttpFileServer`` and ``FaultProxy``), so that their CPU time is theirs alone.

Run as ``python benches/_remote_servers.py SHARD_DIR S3_ENDPOINT LATENCY`` by `ServerProcess`
(``S3_ENDPOINT`` empty: no S3 proxy).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # objstore
CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # after (comm)
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class ServerProcess:
    """The HTTP file server and both latency proxies, in a process of their own (this
    module run as a script), so that their CPU time is theirs alone (``/proc/PID/stat``).

    ``urls``: ``http``, ``http_proxy`` (in front of it) and ``s3_proxy`` (in front of moto,
    when there is one); ``requests()``: how many requests each has received so far.
    """

    def __init__(self, shard_dir: str, s3_endpoint: str | None, latency: float) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, __file__, shard_dir, s3_endpoint or "", str(latency)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            self._proc.wait()
            raise RuntimeError(f"the server process exited with code {self._proc.returncode}")
        self.urls: dict[str, str] = json.loads(line)
        self.pid = self._proc.pid

    def requests(self) -> dict[str, int]:
        assert self._proc.stdin is not None
        assert self._proc.stdout is not None
        self._proc.stdin.write("requests\n")
        self._proc.stdin.flush()
        counts: dict[str, int] = json.loads(self._proc.stdout.readline())
        return counts

    def close(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()  # the process closes its servers and ends
        try:
            self._proc.wait(30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def servers_main(shard_dir: str, s3_endpoint: str, latency: float) -> None:
    """The server process: start the servers, print their URLs, answer ``requests``."""
    from objstore import FaultProxy, HttpFileServer

    with contextlib.ExitStack() as stack:
        http = stack.enter_context(HttpFileServer(shard_dir))
        servers = {"http": http, "http_proxy": stack.enter_context(FaultProxy(http.url))}
        if s3_endpoint:
            servers["s3_proxy"] = stack.enter_context(FaultProxy(s3_endpoint))
        for key in ("http_proxy", "s3_proxy"):
            if key in servers:
                servers[key].latency = latency
        print(json.dumps({k: v.url for k, v in servers.items()}), flush=True)
        for line in sys.stdin:
            if line.strip() == "requests":
                print(json.dumps({k: v.requests for k, v in servers.items()}), flush=True)


if __name__ == "__main__":
    servers_main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
