"""Requests about the server's devices: the session's start (``InitRequest``: the devices,
their slices and memories), default device assignments and layouts."""

from __future__ import annotations

from pathways_kernel.server.errors import ServerError
from pathways_kernel.server.protos import Proto
from pathways_kernel.server.session import Session

#: The memories of each device, its default first (memory ids: kind-major, then device id).
MEMORY_KINDS = ("device", "pinned_host", "unpinned_host")


def init_request(session: Session, request: Proto, response: Proto) -> None:
    init = response.init_response
    topology = session.topology
    init.session_id = session.id
    init.platform_name = "cpu"
    init.platform_version = f"pathways-local {topology.spec}"
    init.runtime_type = "pjrt_ifrt"
    import jax

    # The client prints its devices and memories with the server's words (str is the
    # debug string, repr the other): the server's own CPU devices say what a stock
    # kernel's would (``cpu:0``, ``CpuDevice(id=0)``), whatever this jaxlib calls them.
    local = jax.devices()
    for i in range(topology.device_count):
        device = init.all_devices.add()
        device.id = device.local_device_id = device.local_hardware_id = i
        device.default_memory_id = i
        device.platform_name = "cpu"
        device.device_kind = topology.device_kind(i)  # "TPU v5p" on a v5p slice
        device.debug_string, device.to_string = str(local[i]), repr(local[i])
        attributes = device.attributes.attributes
        attributes["slice_index"].int64_value = topology.slice_of(i)
        attributes["coords"].int64_list_value.elements.extend(topology.coords(i))
        attributes["core_on_chip"].int64_value = 0
        attributes["num_cores"].int64_value = 1
        init.addressable_device_ids.append(i)
        init.primary_device_ids.append(i)
        # Host memories too, as a TPU's (and XLA:CPU's) devices have: RL frameworks keep a
        # policy snapshot in pinned_host (Tunix's anchor policy) and offload there.
        for number, kind in enumerate(MEMORY_KINDS):
            memory = init.memories.add()
            memory.id = number * topology.device_count + i
            memory.memory_space_kind = kind
            memory.device_ids.append(i)
            device.memory_ids.append(memory.id)
            own = local[i].memory(kind)
            memory.debug_string, memory.to_string = str(own), repr(own)


def get_default_device_assignment_request(session: Session, request: Proto, response: Proto) -> None:
    replicas, partitions = request.num_replicas, request.num_partitions
    count = session.topology.device_count
    if replicas * partitions > count:
        raise ServerError.invalid(
            f"{replicas} replicas x {partitions} partitions need more than the {count} devices here"
        )
    assignment = response.get_default_device_assignment_response.device_assignment
    assignment.replica_count, assignment.computation_count = replicas, partitions
    for partition in range(partitions):
        devices = assignment.computation_devices.add()
        devices.replica_device_ids.extend((partition * replicas + r) % count for r in range(replicas))


def get_default_layout_request(session: Session, request: Proto, response: Proto) -> None:
    session.topology.check_device(request.device_id)
    rank = len(request.dims)
    minor_to_major = ",".join(str(i) for i in reversed(range(rank)))
    response.get_default_layout_response.serialized_pjrt_layout = f"{{{minor_to_major}}}".encode()
