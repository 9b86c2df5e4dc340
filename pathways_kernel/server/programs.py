"""Programs the client compiles on the server, and their execution.

The client sends a StableHLO portable artifact (``xla::ifrt::XlaProgram``) and its
XLA compile options; the server compiles it for its own CPU devices with the
device assignment the client chose, and executes it on arrays it holds.
"""

from __future__ import annotations

import collections
import hashlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import jax
import ml_dtypes
import numpy as np

from pathways_kernel.server import protos
from pathways_kernel.server.arrays import ServerArray, Sharding, replicated
from pathways_kernel.server.colocated import compile_colocated
from pathways_kernel.server.devices import Topology
from pathways_kernel.server.errors import INVALID_ARGUMENT, UNIMPLEMENTED, ServerError, from_exception
from pathways_kernel.server.jaxcompat import (
    CompileOptions,
    DeviceList,
    GSPMDSharding,
    assemble,
    cpu_backend,
    stablehlo_module,
)
from pathways_kernel.server.plugins import compile_plugin
from pathways_kernel.server.protos import Proto

_compile_lock = threading.Lock()
_COMPILED_KEPT = 64  # executables the server keeps for programs compiled again


class Executable(Protocol):
    """What the server uses of jaxlib's ``LoadedExecutable`` (a C++ class without stubs)."""

    def execute_sharded(self, arguments: Sequence[jax.Array], /, with_tokens: bool = ...) -> Any: ...
    def get_parameter_layouts(self) -> Sequence[Any]: ...
    def get_parameter_shardings(self) -> Sequence[Any] | None: ...
    def get_output_shardings(self) -> Sequence[Any] | None: ...
    def get_output_memory_kinds(self) -> Sequence[Sequence[str]]: ...
    def get_compiled_memory_stats(self) -> Any: ...
    def size_of_generated_code_in_bytes(self) -> int: ...
    def cost_analysis(self) -> dict[str, float] | None: ...


class LoadedProgram(Protocol):
    """What a session needs of a compiled program, whatever compiled it: XLA (``Program``),
    a plugin program (``plugins.py``, ``persistence.py``) or colocated Python (``colocated.py``)."""

    @property
    def name(self) -> str: ...
    @property
    def executable(self) -> Executable | None: ...
    @property
    def device_ids(self) -> tuple[int, ...]: ...
    @property
    def num_replicas(self) -> int: ...
    @property
    def output_shapes(self) -> list[tuple[int, ...]]: ...
    @property
    def output_dtypes(self) -> list[np.dtype[Any]]: ...
    @property
    def output_shardings(self) -> list[Sharding]: ...
    @property
    def runs_in_background(self) -> bool: ...

    def run(self, args: list[ServerArray]) -> list[ServerArray]:
        """Executes on ``args``; returns the outputs (their buffers may still be computing)."""
        ...


@dataclass
class Program:
    """A loaded executable and what the client needs to know about it."""

    executable: Executable
    device_ids: tuple[int, ...]
    num_replicas: int
    output_shapes: list[tuple[int, ...]]
    output_dtypes: list[np.dtype[Any]]
    parameter_shardings: list[jax.sharding.Sharding] = field(default_factory=list)
    output_shardings: list[Sharding] = field(default_factory=list)
    name: str = ""
    runs_in_background: bool = False

    def run(self, args: list[ServerArray]) -> list[ServerArray]:
        """Executes on ``args``; returns the outputs (their buffers may still be computing)."""
        return self.launch(args)[0]

    def launch(self, args: list[ServerArray]) -> tuple[list[ServerArray], Any]:
        """``run``, and the token that says when the execution has finished (jaxlib's
        ``ShardedToken``: outputs donated to the next step can no longer say it)."""
        if len(args) != len(self.parameter_shardings):
            raise ServerError.invalid(f"{self.name} takes {len(self.parameter_shardings)} arguments, got {len(args)}")
        inputs = [
            _as_input(arg, sharding, self.device_ids)
            for arg, sharding in zip(args, self.parameter_shardings, strict=True)
        ]
        results = self.executable.execute_sharded(inputs, with_tokens=True)
        token = results.consume_token()
        per_output = results.disassemble_into_single_device_arrays()
        for arg in args:
            if any(shard.is_deleted() for shard in arg.shards):
                arg.delete()  # donated
        outputs = [
            ServerArray(np.dtype(shards[0].dtype), shape, sharding, list(shards))
            for shards, shape, sharding in zip(per_output, self.output_shapes, self.output_shardings, strict=True)
        ]
        return outputs, token


