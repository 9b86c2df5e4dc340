"""Counts in messages: "1 recovery", "2 recoveries"."""

from __future__ import annotations

#: Plurals that are not the singular plus "s".
_IRREGULAR = {"recovery": "recoveries"}


def plural(word: str, n: int) -> str:
    """``word`` as it goes with ``n`` of it."""
    return word if n == 1 else _IRREGULAR.get(word, word + "s")


def count(n: int, word: str) -> str:
    """``n`` and ``word`` agreeing: ``count(1, "scale-up") == "1 scale-up"``."""
    return f"{n} {plural(word, n)}"
