"""TF Serving's gRPC API on ``grpc.aio``: PredictionService, ModelService and grpc.health.v1.

Thin like the REST frontend: protos in, the dataplane in the middle, protos out. Servicers are the
generated ones from ``tensorflow-serving-api``, so any TF Serving client works unchanged. The health service
answers with the server's readiness (the same as REST's ``/readyz``): SERVING exactly when that is 200.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

# Loads TF Serving's protos without running tensorflow/__init__ (seconds): see runtime/tensorflow_protos.py.
import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    inference_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from workbench.config.options import GrpcTLS
from workbench.core import inference
from workbench.core.errors import Code, ServingError, from_exception
from workbench.core.signatures import CLASSIFY_METHOD
from workbench.core.sticky import STICKY_METADATA
from workbench.frontends.auth import bearer_matches
from workbench.models.configs import model_configs_from_proto
from workbench.models.readiness import Readiness
from workbench.observability import tracing
from workbench.planes.controlplane import ControlPlane
from workbench.planes.dataplane import Dataplane, ModelSpec
from workbench.protocol import grpc_services
from workbench.protocol.examples import serialized_examples
from workbench.protocol.serving_protos import model_status_proto
from workbench.protocol.signature_defs import signature_def_map
from workbench.protocol.tensor_proto import from_numpy, to_numpy

log = logging.getLogger(__name__)

PREDICTION_SERVICE = "tensorflow.serving.PredictionService"
MODEL_SERVICE = "tensorflow.serving.ModelService"
INFERENCE_SERVICE = "inference.GRPCInferenceService"  # the Open Inference Protocol's (frontends/v2_grpc.py)
# TorchServe's (frontends/torchserve_grpc.py)
TORCHSERVE_INFERENCE_SERVICE = "org.pytorch.serve.grpc.inference.InferenceAPIsService"
TORCHSERVE_MANAGEMENT_SERVICE = "org.pytorch.serve.grpc.management.ManagementAPIsService"


def _spec(model_spec: Any, key: str | None = None) -> ModelSpec:
    which = model_spec.WhichOneof("version_choice")
    return ModelSpec(
        name=model_spec.name,
        version=model_spec.version.value if which == "version" else None,
        label=model_spec.version_label if which == "version_label" else None,
        signature_name=model_spec.signature_name,
        key=key,
    )


def sticky_key(context: grpc.aio.ServicerContext) -> str | None:
    """The call's stickiness key (``x-workbench-key`` metadata), if it has one."""
    for name, value in context.invocation_metadata() or ():
        if name == STICKY_METADATA:
            return str(value)
    return None


def _echo(target: Any, name: str, version: int, signature_name: str | None) -> None:
    """Fill a response's model_spec with the resolved name, version and signature, as TF Serving does."""
    target.name = name
    target.version.value = version
    if signature_name is not None:
        target.signature_name = signature_name


def authorization(context: grpc.aio.ServicerContext) -> str:
    """The call's ``authorization`` metadata ("" when it has none)."""
    return str(dict(context.invocation_metadata() or ()).get("authorization", ""))


def time_remaining(context: grpc.aio.ServicerContext) -> float | None:
    """Seconds left before the client's deadline; None when it set none."""
    remaining = context.time_remaining()
    return remaining if remaining is not None and remaining > 0 else None


_STATUS = {code: grpc.StatusCode[code.name] for code in Code}
Method = TypeVar("Method", bound=Callable[..., Awaitable[Any]])


