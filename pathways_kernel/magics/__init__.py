"""``%pathways`` and ``%%pathways``: a thin layer over the public API.

Each subcommand is a function declared with IPython's ``magic_arguments``
(so ``%pathways SUB --help`` comes for free) and registered with
``@subcommand``; it parses, calls the Python API and returns something to
display. Subcommands live in one module per area (``core``, ``elastic``, ...)
and register themselves on import.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

from IPython.core import magic_arguments as ipython_arguments
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, line_cell_magic, magics_class, needs_local_scope, no_var_expand
from IPython.core.magic_arguments import MagicArgumentParser
from IPython.utils.text import DollarFormatter

from pathways_kernel.core import parsing, sessions, shellhooks
from pathways_kernel.core.errors import PathwaysError, one_line
from pathways_kernel.core.text import shown

if TYPE_CHECKING:
    from types import TracebackType

    from IPython.lib.pretty import RepresentationPrinter

#: A subcommand's function: the shell, its parsed options, the cell body (None as a line magic) -> what to display.
SubcommandFunc = Callable[[InteractiveShell, argparse.Namespace, str | None], object]
_F = TypeVar("_F", bound=SubcommandFunc)
_T = TypeVar("_T")


class ParsedSubcommand(Protocol):
    """A subcommand's function once ``magic_arguments`` has given it its parser."""

    parser: MagicArgumentParser

    def __call__(self, shell: InteractiveShell, args: argparse.Namespace, cell: str | None, /) -> object: ...


_P = TypeVar("_P", bound=ParsedSubcommand)


def magic_arguments(name: str) -> Callable[[SubcommandFunc], ParsedSubcommand]:
    """IPython's ``magic_arguments`` (builds the parser from the ``argument``s below it), typed:
    IPython's decorator classes carry no annotations."""
    decorate: Callable[[SubcommandFunc], ParsedSubcommand] = ipython_arguments.magic_arguments(name=name)
    return decorate


def argument(*flags: str, **options: object) -> Callable[[_F], _F]:
    """IPython's ``argument`` (``ArgumentParser.add_argument``'s arguments), typed as ``magic_arguments``."""
    decorate: Callable[[_F], _F] = ipython_arguments.argument(*flags, **options)
    return decorate


@dataclasses.dataclass(frozen=True)
class Subcommand:
    name: str
    func: SubcommandFunc
    parser: MagicArgumentParser
    cell: bool  # whether it is (also) a cell magic

    @property
    def summary(self) -> str:
        # magic_arguments replaces __doc__ with the usage; the parser keeps the summary.
        return (self.parser.description or "").strip().splitlines()[0]


SUBCOMMANDS: dict[str, Subcommand] = {}


def subcommand(name: str, cell: bool = False) -> Callable[[_P], _P]:
    """Register ``func(shell, args, cell)`` as ``%pathways NAME``.

    Apply it outermost, above ``@magic_arguments(name="pathways NAME")`` and
    its ``@argument``s. ``cell=True`` makes it a cell magic as well, receiving
    the cell body.
    """

    def decorate(func: _P) -> _P:
        SUBCOMMANDS[name] = Subcommand(name, func, func.parser, cell)
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


#: Largest whole number an option takes: steps and counts end up in int64 fields.
MAX_INT = parsing.MAX_INT


def _argument_type(parse: Callable[[str], _T]) -> Callable[[str], _T]:
    """An argparse ``type`` from a ``core.parsing`` function: its ``ValueError`` is the option's one line."""

    def convert(text: str) -> _T:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def integer(minimum: int, maximum: int = MAX_INT) -> Callable[[str], int]:
    """An argparse ``type``: an ASCII whole number in ``[minimum, maximum]``."""
    return _argument_type(lambda text: parsing.whole_number(text, minimum, maximum))


#: An argparse ``type``: an ASCII whole number; the command checks its range (and names it).
whole_number = integer(parsing.MIN_INT)
#: An argparse ``type``: an ASCII number (inf and nan too); the command checks its range.
number = _argument_type(parsing.number)


def seconds(minimum: float, maximum: float, allow_minimum: bool = True) -> Callable[[str], float]:
    """An argparse ``type``: a finite number of seconds in ``[minimum, maximum]``
    (``(minimum, maximum]`` unless ``allow_minimum``)."""

    def parse(text: str) -> float:
        try:
            value = parsing.finite_number(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{exc} (seconds)") from None
        if value < minimum or (value == minimum and not allow_minimum):
            raise argparse.ArgumentTypeError(
                f"must be {'at least' if allow_minimum else 'more than'} {minimum:g} s, got {value:g}"
            )
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:g} s, got {value:g}")
        return value

    return parse


