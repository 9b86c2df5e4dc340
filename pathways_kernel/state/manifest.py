"""The durable snapshot format: the manifest (written last; a snapshot exists once it
does), the JSON of tree paths and PartitionSpecs, and the checks a manifest read
back must pass before anything is built from it. ``storage.py`` writes and reads it;
checkpoints store their layout with the same JSON.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from pathways_kernel.core.errors import StorageError
from pathways_kernel.core.eventlog import format_bytes
from pathways_kernel.core.locations import Location

if TYPE_CHECKING:
    from jax.sharding import PartitionSpec

#: A PartitionSpec as JSON: per dimension, no axis, one axis name or a list of them.
SpecJson: TypeAlias = list[str | list[str] | None]

FORMAT = "pathways-snapshot/1"
MANIFEST = "manifest.json"


# -- manifests ----------------------------------------------------------------
def spec_to_json(spec: PartitionSpec | None) -> SpecJson | None:
    if spec is None:
        return None
    return [None if e is None else e if isinstance(e, str) else list(e) for e in tuple(spec)]


def spec_from_json(entries: SpecJson | None) -> PartitionSpec | None:
    from jax.sharding import PartitionSpec

    if entries is None:
        return None
    return PartitionSpec(*(None if e is None else e if isinstance(e, str) else tuple(e) for e in entries))


def keys_to_json(path: Sequence[Any]) -> list[list[Any]]:
    from jax import tree_util as tu

    out = []
    for key in path:
        if isinstance(key, tu.DictKey):
            k = key.key
            out.append(["dict", k if isinstance(k, (str, int)) else str(k)])
        elif isinstance(key, tu.SequenceKey):
            out.append(["seq", key.idx])
        elif isinstance(key, tu.GetAttrKey):
            out.append(["attr", key.name])
        elif isinstance(key, tu.FlattenedIndexKey):
            out.append(["seq", key.key])
        else:
            out.append(["dict", str(key)])
    return out


def _tree_from_keys(keys: list[list[list[Any]]], values: list[Any]) -> Any:
    """Rebuild nested dicts/lists from leaf key paths (attributes become dict keys)."""
    if len(keys) == 1 and not keys[0]:
        return values[0]
    root: Any = None

    def container(kind: str) -> Any:
        return [] if kind == "seq" else {}

    for path, value in zip(keys, values, strict=True):
        if root is None:
            root = container(path[0][0])
        node = root
        for depth, (_kind, k) in enumerate(path):
            last = depth == len(path) - 1
            child = value if last else container(path[depth + 1][0])
            if isinstance(node, list):
                while len(node) <= k:
                    node.append(None)
                if node[k] is None:
                    node[k] = child
                node = node[k]
            else:
                node = node.setdefault(k, child)
    return root


def tree_from_stored_keys(keys: list[Any], values: list[Any], where: str) -> Any:
    """``_tree_from_keys`` for key paths read back from storage (``where`` names it).

    Raises:
      StorageError: the paths do not form one tree holding every value once
        (a list under a dict key, a leaf that is also a parent, a duplicate).
    """
    import jax

    try:
        tree = _tree_from_keys(keys, values)
    except (AttributeError, TypeError, IndexError, KeyError, ValueError):
        tree = None
    if values and (tree is None or len(jax.tree_util.tree_leaves(tree)) != len(values)):
        raise StorageError(f"{where} is damaged: its leaves' key paths do not form one tree; restore another one")
    return tree


@dataclasses.dataclass(frozen=True)
class SnapshotInfo:
    """A committed snapshot as its manifest describes it."""

    id: str
    url: str
    name: str
    step: int | None
    created: float
    committed: float
    nbytes: int
    leaves: int
    manifest: dict[str, Any] = dataclasses.field(repr=False, compare=False)

    def summary(self) -> str:
        step = "" if self.step is None else f"  step {self.step}"
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.created))
        return f"{self.id:<24} {format_bytes(self.nbytes):>10}  {self.leaves:>4} arrays  {when}{step}  {self.url}"


class SnapshotList(list[SnapshotInfo]):
    """Committed snapshots under a prefix, oldest first; renders as a table."""

    def __init__(self, url: str, infos: Sequence[SnapshotInfo]):
        super().__init__(infos)
        self.url = url

    def __repr__(self) -> str:
        if not self:
            return f"no committed snapshots under {self.url}"
        return "\n".join(info.summary() for info in self)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))

    def _repr_html_(self) -> str:
        import html

        if not self:
            return f"<i>no committed snapshots under {html.escape(self.url)}</i>"
        head = "".join(f"<th>{h}</th>" for h in ("id", "name", "step", "size", "arrays", "created", "url"))
        rows = "".join(
            "<tr>"
            + "".join(
                f"<td>{html.escape(str(c))}</td>"
                for c in (
                    i.id,
                    i.name,
                    "" if i.step is None else i.step,
                    format_bytes(i.nbytes),
                    i.leaves,
                    time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(i.created)),
                    i.url,
                )
            )
            + "</tr>"
            for i in self
        )
        return f'<table class="pathways-snapshots"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'


def snapshot_info(location: Location, manifest: dict[str, Any]) -> SnapshotInfo:
    return SnapshotInfo(
        id=manifest["id"],
        url=location.url,
        name=manifest["name"],
        step=manifest.get("step"),
        created=manifest["created"],
        committed=manifest["committed"],
        nbytes=manifest["nbytes"],
        leaves=len(manifest["leaves"]),
        manifest=manifest,
    )


def parse_manifest(data: bytes | None, check: bool = True) -> dict[str, Any] | None:
    """A manifest dict, or ``None`` for bytes that are not a complete manifest
    (with ``check``: nor one a restore can trust, see ``valid_manifest``)."""
    if data is None:
        return None
    try:
        manifest = json.loads(data)
    except ValueError:
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or "leaves" not in manifest:
        return None
    return manifest if not check or valid_manifest(manifest) else None


def valid_manifest(manifest: dict[str, Any]) -> bool:
    """Whether a manifest read back from storage only names what a restore may read and build.

    It comes from a bucket or directory that others can write: its data keys
    must stay under this snapshot's ``data.TOKEN/`` (no ``../``), its dtypes
    must be plain numbers (an ``object`` view of raw bytes would be pointers),
    its shapes must match its byte counts, and its key paths must not make
    the rebuilt tree huge (a list index of 10**12).
    """
    try:
        token, leaves = manifest["token"], manifest["leaves"]
        if not (isinstance(token, str) and re.fullmatch(r"[0-9a-f]{1,64}", token) and isinstance(leaves, list)):
            return False
        if not (isinstance(manifest["id"], str) and isinstance(manifest["name"], str) and _count(manifest["nbytes"])):
            return False
        if not all(isinstance(manifest[k], (int, float)) for k in ("created", "committed")):
            return False
        return all(_valid_leaf(entry, token, len(leaves)) for entry in leaves)
    except (KeyError, TypeError):
        return False


def _valid_leaf(entry: Any, token: str, count: int) -> bool:
    if not (isinstance(entry, dict) and valid_keys(entry["keys"], count) and valid_spec(entry["spec"])):
        return False
    if not (valid_mesh_axes(entry["mesh_axes"]) and isinstance(entry["objects"], list)):
        return False
    if entry["dtype"] is None:
        return entry["array"] is None and isinstance(entry.get("value"), (type(None), bool, int, float, str))
    dtype = valid_dtype(entry["dtype"])
    shape = entry["shape"]
    if dtype is None or not (isinstance(shape, list) and all(_count(d) for d in shape)) or not _count(entry["nbytes"]):
        return False
    if int(np.prod(shape, dtype=object)) * dtype.itemsize != entry["nbytes"]:
        return False
    array = entry["array"]
    return array is None or (isinstance(array, str) and re.fullmatch(rf"data\.{token}/[0-9]{{4,9}}", array) is not None)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def valid_keys(keys: Any, count: int) -> bool:
    """Key paths as ``keys_to_json`` writes them, with list indices below ``count`` (the leaf count)."""
    if not isinstance(keys, list):
        return False
    for pair in keys:
        if not (isinstance(pair, list) and len(pair) == 2):
            return False
        kind, key = pair
        if kind == "seq":
            if not (_count(key) and key < count):
                return False
        elif kind not in ("dict", "attr") or not isinstance(key, (str, int)) or isinstance(key, bool):
            return False
    return True


def valid_dtype(name: Any) -> np.dtype | None:
    """The numpy dtype a manifest names, if it is a plain number type (numpy's or ml_dtypes')."""
    import jax.numpy as jnp

    if not isinstance(name, str):
        return None
    try:
        dtype = np.dtype(jnp.dtype(name))
    except (TypeError, ValueError):
        return None
    return dtype if dtype.kind in "biufcV" and not dtype.hasobject and dtype.fields is None and dtype.itemsize else None


def valid_spec(entries: Any) -> bool:
    """A PartitionSpec as ``spec_to_json`` writes it (or ``None``)."""
    if entries is None:
        return True
    return isinstance(entries, list) and all(
        e is None or isinstance(e, str) or (isinstance(e, list) and all(isinstance(a, str) for a in e)) for e in entries
    )


def valid_mesh_axes(axes: Any) -> bool:
    return isinstance(axes, list) and all(
        isinstance(a, list) and len(a) == 2 and isinstance(a[0], str) and _count(a[1]) for a in axes
    )
