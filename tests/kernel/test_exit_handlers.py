"""Exit handlers belong to what runs: a closed session leaves none of ours (issue #21 item 3).

A script that imports pathways_kernel registers nothing at exit; a session's running
parts (its telemetry hub's thread, a chaos schedule) each register a stop at exit
while they run, and take it back when they stop, so the session's close leaves none.
The order they stop in at exit is tests/kernel/test_shutdown.py's.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import atexit

    # Which exit handlers of pathways_kernel are registered now (atexit keeps no list).
    ours = []
    register, unregister = atexit.register, atexit.unregister

    def name(f):
        return getattr(f, "__qualname__", repr(f))

    def tracked_register(f, *args, **kwargs):
        if (getattr(f, "__module__", None) or "").startswith("pathways_kernel"):
            ours.append(f)
        return register(f, *args, **kwargs)

    def tracked_unregister(f):
        ours[:] = [g for g in ours if g != f]
        return unregister(f)

    atexit.register, atexit.unregister = tracked_register, tracked_unregister

    import pathways_kernel as pw
    from pathways_kernel.monitoring import telemetry

    print("imported", [name(f) for f in ours])
    first = pw.connect("embedded:2x4")
    telemetry.hub(first).subscribe()
    pw.chaos(mtbf=3600, mttr=1, seed=0)
    print("running", len(ours))
    pw.connect("embedded:2x4", force=True)  # closes the first session
    print("replaced", [name(f) for f in ours])
    pw.session().close()
    print("closed", [name(f) for f in ours])
    """
)


def test_importing_and_closing_a_session_leave_no_exit_handler_of_ours():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert lines["imported"] == "[]", done.stdout
    assert int(lines["running"]) >= 2, done.stdout  # the hub's thread and the chaos schedule
    assert lines["replaced"] == "[]", done.stdout
    assert lines["closed"] == "[]", done.stdout
