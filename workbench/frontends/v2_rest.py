"""The Open Inference Protocol (KServe v2, Triton's HTTP API) on the REST port, beside TF Serving's ``/v1``.

- ``GET /v2/health/live`` · ``/v2/health/ready`` (the server's readiness, as ``/readyz``) · ``GET /v2`` (metadata);
- ``GET /v2/models/{m}[/versions/{v}]`` (metadata) · ``…/ready`` · ``POST …/infer`` · ``GET …/config``;
- ``GET /v2/models[/{m}[/versions/{v}]]/stats`` (Triton's statistics extension, read from the server's metrics);
- ``POST /v2/repository/index`` · ``POST /v2/repository/models/{m}/load`` · ``…/unload`` (the model repository
  extension, on workbench's version management);
- ``/v2/systemsharedmemory/…`` and ``/v2/cudasharedmemory/…`` (Triton's shared-memory extensions, for clients on
  this host: :mod:`workbench.frontends.v2_shared_memory`); inputs and outputs of ``…/infer`` may name a region.

``{v}`` all digits selects that version; any other word is a version label (``/versions/canary/infer``), a workbench
addition. Without a version a request gets the model's default traffic (promotion and canary apply). Requests run
through the
:class:`~workbench.planes.dataplane.Dataplane` exactly as TF Serving's do (batching, labels, metrics, request
logs); this module only translates. Errors are ``{"error": "…"}`` with v2's HTTP codes: 400 for a bad request, 404
for an unknown model, version or label, 503 for one not ready.

Repository load and unload act on versions, as workbench's management API does (the models themselves are the
model config's): ``load`` with ``{"parameters": {"version": N}}`` loads version N and keeps it loaded; ``load``
without a version re-reads the model's folder and answers once its versions settled (200 when one serves). ``unload``
needs ``{"parameters": {"version": N}}``: it unloads N unless N serves the default traffic (or is the last one that
serves); a whole model leaves only with the model config. With a management token, both need it as a bearer token.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from workbench.config.model_control import load_overrides
from workbench.core.classification import classify
from workbench.core.errors import Code, ServingError, from_exception
from workbench.core.sequence_contract import sequence_request
from workbench.core.signatures import DEFAULT_SIGNATURE
from workbench.core.sticky import STICKY_HEADER, STICKY_PARAMETER
from workbench.core.whole_requests import WholeRequestServable
from workbench.frontends import v2_stream
from workbench.frontends.hot_routes import (
    Answer,
    Arrival,
    StarletteArrival,
    answer_of,
    answer_of_response,
    as_response,
    route_pattern,
    with_header,
)
from workbench.frontends.rest import error_response, json_response
from workbench.frontends.sequence_routing import SequenceRouter
from workbench.frontends.v2_explain import explained_outputs
from workbench.frontends.v2_repository import V2Repository, unsupported_parameters
from workbench.frontends.v2_shared_memory import SharedMemoryAccess, shared_memory_routes
from workbench.planes.controlplane import ControlPlane
from workbench.planes.dataplane import Dataplane, ModelSpec
from workbench.protocol import v2_client, v2_json, v2_models, v2_whole
from workbench.protocol.attributions import v2_parameters
from workbench.protocol.json_tensor import dumps, encode_error, input_specs, parse_body
from workbench.protocol.shared_memory_parameters import SharedMemory
from workbench.protocol.v2_dialects import V2Dialect, dialect_of

log = logging.getLogger(__name__)

PROTOCOL = "v2-rest"  # the protocol label of workbench's request metrics
BINARY = "application/octet-stream"
_MODEL = "/v2/models/{model:str}"
_VERSION = "/v2/models/{model:str}/versions/{version:str}"
_LOAD_TIMEOUT_S = 300.0
_STICKY_PARAMETER_BYTES = f'"{STICKY_PARAMETER}"'.encode()
_STICKY = STICKY_HEADER.lower()  # hot routes read header names in lower case
_HEADER_LENGTH = v2_json.HEADER_LENGTH.lower()
_HEADER_LENGTH_RAW = _HEADER_LENGTH.encode()
_INFER_PATH = route_pattern(f"{_MODEL}/infer")
_INFER_VERSION_PATH = route_pattern(f"{_VERSION}/infer")

Handler = Callable[[Request], Awaitable[Response]]
# Queues an inference request asking for it (parameters.async): (model, version, body, headers) → the 202 answer.
AsyncHandOff = Callable[[str, "str | None", bytes, Mapping[str, str]], Awaitable[Response]]


@dataclasses.dataclass(frozen=True)
class V2Settings:
    timeout_ms: int = 30000  # per inference request (--rest_api_timeout_in_ms); 0 or less: none
    max_request_bytes: int = 256 * 1024 * 1024
    management_token: str = ""  # repository load/unload need it as a bearer token when set


class V2Rest:
    """The handlers; :func:`v2_routes` mounts them."""

    def __init__(
        self,
        dataplane: Dataplane,
        controlplane: ControlPlane,
        settings: V2Settings,
        router: SequenceRouter | None = None,
        shared_memory: SharedMemoryAccess | None = None,
        hand_off_async: AsyncHandOff | None = None,
    ) -> None:
        self.dataplane = dataplane
        self.hand_off_async = hand_off_async  # None: parameters.async is an ordinary parameter
        self.settings = settings
        self.models = V2Repository(dataplane, controlplane, settings.management_token)
        self.router = router  # with --num_workers: hands a sequence's requests to the worker that holds it
        self.shared_memory = shared_memory  # the server's regions (None: requests naming one are UNIMPLEMENTED)
        self.timeout = settings.timeout_ms / 1000 if settings.timeout_ms > 0 else None

    # ---------------------------------------------------------------------------------- resolution
    def _spec(self, request: Request) -> ModelSpec:
        return self.models.spec(request.path_params["model"], request.path_params.get("version"))

    async def _loaded_spec(self, request: Request) -> ModelSpec:
        """:meth:`_spec` once the model's first load is over (a request sent while it loads waits for it)."""
        params = request.path_params
        return await self.models.loaded_spec(params["model"], params.get("version"), self.timeout)

    # -------------------------------------------------------------------------------------- health
    async def live(self, _: Request) -> Response:
        return Response(status_code=200)

    async def ready(self, _: Request) -> Response:
        answer = self.dataplane.readiness()
        return json_response(dumps(answer.body()), 200 if answer.ready else 503)

    async def server_metadata(self, _: Request) -> Response:
        return json_response(dumps(v2_models.server_metadata()))

    async def model_ready(self, request: Request) -> Response:
        spec = self._spec(request)
        try:
            with self.dataplane.handle(spec):
                return Response(status_code=200)
        except ServingError as exc:
            if exc.code is not Code.NOT_FOUND:
                raise
        # Known but not serving (loading, failed, unloaded) is "not ready"; an unknown model or version is 404.
        self.dataplane.model_status(spec.name, spec.version, spec.label)
        raise ServingError(
            Code.UNAVAILABLE, f"Model {spec.name} ({request.path_params.get('version', 'default')}) is not ready"
        )

    # ------------------------------------------------------------------------------------ metadata
    async def model_metadata(self, request: Request) -> Response:
        model = self.dataplane.v2_description(await self._loaded_spec(request))
        return json_response(dumps(v2_models.model_metadata(model, v2_models.default_signature(model))))

    async def model_config(self, request: Request) -> Response:
        model = self.dataplane.v2_description(await self._loaded_spec(request))
        return json_response(dumps(v2_models.model_config(model, v2_models.default_signature(model))))

    async def statistics(self, request: Request) -> Response:
        name = request.path_params.get("model")
        if name is None:
            rows = self.dataplane.statistics()
        else:
            spec = self._spec(request)
            rows = self.dataplane.statistics(spec.name, self.models.version_of(spec))
        return json_response(dumps(v2_models.model_statistics(rows)))

    # ------------------------------------------------------------------------------------ inference
    async def infer(self, request: Request) -> Response:
        """``…/infer`` through Starlette (with CORS on, or under a root path); :meth:`answer` takes it otherwise."""
        params = request.path_params
        return as_response(await self._infer(params["model"], params.get("version"), StarletteArrival(request)))

    def match(self, method: str, path: str) -> re.Match[str] | None:
        """A :class:`~workbench.frontends.hot_routes.HotRoute`: ``POST …/infer``, answered before Starlette."""
        return _infer_match(path) if method == "POST" and path.startswith("/v2/models/") else None

    async def answer(self, match: re.Match[str], request: Arrival) -> Answer:
        """The answer to an ``…/infer`` request :meth:`match` matched, as its Starlette route answers it."""
        try:
            return await self._infer(match["model"], match.groupdict().get("version"), request)
        except ServingError as exc:
            return _error_answer(exc)
        except Exception as exc:  # a bug must still answer JSON, and be logged (as _answering does)
            log.exception("v2 REST %s %s failed", "POST", match.string)
            return _error_answer(from_exception(exc))

    async def _infer(self, model: str, version: str | None, request: Arrival) -> Answer:
        body = await request.body(self.settings.max_request_bytes)
        length = request.header(_HEADER_LENGTH)
        if self.hand_off_async is not None and v2_json.asks_async(body, length):
            return answer_of_response(await self.hand_off_async(model, version, body, request.headers()))
        shared_memory = self._shared_memory(request.peer)
        decoded = None
        if self.router is not None:  # with --num_workers: read the request first, its sequence may live elsewhere
            decoded = self._decode(body, length, shared_memory)
            sequence = sequence_request(decoded.parameters)
            owner = self.router.owner(sequence.id) if sequence is not None else None
            if owner is not None:
                return await self._forward(model, version, decoded, owner, shared_memory)
        key = request.header(_STICKY)
        return _answer(await self.run(model, version, body, length, shared_memory, decoded, key))

    async def run(
        self,
        model: str,
        version: str | None,
        body: bytes,
        length: str | None,
        shared_memory: SharedMemory | None = None,
        decoded: v2_json.InferRequest | None = None,
        key: str | None = None,
    ) -> v2_json.EncodedResponse:
        """One inference request's answer (``length``: its Inference-Header-Content-Length, if any; ``key``: its
        stickiness key, else the body's ``parameters.workbench_key``), run here: on the REST port, and for a queued
        request by its consumer."""
        dataplane = self.dataplane
        if key is None and _STICKY_PARAMETER_BYTES in body:
            # The version is picked from the key when the call is admitted, so a body that may name one (as
            # tritonclient's HTTP client sends parameters) is read first; every other body is decoded after, as before.
            decoded = decoded or self._decode(body, length, shared_memory)
            given = decoded.parameters.get(STICKY_PARAMETER)
            key = given if isinstance(given, str) and given else None
        spec = await self._infer_spec(model, version, key)
        with await dataplane.admit(spec, "predict", PROTOCOL, self.timeout) as call:
            servable = call.servable
            if isinstance(servable, WholeRequestServable):  # MLServer's runtimes: the request as sent, parameters too
                if length is not None:
                    raise ServingError(Code.INVALID_ARGUMENT, f"Model {call.model} takes its tensors as JSON only")
                whole = await dataplane.answer_whole(call, v2_whole.rest_request(parse_body(body)), self.timeout)
                return v2_json.EncodedResponse(dumps(v2_whole.rest_response(call.model, call.version, whole)), None)
            decoded = decoded or self._decode(body, length, shared_memory)
            v2_stream.refuse_decoupled(call, "HTTP end point")
            dialect = dialect_of(servable)
            if dialect is not None:  # a model served as its own server serves it (MLServer's runtimes)
                return await self._run_dialect(call, dialect, decoded, shared_memory)
            specs = input_specs(servable.signatures, DEFAULT_SIGNATURE, tuple(decoded.inputs))
            v2_json.check_datatypes(decoded, specs)
            wanted = [output.name for output in decoded.outputs]
            explaining = v2_parameters(decoded.parameters)
            if explaining is not None:  # "explain": true (see workbench.frontends.v2_explain)
                answer = await dataplane.explain(
                    call, DEFAULT_SIGNATURE, decoded.inputs, explaining, self._timeout(decoded)
                )
                outputs = explained_outputs(call.model, answer, wanted)
                head = answer.explanation.head()
                return v2_json.encode_infer_response(call.model, call.version, decoded, outputs, shared_memory, head)
            _, outputs = await dataplane.predict(
                call,
                DEFAULT_SIGNATURE,
                decoded.inputs,
                wanted,
                timeout=self._timeout(decoded),
                sequence=sequence_request(decoded.parameters),
            )
            counts = {output.name: output.classification for output in decoded.outputs if output.classification}
            outputs = classify(outputs, counts, servable)
            # call.version, not servable's: a sequence runs on the version it started on
            return v2_json.encode_infer_response(call.model, call.version, decoded, outputs, shared_memory)

    async def _run_dialect(
        self, call: Any, dialect: V2Dialect, decoded: v2_json.InferRequest, shared_memory: SharedMemory | None
    ) -> v2_json.EncodedResponse:
        """A request to a servable that reads v2 its own way: its dialect feeds the signature and names the answer."""
        inputs, wanted = dialect.feed(decoded)
        _, outputs = await self.dataplane.predict(
            call, DEFAULT_SIGNATURE, inputs, wanted, timeout=self._timeout(decoded)
        )
        outputs, parameters = dialect.answer(decoded, outputs)
        return v2_json.encode_infer_response(
            call.model,
            dialect.version_name or None,  # MLServer answers no model_version for a model without one
            decoded,
            outputs,
            shared_memory,
            output_parameters=parameters,
        )

    def _decode(self, body: bytes, length: str | None, shared_memory: SharedMemory | None) -> v2_json.InferRequest:
        return v2_json.decode_infer_request(body, v2_json.header_length(length, len(body)), shared_memory)

    def _shared_memory(self, peer: str) -> SharedMemory | None:
        """The regions a request from ``peer`` may name in its inputs and outputs (refusals, for a client on another
        host)."""
        return self.shared_memory.for_peer(peer) if self.shared_memory is not None else None

    async def _forward(
        self,
        model: str,
        version: str | None,
        decoded: v2_json.InferRequest,
        owner: int,
        shared_memory: SharedMemory | None,
    ) -> Answer:
        """Have worker ``owner``, which holds the request's sequence, answer it (over its private gRPC socket)."""
        assert self.router is not None
        parameters = {k: v for k, v in decoded.parameters.items() if isinstance(v, (bool, int, str))}
        message = v2_client.grpc_infer_request(
            model,
            decoded.inputs,
            [output.name for output in decoded.outputs],
            version=version or "",
            request_id=decoded.id or "",
            parameters=parameters,
        )
        answer = v2_client.grpc_infer_answer(await self.router.infer(owner, message, self._timeout(decoded)))
        encoded = v2_json.encode_infer_response(
            model, answer.model_version or 0, decoded, answer.outputs, shared_memory
        )
        return _answer(encoded)

    async def _infer_spec(self, model: str, version: str | None, key: str | None) -> ModelSpec:
        """The servable an inference request names (``key``: its stickiness key); one it cannot name (an unknown
        label) is counted as refused."""
        try:
            return await self.models.loaded_spec(model, version, self.timeout, key)
        except ServingError as exc:
            self.dataplane.refused(model, "predict", PROTOCOL, exc)
            raise

    def _timeout(self, decoded: v2_json.InferRequest) -> float | None:
        """The server's request timeout, or the request's ``parameters.timeout`` (Triton's, in µs) if shorter."""
        asked = decoded.timeout_seconds
        if asked is None:
            return self.timeout
        return asked if self.timeout is None else min(asked, self.timeout)

    async def _body(self, request: Request) -> bytes:
        limit = self.settings.max_request_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise _too_large(limit)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
        return b"".join(chunks)

    # ----------------------------------------------------------------------------------- repository
    async def repository_index(self, request: Request) -> Response:
        doc = await _optional_object(request)
        ready = doc.get("ready", False)
        if not isinstance(ready, bool):
            raise ServingError(Code.INVALID_ARGUMENT, '"ready" must be true or false')
        index = v2_models.repository_index(self.models.index(), ready_only=ready)
        return json_response(dumps(index["models"]))  # Triton's HTTP API answers the bare list

    async def load(self, request: Request) -> Response:
        self.models.authorize(request.headers.get("authorization", ""))
        doc = await _optional_object(request)
        version = _version_parameter(doc, "load")
        await self.models.load(request.path_params["model"], version, load_overrides(doc.get("parameters") or {}))
        return Response(status_code=200)

    async def unload(self, request: Request) -> Response:
        self.models.authorize(request.headers.get("authorization", ""))
        doc = await _optional_object(request)
        version = _version_parameter(doc, "unload")
        dependents = doc.get("parameters", {}).get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise ServingError(Code.INVALID_ARGUMENT, "parameters.unload_dependents must be true or false")
        how = '{"parameters": {"version": N}}'
        await self.models.unload(request.path_params["model"], version, how, unload_dependents=dependents)
        return Response(status_code=200)


