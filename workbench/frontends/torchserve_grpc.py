"""TorchServe's gRPC APIs on workbench's gRPC port: ``org.pytorch.serve.grpc.inference.InferenceAPIsService`` and
``org.pytorch.serve.grpc.management.ManagementAPIsService``, beside TF Serving's and v2's services.

The messages are TorchServe's own (:mod:`workbench.protocol.torchserve`, generated from its ``.proto`` files), so
TorchServe's gRPC clients (``ts_scripts/torchserve_grpc_client.py`` and any built from its protos) work unchanged,
pointed at workbench's one gRPC port instead of TorchServe's 7070 and 7071. Each call does what the REST API's does
(:mod:`workbench.frontends.torchserve_api`):

- ``Ping`` → ``health``: ``{"status": "Healthy"}`` as indented JSON (``Unhealthy`` while the server is not ready);
- ``Predictions`` → ``prediction``: the handler's answer as bytes. The request's ``input`` map is what the handler
  gets per request (``{"data": b"..."}``, every entry under its name, as bytes); its metadata are the request's
  headers. As in TorchServe, the handler's status and content type do not travel over gRPC;
- ``StreamPredictions``: the answer as a stream (of one response: workbench sends no intermediate responses);
- ``StreamPredictions2``: a stream of requests of a sequence, answered in order; a request's failure is its
  response's ``status`` (a ``google.rpc.Status`` with an ``ErrorInfo``), and the stream goes on, as in TorchServe.
  The sequence id is the request's ``sequence_id``, or a new ``ts-seq-<uuid>`` for a request whose input holds
  ``ts_request_sequence_start: true``; handlers read it with ``context.get_sequence_id``;
- ``ListModels``, ``DescribeModel``, ``RegisterModel``, ``ScaleWorker``, ``SetDefault``, ``UnregisterModel`` →
  ``msg``: the REST API's answer (JSON for list and describe; the status text for the others).

Errors are gRPC statuses with TorchServe's codes where TorchServe gives one (NOT_FOUND for an unknown model or
version, INVALID_ARGUMENT for a bad request, PERMISSION_DENIED, UNAVAILABLE for a failed prediction), but never
INTERNAL for the client's mistakes: TorchServe answers an unknown model and a missing model name of ``Predictions``
with INTERNAL; workbench with NOT_FOUND and INVALID_ARGUMENT. Management calls need the management token
(``authorization: Bearer <token>`` metadata) when the server has one.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from workbench.core.errors import Code, ServingError, from_exception
from workbench.frontends.grpc import answers_errors, authorization, status_message, sticky_key, time_remaining
from workbench.frontends.torchserve_api import DEFAULT_LIMIT, TorchServeApi, TorchServeError
from workbench.platforms import torchserve as ts_platform
from workbench.protocol import grpc_services
from workbench.protocol.torchserve import (
    inference_pb2,
    inference_pb2_grpc,
    management_pb2,
    management_pb2_grpc,
)

PROTOCOL = "torchserve-grpc"  # the protocol label of this frontend's requests in metrics
# TorchServe's default header keys of a sequence (config.properties: ts_header_key_sequence_*).
SEQUENCE_ID = "ts_request_sequence_id"
SEQUENCE_START = "ts_request_sequence_start"
SEQUENCE_END = "ts_request_sequence_end"

# TorchServe's GRPCUtils.getGRPCStatusCode: an HTTP status as a gRPC code.
_CODES = {
    400: Code.INVALID_ARGUMENT,
    401: Code.UNAUTHENTICATED,
    403: Code.PERMISSION_DENIED,
    404: Code.NOT_FOUND,
    409: Code.ABORTED,
    413: Code.RESOURCE_EXHAUSTED,
    429: Code.RESOURCE_EXHAUSTED,
    416: Code.OUT_OF_RANGE,
    499: Code.CANCELLED,
    504: Code.DEADLINE_EXCEEDED,
    501: Code.UNIMPLEMENTED,
    503: Code.UNAVAILABLE,
}


def serving_error(error: TorchServeError) -> ServingError:
    """A TorchServe error as the engine's, with the gRPC code TorchServe gives its HTTP status."""
    code = _CODES.get(error.status)
    if code is None:
        code = Code.FAILED_PRECONDITION if 400 <= error.status < 500 else Code.INTERNAL
    return ServingError(code, error.message)


def _request(
    request: Any, context: grpc.aio.ServicerContext, sequence: dict[str, str] | None = None
) -> tuple[bytes, bytes]:
    """The prediction's input and its description (the servable's ``request`` input): every entry of the input
    map under its name (the first, "data" when there is one, as the input; the others beside it), the call's
    metadata as headers."""
    if not request.model_name:
        raise ServingError(Code.INVALID_ARGUMENT, "Parameter model_name is required.")
    entries = dict(request.input)
    if not entries:
        raise ServingError(Code.INVALID_ARGUMENT, 'Parameter input is required (a map such as {"data": bytes}).')
    name = "data" if "data" in entries else next(iter(entries))
    headers = {str(k): str(v) for k, v in context.invocation_metadata() or () if not str(k).endswith("-bin")}
    headers.update(sequence or {})
    more = {k: v for k, v in entries.items() if k != name}
    return entries[name], ts_platform.request_meta(name, "", headers, more)