def _as_input(arg: ServerArray, sharding: jax.sharding.Sharding, device_ids: tuple[int, ...]) -> jax.Array:
    shards = arg.live_shards()
    if len(device_ids) == 1 and arg.sharding.op is None:
        return shards[0]
    by_device = dict(zip(arg.sharding.device_ids, shards, strict=True))
    missing = [d for d in device_ids if d not in by_device]
    if missing:
        raise ServerError.invalid(f"an argument has no shard on device {missing[0]} of the executable")
    return assemble(arg.shape, arg.dtype, sharding, [by_device[d] for d in device_ids])


_ELEMENT_TYPES = {
    "i1": np.bool_,
    "i8": np.int8,
    "i16": np.int16,
    "i32": np.int32,
    "i64": np.int64,
    "ui8": np.uint8,
    "ui16": np.uint16,
    "ui32": np.uint32,
    "ui64": np.uint64,
    "f16": np.float16,
    "f32": np.float32,
    "f64": np.float64,
    "bf16": ml_dtypes.bfloat16,
    "complex<f32>": np.complex64,
    "complex<f64>": np.complex128,
}


def _module_and_outputs(data: bytes) -> tuple[str, list[tuple[int, ...]], list[np.dtype[Any]]]:
    """The module text of a portable artifact and the shapes and dtypes its ``main`` returns."""
    # With its locations: XLA takes each op's op_name metadata (the JAX source name the
    # profile summary shows, jit(f)/dot_general) from them.
    try:
        text, results = stablehlo_module(data)
    except LookupError as error:
        raise ServerError.invalid(str(error)) from error
    shapes = [shape for shape, _ in results]
    dtypes = [np.dtype(_ELEMENT_TYPES.get(element, np.float32)) for _, element in results]
    return text, shapes, dtypes


def device_assignment(options_proto: Proto) -> tuple[list[int], int, int]:
    """Device ids in the order XLA numbers them (replica-major), replicas, partitions."""
    assignment = options_proto.executable_build_options.device_assignment
    replicas, partitions = assignment.replica_count, assignment.computation_count
    ids = [assignment.computation_devices[p].replica_device_ids[r] for r in range(replicas) for p in range(partitions)]
    return ids, replicas, partitions