def _answer(encoded: v2_json.EncodedResponse) -> Answer:
    """An inference answer as Starlette's Response sent it: JSON, or with raw tensors after the JSON, the header's
    length in Inference-Header-Content-Length (before the others, as a Response given that header sends it)."""
    if encoded.json_length is None:
        return answer_of(encoded.body)
    return with_header(_HEADER_LENGTH_RAW, str(encoded.json_length).encode(), answer_of(encoded.body, 200, BINARY))


def _error_answer(error: ServingError) -> Answer:
    """:func:`~workbench.frontends.rest.error_response`'s answer."""
    return answer_of(encode_error(error.message), error.http_status)


@functools.lru_cache(maxsize=1024)  # a port sees a few paths over and over: the regex once per path, not per request
def _infer_match(path: str) -> re.Match[str] | None:
    """``…/infer``'s match, as Starlette's routes match it (the model's first, then a version's)."""
    return _INFER_PATH.match(path) or _INFER_VERSION_PATH.match(path)


def _too_large(limit: int) -> ServingError:
    return ServingError(
        Code.RESOURCE_EXHAUSTED,
        f"Request body is larger than the server's limit of {limit} bytes "
        "(workbench serve --rest_api_max_request_bytes)",
    )


async def _optional_object(request: Request) -> dict[str, Any]:
    body = await request.body()
    return parse_body(body) if body.strip() else {}