class TorchServeInference(inference_pb2_grpc.InferenceAPIsServiceServicer):
    """``org.pytorch.serve.grpc.inference.InferenceAPIsService``."""

    def __init__(self, api: TorchServeApi) -> None:
        self.api = api

    def add_to(self, server: grpc.aio.Server) -> None:
        grpc_services.TORCHSERVE_INFERENCE.add(self, server)

    @answers_errors
    async def Ping(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        health = "Healthy" if self.api.healthy() else "Unhealthy"
        return inference_pb2.TorchServeHealthResponse(health=json.dumps({"status": health}, indent=2))

    @answers_errors
    async def Predictions(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return inference_pb2.PredictionResponse(prediction=await self._predict(request, context))

    @answers_errors
    async def StreamPredictions(self, request: Any, context: grpc.aio.ServicerContext) -> None:  # noqa: N802
        # A coroutine that writes, not an async generator: answers_errors then ends a failure with its status.
        await context.write(inference_pb2.PredictionResponse(prediction=await self._predict(request, context)))

    async def StreamPredictions2(  # noqa: N802
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> None:
        async for request in requests:
            sequence_id = request.sequence_id if request.HasField("sequence_id") else ""
            response = inference_pb2.PredictionResponse()
            try:
                starts = request.input.get(SEQUENCE_START, b"false").decode("utf-8", "replace").lower() == "true"
                if not sequence_id and not starts:
                    raise ServingError(Code.INVALID_ARGUMENT, "Parameter sequenceId is required.")
                headers = {}
                if not sequence_id:
                    sequence_id = f"ts-seq-{uuid.uuid4()}"
                    headers[SEQUENCE_START] = "true"
                headers[SEQUENCE_ID] = sequence_id
                if request.input.get(SEQUENCE_END, b"false").decode("utf-8", "replace").lower() == "true":
                    headers[SEQUENCE_END] = "true"
                response.prediction = await self._predict(request, context, headers)
            except TorchServeError as exc:
                response.status.CopyFrom(_status(serving_error(exc), exc.kind))
            except ServingError as exc:
                response.status.CopyFrom(_status(exc, _reason(exc)))
            except Exception as exc:  # noqa: BLE001 - a bug answers this request's status; the stream goes on
                response.status.CopyFrom(_status(from_exception(exc), _INTERNAL))
            response.sequence_id = sequence_id
            await context.write(response)

    async def _predict(
        self, request: Any, context: grpc.aio.ServicerContext, sequence: dict[str, str] | None = None
    ) -> bytes:
        data, meta = _request(request, context, sequence)
        try:
            answer = await self.api.predict(
                request.model_name,
                request.model_version or None,
                data,
                meta,
                PROTOCOL,
                time_remaining(context),
                sticky_key(context),
            )
        except TorchServeError as exc:
            raise serving_error(exc) from None
        return answer.body


_INTERNAL = "org.pytorch.serve.http.InternalServerException"  # TorchServe's reason for a failed prediction


def _reason(error: ServingError) -> str:
    """The ErrorInfo reason TorchServe gives a failure: a bad request's, or a failed prediction's."""
    return "BadRequestException.()" if error.code == Code.INVALID_ARGUMENT else _INTERNAL


def _status(error: ServingError, reason: str) -> status_pb2.Status:
    """A StreamPredictions2 request's failure, as TorchServe writes it: code, message and an ErrorInfo."""
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.ErrorInfo(reason=reason))
    return status_pb2.Status(code=int(error.code), message=status_message(error.message), details=[detail])


class TorchServeManagement(management_pb2_grpc.ManagementAPIsServiceServicer):
    """``org.pytorch.serve.grpc.management.ManagementAPIsService``: the REST management API's calls."""

    def __init__(self, api: TorchServeApi) -> None:
        self.api = api

    def add_to(self, server: grpc.aio.Server) -> None:
        grpc_services.TORCHSERVE_MANAGEMENT.add(self, server)

    async def _call(self, context: grpc.aio.ServicerContext, work: Callable[[], Awaitable[Any]]) -> Any:
        """``work`` once the caller is authorized; its answer as the response's ``msg``."""
        try:
            self.api.authorize(authorization(context))
            answer = await work()
        except TorchServeError as exc:
            raise serving_error(exc) from None
        text = answer if isinstance(answer, str) else json.dumps(answer, indent=2)
        return management_pb2.ManagementResponse(msg=text)

    @answers_errors
    async def ListModels(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        async def work() -> Any:
            # 0 is proto3's "not set": the documented default of 100 (TorchServe itself lists none then).
            return self.api.list_models(request.limit or DEFAULT_LIMIT, request.next_page_token)

        return await self._call(context, work)

    @answers_errors
    async def DescribeModel(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        version = request.model_version or None
        return await self._call(
            context, lambda: self.api.describe(request.model_name, version, time_remaining(context))
        )

    @answers_errors
    async def RegisterModel(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        # initial_workers is 0 when not set; TorchServe then registers without starting a worker. workbench's model
        # serves once loaded either way: describe shows the count asked for.
        return await self._call(
            context, lambda: self.api.register(request.url, request.initial_workers, request.model_name)
        )

    @answers_errors
    async def ScaleWorker(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        min_workers = request.min_worker or 1  # TorchServe's GRPCUtils.getRegisterParam: 0 is "not set"
        max_workers = request.max_worker or min_workers

        async def work() -> Any:
            return self.api.scale(
                request.model_name, request.model_version or None, min_workers, max_workers, request.synchronous
            )

        return await self._call(context, work)

    @answers_errors
    async def SetDefault(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return await self._call(context, lambda: self.api.set_default(request.model_name, request.model_version))

    @answers_errors
    async def UnregisterModel(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        if not request.model_name:
            raise ServingError(Code.INVALID_ARGUMENT, "Parameter model_name is required.")
        return await self._call(context, lambda: self.api.unregister(request.model_name, request.model_version or None))
