"""`%pathways events` rows: a run of routine events (a snapshot every 10 steps) is one row with a
count and ranges; the HTML table reads left to right (issue #31 item 6)."""

from __future__ import annotations

import re

from pathways_kernel.core.eventlog import Event, EventTable

T0 = 1_760_000_000.0


def _training_log() -> list[Event]:
    events = [
        Event(i + 1, T0 + i / 100, "connection_update", detail=d)
        for i, d in enumerate(("Connecting", "Sending", "Connected"))
    ]
    events.append(Event(4, T0 + 0.05, "connect", detail="local:2x4"))
    events += [Event(10 + i, T0 + 1 + i, "snapshot", step=10 * i, bytes=4096, duration_s=0.002) for i in range(7)]
    events.append(Event(30, T0 + 9, "slice_down", slices_before=(0, 1), slices_after=(0,), detail="slice 1 lost"))
    events += [Event(40 + i, T0 + 10 + i, "snapshot", step=70 + 10 * i, bytes=4096, duration_s=0.002) for i in range(3)]
    events.append(Event(50, T0 + 20, "goodput", step=100, detail="elastic 'params': goodput 93.9%"))
    return events


def test_routine_runs_fold_into_one_row_with_a_count_and_ranges():
    text = repr(EventTable(_training_log()))
    lines = text.splitlines()
    assert len(lines) == 6, text
    assert "connection_update ×3" in lines[0] and "newest: Connected" in lines[0], lines[0]
    assert "snapshot ×7" in lines[2] and "step 0–60" in lines[2] and "4.0 KiB" in lines[2], lines[2]
    # A slice loss breaks the run: the snapshots after it are a row of their own.
    assert "slice_down" in lines[3] and "snapshot ×3" in lines[4] and "step 70–90" in lines[4], text
    assert "goodput" in lines[5]


def test_a_chosen_kind_lists_every_event_and_last_counts_rows():
    assert len(repr(EventTable([e for e in _training_log() if e.kind == "snapshot"], "snapshot")).splitlines()) == 10
    newest = repr(EventTable(_training_log(), last=2)).splitlines()
    assert len(newest) == 2 and "snapshot ×3" in newest[0] and "goodput" in newest[1], newest


def test_the_html_table_reads_left_to_right_in_three_columns():
    html = EventTable(_training_log())._repr_html_()
    assert "table-layout:auto" in html
    cells = re.findall(r"<t[dh]( [^>]*)?>", html)
    assert cells and all("text-align:left" in c for c in cells), html
    assert re.findall(r">(\w+)</th>", html) == ["time", "kind", "details"], html
    assert ">step 0–60 · 4.0 KiB · 2 ms</td>" in html, html
