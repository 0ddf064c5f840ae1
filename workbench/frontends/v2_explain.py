"""Explanations over v2: an inference request (gRPC ModelInfer, REST ``/v2/models/<m>/infer``) with the request
parameter ``"explain": true``.

No peer defines a gRPC explain (TF Serving's PredictionService has none; KServe's explain is its v1 REST verb; the
Open Inference Protocol has no explain RPC), so the explanation rides on the one inference RPC every v2 client
already speaks, as a parameter, the way Triton's clients already pass per-request parameters: ``tritonclient``'s
``infer(..., parameters={"explain": True, "target": 3})``. The other explain parameters (``explainer``, ``target``,
``output``, ``nsamples``, ``steps``, ``baseline``) are read from the same map.

The answer is the model's outputs (those requested, or all) and four more tensors: ``explain_attributions`` (FP64,
[rows, *input row shape]), ``explain_base_values`` and ``explain_values`` (FP64, [rows]) and ``explain_targets``
(INT64, [rows]); the response's parameters say which explainer ran, on which input and output, in what space.
Over gRPC, inputs and outputs in shared memory are refused (UNIMPLEMENTED), as for a client on another host. Over
REST the answer is the same tensors as JSON (or binary, as the request asks) with the same ``parameters``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.core.errors import Code, ServingError
from workbench.planes.dataplane import Dataplane, ModelSpec
from workbench.protocol import v2_grpc_messages
from workbench.protocol.attributions import TENSORS, Parameters

if TYPE_CHECKING:
    from workbench.explain.explaining import Answer


async def explain_infer(
    dataplane: Dataplane, spec: ModelSpec, request: Any, parameters: Parameters, protocol: str, timeout: float | None
) -> Any:
    """The ModelInferResponse of an explained ModelInferRequest (``protocol``: its label in the metrics)."""
    with await dataplane.admit(spec, "explain", protocol, timeout) as call:
        inputs = v2_grpc_messages.decode_inputs(request)
        requested = v2_grpc_messages.requested_outputs(request)
        answer = await dataplane.explain(call, "", inputs, parameters, timeout)
        outputs = explained_outputs(call.model, answer, requested)
        response = v2_grpc_messages.infer_response(call.model, str(call.version), request.id, outputs, list(outputs))
        for key, value in answer.explanation.head().items():
            if isinstance(value, str):
                response.parameters[key].string_param = value
            elif isinstance(value, int):
                response.parameters[key].int64_param = value
            else:
                response.parameters[key].double_param = value
        return response


def explained_outputs(model: str, answer: Answer, requested: Sequence[str]) -> dict[str, np.ndarray]:
    """The tensors of an explained v2 answer, in order: the model's outputs (those ``requested``, or all), then the
    explanation's (:data:`~workbench.protocol.attributions.TENSORS`)."""
    outputs = {**answer.predictions, **answer.explanation.tensors()}
    unknown = [name for name in requested if name not in outputs]
    if unknown:
        raise ServingError(
            Code.INVALID_ARGUMENT,
            f"Unexpected outputs {', '.join(unknown)}: model {model} has {', '.join(answer.predictions)}, and an "
            f"explanation adds {', '.join(TENSORS)}",
        )
    order = [*requested, *(name for name in TENSORS if name not in requested)] if requested else list(outputs)
    return {name: outputs[name] for name in order}
