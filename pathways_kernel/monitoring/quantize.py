"""Per-chip values as one byte each: how metrics travel and how history keeps them.

Utilization is ``round(fraction * 255)``; memory is a count of a power-of-two
unit of bytes, chosen per frame (or per history) so the largest value fits,
255 meaning "at least this much".
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

MEMORY_SATURATED = 255
_U8 = np.dtype(np.uint8)


def quantize_utilization(fraction: npt.ArrayLike) -> npt.NDArray[np.uint8]:
    """Fractions in [0, 1] (clipped; NaN -> 0) to uint8 ``round(f * 255)``."""
    f = np.nan_to_num(np.asarray(fraction, np.float32), nan=0.0, posinf=1.0, neginf=0.0)
    # numpy types its ufuncs' (np.rint's) results as Any.
    quantized: npt.NDArray[np.uint8] = np.rint(np.clip(f, 0.0, 1.0) * 255.0).astype(_U8)
    return quantized


def memory_unit_for(max_bytes: int) -> int:
    """Smallest power of two so that ``max_bytes`` fits in 254 units."""
    unit = 1
    while max_bytes > (MEMORY_SATURATED - 1) * unit:
        unit *= 2
    return unit


def quantize_memory(nbytes: npt.ArrayLike, unit: int) -> npt.NDArray[np.uint8]:
    """Bytes to uint8 units of ``unit`` bytes (round to nearest, saturating at 255)."""
    units = np.rint(np.asarray(nbytes, np.float64) / unit)
    return np.clip(units, 0, MEMORY_SATURATED).astype(_U8)
