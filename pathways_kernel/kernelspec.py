"""Installing more Pathways kernelspecs (``python -m pathways_kernel install``).

The default ``pathways`` kernelspec ships in the wheel; this adds others, e.g.
one on ``local:4x2`` or one pointed at a Pathways proxy.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from pathways_kernel import backends
from pathways_kernel.backends import BACKEND_ENV
from pathways_kernel.core.errors import PathwaysError, one_line
from pathways_kernel.state.compile_cache import ENV as CACHE_ENV


def kernel_json(display_name: str, backend: str | None, compile_cache: str | None = None) -> dict[str, object]:
    spec: dict[str, object] = {
        "argv": [sys.executable, "-m", "pathways_kernel", "-f", "{connection_file}"],
        "display_name": display_name,
        "language": "python",
        "metadata": {"debugger": True},
        "kernel_protocol_version": "5.5",
    }
    env: dict[str, str] = {}
    if backend:
        env[BACKEND_ENV] = backend
    if compile_cache:
        env[CACHE_ENV] = compile_cache
    if env:
        spec["env"] = env
    return spec


def install(
    name: str = "pathways",
    display_name: str | None = None,
    backend: str | None = None,
    compile_cache: str | None = None,
    user: bool = False,
    prefix: str | None = None,
) -> str:
    """Install a kernelspec; returns the directory it was written to.

    Raises:
      SpecError: ``backend`` is not a valid spec.
    """
    from jupyter_client.kernelspec import KernelSpecManager

    if backend:
        backends.from_spec(backend)  # validate before writing anything
    if compile_cache and compile_cache.strip().lower() != "off":
        from pathways_kernel.core.locations import parse_url

        parse_url(compile_cache)
    if display_name is None:
        display_name = "Pathways (JAX)" if not backend else f"Pathways (JAX, {backend})"
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "kernel.json").write_text(json.dumps(kernel_json(display_name, backend, compile_cache), indent=1))
        return KernelSpecManager().install_kernel_spec(tmp, name, user=user, prefix=prefix)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pathways_kernel install", description="Install a Pathways kernelspec."
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for the current user")
    where.add_argument("--sys-prefix", action="store_true", help="install into sys.prefix (e.g. the venv)")
    where.add_argument("--prefix", help="install under this prefix")
    parser.add_argument("--name", default="pathways", help="kernelspec name (default: pathways)")
    parser.add_argument("--display-name", help='name shown in the launcher (default: "Pathways (JAX)")')
    parser.add_argument("--backend", help="backend spec, e.g. local:4x2 or proxy:grpc://localhost:29000")
    parser.add_argument("--compile-cache", help="persistent compilation cache: gs://BUCKET/PREFIX or a directory")
    args = parser.parse_args(argv)
    prefix = sys.prefix if args.sys_prefix else args.prefix
    try:
        path = install(args.name, args.display_name, args.backend, args.compile_cache, user=args.user, prefix=prefix)
    except PathwaysError as exc:
        print(one_line(exc), file=sys.stderr)
        return 2
    print(f"Installed kernelspec {args.name} in {path}")
    return 0
