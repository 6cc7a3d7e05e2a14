"""The training job over tar shards in object storage, against the same shards on local disk.

``make compare-remote`` runs it (``make compare`` too, after benches/compare.py);
directly: ``python benches/remote_compare.py [--n 1600] [--rounds 3] [--epochs 5] [--quick]``.
Results: ``--out-dir`` (default benches/results/; with ``--quick``,
bench-results/remote-compare-quick/) gets remote_compare.json, remote_compare.md (the table
that BENCHMARKS.md quotes, "Shards in object storage") and remote_compare.png.

Data: the JPEGs of benches/compare.py's shards job (``_common.make_jpegs(varied=True)``,
real photos from scikit-image's wheel, ``--n`` of them from ``--seed``) packed in order as
WebDataset tar shards of ``--shard-size`` images (``_common.pack_tar_shards``; at least 8
shards), once, in /dev/shm. The same shard files are then served by:

- moto's S3 server (``tests/objstore.py``'s ``S3Server``, a subprocess on 127.0.0.1), a
  bucket holding them, read as ``s3://BUCKET/train-*.tar`` (one listing) with the
  credentials and endpoint of ``S3Server.env()`` in the environment;
- a plain HTTP/1.1 file server (``HttpFileServer``), read as
  ``http://127.0.0.1:PORT/train-NNNNNN.tar``;
- one ``FaultProxy`` in front of each of them adding 20 ms (``--latency``) before every
  request is forwarded, and nothing else.

The HTTP server and both proxies run in one server process of their own (`ServerProcess`),
moto in another; all of them on the same CPUs as the loader.

Job: benches/compare.py's shards job, the training transform (RandomResizedCrop 224 +
random horizontal flip), batches of 32, shuffled within a window of ``--shuffle-window``
samples. Configurations (`CONFIGS`), each in a fresh interpreter that imports torch first:

- ``local``: ferrofeed's native chain over ``TarShards(<local paths>)`` (the baseline),
  ``DataLoader(source, 32, shuffle=True, seed=0, shuffle_window=W,
  transform=ops.decode_image(size=224, crop="random", flip="random"), image="jpg",
  label="cls", num_threads=2)``, as compare.py's ``ferrofeed-tar``;
- ``s3``: the same over ``TarShards("s3://...")``, no ``cache_dir`` (every epoch fetches
  every shard again), the default ``prefetch_bytes``;
- ``s3-latency``: the same through the proxy (``storage_options={"endpoint": proxy.url}``);
- ``s3-latency-cache``: the same with a fresh ``cache_dir`` per run (counting the shards
  fetches them into it, so every epoch reads them from the cache);
- ``webdataset-local``, ``webdataset-http``, ``webdataset-http-latency``: compare.py's
  webdataset peer (``webdataset_loader``: ``WebDataset(urls, shardshuffle=..., seed=0)
  .shuffle(W).decode("pil").to_tuple("jpg", "cls")`` and the Pillow training transform, in
  PyTorch's DataLoader with 2 workers) over the local paths, and over the HTTP URLs, which
  webdataset opens with its ``curl`` pipe (one GET per shard), directly and through the
  proxy.

Each run builds the loader (for ferrofeed, counting the shards included: each run has a
node index directory of its own, ``FERROFEED_CACHE_DIR``, so no run reuses another's
listing or counts) and runs ``--epochs`` epochs: the first is timed on its own (from
building the source; "first epoch"), the others give the steady images/s. CPU: the loader's
process tree, as compare.py takes it (``getrusage`` of the interpreter and its reaped
workers, from building the loader to its end), and the servers': moto's process and the
server process (``/proc/PID/stat``) over the same run. For ferrofeed's remote configurations,
``loader.stats()["remote"]`` after each epoch (requests, retries, bytes, fetched shards,
cache hits, ``wait_s``: how long the reader waited for a shard's bytes) and the process's
counters around building the source (``_core._remote_stats()``: the listing and counting).
The configurations take turns, ``--rounds`` rounds with the order rotated each round;
ratios are taken round by round (the runs of one round are minutes apart), then their
median and range. The issue's target: ``s3-latency`` steady images/s within 10% of
``local`` (a ratio of at least 0.90).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import importlib.util
import json
import multiprocessing
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import (
    CROP,
    child_entry,
    cpu_children,
    cpu_self,
    fmt,
    fmt_ratio,
    make_jpegs,
    med_range,
    native_op,
    pack_tar_shards,
    run_fresh,
    shutdown_workers,
    tree_pss,
)
from bench_machine import cpu_model

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))  # objstore: the servers the tests use

DEFAULT_OUT = REPO_ROOT / "benches" / "results"
QUICK_OUT = REPO_ROOT / "bench-results" / "remote-compare-quick"
NAME = "remote_compare"
BATCH = 32
MIB = 1 << 20
BUCKET = "ferrofeed-bench"
MIN_SHARDS = 8
TARGET = 0.90  # the issue's: within 10% of local disk


@dataclass(frozen=True)
class Config:
    """One configuration: which loader, where the shards are, how they are reached."""

    key: str
    label: str
    family: str  # ferrofeed | webdataset
    where: str  # local | s3 | http
    latency: bool = False
    cache: bool = False
    baseline: str = ""  # the configuration its images/s are set against, round by round


CONFIGS = [
    Config("local", "ferrofeed, local disk", "ferrofeed", "local"),
    Config("s3", "ferrofeed, S3 (moto)", "ferrofeed", "s3", baseline="local"),
    Config(
        "s3-latency", "ferrofeed, S3 + 20 ms/request", "ferrofeed", "s3", True, baseline="local"
    ),
    Config(
        "s3-latency-cache",
        "ferrofeed, S3 + 20 ms/request, cache_dir",
        "ferrofeed",
        "s3",
        True,
        True,
        baseline="local",
    ),
    Config("webdataset-local", "webdataset, local disk", "webdataset", "local"),
    Config(
        "webdataset-http",
        "webdataset, HTTP (curl)",
        "webdataset",
        "http",
        baseline="webdataset-local",
    ),
    Config(
        "webdataset-http-latency",
        "webdataset, HTTP (curl) + 20 ms/request",
        "webdataset",
        "http",
        True,
        baseline="webdataset-local",
    ),
]
BY_KEY = {c.key: c for c in CONFIGS}
# ferrofeed against webdataset where both read the same place the same way.
PAIRS = [
    ("local", "webdataset-local"),
    ("s3", "webdataset-http"),
    ("s3-latency", "webdataset-http-latency"),
]
COLORS = {"ferrofeed": "#7570b3", "webdataset": "#d95f02"}


# --- the child: one configuration in a fresh interpreter ---------------------------------------


def child_main(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one configuration in this fresh interpreter; return its figures."""
    cfg = BY_KEY[spec["config"]]
    # This run's own node index (listing and counts) and nothing from another run.
    os.environ["FERROFEED_CACHE_DIR"] = spec["index_dir"]
    if importlib.util.find_spec("torch") is not None:
        import torch  # a training script has it; the memory then compares loaders

        torch.set_num_threads(1)
    if cfg.family == "ferrofeed":
        import ferrofeed
        from ferrofeed import _core
    else:
        import webdataset  # noqa: F401
        from _compare_loaders import webdataset_loader
    gc.collect()
    n, me = spec["n"], os.getpid()
    pss_before = tree_pss(me)
    cpu_before = cpu_self() + cpu_children()
    t0 = time.perf_counter()
    remote_source: dict[str, Any] = {}
    if cfg.family == "ferrofeed":
        kwargs: dict[str, Any] = {}
        if cfg.where != "local":
            kwargs["storage_options"] = spec["storage_options"]
            if cfg.cache:
                kwargs["cache_dir"] = spec["cache_dir"]
            before = _core._remote_stats()
        source = ferrofeed.TarShards(spec["urls"], **kwargs)
        if cfg.where != "local":
            after = _core._remote_stats()
            remote_source = {k: after[k] - before[k] for k in after}
        loader: Any = ferrofeed.DataLoader(
            source,
            BATCH,
            shuffle=True,
            seed=spec["seed"],
            shuffle_window=spec["window"],
            transform=native_op("train"),
            image="jpg",
            label="cls",
            num_threads=2,
        )
    else:
        shards = {"tar": spec["urls"], "window": spec["window"]}
        loader = webdataset_loader({"shards": shards}, 2, spec["seed"])
    source_s = time.perf_counter() - t0
    ttfb = 0.0
    epoch_s: list[float] = []
    epoch_first_batch_s: list[float] = []  # from each epoch's start to its first batch
    remote_epochs: list[dict[str, Any]] = []
    pss_epoch_end: list[int] = []
    for epoch in range(spec["epochs"]):
        t = time.perf_counter() if epoch else t0
        count = 0
        for batch in loader:
            images = batch[0]
            if not count:
                epoch_first_batch_s.append(time.perf_counter() - t)
            if not ttfb:
                ttfb = time.perf_counter() - t0
                if tuple(images.shape[1:]) != (CROP, CROP, 3) or "uint8" not in str(images.dtype):
                    raise AssertionError(f"{cfg.key}: batches of {images.shape} {images.dtype}")
            count += len(images)
            del batch, images
        epoch_s.append(time.perf_counter() - t)
        pss_epoch_end.append(tree_pss(me))
        if cfg.family == "ferrofeed" and cfg.where != "local":
            remote_epochs.append(dict(loader.stats()["remote"]))  # since the loader was made
        if count != n:
            raise AssertionError(f"{cfg.key}: epoch {epoch} gave {count} images, not {n}")
    shutdown_workers(loader)
    del loader
    gc.collect()
    multiprocessing.active_children()  # reaps the workers that ended
    cpu_loader = cpu_self() + cpu_children() - cpu_before
    # Per epoch, from the counters since the loader was made.
    per_epoch = [
        {k: v - (remote_epochs[i - 1][k] if i else 0) for k, v in r.items()}
        for i, r in enumerate(remote_epochs)
    ]
    steady = epoch_s[1:]
    return {
        "config": cfg.key,
        "source_s": source_s,
        "ttfb_s": ttfb,
        "epoch_s": epoch_s,
        "epoch_first_batch_s": epoch_first_batch_s,
        "images_per_s": n * len(steady) / sum(steady),
        "first_epoch_images_per_s": n / epoch_s[0],
        "images": n * len(epoch_s),
        "cpu_loader_s": cpu_loader,
        "pss_before_loader": pss_before,
        "pss_epoch_end": pss_epoch_end,
        "remote_source": remote_source,
        "remote_epochs": per_epoch,
    }


