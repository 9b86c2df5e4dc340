"""What the extension installs on a kernel belongs to it: ``%unload_ext`` takes all of it off.

A real kernel through jupyter_client: its shell's cell hooks, magics, exception
handler and traceback display, the kernel's comm target and the two ipykernel
handlers we wrap, and the session's subscriptions (progress under the cell for
transfers and runs).
"""

from __future__ import annotations

import ast

import pytest

pytestmark = pytest.mark.kernel

STATE = r"""
def _pathways_state():
    import comm
    from pathways_kernel.state.transfers import TransferStarts
    from pathways_kernel.training.accounting import RunStarts

    ip = get_ipython()

    def ours(f):
        owner = getattr(f, "__self__", None)
        return any((getattr(o, "__module__", None) or "").startswith("pathways_kernel") for o in (f, owner, type(owner)) if o is not None)

    s = pw.session()
    return dict(
        hooks=sorted(f"{e}:{getattr(f, '__qualname__', f)}" for e, fs in ip.events.callbacks.items() for f in fs if ours(f)),
        magic="pathways" in ip.magics_manager.magics["line"],
        custom_exc=[e.__name__ for e in ip.custom_exceptions],
        showtraceback="_showtraceback" in vars(ip),
        publish_status="_publish_status" in vars(ip.kernel),
        comm_info=ip.kernel.shell_handlers["comm_info_request"] != ip.kernel.comm_info_request,
        target="pathways.monitor" in comm.get_comm_manager().targets,
        watchers=len(s.component(TransferStarts)) + len(s.component(RunStarts)),
        attrs=sorted(a for o in (ip, ip.kernel) for a in vars(o) if a.startswith("_pathways")),
    )
"""


def state(kernel) -> dict:
    reply = kernel.run("print(repr(_pathways_state()))")
    assert reply.status == "ok", reply.error
    return ast.literal_eval(reply.text.strip())


def test_unload_ext_removes_every_hook_and_load_ext_puts_them_back_once(fresh_kernel):
    assert fresh_kernel.run(STATE).status == "ok"
    loaded = state(fresh_kernel)
    assert loaded["magic"] and loaded["target"] and loaded["publish_status"] and loaded["comm_info"], loaded
    assert loaded["custom_exc"] == ["PathwaysError"] and loaded["showtraceback"], loaded
    assert len(loaded["hooks"]) >= 4 and loaded["watchers"] == 2, loaded
    assert loaded["attrs"] == [], loaded

    reply = fresh_kernel.run("%unload_ext pathways_kernel")
    assert reply.status == "ok" and reply.text.strip() == "", reply.text + reply.error
    assert state(fresh_kernel) == dict(
        hooks=[],
        magic=False,
        custom_exc=[],
        showtraceback=False,
        publish_status=False,
        comm_info=False,
        target=False,
        watchers=0,
        attrs=[],
    )

    # Loaded again (twice: the second is a no-op), everything is back, once.
    assert fresh_kernel.run("%load_ext pathways_kernel\n%load_ext pathways_kernel").status == "ok"
    assert state(fresh_kernel) == loaded
    assert fresh_kernel.run("%pathways status").status == "ok"


def test_a_new_session_is_followed_and_the_closed_one_keeps_no_subscription(fresh_kernel):
    assert fresh_kernel.run(STATE).status == "ok"
    reply = fresh_kernel.run(
        "from pathways_kernel.state.transfers import TransferStarts\n"
        "first = pw.session()\n"
        "second = pw.connect(first.backend.spec, force=True)\n"
        "print(len(first.component(TransferStarts)), len(second.component(TransferStarts)))"
    )
    assert reply.status == "ok", reply.error
    # The closed session's components went with it (a fresh, empty one is made on asking).
    assert reply.text.split() == ["0", "1"], reply.text
