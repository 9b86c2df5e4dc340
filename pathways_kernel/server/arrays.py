"""Arrays the server holds for its client (their bytes move through ``host_buffers.py``).

An array is a list of single-device JAX arrays (one per device of its sharding,
in the sharding's device order) plus the IFRT sharding the client gave it. The
client picks array and host-buffer handles; handles the server makes (executables,
futures, arrays of a request that named none) live above ``SERVER_HANDLES``.
A handle can hold an error instead of an array ("poisoned"): every later use of
it fails with that error, which is how a lost slice or a failed execution
reaches the user as the status Pathways gives.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import ml_dtypes
import numpy as np

from pathways_kernel.core import heap
from pathways_kernel.server import protos
from pathways_kernel.server.errors import INVALID_ARGUMENT, UNIMPLEMENTED, ServerError
from pathways_kernel.server.jaxcompat import (
    ArrayImpl,
    GSPMDSharding,
    OpSharding,
    assemble,
    is_ready,
    op_sharding,
    replicated_op,
)
from pathways_kernel.server.protos import Proto

SERVER_HANDLES = 1 << 62

_KINDS = {
    "KIND_PRED": np.bool_,
    "KIND_S8": np.int8,
    "KIND_S16": np.int16,
    "KIND_S32": np.int32,
    "KIND_S64": np.int64,
    "KIND_U8": np.uint8,
    "KIND_U16": np.uint16,
    "KIND_U32": np.uint32,
    "KIND_U64": np.uint64,
    "KIND_F16": np.float16,
    "KIND_F32": np.float32,
    "KIND_F64": np.float64,
    "KIND_C64": np.complex64,
    "KIND_C128": np.complex128,
    "KIND_BF16": ml_dtypes.bfloat16,
    "KIND_S4": ml_dtypes.int4,
    "KIND_U4": ml_dtypes.uint4,
    "KIND_F8E4M3FN": ml_dtypes.float8_e4m3fn,
    "KIND_F8E5M2": ml_dtypes.float8_e5m2,
    # colocated Python's output specs travel as a string array (an instance: the class is "O")
    "KIND_STRING": np.dtypes.StringDType(),
}


def dtype_from_proto(proto: Proto) -> np.dtype[Any]:
    name = proto.DESCRIPTOR.fields_by_name["kind"].enum_type.values_by_number[proto.kind].name
    if name not in _KINDS:
        raise ServerError(UNIMPLEMENTED, f"dtype {name} is not served by the local Pathways server")
    dtype: np.dtype[Any] = np.dtype(_KINDS[name])
    return dtype


def dtype_to_proto(dtype: np.dtype[Any], proto: Proto) -> None:
    for name, numpy_type in _KINDS.items():
        if np.dtype(numpy_type) == dtype:
            proto.kind = proto.DESCRIPTOR.fields_by_name["kind"].enum_type.values_by_name[name].number
            return
    raise ServerError(UNIMPLEMENTED, f"dtype {dtype} is not served by the local Pathways server")


@dataclass(frozen=True)
class Sharding:
    """An IFRT sharding: its devices, and how the array is split over them
    (``op`` is None for a single-device array)."""

    device_ids: tuple[int, ...]
    op: OpSharding | None
    memory_kind: str = ""

    def jax_devices(self) -> tuple[jax.Device, ...]:
        devices = jax.devices()
        return tuple(devices[i] for i in self.device_ids)

    def jax_sharding(self) -> jax.sharding.Sharding:
        memory_kind = self.memory_kind or None  # the server's CPU devices have the host memories too
        if self.op is None:
            return jax.sharding.SingleDeviceSharding(jax.devices()[self.device_ids[0]], memory_kind=memory_kind)
        return GSPMDSharding(self.jax_devices(), self.op, memory_kind=memory_kind)

    def to_proto(self, proto: Proto) -> None:
        """Writes this sharding into an ``xla.ifrt.ShardingProto``."""
        serialized = proto.serialized_sharding
        if self.op is None:
            single = protos.ifrt("SingleDeviceShardingProto")(
                device_id=self.device_ids[0], memory_kind=self.memory_kind or "device"
            )
            serialized.type_name = "xla::ifrt::SingleDeviceSharding"
            serialized.data = single.SerializeToString()
            return
        hlo = protos.ifrt("HloShardingProto")(memory_kind=self.memory_kind or "device")
        hlo.devices.device_ids.extend(self.device_ids)
        hlo.xla_op_sharding.ParseFromString(self.op.SerializeToString())
        serialized.type_name = "xla::ifrt::HloSharding"
        serialized.data = hlo.SerializeToString()

    def with_devices(self, device_ids: Iterable[int]) -> Sharding:
        return Sharding(tuple(device_ids), self.op, self.memory_kind)


def replicated(device_ids: Iterable[int]) -> Sharding:
    return Sharding(tuple(device_ids), replicated_op())


def sharding_from_proto(proto: Proto) -> Sharding:
    kind, data = proto.serialized_sharding.type_name, proto.serialized_sharding.data
    if kind == "xla::ifrt::SingleDeviceSharding":
        single = protos.ifrt("SingleDeviceShardingProto").FromString(data)
        return Sharding((single.device_id,), None, single.memory_kind)
    if kind == "xla::ifrt::HloSharding":
        hlo = protos.ifrt("HloShardingProto").FromString(data)
        op = op_sharding(hlo.xla_op_sharding.SerializeToString())
        return Sharding(tuple(hlo.devices.device_ids), op, hlo.memory_kind)
    if kind == "xla::ifrt::ConcreteEvenSharding":
        even = protos.ifrt("ConcreteEvenShardingProto").FromString(data)
        if even.is_fully_replicated:
            return replicated(even.devices.device_ids)
    raise ServerError(UNIMPLEMENTED, f"sharding {kind or '(none)'} is not served by the local Pathways server")


class ServerArray:
    """One array: ``shards[i]`` lives on device ``sharding.device_ids[i]``.

    Deleting it (the client's delete, a donation) swaps its shards for ``None`` in one
    assignment: a reader on another thread (the control channel, the metric service, a
    reshard) sees either every shard of a live array or a deleted one with none, never a
    deleted array's shards or a live one's shards gone. Read ``shards`` (or ``live_shards()``)
    once and use what it gave."""

    def __init__(self, dtype: np.dtype[Any], shape: tuple[int, ...], sharding: Sharding, shards: Sequence[ArrayImpl]):
        self.dtype = dtype
        self.shape = shape
        self.sharding = sharding
        self._shards: tuple[ArrayImpl, ...] | None = tuple(shards)  # single-device, one per device

    @property
    def deleted(self) -> bool:
        return self._shards is None

    @property
    def shards(self) -> tuple[ArrayImpl, ...]:
        """Its shards; none once it is deleted."""
        shards = self._shards
        return () if shards is None else shards

    def live_shards(self) -> tuple[ArrayImpl, ...]:
        """Its shards; raises INVALID_ARGUMENT if it is deleted."""
        shards = self._shards
        if shards is None:
            raise ServerError(INVALID_ARGUMENT, "Array has been deleted")
        return shards

    def delete(self) -> None:
        """Deletes it for every reader at once; its buffers go when the last reader lets them go."""
        self._shards = None

    def jax_array(self, sharding: jax.sharding.Sharding | None = None) -> jax.Array:
        """The shards as one JAX array (under ``sharding`` if given: an executable's
        own parameter sharding over the same devices)."""
        shards = self.live_shards()
        if sharding is None:
            if self.sharding.op is None:
                return shards[0]
            sharding = self.sharding.jax_sharding()
        return assemble(self.shape, self.dtype, sharding, shards)

    def check_live(self) -> None:
        self.live_shards()

    @classmethod
    def from_jax(cls, array: jax.Array, sharding: Sharding) -> ServerArray:
        by_device = {shard.device.id: shard.data for shard in array.addressable_shards}
        return cls(np.dtype(array.dtype), tuple(array.shape), sharding, [by_device[d] for d in sharding.device_ids])


class Poisoned:
    """What a handle holds after the work that should have made its array failed."""

    def __init__(self, error: ServerError):
        self.error = error


_released: queue.SimpleQueue[list[ServerArray | Poisoned]] = queue.SimpleQueue()
_releaser_lock = threading.Lock()
_releaser: threading.Thread | None = None
# Gives big arrays' memory back once they are dropped (core/heap.py says what kept it).
_reclaimer = heap.Reclaimer()
# Only arrays this big count: a collection holds the GIL for tens of milliseconds (a loader's
# small batches, counted too, set one off every few seconds: 15% of the server's time).
_RECLAIM_FROM = 16 << 20


def _drop_released() -> None:
    while True:
        _released.get()  # the last references go here


def _release(entries: list[ServerArray | Poisoned]) -> None:
    """Drops ``entries`` on another thread if any of their buffers is still being computed:
    dropping the last reference to one waits for the computation using it, which must not
    hold up the session's requests (those computed are dropped here: waking that thread
    costs more)."""
    global _releaser
    sizes = (sum(shard.nbytes for shard in entry.shards) for entry in entries if isinstance(entry, ServerArray))
    _reclaimer.released(sum(size for size in sizes if size >= _RECLAIM_FROM))
    if all(_computed(entry) for entry in entries):
        return
    with _releaser_lock:
        if _releaser is None:
            _releaser = threading.Thread(target=_drop_released, name="pathways-local-release", daemon=True)
            _releaser.start()
    _released.put(entries)


def _computed(entry: ServerArray | Poisoned) -> bool:
    # A shard another array donated (remapped shards are shared) has nothing left to compute.
    return not isinstance(entry, ServerArray) or all(shard.is_deleted() or is_ready(shard) for shard in entry.shards)


class ArrayStore:
    """Handle -> array (or the error that stands in for it)."""

    def __init__(self, check_up: Callable[[Iterable[int]], None] | None = None):
        self._entries: dict[int, ServerArray | Poisoned] = {}
        self._lock = threading.Lock()
        self._server_handles = itertools.count(SERVER_HANDLES)
        # Raises the DATA_LOSS of a device's slice that is down (``Topology.check_up``).
        self._check_up = check_up

    def new_handle(self) -> int:
        return next(self._server_handles)

    def handles_for(self, requested: Iterable[int], count: int) -> list[int]:
        """The client's handles for ``count`` new arrays, or new server handles if it named none."""
        handles = list(requested)
        return handles if handles else [self.new_handle() for _ in range(count)]

    def get(self, handle: int) -> ServerArray:
        with self._lock:
            entry = self._entries.get(handle)
        if entry is None:
            raise ServerError.not_found(f"Unknown array handle: {handle}")
        if isinstance(entry, Poisoned):
            raise entry.error
        return entry

    def is_deleted(self, handle: int) -> bool:
        """Whether the client deleted ``handle``'s array. A poisoned one is not deleted, as on
        Pathways: its error is for the uses of it (an error here makes the client log a line)."""
        with self._lock:
            entry = self._entries.get(handle)
        if entry is None:
            raise ServerError.not_found(f"Unknown array handle: {handle}")
        return isinstance(entry, ServerArray) and entry.deleted

    def put(self, handle: int, entry: ServerArray | Poisoned) -> None:
        """Stores ``entry`` under ``handle``; an array made on a slice lost meanwhile is lost too.

        A slice is failed from another thread (the control channel) while work that checked the
        slice was up is still making its outputs. The failure marks the slice down, then loses
        the arrays stored by then; an array stored after that sweep is caught here, since the
        check comes after the store."""
        with self._lock:
            self._entries[handle] = entry
        if self._check_up is None or not isinstance(entry, ServerArray):
            return
        try:
            self._check_up(entry.sharding.device_ids)
        except ServerError as error:
            with self._lock:
                if self._entries.get(handle) is not entry:
                    return  # already swept up by the loss, or replaced
                self._entries[handle] = Poisoned(error)
            _release([entry])

    def poison(self, handles: Iterable[int], error: ServerError) -> None:
        with self._lock:
            for handle in handles:
                self._entries[handle] = Poisoned(error)

    def destruct(self, handles: Iterable[int]) -> list[int]:
        """Forgets ``handles``; returns those it did not know."""
        missing: list[int] = []
        released: list[ServerArray | Poisoned] = []
        with self._lock:
            for handle in handles:
                entry = self._entries.pop(handle, None)
                if entry is None:
                    missing.append(handle)
                else:
                    released.append(entry)
        _release(released)
        return missing

    def lose(self, device_ids: set[int], error: ServerError) -> int:
        """Poisons every array with a shard on ``device_ids`` (their buffers are freed); returns how many."""
        with self._lock:
            lost = [
                h
                for h, e in self._entries.items()
                if isinstance(e, ServerArray) and device_ids & set(e.sharding.device_ids)
            ]
            released = [self._entries[handle] for handle in lost]
            for handle in lost:
                self._entries[handle] = Poisoned(error)
        _release(released)
        return len(lost)

    def bytes_per_device(self) -> dict[int, int]:
        """Bytes of live arrays on each device (an array aliased by two handles counts once)."""
        result: dict[int, int] = {}
        seen: set[int] = set()
        with self._lock:
            entries = list(self._entries.values())
        for array in (entry for entry in entries if isinstance(entry, ServerArray)):
            shards = array.shards  # read once: a delete on another thread leaves all of them or none
            if not shards:
                continue
            for device, shard in zip(array.sharding.device_ids, shards, strict=True):
                if id(shard) not in seen:
                    seen.add(id(shard))
                    result[device] = result.get(device, 0) + shard.nbytes
        return result
