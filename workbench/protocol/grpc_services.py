"""Each gRPC protocol's services, described once: what the server's frontends register and Ray's proxy reads.

A service here is the generated ``add_*Servicer_to_server`` function of its ``.proto`` and the methods that file
declares (read from its descriptor, with their request and response types and streaming kinds), so a frontend
that registers through :meth:`GrpcService.add` serves exactly the methods listed, and Ray Serve's gRPC proxy
(:mod:`workbench.ray.grpc_methods`) is handed the same functions and the same method list. A **new gRPC protocol**
is one more entry in :data:`SERVICES`.

TF Serving's protos load without running ``tensorflow/__init__`` (runtime/tensorflow_protos.py): Ray's proxy actor
imports this module and must not import TensorFlow.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any

from google.protobuf.descriptor import ServiceDescriptor

import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip
from tensorflow_serving.apis import (
    model_service_pb2,
    model_service_pb2_grpc,
    prediction_service_pb2,
    prediction_service_pb2_grpc,
)
from tritonclient.grpc import service_pb2, service_pb2_grpc

from workbench.protocol.torchserve import inference_pb2, inference_pb2_grpc, management_pb2, management_pb2_grpc


class Streaming(enum.Enum):
    """A method's streaming kind, as gRPC names them."""

    UNARY = "unary_unary"
    SERVER = "unary_stream"
    CLIENT = "stream_unary"
    BIDI = "stream_stream"


@dataclasses.dataclass(frozen=True)
class GrpcMethod:
    """One RPC: its name, its request and response messages' full names, and its streaming kind."""

    name: str
    request_type: str
    response_type: str
    streaming: Streaming


@dataclasses.dataclass(frozen=True)
class GrpcService:
    """One gRPC service: its full name, its methods, and the generated function that adds a servicer of it to a
    server (``add_to_server(servicer, server)``)."""

    full_name: str
    methods: tuple[GrpcMethod, ...]
    add_to_server: Callable[[Any, Any], None]

    def add(self, servicer: object, server: Any) -> None:
        """Register ``servicer`` (an object with one method per RPC) on ``server`` (grpc or grpc.aio)."""
        self.add_to_server(servicer, server)

    def method(self, name: str) -> GrpcMethod:
        return next(m for m in self.methods if m.name == name)


def _service(descriptor: ServiceDescriptor, add_to_server: Callable[[Any, Any], None]) -> GrpcService:
    """A service as its ``.proto`` declares it (every method, in the file's order)."""
    methods = tuple(
        GrpcMethod(
            m.name,
            m.input_type.full_name,
            m.output_type.full_name,
            _STREAMING[(m.client_streaming, m.server_streaming)],
        )
        for m in descriptor.methods
    )
    return GrpcService(descriptor.full_name, methods, add_to_server)


_STREAMING = {
    (False, False): Streaming.UNARY,
    (False, True): Streaming.SERVER,
    (True, False): Streaming.CLIENT,
    (True, True): Streaming.BIDI,
}

# TF Serving's gRPC API.
TF_SERVING_PREDICTION = _service(
    prediction_service_pb2.DESCRIPTOR.services_by_name["PredictionService"],
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server,
)
TF_SERVING_MODEL = _service(
    model_service_pb2.DESCRIPTOR.services_by_name["ModelService"],
    model_service_pb2_grpc.add_ModelServiceServicer_to_server,
)
# The Open Inference Protocol (Triton's v2 gRPC API), with Triton's extensions.
V2_INFERENCE = _service(
    service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"],
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server,
)
# TorchServe's gRPC APIs.
TORCHSERVE_INFERENCE = _service(
    inference_pb2.DESCRIPTOR.services_by_name["InferenceAPIsService"],
    inference_pb2_grpc.add_InferenceAPIsServiceServicer_to_server,
)
TORCHSERVE_MANAGEMENT = _service(
    management_pb2.DESCRIPTOR.services_by_name["ManagementAPIsService"],
    management_pb2_grpc.add_ManagementAPIsServiceServicer_to_server,
)

SERVICES = (TF_SERVING_PREDICTION, TF_SERVING_MODEL, V2_INFERENCE, TORCHSERVE_INFERENCE, TORCHSERVE_MANAGEMENT)
