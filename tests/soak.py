"""Soak: many epochs over generated images; nothing may grow from one epoch to the next.

Each epoch runs the three ways a `DataLoader` loads data, one after the other, over the
same generated JPEGs:

* ``native``: the image folder through the native image chain (decode, resize and crop in
  Rust, on threads, into pooled batch buffers);
* ``threads``: a Python transform (`ferrofeed.io.decode_image` of the file's bytes) on
  threads, over a `SharedList` of ``(path, label)`` records;
* ``workers``: the same Python transform in 2 worker processes (started and ended every
  epoch), batches handed back through shared memory.

After every epoch (garbage collected, and the allocator's free pages handed back with
``malloc_trim``) it records the process's RSS, the bytes of the buffer pools' idle
buffers, its open file descriptors, its OS threads and its shared-memory files (its arenas
in /dev/shm and its memfds). The soak passes when, after the first epoch (which allocates
the pools and caches that later epochs reuse), RSS less the idle pooled buffers grows by
less than ``max_rss_growth`` (5%) at every later epoch, and the fd, thread and
shared-memory counts do not grow at all. The idle pooled buffers are left out because
each pool keeps up to ``max_idle`` of them (16 for the default pool) whatever the load:
how many are idle at the moment of measuring depends on timing, by several MiB, and says
nothing about growth; the raw RSS figures are reported too.

Run it as ``make soak`` (10 epochs over 20,000 images) or ``python tests/soak.py``; the
sizes come from ``FERROFEED_SOAK_IMAGES`` and ``FERROFEED_SOAK_EPOCHS`` (or the command
line), ``--loaders`` picks some of the three. ``tests/test_soak.py`` runs a short version
(3 epochs over 500 images). Both set ``MALLOC_ARENA_MAX=2``: every epoch starts new
threads, and glibc's per-thread malloc arenas (up to 8 per core) then fragment, adding a
few MiB of RSS over the first epochs that ferrofeed does not hold (with the default, the
three loaders together grew by up to 6.8% over 10 epochs, each alone by at most 3% with
no trend; with 2 arenas, by 0.7%: RELIABILITY.md).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from thread_counts import os_threads

SHM = "/dev/shm"


def release_free_memory() -> None:
    """Collect garbage and hand the allocator's free pages back to the kernel.

    glibc keeps freed memory in per-thread arenas and returns it lazily, so RSS after an
    epoch swings by megabytes with where the last batches happened to land; after
    ``malloc_trim(0)`` it measures what is still allocated, which is what a leak grows.
    """
    gc.collect()
    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        pass


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def malloc_in_use() -> int:
    """Bytes the C allocator has handed out and not got back (glibc's ``mallinfo2``:
    ``uordblks`` in every arena plus ``hblkhd`` in mmapped blocks); -1 without glibc 2.33.

    A leak grows this; fragmentation of the allocator's arenas grows RSS but not this.
    Python's small objects come from its own arenas, which it takes from malloc in
    256 KiB blocks (counted here) or from mmap (not counted).
    """
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):  # pragma: no cover - not glibc >= 2.33
        return -1
    fn.restype = _MallInfo2
    info = fn()
    return int(info.uordblks + info.hblkhd)


def rss_bytes() -> int:
    """Resident set size of this process, from /proc/self/statm."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def open_fds() -> int:
    """Open file descriptors of this process."""
    return len(os.listdir("/proc/self/fd"))


