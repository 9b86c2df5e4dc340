"""Protobuf's wire format, read by hand where no message class is at hand (a trace's
metadata plane, the descriptors embedded in jaxlib)."""

from __future__ import annotations


def read_varint(data: bytes | memoryview, i: int) -> tuple[int, int]:
    """The protobuf varint at ``data[i]``, and where the next field starts."""
    result = shift = 0
    while True:
        byte = data[i]
        i += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, i
