"""Helpers the pipeline test modules share (``test_pipeline*.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from ferrofeed import PipelineError


def drain(p: Any) -> list[Any]:
    """All of ``p``'s items, read under ``auto_stop`` (the pipeline is stopped after)."""
    with p.auto_stop():
        return list(p)


def assert_fails_as_programming_error(p: Any) -> None:
    """Draining ``p`` raises a `PipelineError` of one `TypeError` noted as a programming error.

    What a call that fails before the op runs gives (a wrong signature, a bad partial),
    whatever ``on_error`` says.
    """
    with pytest.raises(PipelineError) as info:
        drain(p)
    (inner,) = info.value.exceptions
    assert isinstance(inner, TypeError)
    assert any("programming error" in n for n in inner.__notes__)
