"""ferrofeed.Tensor and BufferPool: DLPack handoff to NumPy, PyTorch and JAX.

Zero-copy (pointer equality), shapes/strides/dtypes, both capsule kinds, lifetime (the
producer dies first), pool recycling exactly once, copy/dl_device/stream semantics, the
lazy imports. GPU-only checks are marked ``gpu`` and skip without a CUDA device.
"""

from __future__ import annotations

import ctypes
import gc
import importlib.util
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ferrofeed
import pytest
from ferrofeed import BufferPool, Tensor

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

DTYPES = ["uint8", "int32", "int64", "float16", "bfloat16", "float32"]
ITEMSIZE = {"uint8": 1, "int32": 4, "int64": 8, "float16": 2, "bfloat16": 2, "float32": 4}
TORCH_DTYPE = {
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int64": torch.int64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
}
KDLCPU, KDLCUDA, KDLCUDAHOST = 1, 2, 3


def pool(max_buffers: int | None = 4, **kw: Any) -> BufferPool:
    kw.setdefault("pinned", False)
    kw.setdefault("timeout", 0.2)
    return BufferPool(max_buffers, **kw)


def capsule_name(capsule: object) -> str:
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype = ctypes.c_char_p
    get_name.argtypes = [ctypes.py_object]
    name = get_name(capsule)
    assert name is not None
    return name.decode()


class Recorder:
    """Forwards __dlpack__ to a Tensor and records the keyword arguments used."""

    def __init__(self, t: Tensor) -> None:
        self.t = t
        self.calls: list[dict[str, Any]] = []

    def __dlpack__(self, **kw: Any) -> Any:
        self.calls.append(kw)
        return self.t.__dlpack__(**kw)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.t.__dlpack_device__()


# --------------------------------------------------------------------------------------
# the tensor itself


@pytest.mark.parametrize("dtype", DTYPES)
def test_shape_strides_dtype(dtype: str) -> None:
    t = ferrofeed.empty((2, 3, 4), dtype, pool=pool())
    assert t.shape == (2, 3, 4)
    assert t.strides == (12, 4, 1)
    assert t.dtype == dtype
    assert t.itemsize == ITEMSIZE[dtype]
    assert (t.ndim, t.size, len(t)) == (3, 24, 2)
    assert t.nbytes == 24 * ITEMSIZE[dtype]
    assert t.device == "cpu"
    assert t.__dlpack_device__() == (KDLCPU, 0)
    assert t.data_ptr % 64 == 0
    assert t.pinned is False
    assert repr(t) == f"ferrofeed.Tensor(shape=(2, 3, 4), dtype={dtype}, device=cpu, pinned=False)"


def test_shapes_scalars_and_empty() -> None:
    p = pool()
    assert ferrofeed.zeros(5, "int64", pool=p).shape == (5,)
    scalar = ferrofeed.zeros((), "float32", pool=p)
    assert (scalar.shape, scalar.strides, scalar.size, scalar.nbytes) == ((), (), 1, 4)
    with pytest.raises(TypeError):
        len(scalar)
    assert np.from_dlpack(scalar).shape == ()
    e = ferrofeed.zeros((0, 7), "uint8", pool=p)
    assert (e.nbytes, e.data_ptr % 64) == (0, 0)
    assert np.from_dlpack(e).shape == (0, 7)
    assert torch.from_dlpack(e).shape == (0, 7)


@pytest.mark.parametrize(
    ("shape", "exc"),
    [((-1, 2), ValueError), ("abc", TypeError), ((1.5,), TypeError), ((1 << 62, 8), ValueError)],
)
def test_bad_shapes(shape: Any, exc: type[Exception]) -> None:
    with pytest.raises(exc):
        ferrofeed.empty(shape, "uint8", pool=pool())


def test_bad_dtype() -> None:
    with pytest.raises(ValueError, match="unsupported dtype"):
        ferrofeed.empty((2,), "complex64")


def test_tensor_cannot_be_built_directly() -> None:
    with pytest.raises(TypeError):
        Tensor()  # type: ignore[call-arg]


