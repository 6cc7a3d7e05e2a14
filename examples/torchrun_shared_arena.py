"""Several ranks on one node share ONE metadata arena; the DataLoader shards it by rank.

Run (CPU, gloo backend, 2 ranks):

    torchrun --standalone --nproc_per_node=2 examples/torchrun_shared_arena.py [--smoke]
    python -m torch.distributed.run --standalone --nproc_per_node=2 \\
        examples/torchrun_shared_arena.py --items 200000 --epochs 2

Every rank joins the process group (gloo), then calls `SharedList.shared`: local rank 0
builds the node's COCO-like image metadata (file name, size, boxes, category ids; made
deterministically at run time) into one arena file, and the other local ranks wait for it
and map the same file, so the node holds one copy of the metadata however many ranks run.
A `DataLoader` on that SharedList picks up rank and world size from torch.distributed and
gives each rank its own shard of a new permutation every epoch; the ranks train a tiny
DistributedDataParallel model on it (DDP needs every rank to take the same number of
steps, which the loader guarantees).

Then the ranks compare notes with ``all_gather_object`` and the script fails (exit status
1) unless:

- every rank saw the same number of batches, ``len(loader)``, in every epoch;
- the shards cover the dataset and overlap only by the padding. Rank ``r`` takes positions
  ``r, r + W, r + 2W, ...`` of the epoch's order (``W`` ranks), so interleaving the ranks'
  samples rebuilds that order. Without ``--drop-last`` each rank takes ``ceil(N / W)``
  samples: the first ``N`` of the rebuilt order are every index exactly once, and the last
  ``pad = W * ceil(N / W) - N`` (``< W``) are the wrap-around padding, which repeats the
  first ``pad`` samples of the order, nothing else. With ``--drop-last`` no sample repeats,
  and ``W * len(loader) * batch_size`` samples are seen;
- every rank maps the same arena file (the same device and inode in ``/proc/self/smaps``),
  and the arena directory holds exactly that one file (no partial or claim file either)
  while all the ranks run (listed at barriers, after the arena is mapped and after
  training), and nothing once the ranks have closed it;
- every rank reads identical metadata, and DDP left the same weights on every rank.

Rank 0 prints a summary, including the memory picture: the arena's size, and for each rank
the resident (RSS) and proportional (PSS) size of its mapping of the arena. Every rank reads
all of the metadata, so each maps the whole file while their PSS adds up to one copy.
``--report FILE`` also writes these facts as JSON (the test suite checks them).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import zlib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from ferrofeed import DataLoader, SharedList, default_arena_dir
from ferrofeed.memory import format_bytes, process_memory
from torch import nn

CATEGORIES = 80
SIZES = [(640, 480), (480, 640), (640, 427), (500, 375), (612, 612)]


def coco_like_images(n: int, seed: int = 0) -> Iterator[dict[str, Any]]:
    """Yield ``n`` deterministic image records shaped like COCO's, boxes included."""
    rng = random.Random(seed)
    for i in range(n):
        width, height = rng.choice(SIZES)
        boxes, categories = [], []
        for _ in range(rng.randint(1, 12)):
            w, h = rng.uniform(8, width / 2), rng.uniform(8, height / 2)
            x, y = rng.uniform(0, width - w), rng.uniform(0, height - h)
            boxes.append([round(x, 2), round(y, 2), round(w, 2), round(h, 2)])
            categories.append(rng.randint(1, CATEGORIES))
        yield {
            "id": i,
            "file_name": f"{i:012d}.jpg",
            "width": width,
            "height": height,
            "boxes": boxes,
            "category_ids": categories,
        }


def features(record: dict[str, Any]) -> dict[str, Any]:
    """Per-sample transform: a few image statistics -> the fraction covered by boxes."""
    boxes = np.asarray(record["boxes"], dtype=np.float32)
    image_area = record["width"] * record["height"]
    areas = boxes[:, 2] * boxes[:, 3] / image_area
    x = [record["width"] / 640, record["height"] / 640, len(boxes) / 12, float(areas.mean())]
    return {
        "index": record["id"],
        "x": np.asarray(x, dtype=np.float32),
        "y": np.float32(min(float(areas.sum()), 4.0)),
    }


def arena_mapping(path: str) -> dict[str, Any]:
    """This process's mapping of the file at ``path``, from ``/proc/self/smaps``.

    Returns the ``(major, minor, inode)`` of every mapping of it (which file the kernel
    really mapped) and their RSS and PSS in bytes.
    """
    target = os.path.realpath(path)
    files: list[list[int]] = []
    rss = pss = 0
    mine = False
    header = re.compile(r"^[0-9a-f]+-[0-9a-f]+ \S+ [0-9a-f]+ ([0-9a-f]+):([0-9a-f]+) (\d+)\s*(.*)$")
    with open("/proc/self/smaps", encoding="utf-8", errors="replace") as f:
        for line in f:
            m = header.match(line)
            if m:
                name = m.group(4).removesuffix(" (deleted)")
                mine = name == target
                if mine:
                    found = [int(m.group(1), 16), int(m.group(2), 16), int(m.group(3))]
                    if found not in files:
                        files.append(found)
            elif mine and line.startswith(("Rss:", "Pss:")):
                kib = int(line.split()[1]) * 1024
                if line.startswith("Rss:"):
                    rss += kib
                else:
                    pss += kib
    return {"files": files, "rss": rss, "pss": pss}


