"""Type stubs of the compiled core. Use the public names of `ferrofeed` instead."""

from collections.abc import Iterable, Iterator
from os import PathLike
from typing import Any, final

__version__: str
build_profile: str
FORMAT_VERSION: int

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
