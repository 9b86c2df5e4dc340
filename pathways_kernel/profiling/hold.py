"""``jax.profiler`` held until pathwaysutils' profiling hooks are in, while a kernel's start defers them.

A kernel on the local server initializes pathwaysutils (orbax, FastAPI: 1-2 s, more under
load) once the first cell may run (``kernel.py``). Until then ``jax.profiler``'s entry
points, those pathwaysutils' ``monkey_patch_jax`` replaces, are ours: a call waits for the
hooks (bounded, under a line saying what it waits for), then calls what ``jax.profiler``
has by then, pathwaysutils' function. So a library that calls ``jax.profiler`` in the
first seconds, or that took a reference to it then, traces the server too.

pathwaysutils keeps its own reference to JAX's ``start_trace`` and ``stop_trace``, taken
when its profiling module is imported, which may be while ours are in:
``pathwaysutils_compat.profiler_originals`` gives it JAX's instead.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from pathways_kernel.core import pathwaysutils_compat

#: The ``jax.profiler`` functions pathwaysutils replaces (``profiling.monkey_patch_jax``).
ENTRY_POINTS = ("start_trace", "stop_trace", "trace", "start_server", "stop_server")
#: Seconds between the updates of the line under a cell whose profiler call waits.
TICK_S = 1.0

#: Shows each text ``line()`` returns (it waits up to a tick) under the cell until it returns
#: None, then ``done()`` in its place; returns False when interrupted (``kernel.py``).
Waiter = Callable[[Callable[[], str | None], Callable[[], str]], bool]


class ProfilerHold:
    """``jax.profiler``'s entry points wait for ``ready`` (at most ``bound_s``) while started."""

    def __init__(self, ready: threading.Event, wait: Waiter, bound_s: float) -> None:
        self._ready, self._wait, self._bound_s = ready, wait, bound_s
        self._held: dict[str, Callable[..., Any]] = {}
        self._original_of: dict[int, Callable[..., Any]] = {}  # by id() of our function
        self._patches = pathwaysutils_compat.profiler_originals(self._unwrap)

    def start(self) -> None:
        import jax.profiler

        for name in ENTRY_POINTS:
            original = getattr(jax.profiler, name)
            held = self._hold(name, original)
            self._held[name] = held
            self._original_of[id(held)] = original
            setattr(jax.profiler, name, held)
        for patch in self._patches:
            patch.start()

    def stop(self) -> None:
        """JAX's own functions back where pathwaysutils did not put its own."""
        import jax.profiler

        for name, held in self._held.items():
            if getattr(jax.profiler, name) is held:
                setattr(jax.profiler, name, self._original_of[id(held)])
        for patch in self._patches:
            # Once applied it stays: pathwaysutils' reference to JAX must not become ours again.
            if not patch.active:
                patch.stop()

    def _unwrap(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self._original_of.get(id(function), function)

    def _hold(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        import jax.profiler

        @functools.wraps(original)
        def held(*args: Any, **kwargs: Any) -> Any:
            if not self._ready.is_set():
                self._wait_for_hooks(name)
            current = getattr(jax.profiler, name)
            return (original if current is held else current)(*args, **kwargs)

        return held

    def _wait_for_hooks(self, name: str) -> None:
        started = time.monotonic()

        def line() -> str | None:
            if self._ready.wait(TICK_S) or time.monotonic() - started >= self._bound_s:
                return None
            return f"jax.profiler.{name}: waiting for pathwaysutils' profiling hooks ({time.monotonic() - started:.0f} s)..."

        def done() -> str:
            return f"jax.profiler.{name} waited {time.monotonic() - started:.0f} s for pathwaysutils' profiling hooks"

        if not self._wait(line, done):
            raise KeyboardInterrupt(f"interrupted while jax.profiler.{name} waited for pathwaysutils' profiling hooks")
        if not self._ready.is_set():
            print(
                f"pathways: pathwaysutils' profiling hooks were not in after {self._bound_s:g} s: "
                f"jax.profiler.{name} runs without them (the trace has this process only)",
                file=sys.stderr,
            )
