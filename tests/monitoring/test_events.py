"""`%pathways events` in a real `pathways` kernel: times to the millisecond, unknown kinds named."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.kernel


def test_events_show_milliseconds_in_text_and_html(kernel):
    reply = kernel.run("%pathways events")
    assert reply.status == "ok", reply.error
    assert re.search(r"^\d\d:\d\d:\d\d\.\d{3}  connect ", reply.text, re.M), reply.text
    html = reply.data[-1]["text/html"]
    assert re.search(r"<td[^>]*>\d\d:\d\d:\d\d\.\d{3}</td><td[^>]*>connect</td>", html), html


def test_an_unknown_kind_is_named_with_the_known_ones(kernel):
    reply = kernel.run("%pathways events --kind nosuch")
    assert reply.status == "error"
    assert "no event kind 'nosuch'; the kinds are: " in reply.error
    assert "slice_down" in reply.error and "connect" in reply.error
    assert "Traceback" not in reply.error
    # A known kind with nothing yet says so, for that kind.
    quiet = kernel.run("%pathways events --kind slice_down")
    assert quiet.status == "ok", quiet.error
    assert "no slice_down events yet" in quiet.text
