"""JAX adapter: ferrofeed tensors as `jax.Array`.

Importing this module imports JAX; ``import ferrofeed`` alone never does. JAX is an
optional extra: without it, importing this module raises `ModuleNotFoundError` saying to
``pip install 'ferrofeed[jax]'``.

On CPU, JAX takes the buffer without a copy when the data is 64-byte aligned, which every
ferrofeed buffer is.

Example:
    >>> import ferrofeed
    >>> from ferrofeed.jax import to_jax
    >>> a = to_jax(ferrofeed.zeros((2, 3), "float32"))
    >>> a.shape, str(a.dtype)
    ((2, 3), 'float32')
"""

from __future__ import annotations

from typing import Any

from ._dependencies import raise_missing

try:
    import jax
    import jax.dlpack
except ModuleNotFoundError as e:
    raise_missing(
        e,
        "jax",
        "ferrofeed.jax (to_jax, DataLoader(output='jax')) needs JAX, which is not installed: "
        "pip install 'ferrofeed[jax]' (or jax[cuda12] and the like for a GPU)",
    )

__all__ = ["to_jax"]


def to_jax(x: Any, /, *, device: jax.Device | None = None) -> jax.Array:
    """Return ``x`` (any object with ``__dlpack__``) as a `jax.Array`.

    Args:
        x: A `ferrofeed.Tensor`, or any other DLPack producer.
        device: If given, the array is then put there with `jax.device_put`.

    Returns:
        An array with the values of ``x``. On the CPU it shares ``x``'s memory: JAX arrays
        are immutable, so do not write to ``x`` while the array is in use.
    """
    a: jax.Array = jax.dlpack.from_dlpack(x)
    if device is not None:
        a = jax.device_put(a, device)
    return a