#: ``--timeout`` of connect/reconnect: a pre-flight longer than an hour is a typo, not a slow network.
preflight_seconds = seconds(0.0, 3600.0, allow_minimum=False)


def name_list(text: str) -> list[str]:
    """An argparse ``type``: comma-separated Python names, none empty, none twice (``a,b``)."""
    names = [n.strip() for n in text.split(",")]
    bad = next((n for n in names if not n.isidentifier()), None)
    if bad is not None:
        what = "an empty name" if not bad else f"{shown(bad)} is not a Python name"
        raise argparse.ArgumentTypeError(f"{what} in {shown(text)}: give comma-separated names, e.g. data,model")
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:
        raise argparse.ArgumentTypeError(f"{shown(twice)} is given twice in {shown(text)}")
    return names


def slice_list(text: str) -> str | tuple[int, ...]:
    """An argparse ``type``: ``all``, or comma-separated slice indices, none twice (``0,1``)."""
    return "all" if text.strip() == "all" else _argument_type(parsing.index_list)(text)


def non_empty(text: str) -> str:
    """An argparse ``type``: any string but an empty or blank one."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


class Text(str):
    """A plain-text result (help, a one-line summary) displayed verbatim."""

    def __repr__(self) -> str:
        return str(self)

    def _repr_pretty_(self, p: RepresentationPrinter, cycle: bool) -> None:
        p.text(str(self))


def dispatch(shell: InteractiveShell, line: str, cell: str | None) -> object:
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
        close = difflib.get_close_matches(name, SUBCOMMANDS, n=1, cutoff=0.6)
        guess = f"did you mean '{close[0]}'? " if close else ""
        raise UsageError(f"%pathways: unknown subcommand {shown(name, 20)}; {guess}choose one of: {known} (or --help)")
    if "-h" in rest or "--help" in rest:
        # IPython's formatter starts usage with a reST "::" block; show plain "usage:".
        return Text("usage: " + sub.parser.format_help().lstrip(": \n").rstrip())
    if cell is not None and not sub.cell:
        raise UsageError(f"%pathways {name} is a line magic; use %pathways {name}, not %%pathways")
    try:
        args = sub.parser.parse_args(rest)
    except UsageError as exc:
        # argparse repeats what it did not recognize: cut, so that the line stays one a user reads.
        message = str(exc) if len(str(exc)) <= 200 else str(exc)[:200] + "..."
        raise UsageError(f"%pathways {name}: {message} (see %pathways {name} --help)") from None
    return sub.func(shell, args, cell)


#: Longest ``%pathways`` line taken: options and URLs are far shorter, and IPython's
#: ``$var`` expansion takes time quadratic in the line (8,000 characters: 0.4 s; 100,000: minutes).
MAX_LINE = 10_000


def expand(shell: InteractiveShell, line: str, local_ns: dict[str, object] | None) -> str:
    """``line`` with IPython's ``$name`` and ``{expr}`` expanded from the user's namespace, as
    IPython expands a magic's line; a line over ``MAX_LINE`` characters is refused in one line."""
    if len(line) > MAX_LINE:
        raise UsageError(
            f"%pathways: the line is {len(line):,} characters, more than the {MAX_LINE:,} a %pathways line may have "
            f"(it starts {shown(line)}); put long values in a variable and use the Python API"
        )
    if "$" not in line and "{" not in line:
        return line  # nothing to expand
    namespace = {**shell.user_ns, **(local_ns or {})}
    try:
        expanded: str = DollarFormatter().vformat(line, args=[], kwargs=namespace)
    except Exception:  # what IPython does too: a line that does not format is taken as typed
        return line
    return expanded


@magics_class
class PathwaysMagics(Magics):
    # IPython's own expansion runs before the magic sees the line, hence no bound of ours
    # could apply: the magic expands (``expand``) after checking the length.
    @no_var_expand
    @needs_local_scope
    @line_cell_magic
    def pathways(self, line: str, cell: str | None = None, local_ns: dict[str, object] | None = None) -> None:
        """Drive a multi-slice JAX session; ``%pathways --help`` lists subcommands."""
        from IPython.display import display

        assert self.shell is not None  # registered with the shell: IPython gives it to every Magics
        result = dispatch(self.shell, expand(self.shell, line, local_ns), cell)
        if result is not None:
            display(result)


