"""Executing the project's notebooks headless on the `pathways` kernel, for tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).parent.parent / "notebooks"


def execute(name: str, keep: Callable[[nbformat.NotebookNode], bool] = lambda cell: True, timeout: int = 180):
    """Run ``notebooks/NAME`` (cells for which ``keep`` holds); returns the executed notebook."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "pathways"
    nb.cells = [cell for cell in nb.cells if keep(cell)]
    NotebookClient(nb, timeout=timeout, kernel_name="pathways").execute()
    return nb


def code_cells(nb) -> list:
    return [cell for cell in nb.cells if cell.cell_type == "code"]


def outputs_text(cell) -> str:
    """What a reader sees under a cell, as text: streams, plain-text results, error tracebacks."""
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif out["output_type"] == "error":
            parts.append("\n".join(out["traceback"]))
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
    return "".join(parts)
