"""Counts in messages: "1 recovery", "2 recoveries", "1 array", "3 slice losses"."""

from __future__ import annotations


def plural(word: str, n: int) -> str:
    """``word`` (a noun, or a phrase ending in one) as it goes with ``n`` of it."""
    if n == 1:
        return word
    if word.endswith(("s", "x", "ch", "sh")):
        return word + "es"
    if word.endswith("y") and word[-2:-1] not in ("a", "e", "i", "o", "u"):
        return word[:-1] + "ies"
    return word + "s"


def count(n: int, word: str) -> str:
    """``n`` and ``word`` agreeing: ``count(1, "scale-up") == "1 scale-up"``."""
    return f"{n} {plural(word, n)}"


def shown(text: str, limit: int = 40) -> str:
    """``text`` quoted for a one-line message: non-ASCII and control characters
    escaped (so ``'\\u0661'`` shows as what it is, not as a 1), cut when long."""
    cut = text if len(text) <= limit else text[:limit] + "..."
    return "'" + cut.encode("unicode_escape").decode("ascii") + "'"
