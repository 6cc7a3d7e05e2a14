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

from typing import Any

try:
    import torch
    import torch.utils.dlpack
except ModuleNotFoundError as e:
    if e.name != "torch":  # PyTorch is there but broken: its own error says more
        raise
    raise ModuleNotFoundError(
        "ferrofeed.torch (to_torch, DataLoader(output='torch')) needs PyTorch, which is not "
        "installed: pip install 'ferrofeed[torch]' (or a build of your choice from pytorch.org)",
        name="torch",
    ) from e

__all__ = ["to_torch"]


def to_torch(
    x: Any, /, *, device: str | torch.device | None = None, non_blocking: bool | None = None
) -> torch.Tensor:
    """Return ``x`` (any object with ``__dlpack__``) as a `torch.Tensor` sharing its memory.

    Args:
        x: A `ferrofeed.Tensor`, or any other DLPack producer.
        device: If given, the tensor is then moved there with ``Tensor.to`` (a copy, unless
            it is there already).
        non_blocking: Passed to ``Tensor.to``; by default True when ``x`` is in pinned
            memory, so a copy to the GPU runs asynchronously.

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
    return t.to(device, non_blocking=non_blocking)
