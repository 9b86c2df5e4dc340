"""The local Pathways server: a process that owns S x C CPU devices, speaks the IFRT
proxy protocol to JAX's own proxy client (``JAX_PLATFORMS=proxy``), and loses slices
where Pathways loses them, on the server.

Start it with ``pathways-local serve --slices 2x4`` or, from Python, with
:func:`pathways_kernel.server.launch.start`; fail and repair slices with
:mod:`pathways_kernel.server.control`.
"""
