"""Durable snapshots: host snapshots persisted to Cloud Storage or a local path.

This module persists, lists and loads them; where they live is ``core/locations.py``,
how failures read ``core/storage_errors.py``, the object operations
``core/objectstore.py`` and the manifest format ``state/manifest.py``.

Layout under a prefix (``gs://BUCKET/PREFIX`` or a directory)::

    PREFIX/ID/manifest.json                 written last, only if absent
    PREFIX/ID/data.TOKEN/LLLL/zarr.json     leaf L: its bytes as a 1-D uint8 zarr3 array,
    PREFIX/ID/data.TOKEN/LLLL/c/N           8 MiB per chunk object, each with a CRC32C

A snapshot exists once its manifest does. The manifest (checksums, sizes,
dtypes, shapes, PartitionSpecs, object generations) is written last with
``if_generation_match=0`` (locally: a hard link, which fails if the name is
taken), so a crash or an outage mid-upload leaves only unreferenced data
objects: never a listed or restorable partial snapshot, and never an
overwritten one. Data objects carry a per-upload token so that two uploads of
the same id cannot touch each other's bytes; the loser of the manifest race
is refused as a duplicate.

Bulk bytes go through tensorstore (zarr3 arrays written straight from the
host arrays by its C++ threads, which do not hold the GIL: upload threads
in Python stalled the notebook for up to 0.9 s); manifests and listings through google-cloud-storage. The
manifest records every data object's size, CRC32C and generation as the
server reported them after the upload. Restore reads the manifest, checks
that the data fits in host memory and that every object is still there and
unchanged, reads the chunks (tensorstore verifies each chunk's own CRC32C)
and hands a host ``Snapshot`` to ``snapshots.restore`` for the mesh.

Pointing at an emulator: ``STORAGE_EMULATOR_HOST=http://HOST:PORT`` is enough;
the tensorstore and gcsfs settings are derived from it (``emulator_env``).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from pathways_kernel.core.errors import StorageError, one_line
from pathways_kernel.core.eventlog import EventLog, format_bytes
from pathways_kernel.core.locations import Location, check_id, parse_url
from pathways_kernel.core.objectstore import ObjectStore, objects_for, tensorstore_context
from pathways_kernel.core.sessions import session
from pathways_kernel.core.storage_errors import errors_as
from pathways_kernel.state import snapshots, transfers
from pathways_kernel.state.manifest import (
    FORMAT,
    MANIFEST,
    SnapshotInfo,
    SnapshotList,
    keys_to_json,
    parse_manifest,
    snapshot_info,
    spec_from_json,
    spec_to_json,
    tree_from_stored_keys,
)
from pathways_kernel.state.snapshots import Snapshot
from pathways_kernel.state.transfers import Transfer

if TYPE_CHECKING:
    from jax.sharding import Mesh

#: Size of each data object: large enough for full-speed uploads, small
#: enough for a smooth progress bar and cheap retries.
CHUNK_BYTES = 8 << 20


# -- persist ------------------------------------------------------------------
def default_id(snapshot: Any) -> str:
    return snapshot.name if snapshot.step is None else f"{snapshot.name}-step{snapshot.step}"


def _leaf_array(leaf: Any) -> tuple[np.ndarray | None, Any]:
    """(contiguous array, None) for an array leaf, (None, value) for a plain scalar/string."""
    host = leaf.host
    if not getattr(leaf, "on_device", True) and not isinstance(host, np.ndarray):
        if host is None or isinstance(host, (bool, int, float, str)):
            return None, host
        try:
            host = np.asarray(host)
        except Exception:
            host = None
        if host is None or host.dtype == object:
            raise StorageError(
                f"cannot persist leaf {leaf.path or '(root)'}: a {type(leaf.host).__name__} is neither an array "
                "nor a number/string; persist arrays only"
            )
    array = np.asarray(host)
    if not array.flags.c_contiguous:
        array = array.copy(order="C")  # not np.ascontiguousarray: it turns scalars into shape (1,)
    if array.dtype == object:
        raise StorageError(
            f"cannot persist leaf {leaf.path or '(root)'}: object arrays cannot be stored; persist numeric arrays"
        )
    return array, None


def persist(
    snapshot: Any,
    url: str,
    snapshot_id: str | None = None,
    *,
    name: str | None = None,
    step: int | None = None,
    events: EventLog | None = None,
    check_timeout: float = 5.0,
) -> Transfer:
    """Upload a host snapshot under ``url``; returns a running ``Transfer``.

    ``snapshot`` is a ``Snapshot`` (pending ones are waited for on the
    storage executor, not here) or a pytree of arrays, which is snapshotted
    first (``name``, ``step``). The id defaults to ``NAME`` or
    ``NAME-stepN``.

    The data objects go first, the manifest last and only if no snapshot
    ``url/ID`` exists yet. Returns once the quick checks passed (URL, bucket,
    duplicate id; at most ``check_timeout`` s); the upload continues on the
    storage executor. ``Transfer.wait()`` returns the committed
    ``SnapshotInfo`` or raises ``StorageError``.

    Raises:
      StorageError: malformed URL or id, missing bucket, permission denied,
        duplicate id, unreachable server (when found within ``check_timeout``).
    """
    location = parse_url(url)
    if not isinstance(snapshot, snapshots.Snapshot):
        snapshot = snapshots.snapshot(snapshot, name, step)
    snapshot_id = check_id(snapshot_id or default_id(snapshot))
    target = location.child(snapshot_id)
    transfer = Transfer("persist", f"'{snapshot_id}' -> {target.url}", int(snapshot.nbytes), _events(events))
    transfer.start(lambda t: _persist(t, snapshot, location, snapshot_id))
    transfer.wait_checked(check_timeout)
    return transfer


def _persist(transfer: Transfer, snapshot: Any, location: Location, snapshot_id: str) -> SnapshotInfo:
    target = location.child(snapshot_id)
    with errors_as("persist", target):
        return _upload(transfer, snapshot, location, target, snapshot_id)


def _upload(transfer: Transfer, snapshot: Any, location: Location, target: Location, snapshot_id: str) -> SnapshotInfo:
    objects = objects_for(location)
    objects.check(location)
    if parse_manifest(objects.read(target.key(MANIFEST))) is not None:
        raise StorageError(
            f"snapshot {target.url} already exists; snapshots are never overwritten: choose another id (or name/step)"
        )
    transfer.checked()
    try:
        snapshot.wait()
    except Exception as exc:  # e.g. DATA_LOSS: a slice was lost before its bytes reached the host
        raise StorageError(
            f"persist {target.url} failed: snapshot '{snapshot.name}' never reached host memory ({one_line(exc)})"
        ) from exc
    transfer.total = snapshot.nbytes
    token = secrets.token_hex(8)
    made = objects.missing_dirs(target)
    data = target.key(f"data.{token}") + "/"
    try:
        # Readable by this user alone (a snapshot holds the notebook's arrays): made first, so that
        # nothing is reachable while tensorstore writes its files with the umask's modes.
        objects.make_private_dirs(target)
        manifest = _write_data(transfer, snapshot, objects, target, snapshot_id, token)
    except BaseException:
        # Nothing will ever refer to these bytes, and a full disk would stay full.
        objects.discard(data, made)
        raise
    body = json.dumps(manifest, indent=1).encode()
    try:
        generation = objects.create(target.key(MANIFEST), body)
    except FileExistsError:
        existing = parse_manifest(objects.read(target.key(MANIFEST)))
        # Our own earlier attempt whose reply was lost counts as success.
        if existing is None or existing.get("token") != token:
            objects.discard(data, made)
            raise StorageError(
                f"snapshot {target.url} already exists (written meanwhile by someone else); snapshots are never overwritten"
            ) from None
        generation = None
    except BaseException:
        # link(2) either made the manifest or not; a bucket may have committed it before the reply was lost.
        if location.scheme == "file":
            objects.discard(data, made)
        raise
    objects.make_private(target)
    manifest["manifest_generation"] = generation
    return snapshot_info(target, manifest)


def _write_data(
    transfer: Transfer, snapshot: Any, objects: ObjectStore, target: Location, snapshot_id: str, token: str
) -> dict[str, Any]:
    """Upload every leaf's bytes under ``data.TOKEN``; returns the manifest that will describe them."""
    import jax

    data_dir = f"data.{token}"
    paths = _leaf_key_paths(snapshot)
    context = tensorstore_context()
    leaves, arrays = [], []
    for index, leaf in enumerate(snapshot.leaves):
        array, value = _leaf_array(leaf)
        entry: dict[str, Any] = {
            "path": leaf.path,
            "keys": paths[index],
            "on_device": bool(getattr(leaf, "on_device", True)),
            "spec": spec_to_json(leaf.spec),
            "mesh_axes": [list(a) for a in leaf.mesh_axes],
        }
        leaves.append(entry)
        if array is None:
            entry.update(value=value, shape=None, dtype=None, nbytes=0, array=None, objects=[])
            continue
        flat = array.reshape(-1).view(np.uint8)
        entry.update(shape=list(array.shape), dtype=array.dtype.name, nbytes=int(flat.size), objects=[])
        if not flat.size:
            entry["array"] = None
            continue
        entry["array"] = f"{data_dir}/{index:04d}"
        arrays.append((_open_array(objects, target, entry["array"], flat.size, context, create=True), flat))
    # Every array is created before any chunk is sent: a create queued behind
    # another leaf's chunks would leave the connections idle meanwhile.
    pending = []
    try:
        for opening, flat in arrays:
            stored = opening.result()
            # One write per chunk: tensorstore copies and uploads from its own threads, without the GIL.
            for start in range(0, flat.size, CHUNK_BYTES):
                end = min(start + CHUNK_BYTES, flat.size)
                pending.append((stored[start:end].write(flat[start:end]), end - start))
        for future, size in pending:
            future.result()
            transfer.advance(size)
    except Exception:
        # Writes still in flight would recreate what the caller is about to discard: let them end first.
        for future in [opening for opening, _ in arrays] + [future for future, _ in pending]:
            with contextlib.suppress(Exception):
                future.result()
        raise
    # What the server holds now is what the manifest will promise: names, sizes, CRC32Cs, generations.
    listed = objects.list(target.key(data_dir) + "/")
    prefix = target.key("")
    for entry in leaves:
        if entry["array"]:
            entry["objects"] = [
                {"name": name[len(prefix) :], **meta}
                for name, meta in sorted(listed.items())
                if name[len(prefix) :].startswith(entry["array"] + "/")
            ]
            if len(entry["objects"]) < 2:  # zarr.json and at least one chunk
                raise StorageError(f"persist {target.url} failed: the data of {entry['path']} did not arrive; retry")
    return {
        "format": FORMAT,
        "id": snapshot_id,
        "token": token,
        "name": snapshot.name,
        "step": snapshot.step,
        "created": snapshot.created,
        "committed": time.time(),
        "nbytes": int(snapshot.nbytes),
        "chunk_bytes": CHUNK_BYTES,
        "jax": jax.__version__,
        "leaves": leaves,
    }


