"""Every name of the public API, gathered from the layers that define it.

``pathways_kernel/__init__.py`` hands these out on first use (``pw.mesh``), so that
importing the package stays cheap: the local server's process and the kernel's own
first lines (which start that server, ``__main__.py``) import it without JAX or IPython.
Importing this module also tells core how a spec becomes a backend.
"""

from __future__ import annotations

from pathways_kernel import backends as _backends

# Session, topology and meshes (api.py), and fault injection on the local backend.
from pathways_kernel.api import (
    chaos,
    chaos_off,
    connect,
    devices,
    events,
    fail_slice,
    health,
    is_lost,
    mesh,
    repair_slice,
    session,
    status,
    topology,
)
from pathways_kernel.backends.connection import connect_shared_service, reconnect
from pathways_kernel.backends.slurm_backend import connect as connect_slurm

# Sidecars and data loading; the in-notebook monitor.
from pathways_kernel.colocated.data_loader import Loader, loader
from pathways_kernel.colocated.sidecars import Sidecar, SidecarError, SidecarTimeout, run_sidecar, sidecar
from pathways_kernel.core import sessions as _sessions
from pathways_kernel.core.errors import PathwaysError
from pathways_kernel.monitoring.chip_metrics import chip_metrics
from pathways_kernel.monitoring.widget import monitor

# Profiling: a trace of one block, summarized inline, opened in XProf.
from pathways_kernel.profiling.capture import ProfileError, profile, profiles

# State: host snapshots, elastic execution, durable storage.
from pathways_kernel.state.autosnapshots import autosnapshot
from pathways_kernel.state.checkpoints import listing as checkpoints_list
from pathways_kernel.state.checkpoints import restore as checkpoint_restore
from pathways_kernel.state.checkpoints import save as checkpoint_save
from pathways_kernel.state.compile_cache import cache
from pathways_kernel.state.snapshots import Snapshot, SnapshotStore, snapshot, snapshot_variables
from pathways_kernel.state.snapshots import restore as restore_snapshot
from pathways_kernel.state.snapshots import store as snapshot_store
from pathways_kernel.state.storage import list_snapshots as snapshots_list
from pathways_kernel.state.storage import persist, restore
from pathways_kernel.training.elastic_batch import elastic_map
from pathways_kernel.training.elastic_loop import ElasticError, elastic
from pathways_kernel.training.elastic_run import on_restore
from pathways_kernel.training.goodput_logging import cloud_logging as goodput_cloud_logging
from pathways_kernel.training.goodput_report import goodput, goodput_over_time
from pathways_kernel.training.metrics import log, metrics
from pathways_kernel.training.mfu import flops
from pathways_kernel.training.phases import phase
from pathways_kernel.training.steps import steps
from pathways_kernel.training.tensorboard import metrics_to_tensorboard

# Core sits below the backends and cannot import them: it is told here how a spec becomes one.
_sessions.use_backends(_backends.from_spec, _backends.default_spec)

__all__ = [
    "PathwaysError",
    "Snapshot",
    "SnapshotStore",
    "snapshot",
    "snapshot_variables",
    "snapshot_store",
    "autosnapshot",
    "elastic",
    "elastic_map",
    "ElasticError",
    "on_restore",
    "goodput",
    "phase",
    "goodput_over_time",
    "goodput_cloud_logging",
    "flops",
    "steps",
    "log",
    "metrics",
    "metrics_to_tensorboard",
    "restore_snapshot",
    "persist",
    "restore",
    "snapshots_list",
    "checkpoint_save",
    "checkpoint_restore",
    "checkpoints_list",
    "cache",
    "connect",
    "connect_shared_service",
    "connect_slurm",
    "reconnect",
    "devices",
    "events",
    "mesh",
    "session",
    "status",
    "topology",
    "Loader",
    "loader",
    "Sidecar",
    "SidecarError",
    "SidecarTimeout",
    "run_sidecar",
    "sidecar",
    "fail_slice",
    "repair_slice",
    "is_lost",
    "chaos",
    "chaos_off",
    "health",
    "monitor",
    "chip_metrics",
    "profile",
    "profiles",
    "ProfileError",
]
