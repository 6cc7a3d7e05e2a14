"""ferrofeed: a framework-agnostic, Rust-accelerated data loader for ML training.

Example:
    >>> import ferrofeed
    >>> with ferrofeed.SharedList([{"file": "a.jpg", "label": 3}]) as meta:
    ...     meta[0]["label"]
    3
    >>> t = ferrofeed.zeros((2, 3), "uint8")  # a 64-byte aligned, pooled buffer
    >>> t.numpy().tolist()  # a zero-copy NumPy view, through DLPack
    [[0, 0, 0], [0, 0, 0]]

``import ferrofeed`` imports neither NumPy, PyTorch nor JAX: `to_numpy`, `to_torch` and
`to_jax` import their framework when first called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING, Any as _Any

from ._native import load_core as _load_core

# Before any other import of ferrofeed._core: the x86-64-v3 build where the wheel holds it and
# the CPU runs it, else the portable one (FERROFEED_CPU overrides; see _native). build_info()
# says which.
_native_build = _load_core()

from . import _core, io, ops
from ._collate import default_collate
from ._core import BufferPool, Tensor, default_pool, empty, zeros
from ._errors import (
    ArenaBuilderError,
    ArenaClosedError,
    ArenaCorruptError,
    ArenaError,
    ArenaExistsError,
    ArenaFullError,
    ArenaIOError,
    ArenaNotFoundError,
    ArenaTimeoutError,
    BufferAllocationError,
    CollateError,
    CollateKeyError,
    CollateTypeError,
    CollateValueError,
    DLPackError,
    FerrofeedError,
    ImageDecodeError,
    ImageError,
    ImageReadError,
    PackConflictError,
    PackDestinationError,
    PackError,
    PackInputError,
    PinnedMemoryError,
    PipelineError,
    PoolExhaustedError,
    ShardCorruptError,
    ShardError,
    ShardFieldError,
    ShardNotFoundError,
    ShardPermissionError,
    ShardReadError,
    StagingError,
    TooManyFailuresError,
    WorkerDiedError,
    WorkerError,
    WorkerTimeoutError,
)
from ._images import IMAGE_EXTENSIONS, ImageFiles, ImageFolder
from ._loader import DataLoader
from ._mix import Mix
from ._pack import PackSummary, SkippedSample, index_shards, write_shards
from ._pipeline import Aggregator, Pipeline, PipelineBuilder, TaskHook
from ._sample import sample_rng
from ._shards import JsonLines, MDSShards, ParquetShards, ShardedSource, TarShards
from ._shared_list import SharedList, default_arena_dir
from ._workers import WorkerInfo, get_worker_info

if _TYPE_CHECKING:
    import jax
    import numpy.typing as npt
    import torch

__version__: str = _core.__version__

__all__ = [
    "IMAGE_EXTENSIONS",
    "Aggregator",
    "ArenaBuilderError",
    "ArenaClosedError",
    "ArenaCorruptError",
    "ArenaError",
    "ArenaExistsError",
    "ArenaFullError",
    "ArenaIOError",
    "ArenaNotFoundError",
    "ArenaTimeoutError",
    "BufferAllocationError",
    "BufferPool",
    "CollateError",
    "CollateKeyError",
    "CollateTypeError",
    "CollateValueError",
    "DLPackError",
    "DataLoader",
    "FerrofeedError",
    "ImageDecodeError",
    "ImageError",
    "ImageFiles",
    "ImageFolder",
    "ImageReadError",
    "JsonLines",
    "MDSShards",
    "Mix",
    "PackConflictError",
    "PackDestinationError",
    "PackError",
    "PackInputError",
    "PackSummary",
    "ParquetShards",
    "PinnedMemoryError",
    "Pipeline",
    "PipelineBuilder",
    "PipelineError",
    "PoolExhaustedError",
    "ShardCorruptError",
    "ShardError",
    "ShardFieldError",
    "ShardNotFoundError",
    "ShardPermissionError",
    "ShardReadError",
    "ShardedSource",
    "SharedList",
    "SkippedSample",
    "StagingError",
    "TarShards",
    "TaskHook",
    "Tensor",
    "TooManyFailuresError",
    "WorkerDiedError",
    "WorkerError",
    "WorkerInfo",
    "WorkerTimeoutError",
    "__version__",
    "build_info",
    "default_arena_dir",
    "default_collate",
    "default_pool",
    "empty",
    "get_worker_info",
    "index_shards",
    "io",
    "ops",
    "sample_rng",
    "to_jax",
    "to_numpy",
    "to_torch",
    "write_shards",
    "zeros",
]


def to_numpy(x: _Any, /) -> npt.NDArray[_Any]:
    """Return ``x`` as a `numpy.ndarray` sharing its memory (see `ferrofeed.numpy`)."""
    from .numpy import to_numpy

    return to_numpy(x)


def to_torch(
    x: _Any, /, *, device: str | torch.device | None = None, non_blocking: bool | None = None
) -> torch.Tensor:
    """Return ``x`` as a `torch.Tensor` sharing its memory (see `ferrofeed.torch.to_torch`)."""
    from .torch import to_torch

    return to_torch(x, device=device, non_blocking=non_blocking)


def to_jax(x: _Any, /, *, device: jax.Device | None = None) -> jax.Array:
    """Return ``x`` as a `jax.Array` (see `ferrofeed.jax.to_jax`)."""
    from .jax import to_jax

    return to_jax(x, device=device)


def build_info() -> dict[str, str]:
    """Versions and build settings, for bug reports.

    Example:
        >>> sorted(build_info())  # doctest: +NORMALIZE_WHITESPACE
        ['arena_format', 'build_profile', 'cuda_feature', 'native_build', 'pinned_memory',
         'platform', 'python', 'version']

    ``native_build`` is the build of the native extension this process loaded:
    ``"x86-64-v3"`` (in the x86_64 wheel, on CPUs with AVX2, FMA and BMI2) or ``"baseline"``
    (any CPU; ``FERROFEED_CPU=baseline`` picks it).
    """
    import platform

    known, why = _core.pinned_memory_status()
    if known is None:
        pinned = "not probed yet"
    elif known:
        pinned = "available"
    else:
        pinned = f"unavailable ({why})"
    return {
        "version": __version__,
        "build_profile": _core.build_profile,
        "native_build": _native_build,
        "arena_format": str(_core.FORMAT_VERSION),
        "cuda_feature": str(_core.cuda_feature),
        "pinned_memory": pinned,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


# `from __future__ import annotations` binds this name; it is not part of the API.
del annotations
