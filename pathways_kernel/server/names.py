"""Names both sides of the server's process boundary use, importable without the server's modules.

The kernel reads the files the server writes by these names (``profiling/jax_trace.py``)
without importing ``server/plugins.py`` (protobuf, the server's arrays: ~0.1-0.4 s of a
kernel's start).
"""

#: The server's trace file in a run directory (XProf shows it as host "pathways-local-server").
SERVER_TRACE = "pathways-local-server.xplane.pb"
