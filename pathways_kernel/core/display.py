"""How our result objects show themselves: ``to_text()`` everywhere text is wanted.

Subclasses define ``to_text()`` (and ``_repr_html_`` where a notebook should get
a richer view); ``str()`` and IPython's plain-text display both use it.
"""

from __future__ import annotations

from typing import Any


class TextDisplay:
    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # IPython's printer prefers a class's own __repr__ (dataclasses write
        # one) to an inherited _repr_pretty_, so each subclass gets its own.
        cls._repr_pretty_ = TextDisplay._repr_pretty_  # type: ignore[method-assign]

    def to_text(self) -> str:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.to_text()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.to_text())
