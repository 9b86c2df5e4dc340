"""The local Pathways server: a process that owns S x C CPU devices, speaks the IFRT
proxy protocol to JAX's own proxy client (``JAX_PLATFORMS=proxy``), and loses slices
where Pathways loses them, on the server.

Start it with ``pathways-local serve --slices 2x4`` or, from Python, with
:func:`pathways_kernel.backends.server_client.start`, which also fails and repairs its slices
(``fail``, ``repair``). This package is the server's process and imports only itself and
``core/``; the kernel's side never imports it (both share ``core/server_protocol.py``).
"""
