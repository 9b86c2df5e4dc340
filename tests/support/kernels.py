"""Real kernels through jupyter_client, for tests: run code, collect what a user sees."""

from __future__ import annotations

import dataclasses
import queue
import re
import time
from typing import Any

from jupyter_client.manager import KernelManager

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclasses.dataclass
class Reply:
    status: str
    text: str  # stdout, stderr and text/plain results, in order
    error: str  # the error lines a user sees (error tracebacks and stderr), ANSI stripped
    data: list[dict[str, Any]]  # display_data / execute_result bundles
    messages: list[dict[str, Any]]


#: The product default: slices in a local Pathways server the kernel starts (a second process).
SERVER = "local:2x4"
#: The same slices in the kernel's own process: ~5 s less per kernel start and stop, for tests
#: of the UI and protocol, and of what only the embedded backend does.
EMBEDDED = "embedded:2x4"


class Kernel:
    """A started kernel and a blocking client.

    ``backend`` is the kernel's backend spec (``PATHWAYS_BACKEND``); ``env`` wins over it,
    and ``backend=None`` sets none, so the kernel starts on the product default.
    """

    def __init__(
        self,
        name: str = "pathways",
        env: dict[str, str] | None = None,
        jupyter_path: str | None = None,
        backend: str | None = EMBEDDED,
    ):
        self.km = KernelManager(kernel_name=name)
        # Grace before a kernel that was asked to exit is killed: an exit takes ~1 s
        # here, but several times that on a loaded 2-core machine (jupyter_client's 5 s
        # default turned clean exits into SIGTERMs).
        self.km.shutdown_wait_time = 20.0
        if jupyter_path:
            from jupyter_client.kernelspec import KernelSpecManager

            self.km.kernel_spec_manager = KernelSpecManager(kernel_dirs=[jupyter_path + "/kernels"])
        import os

        chosen = {key: value for key, value in os.environ.items() if key != "PATHWAYS_BACKEND"}
        if backend is not None:
            chosen["PATHWAYS_BACKEND"] = backend
        self.km.start_kernel(env={**chosen, **(env or {})})
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 120) -> Reply:
        messages: list[dict[str, Any]] = []
        reply = self.kc.execute_interactive(code, output_hook=messages.append, timeout=timeout, allow_stdin=False)
        text, errors, data = [], [], []
        clear_next = False
        for msg in messages:
            kind, content = msg["header"]["msg_type"], msg["content"]
            # What a frontend shows: clear_output empties the cell's output (with wait, at the next).
            if kind == "clear_output" or (clear_next and kind in ("stream", "execute_result", "display_data", "error")):
                clear_next = kind == "clear_output" and content.get("wait", False)
                if not clear_next:
                    text, errors, data = [], [], []
                if kind == "clear_output":
                    continue
            if kind == "stream":
                text.append(content["text"])
                if content["name"] == "stderr":
                    errors.append(_ANSI.sub("", content["text"]))
            elif kind in ("execute_result", "display_data"):
                data.append(content["data"])
                text.append(content["data"].get("text/plain", "") + "\n")
            elif kind == "error":
                errors.append("\n".join(_ANSI.sub("", line) for line in content["traceback"]))
        return Reply(reply["content"]["status"], "".join(text), "\n".join(errors), data, messages)

    def iopub(self, timeout: float) -> dict[str, Any] | None:
        try:
            return self.kc.get_iopub_msg(timeout=timeout)
        except queue.Empty:
            return None

    def shutdown(self) -> int | None:
        """Stop the kernel (once); returns its exit code."""
        if getattr(self, "_exit_code", "running") != "running":
            return self._exit_code
        proc = getattr(self.km.provisioner, "process", None)
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)
        deadline = time.time() + 25
        while proc is not None and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        self._exit_code = None if proc is None else proc.poll()
        return self._exit_code
