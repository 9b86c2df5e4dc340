"""What an injected fault says: the DATA_LOSS lines a lost slice's arrays raise, and the
report of one ``fail_slice``/``repair_slice`` (``FaultReport``), apart from the mechanism
in ``faults.py`` that makes them happen."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from pathways_kernel.core.display import TextDisplay
from pathways_kernel.core.eventlog import format_bytes
from pathways_kernel.core.text import count


def lost_array_message(slice_index: int) -> str:
    return (
        f"DATA_LOSS: slice {slice_index} was lost; this array had a shard on it and its data is gone. "
        f"Restore it from a snapshot or recompute it on the live slices"
    )


def placed_on_lost_message(slice_index: int, what: str) -> str:
    return f"DATA_LOSS: slice {slice_index} is down; {what} placed data on it"


def no_slice_up_message(slices: Iterable[int]) -> str:
    down = ", ".join(map(str, slices))
    return (
        f"no slice is up (slices {down} are down), so nothing can run (DATA_LOSS); bring one back with "
        "%pathways repair N (pw.repair_slice(N)) and run this again"
    )


@dataclasses.dataclass(frozen=True)
class FaultReport(TextDisplay):
    """What one ``fail_slice``/``repair_slice`` did."""

    slice_index: int
    action: str  # "fail" | "repair"
    changed: bool
    arrays: int = 0
    nbytes: int = 0
    slices_up: tuple[int, ...] = ()

    def to_text(self) -> str:
        up = "[" + ",".join(map(str, self.slices_up)) + "]"
        if self.action == "fail":
            if not self.changed:
                return f"slice {self.slice_index} is already down; live slices {up}"
            return (
                f"slice {self.slice_index} down: lost {count(self.arrays, 'array')} ({format_bytes(self.nbytes)}) with a "
                f"shard on it (DATA_LOSS); live slices {up}"
            )
        if not self.changed:
            return f"slice {self.slice_index} is already up; live slices {up}"
        return f"slice {self.slice_index} up again (empty: lost arrays stay lost); live slices {up}"
