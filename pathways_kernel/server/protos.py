"""Message classes of the IFRT proxy protocol, built from the installed jaxlib.

jaxlib ships no Python protos for the proxy, but ``libjax_common.so`` embeds
the serialized ``FileDescriptorProto`` of every proto it speaks. Building the
classes from those descriptors gives exactly the protocol of the installed
client, whatever its version, without vendoring .proto files that would drift.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from typing import Any, Protocol

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor

from pathways_kernel.core.protowire import read_varint


class Proto(Protocol):
    """A message of a class built at runtime from jaxlib's descriptors (``message``). No stub
    declares its fields, so they read and write as Any; protobuf's own methods are checked."""

    DESCRIPTOR: Descriptor

    def SerializeToString(self, *, deterministic: bool = ...) -> bytes: ...
    def ParseFromString(self, serialized: bytes, /) -> int | None: ...
    def HasField(self, field_name: str, /) -> bool: ...
    def WhichOneof(self, oneof_group: str, /) -> str | None: ...
    def SetInParent(self) -> None: ...
    def __getattr__(self, name: str) -> Any: ...
    def __setattr__(self, name: str, value: Any) -> None: ...


class ProtoClass(Protocol):
    """A message class built at runtime: ``cls(**fields)``, ``cls.FromString(data)``."""

    DESCRIPTOR: Descriptor
    SerializeToString: Callable[[Proto], bytes]  # as a function of a message, e.g. a gRPC serializer

    def __call__(self, **fields: Any) -> Proto: ...
    def FromString(self, serialized: bytes, /) -> Proto: ...


_ROOT = "xla/python/ifrt_proxy/common/grpc_ifrt_service.proto"
_PATH = re.compile(rb"\x0a(.)([a-zA-Z0-9_/]+\.proto)")


def _library() -> str:
    from pathways_kernel.server.jaxcompat import jaxlib_dir

    return os.path.join(jaxlib_dir(), "libjax_common.so")


def _end_of_message(data: bytes, start: int) -> int:
    """Where the FileDescriptorProto starting at ``start`` ends: the first byte that
    is not a plausible top-level field of one (its fields are numbered 1..20 and are
    varints or length-delimited)."""
    i = start
    while i < len(data):
        try:
            tag, j = read_varint(data, i)
            field, wire = tag >> 3, tag & 7
            if field == 0 or field > 20 or wire not in (0, 2):
                break
            if wire == 0:
                _, j = read_varint(data, j)
            else:
                length, j = read_varint(data, j)
                j += length
        except IndexError:
            break
        if j > len(data):
            break
        i = j
    return i


def _embedded_files(data: bytes) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    found: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    for match in _PATH.finditer(data):
        if match.group(1)[0] != len(match.group(2)):
            continue
        proto = descriptor_pb2.FileDescriptorProto()
        try:
            proto.ParseFromString(data[match.start() : _end_of_message(data, match.start())])
        except Exception:  # a false match of the path pattern
            continue
        if proto.name and proto.name not in found and (proto.message_type or proto.enum_type or proto.service):
            found[proto.name] = proto
    return found


@functools.cache
def pool() -> descriptor_pool.DescriptorPool:
    """The descriptor pool of the proxy protocol (and everything it imports)."""
    with open(_library(), "rb") as f:
        files = _embedded_files(f.read())
    result = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(name: str) -> None:
        if name in added:
            return
        for dependency in files[name].dependency:
            add(dependency)
        result.Add(files[name])
        added.add(name)

    add(_ROOT)
    for extra in (
        "xla/python/pjrt_ifrt/xla_sharding.proto",
        "xla/python/ifrt/sharding_serdes.proto",
        "xla/python/pjrt_ifrt/xla_compiler.proto",
        "xla/python/ifrt/custom_call_program.proto",  # colocated Python
        "xla/python/ifrt_proxy/common/array_util.proto",  # string arrays' host buffers
    ):
        if extra in files:
            add(extra)
    return result


@functools.cache
def message(full_name: str) -> ProtoClass:
    """The class of message ``full_name``, e.g. ``xla.ifrt.proxy.IfrtRequest``."""
    cls: ProtoClass = message_factory.GetMessageClass(pool().FindMessageTypeByName(full_name))
    return cls


def proxy(name: str) -> ProtoClass:
    """A message of the proxy package, e.g. ``proxy("IfrtResponse")``."""
    return message(f"xla.ifrt.proxy.{name}")


def ifrt(name: str) -> ProtoClass:
    """A message of the IFRT package, e.g. ``ifrt("ShardingProto")``."""
    return message(f"xla.ifrt.{name}")


def xla(name: str) -> ProtoClass:
    """A message of the XLA package, e.g. ``xla("OpSharding")``."""
    return message(f"xla.{name}")
