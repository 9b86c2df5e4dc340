"""Executing the project's notebooks headless on the `pathways` kernel, for tests and `make notebooks`.

    python tests/support/notebooks.py [NAME.ipynb ...]    # run and save them with their outputs (default: all)
    python tests/support/notebooks.py --scrub             # take the saving machine out of the saved outputs

Cells tagged ``needs-cluster`` need a real Pathways proxy or job, which cannot
run here: they are skipped, and saved without outputs.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
#: The tag of cells that need a real cluster.
NEEDS_CLUSTER = "needs-cluster"


def execute(
    name: str,
    keep: Callable[[nbformat.NotebookNode], bool] = lambda cell: True,
    timeout: int = 180,
    backend: str = "local:2x4",
):
    """Run ``notebooks/NAME`` (cells for which ``keep`` holds) on ``backend`` (default: the
    product default, as a user and ``make notebooks`` run it); returns the executed notebook."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "pathways"
    nb.cells = [cell for cell in nb.cells if keep(cell)]
    NotebookClient(nb, timeout=timeout, kernel_name="pathways").execute(env=_kernel_env(backend))
    return nb


def _kernel_env(backend: str | None) -> dict[str, str]:
    """This process's environment with the kernel's backend: ``backend``, or none set (the product default)."""
    env = {key: value for key, value in os.environ.items() if key != "PATHWAYS_BACKEND"}
    if backend is not None:
        env["PATHWAYS_BACKEND"] = backend
    return env


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


def save_with_outputs(name: str, timeout: int = 600) -> nbformat.NotebookNode:
    """Run ``notebooks/NAME`` top to bottom (skipping ``needs-cluster`` cells) and write it back
    with its outputs, so it reads well before anyone runs it; a cell's error stops it unsaved."""
    path = NOTEBOOKS / name
    nb = nbformat.read(path, as_version=4)
    for cell in code_cells(nb):
        cell.outputs, cell.execution_count = [], None
    with _environment(name):
        NotebookClient(nb, timeout=timeout, kernel_name="pathways", skip_cells_with_tag=NEEDS_CLUSTER).execute(
            env=_kernel_env(None)
        )
    scrub(nb)
    nbformat.validate(nb)
    nbformat.write(nb, path)
    return nb


#: What a saved notebook must not carry of the machine that ran it, and what stands in for it.
MACHINE_SPECIFIC = (
    (re.compile(r"/tmp/pathways-local-[A-Za-z0-9_]+/"), "/tmp/pathways-local-…/"),
    (re.compile(r"\bpid \d+"), "pid …"),
    (re.compile(r"(pathways-kernel/profiles/[0-9-]+)-p\d+/"), r"\1-p…/"),
    (re.compile(re.escape(str(Path.home())) + r"(?=/)"), "~"),
)


def scrub(nb: nbformat.NotebookNode) -> None:
    """Take the saving machine out of ``nb``: its socket paths, pids and home directory in every
    output, and nbclient's per-cell execution timestamps."""

    def clean(text: str) -> str:
        for pattern, stand_in in MACHINE_SPECIFIC:
            text = pattern.sub(stand_in, text)
        return text

    for cell in code_cells(nb):
        cell.metadata.pop("execution", None)
        for out in cell.get("outputs", []):
            if "text" in out:
                out["text"] = clean(out["text"])
            for mime, value in out.get("data", {}).items():
                if isinstance(value, str):
                    out["data"][mime] = clean(value)


@contextlib.contextmanager
def _environment(name: str) -> Iterator[None]:
    """What a notebook's cluster-free cells need: for slurm.ipynb's rehearsal, a real Slurm
    (tests/support/slurm.py) running a two-node ``--no-kill`` job named pw-rehearsal."""
    if name != "slurm.ipynb":
        yield
        return
    from slurm import Cluster

    cluster = Cluster().start()
    before = os.environ.get("SLURM_CONF")
    try:
        cluster.submit("#!/bin/bash\nsleep 300\n", "--nodes=2", "--no-kill", "--time=10", "--job-name=pw-rehearsal")
        os.environ["SLURM_CONF"] = str(cluster.conf)
        yield
    finally:
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
        cluster.stop()


def main(names: list[str]) -> None:
    if names[:1] == ["--scrub"]:  # saved outputs kept, only the machine taken out
        for path in sorted(NOTEBOOKS.glob("*.ipynb")):
            nb = nbformat.read(path, as_version=4)
            scrub(nb)
            nbformat.write(nb, path)
        return
    for name in names or sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")):
        print(f"== {name}", flush=True)
        save_with_outputs(name)


if __name__ == "__main__":
    main(sys.argv[1:])
