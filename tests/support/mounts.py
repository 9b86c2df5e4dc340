"""Real file systems that refuse writes, for tests: a full disk and a read-only directory.

Both need root (the tests run as root here): a 2 MiB tmpfs fills up for real
(tensorstore and orbax see ENOSPC), and a read-only bind mount refuses even
root (chmod does not: root ignores permission bits, not a read-only mount).

    def test_x(full_disk, read_only):   # fixtures, through conftest.py
        full_disk                        # a directory with 2 MiB of space
        read_only.source / read_only.path  # writable directory / the same one, read-only
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest


def _mount(*args: str) -> None:
    result = subprocess.run(["mount", *args], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"needs root to mount ({' '.join(args)}): {result.stderr.strip()}")


def _umount(path: Path) -> None:
    subprocess.run(["umount", str(path)], check=True)


@pytest.fixture
def full_disk(tmp_path):
    """A directory on a 2 MiB tmpfs: writing more fails with 'No space left on device'."""
    path = tmp_path / "full"
    path.mkdir()
    _mount("-t", "tmpfs", "-o", "size=2m", "tmpfs", str(path))
    try:
        yield path
    finally:
        _umount(path)


@dataclasses.dataclass
class ReadOnly:
    source: Path  # writable: put the data here first
    path: Path  # the same directory, mounted read-only


@pytest.fixture
def read_only(tmp_path):
    """A directory and a read-only bind mount of it."""
    source, path = tmp_path / "source", tmp_path / "read-only"
    source.mkdir()
    path.mkdir()
    _mount("--bind", str(source), str(path))
    try:
        _mount("-o", "remount,ro,bind", str(path))
        yield ReadOnly(source, path)
    finally:
        _umount(path)