def compile_program(request: Proto, topology: Topology) -> LoadedProgram:
    """Compiles a CompileRequest for the server's devices; raises ServerError with the
    compiler's message if XLA rejects it."""
    if request.program.type_name == "xla::ifrt::PluginProgram":
        return compile_plugin(request.program.data, topology)
    if request.program.type_name == "xla::ifrt::CustomCallProgram":
        return compile_colocated(request.program.data)
    if request.program.type_name != "xla::ifrt::XlaProgram":
        raise ServerError(
            UNIMPLEMENTED, f"program type {request.program.type_name} is not served by the local Pathways server"
        )
    if request.host_callbacks:
        raise ServerError(
            UNIMPLEMENTED,
            "host callbacks (jax.debug.print, pure_callback, io_callback) are not served by the local Pathways server",
        )
    options_proto = protos.xla("CompileOptionsProto")()
    if request.compile_options.type_name == "xla::ifrt::XlaCompileOptions":
        options_proto = protos.ifrt("XlaCompileOptionsProto").FromString(request.compile_options.data).compile_options
    ids, replicas, _ = device_assignment(options_proto)
    for device in ids:
        topology.check_device(device)
    topology.check_one_kind(ids)
    try:
        text, shapes, dtypes = _module_and_outputs(request.program.data)
    except ServerError:
        raise
    except Exception as error:  # the client's bytes, its problem
        raise ServerError(INVALID_ARGUMENT, f"cannot read the program: {error}") from error
    options = CompileOptions.ParseFromString(options_proto.SerializeToString())
    devices = jax.devices()
    backend = cpu_backend()
    try:
        with _compile_lock:
            executable = backend.compile_and_load(text, DeviceList(tuple(devices[i] for i in ids)), options)
    except Exception as error:  # XLA's message is what the user needs, its code passed through
        raise from_exception(error, "the CPU compiler rejected the program", INVALID_ARGUMENT) from error
    program = Program(executable, tuple(ids), replicas, shapes, dtypes)
    program.name = _name(text)
    parameters = len(executable.get_parameter_layouts())  # one layout per parameter
    program.parameter_shardings = _parameter_shardings(executable, ids, replicas, parameters)
    program.output_shardings = _output_shardings(executable, ids, replicas, len(shapes))
    return program


def _name(text: str) -> str:
    # Location aliases (#loc1 = loc(...)) may come before the module line.
    head = next((line for line in text.split("\n") if line.startswith("module")), "")
    return head.split("@", 1)[1].split(" ", 1)[0] if "@" in head else "main"


def _parameter_shardings(
    executable: Executable, ids: list[int], replicas: int, count: int
) -> list[jax.sharding.Sharding]:
    devices = tuple(jax.devices()[i] for i in ids)
    if len(ids) == 1:
        single: jax.sharding.Sharding = jax.sharding.SingleDeviceSharding(devices[0])
        return [single] * count
    ops = executable.get_parameter_shardings() if replicas == 1 else None
    return [GSPMDSharding(devices, ops[i] if ops else replicated(ids).op) for i in range(count)]


def _output_shardings(executable: Executable, ids: list[int], replicas: int, count: int) -> list[Sharding]:
    if len(ids) == 1:
        return [Sharding(tuple(ids), None)] * count
    ops = executable.get_output_shardings() if replicas == 1 else None
    return [Sharding(tuple(ids), ops[i]) if ops else replicated(ids) for i in range(count)]


class CompiledPrograms:
    """``compile_program``, once per program and options (``_COMPILED_KEPT`` kept): as on
    Pathways, which has its own compilation cache, a client that compiles a program again
    (its caches cleared, a mesh it ran on before) gets what the server compiled then."""

    def __init__(self, topology: Topology, count: Callable[[str], None]):
        self._topology = topology
        self._count = count  # counts the hits, for the server's status
        self._lock = threading.Lock()
        self._compiled: collections.OrderedDict[bytes, LoadedProgram] = collections.OrderedDict()

    def compile(self, request: Proto) -> LoadedProgram:
        """The program of a CompileRequest, compiled now or before."""
        if request.program.type_name != "xla::ifrt::XlaProgram":  # plugin programs have state
            return compile_program(request, self._topology)
        options = request.compile_options.data
        if request.compile_options.type_name == "xla::ifrt::XlaCompileOptions":
            # The client's bytes order its maps differently from one compile to the next.
            options = protos.ifrt("XlaCompileOptionsProto").FromString(options).SerializeToString(deterministic=True)
        parts = (request.program.data, request.compile_options.type_name.encode(), options)
        key = hashlib.sha256(b"\0".join(parts)).digest()
        with self._lock:
            program = self._compiled.get(key)
            if program is not None:
                self._compiled.move_to_end(key)
        if program is not None:
            self._count("compile_cache_hits")
            return program
        program = compile_program(request, self._topology)
        with self._lock:
            self._compiled[key] = program
            while len(self._compiled) > _COMPILED_KEPT:
                self._compiled.popitem(last=False)
        return program
