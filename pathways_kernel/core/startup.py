"""What the kernel is doing while its backend starts: the local Pathways server's steps, as they happen.

The kernel starts the default backend (``local:SxC``) beside its own start instead of before it
(``kernel.py``), so the frontend can connect at once; until the backend is up, this says what is
happening. The server's launcher reports the steps the server really goes through (its process
is up, its devices exist, it listens), the backend the last one (the client connected); the
monitor comm sends each change (a ``starting`` message) and a cell run meanwhile waits on
``wait`` under a line that counts the seconds.

    startup.begin("starting the local Pathways server (2 slices x 4 chips)", LOCAL_SERVER_STEPS)
    startup.advance("devices")
    startup.finish()            # or finish("the local Pathways server did not start: ...")
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

#: The steps of a local server's start, in order: what the launcher and the backend report.
LOCAL_SERVER_STEPS = ("process up", "devices", "listening", "connected")
#: States of a start.
STARTING, READY, FAILED = "starting", "ready", "failed"


@dataclasses.dataclass(frozen=True)
class Progress:
    """One moment of a start."""

    what: str  # "starting the local Pathways server (2 slices x 4 chips)"
    steps: tuple[str, ...]
    done: int  # how many of ``steps`` are done
    state: str  # STARTING, READY or FAILED
    error: str | None  # one line, when FAILED
    started: float  # time.monotonic() when the start began

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def step(self) -> str:
        """The last step done (``launching`` before the first)."""
        return self.steps[self.done - 1] if self.done else "launching"

    def line(self) -> str:
        """``starting the local Pathways server (2 slices x 4 chips)... devices (2/4), 12 s``."""
        seconds = f"{self.elapsed_s:.0f} s"
        if self.state == READY:
            return f"{self.what.replace('starting ', '', 1)} ready after {seconds}"
        if self.state == FAILED:
            return f"{self.what} failed after {seconds}: {self.error}"
        return f"{self.what}... {self.step} ({self.done}/{len(self.steps)}), {seconds}"


Listener = Callable[[Progress], None]

_cond = threading.Condition()
_progress: Progress | None = None
_listeners: list[Listener] = []


def begin(what: str, steps: tuple[str, ...], started: float | None = None) -> None:
    """A start begins (``started``: when, if it began earlier than this call, e.g. an early server)."""
    _set(Progress(what, steps, 0, STARTING, None, time.monotonic() if started is None else started))


def advance(step: str) -> None:
    """``step`` is done (ignored when no start runs, or it is not one of its steps)."""
    with _cond:
        progress = _progress
    if progress is None or progress.state != STARTING or step not in progress.steps:
        return
    done = max(progress.done, progress.steps.index(step) + 1)
    if done != progress.done:
        _set(dataclasses.replace(progress, done=done))


def finish(error: str | None = None) -> None:
    """The start ended: ready, or failed with a one-line ``error``."""
    with _cond:
        progress = _progress
    if progress is None or progress.state != STARTING:
        return
    if error is None:
        _set(dataclasses.replace(progress, done=len(progress.steps), state=READY))
    else:
        _set(dataclasses.replace(progress, state=FAILED, error=error))


def current() -> Progress | None:
    """The last start's progress, None if none began."""
    with _cond:
        return _progress


def starting() -> bool:
    """Whether a start is under way."""
    progress = current()
    return progress is not None and progress.state == STARTING


def wait(timeout: float) -> Progress | None:
    """Waits at most ``timeout`` seconds for the start to end or change; returns its progress then."""
    with _cond:
        seen = _progress
        if seen is not None and seen.state == STARTING:
            _cond.wait_for(lambda: _progress is not seen, timeout)
        return _progress


def subscribe(listener: Listener) -> Callable[[], None]:
    """Call ``listener`` with each change (on the thread that made it); returns the unsubscribe."""
    with _cond:
        _listeners.append(listener)

    def unsubscribe() -> None:
        with _cond:
            if listener in _listeners:
                _listeners.remove(listener)

    return unsubscribe


def _set(progress: Progress) -> None:
    global _progress
    with _cond:
        _progress = progress
        listeners = list(_listeners)
        _cond.notify_all()
    for listener in listeners:
        listener(progress)
