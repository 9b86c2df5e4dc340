"""Sphinx configuration for the pathways-kernel docs (MyST Markdown pages).

`make docs` builds them with warnings as errors and nitpicky references, so a
broken internal link, heading anchor or toctree entry fails the build.
"""

import json
from pathlib import Path
from typing import Any

project = "pathways-kernel"
author = "pathways-kernel developers"
copyright = "2026, pathways-kernel developers"

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# `[text](page.md#a-heading)` links resolve to the heading's slug (h1-h3), and
# a slug that does not exist is a warning, so an error under -W.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

html_theme = "alabaster"
html_title = "pathways-kernel"
html_static_path: list[str] = []


# Search result snippets. Sphinx's search page fetches each hit's page to cut a
# snippet from it, and a browser refuses fetch() on file:// (README: open
# docs/_build/html/index.html), so the hits came without one. The page bodies go
# into one script the search page loads (a <script src> loads from file:// too),
# and on file:// its fetch() of a page of this site answers from there.
def _keep_body(app: Any, pagename: str, templatename: str, context: dict[str, Any], doctree: Any) -> None:
    if doctree is not None and "body" in context:
        _bodies[pagename + app.builder.out_suffix] = context["body"]
    if pagename == "search":
        app.add_js_file("search_pages.js")


def _write_bodies(app: Any, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    pages = json.dumps(_bodies).replace("</", "<\\/")
    script = f"""// Written by docs/conf.py: each page's body, for search snippets when the site is opened from file://.
(() => {{
  if (window.location.protocol !== "file:") return;
  const pages = {pages};
  const fetchPage = window.fetch;
  window.fetch = (url, init) => {{
    const name = decodeURI(String(url).split(/[?#]/)[0]).replace(/^(\\.\\/)+/, "");
    const key = Object.keys(pages).find(page => name === page || name.endsWith("/" + page));
    if (key === undefined) return fetchPage(url, init);
    return Promise.resolve(new Response(`<div role="main">${{pages[key]}}</div>`, {{ headers: {{ "Content-Type": "text/html" }} }}));
  }};
}})();
"""
    static = Path(app.outdir) / "_static"
    static.mkdir(exist_ok=True)
    (static / "search_pages.js").write_text(script, encoding="utf-8")


_bodies: dict[str, str] = {}


def setup(app: Any) -> None:
    app.connect("html-page-context", _keep_body)
    app.connect("build-finished", _write_bodies)
