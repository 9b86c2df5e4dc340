"""Requests about arrays: making them from host buffers (or as errors), copying them to
host buffers, splitting and joining their shards, copying, resharding and remapping them
between devices, and deleting them."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from pathways_kernel.server.arrays import ServerArray, Sharding, dtype_from_proto, sharding_from_proto
from pathways_kernel.server.colocated import string_host_buffer
from pathways_kernel.server.errors import INTERNAL, ServerError
from pathways_kernel.server.host_buffers import HostBuffer, from_host_bytes, to_host_bytes
from pathways_kernel.server.jaxcompat import ArrayImpl, is_ready
from pathways_kernel.server.protos import Proto
from pathways_kernel.server.session import Deferred, Session, done, failed, wait_ready

_DONATE = 3  # xla.ifrt.proto.ArrayCopySemantics.ARRAY_COPY_SEMANTICS_DONATE_INPUT


def _byte_strides(proto: Proto) -> list[int] | None:
    return list(proto.byte_strides.strides) if proto.HasField("byte_strides") else None


def _device_put(value: Any, sharding: Sharding) -> jax.Array:
    array: jax.Array = jax.device_put(value, sharding.jax_sharding())
    return array


def _check_devices(session: Session, device_ids: tuple[int, ...]) -> None:
    for device in device_ids:
        session.topology.check_device(device)
    session.topology.check_up(device_ids)


def _donated(request: Proto, sources: list[ServerArray]) -> None:
    """Inputs the client donated to a copy are deleted, as the client now sees them (their
    memory is freed now, not when the client gets round to destructing them)."""
    if request.copy_semantics == _DONATE:
        for source in sources:
            source.delete()


# ---- from and to the client's host buffers ----------------------------------------


def make_array_from_host_buffer_request(session: Session, request: Proto, response: Proto) -> None:
    handle = request.array_handle if request.HasField("array_handle") else session.arrays.new_handle()
    sharding = sharding_from_proto(request.sharding)
    _check_devices(session, sharding.device_ids)
    dtype = dtype_from_proto(request.dtype)
    data = session.host_buffers.take(request.host_buffer_handle)
    value = from_host_bytes(data, dtype, request.shape.dims, _byte_strides(request))
    session.arrays.put(handle, ServerArray.from_jax(_device_put(value, sharding), sharding))
    response.make_array_from_host_buffer_response.array_handle = handle


def make_arrays_from_host_buffer_shards_request(session: Session, request: Proto, response: Proto) -> None:
    handles = session.arrays.handles_for(request.array_handles, len(request.specs))
    arrays = [_array_from_shards(session, spec) for spec in request.specs]
    for handle, array in zip(handles, arrays, strict=True):
        session.arrays.put(handle, array)
    response.make_arrays_from_host_buffer_shards_response.array_handles.extend(handles)


def _array_from_shards(session: Session, spec: Proto) -> ServerArray:
    sharding = sharding_from_proto(spec.array_spec.sharding)
    session.topology.check_up(sharding.device_ids)
    dtype = dtype_from_proto(spec.array_spec.dtype)
    devices = jax.devices()
    shards: dict[int, ArrayImpl] = {}
    for indices, buffer in zip(spec.addressable_shard_indices, spec.host_buffers, strict=True):
        data = session.host_buffers.take(buffer.host_buffer_handle)
        value = from_host_bytes(data, dtype, buffer.shape.dims, _byte_strides(buffer))
        for index in indices.indices:
            shards[index] = jax.device_put(value, devices[sharding.device_ids[index]])
    return ServerArray(dtype, tuple(spec.array_spec.shape.dims), sharding, [shards[i] for i in range(len(shards))])


def make_error_arrays_request(session: Session, request: Proto, response: Proto) -> None:
    handles = session.arrays.handles_for(request.array_handles, len(request.array_specs))
    session.arrays.poison(handles, ServerError(request.error.code or INTERNAL, request.error.message))
    response.make_error_arrays_response.array_handles.extend(handles)


def copy_to_host_buffer_request(session: Session, request: Proto, response: Proto) -> Deferred:
    buffers = session.host_buffers
    try:
        array = session.arrays.get(request.array_handle)
        array.check_live()
    except ServerError as error:
        # The client may look the buffer up without waiting for this answer.
        buffers.store(request.host_buffer_handle, error)
        raise
    strides = _byte_strides(request)
    response.copy_to_host_buffer_response.SetInParent()

    def copy() -> None:
        value: HostBuffer | bytes | ServerError
        try:
            if array.dtype.kind == "T":
                value = string_host_buffer(array)
            else:
                value = to_host_bytes(np.asarray(array.jax_array()), strides)
        except ServerError as error:
            value = error
        buffers.store(request.host_buffer_handle, value)
        if isinstance(value, ServerError):
            raise value

    return copy


# ---- readiness, shards ---------------------------------------------------------


def check_value_ready_request(session: Session, request: Proto, response: Proto) -> Deferred | None:
    arrays = [session.arrays.get(h) for h in request.value_handles]
    response.check_value_ready_response.SetInParent()
    if all(is_ready(shard) for array in arrays for shard in array.shards):
        return None
    return lambda: wait_ready(arrays)


def disassemble_into_single_device_arrays_request(session: Session, request: Proto, response: Proto) -> None:
    array = session.arrays.get(request.array_handle)
    shards = array.live_shards()
    handles = session.arrays.handles_for(request.result_handles, len(shards))
    for handle, device, shard in zip(handles, array.sharding.device_ids, shards, strict=True):
        single = array.sharding.with_devices([device])
        session.arrays.put(
            handle,
            ServerArray(array.dtype, tuple(shard.shape), type(single)((device,), None, single.memory_kind), [shard]),
        )
    response.disassemble_into_single_device_arrays_response.array_handles.extend(handles)


def assemble_array_from_single_device_arrays_request(session: Session, request: Proto, response: Proto) -> None:
    handle = request.result_handle or session.arrays.new_handle()
    sharding = sharding_from_proto(request.sharding)
    pieces = [session.arrays.get(h) for h in request.single_device_array_handles]
    by_device = {}
    for piece in pieces:
        by_device[piece.sharding.device_ids[0]] = piece.live_shards()[0]
    missing = [d for d in sharding.device_ids if d not in by_device]
    if missing:
        raise ServerError.invalid(f"no single-device array on device {missing[0]} of the sharding")
    dtype = dtype_from_proto(request.dtype) if request.HasField("dtype") else pieces[0].dtype
    array = ServerArray(dtype, tuple(request.shape.dims), sharding, [by_device[d] for d in sharding.device_ids])
    session.arrays.put(handle, array)
    response.assemble_array_from_single_device_arrays_response.array_handle = handle


def fully_replicated_shard_request(session: Session, request: Proto, response: Proto) -> None:
    array = session.arrays.get(request.array_handle)
    shard = array.live_shards()[0]
    handle = request.result_handle or session.arrays.new_handle()
    device = array.sharding.device_ids[0]
    session.arrays.put(
        handle, ServerArray(array.dtype, tuple(shard.shape), type(array.sharding)((device,), None), [shard])
    )
    response.fully_replicated_shard_response.array_handle = handle


# ---- between devices -----------------------------------------------------------


def copy_arrays_request(session: Session, request: Proto, response: Proto) -> None:
    handles = session.arrays.handles_for(request.result_handles, len(request.array_handles))
    targets = list(request.device_ids)
    for device in targets:
        session.topology.check_device(device)
    session.topology.check_up(targets)
    devices = jax.devices()
    copies = []
    sources = [session.arrays.get(h) for h in request.array_handles]
    for source in sources:
        destination = source.sharding.with_devices(targets) if targets else source.sharding
        shards = [
            jax.device_put(s, devices[d]) for s, d in zip(source.live_shards(), destination.device_ids, strict=True)
        ]
        copies.append(ServerArray(source.dtype, source.shape, destination, shards))
    for handle, copy in zip(handles, copies, strict=True):
        session.arrays.put(handle, copy)
    _donated(request, sources)
    response.copy_arrays_response.array_handles.extend(handles)


def reshard_arrays_request(session: Session, request: Proto, response: Proto) -> None:
    handles = session.arrays.handles_for(request.result_handles, len(request.array_handles))
    results = []
    sources = [session.arrays.get(h) for h in request.array_handles]
    for source, spec in zip(sources, request.array_specs, strict=True):
        sharding = sharding_from_proto(spec.sharding)
        _check_devices(session, sharding.device_ids)
        results.append(ServerArray.from_jax(_device_put(source.jax_array(), sharding), sharding))
    for handle, result in zip(handles, results, strict=True):
        session.arrays.put(handle, result)
    _donated(request, sources)
    response.reshard_arrays_response.array_handles.extend(handles)


def remap_arrays_request(session: Session, request: Proto, response: Proto) -> None:
    """Shards of the inputs become shards of the outputs, where the plan says, without
    moving (pathwaysutils' split_by_mesh_axis and concatenate_by_mesh_axis send it)."""
    plan = request.plan
    arrays = [session.arrays.get(h) for h in request.array_handles]
    sources = [array.live_shards() for array in arrays]
    specs = [(spec, sharding_from_proto(spec.sharding)) for spec in plan.output_specs]
    shards: list[list[ArrayImpl | None]] = [[None] * len(sharding.device_ids) for _, sharding in specs]
    for mapping in plan.mappings:
        source_shards = sources[mapping.in_array]
        intervals = zip(
            mapping.from_start, mapping.from_end, mapping.from_step,
            mapping.to_start, mapping.to_end, mapping.to_step, strict=True,
        )  # fmt: skip
        for from_start, from_end, from_step, to_start, to_end, to_step in intervals:
            targets = range(to_start, to_end, to_step)
            for i, j in zip(range(from_start, from_end, from_step), targets, strict=True):
                shards[mapping.out_array][j] = source_shards[i]
    results = []
    for (spec, sharding), pieces in zip(specs, shards, strict=True):
        placed = [piece for piece in pieces if piece is not None]
        if len(placed) < len(pieces):
            raise ServerError.invalid("the remap plan leaves a shard of an output unset")
        results.append(ServerArray(dtype_from_proto(spec.dtype), tuple(spec.shape.dims), sharding, placed))
    handles = session.arrays.handles_for(request.result_handles, len(results))
    for handle, result in zip(handles, results, strict=True):
        session.arrays.put(handle, result)
    _donated(request, arrays)
    response.remap_arrays_response.array_handles.extend(handles)


# ---- deleting ------------------------------------------------------------------


def delete_array_request(session: Session, request: Proto, response: Proto) -> None:
    errors = []
    for handle in request.array_handle:
        try:
            session.arrays.get(handle).delete()
        except ServerError as error:
            errors.append(error)
    future_handle = session.arrays.new_handle()
    session.add_future(future_handle, failed(errors[0]) if errors else done())
    response.delete_array_response.deletion_future_handle = future_handle


def is_array_deleted_request(session: Session, request: Proto, response: Proto) -> None:
    response.is_array_deleted_response.deleted = session.arrays.is_deleted(request.array_handle)


def destruct_array_request(session: Session, request: Proto, response: Proto) -> None:
    missing = session.arrays.destruct(request.array_handle)
    if missing:
        raise ServerError.not_found(f"Unknown array handle(s): {','.join(map(str, missing))}")
    response.destruct_array_response.SetInParent()
