"""The Slurm job's id and time left in the Pathways panel's header, in a real JupyterLab and Chromium.

A real Slurm (tests/support/slurm.py) runs a two-node job; the notebook binds
``local:2x4`` to it, and the header's target follows what Slurm says.
"""

from __future__ import annotations

import re

import lab as labtools
import pytest
from slurm import slurm_cluster  # noqa: F401  (the `slurm` fixture)
from test_browser import PANEL, open_monitor, open_notebook, run_first_cell

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(labtools.missing() is not None, reason=labtools.missing() or ""),
]


def test_the_panel_header_shows_the_slurm_job_and_its_time_left(slurm, tmp_path_factory):
    job = slurm.submit("#!/bin/bash\nsleep 300\n", "--nodes=2", "--time=30", "--job-name=pw-header")
    try:
        slurm.wait_job(job, "RUNNING")
        root = tmp_path_factory.mktemp("lab")
        labtools.notebook(root / "slurm.ipynb", [f"%pathways connect local:2x4 --slurm {job} --force\nprint('bound')"])
        lab = labtools.Lab(root, env={"SLURM_CONF": str(slurm.conf)})
        try:
            with labtools.browser(tmp_path_factory.mktemp("chromium")) as context:
                page = context.new_page()
                page.set_default_timeout(60_000)
                open_notebook(page, lab, "slurm.ipynb")
                run_first_cell(page, "bound")
                open_monitor(page)
                target = page.locator(f"{PANEL} [data-field='target'] .jp-PathwaysPanel-headerValue")
                page.wait_for_function(
                    f"() => /slurm job {job} · \\d+ min left/.test(document.querySelector("
                    f"\"{PANEL} [data-field='target'] .jp-PathwaysPanel-headerValue\")?.textContent ?? '')",
                    timeout=30_000,
                )
                first = int(re.search(r"(\d+) min left", target.inner_text()).group(1))
                assert 25 <= first <= 29, target.inner_text()
                slurm.run("scontrol", "update", f"jobid={job}", "timelimit=12")
                page.wait_for_function(
                    f"() => /slurm job {job} · 1[01] min left/.test(document.querySelector("
                    f"\"{PANEL} [data-field='target'] .jp-PathwaysPanel-headerValue\")?.textContent ?? '')",
                    timeout=10_000,
                )
                page.close()
        finally:
            lab.stop()
    finally:
        slurm.run("scancel", job, check=False)
