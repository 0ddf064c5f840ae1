"""Each gRPC protocol's description (workbench/protocol/grpc_services.py) against what reads it: the frontends'
servicers answer every method their service declares, and Ray's proxy carries every unary one."""

from __future__ import annotations

import pytest

from workbench.frontends.grpc import ModelService, PredictionService
from workbench.frontends.torchserve_grpc import TorchServeInference, TorchServeManagement
from workbench.frontends.v2_grpc import InferenceService
from workbench.protocol import grpc_services
from workbench.protocol.grpc_services import Streaming
from workbench.ray import grpc_methods

SERVICERS = [
    (grpc_services.TF_SERVING_PREDICTION, PredictionService),
    (grpc_services.TF_SERVING_MODEL, ModelService),
    (grpc_services.V2_INFERENCE, InferenceService),
    (grpc_services.TORCHSERVE_INFERENCE, TorchServeInference),
    (grpc_services.TORCHSERVE_MANAGEMENT, TorchServeManagement),
]


def test_every_service_has_a_servicer() -> None:
    assert {service.full_name for service, _ in SERVICERS} == {s.full_name for s in grpc_services.SERVICES}


@pytest.mark.parametrize("service, servicer", SERVICERS, ids=lambda x: getattr(x, "full_name", ""))
def test_a_servicer_answers_every_method_of_its_service(service, servicer) -> None:
    # Defined by workbench's class, not inherited from the generated servicer (whose methods answer UNIMPLEMENTED).
    missing = [m.name for m in service.methods if m.name not in vars(servicer)]
    assert not missing, f"{servicer.__name__} lacks {missing}"


def test_ray_carries_every_unary_method_of_every_service() -> None:
    unary = {m.name for s in grpc_services.SERVICES for m in s.methods if m.streaming is Streaming.UNARY}
    assert set(grpc_methods.ray_methods()) == unary
    assert set(grpc_methods.REFUSED_METHODS) <= unary
    assert len(grpc_methods.SERVICER_FUNCTIONS) == len(grpc_services.SERVICES)


def test_streaming_kinds_come_from_the_protos() -> None:
    assert grpc_services.V2_INFERENCE.method("ModelStreamInfer").streaming is Streaming.BIDI
    assert grpc_services.TORCHSERVE_INFERENCE.method("StreamPredictions").streaming is Streaming.SERVER
    assert grpc_services.TF_SERVING_PREDICTION.method("Predict").request_type == "tensorflow.serving.PredictRequest"
