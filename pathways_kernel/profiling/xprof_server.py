"""The XProf UI for the profile root, on 127.0.0.1 only.

jupyter-server-proxy starts this on demand (``/xprof/`` under the Jupyter
server's base URL and auth) and stops it with the server. It is xprof's own
standalone server, except for two things ``xprof --port`` does: binding every
interface and starting a gRPC worker service (distributed conversion we do not
use, also on every interface). Behind the proxy, neither may be reachable
from outside.

    python -m pathways_kernel.profiling.xprof_server --port P [--logdir DIR]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pathways_kernel.profiling.capture import profile_root


def serve(logdir: str, port: int) -> None:
    """Serve XProf for ``logdir`` on 127.0.0.1:``port`` until interrupted."""
    from xprof import server

    context = server.TBContext(logdir, server.DataProvider(logdir), server.TBContext.Flags(False))
    # Captures are taken from the notebook; a capture button in XProf would
    # ask for a profiler server address that the kernel never opens.
    context.hide_capture_profile_button = True
    context.enable_tab_name_label = False
    context.src_prefix = None
    plugin = server.ProfilePluginLoader().load(context)
    server.run_server(plugin, "127.0.0.1", port)


def proxy_config() -> dict[str, Any]:
    """jupyter-server-proxy's server process entry (``jupyter_serverproxy_servers``)."""
    return {
        "command": [sys.executable, "-m", "pathways_kernel.profiling.xprof_server", "--port", "{port}"],
        # xprof reads every run dir on start; a big profile root takes a while.
        "timeout": 60,
        # The proxy strips /xprof; XProf's own page finds its base from the path.
        "absolute_url": False,
        "launcher_entry": {"enabled": False},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pathways-xprof", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--logdir", default=None, help="default: the profile root every session writes under")
    args = parser.parse_args(argv)
    logdir = args.logdir or str(profile_root())
    serve(logdir, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
