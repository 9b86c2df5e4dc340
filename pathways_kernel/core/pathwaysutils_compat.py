"""Every patch of pathwaysutils' API, in one place: each a ``Patch`` with start and stop.

Written for pathwaysutils >=0.1.13,<0.2 (the pin in pyproject.toml); what is
patched, and why:

* ``pathwaysutils.elastic.elastic.get_slice_to_devices``: the one place its
  elastic tools (``elastic.Manager``, ``wait_for_slices``,
  ``get_active_slice_indices``, what MaxText uses) learn which slice a device
  belongs to, from ``device.slice_index``. The embedded backend's CPU devices
  have no such attribute and cannot be given one: while it is active its
  slices are handed over instead (``slice_groups``, ``emulator/local.py``).
* ``pathwaysutils.elastic.manager.Manager.elastic_retry`` and
  ``pathwaysutils.elastic.elastic.wait_for_slices``: wrapped so that the
  attempts of one retried job are one goodput run (``training/goodput_jobs.py``).
* ``pathwaysutils.profiling._original_start_trace`` and ``_original_stop_trace``:
  its references to JAX's functions, taken when the module is imported. A kernel's
  start holds ``jax.profiler`` until pathwaysutils is in (``profiling/hold.py``); an
  import meanwhile would take the held functions, so it is given JAX's.

Importing pathwaysutils costs ~0.7 s (it brings orbax), so nothing here
imports it: a patch of a module not imported yet is put in by an import hook
(on ``sys.meta_path`` only while such a patch waits) when user code first
imports it.
"""

from __future__ import annotations

import collections
import functools
import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

ELASTIC = "pathwaysutils.elastic.elastic"
MANAGER = "pathwaysutils.elastic.manager"
PROFILING = "pathwaysutils.profiling"

_lock = threading.RLock()
#: Patches started whose module is not imported yet, by module name.
_waiting: dict[str, list[Patch]] = {}


class Patch:
    """``owner.name`` replaced by ``wrap(original)`` while started.

    ``owner`` is the module ``module`` or, with ``cls``, its class of that name.
    ``start()`` patches now if the module is imported, else when it is;
    ``stop()`` puts the original back (or stops waiting).
    """

    def __init__(
        self, module: str, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]], cls: str = ""
    ) -> None:
        self.module, self.name, self.cls, self._wrap = module, name, cls, wrap
        self._original: Callable[..., Any] | None = None
        self._started = False

    @property
    def active(self) -> bool:
        """Whether the replacement is in place now."""
        return self._original is not None

    def start(self) -> None:
        with _lock:
            if self._started:
                return
            self._started = True
            if (module := sys.modules.get(self.module)) is not None:
                self._apply(module)
            else:
                _waiting.setdefault(self.module, []).append(self)
                if _FINDER not in sys.meta_path:
                    sys.meta_path.insert(0, _FINDER)

    def stop(self) -> None:
        with _lock:
            if not self._started:
                return
            self._started = False
            waiting = _waiting.get(self.module, [])
            if self in waiting:
                waiting.remove(self)
            if not any(_waiting.values()) and _FINDER in sys.meta_path:
                sys.meta_path.remove(_FINDER)
            module = sys.modules.get(self.module)
            if self._original is not None and module is not None:
                setattr(self._owner(module), self.name, self._original)
            self._original = None

    def _owner(self, module: ModuleType) -> Any:
        return getattr(module, self.cls) if self.cls else module

    def _apply(self, module: ModuleType) -> None:
        owner = self._owner(module)
        self._original = getattr(owner, self.name)
        setattr(owner, self.name, self._wrap(self._original))


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds a waiting patch's module as usual and patches it once executed."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if not _waiting.get(fullname):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            with _lock:
                for patch in _waiting.pop(fullname, []):
                    patch._apply(module)
                if not any(_waiting.values()) and _FINDER in sys.meta_path:
                    sys.meta_path.remove(_FINDER)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


_FINDER = _PatchOnImport()


def slice_groups(slice_map: Callable[[], Mapping[Any, int]]) -> Patch:
    """pathwaysutils' ``get_slice_to_devices`` grouping devices by ``slice_map()`` (called on
    each use, so that it need not start JAX's client); any other device list goes to
    pathwaysutils' own helper, unchanged. Not started."""

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def get_slice_to_devices(devices: Sequence[Any]) -> Mapping[int, Sequence[Any]]:
            slice_of = slice_map()
            if not devices or not all(d in slice_of for d in devices):
                groups: Mapping[int, Sequence[Any]] = original(devices)
                return groups
            slices: dict[int, list[Any]] = collections.defaultdict(list)
            for device in devices:
                slices[slice_of[device]].append(device)
            return dict(slices)

        return get_slice_to_devices

    return Patch(ELASTIC, "get_slice_to_devices", wrap)


def profiler_originals(unwrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> list[Patch]:
    """pathwaysutils' references to JAX's ``start_trace`` and ``stop_trace``, each replaced by
    ``unwrap(reference)``. Not started; a stop once applied puts the references it took back."""
    return [Patch(PROFILING, "_original_start_trace", unwrap), Patch(PROFILING, "_original_stop_trace", unwrap)]
