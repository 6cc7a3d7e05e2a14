"""Type stubs of the compiled core. Use the public names of `ferrofeed` instead."""

from collections.abc import Iterable, Iterator, Sequence
from os import PathLike
from typing import Any, final

import numpy as np
import numpy.typing as npt

__version__: str
build_profile: str
FORMAT_VERSION: int
cuda_feature: bool

@final
class Arena:
    """A memory-mapped arena of pickled items (the engine behind `ferrofeed.SharedList`)."""

    @staticmethod
    def build(
        items: Iterable[Any],
        *,
        path: str | PathLike[str] | None = None,
        dir: str | PathLike[str] | None = None,
    ) -> Arena:
        """Build an arena at ``path``, or under a generated name in ``dir``."""
    @staticmethod
    def open(path: str | PathLike[str]) -> Arena:
        """Map an existing arena read-only (not owned)."""
    def __len__(self) -> int: ...
    def __getitem__(self, index: int | slice, /) -> Any: ...
    def __iter__(self) -> Iterator[Any]: ...
    def load(self, index: int) -> Any:
        """Item ``index`` unpickled."""
    def raw(self, index: int) -> memoryview:
        """Item ``index``'s stored bytes, zero-copy and read-only."""
    def span(self, index: int) -> tuple[int, int]:
        """``(start, end)`` of item ``index`` within `memoryview`."""
    def memoryview(self) -> memoryview:
        """A read-only view of the whole file."""
    def header(self) -> dict[str, int]:
        """The header fields and layout."""
    def close(self) -> None:
        """Unmap (once no view remains) and, in the owner, remove the file."""
    @property
    def path(self) -> str: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def owner(self) -> bool: ...
    @property
    def closed(self) -> bool: ...

@final
class _ArenaBuffer:
    """The whole mapping, exported read-only through the buffer protocol (internal)."""

def sweep(dir: str | PathLike[str]) -> list[str]:
    """Remove the arenas in ``dir`` that no process holds any more."""

@final
class Tensor:
    """A tensor in a pooled, 64-byte aligned host buffer, exported by DLPack.

    Hand it to any framework without a copy: ``np.from_dlpack(t)``, ``torch.from_dlpack(t)``,
    ``jax.dlpack.from_dlpack(t)``, or `ferrofeed.to_numpy` / `ferrofeed.to_torch` /
    `ferrofeed.to_jax`. The memory stays valid for as long as any of those views lives, and
    goes back to its pool when the last one (and the tensor) is gone.
    """

    @property
    def shape(self) -> tuple[int, ...]:
        """Extents."""
    @property
    def strides(self) -> tuple[int, ...]:
        """Strides in elements (as in DLPack and PyTorch, not bytes as in NumPy)."""
    @property
    def dtype(self) -> str:
        """``"uint8"``, ``"int32"``, ``"int64"``, ``"float16"``, ``"bfloat16"`` or ``"float32"``."""
    @property
    def device(self) -> str:
        """``"cpu"`` (pinned memory is host memory too)."""
    @property
    def ndim(self) -> int: ...
    @property
    def size(self) -> int:
        """Number of elements."""
    @property
    def itemsize(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def pinned(self) -> bool:
        """Whether the memory is page-locked (CUDA pinned), for fast copies to the GPU."""
    @property
    def data_ptr(self) -> int:
        """Address of the first element (64-byte aligned)."""
    def __len__(self) -> int: ...
    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """A DLPack capsule of this tensor, as the array API standard specifies.

        Versioned (``"dltensor_versioned"``) when ``max_version >= (1, 0)``, legacy
        (``"dltensor"``) otherwise. ``copy=True`` exports a fresh copy; ``copy=False`` or
        ``None`` shares the memory. ``dl_device`` may be the CPU (or CUDA host memory, for a
        pinned tensor); host memory has no stream, so ``stream`` must be None or -1.

        Raises:
            DLPackError: (a `BufferError`) the request cannot be met.
        """
    def __dlpack_device__(self) -> tuple[int, int]:
        """``(device_type, device_id)``: ``(1, 0)``, kDLCPU."""
    def numpy(self) -> npt.NDArray[np.generic]:
        """A NumPy array viewing the same memory (imports NumPy)."""

@final
class BufferPool:
    """A bounded pool of 64-byte aligned host buffers, pinned when a CUDA driver is present.

    At most ``max_buffers`` buffers exist at once (None: no bound). When all are in use,
    making a tensor waits (releasing the GIL, Ctrl-C works) for one to be freed, up to
    ``timeout`` seconds (None: for ever), then raises `PoolExhaustedError`. ``pinned``:
    None pins when a CUDA driver can be loaded (and so initializes CUDA: create the pool
    after forking worker processes), True requires it (`PinnedMemoryError` otherwise),
    False never pins.
    """

    def __new__(
        cls,
        max_buffers: int | None = 64,
        *,
        max_idle: int | None = None,
        pinned: bool | None = None,
        timeout: float | None = 30.0,
    ) -> BufferPool: ...
    def empty(self, shape: int | Sequence[int], dtype: str = "float32") -> Tensor:
        """An uninitialized tensor (a reused buffer keeps its old bytes)."""
    def zeros(self, shape: int | Sequence[int], dtype: str = "float32") -> Tensor:
        """A tensor of zeros."""
    def stats(self) -> dict[str, int]:
        """Counters and gauges of the pool.

        ``allocated``, ``in_use``, ``idle``, ``bytes``, ``pinned`` (buffers now);
        ``allocations``, ``reuses``, ``releases``, ``evictions`` (counts so far).
        """
    def clear(self) -> None:
        """Free every idle buffer."""
    @property
    def max_buffers(self) -> int | None: ...
    @property
    def max_idle(self) -> int: ...
    @property
    def timeout(self) -> float | None: ...
    @property
    def pinned(self) -> bool | None:
        """The ``pinned`` setting (None: when available)."""

def default_pool() -> BufferPool:
    """The pool of `empty` and `zeros`: unbounded, 16 idle buffers kept, never pinned."""

def empty(
    shape: int | Sequence[int], dtype: str = "float32", *, pool: BufferPool | None = None
) -> Tensor:
    """An uninitialized tensor from ``pool`` (default: `default_pool`)."""

def zeros(
    shape: int | Sequence[int], dtype: str = "float32", *, pool: BufferPool | None = None
) -> Tensor:
    """A tensor of zeros from ``pool`` (default: `default_pool`)."""

def pinned_memory_status() -> tuple[bool | None, str | None]:
    """(available, reason): None while no pool has asked for pinned memory yet."""
