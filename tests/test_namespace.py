"""The top-level namespace: the public API, nothing else."""

from __future__ import annotations

import ferrofeed


def test_namespace_holds_only_the_public_api() -> None:
    extra = {n for n in dir(ferrofeed) if not n.startswith("_") and n not in ferrofeed.__all__}
    assert extra == set(), extra
    assert all(hasattr(ferrofeed, n) for n in ferrofeed.__all__)
