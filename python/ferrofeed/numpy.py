"""NumPy adapter: ferrofeed tensors as `numpy.ndarray` views.

Example:
    >>> import ferrofeed
    >>> from ferrofeed.numpy import to_numpy
    >>> to_numpy(ferrofeed.zeros(3, "int64")).tolist()
    [0, 0, 0]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["to_numpy"]


def to_numpy(x: Any, /) -> npt.NDArray[Any]:
    """Return ``x`` (any object with ``__dlpack__``) as an array viewing the same memory.

    ``bfloat16`` has no NumPy dtype; read such tensors with `ferrofeed.to_torch` or
    `ferrofeed.to_jax`.
    """
    return np.from_dlpack(x)
