"""Profiling subcommands: ``%%pathways profile`` (capture one cell) and ``%pathways profiles``."""

from __future__ import annotations

import argparse
import ast

from IPython.core.displayhook import DisplayHook
from IPython.core.interactiveshell import InteractiveShell
from IPython.display import display

from pathways_kernel.core.errors import PathwaysError
from pathways_kernel.magics import argument, magic_arguments, non_empty, subcommand, whole_number
from pathways_kernel.profiling import capture


@subcommand("profile", cell=True)
@magic_arguments(name="pathways profile")
@argument("--name", type=non_empty, default=None, help="name of the capture (default: profile)")
@argument(
    "--logdir",
    type=non_empty,
    default=None,
    help="where the trace goes (default: this session's dir; gs://... on the proxy backend)",
)
@argument(
    "--host-tracer-level",
    type=whole_number,
    default=capture.DEFAULT_HOST_TRACER_LEVEL,
    help="0 off, 1 user annotations and XLA ops (default), 2 also the runtime's events, 3 verbose",
)
@argument("--python-tracer", action="store_true", help="also trace Python calls (slower)")
def profile(shell: InteractiveShell, args: argparse.Namespace, cell: str | None) -> object:
    """Capture a JAX profiler trace of the cell; show wall, device busy per slice, top ops, compile and host gaps."""
    if cell is None or not cell.strip():
        raise PathwaysError("%%pathways profile needs a cell body: the code to profile")
    # Like %%time: run the body in the user's namespace, its last expression
    # shown as a cell's would be. Compiled first, so a syntax error captures nothing.
    source = shell.transform_cell(cell)
    tree = ast.parse(source)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    quiet = DisplayHook.semicolon_at_end_of_expression(source)
    body = compile(tree, "<%%pathways profile>", "exec")
    tail = compile(ast.Expression(last.value), "<%%pathways profile>", "eval") if last else None
    with capture.profile(args.name, args.logdir, args.host_tracer_level, args.python_tracer) as taken:
        exec(body, shell.user_ns)  # the user's own cell
        value = eval(tail, shell.user_ns) if tail else None
    if value is not None and not quiet:
        display(value)
    return taken


@subcommand("profiles")
@magic_arguments(name="pathways profiles")
def profiles(shell: InteractiveShell, args: argparse.Namespace, cell: str | None) -> object:
    """The captures of this session: name, when, size, where (and Open in XProf)."""
    return capture.profiles()
