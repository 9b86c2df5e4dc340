"""pathwaysutils' elastic tools on the embedded backend: its slices are ours.

pathwaysutils (``elastic.Manager``, ``wait_for_slices``,
``get_active_slice_indices``, what MaxText uses) learns which slice a device
belongs to in exactly one place, the module-level helper
``pathwaysutils.elastic.elastic.get_slice_to_devices``, which reads
``device.slice_index``. CPU devices have no such attribute and cannot be given
one, so while a local backend is active that helper is replaced by one that
groups the backend's devices by the slices of its placements; any other device
list goes to the original helper, unchanged.

Slice health needs nothing more: pathwaysutils probes each slice with a
``pmap`` on its devices, and the fault hooks (``faults``) make that probe
raise ``DATA_LOSS`` while the slice is down, so ``pw.fail_slice`` and
``pw.repair_slice`` are seen by user code written the pathwaysutils way.

Importing pathwaysutils costs ~0.7 s (it brings orbax), so activation does not
import it: if it is not imported yet, an import hook puts the replacement in
when user code first imports it.
"""

from __future__ import annotations

import collections
import functools
import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

_MODULE = "pathwaysutils.elastic.elastic"
_lock = threading.Lock()
#: Device -> slice index of the active local backend; called on each use, so
#: that activation need not start JAX's client.
_slice_map: Callable[[], Mapping[Any, int]] | None = None
#: pathwaysutils' own helper, while ours is in its place.
_original: Callable[[Sequence[Any]], Mapping[int, Sequence[Any]]] | None = None


def _grouped(devices: Sequence[Any]) -> Mapping[int, Sequence[Any]]:
    slice_map, original = _slice_map, _original
    slice_of = slice_map() if slice_map is not None else {}
    if not devices or not all(d in slice_of for d in devices):
        assert original is not None  # ours is in place only while pathwaysutils' own is kept
        return original(devices)
    slices: dict[int, list[Any]] = collections.defaultdict(list)
    for device in devices:
        slices[slice_of[device]].append(device)
    return dict(slices)


def _patch(module: Any) -> None:
    global _original
    with _lock:
        if _slice_map is None or _original is not None:
            return
        _original = module.get_slice_to_devices
        module.get_slice_to_devices = functools.wraps(_original)(_grouped)


def _unpatch() -> None:
    global _original
    with _lock:
        # pathwaysutils' module, as loaded: its attributes are not known ahead.
        module: Any = sys.modules.get(_MODULE)
        if _original is not None and module is not None:
            module.get_slice_to_devices = _original
        _original = None


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds pathwaysutils' elastic module as usual and patches it once executed."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            _patch(module)

        # The loader was made for this one import: wrapping its method patches the module once executed.
        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


_FINDER = _PatchOnImport()


def install(slice_map: Callable[[], Mapping[Any, int]]) -> None:
    """Make pathwaysutils see the slices ``slice_map()`` assigns to devices."""
    global _slice_map
    uninstall()
    _slice_map = slice_map
    if (module := sys.modules.get(_MODULE)) is not None:
        _patch(module)
    elif _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    """Give pathwaysutils its own helper back (the backend is switching)."""
    global _slice_map
    _slice_map = None
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    _unpatch()