def _version_parameter(doc: dict[str, Any], action: str) -> int | None:
    """``{"parameters": {"version": N}}`` (a number or digits) of a repository load or unload."""
    parameters = doc.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise ServingError(Code.INVALID_ARGUMENT, '"parameters" must be a JSON object')
    refused = unsupported_parameters(list(parameters), action)
    if refused is not None:
        raise refused
    version = parameters.get("version")
    if version is None:
        return None
    if isinstance(version, str) and version.isdigit():
        return int(version)
    if isinstance(version, int) and not isinstance(version, bool) and version >= 0:
        return version
    raise ServingError(Code.INVALID_ARGUMENT, f"parameters.version must be a version number, got {version!r}")


def _answering(handler: Handler) -> Handler:
    """Every outcome is an answer: a ServingError its status and ``{"error"}``, a bug a logged 500."""

    @functools.wraps(handler)
    async def answer(request: Request) -> Response:
        try:
            return await handler(request)
        except ServingError as exc:
            return error_response(exc)
        except Exception as exc:  # a bug must still answer JSON, and be logged
            log.exception("v2 REST %s %s failed", request.method, request.url.path)
            return error_response(from_exception(exc))

    return answer


def v2_api(
    dataplane: Dataplane,
    controlplane: ControlPlane,
    settings: V2Settings | None = None,
    router: SequenceRouter | None = None,
    shared_memory: SharedMemoryAccess | None = None,
    hand_off_async: AsyncHandOff | None = None,
) -> V2Rest:
    """The v2 handlers for the REST app: reads and inference through ``dataplane``, repository loads and unloads
    through ``controlplane``; ``router`` hands a sequence's requests to the worker that holds it (with
    --num_workers); ``shared_memory``: the server's shared-memory regions (None: no shared-memory routes, and
    requests naming a region are UNIMPLEMENTED); ``hand_off_async`` queues requests whose ``parameters.async`` is
    true (None: it is an ordinary parameter). :func:`v2_routes` mounts them; the API is also the hot route of
    ``…/infer`` (:mod:`workbench.frontends.hot_routes`)."""
    return V2Rest(dataplane, controlplane, settings or V2Settings(), router, shared_memory, hand_off_async)