def test_zeros_clears_a_reused_buffer() -> None:
    p = pool(1)
    a = p.empty((16,), "uint8")
    np.from_dlpack(a)[:] = 0xAB
    ptr = a.data_ptr
    del a
    z = p.zeros((16,), "uint8")
    assert z.data_ptr == ptr
    assert np.from_dlpack(z).tolist() == [0] * 16


# --------------------------------------------------------------------------------------
# NumPy and PyTorch: zero copy


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != "bfloat16"])
def test_numpy_shares_memory(dtype: str) -> None:
    t = ferrofeed.zeros((3, 5), dtype, pool=pool())
    a = np.from_dlpack(t)
    assert a.ctypes.data == t.data_ptr
    assert a.dtype == np.dtype(dtype)
    assert a.shape == (3, 5)
    assert a.strides == tuple(s * ITEMSIZE[dtype] for s in t.strides)
    assert a.flags.writeable
    assert a.flags.c_contiguous
    a[1, 2] = 7
    b = t.numpy()
    assert b.ctypes.data == t.data_ptr
    assert b[1, 2] == 7
    assert ferrofeed.to_numpy(t)[1, 2] == 7


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != "bfloat16"])
def test_numpy_array_protocol_views_and_copies_as_numpy_2_says(dtype: str) -> None:
    t = ferrofeed.zeros((3, 5), dtype, pool=pool())
    view = np.asarray(t)  # not a 0-d object array: a view of the same memory
    assert isinstance(view, np.ndarray)
    assert view.dtype == np.dtype(dtype)
    assert view.shape == (3, 5)
    assert view.ctypes.data == t.data_ptr
    view[2, 4] = 3
    assert np.asarray(t)[2, 4] == 3
    assert np.asarray(t, copy=False).ctypes.data == t.data_ptr
    assert np.asarray(t, dtype=dtype, copy=False).ctypes.data == t.data_ptr
    # np.array copies by default, as copy=True does: a buffer of its own, the same values.
    for copied in (np.array(t), np.asarray(t, copy=True)):
        assert copied.ctypes.data != t.data_ptr
        assert copied[2, 4] == 3
        copied[0, 0] = 1
        assert view[0, 0] == 0
    # Another dtype is a conversion: a copy, which copy=False forbids.
    other = "float64" if dtype != "float64" else "float32"
    converted = np.asarray(t, dtype=other)
    assert converted.dtype == np.dtype(other)
    assert converted[2, 4] == 3
    assert converted.ctypes.data != t.data_ptr
    with pytest.raises(ValueError, match="copy"):
        np.asarray(t, dtype=other, copy=False)
    # Views keep the buffer alive after the tensor is gone.
    del t
    assert view[2, 4] == 3


def test_numpy_array_protocol_refuses_bfloat16_clearly() -> None:
    t = ferrofeed.zeros((2,), "bfloat16", pool=pool())
    with pytest.raises(TypeError, match="NumPy has no bfloat16"):
        np.asarray(t)


def test_numpy_array_protocol_in_numpy_functions() -> None:
    t = ferrofeed.zeros((4,), "int32", pool=pool())
    np.asarray(t)[:] = [1, 2, 3, 4]
    assert np.sum(t) == 10
    assert np.stack([t, t]).shape == (2, 4)
    assert (np.asarray(t) == np.arange(1, 5)).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_shares_memory(dtype: str) -> None:
    t = ferrofeed.zeros((4, 2, 3), dtype, pool=pool())
    x = torch.from_dlpack(t)
    assert x.data_ptr() == t.data_ptr
    assert x.dtype == TORCH_DTYPE[dtype]
    assert tuple(x.shape) == t.shape
    assert x.stride() == t.strides
    assert x.device.type == "cpu"
    x[3, 1, 2] = 5
    y = ferrofeed.to_torch(t)
    assert y.data_ptr() == t.data_ptr
    assert int(y[3, 1, 2]) == 5


def test_bfloat16_values_through_torch_and_ml_dtypes() -> None:
    t = ferrofeed.empty((4,), "bfloat16", pool=pool())
    x = torch.from_dlpack(t)
    x.copy_(torch.tensor([1.5, -2.0, 0.25, 3.0], dtype=torch.bfloat16))
    raw = np.frombuffer(ctypes.string_at(t.data_ptr, t.nbytes), dtype=np.uint16)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert raw.view(ml_dtypes.bfloat16).astype(np.float32).tolist() == [1.5, -2.0, 0.25, 3.0]


