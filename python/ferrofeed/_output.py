"""Handing batches out: output conversion (NumPy, PyTorch, JAX), devices, rank, progress."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from . import _core

if TYPE_CHECKING:
    from jax.sharding import Sharding as Sharding
else:
    Sharding = Any  # for annotations: importing ferrofeed never imports JAX

Output = Literal["numpy", "torch", "jax"]
T = TypeVar("T")


def default_rank_and_world() -> tuple[int, int]:
    """Find the rank and world size.

    From torch.distributed or JAX when initialised, else ``RANK`` and ``WORLD_SIZE`` in the
    environment, else a single process. Never imports a framework.
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    jax = sys.modules.get("jax")
    if jax is not None:
        try:
            count = int(jax.process_count())
        except Exception:  # a JAX without a usable backend: fall through
            count = 1
        if count > 1:
            return int(jax.process_index()), count
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is not None and world is not None:
        return int(rank), int(world)
    return 0, 1


def convert(batch: Any, output: Output, device: str | None) -> Any:
    """A batch as ``output`` wants it (on ``device``), without a copy.

    The native chain's `_core.Tensor` batches (alone, or ``(images, labels)``) become
    arrays of the framework; NumPy arrays inside dicts, tuples and lists too, leaf by leaf.
    """
    if isinstance(batch, _core.Tensor):
        return from_tensor(batch, output, device)
    if type(batch) is tuple and batch and all(isinstance(t, _core.Tensor) for t in batch):
        return tuple(from_tensor(t, output, device) for t in batch)
    if output == "numpy":
        return batch
    if isinstance(batch, dict):
        return {k: convert(v, output, device) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(type(batch), "_fields"):  # a named tuple
        return type(batch)(*(convert(v, output, device) for v in batch))
    if isinstance(batch, tuple | list) and not _is_array(batch):
        return type(batch)(convert(v, output, device) for v in batch)
    if not _is_array(batch):
        return batch
    if output == "torch":
        import torch

        tensor = torch.from_numpy(batch)
        if not device:
            return tensor
        from .torch import _to_device

        # The batch's buffer stays out of its pool (or its worker slot) until the copy ends.
        return _to_device(tensor, device, non_blocking=True)
    import jax

    array = jax.dlpack.from_dlpack(batch) if batch.flags.c_contiguous else jax.numpy.asarray(batch)
    return jax.device_put(array, jax.devices(device)[0]) if device else array


@dataclasses.dataclass(frozen=True)
class Handoff:
    """How a loader hands its batches over: what `convert` makes of them, and when.

    Without a ``sharding``, each batch is converted for ``output`` (and moved to
    ``device``) as it comes. With one (``output="jax"``), `convert` only makes NumPy views
    of the batch's own buffers (the DLPack handoff, no copy), and `ahead` lays each batch
    out over the sharding's devices (`ferrofeed.jax.shard_batch`: one transfer per device)
    ``device_prefetch`` batches ahead of the one the training step holds.
    """

    output: Output
    device: str | None
    sharding: Sharding | None = None
    device_prefetch: int = 2

    def convert(self, batch: Any) -> Any:
        """``batch`` converted as it leaves the executor."""
        if self.sharding is None:
            return convert(batch, self.output, self.device)
        return convert(batch, "numpy", None)

    def ahead(self, batches: Iterator[Any]) -> Iterator[Any]:
        """``batches`` as the consumer gets them: placed on the devices, ahead of need."""
        if self.sharding is None:
            return batches
        from .jax import shard_batch

        sharding = self.sharding
        return placed_ahead(batches, self.device_prefetch, lambda b: shard_batch(b, sharding))


def placed_ahead(items: Iterator[T], depth: int, place: Callable[[T], T]) -> Iterator[T]:
    """Yield ``place(item)`` for each item, the next ``depth`` placed before one is yielded.

    flax's ``prefetch_to_device``, without a thread: `jax.device_put` only queues its
    transfers, so those of the batches placed ahead run while the step that holds the
    current batch runs. The consumer counts what it was given, never what was placed
    ahead (a `DataLoader` counts ``batches_done`` on its side of this generator), so a
    resume stays exact. An ``Exception`` from ``items`` or ``place`` while working ahead
    is raised where its item would have been yielded, after the items before it; any
    other exception (`KeyboardInterrupt`) at once. When the consumer stops (``break``,
    an error, the generator dropped), the items placed ahead are dropped and ``items``
    is closed, which stops the loader's pipeline.
    """
    queue: deque[T] = deque()
    failure: Exception | None = None
    exhausted = False
    try:
        while True:
            while not exhausted and failure is None and len(queue) <= depth:
                try:
                    queue.append(place(next(items)))
                except StopIteration:
                    exhausted = True
                except Exception as e:
                    failure = e
            if not queue:
                break
            yield queue.popleft()
        if failure is not None:
            raise failure
    finally:
        queue.clear()
        close = getattr(items, "close", None)
        if close is not None:
            close()


def _is_array(x: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray)


class Progress:
    """A progress bar: tqdm when installed, else a one-line bar on stderr."""

    def __init__(self, total: int | None, desc: str) -> None:
        # total None: not known (a batch sampler or an iterable without len()).
        self._n, self._total, self._desc = 0, total, desc
        self._start = time.monotonic()
        self._tqdm: Any = None
        try:
            from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]

            self._tqdm = tqdm(total=total, desc=desc, unit="batch")
        except ImportError:
            pass

    def update(self) -> None:
        self._n += 1
        if self._tqdm is not None:
            self._tqdm.update(1)
            return
        rate = self._n / max(time.monotonic() - self._start, 1e-9)
        if self._total is None:
            print(f"\r{self._desc} {self._n} {rate:.1f} batch/s", end="", file=sys.stderr)
            return
        width = 30
        filled = width * self._n // max(self._total, 1)
        bar = "#" * filled + "-" * (width - filled)
        print(
            f"\r{self._desc} [{bar}] {self._n}/{self._total} {rate:.1f} batch/s",
            end="",
            file=sys.stderr,
            flush=True,
        )

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
        else:
            print(file=sys.stderr, flush=True)


def from_tensor(tensor: _core.Tensor, output: Output, device: str | None) -> Any:
    """A batch tensor of the native chain as ``output`` wants it, without a copy."""
    if output == "numpy":
        return tensor.numpy()
    if output == "torch":
        from .torch import to_torch

        return to_torch(tensor, device=device)
    from .jax import to_jax

    array = to_jax(tensor)
    if device is None:
        return array
    import jax

    return jax.device_put(array, jax.devices(device)[0])


def check_device(output: Output, device: str) -> None:
    if output == "numpy":
        raise ValueError("device= needs output='torch' or output='jax'")
    if output == "torch":
        import torch

        dev = torch.device(device)
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError(f"device={device!r}: no CUDA device is available to PyTorch")
            count = torch.cuda.device_count()
            if dev.index is not None and dev.index >= count:
                raise ValueError(
                    f"device={device!r}: PyTorch sees {count} CUDA device(s), "
                    f"cuda:0 to cuda:{count - 1}"
                )
        return
    import jax

    try:
        jax.devices(device)
    except RuntimeError as e:
        raise ValueError(f"device={device!r}: JAX has no such backend ({e})") from None
