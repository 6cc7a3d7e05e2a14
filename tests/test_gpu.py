"""On a CUDA machine: pinned staging buffers, asynchronous copies to the GPU, CUDA and fork.

Every test here needs a CUDA device that PyTorch sees; the module skips without one (CI has
none). The checks that matter most are the races a CPU machine cannot show: a batch buffer
must not go back to its pool, to be refilled by a later batch, while a copy queued on a busy
stream still has to read it. Each such test queues a long GPU kernel before every batch, so
that every copy waits behind it, keeps every device batch, and only then compares them all
with a CPU run of the same loader. A control test takes the safeguard away and shows that
the same setup then does read refilled buffers, so the check is known to be able to fail.
"""

from __future__ import annotations

import importlib.util
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

import ferrofeed  # noqa: E402
from ferrofeed import (  # noqa: E402
    BufferPool,
    DataLoader,
    ImageFiles,
    ops,
    torch as ft,
)

pytestmark = pytest.mark.gpu

RunPython = Callable[..., subprocess.CompletedProcess[str]]

SIZE = 64
N_IMAGES = 24
# GPU clock cycles of the kernel queued before each batch: about 10 ms, much longer than
# decoding a batch of two small JPEGs, so a buffer released early is refilled before the
# copy that should have read it runs.
BUSY_CYCLES = 20_000_000
# Every this many batches the test waits for the GPU, as a training step that reads its
# loss does: the copies so far complete, their buffers go back to the pool and are reused.
SYNC_EVERY = 4


def busy_gpu(cycles: int = BUSY_CYCLES) -> None:
    """Queue a kernel that keeps the current stream busy for some milliseconds."""
    torch.cuda._sleep(cycles)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """JPEGs of random sizes and content (each decodes to different pixels)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("gpu-images")
    rng = np.random.default_rng(7)
    paths = []
    for i in range(N_IMAGES):
        h, w = (int(v) for v in rng.integers(80, 160, size=2))
        pixels = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        path = root / f"{i:02d}.jpg"
        Image.fromarray(pixels).save(path, quality=90)
        paths.append(str(path))
    return paths


def image_loader(files: list[str], **kw: Any) -> DataLoader:
    kw.setdefault("transform", ops.decode_image(size=SIZE))
    return DataLoader(
        ImageFiles(files, labels=list(range(len(files)))),
        batch_size=2,
        shuffle=True,
        seed=3,
        num_threads=2,
        prefetch=1,
        **kw,
    )


def cpu_reference(loader: DataLoader, epochs: int) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        out += [(np.array(x), np.array(y)) for x, y in loader]
    return out


def gpu_batches(loader: DataLoader, epochs: int) -> Iterator[Any]:
    """Every batch of ``epochs`` epochs, a busy kernel queued before each is asked for.

    Every `SYNC_EVERY` batches, the GPU is waited for, so that buffers are reused.
    """
    count = 0
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        it = iter(loader)
        while True:
            busy_gpu()
            try:
                batch = next(it)
            except StopIteration:
                break
            yield batch
            count += 1
            if count % SYNC_EVERY == 0:
                torch.cuda.synchronize()


def mismatches(got: list[tuple[Any, Any]], ref: list[tuple[np.ndarray, np.ndarray]]) -> list[int]:
    """The batches whose images or labels differ from the CPU run's."""
    assert len(got) == len(ref)
    return [
        i
        for i, ((images, labels), (ref_images, ref_labels)) in enumerate(zip(got, ref, strict=True))
        if not (
            np.array_equal(labels.cpu().numpy(), ref_labels)
            and np.array_equal(images.cpu().numpy(), ref_images)
        )
    ]


# --------------------------------------------------------------------------------------
# pinned memory


def test_pinned_memory_is_found_and_really_page_locked(run_python: RunPython) -> None:
    # A fresh process: the probe runs once per process, at the first pinned allocation.
    proc = run_python(
        """
        import torch, ferrofeed
        from ferrofeed import BufferPool, _core
        assert _core.pinned_memory_status() == (None, None), "probed before any allocation"
        pool = BufferPool(2, pinned=True)
        t = pool.empty((3, 1000), "uint8")
        assert t.pinned
        assert _core.pinned_memory_status() == (True, None), _core.pinned_memory_status()
        # PyTorch answers is_pinned() False until its own CUDA state is initialized.
        torch.cuda.init()
        x = torch.from_dlpack(t)
        assert x.is_pinned(), "CUDA does not see the block as page-locked"
        assert x.data_ptr() == t.data_ptr
        # pinned=None takes pinned memory when it can
        assert BufferPool(1).empty((8,), "uint8").pinned
        print("OK", ferrofeed.build_info().get("pinned_memory", ""))
        """
    )
    assert "OK" in proc.stdout