def _open_array(objects: ObjectStore, target: Location, key: str, nbytes: int, context: Any, create: bool) -> Any:
    """Open (a future of) one leaf's bytes as a 1-D uint8 zarr3 array: CHUNK_BYTES per object, each with a CRC32C."""
    import tensorstore as ts

    kvstore = objects.kvstore(target)
    spec: dict[str, Any] = {"driver": "zarr3", "kvstore": {**kvstore, "path": kvstore["path"] + key + "/"}}
    if create:
        # Chunks that equal the fill value (all-zero leaves) are stored too: the manifest lists every object.
        spec.update(
            create=True,
            store_data_equal_to_fill_value=True,
            metadata={
                "shape": [nbytes],
                "data_type": "uint8",
                "fill_value": 0,
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [min(CHUNK_BYTES, nbytes)]}},
                # Tensorstore checks each chunk's CRC32C when it reads it back.
                "codecs": [{"name": "bytes"}, {"name": "crc32c"}],
            },
        )
    else:
        spec["open"] = True
    return ts.open(spec, context=context)


def _leaf_key_paths(snapshot: Any) -> list[list[list[Any]]]:
    import jax

    indices = jax.tree_util.tree_unflatten(snapshot.treedef, list(range(len(snapshot.leaves))))
    pairs = jax.tree_util.tree_flatten_with_path(indices)[0]
    out: list[Any] = [None] * len(snapshot.leaves)
    for path, index in pairs:
        out[index] = keys_to_json(path)
    return out


