"""ferrofeed: a framework-agnostic, Rust-accelerated data loader for ML training.

Example:
    >>> import ferrofeed
    >>> with ferrofeed.SharedList([{"file": "a.jpg", "label": 3}]) as meta:
    ...     meta[0]["label"]
    3
"""

from __future__ import annotations

from . import _core, ops
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
    FerrofeedError,
    PipelineError,
)
from ._pipeline import Pipeline, PipelineBuilder
from ._shared_list import SharedList, default_arena_dir

__version__: str = _core.__version__

__all__ = [
    "ArenaBuilderError",
    "ArenaClosedError",
    "ArenaCorruptError",
    "ArenaError",
    "ArenaExistsError",
    "ArenaFullError",
    "ArenaIOError",
    "ArenaNotFoundError",
    "ArenaTimeoutError",
    "FerrofeedError",
    "Pipeline",
    "PipelineBuilder",
    "PipelineError",
    "SharedList",
    "__version__",
    "build_info",
    "default_arena_dir",
    "ops",
]


def build_info() -> dict[str, str]:
    """Versions and build settings, for bug reports.

    Example:
        >>> sorted(build_info())
        ['arena_format', 'build_profile', 'platform', 'python', 'version']
    """
    import platform

    return {
        "version": __version__,
        "build_profile": _core.build_profile,
        "arena_format": str(_core.FORMAT_VERSION),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
