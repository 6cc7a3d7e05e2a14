"""Type stubs of the compiled core. Use the public names of `ferrofeed` instead."""

from collections.abc import Iterable, Iterator
from os import PathLike
from typing import Any, Self, final

__version__: str
build_profile: str
FORMAT_VERSION: int

class Arena:
    """A memory-mapped arena of pickled items (the engine behind `ferrofeed.SharedList`)."""

    def __new__(cls, items: Iterable[Any], /, *, path: str | PathLike[str] | None = None) -> Self:
        """Build an arena from ``items`` (see `ferrofeed.SharedList`)."""
    @classmethod
    def open(cls, path: str | PathLike[str]) -> Self:
        """Map an existing arena read-only (not owned)."""
    def __len__(self) -> int: ...
    def __getitem__(self, index: int | slice, /) -> Any: ...
    def __iter__(self) -> Iterator[Any]: ...
    def raw(self, index: int) -> memoryview:
        """Return item ``index``'s stored bytes, zero-copy and read-only."""
    def span(self, index: int) -> tuple[int, int]:
        """Return ``(start, end)`` of item ``index`` within `memoryview`."""
    def memoryview(self) -> memoryview:
        """Return a read-only view of the whole file."""
    def header(self) -> dict[str, int]:
        """Return the header fields and layout."""
    def close(self) -> None:
        """Unmap (once no view remains) and, in the owner, remove the file."""
    @property
    def path(self) -> str:
        """The file's path."""
    @property
    def nbytes(self) -> int:
        """Size of the file in bytes."""
    @property
    def owner(self) -> bool:
        """Whether this process created the arena (and removes its file)."""
    @property
    def closed(self) -> bool:
        """Whether `close` was called."""

@final
class _OpenRequest:
    """A request to map an existing arena (internal; made by `Arena.open`)."""

@final
class _ArenaBuffer:
    """The whole mapping, exported read-only through the buffer protocol (internal)."""

def sweep(dir: str | PathLike[str]) -> list[str]:
    """Remove the arenas in ``dir`` that no process holds any more."""

def default_arena_dir() -> str:
    """Return the directory new arenas go to when no path is given."""

@final
class NativeOp:
    """A native pipeline stage (see `ferrofeed.ops`)."""

    @property
    def name(self) -> str:
        """The op's name (the default stage name)."""

def _after_fork_in_child() -> None:
    """Mark pipelines built before a fork as the parent's (internal)."""

def _op_identity() -> NativeOp:
    """Return a native op that passes items through."""

@final
class Pipeline:
    """A built pipeline; iterate it, or use ``with pipeline.auto_stop():``."""

    def __new__(
        cls,
        source: Iterable[Any],
        stages: list[tuple[Any, ...]],
        *,
        sink_buffer: int = 3,
        num_threads: int | None = None,
        runner: Any = None,
        report_interval: float | None = None,
    ) -> Self: ...
    def start(self) -> None:
        """Start the pipeline's threads (iteration starts it too)."""
    def stop(self) -> None:
        """Stop every stage and join every thread; idempotent."""
    def __iter__(self) -> Self: ...
    def __next__(self) -> Any:
        """Return the next item; waits in short GIL-free slices, so Ctrl-C works."""
    @property
    def finished(self) -> bool:
        """Whether every item was delivered, or the pipeline stopped or failed."""
    def stats(self) -> dict[str, dict[str, float]]:
        """Return per-stage figures, keyed by stage name (source first, sink last)."""
    def stats_table(self) -> str:
        """Return the per-stage figures as a printable table."""
    def auto_stop(self) -> Self:
        """Return a context manager that starts on entry, stops and joins on exit."""
    def __enter__(self) -> Self: ...
    def __exit__(self, *args: object) -> bool: ...
