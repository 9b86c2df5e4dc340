"""``%pathways`` and ``%%pathways``: a thin layer over the public API.

Each subcommand is a function declared with IPython's ``magic_arguments``
(so ``%pathways SUB --help`` comes for free) and registered with
``@subcommand``; it parses, calls the Python API and returns something to
display. Subcommands live in one module per area (``core``, ``elastic``, ...)
and register themselves on import.
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any, Callable

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import MagicArgumentParser

from pathways_kernel.core.errors import PathwaysError, one_line


@dataclasses.dataclass(frozen=True)
class Subcommand:
    name: str
    func: Callable[..., Any]
    cell: bool  # whether it is (also) a cell magic

    @property
    def parser(self) -> MagicArgumentParser:
        return self.func.parser

    @property
    def summary(self) -> str:
        # magic_arguments replaces __doc__ with the usage; the parser keeps the summary.
        return (self.parser.description or "").strip().splitlines()[0]


SUBCOMMANDS: dict[str, Subcommand] = {}


def subcommand(name: str, cell: bool = False) -> Callable:
    """Register ``func(shell, args, cell)`` as ``%pathways NAME``.

    Apply it outermost, above ``@magic_arguments(name="pathways NAME")`` and
    its ``@argument``s. ``cell=True`` makes it a cell magic as well, receiving
    the cell body.
    """

    def decorate(func: Callable) -> Callable:
        SUBCOMMANDS[name] = Subcommand(name, func, cell)
        return func

    return decorate


def top_level_help() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = [
        "usage: %pathways SUBCOMMAND [options]   |   %%pathways SUBCOMMAND [options] + cell",
        "",
        "Drive a multi-slice JAX session (Pathways or the embedded local backend).",
        "Python twin of every subcommand: import pathways_kernel as pw.",
        "",
        "subcommands:",
    ]
    for name in sorted(SUBCOMMANDS):
        sub = SUBCOMMANDS[name]
        lines.append(f"  {name:<{width}}  {sub.summary}{'  (cell magic)' if sub.cell else ''}")
    lines.append("")
    lines.append("%pathways SUBCOMMAND --help for its options.")
    return "\n".join(lines)


class Text(str):
    """A plain-text result (help, a one-line summary) displayed verbatim."""

    def __repr__(self) -> str:
        return str(self)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))


def dispatch(shell: Any, line: str, cell: str | None) -> Any:
    """Run one ``%pathways`` line (and cell); returns what to display."""
    try:
        tokens = shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"%pathways: cannot parse the line ({exc})") from None
    if not tokens or tokens[0] in ("-h", "--help", "help"):
        return Text(top_level_help())
    name, rest = tokens[0], tokens[1:]
    sub = SUBCOMMANDS.get(name)
    if sub is None:
        known = ", ".join(sorted(SUBCOMMANDS))
        raise UsageError(f"%pathways: unknown subcommand '{name}'; choose one of: {known} (or --help)")
    if "-h" in rest or "--help" in rest:
        # IPython's formatter starts usage with a reST "::" block; show plain "usage:".
        return Text("usage: " + sub.parser.format_help().lstrip(": \n").rstrip())
    if cell is not None and not sub.cell:
        raise UsageError(f"%pathways {name} is a line magic; use %pathways {name}, not %%pathways")
    try:
        args = sub.parser.parse_args(rest)
    except UsageError as exc:
        raise UsageError(f"%pathways {name}: {exc} (see %pathways {name} --help)") from None
    return sub.func(shell, args, cell)


@magics_class
class PathwaysMagics(Magics):
    @line_cell_magic
    def pathways(self, line: str, cell: str | None = None) -> None:
        """Drive a multi-slice JAX session; ``%pathways --help`` lists subcommands."""
        from IPython.display import display

        result = dispatch(self.shell, line, cell)
        if result is not None:
            display(result)


def _show_one_line(shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: int | None = None) -> None:
    """Custom exception handler: a ``PathwaysError`` is one red line, no traceback."""
    shell._showtraceback(etype, value, [f"\x1b[0;31m{one_line(value)}\x1b[0m"])


def register(shell: Any) -> None:
    """Install the magics and the one-line handler for ``PathwaysError``."""
    from pathways_kernel.state import healing
    from pathways_kernel.magics import core  # noqa: F401  (registers subcommands)
    from pathways_kernel.magics import connection
    from pathways_kernel.magics import elastic  # noqa: F401
    from pathways_kernel.magics import monitor  # noqa: F401
    from pathways_kernel.magics import faults  # noqa: F401
    from pathways_kernel.magics import sidecar  # noqa: F401
    from pathways_kernel.magics import storage  # noqa: F401
    from pathways_kernel.magics import profiling  # noqa: F401

    PathwaysMagics.pathways.__doc__ = top_level_help()
    shell.register_magics(PathwaysMagics)
    shell.set_custom_exc((PathwaysError,), _show_one_line)
    healing.install(shell)  # restore variables lost with a slice, between cells
    connection.install(shell)  # the notice after a disconnect