def v2_routes(api: V2Rest) -> list[Route]:
    """``api``'s routes."""
    dataplane, shared_memory = api.dataplane, api.shared_memory
    generate = v2_stream.Generate(dataplane, api.models, api._body, api.timeout, PROTOCOL)  # noqa: SLF001 - the stream reads bodies as the REST API does
    table: list[tuple[str, Handler, str]] = [
        ("/v2", api.server_metadata, "GET"),
        ("/v2/health/live", api.live, "GET"),
        ("/v2/health/ready", api.ready, "GET"),
        ("/v2/models/stats", api.statistics, "GET"),  # before /v2/models/{model}
        ("/v2/repository/index", api.repository_index, "POST"),
        ("/v2/repository/models/{model:str}/load", api.load, "POST"),
        ("/v2/repository/models/{model:str}/unload", api.unload, "POST"),
    ]
    for base in (_MODEL, _VERSION):
        table += [
            (base, api.model_metadata, "GET"),
            (f"{base}/ready", api.model_ready, "GET"),
            (f"{base}/infer", api.infer, "POST"),
            (f"{base}/config", api.model_config, "GET"),
            (f"{base}/stats", api.statistics, "GET"),
            (f"{base}/generate", generate.generate, "POST"),  # Triton's generate extension: v2_stream
            (f"{base}/generate_stream", generate.generate_stream, "POST"),
            (f"{base}/infer_stream", generate.infer_stream, "POST"),  # MLServer's: v2 requests, v2 responses
        ]
    if shared_memory is not None:  # Triton's system and CUDA shared-memory extensions
        table += shared_memory_routes(shared_memory)
    return [Route(path, _answering(handler), methods=[method]) for path, handler, method in table]
