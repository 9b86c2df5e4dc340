"""What a session installs belongs to it and goes when it closes (issue #21 item 3).

In this process's own session (embedded:2x4): a new session does not see the
events of the one it replaced.
"""

from __future__ import annotations

from kernels import EMBEDDED

import pathways_kernel as pw


def test_a_new_session_does_not_see_the_events_of_the_one_it_replaced(local_session):
    local_session.events.emit("snapshot", detail="made in the first session")
    second = pw.connect(EMBEDDED, force=True)
    assert second is not local_session
    assert "made in the first session" not in [e.detail for e in pw.events()]
    assert [e.kind for e in second.events.last()] == ["connect"]
    # The first session's own log still says what happened in it.
    assert "made in the first session" in [e.detail for e in local_session.events.last()]


def test_the_libraries_whose_private_api_we_patch_have_an_upper_pin_that_admits_the_installed_one():
    import tomllib
    from importlib.metadata import version
    from pathlib import Path

    from packaging.requirements import Requirement

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    pins = {r.name: r.specifier for r in map(Requirement, pyproject["project"]["dependencies"])}
    for name in ("ipykernel", "pathwaysutils", "jax", "jaxlib"):
        assert any(s.operator in ("<", "<=", "~=", "==") for s in pins[name]), f"{name} has no upper pin"
        assert pins[name].contains(version(name)), f"{name} {version(name)} is outside {pins[name]}"


def test_pathwaysutils_is_patched_only_while_the_embedded_session_runs_and_no_import_hook_outlives_the_import():
    import subprocess
    import sys

    code = (
        "import sys, pathways_kernel as pw\n"
        "from pathways_kernel.core import pathwaysutils_compat as compat\n"
        "s = pw.session(); s.topology\n"
        "assert 'pathwaysutils' not in sys.modules and compat._FINDER in sys.meta_path\n"
        "from pathwaysutils.elastic import elastic, manager\n"
        "print('hook', compat._FINDER in sys.meta_path)\n"
        "print('running', hasattr(elastic.get_slice_to_devices, '__wrapped__'))\n"
        "s.close()\n"
        "print('closed', hasattr(elastic.get_slice_to_devices, '__wrapped__'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["hook", "False", "running", "True", "closed", "False"], out.stdout
