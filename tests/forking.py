"""Helpers for the test snippets that ``os.fork()``, imported by their interpreters.

The snippets run in a fresh ``sys.executable -c`` process started with ``cwd=TESTS_DIR``
(``-c`` puts the working folder first on ``sys.path``), so ``from forking import ...`` finds
this module.
"""

from __future__ import annotations

import os
import signal
import time

HUNG = -1
"""What `wait_or_kill` returns for a child it had to kill."""


def wait_or_kill(pid: int, timeout: float, poll: float = 0.01) -> int:
    """Wait for the forked child ``pid`` and return its wait status.

    A child that has not exited within ``timeout`` seconds is killed (SIGKILL) and reaped,
    and `HUNG` is returned. ``poll`` is the time between two looks.
    """
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return HUNG
        time.sleep(poll)
