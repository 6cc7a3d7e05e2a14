"""One rank of the two-node job of tests/test_multinode.py, started by torchrun.

Every rank joins the process group (gloo; rank and world size come from torchrun's
environment), maps its node's `SharedList` of class names (local rank 0 builds it in the
node's ``FERROFEED_ARENA_DIR``, the other local rank maps it), reads ``--url`` (tar shards in
S3) through `TarShards` with the node's ``--cache-dir``, and runs ``--epochs`` epochs of a
`DataLoader` whose rank and world size it leaves to their defaults (torch.distributed).

Each batch, as a DDP step would: its sample keys are appended to the rank's records file,
the ranks all-reduce the batch's size (they step in lockstep, so a rank with fewer batches
would hang the job), and the loader's ``state_dict()`` is appended to the rank's checkpoint
file. Files, in ``--out``, by ``--tag`` and global rank:

* ``{tag}-rank{r}.info.json``: the rank's environment, the loader's rank, world size and
  length, the arena it mapped (path, owner, and the ``(major, minor, inode)`` of every file
  of the arena directory in ``/proc/self/smaps``) and the shards' listing.
* ``{tag}-rank{r}.records.jsonl``: ``{"step", "epoch", "batch", "keys"}`` per batch.
* ``{tag}-rank{r}.ckpt.jsonl``: ``{"step", "state"}`` per batch, after the all-reduce.

``--die-at-step N`` makes the ranks of node (group rank) ``--die-node`` kill themselves with
SIGKILL once their checkpoint of step ``N`` is written. ``--resume-from TAG --resume-step S``
makes every rank load its own state of step ``S`` from run ``TAG``'s checkpoint file and go
on from there. The job checks each sample's bytes against its key and exits with status 0
when it ran to the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import ferrofeed as ff
import torch
import torch.distributed as dist

CLASSES = 10


def class_names() -> list[dict[str, Any]]:
    """The node's metadata: a name per class label (what a real job keeps in a SharedList).

    Each item also names the process that built it (local rank 0 of this run of the job).
    It takes a second, as reading a real job's annotation files does: meanwhile the node's
    other local ranks are already waiting for the arena.
    """
    time.sleep(1.0)
    return [{"cls": c, "name": f"class-{c:02d}", "built_by": os.getpid()} for c in range(CLASSES)]


def mapped_files(directory: str) -> list[list[Any]]:
    """``[path, major, minor, inode]`` of every file under ``directory`` this process maps."""
    root = os.path.realpath(directory) + os.sep
    header = re.compile(r"^[0-9a-f]+-[0-9a-f]+ \S+ [0-9a-f]+ ([0-9a-f]+):([0-9a-f]+) (\d+)\s*(.*)$")
    out: list[list[Any]] = []
    with open("/proc/self/smaps", encoding="utf-8", errors="replace") as f:
        for line in f:
            m = header.match(line)
            if m is None:
                continue
            name = m.group(4).removesuffix(" (deleted)")
            if name.startswith(root):
                entry = [name, int(m.group(1), 16), int(m.group(2), 16), int(m.group(3))]
                if entry not in out:
                    out.append(entry)
    return out


def append_line(f: Any, obj: Any) -> None:
    f.write(json.dumps(obj) + "\n")
    f.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--shuffle-window", type=int, default=16)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--die-at-step", type=int, default=None)
    parser.add_argument("--die-node", type=int, default=1)
    parser.add_argument("--resume-from", default=None)
    parser.add_argument("--resume-step", type=int, default=None)
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank = dist.get_rank()
    node = int(os.environ["GROUP_RANK"])
    out = Path(args.out)
    prefix = out / f"{args.tag}-rank{rank}"

    meta = ff.SharedList.shared(class_names, name="multinode-classes", timeout=60)
    names = {item["cls"]: item["name"] for item in meta}
    arena_dir = os.environ["FERROFEED_ARENA_DIR"]

    shards = ff.TarShards(args.url, cache_dir=args.cache_dir)
    loader = ff.DataLoader(
        shards,
        batch_size=args.batch_size,
        shuffle=True,
        shuffle_window=args.shuffle_window,
        seed=args.seed,
        num_threads=1,
    )
    step = 0
    if args.resume_from is not None:
        assert args.resume_step is not None
        ckpt = out / f"{args.resume_from}-rank{rank}.ckpt.jsonl"
        states = [json.loads(line) for line in ckpt.read_text().splitlines()]
        (state,) = [s["state"] for s in states if s["step"] == args.resume_step]
        loader.load_state_dict(state)
        step = args.resume_step

    info = {
        "rank": rank,
        "node": node,
        "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK")},
        "pid": os.getpid(),
        "loader_rank": loader.rank,
        "loader_world_size": loader.world_size,
        "batches": len(loader),
        "arena_path": meta.path,
        "arena_owner": meta.owner,
        "arena_dir": arena_dir,
        "mapped": mapped_files(arena_dir),
        "class_names": [names[c] for c in range(CLASSES)],
        "built_by": sorted({item["built_by"] for item in meta}),
        "shards": shards.shards,
        "start_epoch": loader.epoch,
        "start_step": step,
    }
    (prefix.parent / f"{prefix.name}.info.json").write_text(json.dumps(info))

    with (
        open(f"{prefix}.records.jsonl", "w", encoding="utf-8") as records,
        open(f"{prefix}.ckpt.jsonl", "w", encoding="utf-8") as ckpt_file,
    ):
        while loader.epoch < args.epochs:
            epoch = loader.epoch
            batch_no = loader.state_dict()["batches_done"]
            for batch in loader:
                keys = list(batch["__key__"])
                for key, data, cls in zip(keys, batch["bin"], batch["cls"], strict=True):
                    assert data == key.encode() * 3, (key, data)
                    index = int(key.rsplit("_", 1)[1])
                    assert int(cls) == index % CLASSES, (key, cls)
                    assert names[int(cls)] == f"class-{index % CLASSES:02d}"
                step += 1
                append_line(
                    records, {"step": step, "epoch": epoch, "batch": batch_no, "keys": keys}
                )
                # The DDP step: every rank must take part, or the others wait here.
                size = torch.tensor([len(keys)])
                dist.all_reduce(size)
                append_line(ckpt_file, {"step": step, "state": loader.state_dict()})
                batch_no += 1
                if args.die_at_step == step and node == args.die_node:
                    os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    meta.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
