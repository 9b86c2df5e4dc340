"""The private JAX/jaxlib API the local Pathways server uses, in one place.

The server is its own process (the kernel's side of the boundary has ``core/jaxcompat.py``,
and the embedded backend's fault injection ``emulator/jaxprivate.py``). It holds arrays as
lists of single-device buffers and compiles the client's StableHLO for its own CPU devices:
JAX's public API has no spelling for either, so what it relies on is here, each with what it
needs. ``make test-compat`` runs the server against every jax/jaxlib release of the pinned
series; ``tests/core/test_private_api.py`` keeps every other module off these imports.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

# jax.Array's buffer-backed class (``jax.Array`` itself is abstract): the type of every shard.
from jax._src.array import ArrayImpl

# A sharding made directly from an OpSharding over a device list: what the client's HLO
# sharding is (``jax.sharding.NamedSharding`` needs a mesh the client never sends).
from jax._src.sharding_impls import GSPMDSharding

# jaxlib's C++ sharding types, as the IFRT protocol carries them (an ``xla.OpSharding``
# in bytes; a compiled executable's device list and options).
from jaxlib.xla_client import CompileOptions, DeviceList, OpSharding

__all__ = [
    "ArrayImpl",
    "CompileOptions",
    "DeviceList",
    "GSPMDSharding",
    "OpSharding",
    "assemble",
    "cpu_backend",
    "is_ready",
    "jaxlib_dir",
    "op_sharding",
    "replicated_op",
    "stablehlo_module",
]


def op_sharding(data: bytes) -> OpSharding:
    """An ``xla.OpSharding`` from its serialized bytes."""
    op = OpSharding()
    op.ParseFromString(data)
    return op


def replicated_op() -> OpSharding:
    op = OpSharding()
    op.type = OpSharding.Type.REPLICATED
    return op


def assemble(
    shape: tuple[int, ...], dtype: np.dtype[Any], sharding: jax.sharding.Sharding, shards: Sequence[ArrayImpl]
) -> ArrayImpl:
    """One JAX array of single-device ``shards`` (in ``sharding``'s device order), unchecked:
    the server made them for it (``jax.make_array_from_single_device_arrays`` checks each).
    Relies on ``ArrayImpl``'s constructor and its ``_skip_checks``."""
    aval = jax.core.ShapedArray(shape, dtype)
    return ArrayImpl(aval, sharding, list(shards), committed=True, _skip_checks=True)


def is_ready(shard: ArrayImpl) -> bool:
    """Whether ``shard``'s buffer has been computed (a method of jaxlib's C++ ``ArrayImpl``
    that jax's Python class, its type here, does not declare)."""
    ready: bool = shard.is_ready()  # type: ignore[attr-defined]
    return ready


def cpu_backend() -> Any:
    """The process's XLA:CPU client, which compiles for a given device list
    (``compile_and_load``); ``jax.jit`` compiles only for the devices its shardings name."""
    from jax._src import xla_bridge

    return xla_bridge.get_backend("cpu")


def stablehlo_module(data: bytes) -> tuple[str, list[tuple[tuple[int, ...], str]]]:
    """A StableHLO portable artifact's module text (with its locations: XLA takes each op's
    op_name metadata from them) and, for its ``main``, each result's shape and element type
    (e.g. ``f32``); raises ``LookupError`` if it has no ``main``. Relies on JAX's MLIR context
    (its dialects registered) and jaxlib's MLIR bindings."""
    from jax._src.interpreters import mlir as jax_mlir
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    with jax_mlir.make_ir_context() as context:
        module = stablehlo.deserialize_portable_artifact(context, data)
        text = str(module.operation.get_asm(enable_debug_info=True))
        for op in module.body.operations:
            if ir.StringAttr(op.attributes["sym_name"]).value == "main":
                function_type = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
                results = [ir.RankedTensorType(t) for t in function_type.results]
                return text, [(tuple(t.shape), str(t.element_type)) for t in results]
    raise LookupError("the program has no main function")


def jaxlib_dir() -> str:
    """Where jaxlib is installed: its ``libjax_common.so`` embeds the IFRT proxy's protos."""
    import os

    import jaxlib

    return os.path.dirname(jaxlib.__file__)
