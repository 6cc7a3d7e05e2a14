"""What an adapter raises when its framework is missing (polars' ``_dependencies``).

`ferrofeed.torch`, `ferrofeed.jax` and `ferrofeed.numpy` import their framework at the top;
when that import fails, each hands the error to `raise_missing` with its install hint.
"""

from __future__ import annotations

from typing import NoReturn

__all__ = ["raise_missing"]


def raise_missing(error: ModuleNotFoundError, module: str, hint: str) -> NoReturn:
    """Raise `ModuleNotFoundError` for ``module`` with ``hint`` as its message.

    The new error keeps ``name=module`` (for ``except ModuleNotFoundError`` code that looks
    at it) and is chained to ``error``. An ``error`` about another module means ``module``
    is there but broken: its own error says more, and it is raised again as it is.
    """
    if error.name != module:
        raise error
    raise ModuleNotFoundError(hint, name=module) from error
