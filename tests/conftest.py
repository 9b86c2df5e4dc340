import os

import pytest

# Tests emulate slices with CPU devices; nothing may reach for a TPU or GPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

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
