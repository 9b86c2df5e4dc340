"""The Pathways proxy backend (its own issue): refuses clearly until built."""

from __future__ import annotations

from pathways_kernel.errors import NotSupportedError


class ProxyBackend:
    @classmethod
    def from_spec(cls, spec: str):
        raise NotSupportedError(f"the Pathways proxy backend is not available in this build; cannot connect to {spec}")