def test_disable_env_keeps_pools_on_plain_memory(run_python: RunPython) -> None:
    proc = run_python(
        """
        import ferrofeed
        from ferrofeed import BufferPool, _core
        t = BufferPool(1).empty((8,), "uint8")
        assert not t.pinned
        known, why = _core.pinned_memory_status()
        assert known is False and "FERROFEED_DISABLE_CUDA" in why, (known, why)
        try:
            BufferPool(1, pinned=True).empty((8,), "uint8")
        except ferrofeed.PinnedMemoryError as e:
            print("refused:", e)
        else:
            raise AssertionError("pinned=True must fail when pinned memory is off")
        """,
        env={"FERROFEED_DISABLE_CUDA": "1"},
    )
    assert "refused:" in proc.stdout


def test_a_forked_child_uses_plain_memory_and_never_calls_the_driver(
    run_python: RunPython,
) -> None:
    # CUDA is initialized in the parent (pinned blocks exist); the child may drop the
    # inherited blocks and allocate new ones, all without a driver call.
    proc = run_python(
        """
        import os, sys
        import torch
        from ferrofeed import BufferPool, PinnedMemoryError, _core
        pool = BufferPool(4, pinned=True)
        kept = pool.empty((1 << 16,), "uint8")
        assert kept.pinned
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                known, why = _core.pinned_memory_status()
                assert known is False and "forked" in why, (known, why)
                del kept  # an inherited pinned block: not freed through the driver
                fresh = BufferPool(2).empty((1024,), "uint8")
                assert not fresh.pinned
                try:
                    BufferPool(1, pinned=True).empty((8,), "uint8")
                except PinnedMemoryError:
                    code = 0
            finally:
                sys.stdout.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        # The parent's CUDA is untouched by the child.
        y = torch.from_dlpack(kept).to("cuda")
        torch.cuda.synchronize()
        assert _core.pinned_memory_status() == (True, None)
        print("OK")
        """
    )
    assert "OK" in proc.stdout


def test_to_torch_device_returns_the_buffer_once_the_copy_completed() -> None:
    pool = BufferPool(2, pinned=True)
    # A first copy and event, waited for: CUDA's lazy set-up is then not inside the window
    # that the busy kernel below must cover.
    ferrofeed.to_torch(pool.empty((16,), "uint8"), device="cuda")
    torch.cuda.synchronize()
    ft._copies.release_finished()
    t = pool.empty((1 << 20,), "uint8")
    np.asarray(t.numpy())[:] = np.arange(1 << 20, dtype=np.uint32).astype(np.uint8)
    busy_gpu(20 * BUSY_CYCLES)  # about 200 ms
    y = ferrofeed.to_torch(t, device="cuda")
    del t
    # The copy is queued behind the busy kernel: the buffer must stay out of the pool.
    assert pool.stats()["in_use"] == 1
    torch.cuda.synchronize()
    ft._copies.release_finished()
    assert pool.stats()["in_use"] == 0
    expected = torch.arange(1 << 20, dtype=torch.int64).to(torch.uint8)
    assert torch.equal(y.cpu(), expected)


# --------------------------------------------------------------------------------------
# the loader's copies under a busy stream


def test_native_batches_copied_on_a_busy_stream_match_the_cpu_run(files: list[str]) -> None:
    epochs = 3
    ref = cpu_reference(image_loader(files), epochs)
    loader = image_loader(files, output="torch", device="cuda")
    got = list(gpu_batches(loader, epochs))
    torch.cuda.synchronize()
    assert all(x.is_cuda and y.is_cuda for x, y in got)
    assert mismatches(got, ref) == []
    buffers = loader.stats()["buffers"]
    assert buffers["pinned"] > 0, buffers
    # Buffers were reused (fewer than the two, images and labels, of each batch), so the
    # check above saw buffers refilled while other copies were still queued.
    assert buffers["allocated"] < len(got), buffers