def answers_errors(method: Method) -> Method:
    """A servicer method whose ServingErrors (and bugs) end the RPC with their gRPC status, never UNKNOWN.

    Every unary RPC of TF Serving's services and of v2's wears it, so the rule lives once: the engine's code
    and message as they are, and a bug logged with its traceback but answered as a status (INTERNAL).
    """

    @functools.wraps(method)
    async def answered(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            if type(request) is Unparsable:
                raise ServingError(Code.INVALID_ARGUMENT, request.reason)
            return await method(self, request, context)
        except ServingError as exc:
            error = exc
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except Exception as exc:  # a bug must still answer a status, and be logged
            log.exception("gRPC %s failed", method.__name__)
            error = from_exception(exc)
        await context.abort(_STATUS[error.code], status_message(error.message))

    return cast(Method, answered)


# The longest grpc-message trailer an error gets, in bytes once percent-encoded as gRPC sends it. Clients refuse
# trailers over 8 KiB (gRPC's default metadata limit) and report RESOURCE_EXHAUSTED instead of the real status, so
# an error that repeats a request's 10,000-character name must be cut, not sent whole.
MAX_STATUS_MESSAGE_BYTES = 4096
_ALWAYS_FITS = MAX_STATUS_MESSAGE_BYTES // 12  # characters: 4 UTF-8 bytes each, each percent-encoded as 3


def status_message(message: str) -> str:
    """``message`` as it fits in a gRPC status: cut (saying so) past ``MAX_STATUS_MESSAGE_BYTES`` on the wire."""
    if len(message) <= _ALWAYS_FITS:
        return message
    budget = MAX_STATUS_MESSAGE_BYTES - 64  # room for the note saying what was cut
    for index, character in enumerate(message):
        # gRPC percent-encodes every byte outside printable ASCII, and "%" itself
        cost = 1 if " " <= character <= "~" and character != "%" else 3 * len(character.encode("utf-8", "replace"))
        budget -= cost
        if budget < 0:
            return f"{message[:index]}… ({len(message) - index} more characters)"
    return message


class Unparsable:
    """What a request that is not its method's message decodes to, so that the method answers INVALID_ARGUMENT.

    grpc.aio itself answers such bytes with UNKNOWN (and logs a traceback per request); a client sending garbage,
    or a string field that is not UTF-8, made a mistake the status should name. :func:`answers_errors` turns this
    into that status.
    """

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class TolerantRegistration:
    """The server as a generated ``add_*Servicer_to_server`` sees it: each unary method is registered with a parser
    that returns an :class:`Unparsable` instead of raising.

    Wrapping at registration costs a request nothing (an interceptor, checked per call, cost 7-25% of the gRPC
    rate); the servicer's methods wear :func:`answers_errors`, which answers an Unparsable.
    """

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, generic_handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        for generic in generic_handlers:
            methods = getattr(generic, "_method_handlers", None)  # grpc.method_handlers_generic_handler's table
            if methods is not None:
                generic._method_handlers = {name: _registered(handler, name) for name, handler in methods.items()}  # type: ignore[attr-defined]  # noqa: SLF001
        self._server.add_generic_rpc_handlers(generic_handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        tolerant = {name: _registered(handler, f"/{service}/{name}") for name, handler in handlers.items()}
        self._server.add_registered_method_handlers(service, tolerant)  # type: ignore[attr-defined]


def _registered(handler: Any, method: str) -> Any:
    """``handler`` as registered: tolerant of garbage, and when tracing is on, noting each call's trace context."""
    handler = _tolerant(handler, method)
    return tracing.active.grpc_handler(handler, method) if tracing.active is not None else handler


def _tolerant(handler: Any, method: str) -> Any:
    parse = handler.request_deserializer
    if handler.unary_unary is None or parse is None:
        return handler  # streams keep gRPC's handling

    def parse_or_explain(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError, and whatever a parser raises
            return Unparsable(f"The request is not a valid message for {method}: {exc}")

    return handler._replace(request_deserializer=parse_or_explain)


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, dataplane: Dataplane) -> None:
        self.dataplane = dataplane

    def add_to(self, server: grpc.aio.Server) -> None:
        grpc_services.TF_SERVING_PREDICTION.add(self, server)

    @answers_errors
    async def Predict(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        spec = _spec(request.model_spec, sticky_key(context))
        dataplane = self.dataplane
        with await dataplane.admit(spec, "predict", "grpc", time_remaining(context)) as call:
            specs = dataplane.grpc_input_specs(call.servable, spec.signature_name)
            inputs = {alias: to_numpy(proto, alias, specs.get(alias)) for alias, proto in request.inputs.items()}
            signature, outputs = await dataplane.predict(
                call, spec.signature_name, inputs, list(request.output_filter), timeout=time_remaining(context)
            )
            response = predict_pb2.PredictResponse()
            _echo(response.model_spec, spec.name, call.version, signature.name)
            for alias, value in outputs.items():
                from_numpy(value, response.outputs[alias])
            return response

    @answers_errors
    async def Classify(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return await self._examples("classify", request, context)

    @answers_errors
    async def Regress(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return await self._examples("regress", request, context)

    async def _examples(self, api: str, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Classify and Regress: an ``Input`` of tf.Examples in, a ClassificationResult/RegressionResult out."""
        spec = _spec(request.model_spec, sticky_key(context))
        with await self.dataplane.admit(spec, api, "grpc", time_remaining(context)) as call:
            examples = serialized_examples(request.input)
            timeout = time_remaining(context)
            if api == "classify":
                name, labelled = await self.dataplane.classify(call, spec.signature_name, examples, timeout)
                response = classification_pb2.ClassificationResponse()
                _fill_classifications(response.result, labelled)
            else:
                name, values = await self.dataplane.regress(call, spec.signature_name, examples, timeout)
                response = regression_pb2.RegressionResponse()
                for value in values:
                    response.result.regressions.add().value = value
            _echo(response.model_spec, spec.name, call.version, name)
            return response

    @answers_errors
    async def MultiInference(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        if not request.tasks:
            raise ServingError(Code.INVALID_ARGUMENT, "Tasks are empty")
        specs = [_spec(task.model_spec) for task in request.tasks]
        if len({(s.name, s.version, s.label) for s in specs}) != 1:
            raise ServingError(
                Code.INVALID_ARGUMENT, "All ModelSpecs in a MultiInferenceRequest must access the same model"
            )
        with await self.dataplane.admit(specs[0], "multi_inference", "grpc", time_remaining(context)) as call:
            tasks = [
                inference.InferenceTask(s.signature_name, t.method_name)
                for s, t in zip(specs, request.tasks, strict=True)
            ]
            examples = serialized_examples(request.input)
            results = await self.dataplane.multi_inference(call, tasks, examples, timeout=time_remaining(context))
            response = inference_pb2.MultiInferenceResponse()
            for (name, result), task in zip(results, tasks, strict=True):
                entry = response.results.add()
                _echo(entry.model_spec, specs[0].name, call.version, name)
                if task.method_name == CLASSIFY_METHOD:
                    _fill_classifications(entry.classification_result, result)
                else:
                    for value in result:
                        entry.regression_result.regressions.add().value = value
            return response

    @answers_errors
    async def GetModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        if not request.metadata_field:
            raise ServingError(
                Code.INVALID_ARGUMENT, "GetModelMetadataRequest must specify at least one metadata_field"
            )
        for field in request.metadata_field:
            if field != "signature_def":
                raise ServingError(Code.INVALID_ARGUMENT, f"Metadata field {field} is not supported")
        spec = _spec(request.model_spec)
        await self.dataplane.loaded(spec.name, time_remaining(context), spec)
        with self.dataplane.handle(spec) as servable:
            response = get_model_metadata_pb2.GetModelMetadataResponse()
            _echo(response.model_spec, spec.name, servable.version, None)
            response.metadata["signature_def"].Pack(signature_def_map(servable))
            return response


def _fill_classifications(result: Any, rows: inference.Classifications) -> None:
    for row in rows:
        classifications = result.classifications.add()
        for label, score in row:
            entry = classifications.classes.add()
            entry.label = label
            entry.score = score


class ModelService(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, dataplane: Dataplane, controlplane: ControlPlane, management_token: str = "") -> None:
        """Model status is read through ``dataplane``; a config reload is ``controlplane``'s. ``management_token``,
        when set, guards HandleReloadConfigRequest (``authorization: Bearer <token>`` metadata), as it guards the
        REST management API: a reload points models at any path."""
        self.dataplane = dataplane
        self._controlplane = controlplane
        self._token = management_token

    def add_to(self, server: grpc.aio.Server) -> None:
        grpc_services.TF_SERVING_MODEL.add(self, server)

    @answers_errors
    async def GetModelStatus(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        if not request.HasField("model_spec"):
            raise ServingError(Code.INVALID_ARGUMENT, "Missing ModelSpec")
        spec = _spec(request.model_spec)
        await self.dataplane.loaded(spec.name, time_remaining(context))
        return model_status_proto(self.dataplane.model_status(spec.name, spec.version, spec.label))

    @answers_errors
    async def HandleReloadConfigRequest(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        if self._token and not bearer_matches(authorization(context), self._token):
            raise ServingError(Code.UNAUTHENTICATED, "Reloading the model config needs the server's management token")
        which = request.config.WhichOneof("config")
        if which != "model_config_list":
            raise ServingError(Code.UNIMPLEMENTED, "ServerConfig type not supported: only model_config_list is")
        models = model_configs_from_proto(request.config.model_config_list)
        await asyncio.get_running_loop().run_in_executor(None, self._controlplane.reload_config, models)
        response = model_management_pb2.ReloadConfigResponse()
        response.status.error_code = 0
        return response


class ReadinessHealth(health_pb2_grpc.HealthServicer):
    """grpc.health.v1 with the server's readiness as the status of the server ("") and of each service.

    ``Check`` reads readiness when asked. ``Watch`` streams a status whenever :meth:`changed` is called, and ends
    once the server drains, so a watcher never holds a drain open until its deadline.
    """

    SERVICES = (
        "",
        PREDICTION_SERVICE,
        MODEL_SERVICE,
        INFERENCE_SERVICE,
        TORCHSERVE_INFERENCE_SERVICE,
        TORCHSERVE_MANAGEMENT_SERVICE,
    )

    def __init__(self, readiness: Callable[[], Readiness]) -> None:
        self._readiness = readiness
        self._changed = asyncio.Event()  # replaced on each change: Watch waits on the one it read before

    def changed(self) -> None:
        """Readiness may have changed: wake the watchers (call on the server's event loop)."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _status(self, service: str) -> tuple[int, bool]:
        """The status of ``service``, and whether the server is draining."""
        readiness = self._readiness()
        draining = readiness.status == "draining"
        if service not in self.SERVICES:
            return health_pb2.HealthCheckResponse.SERVICE_UNKNOWN, draining
        if readiness.ready:
            return health_pb2.HealthCheckResponse.SERVING, draining
        return health_pb2.HealthCheckResponse.NOT_SERVING, draining

    async def Check(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        if request.service not in self.SERVICES:
            await context.abort(grpc.StatusCode.NOT_FOUND, status_message(f"Unknown service: {request.service!r}"))
        return health_pb2.HealthCheckResponse(status=self._status(request.service)[0])

    async def Watch(self, request: Any, context: grpc.aio.ServicerContext) -> None:  # noqa: N802
        last = None
        while True:
            changed = self._changed
            status, draining = self._status(request.service)
            if status != last:
                await context.write(health_pb2.HealthCheckResponse(status=status))
                last = status
            if draining:
                return
            await changed.wait()


async def start_grpc_server(
    *,
    address: str | None,
    socket_path: str = "",
    max_message_bytes: int,
    channel_arguments: tuple[tuple[str, Any], ...] = (),
    health: ReadinessHealth | None = None,
    services: Sequence[Callable[[grpc.aio.Server], None]] = (),
    reuse_port: bool = False,
    tls: GrpcTLS | None = None,
    private_socket: str = "",
) -> tuple[grpc.aio.Server, int | None]:
    """Start the gRPC server; returns it with the bound TCP port (None when only a Unix socket is served).

    ``health`` answers grpc.health.v1 (default: SERVING whenever the server answers). ``services`` add the
    servicers (TF Serving's PredictionService and ModelService, the v2 ``inference.GRPCInferenceService``: see
    :mod:`workbench.frontends.wiring`); each is given a :class:`TolerantRegistration`, so its methods must wear
    :func:`answers_errors`. ``tls`` (``--ssl_config_file``)
    secures the TCP port and the Unix socket alike, as in TF Serving. ``private_socket``: a worker's own Unix socket
    in the supervisor's private run folder, where its siblings hand it the requests of the sequences it holds
    (without TLS: only this server's user can open that folder).
    """
    options = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", int(reuse_port)),  # on only for --num_workers: a taken port must fail otherwise
        *channel_arguments,
    ]
    server = grpc.aio.server(options=options)
    # Services whose methods wear answers_errors: garbage gets INVALID_ARGUMENT. Health keeps gRPC's own handling.
    registration = cast(grpc.aio.Server, TolerantRegistration(server))
    for add_service in services:
        add_service(registration)
    health = health or ReadinessHealth(lambda: Readiness(True, "ready"))
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    credentials = _server_credentials(tls) if tls is not None else None

    def add_port(where: str) -> int:
        if credentials is None:
            return server.add_insecure_port(where)
        return server.add_secure_port(where, credentials)

    port = None
    if address is not None:
        try:
            port = add_port(address)
        except RuntimeError:  # grpc raises when the port is taken
            port = 0
        if port == 0:
            raise ServingError(Code.UNAVAILABLE, f"Could not bind the gRPC port {address}: address already in use")
    if socket_path:
        add_port(f"unix:{socket_path}")
    if private_socket:
        with contextlib.suppress(FileNotFoundError):  # a restarted worker's predecessor left it
            os.unlink(private_socket)
        server.add_insecure_port(f"unix:{private_socket}")
    await server.start()
    return server, port


def _server_credentials(tls: GrpcTLS) -> grpc.ServerCredentials:
    """TF Serving's credentials for an SSLConfig: its key and certificate, and with ``client_verify``, client
    certificates required and checked against ``custom_ca`` (gRPC's REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY).

    gRPC reports a key that is not the certificate's, or a PEM it cannot read, only as a failure to bind (and a
    log line): a throwaway server binding a free loopback port with them tells that apart from a taken port.
    """
    credentials = grpc.ssl_server_credentials(
        [(tls.server_key, tls.server_cert)], root_certificates=tls.custom_ca, require_client_auth=tls.client_verify
    )
    probe = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=1))
    try:
        probe.add_secure_port("127.0.0.1:0", credentials)
    except RuntimeError:
        raise ServingError(
            Code.INVALID_ARGUMENT,
            "--ssl_config_file: gRPC cannot use its server_key and server_cert (a key that is not the "
            "certificate's, or PEM text it cannot read; gRPC's log line above says which)",
        ) from None
    finally:
        probe.stop(None)
    return credentials
