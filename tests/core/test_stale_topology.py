"""The session never shows a topology JAX no longer has.

A first cell ``jax.config.update('jax_num_cpu_devices', 4)`` in an ``embedded:2x4``
kernel gives JAX 4 CPU devices; every pw call then says so in one line (and
how to use them) instead of reporting ``embedded:2x4`` or "no slice 1".
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.kernel


def one_line(reply):
    assert reply.status == "error", reply.text
    lines = [line for line in reply.error.splitlines() if line.strip()]
    assert len(lines) == 1, reply.error
    return lines[0]


def test_device_count_changed_in_a_cell_is_said_in_one_line_not_shown_stale(fresh_kernel):
    reply = fresh_kernel.run("import jax; jax.config.update('jax_num_cpu_devices', 4); print(len(jax.devices()))")
    assert reply.text.strip() == "4"
    assert fresh_kernel.run("print('next cell')").error == ""  # no hook trips over it
    for code in ("pw.status()", "%pathways status", "pw.fail_slice(1)", "pw.mesh()", "%pathways topology"):
        line = one_line(fresh_kernel.run(code))
        assert "BackendError" in line and "4 CPU devices, not the 8 of this session's embedded:2x4" in line, line
        assert "embedded:1x4" in line
    reply = fresh_kernel.run(
        "pw.connect('embedded:1x4', force=True); print(pw.status().slices_total, len(pw.devices()))"
    )
    assert reply.status == "ok", reply.error
    assert reply.text.split()[-2:] == ["1", "4"]
