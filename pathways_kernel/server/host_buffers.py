"""Host buffers: the bytes of arrays on their way between the client's memory and the
server's devices.

The client uploads a buffer (``HostBufferStore``, a stream of chunks) and names it in a
request that makes an array of it; it asks for an array's bytes (``CopyToHostBuffer``)
and fetches them (``HostBufferLookup``). Buffers are the bulk of the bytes: their
messages (``bytes data = 1`` and nothing else) are read and written here without
protobuf's extra copy of each chunk, an upload is copied once, into memory the devices
adopt as it is, and a row-major download is the device buffer itself.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from pathways_kernel.core.protowire import read_varint
from pathways_kernel.server import protos
from pathways_kernel.server.errors import ALREADY_EXISTS, FAILED_PRECONDITION, ServerError

# The size of each message of a lookup's stream.
_CHUNK = 4 << 20

HostBuffer = np.ndarray[Any, np.dtype[Any]] | memoryview


class HostBufferStore:
    """Host buffers of one session; a lookup waits for an upload still on its way
    (the client may send the request naming a buffer before the buffer itself)."""

    def __init__(self) -> None:
        self._buffers: dict[int, HostBuffer | bytes | ServerError] = {}
        self._cond = threading.Condition()
        self._closed = False
        # Handles of uploads a refused request named before they arrived: dropped on arrival.
        self._discarded: set[int] = set()

    def store(self, handle: int, data: HostBuffer | bytes | ServerError) -> None:
        """Keeps ``data`` under ``handle``; an error instead fails the lookup of it. Each
        handle is filled once (ALREADY_EXISTS after), and nothing after ``close``."""
        with self._cond:
            if self._closed:
                raise ServerError(FAILED_PRECONDITION, f"host buffer {handle}: the session is closed")
            if handle in self._discarded:
                self._discarded.discard(handle)  # its request was refused: nothing will take it
                return
            if handle in self._buffers:
                raise ServerError(ALREADY_EXISTS, f"host buffer handle {handle} already exists")
            self._buffers[handle] = data
            self._cond.notify_all()

    def discard(self, handles: Iterable[int]) -> None:
        """Releases the buffers of a request that was refused, now or when they arrive."""
        with self._cond:
            for handle in handles:
                if self._buffers.pop(handle, None) is None and not self._closed:
                    self._discarded.add(handle)

    def has(self, handle: int) -> bool:
        with self._cond:
            return handle in self._buffers

    def lookup(self, handle: int, timeout: float = 600.0) -> HostBuffer | bytes:
        with self._cond:
            if not self._cond.wait_for(lambda: handle in self._buffers or self._closed, timeout):
                raise ServerError.not_found(f"host buffer {handle} never arrived")
            if handle not in self._buffers:
                raise ServerError.not_found(f"host buffer {handle}: session closed")
            data = self._buffers[handle]
        if isinstance(data, ServerError):
            raise data
        return data

    def take(self, handle: int, timeout: float = 600.0) -> HostBuffer | bytes:
        data = self.lookup(handle, timeout)
        self.delete(handle)
        return data

    def delete(self, handle: int) -> None:
        with self._cond:
            self._buffers.pop(handle, None)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._buffers.clear()
            self._discarded.clear()
            self._cond.notify_all()


# XLA:CPU adopts a host array 64-byte aligned as the device buffer instead of copying it.
_ALIGNMENT = 64


def receive_buffer(size: int) -> np.ndarray[tuple[int], np.dtype[np.uint8]]:
    """An empty host buffer of ``size`` bytes that ``jax.device_put`` can take without a copy."""
    raw = np.empty(size + _ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % _ALIGNMENT
    return raw[start : start + size]


def receive(chunks: Iterable[memoryview], size: int) -> tuple[np.ndarray[tuple[int], np.dtype[np.uint8]], int]:
    """An upload of ``size`` bytes, from its chunks (see ``data_field``), and how many bytes came."""
    data, received = receive_buffer(size), 0
    for chunk in chunks:
        if received + len(chunk) <= len(data):
            data[received : received + len(chunk)] = chunk
        received += len(chunk)
    return data, received


def from_host_bytes(
    data: HostBuffer | bytes, dtype: np.dtype[Any], shape: Sequence[int], byte_strides: Sequence[int] | None
) -> np.ndarray[Any, np.dtype[Any]]:
    """The numpy view of a host buffer laid out as the client describes it."""
    shape = tuple(shape)
    if dtype.kind == "T":  # a string array travels as a StringArrayContents message, row-major
        contents = protos.message("xla.ifrt.proto.StringArrayContents").FromString(bytes(data))
        return np.array([s.decode() for s in contents.strings], dtype=dtype).reshape(shape)
    if byte_strides is None:
        return np.frombuffer(data, dtype=dtype, count=int(np.prod(shape, dtype=np.int64))).reshape(shape)
    return np.ndarray(shape, dtype=dtype, buffer=data, strides=tuple(byte_strides))


def to_host_bytes(value: np.ndarray[Any, np.dtype[Any]], byte_strides: Sequence[int] | None) -> memoryview:
    """``value`` laid out as the client asks (row-major unless it gives strides), as bytes;
    a row-major value is not copied (the device buffer itself on CPU)."""
    if byte_strides is None:
        return np.ascontiguousarray(value).reshape(-1).view(np.uint8).data
    strides = tuple(byte_strides)
    size = max([0] + [(n - 1) * s for n, s in zip(value.shape, strides, strict=True) if n]) + value.itemsize
    out = bytearray(size if value.size else 0)
    if value.size:
        np.ndarray(value.shape, dtype=value.dtype, buffer=out, strides=strides)[...] = value
    return memoryview(out)


def data_field(raw: bytes) -> memoryview:
    """The ``data`` of a serialized GrpcHostBufferStoreRequest, without copying it."""
    view = memoryview(raw)
    if not raw:
        return view
    if raw[0] != 0x0A:
        return memoryview(protos.proxy("GrpcHostBufferStoreRequest").FromString(raw).data)
    length, i = read_varint(raw, 1)
    return view[i : i + length]


def byte_view(data: HostBuffer | bytes) -> memoryview:
    """The bytes of ``data``, not copied."""
    return (data.data if isinstance(data, np.ndarray) else memoryview(data)).cast("B")


def data_messages(view: memoryview) -> Iterator[bytes]:
    """The bytes of ``view`` as the serialized GrpcHostBufferLookupResponses of a lookup's stream."""
    for offset in range(0, max(len(view), 1), _CHUNK):
        yield _data_message(view[offset : offset + _CHUNK])


def _data_message(chunk: memoryview) -> bytes:
    """A serialized GrpcHostBufferLookupResponse carrying ``chunk``."""
    length, header = len(chunk), bytearray(b"\x0a")
    while True:
        byte = length & 0x7F
        length >>= 7
        header.append(byte | (0x80 if length else 0))
        if not length:
            break
    return b"".join((header, chunk))