def test_numpy_and_torch_ask_for_versioned_capsules() -> None:
    t = ferrofeed.zeros((2,), "float32", pool=pool())
    for consume in (np.from_dlpack, torch.from_dlpack):
        r = Recorder(t)
        consume(r)
        assert r.calls
        assert r.calls[0].get("max_version") == (1, 0), r.calls


# --------------------------------------------------------------------------------------
# capsules


def test_capsule_kinds_follow_max_version() -> None:
    t = ferrofeed.zeros((2, 2), "float32", pool=pool())
    assert capsule_name(t.__dlpack__()) == "dltensor"
    assert capsule_name(t.__dlpack__(max_version=None)) == "dltensor"
    assert capsule_name(t.__dlpack__(max_version=(0, 8))) == "dltensor"
    assert capsule_name(t.__dlpack__(max_version=(1, 0))) == "dltensor_versioned"
    assert capsule_name(t.__dlpack__(max_version=(1, 3))) == "dltensor_versioned"
    assert capsule_name(t.__dlpack__(max_version=(2, 0))) == "dltensor_versioned"


def test_unconsumed_capsules_return_the_buffer() -> None:
    p = pool()
    t = p.zeros((8,), "uint8")
    caps = [t.__dlpack__(), t.__dlpack__(max_version=(1, 0)), t.__dlpack__(copy=True)]
    del t
    gc.collect()
    assert p.stats()["in_use"] == 1, "unconsumed capsules still own the buffer"
    del caps
    gc.collect()
    s = p.stats()
    assert (s["in_use"], s["releases"], s["idle"]) == (0, 1, 1)


def test_legacy_capsule_consumed_once_then_refused() -> None:
    import torch.utils.dlpack

    p = pool()
    t = p.zeros((3,), "float32")
    cap = t.__dlpack__()
    x = torch.utils.dlpack.from_dlpack(cap)
    assert x.data_ptr() == t.data_ptr
    assert capsule_name(cap) == "used_dltensor"
    with pytest.raises(Exception, match=r"(?i)used|consumed|dltensor"):
        torch.utils.dlpack.from_dlpack(cap)
    del t, cap
    gc.collect()
    assert p.stats()["in_use"] == 1, "torch still views the buffer"
    del x
    gc.collect()
    s = p.stats()
    assert (s["in_use"], s["releases"]) == (0, 1)


def test_versioned_capsule_consumed_once_then_refused() -> None:
    import torch.utils.dlpack

    t = ferrofeed.zeros((3,), "float32", pool=pool())
    cap = t.__dlpack__(max_version=(1, 0))
    try:
        x = torch.utils.dlpack.from_dlpack(cap)
    except Exception as e:  # pragma: no cover - torch without versioned capsule input
        pytest.skip(f"this torch does not take versioned capsules directly: {e}")
    assert x.data_ptr() == t.data_ptr
    assert capsule_name(cap) == "used_dltensor_versioned"
    with pytest.raises(Exception, match=r"(?i)used|consumed|dltensor"):
        torch.utils.dlpack.from_dlpack(cap)


# --------------------------------------------------------------------------------------
# lifetime and recycling


def check_view_outlives_tensor_and_pool(take_view: Callable[[Tensor], Any]) -> None:
    """A view by ``take_view`` keeps its buffer: the values stay after the tensor and its
    pool are gone (and the allocator churned), and the buffer goes back once, at its end."""
    p = pool()
    t = p.empty((64, 64), "float32")
    np.from_dlpack(t)[:] = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    view = take_view(t)
    stats = p.stats
    del t, p
    gc.collect()
    # Churn the allocator: freed memory would be reused and overwritten.
    junk = [ferrofeed.empty((64, 64), "float32") for _ in range(8)]
    for j in junk:
        np.from_dlpack(j)[:] = -1
    assert float(view[63, 63]) == 64 * 64 - 1
    assert float(view.sum()) == sum(range(64 * 64))
    assert stats()["in_use"] == 1
    del view
    gc.collect()
    s = stats()
    assert (s["in_use"], s["releases"], s["idle"]) == (0, 1, 1), s