def file_id(path: Path) -> list[int]:
    st = os.stat(path)
    return [os.major(st.st_dev), os.minor(st.st_dev), st.st_ino]


def listing(directory: Path, name: str) -> tuple[list[str], list[str]]:
    """The files of arena ``name`` in ``directory`` (arena, claim, partial), and all entries.

    The check uses the first list: ``directory`` may be shared with other jobs' arenas.
    """
    entries = sorted(os.listdir(directory))
    prefix = f"ferrofeed-shared-{name}."
    return [e for e in entries if e.startswith((prefix, "." + prefix))], entries


def check_shards(seen: list[list[int]], n: int, batches: list[int], loader: DataLoader) -> str:
    """Check the ranks' samples of one epoch (``seen[r]``: rank r's indices, in order)."""
    world = len(seen)
    if len(set(batches)) != 1 or batches[0] != len(loader):
        raise AssertionError(f"ranks saw different numbers of batches: {batches}")
    if loader.drop_last:
        flat = [i for shard in seen for i in shard]
        if len(flat) != len(set(flat)) or not set(flat) <= set(range(n)):
            raise AssertionError("with drop_last the shards overlap or hold foreign indices")
        if len(flat) != world * len(loader) * loader.batch_size:
            raise AssertionError(f"{len(flat)} samples seen, expected full batches only")
        return f"{len(flat)} distinct samples, {n - len(flat)} dropped, no repeats"
    per_rank = math.ceil(n / world)
    if any(len(shard) != per_rank for shard in seen):
        raise AssertionError(f"shard sizes {[len(s) for s in seen]}, expected {per_rank} each")
    # Rank r holds positions r, r + W, ...: interleaving the shards rebuilds the order.
    order = [seen[k % world][k // world] for k in range(world * per_rank)]
    pad = world * per_rank - n
    if sorted(order[:n]) != list(range(n)):
        raise AssertionError("the shards do not cover the dataset exactly once")
    if order[n:] != order[:pad]:
        raise AssertionError("the padding is not the wrap-around of the epoch's order")
    return f"all {n} samples exactly once, plus {pad} wrap-around padding"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--items", type=int, help="images in the dataset (default 100000, 1001 with --smoke)"
    )
    parser.add_argument("--epochs", type=int, default=2, help="passes over the data")
    parser.add_argument("--batch-size", type=int, default=64, help="samples per batch and rank")
    parser.add_argument("--seed", type=int, default=0, help="shuffle seed")
    parser.add_argument("--drop-last", action="store_true", help="drop the uneven tail")
    parser.add_argument("--threads", type=int, default=2, help="loader threads per rank")
    parser.add_argument(
        "--arena-dir",
        type=Path,
        help="where the arena goes (default: $FERROFEED_ARENA_DIR "
        "or /dev/shm); must be the same directory for every rank of the node",
    )
    parser.add_argument("--name", default="coco-like-train", help="the shared arena's name")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for peers")
    parser.add_argument("--report", type=Path, help="rank 0 writes the facts checked as JSON")
    parser.add_argument("--smoke", action="store_true", help="a small, fast run (CI)")
    args = parser.parse_args()
    n = args.items if args.items is not None else (1_001 if args.smoke else 100_000)
    arena_dir = args.arena_dir or default_arena_dir()

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()

    def gather(obj: Any) -> list[Any]:
        out: list[Any] = [None] * world
        dist.all_gather_object(out, obj)
        return out

    # One arena per node: local rank 0 builds it, the other local ranks map the same file.
    meta: SharedList[dict[str, Any]] = SharedList.shared(
        lambda: coco_like_images(n, seed=0),
        name=args.name,
        dir=arena_dir,
        timeout=args.timeout,
    )
    arena_path, arena_name = meta.path, os.path.basename(meta.path)
    dist.barrier()  # every rank has mapped it
    listed_start, entries_start = listing(arena_dir, args.name)

    loader = DataLoader(
        meta,
        batch_size=args.batch_size,
        shuffle=True,
        seed=args.seed,
        drop_last=args.drop_last,
        transform=features,
        num_threads=args.threads,
        output="torch",
    )  # rank and world size come from torch.distributed
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    epochs = []
    for epoch in range(args.epochs):
        seen: list[int] = []
        batches, loss_sum = 0, 0.0
        for batch in loader:  # each pass is the next epoch, reshuffled
            loss = nn.functional.mse_loss(model(batch["x"]).squeeze(1), batch["y"])
            optimizer.zero_grad()
            loss.backward()  # DDP all-reduces the gradients: a collective every step
            optimizer.step()
            seen.extend(batch["index"].tolist())
            batches += 1
            loss_sum += loss.item()
        shards, counts = gather(seen), gather(batches)
        losses = gather(loss_sum / max(batches, 1))
        verdict = check_shards(shards, n, counts, loader)
        epochs.append(
            {
                "epoch": epoch,
                "batches": counts,
                "samples": [len(s) for s in shards],
                "shards": verdict,
                "seen": shards if args.report else None,  # every rank's indices, in order
                "loss": sum(losses) / world,
            }
        )
        if rank == 0:
            print(
                f"epoch {epoch}: {counts[0]} batches per rank; {verdict}; "
                f"loss {epochs[-1]['loss']:.4f}"
            )

    # Every rank reads all the metadata: the same bytes everywhere, and every page mapped.
    crc = 0
    for record in meta:
        crc = zlib.crc32(repr(record).encode(), crc)
    weights = [p.detach().tolist() for p in model.parameters()]
    dist.barrier()  # everyone has read everything: measure
    mapping = arena_mapping(arena_path)
    stat_id = file_id(Path(arena_path))
    mem = process_memory()
    listed_end, entries_end = listing(arena_dir, args.name)
    fact = {
        "rank": rank,
        "local_rank": int(os.environ.get("LOCAL_RANK", rank)),
        "pid": os.getpid(),
        "owner": meta.owner,
        "path": arena_path,
        "mapped": mapping["files"],
        "stat": stat_id,
        "arena_rss": mapping["rss"],
        "arena_pss": mapping["pss"],
        "rss": mem.rss,
        "pss": mem.pss,
        "crc": crc,
        "weights": weights,
        "listed_start": listed_start,
        "listed_end": listed_end,
        "entries_start": entries_start,
        "entries_end": entries_end,
    }
    facts = gather(fact)  # nobody closes the arena before everyone has measured
    nbytes = meta.nbytes
    meta.close()  # rank 0, the owner, removes the file; the others just unmap
    dist.barrier()
    listed_after, entries_after = listing(arena_dir, args.name)

    problems = find_problems(facts, arena_name, listed_after)
    if rank == 0:
        stat_id = facts[0]["stat"]
        print(
            f"{world} ranks share 1 arena: {arena_path} ({format_bytes(nbytes)}, "
            f"{n:,} images), device:inode {stat_id[0]}:{stat_id[1]}:{stat_id[2]}"
        )
        for f in facts:
            print(
                f"  rank {f['rank']}{' (owner)' if f['owner'] else ''}: maps "
                f"{format_bytes(f['arena_rss'])} of it, PSS {format_bytes(f['arena_pss'])}; "
                f"process RSS {format_bytes(f['rss'])}, PSS {format_bytes(f['pss'])}"
            )
        total_pss = sum(f["arena_pss"] for f in facts)
        print(
            f"  the ranks' arena PSS adds up to {format_bytes(total_pss)}, at most the file's "
            "size: one copy for the node, not one per rank"
        )
        if args.report:
            report = {
                "world_size": world,
                "items": n,
                "batch_size": args.batch_size,
                "drop_last": args.drop_last,
                "arena_dir": str(arena_dir),
                "arena_name": arena_name,
                "nbytes": nbytes,
                "epochs": epochs,
                "ranks": facts,
                "listed_after": listed_after,
                "entries_after": entries_after,
                "problems": problems,
            }
            args.report.write_text(json.dumps(report, indent=1))
        if not problems:
            print(f"ok: {world} ranks, {args.epochs} epoch(s) checked, one arena, nothing left")
    dist.barrier()  # a failing rank exits only once rank 0 has reported (torchrun kills the rest)
    dist.destroy_process_group()
    if problems:  # every rank has the same facts, so every rank fails alike
        raise SystemExit("FAILED: " + "; ".join(problems))


def find_problems(facts: list[dict[str, Any]], arena_name: str, after: list[str]) -> list[str]:
    """What is wrong with the ranks' facts about the arena (empty when all is well)."""
    problems = []
    # The kernel's word for the file each rank maps (device and inode, from smaps), and the
    # file the arena's path names: one and the same for every rank.
    stat_id = facts[0]["stat"]
    if any(f["mapped"] != [stat_id] or f["stat"] != stat_id for f in facts):
        problems.append(f"ranks mapped different files: {[f['mapped'] for f in facts]}")
    for when in ("listed_start", "listed_end"):
        if any(f[when] != [arena_name] for f in facts):
            problems.append(f"arena files at {when}: {[f[when] for f in facts]}")
    if after:
        problems.append(f"left behind once closed: {after}")
    if [f["owner"] for f in facts].count(True) != 1:
        problems.append("not exactly one rank owns the arena")
    if len({f["crc"] for f in facts}) != 1:
        problems.append("ranks read different metadata")
    if any(f["weights"] != facts[0]["weights"] for f in facts):
        problems.append("DDP left different weights on the ranks")
    return problems


if __name__ == "__main__":
    main()
