"""Load for tests that must hold on a busy machine: ``yes > /dev/null`` children."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator


@contextlib.contextmanager
def cpu_hogs(count: int = 2) -> Iterator[None]:
    """``count`` busy processes (``yes > /dev/null``) for the block's duration."""
    hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
