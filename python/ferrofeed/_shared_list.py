"""`SharedList`: a read-only list stored once per node in a memory-mapped arena."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import re
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Self, TypeVar, overload

from . import _core
from ._errors import (
    ArenaBuilderError,
    ArenaExistsError,
    ArenaNotFoundError,
    ArenaTimeoutError,
)

__all__ = ["SharedList", "default_arena_dir"]

T = TypeVar("T")

# Owned arenas still open, closed (and so removed) at interpreter exit.
_OWNED: weakref.WeakSet[_core.Arena] = weakref.WeakSet()

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,200}")
# A builder's claim file untouched for this long belongs to an earlier run.
_STALE_CLAIM_S = 60.0
# How long a claim must look abandoned before waiters give up on its builder.
_DEAD_BUILDER_GRACE_S = 2.0


def default_arena_dir() -> Path:
    """The directory new arenas go to when no ``path`` is given.

    ``$FERROFEED_ARENA_DIR`` if set, else ``/dev/shm`` (memory-backed and shared by every
    process of the node), else the system's temporary directory.

    Example:
        >>> default_arena_dir().is_dir()
        True
    """
    return Path(_core.default_arena_dir())


@atexit.register
def _close_owned_at_exit() -> None:
    for arena in list(_OWNED):
        with contextlib.suppress(Exception):
            arena.close()


# The SIGTERM handler that was in place when ours was installed (None: not yet installed).
_PREVIOUS_SIGTERM: Callable[[int, FrameType | None], object] | int | None = None
_SIGTERM_LOCK = threading.Lock()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Remove this process's owned arena files, then do what the previous handler would.

    Only the files go: the mappings stay, so a previous handler that shuts down gracefully
    (finishing a step, saving a checkpoint) still reads every SharedList it holds.
    """
    for arena in list(_OWNED):
        with contextlib.suppress(Exception):
            arena._unlink()
    previous = _PREVIOUS_SIGTERM
    if callable(previous):
        previous(signum, frame)
        return
    # The default action: terminate, with the SIGTERM status the parent expects.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_sigterm_handler() -> None:
    """Remove owned arenas on SIGTERM too (atexit does not run on a fatal signal).

    Installed once, when the process first owns an arena, and only from the main thread
    (Python sets signal handlers there only). It chains the handler already in place: a
    Python handler is called after the arenas are removed; the default action then
    terminates the process with SIGTERM as before. Where SIGTERM is ignored, or handled by
    non-Python code, nothing is installed: that handler's behaviour is kept as it is.
    """
    global _PREVIOUS_SIGTERM
    if threading.current_thread() is not threading.main_thread():
        return
    with _SIGTERM_LOCK:
        if _PREVIOUS_SIGTERM is not None:
            return
        current = signal.getsignal(signal.SIGTERM)
        if current is signal.SIG_IGN or current is None or current is _on_sigterm:
            return
        _PREVIOUS_SIGTERM = current
        signal.signal(signal.SIGTERM, _on_sigterm)


