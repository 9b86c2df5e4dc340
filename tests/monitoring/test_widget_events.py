"""The notebook monitor's last events fold a snapshot every few steps into one line with its count (issue #31 item 6)."""

from __future__ import annotations

import re


def test_the_notebook_monitor_folds_repeated_events_into_one_line(kernel):
    reply = kernel.run(
        "dash = pw.monitor(events=4)\n"
        "for i in range(12):\n"
        "    pw.session().events.emit('snapshot', step=10 * i, bytes=4096)\n"
        "pw.session().events.emit('slice_down', slices_before=(0, 1), slices_after=(0,))\n"
        "pw.session().events.emit('snapshot', step=120, bytes=4096)\n"
        "import time\n"
        "for _ in range(100):  # the hub's thread hands events to the widget\n"
        "    if 'step 120' in dash.event_list.value:\n"
        "        break\n"
        "    time.sleep(0.05)\n"
        "print(dash.event_list.value)\n"
        "dash.close()"
    )
    assert reply.status == "ok", reply.error
    lines = re.findall(r"<div>([^<]*)</div>", reply.text)
    assert len(lines) <= 4, lines
    assert "snapshot" in lines[0] and "step 120" in lines[0], lines  # newest first, after the loss
    assert "slice_down" in lines[1], lines
    assert "snapshot ×12" in lines[2] and "step 0–110" in lines[2], lines
