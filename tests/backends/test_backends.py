"""Backend specs: what users type after `%pathways connect` and `install --backend`."""

import pytest

from pathways_kernel import backends
from pathways_kernel.core.errors import PathwaysError, SpecError
from pathways_kernel.emulator.local import LocalBackend, grid_shape


@pytest.mark.parametrize(
    "spec, shape",
    [("local", (2, 4)), ("local:2x4", (2, 4)), ("local:4x2", (4, 2)), ("local:1x1", (1, 1)), (" local:3X2 ", (3, 2))],
)
@pytest.mark.parametrize("kind", ["local", "embedded"])
def test_local_specs_parse(spec, shape, kind):
    """local:SxC is the local Pathways server, embedded:SxC the same slices in this process."""
    from pathways_kernel.backends.local_server import LocalServerBackend

    backend = backends.from_spec(spec.replace("local", kind))
    assert isinstance(backend, LocalServerBackend if kind == "local" else LocalBackend)
    assert (backend.num_slices, backend.chips_per_slice) == shape
    assert backend.spec == f"{kind}:{shape[0]}x{shape[1]}"


@pytest.mark.parametrize("spec", ["local-server:1x2", "local-server"])
def test_last_waves_server_spec_and_flag_mean_local(spec):
    assert backends.from_spec(spec).spec == ("local:1x2" if spec.endswith("1x2") else "local:2x4")
    assert backends.from_spec("local:1x2", server=True).spec == "local:1x2"
    with pytest.raises(SpecError, match=r"use local:SxC.*embedded:SxC runs them in this process"):
        backends.from_spec("embedded:2x4", server=True)


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("local:0x4", "at least 1"),
        ("local:2x0", "at least 1"),
        ("local:abc", "expected local:SxC"),
        ("local:2x4x9", "expected local:SxC"),
        ("local:-1x4", "expected local:SxC"),
        ("local:100x100", "more than"),
        ("local:\uff12x\uff14", "(digits 0-9)"),
        ("local:" + "9" * 5000 + "x1", "that many devices is more than the 4096"),
        ("local:2\nx4", "expected local:SxC"),
        ("local-server:2y4", "expected local:SxC"),
        ("embedded:0x4", "bad embedded spec 'embedded:0x4': slices and chips must be at least 1"),
        ("embedded:2y4", "expected embedded:SxC"),
        ("tpu:v5e", "unknown backend spec"),
        ("", "unknown backend spec"),
    ],
)
def test_bad_specs_say_what_to_type(spec, fragment):
    """One line; a malformed local spec names both local forms, an unknown one every form."""
    with pytest.raises(SpecError) as info:
        backends.from_spec(spec)
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message and len(message) < 250
    assert isinstance(info.value, PathwaysError)
    if "expected" in fragment or "unknown" in fragment:
        assert "local:SxC" in message and "embedded:SxC" in message, message


def test_default_spec_honours_kernelspec_then_pathways_env(monkeypatch):
    monkeypatch.delenv(backends.BACKEND_ENV, raising=False)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setattr(backends, "_jax_running", lambda: False)
    assert backends.default_spec() == "local:2x4"
    # Where JAX already runs in the process, the session stays in it.
    monkeypatch.setattr(backends, "_jax_running", lambda: True)
    assert backends.default_spec() == "embedded:2x4"
    monkeypatch.setenv("JAX_PLATFORMS", "proxy")
    monkeypatch.setenv("JAX_BACKEND_TARGET", "grpc://localhost:29000")
    assert backends.default_spec() == "proxy:grpc://localhost:29000"
    monkeypatch.setenv(backends.BACKEND_ENV, "embedded:4x2")
    assert backends.default_spec() == "embedded:4x2"


@pytest.mark.parametrize(
    "chips, shape", [(4, (2, 2, 1)), (8, (4, 2, 1)), (6, (3, 2, 1)), (7, (7, 1, 1)), (16, (4, 4, 1))]
)
def test_local_slices_are_near_square_grids(chips, shape):
    assert grid_shape(chips) == shape


def test_local_placements_group_devices_into_slices():
    backend = LocalBackend(2, 4)

    class Dev:
        def __init__(self, i):
            self.id = i

    placements = backend.placements([Dev(i) for i in range(8)])
    assert [p.slice_index for p in placements] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [p.coords for p in placements[:4]] == [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0)]
    assert placements[4].coords == (0, 0, 0)
