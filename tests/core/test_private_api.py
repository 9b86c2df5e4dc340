"""JAX's private API (``jax._src``, jaxlib's modules) is used in one module on each side of the
local server's process boundary, as pyproject.toml and the compat modules' docstrings say: a
new jax/jaxlib release then breaks one place, which ``make test-compat`` runs against."""

from __future__ import annotations

import ast
from pathlib import Path

import pathways_kernel

PACKAGE = Path(pathways_kernel.__file__).parent

#: The modules allowed to import private JAX, and why.
COMPAT = {
    "core/jaxcompat.py": "the kernel's side",
    "emulator/jaxprivate.py": "the embedded backend's fault injection (in the kernel's process, on its own devices)",
    "server/jaxcompat.py": "the local Pathways server's side",
}


def private_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        found += [
            f"{name} (line {node.lineno})"
            for name in names
            if name.startswith(("jax._src", "jaxlib")) and name not in ("jaxlib", "jaxlib.version")
        ]
    return found


def test_private_jax_is_imported_only_by_the_compat_module_of_each_side():
    users = {
        str(path.relative_to(PACKAGE)): imports
        for path in sorted(PACKAGE.rglob("*.py"))
        if (imports := private_imports(path))
    }
    assert set(users) == set(COMPAT), {name: users[name] for name in set(users) - set(COMPAT)}


def test_the_check_sees_an_import_inside_a_function(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from jax._src import xla_bridge\n    import jaxlib.mlir.ir\n")
    assert private_imports(module) == [
        "jax._src (line 2)",
        "jax._src.xla_bridge (line 2)",
        "jaxlib.mlir.ir (line 3)",
    ]
