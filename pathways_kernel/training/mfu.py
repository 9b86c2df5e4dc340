"""MFU: a step's FLOPs from its compiled ``cost_analysis()``, and the peak per chip
(``PEAK_BF16_FLOPS`` for TPUs; on the embedded backend a matmul measured once)."""

from __future__ import annotations

import collections
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from pathways_kernel.core import runs, tpu_kinds
from pathways_kernel.core.errors import PathwaysError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pathways_kernel.core.sessions import Session

#: Peak dense bf16 FLOP/s per chip by ``device.device_kind``, from Google Cloud's TPU pages
#: (``core/tpu_kinds.py``, the table in docs/backends.md): v5e 197 TFLOP/s, v5p 459,
#: v6e (Trillium) 918, TPU7x (Ironwood) 2307 (4614 at fp8).
PEAK_BF16_FLOPS = tpu_kinds.PEAK_BF16_FLOPS


# -- MFU ---------------------------------------------------------------------
def flops(fn: Any, *args: Any, **kwargs: Any) -> float:
    """FLOPs of one call of the jitted ``fn`` on these arguments, from its
    compiled ``cost_analysis()``; also the FLOPs per step of the run in
    progress on this thread, for its MFU."""
    if not hasattr(fn, "lower"):
        raise PathwaysError(f"pw.flops needs a jax.jit-ed function (one with .lower), got {type(fn).__name__}")
    analysis = fn.lower(*args, **kwargs).compile().cost_analysis()
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else {}
    value = float((analysis or {}).get("flops", 0.0))
    if value <= 0:
        raise PathwaysError(
            "the compiled step reports no FLOPs (cost_analysis has none on this backend): MFU is unknown"
        )
    account = runs.current()  # the thread's run (training.goodput.Account)
    if account is not None:
        account.flops_per_step = value
    return value


def peak_flops_per_chip(session: Session, devices: Sequence[Any] | None = None) -> tuple[float, str]:
    """Peak FLOP/s of one chip and where the figure comes from: with slices of several kinds,
    the mean over the chips of each kind's peak (so that chip-seconds x it is their sum).
    ``devices``: the chips a run uses (default the live ones)."""
    devices = devices or session.live_devices() or session.devices()
    kinds = collections.Counter(str(d.device_kind) for d in devices)
    if kinds and all(kind in PEAK_BF16_FLOPS for kind in kinds):
        if len(kinds) == 1:
            kind = next(iter(kinds))
            return PEAK_BF16_FLOPS[kind], f"{kind} bf16 peak (Google Cloud TPU docs)"
        total = sum(PEAK_BF16_FLOPS[kind] * n for kind, n in kinds.items())
        each = ", ".join(f"{n} {kind} at {PEAK_BF16_FLOPS[kind] / 1e12:g}" for kind, n in kinds.items())
        return total / len(devices), f"bf16 peaks by kind: {each} TFLOP/s (Google Cloud TPU docs)"
    measured = session.component(_MeasuredPeak)
    return measured.flops, measured.how


class _MeasuredPeak:
    """Per-device FLOP/s of a batched f32 matmul run on every device at once, measured once per session."""

    def __init__(self, session: Session):
        self.flops, self.how = _measure_peak(session)


def _measure_peak(session: Session, size: int = 768, reps: int = 3) -> tuple[float, str]:
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = session.live_devices() or session.devices()
    sharding = NamedSharding(Mesh(np.array(devices), ("d",)), P("d"))
    a = jax.device_put(np.ones((len(devices), size, size), np.float32), sharding)
    matmul = jax.jit(lambda x: jnp.einsum("bij,bjk->bik", x, x), out_shardings=sharding)
    matmul(a).block_until_ready()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        matmul(a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    peak = 2 * size**3 / best
    return peak, f"measured: f32 {size}x{size} matmul on all {len(devices)} {devices[0].platform} devices at once"