# -- list ---------------------------------------------------------------------
def list_snapshots(url: str) -> SnapshotList:
    """Committed snapshots directly under ``url``, oldest first.

    Only ids with a complete manifest are listed: interrupted uploads leave
    data objects that nothing refers to, and they never show up here.
    """
    location = parse_url(url)
    infos = []
    with errors_as("listing", location):
        objects = objects_for(location)
        objects.check(location, write=False)
        base = location.key("") if location.path else ""
        for key in sorted(objects.list(base)):
            rest = key[len(base) :]
            parts = rest.split("/")
            if len(parts) == 2 and parts[1] == MANIFEST:
                manifest = parse_manifest(objects.read(key))
                if manifest is not None:
                    infos.append(snapshot_info(location.child(parts[0]), manifest))
    return SnapshotList(location.url, sorted(infos, key=lambda i: (i.created, i.committed)))


# -- load & restore -----------------------------------------------------------
def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _resolve(location: Location, objects: ObjectStore) -> tuple[Location, dict[str, Any]]:
    """The snapshot ``location`` names, or the newest committed one under it."""
    data = objects.read(location.key(MANIFEST))
    manifest = parse_manifest(data)
    if manifest is not None:
        return location, manifest
    if parse_manifest(data, check=False) is not None:
        raise StorageError(
            f"snapshot {location.url} is damaged: its manifest names data outside the snapshot, non-numeric dtypes "
            "or shapes that do not match its sizes; restore another snapshot"
        )
    found = list_snapshots(location.url)
    if not found:
        raise StorageError(
            f"no committed snapshot at {location.url}: persist one first, or list them with %pathways snapshots list"
        )
    newest = found[-1]
    return parse_url(newest.url), newest.manifest


