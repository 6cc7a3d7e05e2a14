"""JAX adapter: ferrofeed tensors as `jax.Array`, and batches laid out over many devices.

Importing this module imports JAX; ``import ferrofeed`` alone never does. JAX is an
optional extra: without it, importing this module raises `ModuleNotFoundError` saying to
``pip install 'ferrofeed[jax]'``.

On CPU, JAX takes the buffer without a copy when the data is 64-byte aligned, which every
ferrofeed buffer is.

`shard_batch` makes one global `jax.Array` per array of a batch, laid out by a
`jax.sharding.Sharding`, from this process's part of it: what
``DataLoader(output="jax", sharding=...)`` does to every batch.

Example:
    >>> import ferrofeed
    >>> from ferrofeed.jax import to_jax
    >>> a = to_jax(ferrofeed.zeros((2, 3), "float32"))
    >>> a.shape, str(a.dtype)
    ((2, 3), 'float32')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn, cast

from ._dependencies import raise_missing

try:
    import jax
    import jax.dlpack
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec, Sharding
except ModuleNotFoundError as e:
    raise_missing(
        e,
        "jax",
        "ferrofeed.jax (to_jax, DataLoader(output='jax')) needs JAX, which is not installed: "
        "pip install 'ferrofeed[jax]' (or jax[cuda12] and the like for a GPU)",
    )

__all__ = ["shard_batch", "to_jax"]

# Typed here: JAX leaves it unannotated.
_from_local: Callable[..., Any] = jax.make_array_from_process_local_data

_HINT = (
    "with sharding=, the first axis of every array of a batch is the batch, which the "
    "sharding must divide: drop_last=True keeps every batch full"
)


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


def shard_batch(batch: Any, sharding: Sharding, /) -> Any:
    """Return ``batch`` with each of its arrays as one global `jax.Array` laid out by ``sharding``.

    ``batch`` is this process's part of the global batch: a NumPy (or JAX) array, or dicts,
    tuples, lists and named tuples of them, as collated; what is not an array (strings,
    ``None``) stays as it is, and dicts keep their order. The first axis of each array is
    the batch: every process contributes its part (`jax.make_array_from_process_local_data`),
    so the global array has ``len(part) * jax.process_count()`` rows, each process's on its
    own devices.

    The data is placed once: for each of this process's devices, `jax.device_put` reads
    that device's rows of the array as a NumPy view (no copy) and transfers them, one
    transfer per device. On a CPU device, rows that start at a 64-byte boundary are not
    even copied: the device array views the host memory, as a DLPack handoff does. Keep
    the arrays unchanged while the result is in use (ferrofeed's batch buffers are not
    reused before it is freed).

    Args:
        batch: This process's part of the batch.
        sharding: How the global arrays are laid out, e.g.
            ``NamedSharding(mesh, PartitionSpec("data"))``.

    Returns:
        ``batch`` with global arrays in place of its arrays.

    Raises:
        ValueError: An array that ``sharding`` cannot lay out (a batch axis it does not
            divide, no batch axis: a single value); the error names it.
        TypeError: An array of a type JAX has no dtype for; the error names it.

    Example:
        >>> import jax, numpy as np
        >>> from jax.sharding import NamedSharding, PartitionSpec
        >>> from ferrofeed.jax import shard_batch
        >>> mesh = jax.make_mesh((jax.device_count(),), ("data",))
        >>> rows = 2 * jax.device_count()
        >>> batch = {"x": np.ones((rows, 3), np.float32), "name": "b0"}
        >>> sharding = NamedSharding(mesh, PartitionSpec("data"))
        >>> out = shard_batch(batch, sharding)
        >>> out["x"].sharding == sharding, out["x"].shape == (rows * jax.process_count(), 3)
        (True, True)
        >>> out["name"]  # not an array: as it was
        'b0'
    """
    local: list[tuple[str, Any]] = []

    def take(path: str, x: Any) -> Any:
        if x.ndim == 0:
            raise ValueError(f"batch{path} is a single value, with no batch axis ({_HINT})")
        local.append((path, x))
        return x

    _map_arrays(batch, take, "")
    if not local:
        return batch
    try:
        placed = iter(_from_local(sharding, [x for _, x in local]))
    except (ValueError, TypeError) as e:
        _raise_for_the_array(local, sharding, e)
    return _map_arrays(batch, lambda _path, _x: next(placed), "")


def _map_arrays(batch: Any, fn: Callable[[str, Any], Any], path: str) -> Any:
    """``batch`` with ``fn(path, array)`` in place of each array, in order."""
    if isinstance(batch, np.ndarray | jax.Array):
        return fn(path, batch)
    if isinstance(batch, dict):
        return {k: _map_arrays(v, fn, f"{path}[{k!r}]") for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(type(batch), "_fields"):  # a named tuple
        fields = zip(cast(Any, batch)._fields, batch, strict=True)
        return type(batch)(*(_map_arrays(v, fn, f"{path}.{f}") for f, v in fields))
    if isinstance(batch, tuple | list):
        return type(batch)(_map_arrays(v, fn, f"{path}[{i}]") for i, v in enumerate(batch))
    return batch


def _raise_for_the_array(
    local: list[tuple[str, Any]], sharding: Sharding, error: ValueError | TypeError
) -> NoReturn:
    """Raise ``error`` again, naming the first array of ``local`` that ``sharding`` refuses."""
    for path, x in local:
        try:
            _from_local(sharding, x)
        except (ValueError, TypeError) as e:
            kind = TypeError if isinstance(e, TypeError) else ValueError
            where = f"batch{path} (shape {x.shape})"
            raise kind(f"cannot lay {where} out over the devices: {e} ({_HINT})") from e
    raise error


def _check_sharding(sharding: object, batch_size: int, rank: int, world_size: int) -> None:
    """Refuse a ``sharding`` that cannot lay out a loader's batches (see `DataLoader`).

    Raises:
        TypeError: not a `jax.sharding.Sharding`.
        ValueError: ranks other than JAX's processes, or a batch that the sharding does not
            divide, or whose rows it does not give to this process's devices.
    """
    if not isinstance(sharding, Sharding):
        raise TypeError(
            "sharding must be a jax.sharding.Sharding (a NamedSharding over a mesh, say), "
            f"not {type(sharding).__name__}"
        )
    processes, index = jax.process_count(), jax.process_index()
    if (rank, world_size) != (index, processes):
        raise ValueError(
            f"sharding= needs one rank per JAX process: rank {rank} of world_size "
            f"{world_size} is not JAX's process {index} of {processes} (leave rank and "
            "world_size out to take JAX's)"
        )
    rows = batch_size * processes
    if isinstance(sharding, NamedSharding):
        # Only the batch axis is known: the others are probed at sizes the spec divides.
        pieces = [_pieces(sharding, entry) for entry in sharding.spec] or [1]
        if rows % pieces[0]:
            raise ValueError(
                f"sharding= does not divide the batch: its mesh cuts the batch axis into "
                f"{pieces[0]} pieces, and a global batch has {rows} rows (batch_size="
                f"{batch_size} x {processes} JAX process(es)); sharding={sharding}"
            )
        probe = (rows, *pieces[1:])
    elif sharding.is_fully_replicated:
        probe = (rows,)
    else:  # another kind: its arrays are checked as they are placed
        return
    places = sharding.addressable_devices_indices_map(probe).values()
    held = sum(len(range(*s)) for s in {i[0].indices(rows) for i in places if i is not None})
    if held != batch_size:
        raise ValueError(
            f"sharding= gives this process's devices {held} rows of each global batch of "
            f"{rows}, not its own batch_size={batch_size}: the sharding must split the batch "
            f"axis over the processes ({sharding})"
        )


def _pieces(sharding: NamedSharding, entry: Any) -> int:
    """Into how many pieces ``entry`` of a `PartitionSpec` cuts its axis."""
    if entry is None or entry is PartitionSpec.UNCONSTRAINED:
        return 1
    names = (entry,) if isinstance(entry, str) else tuple(entry)
    pieces = 1
    for name in names:
        pieces *= int(sharding.mesh.shape[name])
    return pieces
