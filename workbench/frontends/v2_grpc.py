"""The Open Inference Protocol (KServe v2) over gRPC: Triton's ``inference.GRPCInferenceService``.

It is served by the same ``grpc.aio`` server, on the same port, as TF Serving's services, and is as thin as they
are: Triton's messages in (``tritonclient.grpc``'s generated protos, so Triton's and KServe's clients work
unchanged), the dataplane in the middle (versions, labels, canaries, batching, metrics and request logs apply as
for TF Serving's API), Triton's messages out. The descriptive answers (metadata, config, statistics, the
repository index) are :mod:`workbench.protocol.v2_models`' dicts, which the REST frontend answers as JSON and this
one turns into protos with ``json_format.ParseDict``.

A ``model_version`` of all digits selects that version, any other text the version with that label (a workbench
addition; an unknown one is NOT_FOUND), none the model's default traffic. Errors are gRPC statuses with the
engine's precise codes.

Repository load and unload act on versions, as the v2 REST frontend's and workbench's management API do:
``RepositoryModelLoad`` with a ``version`` parameter (``int64_param``, or digits in ``string_param``) loads that
version and keeps it loaded; without one it re-reads the model's folder and answers once its versions settled.
``RepositoryModelUnload`` needs the ``version`` parameter (a whole model leaves only with the model config). When
the server has a management token, both need it as ``authorization: Bearer <token>`` metadata.

The ``SystemSharedMemory*`` and ``CudaSharedMemory*`` RPCs, and ``ModelInfer``'s inputs and outputs in registered
regions, follow :mod:`workbench.frontends.v2_shared_memory` (the same regions as REST's, for clients on this host).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Mapping
from typing import Any

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2, service_pb2_grpc

from workbench.config.model_control import load_overrides
from workbench.core.classification import classify
from workbench.core.errors import Code, ServingError
from workbench.core.sequence_contract import sequence_request
from workbench.core.sticky import STICKY_PARAMETER
from workbench.core.whole_requests import WholeRequestServable
from workbench.frontends import v2_stream
from workbench.frontends.grpc import answers_errors, authorization, sticky_key, time_remaining
from workbench.frontends.sequence_routing import SequenceRouter
from workbench.frontends.v2_explain import explain_infer
from workbench.frontends.v2_repository import V2Repository, unsupported_parameters
from workbench.frontends.v2_shared_memory import SharedMemoryAccess
from workbench.planes.controlplane import ControlPlane
from workbench.planes.dataplane import Dataplane, ModelSpec
from workbench.protocol import grpc_services, v2_grpc_messages, v2_models, v2_whole
from workbench.protocol.attributions import v2_parameters
from workbench.protocol.shared_memory_parameters import SharedMemory
from workbench.protocol.v2_dialects import dialect_of

PROTOCOL = "v2-grpc"  # the protocol label of this frontend's requests in metrics


class InferenceService(service_pb2_grpc.GRPCInferenceServiceServicer):
    """``inference.GRPCInferenceService``: health, metadata, inference, statistics and the model repository.

    ``ModelStreamInfer`` (and decoupled models) is :mod:`workbench.frontends.v2_stream`'s; the shared-memory RPCs
    are :mod:`workbench.frontends.v2_shared_memory`'s. Tracing and logging answer UNIMPLEMENTED, naming the RPC.
    """

    def __init__(
        self,
        dataplane: Dataplane,
        controlplane: ControlPlane,
        management_token: str = "",
        router: SequenceRouter | None = None,
        shared_memory: SharedMemoryAccess | None = None,
    ) -> None:
        """Reads and inference go through ``dataplane``, repository loads and unloads through ``controlplane``;
        ``management_token``, when set, guards repository load and unload; ``router`` hands a sequence's requests to
        the worker that holds it (with --num_workers); ``shared_memory``: the server's shared-memory regions (None:
        the shared-memory RPCs and requests naming a region are UNIMPLEMENTED)."""
        self.dataplane = dataplane
        self.models = V2Repository(dataplane, controlplane, management_token)
        self.router = router
        self.shared_memory = shared_memory
        self._streams = v2_stream.StreamInfer(dataplane, self.models, PROTOCOL, self._memory, router)

    def add_to(self, server: grpc.aio.Server) -> None:
        grpc_services.V2_INFERENCE.add(self, server)

    # ------------------------------------------------------------------------------------ health
    @answers_errors
    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return service_pb2.ServerLiveResponse(live=True)  # it answers: it is live

    @answers_errors
    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return service_pb2.ServerReadyResponse(ready=self.dataplane.readiness().ready)  # as /readyz and gRPC health

    @answers_errors
    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        try:
            with self.dataplane.handle(self.models.spec(request.name, request.version)):
                ready = True
        except ServingError:  # an unknown model, version or label, or none loaded: not ready, as in Triton
            ready = False
        return service_pb2.ModelReadyResponse(ready=ready)

    # ---------------------------------------------------------------------------------- metadata
    @answers_errors
    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return json_format.ParseDict(v2_models.server_metadata(), service_pb2.ServerMetadataResponse())

    @answers_errors
    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        spec = await self.models.loaded_spec(request.name, request.version, time_remaining(context))
        return v2_grpc_messages.model_metadata_response(self.dataplane.v2_description(spec))

    @answers_errors
    async def ModelConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        spec = await self.models.loaded_spec(request.name, request.version, time_remaining(context))
        return v2_grpc_messages.model_config_response(self.dataplane.v2_description(spec))

    @answers_errors
    async def ModelStatistics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        if not request.name:
            if request.version:
                raise ServingError(Code.INVALID_ARGUMENT, "A version needs a model name: set name too")
            rows = self.dataplane.statistics()
        else:
            spec = self.models.spec(request.name, request.version)
            rows = self.dataplane.statistics(spec.name, self.models.version_of(spec))
        return json_format.ParseDict(v2_models.model_statistics(rows), service_pb2.ModelStatisticsResponse())

    # ---------------------------------------------------------------------------------- inference
    @answers_errors
    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        dataplane = self.dataplane
        # The request's parameters as plain values, read once: its sequence and its explanation are both in them.
        parameters = v2_grpc_messages.parameter_values(request.parameters) if request.parameters else None
        sequence = sequence_request(parameters) if parameters is not None else None
        if sequence is not None and self.router is not None:
            owner = self.router.owner(sequence.id)
            if owner is not None:  # another worker holds this sequence: it answers
                return await self.router.infer(owner, request, time_remaining(context))
        spec = await self._infer_spec(request, time_remaining(context))
        key = request.parameters[STICKY_PARAMETER].string_param if STICKY_PARAMETER in request.parameters else None
        key = key or sticky_key(context)
        if key is not None:  # (a spec without a key is the one resolved already: no copy of it per request)
            spec = dataclasses.replace(spec, key=key)
        explaining = v2_parameters(parameters) if parameters is not None else None
        if explaining is not None:  # "explain": true (see workbench.frontends.v2_explain)
            return await explain_infer(dataplane, spec, request, explaining, PROTOCOL, time_remaining(context))
        with await dataplane.admit(spec, "predict", PROTOCOL, time_remaining(context)) as call:
            if isinstance(call.servable, WholeRequestServable):  # MLServer's runtimes: the request as sent
                whole = v2_whole.grpc_request(request)
                answer = await dataplane.answer_whole(call, whole, time_remaining(context))
                return v2_whole.grpc_response(call.model, call.version, answer, request.id)
            # The client's address is read (and parsed) only for a request that names a shared-memory region.
            memory = self._memory(context) if v2_grpc_messages.names_shared_memory(request) else None
            inputs = v2_grpc_messages.decode_inputs(request, memory)
            requested = v2_grpc_messages.requested_outputs(request, memory)
            timeout = time_remaining(context)
            v2_stream.refuse_decoupled(call, "ModelInfer RPC")
            dialect = dialect_of(call.servable)
            if dialect is not None:  # a model served as its own server serves it (MLServer's runtimes)
                decoded = v2_grpc_messages.as_infer_request(request, inputs)
                fed, wanted = dialect.feed(decoded)
                _, outputs = await dataplane.predict(call, "", fed, wanted, timeout=timeout)
                outputs, parameters = dialect.answer(decoded, outputs)
                return v2_grpc_messages.infer_response(
                    call.model,
                    dialect.version_name,  # "" for a model without one, as MLServer answers it
                    request.id,
                    outputs,
                    list(outputs),
                    output_parameters=parameters,
                )
            _, outputs = await dataplane.predict(call, "", inputs, requested, timeout=timeout, sequence=sequence)
            outputs = classify(outputs, v2_grpc_messages.classification_counts(request), call.servable)
            order = requested or list(outputs)
            shared = v2_grpc_messages.output_regions(request)
            return v2_grpc_messages.infer_response(
                call.model, str(call.version), request.id, outputs, order, shared, memory
            )

    async def ModelStreamInfer(  # noqa: N802
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> None:
        """Bidirectional streaming inference, and decoupled models: see :mod:`workbench.frontends.v2_stream`.

        A coroutine that writes with ``context.write`` rather than an async generator, so a client that leaves while
        a response is being written ends the stream quietly instead of logging gRPC's error."""
        await self._streams.serve(requests, context)

    def _memory(self, context: grpc.aio.ServicerContext) -> SharedMemory | None:
        """The regions this call's inputs and outputs may name (refusals, for a client on another host)."""
        return self.shared_memory.for_peer(context.peer()) if self.shared_memory is not None else None

    async def _infer_spec(self, request: Any, timeout: float | None) -> ModelSpec:
        """The servable an inference request names; one it cannot name (an unknown label) is counted as refused."""
        try:
            return await self.models.loaded_spec(request.model_name, request.model_version, timeout)
        except ServingError as exc:
            self.dataplane.refused(request.model_name, "predict", PROTOCOL, exc)
            raise

    # --------------------------------------------------------------------------- model repository
    @answers_errors
    async def RepositoryIndex(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        _one_repository(request.repository_name)
        index = v2_models.repository_index(self.models.index(), ready_only=request.ready)
        return json_format.ParseDict(index, service_pb2.RepositoryIndexResponse())

    @answers_errors
    async def RepositoryModelLoad(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        self.models.authorize(authorization(context))
        _one_repository(request.repository_name)
        version = _version_parameter(request.parameters, "load")
        overrides = load_overrides(v2_grpc_messages.parameter_values(request.parameters))
        await self.models.load(request.model_name, version, overrides)
        return service_pb2.RepositoryModelLoadResponse()

    @answers_errors
    async def RepositoryModelUnload(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        self.models.authorize(authorization(context))
        _one_repository(request.repository_name)
        version = _version_parameter(request.parameters, "unload")
        dependents = False
        if "unload_dependents" in request.parameters:
            parameter = request.parameters["unload_dependents"]
            if parameter.WhichOneof("parameter_choice") != "bool_param":
                raise ServingError(Code.INVALID_ARGUMENT, "The unload_dependents parameter must be a bool_param")
            dependents = parameter.bool_param
        await self.models.unload(request.model_name, version, "the version parameter", unload_dependents=dependents)
        return service_pb2.RepositoryModelUnloadResponse()

    # ------------------------------------------------------------------------------ shared memory
    @answers_errors
    async def SystemSharedMemoryStatus(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        response = service_pb2.SystemSharedMemoryStatusResponse()
        for region in self._shared_memory("SystemSharedMemoryStatus").status(context.peer(), request.name):
            response.regions[region.name].CopyFrom(
                service_pb2.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=region.name, key=region.key, offset=region.offset, byte_size=region.byte_size
                )
            )
        return response

    @answers_errors
    async def SystemSharedMemoryRegister(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        self._shared_memory("SystemSharedMemoryRegister").register(
            context.peer(), authorization(context), request.name, request.key, request.offset, request.byte_size
        )
        return service_pb2.SystemSharedMemoryRegisterResponse()

    @answers_errors
    async def SystemSharedMemoryUnregister(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        self._shared_memory("SystemSharedMemoryUnregister").unregister(
            context.peer(), authorization(context), request.name
        )
        return service_pb2.SystemSharedMemoryUnregisterResponse()

    @answers_errors
    async def CudaSharedMemoryStatus(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        # No CUDA region is ever registered: an empty map, or NOT_FOUND for a name
        self._shared_memory("CudaSharedMemoryStatus").cuda_status(context.peer(), request.name)
        return service_pb2.CudaSharedMemoryStatusResponse()

    @answers_errors
    async def CudaSharedMemoryRegister(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        self._shared_memory("CudaSharedMemoryRegister").cuda_register(
            context.peer(), authorization(context), request.name
        )

    @answers_errors
    async def CudaSharedMemoryUnregister(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        self._shared_memory("CudaSharedMemoryUnregister").cuda_unregister(
            context.peer(), authorization(context), request.name
        )
        return service_pb2.CudaSharedMemoryUnregisterResponse()

    def _shared_memory(self, rpc: str) -> SharedMemoryAccess:
        if self.shared_memory is None:
            raise ServingError(Code.UNIMPLEMENTED, f"{rpc} is not served here: this server offers no shared memory")
        return self.shared_memory

    # ------------------------------------------------------------------------------ not implemented
    # The generated servicer's answer to these raises in the handler, which gRPC logs with a traceback per call.
    @answers_errors
    async def TraceSetting(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        raise ServingError(
            Code.UNIMPLEMENTED,
            "TraceSetting is not implemented: workbench has no request tracing (its request logs and metrics say "
            "what requests did)",
        )

    @answers_errors
    async def LogSettings(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        raise ServingError(
            Code.UNIMPLEMENTED,
            "LogSettings is not implemented: workbench's log level is set where it starts (Python's logging), not by "
            "clients",
        )


def _version_parameter(parameters: Mapping[str, Any], action: str) -> int | None:
    """The ``version`` parameter of a repository load or unload: an ``int64_param`` or digits in ``string_param``."""
    refused = unsupported_parameters(list(parameters), action)
    if refused is not None:
        raise refused
    if "version" not in parameters:
        return None
    parameter = parameters["version"]
    which = parameter.WhichOneof("parameter_choice")
    if which == "int64_param" and parameter.int64_param >= 0:
        return int(parameter.int64_param)
    if which == "string_param" and parameter.string_param.isascii() and parameter.string_param.isdigit():
        return int(parameter.string_param)
    given = repr(getattr(parameter, which)) if which else "no value"
    raise ServingError(Code.INVALID_ARGUMENT, f"The version parameter must be a version number, got {given}")


def _one_repository(repository_name: str) -> None:
    """workbench serves one model repository: a request may name it by "" only."""
    if repository_name:
        raise ServingError(
            Code.NOT_FOUND, f'Unknown model repository {repository_name!r}: workbench serves one, named by ""'
        )
