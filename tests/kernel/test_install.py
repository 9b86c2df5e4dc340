"""What `pip install` alone gives a user: the extension enabled and the kernelspec listed."""

import re
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


def jupyter(*args: str) -> str:
    result = subprocess.run([str(BIN / "jupyter"), *args], capture_output=True, text=True, check=True)
    return re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)


def test_labextension_is_installed_enabled_and_ok():
    listing = jupyter("labextension", "list")
    assert re.search(r"pathways-kernel v\d+\.\d+\.\d+ enabled OK \(python, pathways-kernel\)", listing), listing


def test_pathways_kernelspec_ships_with_the_package():
    listing = jupyter("kernelspec", "list")
    assert re.search(r"^\s+pathways\s", listing, re.M), listing
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("pathways")
    assert spec.display_name == "Pathways (JAX)"
    assert spec.argv[1:3] == ["-m", "pathways_kernel"]
    # `python` is swapped for the interpreter that owns the kernelspec at launch
    assert spec.argv[0] == "python"
