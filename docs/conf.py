"""Sphinx configuration for the pathways-kernel docs (MyST Markdown pages).

`make docs` builds them with warnings as errors and nitpicky references, so a
broken internal link, heading anchor or toctree entry fails the build.
"""

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