class SharedList(_core.Arena, Sequence[T]):
    """A read-only list whose items live once per node, in a memory-mapped file.

    Each item is pickled (protocol 5) into one arena file, on ``/dev/shm`` by default,
    which every process maps read-only. Workers forked, spawned or forkserver-started,
    PyTorch DataLoader workers and other ranks of the node all read the same pages: the
    metadata exists once per node however many processes read it, and reading it never
    copies it (no "copy-on-read" through reference counts, as with a list of dicts).

    NumPy arrays inside items come back as zero-copy, read-only views into the arena.

    The process that creates a SharedList owns its file and removes it on `close`, when
    the object is garbage collected, at interpreter exit, and on SIGTERM (a handler that
    then chains to the one already installed, or terminates the process as SIGTERM
    would). A pickled SharedList is just its path: unpickling maps the same file (not an
    owner). Arenas left by a process killed with SIGKILL are removed by the next arena
    created in their directory, or on demand by ``ferrofeed clean``.

    Args:
        items: any iterable of picklable objects; consumed once, streaming.
        path: where to put the arena: ``None`` for a new file in `default_arena_dir`, an
            existing directory for a new file in it, or the path of a file to create
            (which must not exist).

    Raises:
        ArenaExistsError: ``path`` names an existing file.
        ArenaFullError: the file system cannot hold the arena (nothing is left behind).

    Example:
        >>> from ferrofeed import SharedList
        >>> with SharedList({"id": i, "box": [i, i, 2, 2]} for i in range(1000)) as anns:
        ...     len(anns), anns[-1]["id"], anns[10:12][0]["box"]
        (1000, 999, [10, 10, 2, 2])
    """

    __slots__ = ()

    def __init__(
        self, items: Iterable[T], /, *, path: str | os.PathLike[str] | None = None
    ) -> None:
        # The arena is built (or, for `open`, mapped) by the compiled base class;
        # remember owned ones to remove their files at interpreter exit.
        if self.owner:
            _OWNED.add(self)
            _install_sigterm_handler()

    if TYPE_CHECKING:

        @classmethod
        def open(cls, path: str | os.PathLike[str]) -> Self:
            """Map an existing arena, read-only; this process does not own it.

            Raises:
                ArenaNotFoundError: no such file.
                ArenaCorruptError: the file is not a complete, valid arena.

            Example:
                >>> owner = SharedList(["a", "b"])
                >>> SharedList.open(owner.path)[1]
                'b'
                >>> owner.close()
            """
            ...

        @overload
        def __getitem__(self, index: int, /) -> T: ...
        @overload
        def __getitem__(self, index: slice, /) -> list[T]: ...
        def __getitem__(self, index: int | slice, /) -> T | list[T]: ...
        def __iter__(self) -> Iterator[T]: ...
        def __len__(self) -> int: ...

    @classmethod
    def shared(
        cls,
        build: Callable[[], Iterable[T]],
        *,
        name: str,
        local_rank: int | None = None,
        local_world_size: int | None = None,
        timeout: float = 300.0,
        dir: str | os.PathLike[str] | None = None,
    ) -> Self:
        """Build one arena per node and map it in every local rank.

        Local rank 0 calls ``build()`` and writes its items to the arena
        ``ferrofeed-shared-<name>.arena`` in ``dir``; every other local rank waits for the
        arena to appear and maps it, so the node holds a single copy however many ranks
        it runs. ``local_rank`` and ``local_world_size`` default to the ``LOCAL_RANK``
        and ``LOCAL_WORLD_SIZE`` environment variables that torchrun and similar
        launchers set (else 0 and 1). Rank 0 owns the file.

        Raises:
            ArenaTimeoutError: no arena appeared within ``timeout`` seconds.
            ArenaBuilderError: rank 0's ``build()`` raised, or rank 0 died while building.
            ArenaExistsError: (rank 0) another live process built or is building ``name``.

        Example:
            >>> anns = SharedList.shared(lambda: range(5), name="doc-example")
            >>> list(anns)
            [0, 1, 2, 3, 4]
            >>> anns.close()
        """
        if not _NAME_RE.fullmatch(name):
            raise ValueError(f"name must match {_NAME_RE.pattern}, got {name!r}")
        rank = _env_int("LOCAL_RANK", 0) if local_rank is None else local_rank
        world = _env_int("LOCAL_WORLD_SIZE", 1) if local_world_size is None else local_world_size
        if not 0 <= rank < world:
            raise ValueError(f"local_rank {rank} is not in [0, local_world_size={world})")
        directory = default_arena_dir() if dir is None else Path(dir)
        path = directory / f"ferrofeed-shared-{name}.arena"
        claim = directory / f"ferrofeed-shared-{name}.claim"
        if rank == 0:
            return cls._build_shared(build, path, claim)
        return cls._wait_shared(path, claim, timeout)

    @classmethod
    def _build_shared(cls, build: Callable[[], Iterable[T]], path: Path, claim: Path) -> Self:
        fd = os.open(claim, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            # Waiters probe the claim with momentary shared locks: retry briefly.
            deadline = time.monotonic() + 2.0
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise ArenaExistsError(
                            f"another process is building the shared arena {str(path)!r}",
                        ) from None
                    time.sleep(0.01)
            _write_claim(fd, f"building {os.getpid()}")
            try:
                built = cls(build(), path=path)
            except BaseException as e:
                _write_claim(fd, f"failed {os.getpid()} {type(e).__name__}: {e}")
                raise
            # Unlink before unlocking: a waiter that gets the lock afterwards sees a
            # claim without a name, i.e. a finished build.
            os.unlink(claim)
            return built
        finally:
            os.close(fd)

    @classmethod
    def _wait_shared(cls, path: Path, claim: Path, timeout: float) -> Self:
        started = time.time()
        deadline = time.monotonic() + timeout
        abandoned_since: float | None = None
        delay = 0.005
        while True:
            # An arena no process maps is a dead run's (its owner was killed after building
            # it): rank 0 sweeps it and builds again; wait for that one, never map this.
            if _mapped(path):
                with contextlib.suppress(ArenaNotFoundError):
                    return cls.open(path)
            state = _probe_claim(claim, started)
            if state.startswith("failed"):
                raise ArenaBuilderError(
                    f"local rank 0 failed to build the shared arena {str(path)!r}: "
                    f"{state.split(' ', 2)[-1]}"
                )
            if state.startswith("dead"):
                now = time.monotonic()
                abandoned_since = abandoned_since or now
                if now - abandoned_since >= _DEAD_BUILDER_GRACE_S:
                    raise ArenaBuilderError(
                        f"local rank 0 (pid {state.split()[-1]}) died while building the "
                        f"shared arena {str(path)!r}"
                    )
            else:
                abandoned_since = None
            if time.monotonic() >= deadline:
                raise ArenaTimeoutError(
                    f"no shared arena {str(path)!r} appeared within {timeout:g} s; is local "
                    "rank 0 running and calling SharedList.shared with the same name and dir?",
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self)} items, {self.nbytes} bytes"
        return f"<{type(self).__name__} {self.path!r}: {state}>"


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def _mapped(path: Path) -> bool:
    """Whether some process maps the arena at ``path``.

    Every process that maps an arena holds a shared ``flock`` on it (its owner first of
    all), so an arena held by none is an orphan. Read from ``/proc/locks`` rather than by
    taking a lock: a probe's momentary exclusive lock would make the builder's sweep of
    that orphan fail. Where ``/proc/locks`` cannot be read, any arena counts as mapped.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            table = f.read()
    except OSError:
        return True
    target = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        fields = line.split()
        # "N: FLOCK ADVISORY READ PID MAJ:MIN:INODE START END"; "N: -> ..." lines are
        # processes waiting for a lock, not holding one.
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == target:
            return True
    return False


def _write_claim(fd: int, text: str) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)


def _probe_claim(claim: Path, started: float) -> str:
    """What a builder's claim file says.

    ``"none"`` (no claim, or a stale one from an earlier run), ``"building"`` (its
    builder holds it), ``"failed PID MESSAGE"``, or ``"dead PID"`` (nobody holds it
    although it says building).
    """
    try:
        fd = os.open(claim, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return "none"
    try:
        st = os.fstat(fd)
        if st.st_mtime < started - _STALE_CLAIM_S:
            return "none"
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return "building"
        if os.fstat(fd).st_nlink == 0:
            return "none"  # finished meanwhile: the arena is there now
        text = os.pread(fd, 4096, 0).decode(errors="replace")
        if text.startswith("failed"):
            return text
        parts = text.split()
        if len(parts) == 2 and parts[0] == "building" and parts[1].isdigit():
            pid = int(parts[1])
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return f"dead {pid}"
            except PermissionError:
                pass
            # Unlocked, but its process lives: it is between claiming and locking, or
            # the pid was reused; keep waiting (the timeout bounds this).
        return "none"
    finally:
        os.close(fd)
