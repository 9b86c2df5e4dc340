"""Requests about programs: compiling them (``programs.py`` compiles), what the client asks of
an executable (metadata, cost analysis, text), executing it, and the futures that say
when the work is done."""

from __future__ import annotations

from pathways_kernel.server import protos
from pathways_kernel.server.arrays import ServerArray, dtype_to_proto
from pathways_kernel.server.errors import UNIMPLEMENTED, ServerError
from pathways_kernel.server.programs import Program
from pathways_kernel.server.protos import Proto
from pathways_kernel.server.session import Deferred, Future, Session, done, failed

_NOT_REPORTED = "layouts are not reported by the local Pathways server"
# What the client reads of an executable's compiled memory statistics.
_MEMORY_STATS = (
    "generated_code_size_in_bytes",
    "argument_size_in_bytes",
    "output_size_in_bytes",
    "alias_size_in_bytes",
    "temp_size_in_bytes",
    "peak_memory_in_bytes",
    "host_generated_code_size_in_bytes",
    "host_argument_size_in_bytes",
    "host_output_size_in_bytes",
    "host_alias_size_in_bytes",
    "host_temp_size_in_bytes",
)


def compile_request(session: Session, request: Proto, response: Proto) -> Deferred:
    def compile_() -> None:
        program = session.server.compile(request)
        handle = session.arrays.new_handle()
        ready = session.arrays.new_handle()
        session.add_program(handle, program)
        session.add_future(ready, done())
        compiled = response.compile_response
        compiled.loaded_executable_handle = handle
        compiled.name = program.name
        compiled.num_devices = len(program.device_ids)
        compiled.device_ids.extend(program.device_ids)
        compiled.addressable_device_ids.extend(program.device_ids)
        compiled.fingerprint_value = getattr(program.executable, "fingerprint", None) or b""
        compiled.ready_future_handle = ready

    return session.server.compiles.submit(compile_)


def loaded_executable_metadata_request(session: Session, request: Proto, response: Proto) -> None:
    program = session.program(request.loaded_executable_handle)
    metadata = response.loaded_executable_metadata_response
    executable = program.executable
    ServerError(UNIMPLEMENTED, _NOT_REPORTED).to_status(metadata.parameter_layouts_error)
    ServerError(UNIMPLEMENTED, _NOT_REPORTED).to_status(metadata.output_layouts_error)
    ServerError(UNIMPLEMENTED, "donated inputs are not reported").to_status(metadata.donated_input_indices_error)
    metadata.output_memory_kinds.SetInParent()
    if executable is None:  # a plugin program: no arguments, no outputs, no XLA executable
        return
    op_sharding = protos.xla("OpSharding")
    if program.num_replicas == 1 and len(program.device_ids) > 1:
        metadata.parameter_shardings.SetInParent()
        for op in executable.get_parameter_shardings() or []:
            metadata.parameter_shardings.shardings.append(op_sharding.FromString(op.SerializeToString()))
        metadata.output_shardings.SetInParent()
        for op in executable.get_output_shardings() or []:
            metadata.output_shardings.shardings.append(op_sharding.FromString(op.SerializeToString()))
    for memory_kinds in executable.get_output_memory_kinds():
        metadata.output_memory_kinds.memory_kind_lists.add().memory_kinds.extend(memory_kinds)
    stats = executable.get_compiled_memory_stats()
    memory = metadata.compiled_memory_stats
    for name in _MEMORY_STATS:
        setattr(memory, name, int(getattr(stats, name)))
    metadata.size_of_generated_code_in_bytes = int(executable.size_of_generated_code_in_bytes())


def loaded_executable_cost_analysis_request(session: Session, request: Proto, response: Proto) -> None:
    program = session.program(request.loaded_executable_handle)
    analysis = response.loaded_executable_cost_analysis_response
    analysis.attributes.SetInParent()
    executable = program.executable  # None for a plugin program: nothing to analyse
    for key, value in ((executable.cost_analysis() if executable else None) or {}).items():
        analysis.attributes.attributes[key].float_value = float(value)


def loaded_executable_human_readable_program_text_request(session: Session, request: Proto, response: Proto) -> None:
    program = session.program(request.loaded_executable_handle)
    executable = program.executable
    texts = executable.get_hlo_text() if executable is not None and hasattr(executable, "get_hlo_text") else ""
    response.loaded_executable_human_readable_program_text_response.human_readable_program_text = str(texts)


