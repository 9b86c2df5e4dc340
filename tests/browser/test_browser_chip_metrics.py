"""The panel shows where its chip figures come from, in a real JupyterLab through Chromium: the local
server's runtime metrics on the default backend (idle chips 0 %), then Cloud Monitoring's series
per slice once the kernel connects with ``--metrics cloud-monitoring`` (a stand-in API on 127.0.0.1,
``tests/support/cloud_monitoring.py``).
"""

from __future__ import annotations

import json

import lab as labtools
import pytest
from cloud_monitoring import StandIn, gke_series
from test_browser import PANEL, open_monitor, open_notebook, run_first_cell

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(labtools.missing() is not None, reason=labtools.missing() or ""),
]

GIB = 1 << 30


@pytest.fixture(scope="module")
def monitoring():
    standin = StandIn(
        {
            "gke-project": gke_series(
                "pathways", slices=2, hosts=1, chips=4, duty=[75, 25], used=[3 * GIB, GIB], total=16 * GIB
            )
        }
    )
    yield standin
    standin.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory, monitoring):
    root = tmp_path_factory.mktemp("lab")
    adc = root / "adc.json"
    adc.write_text(
        json.dumps({"type": "authorized_user", "client_id": "i", "client_secret": "s", "refresh_token": "r"})
    )
    labtools.notebook(
        root / "chips.ipynb",
        [
            "import jax.numpy as jnp\nx = (jnp.ones((256, 256)) @ jnp.ones((256, 256))).block_until_ready()\n"
            "print('ran', x.shape)",
            "%pathways connect embedded:2x4 --force --metrics cloud-monitoring --metrics-project gke-project "
            "--metrics-cluster pw-cluster",
        ],
    )
    lab = labtools.Lab(
        root,
        env={
            "PATHWAYS_BACKEND": "local:2x4",  # the product default (the tests' own is embedded)
            "PATHWAYS_MONITORING_ENDPOINT": monitoring.address,
            "GOOGLE_APPLICATION_CREDENTIALS": str(adc),
        },
    )
    yield lab
    lab.stop()


@pytest.fixture(scope="module")
def context(server, tmp_path_factory):
    with labtools.browser(tmp_path_factory.mktemp("chromium")) as ctx:
        yield ctx


@pytest.fixture
def page(context):
    page = context.new_page()
    page.set_default_timeout(60_000)
    yield page
    page.close()


def header(page, field: str):
    return page.locator(f"{PANEL} [data-field='{field}'] .jp-PathwaysPanel-headerValue")


def slice_utilization(page) -> list[str]:
    return page.locator(f"{PANEL} .jp-PathwaysPanel-sliceUtil").all_inner_texts()


def test_the_panel_says_what_measured_the_chips_and_shows_cloud_monitoring_per_slice(page, server):
    open_notebook(page, server, "chips.ipynb")
    page.locator(f"{PANEL}[data-state='live']").wait_for(state="attached", timeout=120_000)
    run_first_cell(page, "ran (256, 256)")
    open_monitor(page)
    measured = header(page, "measured by")
    page.wait_for_function(
        f"() => document.querySelector(\"{PANEL} [data-field='measured by'] .jp-PathwaysPanel-headerValue\")"
        "?.textContent === 'runtime metrics (pathways-local), 1 s'",
        timeout=60_000,
    )
    # The work is over: idle chips read 0 %.
    page.wait_for_function(
        f"() => [...document.querySelectorAll('{PANEL} .jp-PathwaysPanel-sliceUtil')].map(n => n.textContent)"
        ".join() === '0%,0%'",
        timeout=30_000,
    )
    # Connect with Cloud Monitoring's figures: the second cell.
    page.locator(".jp-Notebook .jp-Cell .jp-InputArea-editor").nth(1).click()
    page.keyboard.press("Control+Enter")
    page.locator(".jp-OutputArea-output", has_text="monitor: chips from Cloud Monitoring, 60 s").first.wait_for(
        timeout=120_000
    )
    page.wait_for_function(
        f"() => document.querySelector(\"{PANEL} [data-field='measured by'] .jp-PathwaysPanel-headerValue\")"
        "?.textContent === 'Cloud Monitoring, 60 s'",
        timeout=60_000,
    )
    assert measured.inner_text() == "Cloud Monitoring, 60 s"
    page.wait_for_function(
        f"() => [...document.querySelectorAll('{PANEL} .jp-PathwaysPanel-sliceUtil')].map(n => n.textContent)"
        ".join() === '75%,25%'",
        timeout=30_000,
    )
    assert header(page, "utilization").inner_text() == "50%"