# --- the parent: data, servers, rounds ---------------------------------------------------------


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cargo_profile() -> str | None:
    """The cargo profile whose build ferrofeed's extension is (the same bytes as
    ``target/<profile>/libferrofeed.so``), when this tree built it; else None."""
    try:
        import ferrofeed

        so = Path(ferrofeed._core.__file__).read_bytes()
    except (ImportError, OSError, AttributeError):
        return None
    for lib in sorted((REPO_ROOT / "target").glob("*/libferrofeed.so")):
        try:
            if lib.stat().st_size == len(so) and lib.read_bytes() == so:
                return lib.parent.name
        except OSError:
            continue
    return None


def build_info() -> dict[str, Any]:
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, ferrofeed; print(json.dumps({'build_profile': "
            "ferrofeed._core.build_profile, 'native_build': "
            "ferrofeed.build_info()['native_build']}))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    info: dict[str, Any] = json.loads(probe.stdout)
    info["cargo_profile"] = cargo_profile()
    return info


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("ferrofeed", "numpy", "torch", "pillow", "webdataset", "moto", "matplotlib"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    curl = shutil.which("curl")
    if curl:
        first = subprocess.run([curl, "--version"], capture_output=True, text=True).stdout
        out["curl"] = (first.splitlines() or [""])[0]
    return out


def available(cfg: Config) -> tuple[bool, str]:
    """Whether ``cfg`` can run here, and if not, why (said in the results)."""
    if cfg.family == "webdataset":
        if importlib.util.find_spec("webdataset") is None:
            return False, "webdataset is not installed"
        if importlib.util.find_spec("torch") is None:
            return False, "torch is not installed"
        if cfg.where == "http" and shutil.which("curl") is None:
            return False, "no curl (webdataset's HTTP opener runs it)"
    if cfg.where == "s3" and importlib.util.find_spec("moto") is None:
        return False, "moto is not installed (pip install 'moto[server]' boto3)"
    return True, ""


def run_one(
    cfg: Config,
    base: dict[str, Any],
    servers: dict[str, Any],
    workdir: str,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """One configuration in a fresh interpreter, with the servers' CPU over the run."""
    run_dir = tempfile.mkdtemp(prefix=f"{cfg.key}-", dir=workdir)
    spec = {
        **base,
        "config": cfg.key,
        "index_dir": os.path.join(run_dir, "index"),
        "cache_dir": os.path.join(run_dir, "cache"),
    }
    front: ServerProcess = servers["front"]
    if cfg.where == "local":
        spec["urls"] = base["paths"]
    elif cfg.where == "s3":
        spec["urls"] = f"s3://{BUCKET}/train-*.tar"
        spec["storage_options"] = {"endpoint": front.urls["s3_proxy"]} if cfg.latency else {}
    else:
        root = front.urls["http_proxy" if cfg.latency else "http"]
        spec["urls"] = [f"{root}/{os.path.basename(p)}" for p in base["paths"]]
    moto_pid = servers["s3"].pid if servers.get("s3") else None
    moto_before = proc_cpu(moto_pid) if moto_pid else 0.0
    front_before = proc_cpu(front.pid)
    requests_before = front.requests()
    r = run_fresh(__file__, spec, run_dir, args.timeout, pss_interval=args.pss_interval)
    r["server_cpu_s"] = {
        "moto": (proc_cpu(moto_pid) - moto_before) if moto_pid else 0.0,
        "http_and_proxies": proc_cpu(front.pid) - front_before,
    }
    after = front.requests()
    r["server_requests"] = {k: after[k] - requests_before[k] for k in after}
    r["cpu_s_per_1000"] = r["cpu_loader_s"] / r["images"] * 1000
    r["server_cpu_s_per_1000"] = sum(r["server_cpu_s"].values()) / r["images"] * 1000
    samples = [v for _, v in r.pop("pss_series")] + r["pss_epoch_end"]
    r["peak_pss"] = max(samples)
    r["peak_pss_added"] = r["peak_pss"] - r["pss_before_loader"]
    shutil.rmtree(run_dir, ignore_errors=True)
    return r


SERVERS_FLAG = "--_servers"


class ServerProcess:
    """The HTTP file server and both latency proxies, in a process of their own (this script
    with `SERVERS_FLAG`), so that their CPU time is theirs alone (``/proc/PID/stat``).

    ``urls``: ``http``, ``http_proxy`` (in front of it) and ``s3_proxy`` (in front of moto,
    when there is one); ``requests()``: how many requests each has received so far.
    """

    def __init__(self, shard_dir: str, s3_endpoint: str | None, latency: float) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, __file__, SERVERS_FLAG, shard_dir, s3_endpoint or "", str(latency)],
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


def cores(r: dict[str, Any]) -> tuple[float, float]:
    """The CPUs the loader's process tree and the servers kept busy over a run, on average:
    their CPU seconds over the run's wall time (building the source and every epoch)."""
    wall = sum(r["epoch_s"])
    return r["cpu_loader_s"] / wall, sum(r["server_cpu_s"].values()) / wall


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    for r in runs:
        r["loader_cores"], r["server_cores"] = cores(r)
        r["total_cpu_s_per_1000"] = r["cpu_s_per_1000"] + r["server_cpu_s_per_1000"]
    out: dict[str, Any] = {
        key: med_range([r[key] for r in runs])
        for key in (
            "images_per_s",
            "first_epoch_images_per_s",
            "ttfb_s",
            "cpu_s_per_1000",
            "server_cpu_s_per_1000",
            "total_cpu_s_per_1000",
            "loader_cores",
            "server_cores",
            "peak_pss",
            "peak_pss_added",
        )
    }
    steady = [e for r in runs for e in r["remote_epochs"][1:]]
    if steady:  # ferrofeed's remote counters per steady epoch, over every run
        out["remote_steady_epoch"] = {k: med_range([e[k] for e in steady]) for k in steady[0]}
        out["remote_first_epoch"] = {
            k: med_range([r["remote_epochs"][0][k] for r in runs]) for k in steady[0]
        }
        out["remote_source"] = {
            k: med_range([r["remote_source"][k] for r in runs]) for k in runs[0]["remote_source"]
        }
    return out


def per_round(
    runs: dict[str, list[dict[str, Any]]], a: str, b: str, key: str
) -> list[float] | None:
    """``a``'s ``key`` over ``b``'s, round by round (None when either did not run)."""
    rounds = min(len(runs.get(a, [])), len(runs.get(b, [])))
    if not rounds:
        return None
    return [runs[a][i][key] / runs[b][i][key] for i in range(rounds)]


def ratios(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each configuration against its baseline, and ferrofeed against webdataset."""
    out: dict[str, Any] = {}
    pairs = [(c.key, c.baseline) for c in CONFIGS if c.baseline] + PAIRS
    for a, b in pairs:
        steady = per_round(runs, a, b, "images_per_s")
        if steady is None:
            continue
        first = per_round(runs, a, b, "first_epoch_images_per_s")
        cpu = per_round(runs, a, b, "cpu_s_per_1000")
        total = per_round(runs, a, b, "total_cpu_s_per_1000")
        assert first is not None
        assert cpu is not None
        assert total is not None
        out[f"{a} vs {b}"] = {
            "steady_per_round": steady,
            "steady": med_range(steady),
            "first_epoch_per_round": first,
            "first_epoch": med_range(first),
            # CPU per image, a's over b's (above 1: a takes more): the loader's alone, and
            # the loader's with the servers'.
            "cpu_per_image": med_range(cpu),
            "cpu_per_image_with_servers": med_range(total),
        }
    return out


# --- report ------------------------------------------------------------------------------------


def markdown(results: dict[str, Any]) -> str:
    """The tables BENCHMARKS.md quotes, from the results."""
    s = results["summary"]
    build = results["build"]
    lines = [
        f"#### training (RandomResizedCrop 224 + random flip) from tar shards in object storage, "
        f"on {results['cpu']}",
        "",
        f"{results['machine']}; ferrofeed build: {build['build_profile']} "
        f"(cargo profile {build.get('cargo_profile') or 'unknown'}, {build['native_build']}); "
        f"{results['data']['n']} JPEGs in {results['data']['shards']} tar shards of "
        f"{results['data']['per_shard']} ({results['data']['mean_tar_bytes'] / 1e6:.1f} MB "
        f"each); {results['args']['rounds']} rounds of {results['args']['epochs']} epochs; "
        f"load average {results['loadavg_start']} at the start, {results['loadavg_end']} "
        "at the end.",
        "",
        "| configuration | steady images/s | first epoch images/s | first batch (ms) "
        "| CPU s / 1000 images, loader | CPU s / 1000 images, servers "
        "| CPUs busy, loader + servers | peak PSS (MiB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, st in s.items():
        label = BY_KEY[key].label
        label = f"**{label}**" if BY_KEY[key].family == "ferrofeed" else label
        lines.append(
            f"| {label} | {fmt(st['images_per_s'])} | {fmt(st['first_epoch_images_per_s'])} "
            f"| {fmt(st['ttfb_s'], 1e3)} | {fmt(st['cpu_s_per_1000'], digits=2)} "
            f"| {fmt(st['server_cpu_s_per_1000'], digits=2)} "
            f"| {st['loader_cores']['median']:.2f} + {st['server_cores']['median']:.2f} "
            f"| {fmt(st['peak_pss'], 1 / MIB)} |"
        )
    lines += [
        "",
        "Per round, then median and range (images/s: above 1, the first is faster; CPU per "
        "image: the first's over the second's, above 1, the first takes more):",
        "",
        "| configuration | against | steady images/s | per round | first epoch images/s "
        "| CPU per image, loader | CPU per image, loader + servers |",
        "|---|---|---:|---|---:|---:|---:|",
    ]
    for pair, r in results["ratios"].items():
        a, b = pair.split(" vs ")
        rounds = ", ".join(f"{x:.3f}" for x in r["steady_per_round"])
        lines.append(
            f"| {BY_KEY[a].label} | {BY_KEY[b].label} | {fmt_ratio(r['steady'])} | {rounds} "
            f"| {fmt_ratio(r['first_epoch'])} | {fmt_ratio(r['cpu_per_image'])} "
            f"| {fmt_ratio(r['cpu_per_image_with_servers'])} |"
        )
    remote = [k for k in s if "remote_steady_epoch" in s[k]]
    if remote:
        lines += [
            "",
            'ferrofeed\'s `loader.stats()["remote"]`, per epoch (median and range over the '
            "rounds; steady: the epochs after the first), and around building the source "
            "(listing and counting the shards):",
            "",
            "| configuration | when | requests | retries | MiB received | shards fetched "
            "| cache hits | wait_s |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for key in remote:
            for when, field in (
                ("source", "remote_source"),
                ("first epoch", "remote_first_epoch"),
                ("steady epoch", "remote_steady_epoch"),
            ):
                st = s[key][field]
                lines.append(
                    f"| {BY_KEY[key].label} | {when} | {fmt(st['requests'])} "
                    f"| {fmt(st['retries'])} | {fmt(st['bytes'], 1 / MIB, 1)} "
                    f"| {fmt(st['fetched'])} | {fmt(st['cache_hits'])} "
                    f"| {fmt(st['wait_s'], digits=3)} |"
                )
    t = results.get("target")
    if t:
        lines += [
            "",
            f"Target (issue 26): S3 + 20 ms/request steady images/s at least {TARGET:.2f}x "
            f"local disk: {fmt_ratio(t['ratio'])} per round {t['per_round']}: "
            f"**{'met' if t['met'] else 'missed'}** (median).",
        ]
    if results["not_run"]:
        lines += ["", "Not run:", ""]
        lines += [f"- {BY_KEY[k].label}: {why}" for k, why in results["not_run"].items()]
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    """Bars of steady and first-epoch images/s and CPU per image (loader + servers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = results["summary"]
    keys = [c.key for c in CONFIGS if c.key in s][::-1]
    panels = [
        ("images_per_s", "steady images/s, epochs after the first (higher is better)"),
        ("first_epoch_images_per_s", "first epoch images/s, building the source included"),
        ("cpu", "CPU s per 1000 images: loader tree + servers (hatched) (lower is better)"),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(15, 0.45 * len(keys) + 1.9), sharey=True)
    for ax, (metric, xlabel) in zip(axes, panels, strict=True):
        top = 0.0
        for y, key in enumerate(keys):
            color = COLORS[BY_KEY[key].family]
            if metric == "cpu":
                a = s[key]["cpu_s_per_1000"]["median"]
                b = s[key]["server_cpu_s_per_1000"]["median"]
                ax.barh(y, a, 0.7, color=color)
                ax.barh(y, b, 0.7, left=a, color=color, alpha=0.45, hatch="//")
                ax.text(a + b, y, f" {a:.2f} + {b:.2f}", va="center", fontsize=7)
                top = max(top, a + b)
                continue
            st = s[key][metric]
            err = [[st["median"] - st["min"]], [st["max"] - st["median"]]]
            ax.barh(y, st["median"], 0.7, xerr=err, color=color, capsize=2, error_kw={"lw": 0.8})
            ax.text(st["max"], y, f" {st['median']:,.0f}", va="center", fontsize=7)
            top = max(top, st["max"])
        ax.set_xlim(0, top * 1.25)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(keys)), [BY_KEY[k].label for k in keys], fontsize=8)
    for tick, key in zip(axes[0].get_yticklabels(), keys, strict=True):
        if BY_KEY[key].family == "ferrofeed":
            tick.set_fontweight("bold")
    build = results["build"]
    fig.suptitle(
        "training (RandomResizedCrop 224 + flip) from tar shards: local disk, moto S3, HTTP, "
        f"with and without 20 ms/request; median of {results['args']['rounds']} rounds, "
        f"bars: min-max\n{results['machine']}; ferrofeed {build['build_profile']} "
        f"(cargo profile {build.get('cargo_profile') or 'unknown'})",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def report(results: dict[str, Any], out_dir: Path) -> None:
    """Write ``remote_compare.{json,md,png}`` into ``out_dir``; print the tables."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{NAME}.json").write_text(json.dumps(results, indent=1))
    md = markdown(results)
    (out_dir / f"{NAME}.md").write_text(md + "\n")
    written = [out_dir / f"{NAME}.md"]
    if importlib.util.find_spec("matplotlib") is not None:
        plot(results, out_dir / f"{NAME}.png")
        written.append(out_dir / f"{NAME}.png")
    print()
    print(md)
    print("written: " + ", ".join(str(p) for p in [out_dir / f"{NAME}.json", *written]))


# --- main --------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=None, help="JPEGs (default 1600; --quick: 256)")
    p.add_argument("--shard-size", type=int, default=None, help="images per shard (default 200)")
    p.add_argument("--shuffle-window", type=int, default=1000, help="samples (default 1000)")
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 3; --quick: 1)")
    p.add_argument("--epochs", type=int, default=5, help="epochs per run, the first timed alone")
    p.add_argument("--latency", type=float, default=0.020, help="seconds added per request")
    p.add_argument("--configs", default="all", help=f"subset of {','.join(BY_KEY)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pss-interval", type=float, default=1.0, help="PSS sampling, seconds")
    p.add_argument("--timeout", type=float, default=900.0, help="per run, seconds")
    p.add_argument("--quick", action="store_true", help="a short run: small sizes, 1 round")
    p.add_argument("--out-dir", type=Path, default=None, help="where results go")
    p.add_argument(
        "--replot", type=Path, default=None, help="only redo the summaries and report of a JSON"
    )
    args = p.parse_args(argv)
    for name, full, quick in (("n", 1600, 256), ("shard_size", 200, 32), ("rounds", 3, 1)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.out_dir is None:
        args.out_dir = QUICK_OUT if args.quick else DEFAULT_OUT
    if args.configs == "all":
        args.configs = list(BY_KEY)
    else:
        args.configs = [k.strip() for k in args.configs.split(",") if k.strip()]
        if unknown := set(args.configs) - set(BY_KEY):
            p.error(f"unknown configurations: {sorted(unknown)}")
    if args.epochs < 2 or args.rounds < 1 or args.shard_size < 1:
        p.error("--epochs must be >= 2, --rounds and --shard-size >= 1")
    if -(-args.n // args.shard_size) < MIN_SHARDS:
        p.error(f"--n / --shard-size must give at least {MIN_SHARDS} shards")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv if argv is None else argv
    if child_entry(argv, child_main):
        return 0
    if len(argv) == 5 and argv[1] == SERVERS_FLAG:
        servers_main(argv[2], argv[3], float(argv[4]))
        return 0
    args = parse_args(argv[1:])
    if args.replot:
        report(analyse(json.loads(args.replot.read_text())), args.out_dir)
        return 0
    from objstore import S3Server

    configs, not_run = [], {}
    for key in args.configs:
        ok, why = available(BY_KEY[key])
        if ok:
            configs.append(BY_KEY[key])
        else:
            not_run[key] = why
            print(f"skipped {key}: {why}", flush=True)
    results: dict[str, Any] = {
        "cpu": cpu_model(),
        "machine": f"{cpu_model()}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB",
        "build": build_info(),
        "versions": versions(),
        "command": "python benches/remote_compare.py " + " ".join(argv[1:]),
        "args": {k: str(v) for k, v in vars(args).items()},
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "not_run": not_run,
    }
    runs: dict[str, list[dict[str, Any]]] = {c.key: [] for c in configs}
    workdir = tempfile.mkdtemp(
        prefix="ferrofeed-remote-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    )
    saved_env = dict(os.environ)
    servers: dict[str, Any] = {}
    try:
        t = time.perf_counter()
        files, info = make_jpegs(os.path.join(workdir, "images"), args.n, args.seed, varied=True)
        paths = pack_tar_shards(files, os.path.join(workdir, "shards"), args.shard_size)
        results["data"] = {
            **info,
            "n": args.n,
            "shards": len(paths),
            "per_shard": args.shard_size,
            "mean_tar_bytes": round(sum(os.path.getsize(p) for p in paths) / len(paths)),
            "made_s": round(time.perf_counter() - t, 1),
        }
        print(
            f"{args.n} JPEGs in {len(paths)} tar shards of {args.shard_size} "
            f"({results['data']['mean_tar_bytes'] / 1e6:.1f} MB each) in "
            f"{results['data']['made_s']} s; load average {results['loadavg_start']}",
            flush=True,
        )
        s3_endpoint = None
        if any(c.where == "s3" for c in configs):
            servers["s3"] = S3Server().start()
            servers["s3"].create_bucket(BUCKET)
            for p in paths:
                servers["s3"].put_file(BUCKET, os.path.basename(p), p)
            s3_endpoint = servers["s3"].endpoint
            os.environ.update(servers["s3"].env())  # the children's credentials and endpoint
        servers["front"] = ServerProcess(os.path.dirname(paths[0]), s3_endpoint, args.latency)
        base = {
            "paths": paths,
            "n": args.n,
            "seed": args.seed,
            "epochs": args.epochs,
            "window": args.shuffle_window,
        }
        for rnd in range(args.rounds):
            shift = rnd % len(configs)
            for cfg in configs[shift:] + configs[:shift]:
                r = run_one(cfg, base, servers, workdir, args)
                runs[cfg.key].append(r)
                wait = sum(e["wait_s"] for e in r["remote_epochs"][1:])
                print(
                    f"[round {rnd + 1}/{args.rounds}] {cfg.key:24s} "
                    f"steady {r['images_per_s']:6.0f} images/s, first epoch "
                    f"{r['first_epoch_images_per_s']:6.0f}, "
                    f"first batch {r['ttfb_s'] * 1e3:5.0f} ms, "
                    f"CPU {r['cpu_s_per_1000']:.2f} + servers {r['server_cpu_s_per_1000']:.2f} "
                    f"s/1000, peak PSS {r['peak_pss'] / MIB:4.0f} MiB"
                    + (f", steady wait_s {wait:.3f}" if r["remote_epochs"] else ""),
                    flush=True,
                )
    finally:
        if "front" in servers:
            servers["front"].close()
        if "s3" in servers:
            servers["s3"].stop()
        os.environ.clear()
        os.environ.update(saved_env)
        shutil.rmtree(workdir, ignore_errors=True)
    results["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    results["runs"] = runs
    args.out_dir.mkdir(parents=True, exist_ok=True)
    report(analyse(results), args.out_dir)
    return 0


def analyse(results: dict[str, Any]) -> dict[str, Any]:
    """Add the summaries, ratios and the target's verdict to ``results`` (from its runs)."""
    runs = results["runs"]
    results["summary"] = {key: summarize(rs) for key, rs in runs.items() if rs}
    results["ratios"] = ratios(runs)
    target = results["ratios"].get("s3-latency vs local")
    if target:
        results["target"] = {
            "ratio": target["steady"],
            "per_round": [round(x, 3) for x in target["steady_per_round"]],
            "met": target["steady"]["median"] >= TARGET,
        }
    return results


if __name__ == "__main__":
    sys.exit(main())
