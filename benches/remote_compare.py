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
- ``s3-latency-index``: ``s3-latency`` with the bucket's sample index
  (``ferrofeed.index_shards`` run over the bucket once; ``TarShards(..., index=True)``): no
  counting pass, and each window fetches only its samples' byte ranges (the other S3
  configurations pass ``index=False``);
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
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _rounds
from _common import make_images, native_op, scratch_dir, shutdown_workers
from _remote_configs import BY_KEY, Config
from _remote_report import analyse, report
from _remote_servers import ServerProcess, proc_cpu
from _rounds import REPO_ROOT
from _runs import LoaderCosts, add_tree_figures, read_epoch, run_fresh, run_script
from bench_machine import loadavg, stamp, versions

sys.path.insert(0, str(REPO_ROOT / "tests"))  # objstore: the servers the tests use

BATCH = 32
MIB = 1 << 20
BUCKET = "ferrofeed-bench"
MIN_SHARDS = 8
QUICK_DIR = "remote-compare-quick"  # under bench-results/: a quick run's results


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
    n = spec["n"]
    costs = LoaderCosts()
    t0 = time.perf_counter()
    remote_source: dict[str, Any] = {}
    if cfg.family == "ferrofeed":
        kwargs: dict[str, Any] = {}
        if cfg.where != "local":
            kwargs["storage_options"] = spec["storage_options"]
            if cfg.cache:
                kwargs["cache_dir"] = spec["cache_dir"]
            # The bucket holds a sample index (for s3-latency-index): the other
            # configurations leave it unread, and count and fetch whole shards.
            kwargs["index"] = cfg.index
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
    epoch_s: list[float] = []
    epoch_first_batch_s: list[float] = []  # from each epoch's start to its first batch
    remote_epochs: list[dict[str, Any]] = []
    for epoch in range(spec["epochs"]):
        t = time.perf_counter() if epoch else t0
        count, first = read_epoch(loader, cfg.key, since=t)
        epoch_first_batch_s.append(first)
        epoch_s.append(time.perf_counter() - t)
        costs.epoch_end()
        if cfg.family == "ferrofeed" and cfg.where != "local":
            remote_epochs.append(dict(loader.stats()["remote"]))  # since the loader was made
        if count != n:
            raise AssertionError(f"{cfg.key}: epoch {epoch} gave {count} images, not {n}")
    shutdown_workers(loader)
    del loader
    # Per epoch, from the counters since the loader was made.
    per_epoch = [
        {k: v - (remote_epochs[i - 1][k] if i else 0) for k, v in r.items()}
        for i, r in enumerate(remote_epochs)
    ]
    steady = epoch_s[1:]
    return {
        "config": cfg.key,
        "source_s": source_s,
        "ttfb_s": epoch_first_batch_s[0],
        "epoch_s": epoch_s,
        "epoch_first_batch_s": epoch_first_batch_s,
        "images_per_s": n * len(steady) / sum(steady),
        "first_epoch_images_per_s": n / epoch_s[0],
        "images": n * len(epoch_s),
        **costs.end(),
        "remote_source": remote_source,
        "remote_epochs": per_epoch,
    }


# --- the parent: data, servers, rounds ---------------------------------------------------------


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


def versions_and_curl() -> dict[str, str | None]:
    """The versions of Python, ferrofeed, the peers and the servers, and curl's."""
    out = versions("ferrofeed", "numpy", "torch", "pillow", "webdataset", "moto", "matplotlib")
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
    add_tree_figures(r)
    r["server_cpu_s_per_1000"] = sum(r["server_cpu_s"].values()) / r["images"] * 1000
    shutil.rmtree(run_dir, ignore_errors=True)
    return r


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
    _rounds.add_run_options(p, timeout=900.0, quick="a short run: small sizes, 1 round")
    p.add_argument("--pss-interval", type=float, default=1.0, help="PSS sampling, seconds")
    _rounds.add_result_options(
        p, quick_dir=QUICK_DIR, replot="only redo the summaries and report of a JSON"
    )
    args = p.parse_args(argv)
    _rounds.fill_defaults(args, n=(1600, 256), shard_size=(200, 32), rounds=(3, 1))
    args.out_dir = _rounds.results_dir(args.out_dir, args.quick, QUICK_DIR)
    args.configs = _rounds.subset(args.configs, BY_KEY, "configurations", p)
    if args.epochs < 2 or args.rounds < 1 or args.shard_size < 1:
        p.error("--epochs must be >= 2, --rounds and --shard-size >= 1")
    if -(-args.n // args.shard_size) < MIN_SHARDS:
        p.error(f"--n / --shard-size must give at least {MIN_SHARDS} shards")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.replot:
        report(analyse(json.loads(args.replot.read_text())), args.out_dir)
        return 0
    from objstore import S3Server

    keys, not_run = _rounds.runnable({key: available(BY_KEY[key]) for key in args.configs})
    configs = [BY_KEY[k] for k in keys]
    results: dict[str, Any] = {
        **stamp("remote_compare.py", argv),
        "build": build_info(),
        "versions": versions_and_curl(),
        "args": {k: str(v) for k, v in vars(args).items()},
        "not_run": not_run,
    }
    runs: dict[str, list[dict[str, Any]]] = {c.key: [] for c in configs}
    workdir = scratch_dir("ferrofeed-remote-")
    saved_env = dict(os.environ)
    servers: dict[str, Any] = {}
    try:
        _, paths, results["data"] = make_images(
            workdir, args.n, args.seed, per_shard=args.shard_size
        )
        s3_endpoint = None
        if any(c.where == "s3" for c in configs):
            servers["s3"] = S3Server().start()
            servers["s3"].create_bucket(BUCKET)
            for p in paths:
                servers["s3"].put_file(BUCKET, os.path.basename(p), p)
            s3_endpoint = servers["s3"].endpoint
            os.environ.update(servers["s3"].env())  # the children's credentials and endpoint
            if any(c.index for c in configs):
                # `ferrofeed index` over the bucket: the offsets of every sample.
                import ferrofeed

                ferrofeed.index_shards(f"s3://{BUCKET}/train-*.tar")
        servers["front"] = ServerProcess(os.path.dirname(paths[0]), s3_endpoint, args.latency)
        base = {
            "paths": paths,
            "n": args.n,
            "seed": args.seed,
            "epochs": args.epochs,
            "window": args.shuffle_window,
        }
        for rnd in range(args.rounds):
            for cfg in _rounds.rotated(configs, rnd):
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
    results["loadavg_end"] = loadavg()
    results["runs"] = runs
    args.out_dir.mkdir(parents=True, exist_ok=True)
    report(analyse(results), args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, child_main))
