"""Persistence in the server: pathwaysutils' ``bulk_persistence_write_request`` and
``bulk_persistence_read_request`` (``pathwaysutils.persistence.helper.write_arrays`` /
``read_arrays``, and orbax's ``CloudPathwaysArrayHandler`` with
``ENABLE_PATHWAYS_PERSISTENCE=1``), served as Pathways serves them: the server writes
the arrays it holds to storage itself, and reads them back onto the devices asked
for, without the bytes passing through the client.

Each array is a zarr array at ``LOCATION/NAME`` (one chunk per shard), the layout
orbax reads (its ``ArrayHandler.metadata`` opens it), written with tensorstore to a
local directory or ``gs://`` (a Cloud Storage emulator through
``STORAGE_EMULATOR_HOST`` in the server's environment, as in the kernel). A read
fills each device's shard from its own slice of the stored array.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from pathways_kernel.server.arrays import ServerArray, Sharding
from pathways_kernel.server.errors import INVALID_ARGUMENT, ServerError, from_exception

if TYPE_CHECKING:
    import tensorstore as ts

# A persistence request's entry for one array: its JSON object.
Entry = dict[str, Any]

WRITE, READ = "bulk_persistence_write_request", "bulk_persistence_read_request"
# pathwaysutils sends the bulk forms; the single ones are Pathways' names for one array.
SINGLE = {"persistenceWriteRequest": WRITE, "persistenceReadRequest": READ}

_DTYPES = {
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
    "S8": "int8",
    "S16": "int16",
    "S32": "int32",
    "S64": "int64",
    "U8": "uint8",
    "U16": "uint16",
    "U32": "uint32",
    "U64": "uint64",
}


def _text(entry: Entry, key: str) -> str:
    return base64.b64decode(entry[key]).decode()


def _sharding(entry: Entry, rank: int) -> Sharding:
    from pathways_kernel.server.jaxcompat import OpSharding, op_sharding

    op = op_sharding(base64.b64decode(entry["b64_hlo_sharding_string"]))
    device_ids = tuple(int(d) for d in entry["devices"]["device_ids"])
    if len(device_ids) == 1 and op.type != OpSharding.Type.OTHER:
        return Sharding(device_ids, None)
    return Sharding(device_ids, op)


def _store(location: str, name: str, *, create: dict[str, Any] | None = None) -> ts.TensorStore:
    """The tensorstore zarr array ``location/name`` (created with ``create``'s metadata if given)."""
    import tensorstore as ts

    from pathways_kernel.core import locations, objectstore
    from pathways_kernel.core.errors import PathwaysError

    locations.emulator_env()
    try:
        where = locations.parse_url(location)
    except PathwaysError as error:
        raise ServerError(INVALID_ARGUMENT, str(error)) from error
    kvstore = objectstore.objects_for(where).kvstore(where)
    kvstore["path"] += name
    spec: dict[str, Any] = {"driver": "zarr", "kvstore": kvstore}
    try:
        if create is None:
            return ts.open(spec, open=True, read=True).result()
        spec["metadata"] = create
        return ts.open(spec, create=True, delete_existing=True, write=True).result()
    except Exception as error:  # tensorstore's reason is the user's answer, its status code passed through
        what = f"{'write' if create else 'read'} {location}/{name}"
        raise from_exception(error, what, default=INVALID_ARGUMENT) from error


@dataclass(eq=False)
class PersistenceProgram:
    """One bulk write or read request; executions run in the background, like colocated Python."""

    kind: str
    entries: list[Entry]
    name: str = ""
    executable: None = None  # no XLA executable
    device_ids: tuple[int, ...] = ()
    num_replicas: int = 1
    output_shapes: list[tuple[int, ...]] = field(default_factory=list)
    output_dtypes: list[np.dtype[Any]] = field(default_factory=list)
    output_shardings: list[Sharding] = field(default_factory=list)
    parameter_shardings: list[jax.sharding.Sharding] = field(default_factory=list)
    runs_in_background: bool = True

    def run(self, args: list[ServerArray]) -> list[ServerArray]:
        return self._write(args) if self.kind == WRITE else self._read()

    def _write(self, args: list[ServerArray]) -> list[ServerArray]:
        if len(args) != len(self.entries):
            raise ServerError.invalid(f"{WRITE} names {len(self.entries)} arrays, got {len(args)}")
        for entry, array in zip(self.entries, args, strict=True):
            value = array.jax_array()
            shards = [s for s in value.addressable_shards if s.replica_id == 0]
            chunk = list(shards[0].data.shape) or [1]
            metadata = {"shape": list(array.shape), "chunks": chunk, "dtype": np.dtype(array.dtype).str}
            if array.dtype == np.dtype("bfloat16"):
                metadata["dtype"] = "bfloat16"
            stored = _store(_text(entry, "b64_location"), _text(entry, "b64_name"), create=metadata)
            writes = [stored[shard.index].write(np.asarray(shard.data)) for shard in shards]
            for write in writes:
                write.result()
        return []

    def _read(self) -> list[ServerArray]:
        outputs = []
        for entry, shape, dtype, sharding in zip(
            self.entries, self.output_shapes, self.output_dtypes, self.output_shardings, strict=True
        ):
            stored = _store(_text(entry, "b64_location"), _text(entry, "b64_name"))
            if tuple(stored.shape) != shape or np.dtype(stored.dtype.numpy_dtype) != dtype:
                raise ServerError.invalid(
                    f"read {_text(entry, 'b64_name')}: stored as {stored.dtype.numpy_dtype}{list(stored.shape)}, "
                    f"asked for {dtype}{list(shape)}"
                )
            value = jax.make_array_from_callback(shape, sharding.jax_sharding(), _reader(stored))
            outputs.append(ServerArray.from_jax(value, sharding))
        return outputs


def _reader(stored: ts.TensorStore) -> Callable[[tuple[slice, ...] | None], np.ndarray[Any, np.dtype[Any]]]:
    """Reads a shard's slice of ``stored`` (for ``jax.make_array_from_callback``)."""

    def read(index: tuple[slice, ...] | None) -> np.ndarray[Any, np.dtype[Any]]:
        return stored[index].read().result()

    return read


def compile_persistence(kind: str, body: Entry) -> PersistenceProgram:
    """The program of a (bulk) persistence request's JSON body."""
    kind = SINGLE.get(kind, kind)
    if kind == WRITE:
        entries = body.get("write_requests", [body] if "b64_name" in body else [])
    else:
        entries = body.get("read_requests", [body] if "b64_name" in body else [])
    if not entries:
        raise ServerError.invalid(f"{kind}: no arrays named")
    program = PersistenceProgram(kind, entries, name=kind)
    devices: list[int] = []
    for entry in entries:
        try:
            if kind == WRITE:
                rank = len(entry["shape"])
                sharding = _sharding(entry, rank)
            else:
                shape = tuple(int(d) for d in entry["shape"]["dimensions"])
                dtype = np.dtype(_DTYPES[entry["shape"]["xla_primitive_type_str"]])
                sharding = _sharding(entry, len(shape))
                program.output_shapes.append(shape)
                program.output_dtypes.append(dtype)
                program.output_shardings.append(sharding)
            _text(entry, "b64_location"), _text(entry, "b64_name")
        except (KeyError, ValueError, TypeError) as error:
            raise ServerError.invalid(f"{kind}: malformed request ({type(error).__name__}: {error})") from error
        devices.extend(d for d in sharding.device_ids if d not in devices)
    program.device_ids = tuple(devices)
    return program
