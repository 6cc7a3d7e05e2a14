"""The exception hierarchy of ferrofeed.

Every exception ferrofeed raises on purpose derives from `FerrofeedError`,
and also from the standard exception whose meaning it shares, so that code
which already catches ``FileNotFoundError`` or ``ValueError`` keeps working.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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
    "BufferAllocationError",
    "CollateError",
    "CollateKeyError",
    "CollateTypeError",
    "CollateValueError",
    "DLPackError",
    "FerrofeedError",
    "ImageDecodeError",
    "ImageError",
    "ImageReadError",
    "PackConflictError",
    "PackDestinationError",
    "PackError",
    "PackInputError",
    "PinnedMemoryError",
    "PipelineError",
    "PoolExhaustedError",
    "ShardCorruptError",
    "ShardError",
    "ShardFieldError",
    "ShardNotFoundError",
    "ShardPermissionError",
    "ShardReadError",
    "StagingError",
]


class FerrofeedError(Exception):
    """Base class of every error ferrofeed raises."""


class _PlainMessage(Exception):
    """A one-argument error whose ``str()`` is that argument, also on an `OSError` subclass.

    OSError's own rendering, ``[Errno N] message: 'file'``, would name the file twice: the
    message names it already.
    """

    def __str__(self) -> str:
        if len(self.args) == 1:
            return str(self.args[0])
        return super().__str__()


class ArenaError(_PlainMessage, FerrofeedError):
    """Base class of the errors of shared arenas (`ferrofeed.SharedList`).

    The `OSError` subclasses carry ``errno`` and ``filename``; their message is the plain
    text, not OSError's ``[Errno N] ...: 'file'`` rendering, since it names the file already.
    """


class ArenaNotFoundError(ArenaError, FileNotFoundError):
    """The arena file does not exist (or its directory does not)."""


class ArenaExistsError(ArenaError, FileExistsError):
    """The target path of a new arena exists already; arenas are never overwritten."""


class ArenaCorruptError(ArenaError, ValueError):
    """The file is not a complete, valid arena: truncated, foreign, half-written or damaged."""


class ArenaFullError(ArenaError, OSError):
    """Not enough space for the arena; the message says how much was needed and free."""


class ArenaIOError(ArenaError, OSError):
    """An operating-system call on an arena file failed."""


class ArenaClosedError(ArenaError, ValueError):
    """The arena was used after ``close()``."""


class ArenaTimeoutError(ArenaError, TimeoutError):
    """Waiting for another rank's arena took longer than the timeout."""


class ArenaBuilderError(ArenaError, RuntimeError):
    """The local rank that builds a shared arena failed or died before finishing it."""


class PipelineError(FerrofeedError, ExceptionGroup):
    """A pipeline stage (or its source) failed; the original exception is inside.

    An `ExceptionGroup` whose single member is the exception the stage raised, with its
    own traceback and a note naming the stage; ``stage`` holds the stage's name. Catch
    it as ``except PipelineError``, or the original type with ``except*``.
    """

    stage: str

    def derive(self, excs: Sequence[Exception]) -> PipelineError:  # type: ignore[override]
        derived = PipelineError(self.message, excs)
        derived.stage = getattr(self, "stage", "")
        return derived


class StagingError(FerrofeedError):
    """Base class of the errors of buffer pools and tensors (`ferrofeed.BufferPool`)."""


class PoolExhaustedError(StagingError, TimeoutError):
    """Every buffer of a pool stayed in use for the pool's whole timeout.

    The consumer holds on to its tensors (or to views of them: NumPy arrays, torch tensors),
    or ``max_buffers`` is lower than the number it keeps at once.
    """


class PinnedMemoryError(StagingError, RuntimeError):
    """Pinned memory was required (``pinned=True``) and the CUDA driver cannot give it."""


class BufferAllocationError(StagingError, MemoryError):
    """The allocator refused a buffer of the size asked for."""


class DLPackError(StagingError, BufferError):
    """A ``__dlpack__`` request cannot be met (another device, a stream for host memory).

    A `BufferError`, as the array API standard specifies.
    """


class ImageError(_PlainMessage, FerrofeedError):
    """Base class of the errors of image decoding (`ferrofeed.io`).

    The message starts with the file's path (or ``item N`` for bytes in a batch).
    """


class ImageDecodeError(ImageError, ValueError):
    """The bytes are not a decodable image: empty, truncated, corrupt, or not JPEG/PNG/WebP/BMP."""


class ImageReadError(ImageError, OSError):
    """The image file cannot be read; ``errno`` and ``filename`` are set."""


class WorkerError(FerrofeedError, RuntimeError):
    """A `DataLoader` worker process failed in a way that is not the user's exception.

    A user's exception raised in a worker (in ``dataset[i]``, ``transform`` or
    ``collate``) reaches the main process as itself, with the worker's traceback in a
    note; this class covers the rest (an exception that cannot be sent back, a worker that
    cannot start).
    """