def test_control_without_the_copy_keeper_a_busy_stream_reads_refilled_buffers(
    files: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same run as above with the safeguard removed: the copies then read buffers that
    # later batches have refilled. This proves that the test above can fail.
    monkeypatch.setattr(ft._copies, "keep", lambda source, event: None)
    epochs = 3
    ref = cpu_reference(image_loader(files), epochs)
    loader = image_loader(files, output="torch", device="cuda")
    got = list(gpu_batches(loader, epochs))
    torch.cuda.synchronize()
    assert mismatches(got, ref) != []


def test_native_float_collate_on_gpu_matches(files: list[str]) -> None:
    collate = ops.collate(
        2, layout="NCHW", dtype="float32", normalize=([0.5, 0.4, 0.3], [0.2, 0.3, 0.4])
    )
    ref = cpu_reference(image_loader(files, collate=collate), 1)
    loader = image_loader(files, collate=collate, output="torch", device="cuda:0")
    got = list(gpu_batches(loader, 1))
    torch.cuda.synchronize()
    assert got[0][0].dtype == torch.float32
    assert mismatches(got, ref) == []


class Arrays:
    """A map-style dataset of distinct arrays (Python samples, Python collate)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return np.full((3, 32, 32), i % 251, dtype=np.uint8) + np.arange(32, dtype=np.uint8), i


@pytest.mark.parametrize("workers", [0, 2])
def test_python_batches_copied_on_a_busy_stream_match(workers: int) -> None:
    kw: dict[str, Any] = {"batch_size": 4, "shuffle": True, "seed": 5, "num_workers": workers}
    if workers:
        # CUDA is initialized in this process; forked workers must not touch it.
        kw["worker_start_method"] = "fork"
    ref = cpu_reference(DataLoader(Arrays(40), **kw), 2)
    loader = DataLoader(Arrays(40), output="torch", device="cuda", **kw)
    got = list(gpu_batches(loader, 2))
    torch.cuda.synchronize()
    assert all(x.is_cuda for x, _ in got)
    assert mismatches(got, ref) == []


def test_worker_batches_for_the_gpu_come_in_page_locked_slots() -> None:
    # Worker processes write batches into shared-memory slots; with a CUDA device the
    # main process page-locks them, so the copies run asynchronously (as from pinned
    # buffers) and the batches still match a CPU run under a busy stream.
    kw: dict[str, Any] = {"batch_size": 4, "shuffle": True, "seed": 6, "num_workers": 2}
    ref = cpu_reference(DataLoader(Arrays(40), **kw), 2)
    kw["persistent_workers"] = True  # their slots' counters stay readable after the epochs
    loader = DataLoader(Arrays(40), output="torch", device="cuda", **kw)
    seen_pinned = []
    original = ft._to_device

    def spy(t: Any, device: Any, non_blocking: bool, **k: Any) -> Any:
        seen_pinned.append(t.is_pinned())
        return original(t, device, non_blocking, **k)

    ft._to_device = spy  # type: ignore[assignment]
    try:
        got = list(gpu_batches(loader, 2))
    finally:
        ft._to_device = original  # type: ignore[assignment]
    torch.cuda.synchronize()
    assert mismatches(got, ref) == []
    slots = loader.stats()["workers"]["slots"]
    assert slots["pinned"] == slots["slots"] > 0, slots
    assert slots["pin_error"] is None
    assert seen_pinned
    assert all(seen_pinned), seen_pinned
    loader.shutdown_workers()


def test_a_device_index_torch_has_not_is_refused_at_construction(files: list[str]) -> None:
    n = torch.cuda.device_count()
    with pytest.raises(ValueError, match=f"cuda:{n}"):
        image_loader(files, output="torch", device=f"cuda:{n}")


# --------------------------------------------------------------------------------------
# JAX on the GPU, in its own process (JAX would otherwise take most of the GPU's memory)

JAX_GPU = """
import json, sys
import numpy as np
import jax
from ferrofeed import DataLoader, ImageFiles, ops

if not any(d.platform == "gpu" for d in jax.devices()):
    print(json.dumps({"skip": "JAX has no GPU backend here"}))
    sys.exit(0)
files = json.loads(sys.argv[1])

def loader(**kw):
    return DataLoader(ImageFiles(files, labels=list(range(len(files)))), batch_size=2,
                      shuffle=True, seed=3, num_threads=2, prefetch=1,
                      transform=ops.decode_image(size=64), **kw)

ref = []
for epoch in range(3):
    cpu = loader()
    cpu.set_epoch(epoch)
    ref += [(np.array(x), np.array(y)) for x, y in cpu]
gpu = loader(output="jax", device="gpu")
got = []
for epoch in range(3):
    gpu.set_epoch(epoch)
    got += list(gpu)
jax.block_until_ready([x for x, _ in got])
bad = [i for i, ((x, y), (rx, ry)) in enumerate(zip(got, ref, strict=True))
       if not (np.array_equal(np.asarray(x), rx) and np.asarray(y).tolist() == ry.tolist())]
platforms = sorted({d.platform for x, _ in got for d in x.devices()})
print(json.dumps({"batches": len(got), "bad": bad, "platforms": platforms,
                  "pinned": gpu.stats()["buffers"]["pinned"]}))
"""


def test_jax_gpu_batches_match_the_cpu_run(
    files: list[str], run_python: RunPython, last_json_line: Any
) -> None:
    # Not imported here: JAX in this process would make later tests' workers default to
    # forkserver (see default_start_method), and JAX warns at every fork.
    if importlib.util.find_spec("jax") is None:
        pytest.skip("JAX is not installed")
    import json

    proc = run_python(
        JAX_GPU,
        args=[json.dumps(files)],
        timeout=180,
        env={"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
    )
    out = last_json_line(proc.stdout)
    if "skip" in out:
        pytest.skip(out["skip"])
    assert out["batches"] == 3 * N_IMAGES // 2
    assert out["bad"] == []
    assert out["platforms"] == ["gpu"]
