"""pathwaysutils' ``reshardRequest`` side channel, served: the server moves arrays between
device sets itself, as Pathways does for RL frameworks that sync weights from the training
mesh to the rollout mesh (Tunix with ``JAX_PLATFORMS=proxy``).

``pathwaysutils.experimental.reshard`` compiles a plugin program whose JSON names, for each
array, its sharding before and after (device ids, a base64 ``xla.OpSharding``, a memory
kind) and whether the inputs are donated, then executes it on the arrays. The JSON carries
no shapes: each output has its input's shape and dtype, learnt at the first execution (the
client's response wants them; a program is built for one set of avals, cached or not).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from pathways_kernel.server.arrays import ServerArray, Sharding
from pathways_kernel.server.errors import ServerError
from pathways_kernel.server.jaxcompat import op_sharding

if TYPE_CHECKING:
    from pathways_kernel.server.devices import Topology

KIND = "reshardRequest"


def _sharding(entry: dict[str, Any], device_count: int) -> Sharding:
    """One ``inSharding``/``outSharding`` entry: devices, HLO sharding, memory kind."""
    device_ids = tuple(int(d) for d in entry["devices"]["device_ids"])
    unknown = [d for d in device_ids if not 0 <= d < device_count]
    if not device_ids or unknown:
        raise ServerError.not_found(
            f"{KIND}: device {unknown[0] if unknown else '(none)'} does not exist "
            f"(this server has devices 0..{device_count - 1})"
        )
    op = op_sharding(base64.b64decode(entry["xla_hlo_sharding"]))
    memory_kind = str(entry.get("memory_kind", ""))
    if len(device_ids) == 1:
        return Sharding(device_ids, None, memory_kind)
    return Sharding(device_ids, op, memory_kind)


@dataclass(eq=False)
class ReshardProgram:
    """Moves each argument onto its ``outSharding`` on the server; the client sees new arrays
    and, with ``donateInput``, its inputs deleted."""

    in_shardings: list[Sharding]
    out_shardings: list[Sharding]
    donate: bool
    name: str = KIND
    executable: None = None  # no XLA executable
    device_ids: tuple[int, ...] = ()
    num_replicas: int = 1
    output_shapes: list[tuple[int, ...]] = field(default_factory=list)
    output_dtypes: list[np.dtype[Any]] = field(default_factory=list)
    runs_in_background: bool = False
    # Raises DATA_LOSS for devices on a slice that is down (``Topology.check_up``): a sync onto a
    # lost rollout slice fails, as its future says on Pathways, instead of leaving lost arrays.
    check_up: Callable[[Iterable[int]], None] | None = None

    @property
    def output_shardings(self) -> list[Sharding]:
        return self.out_shardings

    def run(self, args: list[ServerArray]) -> list[ServerArray]:
        if len(args) != len(self.out_shardings):
            raise ServerError.invalid(f"{KIND} names {len(self.out_shardings)} arrays, got {len(args)}")
        if self.check_up is not None:
            for after in self.out_shardings:
                self.check_up(after.device_ids)
        for i, (arg, before) in enumerate(zip(args, self.in_shardings, strict=True)):
            arg.check_live()
            if set(arg.sharding.device_ids) != set(before.device_ids):
                raise ServerError.invalid(
                    f"{KIND}: array {i} is on devices {list(arg.sharding.device_ids)}, "
                    f"the request says {list(before.device_ids)}"
                )
            self.output_shapes[i], self.output_dtypes[i] = arg.shape, arg.dtype
        # One batched device_put, as a client's own sync of a pytree is: JAX runs the copies
        # at once, not one after another (64 MiB in 4 arrays: 20.7 ms one by one on a quiet machine).
        moved = jax.device_put(
            [arg.jax_array() for arg in args], [after.jax_sharding() for after in self.out_shardings]
        )
        outputs = [ServerArray.from_jax(m, after) for m, after in zip(moved, self.out_shardings, strict=True)]
        if self.donate:
            for arg in args:
                arg.delete()
        return outputs


def compile_reshard(body: dict[str, Any], topology: Topology | None = None) -> ReshardProgram:
    """The program of a ``reshardRequest``'s JSON body; raises ServerError if it is malformed."""
    count = len(jax.devices())
    try:
        ins = [_sharding(entry, count) for entry in body["inSharding"]]
        outs = [_sharding(entry, count) for entry in body["outSharding"]]
        donate = bool(body.get("donateInput", False))
    except (KeyError, ValueError, TypeError) as error:
        raise ServerError.invalid(f"{KIND}: malformed request ({type(error).__name__}: {error})") from error
    if len(ins) != len(outs):
        raise ServerError.invalid(f"{KIND}: {len(ins)} input shardings but {len(outs)} output shardings")
    # The executable's devices are its inputs' (the client gives it one shard per device);
    # an output made on a slice that is down is lost when stored (``ArrayStore.put``).
    devices: list[int] = []
    for sharding in ins:
        devices.extend(d for d in sharding.device_ids if d not in devices)
    program = ReshardProgram(ins, outs, donate, device_ids=tuple(devices))
    if topology is not None:
        program.check_up = topology.check_up
    # Placeholders until the first execution says the shapes (see the module's docstring).
    program.output_shapes = [()] * len(outs)
    program.output_dtypes = [np.dtype(np.float32)] * len(outs)
    return program
