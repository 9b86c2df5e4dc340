import os

import pytest

# Tests emulate slices with CPU devices; nothing may reach for a TPU or GPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from gcs import gcs_server  # noqa: E402,F401  (one fake-gcs-server for the whole run)
from kernels import Kernel  # noqa: E402


@pytest.fixture(scope="module")
def kernel():
    """One `pathways` kernel (local:2x4) shared by a test module."""
    k = Kernel("pathways")
    yield k
    k.shutdown()


@pytest.fixture
def fresh_kernel():
    """A `pathways` kernel of its own, for tests that change the backend or kill slices."""
    k = Kernel("pathways")
    yield k
    k.shutdown()


@pytest.fixture
def local_session():
    """This process's session on local:2x4, every slice up before and after the test."""
    import pathways_kernel as pw
    from pathways_kernel.emulator.faults import repair_slice

    s = pw.session()
    if s.backend.spec != "local:2x4":
        s = pw.connect("local:2x4", force=True)
    for sl in s.topology.down_slices:
        repair_slice(sl.index)
    yield s
    for sl in s.topology.down_slices:
        repair_slice(sl.index)
