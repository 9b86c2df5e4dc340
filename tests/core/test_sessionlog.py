"""The session log's files: appended as logged, read back after a crash, bounded on reading."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from pathways_kernel.core import sessionlog
from pathways_kernel.core.sessionlog import JsonLines


def earlier_kernel_wrote(path, records, tail: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write("".join(json.dumps({**r, "k": "1-0.000"}) + "\n" for r in records) + tail)


def test_a_line_cut_by_a_kill_is_skipped_and_said_and_the_next_kernel_writes_on_a_line_of_its_own(tmp_path):
    path = tmp_path / "s" / "metrics.jsonl"
    earlier_kernel_wrote(path, [{"i": 0}, {"i": 1}], tail='{"i": 2, "na')  # killed mid-write
    log = JsonLines(path)
    records, note = log.read()
    assert [r["i"] for r in records] == [0, 1]
    assert note == f"pathways: skipped 1 unreadable line of {path}"
    log.append([{"i": 3}])
    log.close()
    records, _ = JsonLines(path).read()
    assert [(r["i"], sessionlog.earlier(r)) for r in records] == [(0, True), (1, True), (3, False)]


def test_reading_back_is_bounded_to_the_newest_bytes(tmp_path):
    path = tmp_path / "metrics.jsonl"
    earlier_kernel_wrote(path, [{"i": i, "pad": "x" * 80} for i in range(10_000)])
    records, note = JsonLines(path).read(max_bytes=10_000)
    assert note == ""  # the line the bound cuts through is not counted unreadable
    assert 50 < len(records) < 120
    assert records[-1]["i"] == 9_999
    assert [r["i"] for r in records] == list(range(records[0]["i"], 10_000))


def test_no_file_reads_as_nothing_and_outside_a_kernel_nothing_is_kept(tmp_path):
    assert JsonLines(tmp_path / "none.jsonl").read() == ([], "")
    assert sessionlog.session_dir() is None


def test_old_and_surplus_session_directories_are_pruned_but_not_ours_nor_foreign_ones(tmp_path, monkeypatch):
    now = time.time()

    def session(name: str, days_old: float, files=("metrics.jsonl",)) -> Path:
        directory = tmp_path / name
        directory.mkdir()
        for f in files:
            (directory / f).write_text("{}\n")
        for path in [*directory.iterdir(), directory]:
            os.utime(path, (now - days_old * 86400, now - days_old * 86400))
        return directory

    own = session("kernel-own", 90)  # a long-idle session restarted now: ours, never pruned
    stale = session("kernel-stale", sessionlog.KEEP_DAYS + 1, ("metrics.jsonl", "events.jsonl"))
    foreign = session("not-a-session", 400, ("notes.txt",))  # something else: left alone
    monkeypatch.setattr(sessionlog, "KEEP_SESSIONS", 3)
    recent = [session(f"kernel-{i}", i, ()) for i in range(4)]  # newest first: 0, 1, 2, 3 days old
    removed = sessionlog.prune(tmp_path, own, now)
    assert sorted(removed) == sorted([stale, recent[2], recent[3]])
    assert own.exists() and foreign.exists() and recent[0].exists() and recent[1].exists()
    assert sessionlog.prune(tmp_path / "missing", own, now) == []