def _show_one_line(
    shell: InteractiveShell,
    etype: type[BaseException],
    value: BaseException,
    tb: TracebackType | None,
    tb_offset: int | None = None,
) -> None:
    """Custom exception handler: a ``PathwaysError`` is one red line, no traceback."""
    shell._showtraceback(etype, value, [f"\x1b[0;31m{one_line(value)}\x1b[0m"])


def _show_error_lines(shell: InteractiveShell) -> Callable[[], None]:
    """Show the local server's JAX errors whose own message does not say what to do as one
    red line (``connection.error_line``: a server gone, a host callback, every slice down; ``lost_read_line``:
    a read of an array lost with a slice), wherever IPython
    shows them: a cell's error, and a result whose display raised (the proxy client's dispatch
    is asynchronous, so a loss often surfaces in the result's repr)."""
    show = shell._showtraceback
    own = "_showtraceback" in vars(shell)  # wrapped already on this shell (by someone else)

    def showtraceback(etype: type[BaseException], value: BaseException, stb: list[str]) -> object:
        from pathways_kernel.backends.connection import error_line
        from pathways_kernel.state.lost_reads import lost_read_line

        line = None if isinstance(value, PathwaysError) else error_line(value) or lost_read_line(value, shell.user_ns)
        return show(etype, value, stb if line is None else [f"\x1b[0;31m{line}\x1b[0m"])

    # IPython has no hook for how a traceback is shown: this shell's own method is wrapped.
    shell._showtraceback = showtraceback  # type: ignore[method-assign, assignment]

    def undo() -> None:
        if own:
            shell._showtraceback = show  # type: ignore[method-assign]
        else:
            del shell._showtraceback

    return undo


def register(shell: InteractiveShell) -> None:
    """Install the magics, the one-line handler for ``PathwaysError`` and the cell hooks (once).

    All of it through the shell's ``ShellHooks``, so ``shellhooks.remove(shell)``
    (``%unload_ext pathways_kernel``) takes it all off again.
    """
    shellhooks.of(shell).component(PathwaysMagics, _install)


def _install(hooks: shellhooks.ShellHooks) -> PathwaysMagics:
    from pathways_kernel.backends import interrupts
    from pathways_kernel.magics import (
        connection,
        core,  # noqa: F401  (registers subcommands)
        elastic,  # noqa: F401
        faults,  # noqa: F401
        goodput,
        monitor,  # noqa: F401
        profiling,  # noqa: F401
        sidecar,  # noqa: F401
        storage,  # noqa: F401
    )
    from pathways_kernel.state import compile_cache, healing

    shell = hooks.shell
    PathwaysMagics.pathways.__doc__ = top_level_help()
    magics = PathwaysMagics(shell)
    shell.register_magics(magics)
    hooks.on_close(lambda: _unregister_magics(shell, magics))
    hooks.on_close(_set_custom_exc(shell))
    hooks.on_close(_show_error_lines(shell))
    healing.install(shell)  # restore variables lost with a slice, between cells
    connection.install(shell)  # the notice after a disconnect
    interrupts.install(shell)  # the local server drops what an interrupted cell queued
    goodput.install(shell)  # the notebook's idle time between cells
    compile_cache.install(shell)  # the cache's hits and misses, after a library cleared JAX's listeners
    hooks.on_close(_follow_sessions())
    return magics


def _set_custom_exc(shell: InteractiveShell) -> Callable[[], None]:
    """Show a ``PathwaysError`` as one line; returns the undo (the shell's handler before)."""
    before = shell.custom_exceptions, shell.CustomTB
    shell.set_custom_exc((PathwaysError,), _show_one_line)

    def undo() -> None:
        shell.custom_exceptions, shell.CustomTB = before

    return undo


def _unregister_magics(shell: InteractiveShell, magics: PathwaysMagics) -> None:
    manager = shell.magics_manager
    if manager.registry.get(type(magics).__name__) is magics:
        del manager.registry[type(magics).__name__]
    for kind, table in magics.magics.items():
        for name in table:
            manager.magics[kind].pop(name, None)


def _follow_sessions() -> Callable[[], None]:
    """Show the progress of each session's transfers and runs under the cells; returns the undo.

    The subscriptions are the session's own (they go when it closes); the next
    session is followed from when it starts.
    """
    from pathways_kernel.monitoring import cellprogress
    from pathways_kernel.state import progress

    following: list[Callable[[], None]] = []

    def follow(session: sessions.Session) -> None:
        following[:] = [progress.follow(session), cellprogress.follow(session)]

    stop = sessions.on_start(follow)
    if (running := sessions.current()) is not None:
        follow(running)

    def undo() -> None:
        stop()
        for unsubscribe in following:
            unsubscribe()

    return undo
