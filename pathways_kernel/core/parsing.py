"""Numbers and lists a user types: one place that checks them.

``int()`` and ``float()`` also take other scripts' digits (``int("١")`` is 1,
``int("１")`` is 1) and underscores (``"1_0"`` is 10), so a slice typed in
Arabic-Indic digits would name slice 1. Every magic option, slice list and
mesh shape goes through here: ASCII digits only, each failure a ``ValueError``
whose message is the one line the caller shows.
"""

from __future__ import annotations

import math
import re

from pathways_kernel.core.text import shown

#: Largest whole number taken: steps and counts end up in int64 fields.
MAX_INT = 2**63 - 1
MIN_INT = -(2**63)

_WHOLE = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[+-]?(inf|infinity|nan)", re.IGNORECASE)


def whole_number(text: str, minimum: int = MIN_INT, maximum: int = MAX_INT) -> int:
    """``text`` as an int in ``[minimum, maximum]``, written in ASCII digits.

    Raises:
      ValueError: not a whole number, or out of range (the message says which).
    """
    digits = text.strip()
    if not _WHOLE.fullmatch(digits):
        raise ValueError(f"expected a whole number (digits 0-9), got {shown(text)}")
    # int() of thousands of digits is slow or refused; such a number is out of range anyway.
    if len(digits.lstrip("+-").lstrip("0")) > len(str(MAX_INT)):
        bound = f"at least {minimum}" if digits.startswith("-") else f"at most {maximum}"
        raise ValueError(f"must be {bound}, got {shown(text)}")
    value = int(digits)
    if value < minimum:
        raise ValueError(f"must be at least {minimum}, got {value}")
    if value > maximum:
        raise ValueError(f"must be at most {maximum}, got {value}")
    return value


def number(text: str) -> float:
    """``text`` as a float, written in ASCII (``inf`` and ``nan`` included: callers check ranges).

    Raises:
      ValueError: not a number.
    """
    if not _NUMBER.fullmatch(text.strip()):
        raise ValueError(f"expected a number (digits 0-9), got {shown(text)}")
    return float(text)


def finite_number(text: str) -> float:
    """``number(text)``, refusing ``inf`` and ``nan``."""
    value = number(text)
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {shown(text)}")
    return value


def index_list(text: str, what: str = "slice") -> tuple[int, ...]:
    """``"0,1"`` -> ``(0, 1)``: comma-separated indices from 0, none empty, none twice.

    Raises:
      ValueError: an empty item, an item that is not a whole number, or an index given twice.
    """
    indices: list[int] = []
    for part in text.split(","):
        if not part.strip():
            raise ValueError(f"an empty {what} index in {shown(text)}: give comma-separated indices, e.g. 0,1")
        index = whole_number(part, 0)
        if index in indices:
            raise ValueError(f"{what} {index} is given twice in {shown(text)}")
        indices.append(index)
    return tuple(indices)
