"""What the thread's run is doing, for the goodput ledger (``goodput.py``).

Runs begin (``begin``) and end (``Account.end``) on the thread that runs their
steps; inside a run, time is booked by cause (``spent``, ``snapshot_wait``,
``computing``). A bare ``for batch in loader`` loop is a run of its own
(``loop_next``/``loop_step``), ended with its cell. Compiles are taken from
``jax.monitoring`` and moved out of the segment they happened in. ``install``
hooks the notebook's cells: the session's idle time between them, and the end
of their bare loops.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pathways_kernel.core import runs, sessions, shellhooks
from pathways_kernel.core.subscribers import Subscribers
from pathways_kernel.training.goodput import Account, ledger
from pathways_kernel.training.run_events import StepFollower

if TYPE_CHECKING:
    from pathways_kernel.core.sessions import Session

_local = threading.local()


def current() -> Account | None:
    """The innermost run in progress on this thread, if any."""
    account: Account | None = runs.current()
    return account


def running() -> Account | None:
    """The run this thread's steps count in: the innermost run, else its bare loader loop."""
    loops = getattr(_local, "loops", None)
    return current() or (loops[-1] if loops else None)


class RunStarts(Subscribers[Account]):
    """A session's listeners of its runs as each starts, called on the run's thread (views
    follow runs from here); ``current()`` is then the run it is nested in, if any."""


# -- what the thread's run is doing --------------------------------------------
def begin(
    name: str,
    kind: str,
    session: Session | None = None,
    first_step: int = 0,
    stop_step: int | None = None,
    progress: bool = True,
    began: float | None = None,
) -> Account:
    """Start accounting a run of steps ``first_step..stop_step - 1`` on this
    thread; end it with ``Account.end()``. ``progress``: a notebook may show it.
    ``began``: the ``time.perf_counter()`` the run started at, if earlier."""
    account = Account(name, kind, session or sessions.session(), began)
    account._session.component(CompileListener).ensure()
    account.first_step, account.stop_step, account.progress = first_step, stop_step, progress
    ledger(account._session).started(account)
    account._session.component(RunStarts).notify(account)
    runs.stack().append(account)
    return account


@contextlib.contextmanager
def spent(category: str, owner: Any = None) -> Iterator[None]:
    """Count the block as ``category`` in this thread's run (or ``owner``'s own loop); no-op without one."""
    account = current()
    if account is None and owner is not None:
        account = _loops.get(owner)
    if account is None or account.ended:
        yield
        return
    with account.spent(category):
        yield


# -- loops that are not elastic runs: a bare `for batch in loader` ------------
_loops: weakref.WeakKeyDictionary[Any, Account] = weakref.WeakKeyDictionary()


def loop_next(owner: Any, name: str) -> Account | None:
    """``owner`` (a loader) is asked for its next item: the previous step of
    its own loop ends. Returns its loop's account, or None when a run on this
    thread (an elastic run, ``pw.steps``) already counts the loop."""
    account = _loops.get(owner)
    if account is None or account.ended:
        if current() is not None:
            return None
        account = Account(name, "loader", sessions.session())
        account._session.component(CompileListener).ensure()
        ledger(account._session).started(account)
        _loops[owner] = account
        account._session.component(RunStarts).notify(account)
        _thread_loops().append(account)
    account.step_end()
    return account


def loop_step(owner: Any) -> None:
    """``owner`` handed out an item: a step of its own loop begins."""
    account = _loops.get(owner)
    if account is not None and not account.ended:
        account.step_begin(account.steps + account.steps_redone)


def end_loop(owner: Any) -> None:
    account = _loops.pop(owner, None)
    if account is not None:
        account.end()


def end_cell_loops() -> None:
    """A cell ended: bare loops started in it are over (IPython ``post_run_cell``)."""
    for owner, account in list(_loops.items()):
        if account in _thread_loops():
            end_loop(owner)
    _thread_loops().clear()


def _thread_loops() -> list[Account]:
    loops = getattr(_local, "loops", None)
    if loops is None:
        loops = _local.loops = []
    return loops


class LedgerFollower(StepFollower):
    """The goodput ledger following a run's step events (``run_events``) into its ``Account``."""

    def __init__(self, account: Account):
        self.account = account

    def step_begin(self, step: int) -> None:
        self.account.step_begin(step)

    def step_end(self, step: int, output: Any) -> None:
        self.account.step_end(output)

    def recovery_begin(self) -> None:
        self.account.recovery_begin()

    def recovery_end(self, step: int) -> None:
        self.account.recovery_end(step)

    def snapshot_started(self, state: Any) -> None:
        # The wait on it starts with the steps' compute (Account.snapshot_source).
        self.account.snapshot_source(state)

    def phase(self, category: str) -> contextlib.AbstractContextManager[Any]:
        return self.account.spent(category)

    def device_wait(self) -> contextlib.AbstractContextManager[Any]:
        return self.account.computing()  # the steps' own device time: productive

    def snapshot_wait(self) -> contextlib.AbstractContextManager[Any]:
        return self.account.snapshot_wait()  # see Account.snapshot_source

    def end(self) -> None:
        self.account.end()


# -- compiles, from jax.monitoring ---------------------------------------------
_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


class CompileListener:
    """The session's ``jax.monitoring`` listener for compiles: registered at the
    session's first run, unregistered when the session closes (a session component).
    It counts compiles only in runs of its own session."""

    def __init__(self, session: Session):
        from jax import monitoring

        self.session = session
        monitoring.register_event_duration_secs_listener(self.on_duration)
        self._registered = True
        session.on_close(self.close)

    def on_duration(self, event: str, duration_secs: float, **_kwargs: str | int) -> None:
        if event not in _COMPILE_EVENTS:
            return
        account = running()
        if account is not None and not account.ended and account._session is self.session:
            account.compiled(duration_secs)

    def ensure(self) -> None:
        """Listen again if a library dropped every listener (Tunix's ``MetricsLogger.close()``
        calls ``jax.monitoring.clear_event_listeners()``): at each run's start, so its compiles count."""
        from jax import monitoring

        if self._registered:
            self._unregister()
            monitoring.register_event_duration_secs_listener(self.on_duration)

    def close(self) -> None:
        if self._registered:
            self._registered = False
            self._unregister()

    def _unregister(self) -> None:
        from jax import monitoring

        # Absent when a library cleared the listeners: JAX asserts it is present (ValueError under -O).
        with contextlib.suppress(AssertionError, ValueError):
            monitoring.unregister_event_duration_listener(self.on_duration)


# Never a session of their own: without a backend (unreachable at start)
# there is no time to account, and starting one would retry it every cell.
def _cell_started(*args: Any) -> None:
    if (s := sessions.current()) is not None:
        ledger(s).cell_started()


def _cell_finished(*args: Any) -> None:
    if (s := sessions.current()) is not None:
        end_cell_loops()
        ledger(s).cell_finished()


def install(shell: Any) -> None:
    """Count the notebook's time between cells (idle, slices held) for ``shell`` (``shellhooks.remove`` undoes it)."""
    hooks = shellhooks.of(shell)
    hooks.register("pre_run_cell", _cell_started)
    hooks.register("post_run_cell", _cell_finished)
