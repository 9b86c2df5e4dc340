import os
import tempfile
from pathlib import Path

import pytest

# Tests emulate slices with CPU devices; nothing may reach for a TPU or GPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# This process's JAX runs on cpu: its own session can only be the embedded backend
# (test kernels choose theirs explicitly, kernels.Kernel).
os.environ.setdefault("PATHWAYS_BACKEND", "embedded:2x4")
# Kernels keep their session's metrics and events under the session log dir: one of the
# run's own, not the user's ~/.cache (core/sessionlog.py).
os.environ.setdefault("PATHWAYS_LOG_DIR", tempfile.mkdtemp(prefix="pathways-test-logs-"))
# Test modules run as scripts in processes of their own (JAX proxy clients, crash probes)
# import the helpers of tests/support as pytest's `pythonpath` lets the tests do.
SUPPORT = str(Path(__file__).resolve().parent / "support")
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (SUPPORT, os.environ.get("PYTHONPATH")) if p)

from gcs import gcs_server  # noqa: E402,F401  (one fake-gcs-server for the whole run)
from kernels import EMBEDDED, Kernel  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "backend(spec): the backend of this test's kernel, over its module's KERNEL_BACKEND (say why)"
    )


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items):
    """Tests on the real Slurm cluster (the ``slurm`` fixture) carry the ``slurm`` marker: ``make test-fast`` leaves them out."""
    for item in items:
        if "slurm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slurm)


def _backend(request) -> str:
    """The kernel backend: the test's ``backend`` mark, its module's ``KERNEL_BACKEND``, else embedded:2x4.

    Modules of what users do on the product default (elastic, healing, faults, ...) set
    ``KERNEL_BACKEND = SERVER``; UI and protocol modules stay on the faster embedded backend.
    """
    if (mark := request.node.get_closest_marker("backend")) is not None:
        return mark.args[0]
    return getattr(request.module, "KERNEL_BACKEND", EMBEDDED)


@pytest.fixture(scope="module")
def kernel(request):
    """One `pathways` kernel shared by a test module, on the module's KERNEL_BACKEND."""
    k = Kernel("pathways", backend=_backend(request))
    yield k
    k.shutdown()


@pytest.fixture
def fresh_kernel(request):
    """A `pathways` kernel of its own (on the module's KERNEL_BACKEND), for tests that change the backend or kill slices."""
    k = Kernel("pathways", backend=_backend(request))
    yield k
    k.shutdown()


@pytest.fixture
def local_session():
    """This process's session on embedded:2x4 (its JAX runs on cpu), every slice up before and after the test."""
    import pathways_kernel as pw
    from pathways_kernel.emulator.faults import repair_slice

    s = pw.session()
    if s.backend.spec != EMBEDDED:
        s = pw.connect(EMBEDDED, force=True)
    for sl in s.topology.down_slices:
        repair_slice(sl.index)
    yield s
    for sl in s.topology.down_slices:
        repair_slice(sl.index)


@pytest.fixture(autouse=True)
def each_test_is_a_cell():
    """In a kernel a cell's end ends the bare loops it started (a `for batch in loader` left by
    `break`); between in-process tests, the test's end does, or a later test's runs would log into
    an earlier test's loop (``accounting.end_cell_loops``, the kernel's post_run_cell)."""
    yield
    import sys

    accounting = sys.modules.get("pathways_kernel.training.accounting")
    if accounting is not None:
        accounting.end_cell_loops()
