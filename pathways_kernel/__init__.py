"""pathways-kernel: drive multi-slice JAX (Pathways) interactively from Jupyter.

    import pathways_kernel as pw
    pw.status(); pw.topology(); m = pw.mesh()

``%load_ext pathways_kernel`` adds the ``%pathways`` magics to any IPython.

The names below come from ``public.py`` on first use: ``import pathways_kernel`` alone
imports neither JAX nor IPython, so the local server's process (``pathways_kernel.server``)
imports only what it runs, and the kernel starts that server before its own heavy imports.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from pathways_kernel.public import *  # noqa: F403

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """A public name (``public.__all__``), imported with every layer the first time any is asked for."""
    # A submodule not imported yet (``from pathways_kernel import server``) is left to the import system.
    if name == "__all__" or not (name.startswith("__") or importlib.util.find_spec(f"{__name__}.{name}")):
        public = importlib.import_module("pathways_kernel.public")
        names: list[str] = public.__all__
        globals().update((n, getattr(public, n)) for n in names)
        globals()["__all__"] = [*names, "load_ipython_extension"]
        if name in globals():
            return globals()[name]
    raise AttributeError(f"module 'pathways_kernel' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__getattr__("__all__")))


def load_ipython_extension(ipython: InteractiveShell) -> None:
    """``%load_ext pathways_kernel``: the magics and one-line errors."""
    importlib.import_module("pathways_kernel.public")  # the session's backends, before any magic runs
    from pathways_kernel.magics import register
    from pathways_kernel.monitoring.comm import register as register_monitor

    register(ipython)
    register_monitor(ipython)  # comm target pathways.monitor, when inside a kernel


def unload_ipython_extension(ipython: InteractiveShell) -> None:
    """``%unload_ext pathways_kernel``: remove all the extension installed on the shell (``core/shellhooks.py``)."""
    from pathways_kernel.core import shellhooks

    shellhooks.remove(ipython)
