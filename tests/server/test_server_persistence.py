"""The local Pathways server's persistence (pathwaysutils' bulk write and read), on its own, in
this process: a tensorstore failure keeps the status code its text starts with, as the reference
passes statuses through (it was INVALID_ARGUMENT unless a read's text held NOT_FOUND anywhere)."""

from __future__ import annotations

import pytest

from pathways_kernel.server import persistence
from pathways_kernel.server.errors import FAILED_PRECONDITION, INVALID_ARGUMENT, NOT_FOUND, ServerError

ZARR = {"shape": [2], "chunks": [2], "dtype": "<f4", "compressor": None, "fill_value": 0, "order": "C"}
ZARR |= {"filters": None, "zarr_format": 2}


def failure(location: str, name: str, create: dict | None = None) -> ServerError:
    with pytest.raises(ServerError) as raised:
        persistence._store(location, name, create=create)
    return raised.value


def test_a_tensorstore_failure_keeps_its_code_in_one_line(tmp_path):
    missing = failure(str(tmp_path), "nope")
    assert missing.code == NOT_FOUND
    assert missing.message.startswith(f'read {tmp_path}/nope: Error opening "zarr" driver'), missing.message
    (tmp_path / "a_file").write_text("x")
    blocked = failure(str(tmp_path / "a_file"), "x", create=ZARR)  # a file where a directory should be
    assert blocked.code == FAILED_PRECONDITION, blocked.message
    assert blocked.message.startswith(f"write {tmp_path}/a_file/x: Error opening"), blocked.message
    assert "\n" not in blocked.message
    bad = failure(str(tmp_path), "y", create={"bogus": 1})  # its text names no code: the request's fault
    assert bad.code == INVALID_ARGUMENT, bad.message