def read_info(url: str) -> SnapshotInfo:
    location = parse_url(url)
    with errors_as("reading", location):
        target, manifest = _resolve(location, objects_for(location))
    return snapshot_info(target, manifest)


def load(url: str, events: EventLog | None = None, memory_limit: int | None = None, like: Any = None) -> Any:
    """Download a committed snapshot into host memory; returns a done ``Snapshot``.

    ``url`` names a snapshot (``PREFIX/ID``) or a prefix (its newest
    snapshot). Every chunk is checked against its manifest CRC32C. The tree
    is rebuilt as nested dicts and lists from the leaves' key paths, or with
    the structure of ``like`` when given.

    Raises:
      StorageError: nothing committed there, the data does not fit in host
        memory, a chunk is missing or corrupt, the server is unreachable.
    """
    location = parse_url(url)
    with errors_as("restore", location):
        objects = objects_for(location)
        target, manifest = _resolve(location, objects)
    # A manifest states its total, but the leaves are what gets allocated.
    nbytes = max(manifest["nbytes"], sum(entry["nbytes"] for entry in manifest["leaves"]))
    limit = _available_memory() if memory_limit is None else memory_limit
    if nbytes > limit:
        raise StorageError(
            f"snapshot {target.url} needs {format_bytes(nbytes)} of host memory but only {format_bytes(limit)} is available; "
            "restore it on a machine with more memory or free some first"
        )
    treedef = None
    if like is not None:
        import jax

        treedef = jax.tree_util.tree_structure(like)
        # jaxlib ships no stubs, so mypy cannot see PyTreeDef's attributes.
        like_leaves = treedef.num_leaves  # type: ignore[attr-defined]
        if like_leaves != len(manifest["leaves"]):
            raise StorageError(
                f"snapshot {target.url} has {len(manifest['leaves'])} leaves but `like` has {like_leaves}"
            )
    return transfers.run_sync(
        "restore", f"{target.url}", lambda t: _download(t, objects, target, manifest, treedef), events, total=nbytes
    )


