"""What users see of goodput: ``pw.goodput()`` (a run, or the session), ``pw.goodput_over_time``
and the monitor's ``goodput_intervals`` message, from the ledger (``goodput.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from pathways_kernel.core.display import TextDisplay
from pathways_kernel.core.errors import PathwaysError
from pathways_kernel.training import goodput_timeline, phases
from pathways_kernel.training.goodput import CATEGORIES, OTHER, PRODUCTIVE, Account, Ledger, ledger

if TYPE_CHECKING:
    from pathways_kernel.core.sessions import Session

# -- what users see ----------------------------------------------------------------
LABELS = {
    PRODUCTIVE: "productive steps",
    "compile": "compiling",
    "data_wait": "waiting for data",
    "snapshot_stall": "waiting on snapshots",
    "checkpoint_save": "saving checkpoints",
    "recovery": "recovering from a loss",
    "redone": "redoing lost steps",
    "slice_wait": "waiting for slices",
    "scale_up": "scaling back up",
    OTHER: "loop overhead",
}


class RunFigures(TypedDict):
    """One run's figures as ``pw.goodput()`` shows them."""

    name: str
    header: str
    step_time: dict[str, Any]
    wall_s: float
    seconds: dict[str, float]
    summary: str
    mfu: float | None
    #: The chips its MFU counts: the live ones of the run's slices.
    chips: int
    peak_how: str
    #: ml-goodput-measurement's own figure of a finished run (``field=True``).
    field: NotRequired[str]
    #: Its time by role, where its loop marked phases (``pw.phase``): role -> figures.
    roles: dict[str, phases.RoleTime]


class Report(TextDisplay):
    """``pw.goodput()``: one run, or every run of the session plus the notebook's idle time."""

    def __init__(self, accounts: list[Account], ledger: Ledger | None, with_field: bool):
        self.accounts = accounts
        self.ledger = ledger
        self.runs = [_figures(a, with_field) for a in accounts]

    @property
    def goodput(self) -> float:
        """Productive time over the runs' wall time (0..1)."""
        wall = sum(r["wall_s"] for r in self.runs)
        return sum(r["seconds"][PRODUCTIVE] for r in self.runs) / wall if wall else 0.0

    @property
    def seconds(self) -> dict[str, float]:
        total = dict.fromkeys(CATEGORIES, 0.0)
        for r in self.runs:
            for k, v in r["seconds"].items():
                total[k] += v
        return total

    @property
    def wall_s(self) -> float:
        return sum(r["wall_s"] for r in self.runs)

    @property
    def mfu(self) -> float | None:
        values = [r["mfu"] for r in self.runs if r["mfu"] is not None]
        return values[-1] if values else None

    @property
    def idle_s(self) -> float | None:
        return None if self.ledger is None else self.ledger.idle_now_s()

    def to_text(self) -> str:
        if not self.runs:
            lines = ["no runs yet: @pw.elastic, %%pathways elastic, pw.loader and pw.steps(...) loops are counted"]
        else:
            wall = self.wall_s
            if self.ledger is None:
                lines = [f"{self.runs[0]['header']}: goodput {100 * self.goodput:.1f}%"]
            else:
                plural = "run" if len(self.runs) == 1 else "runs"
                lines = [f"session, {len(self.runs)} {plural}: goodput {100 * self.goodput:.1f}% of {wall:.1f} s"]
            for r in self.runs:
                lines.append(f"  {r['summary']}")
                if self.ledger is not None:
                    lines.append(f"    {r['header']}")
                lines.append(f"    {goodput_timeline.step_time_text(r['step_time'])}")
                if r["mfu"] is not None:
                    lines.append(f"    MFU {100 * r['mfu']:.2f}% over {r['chips']} chips ({r['peak_how']})")
                if r.get("field") is not None:
                    lines.append(f"    ml-goodput-measurement: {r['field']}")
                if r["roles"]:
                    lines.append(f"    by role (pw.phase), of the run's {r['wall_s']:.1f} s:")
                    lines.extend(f"      {role.to_text()}" for role in r["roles"].values())
            seconds = self.seconds
            for category in CATEGORIES:
                if seconds[category] > 0.0005 * wall or category == PRODUCTIVE:
                    lines.append(
                        f"  {LABELS[category]:<24} {seconds[category]:8.2f} s  {100 * seconds[category] / wall:5.1f}%"
                    )
        if self.ledger is not None:
            session_s = time.perf_counter() - self.ledger.since
            idle = self.ledger.idle_now_s()
            lines.append(
                f"notebook: idle between cells with slices held {idle:.1f} s "
                f"({100 * idle / session_s if session_s else 0:.1f}% of the session's {session_s:.0f} s; not in the figures above)"
            )
        return "\n".join(lines)


