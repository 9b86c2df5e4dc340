"""History on subscribe at 65,536 chips, measured in the page: comm_open sent -> `history` received.

The kernel holds bench/panel_scale.py's synthetic 64 x 1,024 hub with its
history filled for a full 15 minutes at 2 Hz (what a kernel that ran that long
keeps). Debian's Chromium opens the notebook with the Pathways panel; the
websocket is watched from outside the page: the time from the frame that opens
the `pathways.monitor` comm to the frame carrying the `history` message, and
that frame's size. Repeated by reloading the page (each load subscribes anew).
Prints the median last, against the 250 ms goal.

Run: .venv/bin/python bench/history_page.py [loads]
"""

from __future__ import annotations

import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

import lab as labtools
from panel_scale import CHIPS, SETUP, kernel_client, run, start_kernel

FILL = """
import dataclasses
from pathways_kernel.monitoring.history import SLICE_HISTORY_S, History
_rng = np.random.default_rng(1)
_util, _mem = _rng.random(S * C, dtype=np.float32), _rng.integers(0, 16 << 30, S * C)
_h = History(S, S * C, 2.0, 16 << 30)
_t0 = time.time() - SLICE_HISTORY_S
for _i in range(int(SLICE_HISTORY_S * 2)):
    _m = telemetry.aggregate(_hub.layout, 1, _i + 1, "synthetic", 2.0, _util, _mem, None)
    _h.record(dataclasses.replace(_m, time=_t0 + _i / 2))
_hub._history = _h
print("history points", len(_h))
"""

GOAL_S = 0.250


def main(loads: int = 5) -> None:
    reason = labtools.missing()
    if reason:
        print(f"skipped: {reason}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        labtools.notebook(root / "bench.ipynb", ["# history_page benchmark: a synthetic 64 x 1024 hub with 15 min"])
        server = labtools.Lab(root)
        try:
            kernel_id = start_kernel(server, "bench.ipynb")
            client = kernel_client(server, kernel_id)
            print(run(client, SETUP).strip())
            print(run(client, FILL).strip())
            latencies, sizes = [], []
            with labtools.browser(root / "chromium") as context:
                page = context.new_page()
                page.set_default_timeout(120_000)
                marks: dict[str, float] = {}

                def on_socket(ws):
                    def sent(payload):
                        raw = payload if isinstance(payload, bytes) else payload.encode()
                        if b"comm_open" in raw and b"pathways.monitor" in raw:
                            marks["open"] = time.perf_counter()

                    def received(payload):
                        raw = payload if isinstance(payload, bytes) else payload.encode()
                        if "open" in marks and "history" not in marks and re.search(rb'"type":\s*"history"', raw):
                            marks["history"] = time.perf_counter()
                            sizes.append(len(raw))

                    ws.on("framesent", sent)
                    ws.on("framereceived", received)

                page.on("websocket", on_socket)
                for _ in range(loads):
                    marks.clear()
                    page.goto(server.url("bench.ipynb"))
                    page.locator("#pathways-monitor[data-state='live']").wait_for(state="attached")
                    deadline = time.monotonic() + 30
                    while "history" not in marks and time.monotonic() < deadline:
                        page.wait_for_timeout(20)
                    if "history" not in marks:
                        raise SystemExit("no history message reached the page")
                    latencies.append(marks["history"] - marks["open"])
            client.stop_channels()
        finally:
            server.stop()

    print(f"chips {CHIPS}; history frame {statistics.median(sizes) / 1e6:.2f} MB on the websocket")
    print("comm_open -> history received (ms): " + ", ".join(f"{s * 1000:.0f}" for s in latencies))
    median = statistics.median(latencies)
    print(f"history on subscribe, median {median * 1000:.0f} ms (goal <= 250): {median / GOAL_S:.2f} of the goal")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
