"""A session's metrics and events outlive a kernel restart: written under the session's log
directory as they are logged, read back by the restarted kernel (issue #31 item 7)."""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path

from kernels import Kernel

LOG = """\
import pathways_kernel as pw
for b in pw.steps(range(5), name="train"):
    pw.log(loss=10.0 - b)
print(pw.metrics()["run"].unique().tolist())"""

AFTER = """\
for b in pw.steps(range(3), name="train"):
    pw.log(loss=1.0)
f = pw.metrics()
print({run: f[f.run == run]["loss"].tolist() for run in f["run"].unique()})
print(sorted(os.listdir(pw.metrics_to_tensorboard(tb).logdir)))"""


def test_metrics_and_events_come_back_after_a_kill_and_a_restart(tmp_path):
    k = Kernel("pathways", env={"PATHWAYS_LOG_DIR": str(tmp_path / "logs")})
    try:
        first = k.run(LOG)
        assert first.status == "ok", first.error
        assert "['train #1']" in first.text
        [metrics] = glob.glob(str(tmp_path / "logs" / "*" / "metrics.jsonl"))
        assert len(Path(metrics).read_text().splitlines()) == 5
        with open(metrics, "a") as f:
            f.write('{"run": "train #1", "st')  # what a kill -9 in the middle of a write leaves
        k.km.restart_kernel(now=True)  # SIGKILL, as a crash would, then the same kernel id again
        k.kc.wait_for_ready(timeout=120)

        after = k.run(f"import os, pathways_kernel as pw\ntb = {str(tmp_path / 'tb')!r}\n" + AFTER)
        assert after.status == "ok", after.error
        # The earlier kernel's run, whole; this kernel's first run numbered after it.
        assert "{'train #1': [10.0, 9.0, 8.0, 7.0, 6.0], 'train #2': [1.0, 1.0, 1.0]}" in after.text
        assert f"pathways: skipped 1 unreadable line of {metrics}" in after.error
        assert "['train_1', 'train_2']" in after.text  # both export to TensorBoard, as before
        events = k.run("%pathways events")
        # The earlier kernel's events first, marked; then this kernel's, from its connect.
        rows = [line for line in events.text.splitlines() if "connect " in line]
        assert len(rows) == 2 and "earlier kernel" in rows[0] and "earlier kernel" not in rows[1], events.text
        # This kernel appends on a line of its own: a third kernel reads both runs.
        lines = Path(metrics).read_text().splitlines()
        assert [json.loads(line)["run"] for line in lines[6:]] == ["train #2"] * 3
    finally:
        k.shutdown()
    assert os.stat(metrics).st_mode & 0o077 == 0  # the owner's only, as the profiles are
