"""The docs site's search, opened as README says: docs/_build/html/index.html from disk.

Sphinx's search page cuts each hit's snippet from the hit's page, which it
fetch()es; Chromium refuses fetch() on file://, so every hit came without one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lab as labtools
import pytest
from test_browser import ARTIFACTS

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(labtools.missing() is not None, reason=labtools.missing() or ""),
]

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_search_results_opened_from_disk_have_snippets_with_the_term(tmp_path):
    html = tmp_path / "html"
    # As `make docs` builds it (warnings are errors, references checked).
    sphinx = Path(sys.executable).parent / "sphinx-build"
    subprocess.run(
        [str(sphinx), "-E", "-W", "--keep-going", "-n", "-q", "-b", "html", str(DOCS), str(html)], check=True
    )
    with labtools.browser(tmp_path / "chromium") as ctx:
        page = ctx.new_page()
        page.set_viewport_size({"width": 1280, "height": 800})
        page.goto((html / "search.html").as_uri() + "?q=snapshot")
        results = page.locator("#search-results ul.search > li")
        page.locator("#search-results", has_text="Search finished").wait_for(timeout=30_000)
        hits = results.count()
        assert hits >= 3, page.locator("#search-results").inner_text()
        # Each hit gets its snippet once its page is read (a few ms each): wait for all, bounded.
        snippets = page.locator("#search-results ul.search > li p.context")
        page.wait_for_function(
            f"() => document.querySelectorAll('#search-results ul.search > li p.context').length >= {hits}",
            timeout=15_000,
        )
        texts = snippets.all_inner_texts()
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "docs-search-snippets.png"))
    assert len(texts) == hits
    assert all("snapshot" in text.lower() for text in texts), texts