@pytest.mark.parametrize("consumer", ["numpy", "torch"])
def test_views_outlive_the_tensor_and_the_pool(consumer: str) -> None:
    check_view_outlives_tensor_and_pool(
        np.from_dlpack if consumer == "numpy" else torch.from_dlpack
    )


def test_every_view_freed_returns_the_buffer_exactly_once() -> None:
    p = pool()
    t = p.zeros((1000,), "float32")
    views = [np.from_dlpack(t), torch.from_dlpack(t), t.numpy(), ferrofeed.to_torch(t)]
    del t
    for i in range(len(views)):
        views.pop()
        gc.collect()
        s = p.stats()
        expect_released = 1 if not views else 0
        assert s["releases"] == expect_released, (i, s)
    s = p.stats()
    assert (s["allocated"], s["in_use"], s["idle"], s["releases"]) == (1, 0, 1, 1)


def test_pool_recycles_without_growing() -> None:
    p = pool(4)
    for _ in range(200):
        t = p.empty((32, 3, 8, 8), "uint8")
        x = torch.from_dlpack(t)
        a = np.from_dlpack(t)
        del t, x, a
    s = p.stats()
    assert s["allocations"] == 1
    assert s["reuses"] == 199
    assert s["releases"] == 200
    assert (s["allocated"], s["in_use"]) == (1, 0)


def test_exhausted_pool_times_out_clearly() -> None:
    p = pool(2, timeout=0.1)
    held = [p.empty((10,), "uint8"), torch.from_dlpack(p.empty((10,), "uint8"))]
    t0 = time.monotonic()
    with pytest.raises(ferrofeed.PoolExhaustedError, match="all 2 buffers") as ei:
        p.empty((10,), "uint8")
    assert time.monotonic() - t0 >= 0.1
    assert isinstance(ei.value, TimeoutError)
    assert isinstance(ei.value, ferrofeed.FerrofeedError)
    del held
    gc.collect()
    assert p.empty((10,), "uint8").nbytes == 10


def test_waiting_for_a_buffer_releases_the_gil() -> None:
    p = pool(1, timeout=10.0)
    t = p.empty((10,), "uint8")
    got: list[Tensor] = []
    th = threading.Thread(target=lambda: got.append(p.empty((10,), "uint8")))
    th.start()
    time.sleep(0.2)  # the waiting thread must not hold the GIL, or this would hang
    assert not got
    ptr = t.data_ptr
    del t
    th.join(5)
    assert got
    assert got[0].data_ptr == ptr


def test_pool_settings_and_stats() -> None:
    p = BufferPool(8, max_idle=2, pinned=False, timeout=None)
    assert (p.max_buffers, p.max_idle, p.timeout, p.pinned) == (8, 2, None, False)
    ts = [p.empty(100, "uint8") for _ in range(5)]
    del ts
    s = p.stats()
    assert (s["idle"], s["evictions"], s["releases"]) == (2, 3, 5)
    p.clear()
    assert p.stats()["allocated"] == 0
    with pytest.raises(ValueError):
        BufferPool(0)
    with pytest.raises(ValueError):
        BufferPool(4, timeout=-1.0)
    assert BufferPool(None).max_buffers is None
    assert "BufferPool(max_buffers=8" in repr(p)
    assert ferrofeed.default_pool() is ferrofeed.default_pool()


# --------------------------------------------------------------------------------------
# copy, dl_device and stream


def test_copy_true_exports_a_fresh_buffer() -> None:
    p = pool()
    t = p.zeros((4,), "int32")
    np.from_dlpack(t)[:] = [1, 2, 3, 4]
    c = np.from_dlpack(t, copy=True)
    assert c.ctypes.data != t.data_ptr
    assert c.tolist() == [1, 2, 3, 4]
    c[0] = 100
    assert np.from_dlpack(t)[0] == 1
    x = torch.from_dlpack(t.__dlpack__(copy=True))
    assert x.data_ptr() != t.data_ptr
    assert x.data_ptr() % 64 == 0
    assert p.stats()["allocated"] == 1, "copies are not taken from the pool"
    del t
    gc.collect()
    assert p.stats()["in_use"] == 0, "a copy does not hold the source buffer"
    assert x.tolist() == [1, 2, 3, 4]