class WorkerDiedError(WorkerError):
    """A `DataLoader` worker process died (killed by a signal, or exited) mid-epoch.

    The message names the worker's pid, the signal or exit code, and the sample indices
    it held. ``pid``, ``signal`` (a `signal.Signals` or None), ``exitcode`` and ``indices``
    carry the same as attributes.
    """

    def __init__(
        self,
        message: str,
        *,
        pid: int,
        exitcode: int | None,
        indices: Sequence[int] = (),
    ) -> None:
        super().__init__(message)
        import signal as _signal

        self.pid = pid
        self.exitcode = exitcode
        self.signal = _signal.Signals(-exitcode) if exitcode is not None and exitcode < 0 else None
        self.indices = list(indices)


class WorkerTimeoutError(WorkerError, TimeoutError):
    """A batch took longer than the `DataLoader`'s ``timeout`` to come back from a worker."""


class TooManyFailuresError(FerrofeedError, RuntimeError):
    """More samples failed under ``on_error="skip"`` than ``max_failures`` allows.

    Also raised by a `DataLoader` epoch in which every sample failed (it would otherwise
    yield no batch at all). The failures are listed in ``loader.stats()["skipped"]``.
    """


class CollateError(FerrofeedError):
    """The samples of a batch cannot be collated into one.

    Raised, as one of the subclasses below, by `default_collate` (and so by a `DataLoader`
    that collates with it) and by the native chain's collate (``ops.collate()``, or a
    `DataLoader` with ``transform=ops.decode_image(...)``). Each subclass is also the
    standard error of the same meaning, so ``except ValueError`` keeps working. Those of
    `default_collate` name the field path and the batch entries that disagree, with the
    attributes ``path`` (e.g. ``"sample['image']"``) and ``entries`` (the batch positions
    named; see `describe_entries`).
    """


class CollateTypeError(CollateError, TypeError):
    """A field of a type that cannot be collated, or whose types or dtypes disagree.

    Also raised for items the native collate does not take (not decoded images).
    """


class CollateValueError(CollateError, ValueError):
    """Entries that do not fit together, or no entries at all.

    Arrays or images of different shapes at one field, sequences of different lengths,
    labels on some images of a batch only, or an empty batch.
    """


class CollateKeyError(CollateError, KeyError):
    """A dict sample lacks a key that the batch's first sample has."""

    def __str__(self) -> str:
        # The message as it is (KeyError's own str() would quote it, as it does a key).
        return str(self.args[0]) if self.args else ""


class ShardError(FerrofeedError):
    """Base class of the errors of sharded sources (`TarShards`, `ParquetShards`, `JsonLines`).

    The message starts with the shard's path, then where in it (``member NAME``, ``row group
    G``, ``line N``). ``shard`` and ``at`` carry the same as attributes (``at`` is None when
    the whole shard is concerned).
    """

    def __init__(self, message: str, shard: str | None = None, at: str | None = None) -> None:
        super().__init__(message)
        self.shard = shard
        self.at = at

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple[Any, ...]:
        # Through a worker's pipe with its shard and place (args holds the message alone).
        return (type(self), (str(self), self.shard, self.at))


class ShardReadError(ShardError, OSError):
    """A shard cannot be opened or read (missing, unreadable)."""


class ShardNotFoundError(ShardReadError, FileNotFoundError):
    """A remote shard, or its bucket, does not exist (HTTP 404): raised at once, not retried.

    ``shard`` is the URL.
    """


class ShardPermissionError(ShardReadError, PermissionError):
    """The store refused the credentials for a remote shard (HTTP 401, 403): not retried.

    ``shard`` is the URL.
    """


class ShardCorruptError(ShardError, ValueError):
    """A shard's content is not what its format says.

    A truncated tar, a corrupt Parquet page or footer, a malformed JSON line, a sample split
    across two shards, a shard that changed since it was counted, or a field that does not
    decode (``cls`` not an integer).
    """


class ShardFieldError(ShardError, LookupError):
    """A sample lacks the field that ``image=`` or ``label=`` names.

    The message lists the fields it has.
    """


class PackError(FerrofeedError):
    """Base class of the errors of writing shards (`ferrofeed.write_shards`, ``ferrofeed pack``)."""


class PackInputError(_PlainMessage, PackError, ValueError):
    """A sample cannot be packed: its file is unreadable, not an image, or not whole.

    The message starts with the file's path (or the sample's key); ``sample`` carries it.
    With ``on_error="skip"`` such samples are left out and listed in the summary instead.
    """

    sample: str | None = None


class PackDestinationError(_PlainMessage, PackError, OSError):
    """The destination cannot be written.

    A folder that cannot be made or written, a bucket that does not exist, refused
    credentials, a failed upload. ``filename`` is the destination (or the file in it),
    ``errno`` the OS error's for a local folder. Raised before any shard is written when the
    destination itself is the problem.
    """


class PackConflictError(_PlainMessage, PackError, FileExistsError):
    """The destination holds something other than this pack.

    Files no pack wrote, a pack of other input or options, or another pack writing it now. A
    pack of the same input and options is resumed, never refused.
    """