def _figures(account: Account, with_field: bool) -> RunFigures:
    mfu = account.mfu()
    figures: RunFigures = {
        "name": account.name,
        "header": account.header(),
        "step_time": account.step_times(),
        "wall_s": account.wall_s,
        "seconds": account.snapshot(),
        "summary": account.summary(),
        "mfu": mfu,
        "chips": account.chips(),
        "peak_how": account.peak()[1] if mfu is not None else "",
        "roles": _roles(account),
    }
    if with_field and account.ended:
        try:
            result = account.field()
            figures["field"] = f"goodput {result['goodput']:.1f}%"
        except Exception as error:  # the library's own figure is a cross-check, not ours
            figures["field"] = f"no figure ({type(error).__name__}: {error})"
    return figures


def _roles(account: Account) -> dict[str, phases.RoleTime]:
    """The run's time by role, from the phases its loop marked (none: {})."""
    start = account.started
    end = start + account.wall_s
    spans = phases.phase_log(account._session).spans(account.name, start - 1e-3, end + 1e-3)
    return phases.role_split(spans, start, end) if spans else {}


def goodput(run: str | None = None, field: bool = True) -> Report:
    """Goodput of the run named ``run`` (the latest of that name), or of every
    run of the session, with the notebook's idle time between cells.

    ``field``: also compute the figure of ``ml-goodput-measurement`` for
    finished runs.

    Raises:
      PathwaysError: no run of that name.
    """
    book = ledger()
    if run is not None:
        return Report([_account(run)], None, field)
    with book._lock:
        accounts = [*book.runs, *book.active]
    return Report(accounts, book, field)


class OverTime(TextDisplay):
    """``%pathways goodput --over-time``: a run's intervals as a stacked chart (text without HTML)."""

    def __init__(self, frame: Any):
        self.frame = frame

    def to_text(self) -> str:
        f = self.frame
        cats = [c for c in CATEGORIES if float(f[c].sum()) > 0]
        lines = [f"{f.attrs['header']}: goodput over {len(f)} intervals"]
        lines.append(
            f"  {'interval':<17} {'goodput':>7}  " + "  ".join(f"{c[:10]:>10}" for c in cats if c != PRODUCTIVE)
        )
        for row in f.itertuples(index=False):
            span = row.end_s - row.start_s or 1.0
            shares = "  ".join(f"{100 * getattr(row, c) / span:9.1f}%" for c in cats if c != PRODUCTIVE)
            lines.append(f"  {row.start_s:7.2f}-{row.end_s:7.2f} s {100 * row.goodput:6.1f}%  {shares}")
        lines.append(f"  {goodput_timeline.step_time_text(f.attrs['step_time'])}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        f = self.frame
        title = f"{f.attrs['header']}: goodput over {len(f)} intervals"
        return goodput_timeline.chart_html(f, title, LABELS, goodput_timeline.step_time_text(f.attrs["step_time"]))


def goodput_over_time(run: str | None = None, intervals: int | None = None, window_s: float | None = None) -> Any:
    """Goodput and badput by category over the run named ``run`` (default: the
    session's latest run), in ``intervals`` equal intervals (default 20) or
    windows of ``window_s`` seconds: a pandas DataFrame, one row per interval
    (``start_s``, ``end_s`` from the run's start, ``goodput`` 0..1, seconds per
    category, ``steps`` started in it and their ``step_time_mean_s`` /
    ``step_time_std_s``); ``.attrs`` holds ``run``, ``header`` and the run's
    ``step_time`` figures (median, mean, std, slowest steps).

    Raises:
      PathwaysError: no such run, no run yet, or a bad ``intervals`` / ``window_s``.
    """
    return _account(run).over_time(intervals, window_s)


def intervals_message(session: Session, intervals: int, encode: Callable[..., Any]) -> Any:
    """The monitor's ``goodput_intervals`` message for the session's newest finished
    run (``intervals`` intervals), computed once per run; None before one.

    ``encode`` is the monitor protocol's ``encode_goodput_intervals``: the monitor
    passes it in, as training sits below monitoring and does not import it.
    """
    book = ledger(session)
    with book._lock:
        account = book.runs[-1] if book.runs else None
    if account is None:
        return None
    if account._published is None:
        frame = account.over_time(intervals)
        run = {
            "run": account.name,
            "kind": account.kind,
            "header": frame.attrs["header"],
            "started": account.started,
            "wall_s": account.wall_s,
        }
        columns = {name: frame[name].tolist() for name in frame.columns}
        account._published = encode(run, CATEGORIES, columns, frame.attrs["step_time"])
    return account._published


def _account(run: str | None) -> Account:
    book = ledger()
    if run is None:
        with book._lock:
            accounts = [*book.runs, *book.active]
        if not accounts:
            raise PathwaysError(
                "no run yet: @pw.elastic, %%pathways elastic, pw.loader and pw.steps(...) loops are counted"
            )
        return max(accounts, key=lambda a: a._began)
    account = book.find(run)
    if account is None:
        names = sorted({a.name for a in [*book.active, *book.runs]})
        known = f"; runs: {', '.join(names)}" if names else "; no run yet"
        raise PathwaysError(f"no run named '{run}' in this session{known}")
    return account
