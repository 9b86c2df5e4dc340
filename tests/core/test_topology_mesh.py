"""Topology and multi-slice meshes on real CPU devices (local:2x4)."""

import jax
import numpy as np
import pytest

import pathways_kernel as pw
from pathways_kernel.core import meshes
from pathways_kernel.core.errors import MeshError


@pytest.fixture(scope="module")
def session():
    s = pw.connect("embedded:2x4")
    yield s


def test_topology_has_two_slices_of_four_chips(session):
    topo = pw.topology()
    assert [s.index for s in topo.slices] == [0, 1]
    assert [len(s.chips) for s in topo.slices] == [4, 4]
    assert all(s.state == "up" for s in topo.slices)
    assert sorted(d.id for d in topo.devices) == sorted(d.id for d in jax.devices())
    # every chip knows its slice and coordinates; coordinates are unique within a slice
    for s in topo.slices:
        assert len({c.coords for c in s.chips}) == 4
        assert all(c.slice_index == s.index for c in s.chips)
    assert topo.slices[0].shape == (2, 2, 1)


def test_topology_renders_as_text_and_html(session):
    topo = pw.topology()
    text = topo.to_text()
    assert "2/2 slices up, 8 chips (cpu)" in text
    assert "slice 1: up" in text
    html = topo._repr_html_()
    assert html.count("slice ") >= 2 and "<b>up</b>" in html


def test_slice_state_changes_show_in_topology_status_and_events(session):
    before = len(pw.events(kind="slice_down"))
    assert session.set_slice_state(1, "down")
    try:
        topo = pw.topology()
        assert [s.index for s in topo.up_slices] == [0]
        assert "DOWN" in topo._repr_html_()
        status = pw.status()
        assert (status.slices_up, status.slices_total) == (1, 2)
        event = pw.events(kind="slice_down")[-1]
        assert len(pw.events(kind="slice_down")) == before + 1
        assert (event.slices_before, event.slices_after) == ((0, 1), (0,))
        # a mesh is built over the live slices only
        mesh = pw.mesh()
        assert dict(mesh.shape) == {"data": 1, "model": 4}
        assert {d.id for d in mesh.devices.flat} == {d.id for d in topo.slice(0).devices}
    finally:
        session.set_slice_state(1, "up")
    assert not session.set_slice_state(1, "up")  # no change, no event


def test_default_mesh_puts_slices_on_dcn_and_chips_on_ici(session):
    mesh = pw.mesh()
    assert mesh.axis_names == ("data", "model")
    assert dict(mesh.shape) == {"data": 2, "model": 4}
    topo = pw.topology()
    for row, s in zip(mesh.devices, topo.slices, strict=True):
        assert {d.id for d in row} == {d.id for d in s.devices}


def test_hybrid_mesh_with_ici_data_parallelism(session):
    mesh = pw.mesh(dcn=(2, 1), ici=(2, 2))
    assert dict(mesh.shape) == {"data": 4, "model": 2}
    topo = pw.topology()
    # the first two rows of the data axis are slice 0, the last two slice 1
    first = {d.id for d in mesh.devices[:2].flat}
    assert first == {d.id for d in topo.slice(0).devices}


def test_three_axes(session):
    mesh = pw.mesh(axes=("replica", "data", "model"), dcn=(2, 1, 1), ici=(1, 2, 2))
    assert dict(mesh.shape) == {"replica": 2, "data": 2, "model": 2}


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(dcn=(3, 1)), "needs 3 slices but 2 are up"),
        (dict(ici=(3, 1)), "needs 3 chips per slice"),
        (dict(axes=("a", "b", "c"), dcn=(2, 1)), "has 2 sizes but there are 3 axes"),
        (dict(axes=("data", "data")), "distinct identifiers"),
        (dict(ici=(0, 4)), "must be positive"),
    ],
)
def test_mesh_that_does_not_fit_is_one_clear_error(session, kwargs, fragment):
    with pytest.raises(MeshError, match=fragment):
        pw.mesh(**kwargs)


def test_parse_shape():
    assert meshes.parse_shape("2,1") == (2, 1)
    assert meshes.parse_shape("2x2") == (2, 2)
    with pytest.raises(MeshError, match="bad shape"):
        meshes.parse_shape("two")


def test_sharded_computation_runs_across_slices(session):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = pw.mesh()
    x = jax.device_put(np.arange(64, dtype=np.float32).reshape(8, 8), NamedSharding(mesh, P("data", "model")))
    assert len(x.addressable_shards) == 8
    total = jax.jit(lambda a: (a * 2).sum())(x)
    assert float(total) == float(np.arange(64).sum() * 2)