def loaded_executable_destruct_request(session: Session, request: Proto, response: Proto) -> None:
    session.drop_program(request.loaded_executable_handle)
    response.loaded_executable_destruct_response.SetInParent()


def loaded_executable_is_deleted_request(session: Session, request: Proto, response: Proto) -> None:
    response.loaded_executable_is_deleted_response.is_deleted = False


def loaded_executable_delete_request(session: Session, request: Proto, response: Proto) -> None:
    handle = session.arrays.new_handle()
    session.add_future(handle, failed(ServerError(UNIMPLEMENTED, "LoadedExecutable::Delete is no longer supported")))
    response.loaded_executable_delete_response.future_handle = handle


def loaded_executable_execute_request(session: Session, request: Proto, response: Proto) -> None:
    """Dispatches the execution. As on Pathways, a failure (a lost slice, a lost argument,
    the client interrupted before it started) does not fail the dispatch: the outputs hold
    the error and the user meets it when reading them, which also keeps the client, which
    only logs execute errors, in step.

    An XLA program waits for room among the executions in flight on its devices
    (``executions.py``; the session hands it to its own thread when there is none)."""
    program = session.program(request.loaded_executable_handle)
    arrays = session.arrays
    handles = list(request.result_array_handle) or [arrays.new_handle() for _ in program.output_shapes]
    status_handle = request.result_status_handle
    if not status_handle and request.execute_options.fill_status:
        status_handle = arrays.new_handle()
    outputs: list[ServerArray] | None
    status: Future | None
    try:
        session.topology.check_up(program.device_ids)
        args = [arrays.get(h) for h in request.args_handles]
        if program.runs_in_background:
            status, outputs = session.run_in_background(program, args, handles), None
        else:
            if isinstance(program, Program):
                outputs, status = _launch(session, program, args, bool(status_handle))
            else:  # a plugin program: done when it returns
                outputs, status = program.run(args), done()
            session.server.program_dispatched(program.device_ids, outputs)
            for handle, output in zip(handles, outputs, strict=True):
                arrays.put(handle, output)
    except ServerError as error:
        arrays.poison(handles, error)
        status = failed(error)
        outputs = None
    executed = response.loaded_executable_execute_response
    executed.SetInParent()
    if status_handle and status is not None:
        executed.status_handle = status_handle
        session.add_future(status_handle, status)
    if not request.result_array_handle:
        for i, handle in enumerate(handles):
            described = executed.outputs.add()
            dtype_to_proto(outputs[i].dtype if outputs else program.output_dtypes[i], described.dtype)
            described.shape.dims.extend(program.output_shapes[i])
            program.output_shardings[i].to_proto(described.sharding)
            described.array_handle = handle


def _launch(
    session: Session, program: Program, args: list[ServerArray], status: bool
) -> tuple[list[ServerArray], Future | None]:
    """Starts ``program`` once it has room (or the client's interrupt drops it: CANCELLED);
    with ``status``, a future that settles when it has finished (only a status the client
    will ask for is waited for: a thread's wake-up each)."""
    executions = session.server.executions
    if (error := session.cancelled()) is not None:
        raise error
    executions.enter(program.device_ids, session.cancelled)
    try:
        outputs, token = program.launch(args)
    except BaseException:
        executions.leave(program.device_ids)
        raise
    shards = [shard for output in outputs for shard in output.shards]
    if status:
        return outputs, executions.watch(program.device_ids, token, shards)
    executions.started(program.device_ids, token, shards)
    return outputs, None


def loaded_executable_fetch_execute_result_request(session: Session, request: Proto, response: Proto) -> Deferred:
    future = session.take_future(request.result_status_handle)
    response.loaded_executable_fetch_execute_result_response.SetInParent()
    return future


def check_future_request(session: Session, request: Proto, response: Proto) -> Deferred:
    future = session.take_future(request.future_handle)
    response.check_future_response.SetInParent()
    return future


def loaded_host_callback_poll_request(session: Session, request: Proto, response: Proto) -> None:
    raise ServerError(UNIMPLEMENTED, "host callbacks are not served by the local Pathways server")
