"""PyTorch adapter: ferrofeed tensors as `torch.Tensor`, without a copy.

Importing this module imports PyTorch; ``import ferrofeed`` alone never does. PyTorch is
an optional extra: without it, importing this module raises `ModuleNotFoundError` saying
to ``pip install 'ferrofeed[torch]'``.

Example:
    >>> import ferrofeed
    >>> from ferrofeed.torch import to_torch
    >>> t = to_torch(ferrofeed.zeros((2, 3), "bfloat16"))
    >>> t.dtype, tuple(t.shape)
    (torch.bfloat16, (2, 3))
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from ._dependencies import raise_missing

try:
    import torch
    import torch.utils.dlpack
except ModuleNotFoundError as e:
    raise_missing(
        e,
        "torch",
        "ferrofeed.torch (to_torch, DataLoader(output='torch')) needs PyTorch, which is not "
        "installed: pip install 'ferrofeed[torch]' (or a build of your choice from pytorch.org)",
    )

__all__ = ["to_torch"]


class _Event(Protocol):
    def query(self) -> bool: ...


class _CopyKeeper:
    """Keeps the host side of asynchronous host-to-device copies until they complete.

    ``Tensor.to(device, non_blocking=True)`` only queues the copy. PyTorch keeps its own
    pinned buffers alive for it, but not memory it merely views by DLPack: a batch buffer
    of ours would go back to its pool (and be refilled by a later batch) while the copy is
    still queued. Each copy's source is kept here with a CUDA event recorded after the
    copy, and let go once the event has completed.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[tuple[_Event, Any]] = []

    def keep(self, source: Any, event: _Event) -> None:
        with self._lock:
            self._pending.append((event, source))
        self.release_finished()

    def release_finished(self) -> None:
        """Let go of the sources whose copies have completed."""
        with self._lock:
            waiting: list[tuple[_Event, Any]] = []
            done: list[tuple[_Event, Any]] = []
            for entry in self._pending:
                (done if entry[0].query() else waiting).append(entry)
            self._pending = waiting
        del done  # the sources go (back to their pools) here, outside the lock

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)


_copies = _CopyKeeper()


def _cuda_event(device: torch.device) -> _Event:
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
    event.record(torch.cuda.current_stream(device))
    return event


def _to_device(
    t: torch.Tensor,
    device: str | torch.device,
    non_blocking: bool,
    event: Callable[[torch.device], _Event] = _cuda_event,
) -> torch.Tensor:
    """``t.to(device)``, keeping ``t`` until an asynchronous copy has completed."""
    out = t.to(device, non_blocking=non_blocking)
    if non_blocking and out.device.type == "cuda" and t.device.type == "cpu":
        _copies.keep(t, event(out.device))
    return out


def to_torch(
    x: Any, /, *, device: str | torch.device | None = None, non_blocking: bool | None = None
) -> torch.Tensor:
    """Return ``x`` (any object with ``__dlpack__``) as a `torch.Tensor` sharing its memory.

    Args:
        x: A `ferrofeed.Tensor`, or any other DLPack producer.
        device: If given, the tensor is then moved there with ``Tensor.to`` (a copy, unless
            it is there already).
        non_blocking: Passed to ``Tensor.to``; by default True when ``x`` is in pinned
            memory, so a copy to the GPU runs asynchronously. ``x``'s memory is then kept
            (and its buffer stays out of its pool) until the copy has completed: a CUDA
            event is recorded after it.

    Returns:
        A tensor that views the same memory as ``x`` (when ``device`` is None or where it
        is already). The memory stays valid for as long as the tensor lives, whatever
        becomes of ``x``.
    """
    t = torch.utils.dlpack.from_dlpack(x)
    if device is None:
        return t
    if non_blocking is None:
        non_blocking = bool(getattr(x, "pinned", False))
    return _to_device(t, device, non_blocking)
