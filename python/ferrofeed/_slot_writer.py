"""The worker side of a shared batch slot: a bump allocator over a growable memfd.

A `DataLoader` worker process collates each batch straight into a *slot*, an anonymous
shared memory file the main process maps once (see `ferrofeed._workers`). `SlotWriter`
is the worker's view of one slot: `SlotWriter.array` hands out uninitialised NumPy
arrays in it (64-byte aligned), growing the file when a batch needs more room, and
`SlotWriter.offset_of` tells where an array of the current batch lives, for the header
the main process decodes.

Example:
    >>> import os
    >>> fd = os.memfd_create("slot")
    >>> slot = SlotWriter(fd)
    >>> slot.begin(0)
    >>> a = slot.array((2, 3), "float32")
    >>> slot.offset_of(a), a.shape
    (0, (2, 3))
"""

from __future__ import annotations

import mmap
import os
from typing import Any

__all__ = ["SlotWriter"]

_ALIGN = 64
_PAGE = mmap.PAGESIZE


def _address(buf: mmap.mmap) -> int:
    import numpy as np

    return int(np.frombuffer(buf, np.uint8, 1).__array_interface__["data"][0])


class SlotWriter:
    """A worker's view of one shared slot: a bump allocator that grows the file.

    Args:
        fd: the slot's file descriptor (a memfd received from the main process); the
            writer maps it and grows it with ``ftruncate`` as batches need.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.size = os.fstat(fd).st_size
        self.map: mmap.mmap | None = mmap.mmap(fd, self.size) if self.size else None
        self.used = 0
        # (address, size) of each mapping that arrays of the current batch may live in.
        self.regions: list[tuple[int, int]] = []

    def begin(self, size_hint: int) -> None:
        """Start a new batch: reuse the slot from its start, grown to ``size_hint`` bytes."""
        self.used = 0
        if size_hint > self.size:
            self._grow(size_hint)
        self.regions = [(_address(self.map), self.size)] if self.map is not None else []

    def _grow(self, need: int) -> None:
        new = max(need, 2 * self.size)
        new = -(-new // _PAGE) * _PAGE
        os.ftruncate(self.fd, new)
        try:
            # Reserve the memory now: a full tmpfs is a clean error here, not a SIGBUS
            # when a page is first written.
            os.posix_fallocate(self.fd, self.size, new - self.size)
        except OSError as e:
            raise MemoryError(
                f"cannot grow a shared batch slot to {new} bytes: {e.strerror}"
            ) from e
        # Arrays already placed keep the old mapping alive (same file, same pages).
        self.map = mmap.mmap(self.fd, new)
        self.size = new
        self.regions.append((_address(self.map), new))

    def alloc(self, nbytes: int) -> int:
        """Reserve ``nbytes`` (64-byte aligned) and return their offset."""
        offset = -(-self.used // _ALIGN) * _ALIGN
        if offset + nbytes > self.size:
            self._grow(offset + nbytes)
        self.used = offset + nbytes
        return offset

    def array(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A new uninitialised array in the slot."""
        import numpy as np

        dtype = np.dtype(dtype)
        count = 1
        for n in shape:
            count *= n
        offset = self.alloc(count * dtype.itemsize)
        assert self.map is not None
        return np.frombuffer(self.map, dtype, count, offset).reshape(shape)

    def offset_of(self, arr: Any) -> int | None:
        """The offset of ``arr``'s data in the slot, if it is a contiguous array there."""
        if not arr.flags.c_contiguous:
            return None
        addr = arr.__array_interface__["data"][0]
        for base, size in self.regions:
            if base <= addr and addr + arr.nbytes <= base + size:
                return int(addr - base)
        return None
