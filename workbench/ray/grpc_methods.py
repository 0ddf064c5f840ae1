"""Workbench's gRPC services behind Ray Serve's gRPC proxy.

Ray's proxy registers a service from a function like the generated ``add_*Servicer_to_server`` and sends each call
to a deployment method named after the RPC (``Predict``, ``ModelInfer`` …), with the request decoded and a
serialisable stand-in for the servicer context. The functions here are what ``grpc_servicer_functions`` names:
they register the services :mod:`workbench.protocol.grpc_services` describes, the server's own (whose protos load
without running ``tensorflow/__init__``: the proxy actor must not import TensorFlow), and :func:`ray_methods` gives
the replica one method per unary RPC of those descriptions that calls workbench's own servicer, so the rules of TF
Serving's, v2's and TorchServe's gRPC APIs live once, in ``workbench.frontends``, and a method the server serves is
served through Ray too.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from tritonclient.grpc import model_config_pb2, service_pb2

from workbench.protocol import grpc_services
from workbench.protocol.grpc_services import GrpcService, Streaming

# Ray's proxy pickles each decoded request to the replica, and a message class pickles by its module's name.
# Triton's generated classes name the module their .proto file would have ("grpc_service_pb2"), which no import
# finds; both the proxy and the replica import this module, so the names resolve in both.
sys.modules.setdefault("grpc_service_pb2", service_pb2)
sys.modules.setdefault("model_config_pb2", model_config_pb2)

# The services Ray's proxy serves (protocol/grpc_services.py describes each), by the replica's attribute holding
# its servicer. Every unary method of each is answered through the servicer; streaming ones (v2's ModelStreamInfer,
# TorchServe's StreamPredictions and StreamPredictions2) are not: the servicers write a stream on grpc.aio's
# context, which Ray's does not offer.
RAY_SERVICES: tuple[tuple[GrpcService, str], ...] = (
    (grpc_services.TF_SERVING_PREDICTION, "prediction_service"),
    (grpc_services.TF_SERVING_MODEL, "model_service"),
    (grpc_services.V2_INFERENCE, "inference_service"),
    (grpc_services.TORCHSERVE_INFERENCE, "torchserve_inference"),
    (grpc_services.TORCHSERVE_MANAGEMENT, "torchserve_management"),
)
# Unary methods answered UNIMPLEMENTED through Ray: each would change the one replica that answers, not the
# deployment.
REFUSED_METHODS = {
    "HandleReloadConfigRequest": "on Ray Serve, change what is served by deploying again (workbench.ray.deploy)",
    "RepositoryModelLoad": "on Ray Serve, every replica loads what the repository holds; export a version there",
    "RepositoryModelUnload": "on Ray Serve, every replica serves what the repository holds; remove it there",
    "RegisterModel": "on Ray Serve, every replica loads what the repository holds; export a version there",
    "UnregisterModel": "on Ray Serve, every replica serves what the repository holds; remove it there",
    "ScaleWorker": "on Ray Serve, scale the deployment's replicas (num_replicas) instead",
}  # TorchServe's SetDefault is a promotion: written to the repository's routing, which every replica reads

# Metadata on every answer: which replica answered (tests, and operators reading a trace).
REPLICA_METADATA = "workbench-replica"


# What ``grpc_servicer_functions`` names, one per service: Ray's proxy imports them by path (in this module, so
# that the proxy gets the module aliases above and TF Serving's protos without TensorFlow).
def add_prediction_service(servicer: Any, server: grpc.Server) -> None:
    grpc_services.TF_SERVING_PREDICTION.add(servicer, server)


def add_model_service(servicer: Any, server: grpc.Server) -> None:
    grpc_services.TF_SERVING_MODEL.add(servicer, server)


def add_inference_service(servicer: Any, server: grpc.Server) -> None:
    grpc_services.V2_INFERENCE.add(servicer, server)


def add_torchserve_inference(servicer: Any, server: grpc.Server) -> None:
    grpc_services.TORCHSERVE_INFERENCE.add(servicer, server)


def add_torchserve_management(servicer: Any, server: grpc.Server) -> None:
    grpc_services.TORCHSERVE_MANAGEMENT.add(servicer, server)


_ADDERS = {
    "prediction_service": add_prediction_service,
    "model_service": add_model_service,
    "inference_service": add_inference_service,
    "torchserve_inference": add_torchserve_inference,
    "torchserve_management": add_torchserve_management,
}
SERVICER_FUNCTIONS = [f"{__name__}.{_ADDERS[attribute].__name__}" for _, attribute in RAY_SERVICES]


class Aborted(grpc.aio.AbortError):
    """The servicer ended the call with a status: it is set on Ray's context, and the answer carries no message."""


class RayCallContext:
    """What workbench's servicers use of ``grpc.aio.ServicerContext``, over Ray Serve's context.

    Ray's proxy carries the status and trailing metadata set here back to the client. It does not hand on the
    client's deadline (the proxy applies its own request timeout), so :meth:`time_remaining` is None.
    """

    def __init__(self, ray_context: Any, replica: str) -> None:
        self._ray = ray_context
        self._ray.set_trailing_metadata([(REPLICA_METADATA, replica)])

    def time_remaining(self) -> float | None:
        return None

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return list(self._ray.invocation_metadata())

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self._ray.set_code(code)
        self._ray.set_details(details)
        raise Aborted()


class _NoMessage:
    """The answer of a call that ended with a status: no message (empty bytes decode as any proto3 message)."""

    @staticmethod
    def SerializeToString() -> bytes:  # noqa: N802 - the protobuf method Ray calls
        return b""


Servicer = Callable[[Any, Any], Awaitable[Any]]


def ray_method(name: str, servicer: Callable[[Any], Servicer | None]) -> Callable[..., Awaitable[Any]]:
    """A deployment method for RPC ``name``: ``servicer(replica)`` is the bound servicer method to call.

    Ray passes the context as the ``grpc_context`` keyword (it looks for that parameter name).
    """

    async def method(self: Any, request: Any, grpc_context: Any) -> Any:
        context = RayCallContext(grpc_context, self.replica_id)
        handler = servicer(self)
        try:
            if handler is None:
                await context.abort(
                    grpc.StatusCode.UNIMPLEMENTED, f"{name} is not served here: {REFUSED_METHODS[name]}"
                )
                raise AssertionError("abort returned")  # pragma: no cover
            return await handler(request, context)
        except Aborted:
            return _NoMessage()

    method.__name__ = method.__qualname__ = name
    return method


def ray_methods() -> dict[str, Callable[..., Awaitable[Any]]]:
    """Every RPC the replica answers, by name (Ray routes a call by its method name alone)."""

    def bound(attribute: str, method: str) -> Callable[[Any], Servicer]:
        return lambda replica: getattr(getattr(replica, attribute), method)

    methods: dict[str, Callable[..., Awaitable[Any]]] = {}
    for service, attribute in RAY_SERVICES:
        for method in service.methods:
            if method.streaming is not Streaming.UNARY:
                continue
            name = method.name
            if name in REFUSED_METHODS:
                methods[name] = ray_method(name, lambda replica: None)
            else:
                methods[name] = ray_method(name, bound(attribute, name))
    return methods