def test_copy_false_and_none_share() -> None:
    t = ferrofeed.zeros((4,), "int32", pool=pool())
    assert np.from_dlpack(t, copy=False).ctypes.data == t.data_ptr
    assert torch.from_dlpack(t.__dlpack__(copy=None)).data_ptr() == t.data_ptr
    assert torch.from_dlpack(t.__dlpack__(copy=False)).data_ptr() == t.data_ptr


def test_dl_device() -> None:
    t = ferrofeed.zeros((4,), "int32", pool=pool())
    for copy in (None, False, True):
        cap = t.__dlpack__(dl_device=(KDLCPU, 0), copy=copy)
        assert (torch.from_dlpack(cap).data_ptr() == t.data_ptr) is (copy is not True)
    assert np.from_dlpack(t, device="cpu").ctypes.data == t.data_ptr
    for copy in (None, False, True):
        with pytest.raises(BufferError, match="cuda:0"):
            t.__dlpack__(dl_device=(KDLCUDA, 0), copy=copy)
    # CUDA host memory only for a pinned tensor
    with pytest.raises(BufferError, match="cuda_host"):
        t.__dlpack__(dl_device=(KDLCUDAHOST, 0))
    with pytest.raises(ferrofeed.DLPackError):
        t.__dlpack__(dl_device=(KDLCUDA, 0))


def test_stream_must_be_none_for_host_memory() -> None:
    t = ferrofeed.zeros((4,), "int32", pool=pool())
    t.__dlpack__(stream=None)
    t.__dlpack__(stream=-1)
    with pytest.raises(BufferError, match="stream"):
        t.__dlpack__(stream=1)
    with pytest.raises(BufferError, match="stream"):
        t.__dlpack__(stream="default")


def test_dlpack_arguments_are_keyword_only() -> None:
    t = ferrofeed.zeros((1,), "uint8", pool=pool())
    with pytest.raises(TypeError):
        t.__dlpack__(None)  # type: ignore[misc]


# --------------------------------------------------------------------------------------
# JAX


@pytest.mark.timeout(240)
@pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])
def test_jax(x64: bool, run_python: Any, last_json_line: Any) -> None:
    """Values, zero copy, legacy capsules, lifetime and recycling with JAX (in a subprocess).

    JAX starts threads at import; it is kept out of the pytest process, which forks.
    """
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed")
    proc = run_python(
        "import jax_dlpack_checks; jax_dlpack_checks.main()",
        env={"JAX_ENABLE_X64": "1" if x64 else "0", "JAX_PLATFORMS": "cpu"},
        cwd=Path(__file__).resolve().parent,
        timeout=200,
    )
    out = last_json_line(proc.stdout)
    assert out["x64"] is x64
    # On the CPU JAX takes our 64-byte aligned buffers without a copy, every dtype and
    # entry point, except int64 without x64 (narrowed to int32).
    copied = sorted(k for k, same in out["zero_copy"].items() if not same)
    expect = [] if x64 else ["int64/jax.dlpack", "int64/jnp", "int64/to_jax"]
    assert copied == expect
    assert "max_version" not in out["legacy_call"]


# --------------------------------------------------------------------------------------
# imports and adapters


def test_import_ferrofeed_imports_no_framework(run_python: Any) -> None:
    proc = run_python(
        """
        import sys
        import ferrofeed
        t = ferrofeed.zeros((2, 2), "float32")
        t.__dlpack__()
        heavy = sorted(m for m in ("torch", "jax", "jaxlib", "numpy") if m in sys.modules)
        print("heavy:", heavy)
        """
    )
    assert "heavy: []" in proc.stdout, proc.stdout


def test_adapters_import_their_framework_lazily(run_python: Any) -> None:
    proc = run_python(
        """
        import sys
        import ferrofeed
        t = ferrofeed.zeros((2,), "float32")
        ferrofeed.to_torch(t)
        assert "torch" in sys.modules and "jax" not in sys.modules
        ferrofeed.to_jax(t)
        assert "jax" in sys.modules
        print("ok")
        """,
        timeout=120,
    )
    assert "ok" in proc.stdout


def test_to_torch_device() -> None:
    t = ferrofeed.zeros((3,), "float32", pool=pool())
    x = ferrofeed.to_torch(t, device="cpu")
    assert x.data_ptr() == t.data_ptr