def shm_files() -> int:
    """Shared-memory files of this process: its arenas in /dev/shm (named
    ``ferrofeed-<pid>-...``, or any file under /dev/shm it has mapped or open) and the
    memfds it has mapped or open (the worker slots). Other processes' files in /dev/shm
    are not counted: a shared machine's /dev/shm changes under the soak."""
    names: set[str] = set()
    prefix = f"ferrofeed-{os.getpid()}-"
    with contextlib.suppress(FileNotFoundError):  # no /dev/shm
        for n in os.listdir(SHM):
            if n.startswith(prefix):
                with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                    names.add(f"{SHM}/{n}#{os.stat(f'{SHM}/{n}').st_ino}")
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6:
                path, inode = parts[5].strip(), parts[4]
                if path.startswith((SHM + "/", "/memfd:")):
                    names.add(f"{path.removesuffix(' (deleted)')}#{inode}")
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (listdir's own fd)
            continue
        if target.startswith((SHM + "/", "/memfd:")):
            inode = os.stat(f"/proc/self/fd/{fd}").st_ino
            names.add(f"{target.removesuffix(' (deleted)')}#{inode}")
    return len(names)


def pooled_bytes(*loaders: Any) -> int:
    """Bytes held by idle buffers of the default pool and of the loaders' own pools."""
    import ferrofeed

    pools = [ferrofeed.default_pool()]
    pools += [p for p in (getattr(ld, "_pool", None) for ld in loaders) if p is not None]
    total = 0
    for pool in pools:
        st = pool.stats()
        if st["allocated"]:
            total += st["bytes"] * st["idle"] // st["allocated"]  # buffers here are alike
    return total


def settle(seconds: float = 0.2) -> None:
    """Let threads that were just joined or told to end leave the kernel's count."""
    release_free_memory()
    time.sleep(seconds)


@dataclass
class Sample:
    """The process's resources after one epoch."""

    epoch: int
    seconds: float
    batches: int
    rss: int
    # Bytes of the buffer pools' idle buffers (kept for reuse, at most ``max_idle`` per
    # pool: a bounded cache whose fill varies with timing, not a leak).
    pooled: int
    # See `malloc_in_use` (reported, not judged).
    malloc: int
    fds: int
    threads: int
    shm: int


@dataclass
class Report:
    """What a soak run measured, and its verdict."""

    images: int
    epochs: int
    baseline: dict[str, int]
    samples: list[Sample] = field(default_factory=list)
    max_rss_growth: float = 0.05
    # After the loaders are dropped and the SharedList closed: back to the baseline, less
    # the arena (one shared-memory file, one fd: they were open at the baseline).
    after_close: dict[str, int] = field(default_factory=dict)

    @property
    def rss_growth(self) -> float:
        """Largest RSS after an epoch past the first, less the pools' idle buffers,
        relative to the same after the first: what the soak judges."""
        first = self.samples[0].rss - self.samples[0].pooled
        return max(s.rss - s.pooled for s in self.samples) / first - 1.0

    @property
    def raw_rss_growth(self) -> float:
        """As `rss_growth`, with the pools' idle buffers counted (reported, not judged)."""
        first = self.samples[0].rss
        return max(s.rss for s in self.samples) / first - 1.0

    @property
    def last_rss_growth(self) -> float:
        """RSS after the last epoch relative to after the first (pools counted)."""
        return self.samples[-1].rss / self.samples[0].rss - 1.0

    def failures(self) -> list[str]:
        """What broke the soak's promises (empty when it held)."""
        out = []
        first = self.samples[0]
        if self.rss_growth >= self.max_rss_growth:
            out.append(
                f"RSS (less idle pooled buffers) grew by {100 * self.rss_growth:.1f}% after "
                "the first epoch "
                f"(limit {100 * self.max_rss_growth:.0f}%)"
            )
        for name in ("fds", "threads", "shm"):
            counts = [getattr(s, name) for s in self.samples]
            if max(counts) > getattr(first, name):
                out.append(f"{name} grew after the first epoch: {counts}")
        if first.shm > self.baseline["shm"]:
            out.append(
                f"shared-memory files after the first epoch {first.shm} > before it "
                f"{self.baseline['shm']}"
            )
        end = self.after_close
        # Threads against the first epoch's count, not the baseline: the process's CPU
        # pool (src/cpu.rs) starts its threads at the first native batch and keeps them.
        if end and (
            end["fds"] > self.baseline["fds"]
            or end["threads"] > first.threads
            or end["shm"] >= self.baseline["shm"]
        ):
            out.append(f"left after closing everything: {end}, baseline {self.baseline}")
        return out

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data, with the derived figures."""
        d = asdict(self)
        d["rss_growth"] = self.rss_growth
        d["raw_rss_growth"] = self.raw_rss_growth
        d["last_rss_growth"] = self.last_rss_growth
        d["failures"] = self.failures()
        return d


def _decode_record(record: tuple[str, int]) -> tuple[Any, int]:
    """The Python transform: read the file, decode, resize and crop it (module level, so
    that it pickles into spawned workers)."""
    import ferrofeed.io

    path, label = record
    with open(path, "rb") as f:
        data = f.read()
    image = ferrofeed.io.decode_image(data, resize_shorter=64, crop=56).numpy()
    return image, label


LOADERS = ("native", "threads", "workers")


def run(
    images: int,
    epochs: int,
    root: str | None = None,
    *,
    batch_size: int = 64,
    loaders: tuple[str, ...] = LOADERS,
) -> Report:
    """Generate ``images`` JPEGs (in ``root``, else a temporary folder) and soak them with
    ``loaders`` (some of `LOADERS`), each epoch."""
    from ferrofeed import DataLoader, ImageFolder, SharedList, ops
    from ferrofeed.samples import image_folder

    own_root = root is None
    folder_root = tempfile.mkdtemp(prefix="ferrofeed-soak-") if root is None else root
    try:
        files = image_folder(folder_root, images, classes=10, size=(160, 120), seed=7)
        folder = ImageFolder(folder_root)
        native = DataLoader(
            folder,
            batch_size,
            shuffle=True,
            seed=1,
            transform=ops.decode_image(resize_shorter=64, crop=56),
            num_threads=2,
        )
        with SharedList(files) as records:
            threads = DataLoader(
                records,
                batch_size,
                shuffle=True,
                seed=2,
                transform=_decode_record,
                num_threads=2,
            )
            workers = DataLoader(
                records,
                batch_size,
                shuffle=True,
                seed=3,
                transform=_decode_record,
                num_workers=2,
            )
            # What the process makes once, on first use, and keeps (the one async runtime:
            # its threads and its I/O driver's descriptors), made before the baseline: it
            # is the library's, not a leak of an epoch's.
            for _ in DataLoader(list(range(4)), 2, num_threads=2):
                pass
            settle()
            report = Report(
                images=images,
                epochs=epochs,
                baseline={
                    "rss": rss_bytes(),
                    "fds": open_fds(),
                    "threads": os_threads(),
                    "shm": shm_files(),
                },
            )
            for epoch in range(epochs):
                t0 = time.monotonic()
                n = 0
                chosen = {"native": native, "threads": threads, "workers": workers}
                for loader in (chosen[name] for name in loaders):
                    loader.set_epoch(epoch)
                    for batch in loader:
                        images_batch = batch[0]
                        assert images_batch.shape[1:] == (56, 56, 3), images_batch.shape
                        n += 1
                    del batch, images_batch
                seconds = time.monotonic() - t0
                settle()
                report.samples.append(
                    Sample(
                        epoch=epoch,
                        seconds=round(seconds, 2),
                        batches=n,
                        rss=rss_bytes(),
                        pooled=pooled_bytes(native, threads, workers),
                        malloc=malloc_in_use(),
                        fds=open_fds(),
                        threads=os_threads(),
                        shm=shm_files(),
                    )
                )
            del native, threads, workers
        settle()
        report.after_close = {"fds": open_fds(), "threads": os_threads(), "shm": shm_files()}
        return report
    finally:
        if own_root:
            shutil.rmtree(folder_root, ignore_errors=True)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


def main(argv: list[str] | None = None) -> int:
    """Run the soak, print a table and a JSON line; exit status 1 when it failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=_env_int("FERROFEED_SOAK_IMAGES", 20_000))
    parser.add_argument("--epochs", type=int, default=_env_int("FERROFEED_SOAK_EPOCHS", 10))
    parser.add_argument("--root", help="where to write the images (default: a temporary folder)")
    parser.add_argument(
        "--loaders",
        default=",".join(LOADERS),
        help=f"which loaders run each epoch, comma-separated (default: {','.join(LOADERS)})",
    )
    args = parser.parse_args(argv)
    loaders = tuple(args.loaders.split(","))
    if not loaders or not set(loaders) <= set(LOADERS):
        parser.error(f"--loaders takes some of {','.join(LOADERS)}")
    report = run(args.images, args.epochs, args.root, loaders=loaders)
    print(f"soak: {args.images} images, {args.epochs} epochs ({', '.join(loaders)})")
    print(
        "epoch  seconds  batches   RSS MiB  pooled MiB  RSS-pooled  malloc MiB  fds  threads"
        "  shm files"
    )
    for s in report.samples:
        print(
            f"{s.epoch:5d}  {s.seconds:7.1f}  {s.batches:7d}  {s.rss / 2**20:8.1f}  "
            f"{s.pooled / 2**20:10.1f}  {(s.rss - s.pooled) / 2**20:10.1f}  "
            f"{s.malloc / 2**20:10.1f}  {s.fds:3d}  {s.threads:7d}  {s.shm:9d}"
        )
    print(f"baseline (before the first epoch): {report.baseline}")
    print(f"after closing the loaders and the SharedList: {report.after_close}")
    print(
        f"RSS growth after the first epoch (largest, pools' idle buffers not counted): "
        f"{100 * report.rss_growth:+.2f}%; with them: {100 * report.raw_rss_growth:+.2f}%; "
        f"last epoch against the first: {100 * report.last_rss_growth:+.2f}%"
    )
    failures = report.failures()
    for f in failures:
        print(f"FAIL: {f}")
    print(json.dumps(report.as_dict()))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
