"""Stand-ins for TPU devices: what the Pathways proxy's devices carry.

No TPU exists here, so these plain objects carry the attributes JAX's TPU
devices have (``id``, ``platform``, ``device_kind``, ``slice_index``,
``coords``, ``core_on_chip``, ``process_index``), laid out like multi-slice
v5e, v5p, v6e (Trillium) and TPU7x (Ironwood) jobs. Shapes and chips per host
come from pathwaysutils' shared-service ``tpu_specs``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

from pathwaysutils.experimental.shared_pathways_service import tpu_specs

#: ``device_kind`` JAX reports per TPU type.
DEVICE_KIND = {"v5e": "TPU v5 lite", "v5p": "TPU v5", "v6e": "TPU v6 lite", "tpu7x": "TPU7x"}
#: JAX devices per chip: Ironwood exposes each of its two TensorCores
#: (assumed from its published architecture); the others one per chip.
CORES_PER_CHIP = {"v5e": 1, "v5p": 1, "v6e": 1, "tpu7x": 2}


@dataclasses.dataclass(frozen=True)
class FakeTpuDevice:
    id: int
    device_kind: str
    slice_index: int
    coords: tuple[int, int, int]
    core_on_chip: int
    process_index: int
    platform: str = "tpu"

    def __repr__(self) -> str:
        return f"TpuDevice(id={self.id}, slice={self.slice_index}, coords={self.coords}, core={self.core_on_chip})"


def tpu_devices(tpu_type: str, topology: str, num_slices: int) -> list[FakeTpuDevice]:
    """Devices of ``num_slices`` slices of ``tpu_type`` with ``topology`` (e.g. ``"2x4"``)."""
    config = tpu_specs.get_tpu_config(tpu_type)
    tpu_specs.calculate_vms_per_slice(topology, config.chips_per_vm)  # validates the shape
    dims = [int(d) for d in topology.split("x")]
    dims += [1] * (3 - len(dims))
    hosts_per_slice = math.prod(dims) // config.chips_per_vm
    cores = CORES_PER_CHIP[tpu_type]
    devices, next_id = [], 0
    for s in range(num_slices):
        for chip, (z, y, x) in enumerate(itertools.product(range(dims[2]), range(dims[1]), range(dims[0]))):
            for core in range(cores):
                host = s * hosts_per_slice + chip // config.chips_per_vm
                devices.append(FakeTpuDevice(next_id, DEVICE_KIND[tpu_type], s, (x, y, z), core, host))
                next_id += 1
    return devices