def test_adapter_docstrings_run() -> None:
    import doctest

    import ferrofeed.numpy
    import ferrofeed.torch

    # ferrofeed.jax's examples run in test_jax's subprocess
    for mod in (ferrofeed, ferrofeed.numpy, ferrofeed.torch):
        res = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
        assert res.failed == 0, mod.__name__
        assert res.attempted > 0, mod.__name__


# --------------------------------------------------------------------------------------
# pinned memory


def test_pinned_falls_back_or_is_required(run_python: Any) -> None:
    # Run in a fresh process: probing initializes CUDA where a driver exists.
    proc = run_python(
        """
        import ferrofeed
        auto = ferrofeed.BufferPool(2).empty((4,), "uint8")
        known, why = ferrofeed._core.pinned_memory_status()
        print("auto", auto.pinned, known, why)
        try:
            t = ferrofeed.BufferPool(2, pinned=True).empty((4,), "uint8")
            print("required", t.pinned)
        except ferrofeed.PinnedMemoryError as e:
            assert isinstance(e, RuntimeError)
            print("required-error", e)
        """
    )
    out = proc.stdout
    if "auto True" in out:
        assert "required True" in out
    else:
        assert "auto False False" in out
        assert "required-error pinned memory is unavailable" in out


def test_pinned_can_be_disabled_by_environment(run_python: Any) -> None:
    proc = run_python(
        """
        import ferrofeed
        t = ferrofeed.BufferPool(2).empty((4,), "uint8")
        print(t.pinned, ferrofeed.build_info()["pinned_memory"])
        """,
        env={"FERROFEED_DISABLE_CUDA": "1"},
    )
    assert "False unavailable (disabled by FERROFEED_DISABLE_CUDA)" in proc.stdout


def test_build_info_does_not_probe_cuda(run_python: Any) -> None:
    proc = run_python(
        """
        import ferrofeed
        print(ferrofeed.build_info()["pinned_memory"])
        """
    )
    assert "not probed yet" in proc.stdout


def _cuda_available() -> bool:
    return bool(torch.cuda.is_available())


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA device")
def test_pinned_tensors_on_a_gpu_machine() -> None:  # pragma: no cover - GPU only
    p = BufferPool(2, pinned=True)
    t = p.zeros((1024,), "float32")
    assert t.pinned
    assert t.__dlpack_device__() == (KDLCPU, 0)
    x = torch.from_dlpack(t)
    assert x.is_pinned()
    assert x.data_ptr() == t.data_ptr
    y = ferrofeed.to_torch(t, device="cuda")
    assert y.is_cuda
    assert float(y.sum()) == 0.0
    cap = t.__dlpack__(dl_device=(KDLCUDAHOST, 0))
    assert capsule_name(cap) == "dltensor"


class _FakeEvent:
    """Stands for a CUDA event recorded after a copy: done when the test says so."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done


def test_async_device_copy_keeps_the_pooled_buffer_until_the_copy_completes() -> None:
    # Without a GPU: the keeper's logic, with a fake event, on a pooled buffer.
    pytest.importorskip("torch")
    from ferrofeed import BufferPool, torch as ft

    pool = BufferPool(4, pinned=False)
    t = ft.to_torch(pool.empty((8,), "float32"))
    event = _FakeEvent()
    ft._copies.keep(t, event)
    del t
    assert pool.stats()["in_use"] == 1, "the queued copy still reads the buffer"
    ft._copies.release_finished()
    assert pool.stats()["in_use"] == 1
    event.done = True
    ft._copies.release_finished()
    assert pool.stats()["in_use"] == 0, "back in the pool once the copy completed"
    assert len(ft._copies) == 0


def test_to_device_keeps_the_source_only_for_async_cuda_copies() -> None:
    torch = pytest.importorskip("torch")
    from ferrofeed import torch as ft

    events: list[_FakeEvent] = []

    def fake_event(device: object) -> _FakeEvent:
        events.append(_FakeEvent())
        return events[-1]

    src = torch.zeros(4)
    out = ft._to_device(src, "cpu", non_blocking=True, event=fake_event)
    assert out.device.type == "cpu"
    assert events == [], "no copy to a GPU, nothing to wait for"
