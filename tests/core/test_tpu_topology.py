"""Topology of real TPU slices, from the attributes their devices carry.

No TPU exists here: ``tpu_devices`` builds stand-in objects with the
attributes JAX's TPU devices have (see tests/support/tpu_devices.py), for multi-slice
v5e, v5p, v6e (Trillium) and TPU7x (Ironwood) shapes. The proxy backend's
placements and the shared topology code must draw them as a user expects.
"""

from __future__ import annotations

import re

import pytest
from tpu_devices import tpu_devices

from pathways_kernel.backends.proxy import device_placements
from pathways_kernel.core.slices import DeviceTable, Topology

SHAPES = [
    # type, topology, slices, kind, chips per slice, devices per slice, grid
    ("v5e", "2x4", 2, "TPU v5 lite", 8, 8, "2x4x1"),
    ("v5p", "2x2x4", 2, "TPU v5", 16, 16, "2x2x4"),
    ("v6e", "4x4", 4, "TPU v6 lite", 16, 16, "4x4x1"),
    ("tpu7x", "2x2x2", 2, "TPU7x", 8, 16, "2x2x2"),
]


def topology_of(devices) -> Topology:
    return Topology.from_placements(devices, device_placements(devices), "tpu")


@pytest.mark.parametrize("tpu,shape,slices,kind,chips,devices,grid", SHAPES, ids=[s[0] for s in SHAPES])
def test_text_names_slices_chips_kind_and_grid(tpu, shape, slices, kind, chips, devices, grid):
    topology = topology_of(tpu_devices(tpu, shape, slices))
    text = topology.to_text()
    count = f"{chips} chips" if chips == devices else f"{chips} chips ({devices} devices)"
    assert text.splitlines()[0].startswith(f"{slices}/{slices} slices up, ")
    for index in range(slices):
        assert f"slice {index}: up   {count} {kind} grid {grid}" in text
    # Every device listed once, with its coordinates (and core where chips have two).
    listed = re.findall(r"(\d+)@\(\d+,\d+,\d+\)", text)
    assert sorted(map(int, listed)) == list(range(slices * devices))
    if devices > chips:
        assert "/c1" in text


@pytest.mark.parametrize("tpu,shape,slices,kind,chips,devices,grid", SHAPES, ids=[s[0] for s in SHAPES])
def test_html_places_every_device_in_its_own_cell(tpu, shape, slices, kind, chips, devices, grid):
    topology = topology_of(tpu_devices(tpu, shape, slices))
    html = topology._repr_html_()
    blocks = html.split("border:2px solid")[1:]
    assert len(blocks) == slices
    for block in blocks:
        cells = re.findall(r"grid-column:(\d+);grid-row:(\d+)", block)
        assert len(cells) == devices
        assert len(set(cells)) == devices, "two devices drawn on the same cell"
        assert kind in block


def test_slice_down_renders_and_devices_table_shows_kind():
    topology = topology_of(tpu_devices("v6e", "2x2", 2)).with_slice_state(1, "down")
    assert "slice 1: down" in topology.to_text()
    assert "<b>DOWN</b>" in topology._repr_html_()
    table = repr(DeviceTable(topology))
    assert "TPU v6 lite" in table and "down" in table


def test_devices_without_coords_fall_back_to_a_grid_per_slice():
    class Bare:
        def __init__(self, id, slice_index):
            self.id, self.slice_index, self.platform = id, slice_index, "cpu"

    topology = topology_of([Bare(i, i // 4) for i in range(8)])
    assert [s.shape for s in topology.slices] == [(2, 2, 1), (2, 2, 1)]


@pytest.mark.parametrize("tpu,shape,slices,kind,chips,devices,grid", SHAPES, ids=[s[0] for s in SHAPES])
def test_mesh_puts_slices_on_the_dcn_axis(tpu, shape, slices, kind, chips, devices, grid):
    from pathways_kernel.core import meshes

    topology = topology_of(tpu_devices(tpu, shape, slices))
    mesh = meshes.build(topology.up_slices, None, None, None)
    assert dict(mesh.shape) == {"data": slices, "model": devices}
    for row, s in zip(mesh.devices, topology.slices, strict=True):
        assert {d.slice_index for d in row} == {s.index}
        assert sorted(d.id for d in row) == sorted(d.id for d in s.devices)
