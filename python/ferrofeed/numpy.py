"""NumPy adapter: ferrofeed tensors as `numpy.ndarray` views.

NumPy is a dependency of ferrofeed (``pip install ferrofeed`` installs it); where it is
missing all the same, importing this module raises `ModuleNotFoundError` saying what to
install.

Example:
    >>> import ferrofeed
    >>> from ferrofeed.numpy import to_numpy
    >>> to_numpy(ferrofeed.zeros(3, "int64")).tolist()
    [0, 0, 0]
"""

from __future__ import annotations

from typing import Any

from ._dependencies import raise_missing

try:
    import numpy as np
    import numpy.typing as npt
except ModuleNotFoundError as e:
    raise_missing(
        e,
        "numpy",
        "ferrofeed.numpy needs NumPy, a dependency of ferrofeed that is missing from this "
        "environment: pip install 'numpy>=2.2' (installing ferrofeed with pip brings it)",
    )

__all__ = ["to_numpy"]


def to_numpy(x: Any, /) -> npt.NDArray[Any]:
    """Return ``x`` (any object with ``__dlpack__``) as an array viewing the same memory.

    ``bfloat16`` has no NumPy dtype; read such tensors with `ferrofeed.to_torch` or
    `ferrofeed.to_jax`.
    """
    return np.from_dlpack(x)
