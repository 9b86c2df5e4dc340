"""Render cost of the Pathways panel at 65,536 chips, through the real protocol path.

A `pathways` kernel started by a real JupyterLab server gets a synthetic
telemetry hub as its session's hub: 64 slices x 1,024 chips (32 x 32 grid
each), random utilization and memory, sampled and published at 2 Hz. The
monitor comm, the protocol encoder (pathways_kernel.monitoring) and the panel are
the real ones. Debian's Chromium shows the notebook with the panel open.

Prints:
- the median time of the panel's render per update, measured in the page with
  performance.now() around the panel's frame (the benchmark wraps the panel
  widget's draw method from outside; the panel carries no instrumentation); goal <= 16 ms;
- bytes per chip per metrics update: the binary buffers, the whole comm message
  (buffers + JSON), and the whole websocket frame as received by the browser;
  goal <= 3.

Run: .venv/bin/python bench/panel_scale.py [seconds]
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

import lab as labtools

SLICES, CHIPS_PER_SLICE = 64, 1024
CHIPS = SLICES * CHIPS_PER_SLICE

# Runs in the kernel before the page opens, so the panel's comm subscribes to this hub.
SETUP = f"""
import time, types
import numpy as np
from pathways_kernel.monitoring import telemetry
from pathways_kernel.core.backend import Placement
from pathways_kernel.core.eventlog import EventLog
from pathways_kernel.core.sessions import session
from pathways_kernel.core.slices import Topology

