"""The XProf UI for the profile root, reachable by the Jupyter server only.

jupyter-server-proxy starts this on demand (``/xprof/`` under the Jupyter
server's base URL and auth) and stops it with the server. It listens on a Unix
socket in a directory only this user can enter (the proxy makes a fresh 0700
directory per start): on 127.0.0.1 any local user could read every run from its
port, past the Jupyter token. Otherwise it is xprof's own standalone server,
without two things ``xprof --port`` does: binding every interface and starting
a gRPC worker service (distributed conversion we do not use, also on every
interface).

    python -m pathways_kernel.profiling.xprof_server --socket PATH [--logdir DIR]
    python -m pathways_kernel.profiling.xprof_server --port P [--logdir DIR]   (127.0.0.1, by hand)
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pathways_kernel.profiling.capture import profile_root

#: The page the lab's XProf tab opens (``/xprof/pathways-xprof?run=R&tag=T``): it frames
#: XProf's UI, so the address XProf rewrites is its own, not the lab's (xprof_host.html).
HOST_PATH = "/pathways-xprof"
_HOST_PAGE = Path(__file__).with_name("xprof_host.html")

Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def with_host_page(app: Wsgi) -> Wsgi:
    """``app`` (XProf's WSGI app), also answering ``HOST_PATH`` with the page that frames it."""
    page = _HOST_PAGE.read_bytes()

    def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != HOST_PATH:
            return app(environ, start_response)
        start_response(
            "200 OK",
            [
                ("Content-Type", "text/html; charset=utf-8"),
                ("Content-Length", str(len(page))),
                ("Cache-Control", "no-cache"),
            ],
        )
        return [page]

    return application


def serve(logdir: str, address: str | tuple[str, int]) -> None:
    """Serve XProf for ``logdir`` on ``address`` (a Unix socket's path, or ``(host, port)``) until interrupted."""
    from cheroot import wsgi
    from xprof import server

    context = server.TBContext(logdir, server.DataProvider(logdir), server.TBContext.Flags(False))
    # Captures are taken from the notebook; a capture button in XProf would
    # ask for a profiler server address that the kernel never opens.
    context.hide_capture_profile_button = True
    context.enable_tab_name_label = False
    context.src_prefix = None
    plugin = server.ProfilePluginLoader().load(context)
    # xprof's run_server, on an address of ours: cheroot takes a path for a Unix socket.
    listener = wsgi.Server(address, with_host_page(server.make_wsgi_app(plugin)))
    try:
        listener.start()
    except KeyboardInterrupt:
        listener.stop()


def private_socket(path: str) -> str:
    """``path``, once its directory is one only this user can enter; raises ``SystemExit`` otherwise.

    The socket itself is created open to all (cheroot's default): the directory is the lock.
    """
    directory = os.path.dirname(os.path.abspath(path))
    try:
        info = os.stat(directory)
    except OSError as exc:
        raise SystemExit(f"pathways-xprof: cannot use {directory} for the socket: {exc.strerror or exc}") from None
    if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise SystemExit(
            f"pathways-xprof: {directory} must be a directory only you can enter (chmod 700): "
            "whoever reaches the socket reads every profile"
        )
    return path


def proxy_config() -> dict[str, Any]:
    """jupyter-server-proxy's server process entry (``jupyter_serverproxy_servers``)."""
    return {
        "command": [sys.executable, "-m", "pathways_kernel.profiling.xprof_server", "--socket", "{unix_socket}"],
        # A socket in a fresh 0700 directory (mkdtemp) for each start: only this user, whose
        # Jupyter server checks the token, can connect; a port on 127.0.0.1 was open to every user.
        "unix_socket": True,
        # xprof reads every run dir on start; a big profile root takes a while.
        "timeout": 60,
        # The proxy strips /xprof; XProf's own page finds its base from the path.
        "absolute_url": False,
        "launcher_entry": {"enabled": False},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pathways-xprof", description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--socket", help="a Unix socket whose directory only you can enter (what the proxy gives)")
    where.add_argument("--port", type=int, help="127.0.0.1:PORT: any user of this machine can read the profiles there")
    parser.add_argument("--logdir", default=None, help="default: the profile root every session writes under")
    args = parser.parse_args(argv)
    logdir = args.logdir or str(profile_root())
    serve(logdir, private_socket(args.socket) if args.socket else ("127.0.0.1", args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
