"""What a session installs belongs to it and goes when it closes (issue #21 item 3).

In this process's own session (embedded:2x4): a new session does not see the
events of the one it replaced.
"""

from __future__ import annotations

from kernels import EMBEDDED

import pathways_kernel as pw


def test_a_new_session_does_not_see_the_events_of_the_one_it_replaced(local_session):
    local_session.events.emit("snapshot", detail="made in the first session")
    second = pw.connect(EMBEDDED, force=True)
    assert second is not local_session
    assert "made in the first session" not in [e.detail for e in pw.events()]
    assert [e.kind for e in second.events.last()] == ["connect"]
    # The first session's own log still says what happened in it.
    assert "made in the first session" in [e.detail for e in local_session.events.last()]
