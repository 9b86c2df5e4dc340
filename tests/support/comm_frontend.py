"""A JupyterLab panel's side of the monitor comm, over a real kernel's channels.

Tests that act as the panel (tests/monitoring, goodput, profiling) open
`pathways.monitor` comms on a kernel subshell (what JupyterLab >= 4.4 does with
commsOverSubshells), send requests as `comm_msg`s and read the kernel's answers on IOPub.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from pathways_kernel.monitoring import protocol as p


class Frontend:
    """What a panel does over the kernel's channels (one subshell, many comms)."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.kc = kernel.kc
        self.subshell = self._create_subshell()
        self.inbox: list[dict[str, Any]] = []  # comm messages seen on IOPub, in order
        self.statuses: list[dict[str, Any]] = []  # status messages seen on IOPub, in order

    def _create_subshell(self) -> str:
        msg = self.kc.session.msg("create_subshell_request", {})
        self.kc.control_channel.send(msg)
        deadline = time.time() + 30
        while time.time() < deadline:
            reply = self.kc.control_channel.get_msg(timeout=30)
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                assert reply["content"]["status"] == "ok", reply["content"]
                return reply["content"]["subshell_id"]
        raise AssertionError("no create_subshell_reply")

    def _send(
        self, msg_type: str, content: dict[str, Any], buffers: list[bytes] | None = None, main_shell: bool = False
    ) -> None:
        msg = self.kc.session.msg(msg_type, content)
        if not main_shell:
            msg["header"]["subshell_id"] = self.subshell
        self.kc.shell_channel.send(msg) if not buffers else self.kc.session.send(
            self.kc.shell_channel.socket, msg, buffers=buffers
        )

    def open(self, main_shell: bool = False) -> str:
        comm_id = uuid.uuid4().hex
        self._send("comm_open", {"comm_id": comm_id, "target_name": p.TARGET, "data": {}}, main_shell=main_shell)
        return comm_id

    def send(self, comm_id: str, data: Any, buffers: list[bytes] | None = None) -> None:
        self._send("comm_msg", {"comm_id": comm_id, "data": data}, buffers)

    def request(self, comm_id: str, type_: str, **fields: Any) -> str:
        request_id = uuid.uuid4().hex[:12]
        self.send(comm_id, {"v": 1, "type": type_, "request_id": request_id, **fields})
        return request_id

    def pump(self, timeout: float) -> None:
        msg = self.kernel.iopub(timeout)
        if msg is not None and msg["header"]["msg_type"] in ("comm_msg", "comm_close", "comm_open"):
            self.inbox.append(msg)
        elif msg is not None and msg["header"]["msg_type"] == "status":
            self.statuses.append(msg)

    def wait_for(self, predicate, timeout: float, since: int = 0) -> dict[str, Any] | None:
        """The first comm message (from position ``since`` on) that satisfies ``predicate``."""
        deadline = time.time() + timeout
        checked = since
        while True:
            for msg in self.inbox[checked:]:
                if predicate(msg):
                    return msg
            checked = len(self.inbox)
            remaining = deadline - time.time()
            if remaining <= 0:
                return None
            self.pump(min(remaining, 0.05))

    def reply_to(self, comm_id: str, request_id: str | None, timeout: float, since: int = 0) -> dict[str, Any] | None:
        msg = self.wait_for(
            lambda m: is_comm_msg(m, comm_id, "reply") and m["content"]["data"]["request_id"] == request_id,
            timeout,
            since,
        )
        return None if msg is None else msg["content"]["data"]


def is_comm_msg(msg: dict[str, Any], comm_id: str, kind: str) -> bool:
    content = msg["content"]
    return (
        msg["header"]["msg_type"] == "comm_msg"
        and content.get("comm_id") == comm_id
        and content.get("data", {}).get("type") == kind
    )


def is_comm_close(msg: dict[str, Any], comm_id: str) -> bool:
    return msg["header"]["msg_type"] == "comm_close" and msg["content"].get("comm_id") == comm_id
