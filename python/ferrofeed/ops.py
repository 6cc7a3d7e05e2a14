"""Native pipeline ops: stages that run in Rust, never taking the GIL.

Pass them to `PipelineBuilder.pipe` like a function. A chain of native ops over a native
source (a ``range``) runs without touching the GIL until items reach the consumer.

Example:
    >>> from ferrofeed import PipelineBuilder, ops
    >>> p = PipelineBuilder().add_source(range(3)).pipe(ops.identity()).add_sink().build()
    >>> list(p)
    [0, 1, 2]
"""

from __future__ import annotations

from . import _core

__all__ = ["NativeOp", "identity"]

NativeOp = _core.NativeOp


def identity() -> NativeOp:
    """Pass items through unchanged (a native no-op, for measuring overhead).

    Example:
        >>> identity().name
        'identity'
    """
    return _core._op_identity()
