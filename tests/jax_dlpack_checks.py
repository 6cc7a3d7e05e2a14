"""JAX checks of test_dlpack.py, run in a subprocess.

JAX starts threads at import, and forking a process that holds them warns (and may
deadlock): keeping JAX out of the pytest process keeps the fork-based tests sound. Each
check asserts; ``main`` prints one JSON line with what it observed.
"""

from __future__ import annotations

import doctest
import gc
import json
from typing import Any

import ferrofeed
import ferrofeed.jax
import jax
import jax.dlpack
import jax.numpy as jnp
import numpy as np
import torch
from test_dlpack import DTYPES, Recorder, check_view_outlives_tensor_and_pool, pool


def values_and_copies() -> dict[str, bool]:
    """Right values for every dtype; whether JAX kept our buffer (zero copy), per dtype."""
    x64 = bool(jax.config.read("jax_enable_x64"))
    zero_copy: dict[str, bool] = {}
    for dtype in DTYPES:
        t = ferrofeed.empty((3, 4), dtype, pool=pool())
        torch.from_dlpack(t).copy_(torch.arange(12).reshape(3, 4).to(getattr(torch, dtype)))
        # Without jax_enable_x64, JAX narrows 64-bit integers to 32 bits (so, a copy).
        narrowed = dtype == "int64" and not x64
        for name, from_dlpack in [
            ("jax.dlpack", jax.dlpack.from_dlpack),
            ("jnp", jnp.from_dlpack),
            ("to_jax", ferrofeed.to_jax),
        ]:
            a = from_dlpack(t)
            assert a.shape == (3, 4), (dtype, name)
            assert str(a.dtype) == ("int32" if narrowed else dtype), (dtype, name, a.dtype)
            got = np.asarray(a.astype(jnp.float32)).tolist()
            assert got == [[float(4 * i + j) for j in range(4)] for i in range(3)], (dtype, name)
            same = a.unsafe_buffer_pointer() == t.data_ptr
            assert same is not narrowed, (dtype, name, same)
            zero_copy[f"{dtype}/{name}"] = same
    return zero_copy


def asks_for_legacy() -> dict[str, Any]:
    r = Recorder(ferrofeed.zeros((2,), "float32", pool=pool()))
    jax.dlpack.from_dlpack(r)
    assert r.calls
    assert "max_version" not in r.calls[0], r.calls
    assert r.calls[0].get("stream") in (None, -1), r.calls
    return {k: repr(v) for k, v in r.calls[0].items()}


def view_outlives_tensor_and_pool() -> None:
    def take_view(t: ferrofeed.Tensor) -> Any:
        view = jax.dlpack.from_dlpack(t)
        assert view.unsafe_buffer_pointer() == t.data_ptr
        return view

    check_view_outlives_tensor_and_pool(take_view)


def every_view_returns_the_buffer_once() -> None:
    p = pool()
    t = p.zeros((1000,), "float32")
    views: list[Any] = [
        np.from_dlpack(t),
        torch.from_dlpack(t),
        jax.dlpack.from_dlpack(t),
        jnp.from_dlpack(t),
    ]
    del t
    while views:
        views.pop()
        gc.collect()
        assert p.stats()["releases"] == (0 if views else 1), p.stats()
    s = p.stats()
    assert (s["allocated"], s["in_use"], s["idle"], s["releases"]) == (1, 0, 1, 1), s


def docstrings() -> None:
    res = doctest.testmod(ferrofeed.jax)
    assert res.attempted > 0
    assert res.failed == 0


def main() -> None:
    out = {
        "x64": bool(jax.config.read("jax_enable_x64")),
        "zero_copy": values_and_copies(),
        "legacy_call": asks_for_legacy(),
    }
    view_outlives_tensor_and_pool()
    every_view_returns_the_buffer_once()
    docstrings()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