def _download(
    transfer: Transfer, objects: ObjectStore, target: Location, manifest: dict[str, Any], treedef: Any
) -> Any:
    import jax
    import jax.numpy as jnp

    transfer.checked()
    with errors_as("restore", target):
        _verify_objects(objects, target, manifest)
        context = tensorstore_context()
        values: list[Any] = []
        pending = []
        for index, entry in enumerate(manifest["leaves"]):
            if entry["dtype"] is None:
                values.append(entry["value"])
                continue
            dtype = np.dtype(jnp.dtype(entry["dtype"]))
            if not entry["array"]:
                values.append(np.zeros(entry["shape"], dtype))
                continue
            stored = _open_array(objects, target, entry["array"], entry["nbytes"], context, create=False).result()
            if stored.shape != (entry["nbytes"],):
                raise StorageError(
                    f"snapshot {target.url} is damaged: {entry['path']} holds {stored.shape[0]} of {entry['nbytes']} bytes"
                )
            pending.append((index, stored.read(), dtype))
            values.append(None)
        for index, future, dtype in pending:
            entry = manifest["leaves"][index]
            values[index] = future.result().view(dtype).reshape(entry["shape"])
            transfer.advance(entry["nbytes"])
    specs = [spec_from_json(e["spec"]) for e in manifest["leaves"]]
    if treedef is None:
        tree = tree_from_stored_keys(
            [e["keys"] for e in manifest["leaves"]], list(range(len(values))), f"snapshot {target.url}"
        )
        treedef = jax.tree_util.tree_structure(tree)
        order = jax.tree_util.tree_leaves(tree)  # manifest leaf index, in the rebuilt tree's order
    else:
        order = list(range(len(values)))
    mesh_axes = next((tuple(tuple(a) for a in e["mesh_axes"]) for e in manifest["leaves"] if e["mesh_axes"]), ())
    snap = Snapshot.from_host(
        jax.tree_util.tree_unflatten(treedef, [values[i] for i in order]),
        [specs[i] for i in order],
        mesh_axes,
        manifest["name"],
        manifest.get("step"),
        manifest["created"],
    )
    for leaf, i in zip(snap.leaves, order, strict=True):
        entry = manifest["leaves"][i]
        leaf.path = entry["path"]
        if not entry.get("on_device", True):
            leaf.on_device = False
            leaf.host = values[i]
    return snap


def _verify_objects(objects: ObjectStore, target: Location, manifest: dict[str, Any]) -> None:
    """Every object the manifest names is there, unchanged since the commit."""
    listed = objects.list(target.key(f"data.{manifest['token']}") + "/")
    for entry in manifest["leaves"]:
        for obj in entry["objects"]:
            meta = listed.get(target.key(obj["name"]))
            if meta is None:
                raise StorageError(f"snapshot {target.url} is damaged: object {obj['name']} is missing")
            for field in ("size", "crc32c", "generation"):
                if obj.get(field) is not None and meta[field] != obj[field]:
                    raise StorageError(
                        f"snapshot {target.url} is damaged: object {obj['name']} changed since the commit ({field}); "
                        "restore another snapshot"
                    )


def restore(
    source: str | snapshots.Snapshot, mesh: Mesh | None = None, *, like: Any = None, events: EventLog | None = None
) -> Any:
    """Put a snapshot back on ``mesh`` (default: the live slices); returns the pytree.

    ``source`` is a URL (a snapshot ``PREFIX/ID``, or a prefix: its newest
    committed snapshot) or an in-memory ``Snapshot``. Leaves keep their
    PartitionSpecs; axes the mesh lacks, or that no longer divide a
    dimension, become replicated. ``like`` (a pytree of the same structure)
    gives the result that structure instead of nested dicts and lists.

    Raises:
      StorageError: see ``load``.
    """
    if isinstance(source, snapshots.Snapshot):
        return snapshots.restore(source, mesh)
    return snapshots.restore(load(source, events=_events(events), like=like), mesh)


def _events(events: EventLog | None) -> EventLog:
    if events is not None:
        return events
    return session().events
