"""Colocated Python in the server: ``jax.experimental.colocated_python`` functions run in
the server's own process, next to its devices, as Pathways runs them in the sidecar
next to each TPU host.

The client compiles an ``xla::ifrt::CustomCallProgram`` of type ``colocated_python``
whose program text is the function, its input and output specs and its devices,
pickled by colocated_python's own serializer (cloudpickle; meshes, shardings and
device lists travel as device ids and are rebuilt here on the server's devices).
Executing it calls the function on the server's arrays named by the client (inputs
by handle) and registers what it returns as the outputs, on the devices of the
output specs. Whoever can reach the server can thereby run any Python as its user;
that was already true of compiled programs, which is why the server listens on a
0700 Unix socket or 127.0.0.1 only.

A function may run for long (a data loader, a sidecar that hangs): it runs on a
thread of its own, its outputs are pending until it returns, and the session goes
on serving other requests meanwhile (see ``Session._process``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pathways_kernel.server import protos
from pathways_kernel.server.arrays import ServerArray, Sharding, dtype_from_proto, sharding_from_proto
from pathways_kernel.server.errors import INVALID_ARGUMENT, UNIMPLEMENTED, ServerError, from_exception

if TYPE_CHECKING:
    import jax

# What jax.experimental.colocated_python names its programs (its version in the name).
COLOCATED_PYTHON = "jax_colocated_python_"


@dataclass(eq=False)
class ColocatedProgram:
    """A colocated Python function, compiled for (bound to) the server's devices."""

    name: str
    function: Callable[..., Any]
    in_treedef: jax.tree_util.PyTreeDef
    in_specs: tuple[jax.ShapeDtypeStruct, ...]  # leaves, with shardings on the server's devices
    out_treedef: jax.tree_util.PyTreeDef
    out_specs: tuple[jax.ShapeDtypeStruct, ...]
    device_ids: tuple[int, ...]
    output_shapes: list[tuple[int, ...]] = field(default_factory=list)
    output_dtypes: list[np.dtype[Any]] = field(default_factory=list)
    output_shardings: list[Sharding] = field(default_factory=list)
    executable: None = None  # no XLA executable
    num_replicas: int = 1
    runs_in_background: bool = True

    @property
    def parameter_shardings(self) -> list[jax.sharding.Sharding | None]:
        return [spec.sharding for spec in self.in_specs]

    def run(self, args: list[ServerArray]) -> list[ServerArray]:
        """Calls the function on ``args`` (blocking: run it off the session's loop)."""
        import jax

        if len(args) != len(self.in_specs):
            raise ServerError.invalid(f"{self.name} takes {len(self.in_specs)} arguments, got {len(args)}")
        inputs = [arg.jax_array(spec.sharding) for arg, spec in zip(args, self.in_specs, strict=True)]
        call_args, call_kwargs = jax.tree_util.tree_unflatten(self.in_treedef, inputs)
        try:
            result = self.function(*call_args, **call_kwargs)
        except ServerError:
            raise
        except Exception as error:  # the function's own error is the user's answer
            # Its status code passes through, as the reference passes an execution's: the code
            # its text starts with (an XLA error, tensorstore's), else INTERNAL, as jaxlib makes
            # a host callback's Python error ("INTERNAL: CpuCallback error"); ours stay ours.
            raise from_exception(error, type(error).__name__) from error
        leaves, treedef = jax.tree_util.tree_flatten(result)
        if treedef != self.out_treedef or len(leaves) != len(self.out_specs):
            raise ServerError.invalid(
                f"{self.name} returned {treedef}, not the {self.out_treedef} its output specs say"
            )
        outputs = []
        for i, (leaf, spec, sharding) in enumerate(zip(leaves, self.out_specs, self.output_shardings, strict=True)):
            if not isinstance(leaf, jax.Array):
                raise ServerError.invalid(f"{self.name} returned a {type(leaf).__name__}, not a jax.Array")
            if tuple(leaf.shape) != tuple(spec.shape) or leaf.dtype != spec.dtype:
                raise ServerError.invalid(
                    f"{self.name} returned {leaf.dtype}{list(leaf.shape)} as output {i}, not the "
                    f"{spec.dtype}{list(spec.shape)} of its first call: colocated_python fixes a function's "
                    "output shapes by its first call on inputs of the same shapes"
                )
            if set(leaf.sharding.device_set) != set(spec.sharding.device_set):
                leaf = jax.device_put(leaf, spec.sharding)
            outputs.append(ServerArray.from_jax(leaf, sharding))
        return outputs


def compile_colocated(data: bytes) -> ColocatedProgram:
    """The program of a ``CustomCallProgram``'s serialized data; raises ServerError if it
    is not colocated Python or cannot be unpickled here."""
    from jax.experimental.colocated_python.serialization import _deserialize

    proto = protos.ifrt("CustomCallProgramProto").FromString(data)
    if not proto.type.startswith(COLOCATED_PYTHON):
        raise ServerError(
            UNIMPLEMENTED, f"custom call program {proto.type or '(no type)'} is not served by the local Pathways server"
        )
    try:
        function, in_treedef, in_specs, out_treedef, out_specs, _devices = _deserialize(proto.serialized_program_text)
    except Exception as error:  # e.g. a module the server's environment lacks
        raise ServerError(
            INVALID_ARGUMENT,
            f"colocated Python {proto.name}: cannot unpickle the function in the server: "
            f"{type(error).__name__}: {error}",
        ) from error
    program = ColocatedProgram(
        proto.name,
        function,
        in_treedef,
        tuple(in_specs),
        out_treedef,
        tuple(out_specs),
        tuple(proto.devices.device_ids),
    )
    for spec in proto.output_specs:
        program.output_shapes.append(tuple(spec.shape.dims))
        program.output_dtypes.append(dtype_from_proto(spec.dtype))
        program.output_shardings.append(sharding_from_proto(spec.sharding))
    return program


def string_host_buffer(array: ServerArray) -> bytes:
    """A string array's host buffer as the proxy client reads it (``StringArrayContents``,
    row-major); colocated Python's output specs come back this way. Its first shard is
    the whole array: string arrays here are single-device or replicated."""
    contents = protos.message("xla.ifrt.proto.StringArrayContents")()
    contents.strings.extend(str(s).encode() for s in np.asarray(array.live_shards()[0]).reshape(-1))
    return contents.SerializeToString()