S, C = {SLICES}, {CHIPS_PER_SLICE}
_devices = [types.SimpleNamespace(id=i) for i in range(S * C)]
_placements = [Placement(i // C, ((i % C) % 32, (i % C) // 32, 0), 0, "synthetic") for i in range(S * C)]
_topology = Topology.from_placements(_devices, _placements, platform="synthetic")


class SyntheticSource(telemetry.MetricsSource):
    name = "synthetic"

    def __init__(self):
        self.rng = np.random.default_rng(0)

    def sample(self, layout):
        n = layout.chips
        return telemetry.Sample(time.time(), self.rng.random(n, dtype=np.float32),
                                self.rng.integers(0, 16 << 30, n))


_backend = types.SimpleNamespace(spec="synthetic:{SLICES}x{CHIPS_PER_SLICE}", target="bench",
                                 supports_fault_injection=False, close=lambda: None)
_components = {{}}  # what a session keeps per kind (the monitor reads its metric log)
_fake = types.SimpleNamespace(topology=_topology, events=EventLog(), backend=_backend,
                              component=lambda kind: _components.setdefault(kind, kind(None)))
_hub = telemetry.TelemetryHub(_fake, source=SyntheticSource(), sample_hz=2, publish_hz=2)
assert session().component(telemetry.TelemetryHub, lambda s: _hub) is _hub, "a hub existed before the benchmark's"
_fake.events.emit("connect", detail="synthetic 64 x 1024 chips")
print("synthetic hub ready", _hub.layout.chips)
"""

MEASURE = """
from pathways_kernel.monitoring import encoding
from pathways_kernel.monitoring import protocol
import json
_m = _hub.latest()
_data, _buffers = protocol.encode_metrics(encoding.metrics_message(_m))
print(json.dumps({"json": len(json.dumps(_data)), "buffers": sum(memoryview(b).nbytes for b in _buffers)}))
"""


def start_kernel(server: labtools.Lab, path: str) -> str:
    body = json.dumps({"path": path, "name": path, "type": "notebook", "kernel": {"name": "pathways"}}).encode()
    req = urllib.request.Request(
        server.api("sessions"), data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())["kernel"]["id"]


def kernel_client(server: labtools.Lab, kernel_id: str):
    from jupyter_client import BlockingKernelClient

    client = BlockingKernelClient(connection_file=f"{server.env['JUPYTER_RUNTIME_DIR']}/kernel-{kernel_id}.json")
    client.load_connection_file()
    client.start_channels()
    client.wait_for_ready(timeout=120)
    return client


def run(client, code: str) -> str:
    out: list[str] = []

    def hook(msg):
        if msg["header"]["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["header"]["msg_type"] == "error":
            out.append("\n".join(msg["content"]["traceback"]))

    reply = client.execute_interactive(code, output_hook=hook, timeout=300)
    if reply["content"]["status"] != "ok":
        raise RuntimeError("".join(out))
    return "".join(out)


def main(seconds: float = 30.0) -> None:
    reason = labtools.missing()
    if reason:
        print(f"skipped: {reason}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        labtools.notebook(root / "bench.ipynb", ["# panel_scale benchmark: the kernel holds a synthetic 64 x 1024 hub"])
        server = labtools.Lab(root)
        try:
            kernel_id = start_kernel(server, "bench.ipynb")
            client = kernel_client(server, kernel_id)
            print(run(client, SETUP).strip())
            artifacts = Path(__file__).resolve().parent.parent / "test-artifacts"
            artifacts.mkdir(exist_ok=True)
            with labtools.browser(root / "chromium") as context:
                page = context.new_page()
                page.set_default_timeout(120_000)
                frames: list[int] = []

                def on_socket(ws):
                    def on_frame(payload):
                        raw = payload if isinstance(payload, bytes) else payload.encode()
                        if re.search(rb'"type":\s*"metrics"', raw):
                            frames.append(len(raw))

                    ws.on("framereceived", on_frame)

                page.on("websocket", on_socket)
                page.goto(server.url("bench.ipynb"))
                page.locator("#pathways-monitor[data-state='live']").wait_for(state="attached")
                page.evaluate("window.jupyterapp.commands.execute('pathways:open-monitor')")
                page.locator(f"#pathways-monitor canvas[data-chips='{CHIPS}']").wait_for()
                page.evaluate(TIME_RENDERS)
                narrow = measure(page, frames, seconds)
                page.locator("#pathways-monitor").screenshot(path=str(artifacts / "panel_scale_narrow.png"))
                widen_sidebar(page)
                wide = measure(page, frames, seconds)
                page.locator("#pathways-monitor").screenshot(path=str(artifacts / "panel_scale_wide.png"))
            sizes = json.loads(run(client, MEASURE).strip().splitlines()[-1])
            client.stop_channels()
        finally:
            server.stop()

    wire = statistics.median(narrow["frames"] + wide["frames"])
    mode = {"true": "one block per slice", "false": "one cell per chip"}
    for name, m in (("default sidebar", narrow), ("widened sidebar", wide)):
        t = m["times"]
        print(
            f"{name}: canvas {m['width']} CSS px, {mode[m['aggregated']]}; "
            f"{len(m['frames'])} metrics frames in {m['elapsed']:.1f} s, {len(t)} renders; "
            f"render ms median {statistics.median(t):.2f}, p90 {sorted(t)[int(0.9 * (len(t) - 1))]:.2f}, max {max(t):.2f}"
        )
    print(
        f"bytes/chip/update: buffers {sizes['buffers'] / CHIPS:.3f}, comm message (buffers + JSON "
        f"{sizes['json']} B) {(sizes['buffers'] + sizes['json']) / CHIPS:.3f}, websocket frame {wire / CHIPS:.3f}"
    )
    print(
        f"median render per update: {statistics.median(narrow['times']):.2f} ms ({mode[narrow['aggregated']]}), "
        f"{statistics.median(wide['times']):.2f} ms ({mode[wide['aggregated']]}) (goal <= 16); bytes per chip per update: "
        f"{wire / CHIPS:.2f} on the wire, {sizes['buffers'] / CHIPS:.2f} in buffers (goal <= 3)"
    )


# Wrap the panel widget's per-frame draw (found through JupyterLab's shell) to time it.
TIME_RENDERS = """() => {
  const panel = [...window.jupyterapp.shell.widgets('right')].find(w => w.id === 'pathways-monitor');
  if (!panel || typeof panel._draw !== 'function') throw new Error('no Pathways panel with a _draw method');
  const draw = panel._draw.bind(panel);
  window.renderTimes = [];
  panel._draw = () => { const t0 = performance.now(); draw(); window.renderTimes.push(performance.now() - t0); };
}"""


def measure(page, frames: list[int], seconds: float) -> dict:
    """Render times and metrics frame sizes over `seconds` of 2 Hz updates."""
    page.wait_for_timeout(3000)  # warm-up: first frames, resize, JIT
    page.evaluate("window.renderTimes.length = 0")
    frames.clear()
    started = time.monotonic()
    page.wait_for_timeout(seconds * 1000)
    canvas = page.locator("#pathways-monitor canvas.jp-PathwaysPanel-canvas")
    times = page.evaluate("window.renderTimes.slice()")
    if not times:
        raise SystemExit("no renders recorded: the panel did not update")
    return {
        "times": times,
        "frames": list(frames),
        "elapsed": time.monotonic() - started,
        "width": canvas.evaluate("c => c.clientWidth"),
        "aggregated": canvas.get_attribute("data-aggregated"),
    }


def widen_sidebar(page) -> None:
    """Drag the right sidebar's split handle left, as a user would, until the panel is ~1,200 px wide."""
    panel = page.locator("#pathways-monitor").bounding_box()
    handle = page.locator("#jp-main-split-panel > .lm-SplitPanel-handle:not(.lm-mod-hidden)").last.bounding_box()
    x, y = handle["x"] + handle["width"] / 2, handle["y"] + handle["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x - (1200 - panel["width"]), y, steps=10)
    page.mouse.up()


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 30.0)
