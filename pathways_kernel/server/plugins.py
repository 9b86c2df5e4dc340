"""The plugin programs pathwaysutils sends (``xla::ifrt::PluginProgram``): what Pathways
does server-side rather than in the client.

pathwaysutils compiles a plugin program whose data is ``__serialized_plugin_program``
followed by a JSON request, and executes it without arguments:

* ``profileRequest`` (``pathwaysutils.profiling``): the first execution starts a
  trace of the server's own process into ``traceLocation`` with ``jax.profiler``,
  the second stops it, as Pathways' workers trace theirs (in the run directory its
  ``traceSessionName`` names; in a local directory the file is named for the server,
  ``pathways-local-server.xplane.pb``, beside the client's ``<host>.xplane.pb``);
* ``persistenceWriteRequest`` / ``persistenceReadRequest`` (``pathwaysutils.persistence``,
  which sends them as ``bulk_persistence_write/read_request``): the server writes the
  arrays it holds to storage, and reads them onto its devices, itself (``persistence.py``);
* ``reshardRequest`` (``pathwaysutils.experimental.reshard``, Tunix's weight sync): the
  server moves the arrays onto other devices itself (``reshard_plugin.py``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pathways_kernel.core.server_protocol import SERVER_TRACE
from pathways_kernel.server.arrays import ServerArray, Sharding
from pathways_kernel.server.errors import INVALID_ARGUMENT, UNIMPLEMENTED, ServerError
from pathways_kernel.server.persistence import READ, SINGLE, WRITE, PersistenceProgram, compile_persistence
from pathways_kernel.server.reshard_plugin import KIND as RESHARD
from pathways_kernel.server.reshard_plugin import ReshardProgram, compile_reshard

if TYPE_CHECKING:
    import jax

    from pathways_kernel.server.devices import Topology

PREFIX = b"__serialized_plugin_program "

# One trace per process: jax.profiler allows one at a time, as does a Pathways worker.
_tracing_lock = threading.Lock()
_tracing: list[ProfileProgram] = []


@dataclass(eq=False)
class ProfileProgram:
    """A ``profileRequest``: each execution starts, then stops, a trace of this process."""

    trace_location: str
    session: str = ""  # the run directory's name (xprofTraceOptions.traceSessionName)
    host_trace_level: int | None = None
    _session_id: str = ""
    name: str = "profileRequest"
    executable: None = None  # no XLA executable
    device_ids: tuple[int, ...] = ()
    num_replicas: int = 1
    output_shapes: list[tuple[int, ...]] = field(default_factory=list)
    output_dtypes: list[np.dtype[Any]] = field(default_factory=list)
    parameter_shardings: list[jax.sharding.Sharding] = field(default_factory=list)
    output_shardings: list[Sharding] = field(default_factory=list)
    runs_in_background: bool = False

    def run(self, args: list[ServerArray]) -> list[ServerArray]:
        import jax

        with _tracing_lock:
            if self in _tracing:
                _tracing.remove(self)
                self._stop()
                return self._outputs()
            if _tracing:
                raise ServerError(INVALID_ARGUMENT, "profileRequest: the local Pathways server is already tracing")
            options = jax.profiler.ProfileOptions()
            self._session_id = options.session_id = self.session or time.strftime("%Y_%m_%d_%H_%M_%S")
            if self.host_trace_level is not None:
                options.host_tracer_level = self.host_trace_level
            try:
                jax.profiler.start_trace(self.trace_location, profiler_options=options)
            except Exception as error:  # the profiler's reason is the user's answer
                raise ServerError(
                    INVALID_ARGUMENT,
                    f"profileRequest: cannot trace into {self.trace_location}: {' '.join(str(error).split())}",
                ) from error
            _tracing.append(self)
        return self._outputs()

    def _stop(self) -> None:
        """Ends the trace. Into a local directory the server writes it itself, under its own
        name: jax.profiler would name it for the host, as the client on this host does."""
        import jax

        from pathways_kernel.core import jaxcompat

        if "://" in self.trace_location:
            jax.profiler.stop_trace()
            return
        xspace = jaxcompat.stop_trace_in_memory()
        if xspace is None:
            jax.profiler.stop_trace()
            return
        run_dir = os.path.join(self.trace_location, "plugins", "profile", self._session_id)
        os.makedirs(run_dir, exist_ok=True)
        path = os.path.join(run_dir, SERVER_TRACE)
        with open(path + ".partial", "wb") as f:
            f.write(xspace)
        os.replace(path + ".partial", path)

    def _outputs(self) -> list[ServerArray]:
        """With ``xprofTraceOptions`` pathwaysutils waits for one output (on Pathways, the
        trace's future); a one-byte array on device 0 stands in for it."""
        import jax

        if not self.output_shapes:
            return []
        value = jax.device_put(np.zeros(1, np.int8), jax.devices()[0])
        return [ServerArray(np.dtype(np.int8), (1,), self.output_shardings[0], [value])]


def compile_plugin(
    data: bytes, topology: Topology | None = None
) -> ProfileProgram | PersistenceProgram | ReshardProgram:
    """The program a plugin program's ``data`` asks for (``topology``: the server's slices, which a
    reshard checks are up); raises ServerError naming the request if it is not one this server serves."""
    try:
        request = json.loads(data.removeprefix(PREFIX))
        kind = next(iter(request)) if isinstance(request, dict) and request else None
    except ValueError:
        kind = None
    if kind is None:
        raise ServerError(INVALID_ARGUMENT, "Bad PluginProgram: not a JSON request")
    if kind == "profileRequest":
        location = request[kind].get("traceLocation", "")
        if not location:
            raise ServerError(INVALID_ARGUMENT, "profileRequest: no traceLocation")
        if "xprofTraceOptions" not in request[kind]:
            return ProfileProgram(location)
        options = request[kind]["xprofTraceOptions"]
        return ProfileProgram(
            location,
            str(options.get("traceSessionName", "")),
            options.get("hostTraceLevel"),
            output_shapes=[(1,)],
            output_dtypes=[np.dtype(np.int8)],
            output_shardings=[Sharding((0,), None)],
        )
    if kind in (WRITE, READ) or kind in SINGLE:
        return compile_persistence(kind, request[kind])
    if kind == RESHARD:
        return compile_reshard(request[kind], topology)
    raise ServerError(UNIMPLEMENTED, f"{kind}: the local Pathways server does not serve it")
