"""Waiting for a condition in tests: poll it with a generous deadline, never a sleep tuned to a quiet machine."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], object], timeout: float = 60.0, interval: float = 0.1) -> bool:
    """Whether ``condition()`` came true within ``timeout`` seconds (asked every ``interval``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return bool(condition())
