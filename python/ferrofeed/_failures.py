"""A `DataLoader`'s failure budget under ``on_error="skip"``: `Failures`.

The executors report each skipped sample with its batch; the loader hands them to
`Failures.record`, which logs the skip, lists it for ``stats()["skipped"]`` and raises
`TooManyFailuresError` past ``max_failures`` in one epoch; `Failures.check_epoch` raises it
for an epoch in which every sample failed.
"""

from __future__ import annotations

import logging
import threading

from ._errors import TooManyFailuresError

__all__ = ["Failures"]

_log = logging.getLogger("ferrofeed.loader")


class Failures:
    """The samples skipped so far (every epoch), and the current epoch's count.

    Thread-safe: ``stats()`` reads the list while the loader's iteration adds to it.
    """

    def __init__(self, max_failures: int | None) -> None:
        self.max_failures = max_failures
        self._skipped: list[tuple[int, str]] = []
        self._lock = threading.Lock()
        self._in_epoch = 0  # samples skipped in the current iteration

    def new_epoch(self) -> None:
        """Start counting the skips of an iteration from zero."""
        with self._lock:
            self._in_epoch = 0

    def skipped(self) -> list[tuple[int, str]]:
        """Every sample skipped so far, as (index, reason), in order."""
        with self._lock:
            return list(self._skipped)

    def record(self, index: int, reason: str) -> None:
        """Note a sample skipped under ``on_error="skip"``; raise past ``max_failures``."""
        _log.warning("skipped sample %d: %s", index, reason)
        with self._lock:
            self._skipped.append((index, reason))
            self._in_epoch += 1
            failures = self._in_epoch
        if self.max_failures is not None and failures > self.max_failures:
            raise TooManyFailuresError(
                f"{failures} samples failed in this epoch, more than max_failures="
                f"{self.max_failures} (the last: sample {index}: {reason}); see "
                "loader.stats()['skipped'], or raise max_failures (None: no limit)"
            )

    def check_epoch(self, epoch: int, todo: int | None, yielded: int) -> None:
        """Raise if every sample failed in an epoch with batches to give.

        ``todo``: the epoch's batches (None: not known); ``yielded``: those given.
        """
        if (todo is None or todo > 0) and yielded == 0 and self._in_epoch > 0:
            raise TooManyFailuresError(
                f"every sample of epoch {epoch} failed ({self._in_epoch} skipped); see "
                "loader.stats()['skipped']"
            )
