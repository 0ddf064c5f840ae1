"""TF Serving's gRPC API (``PredictionService``, ``ModelService``): metadata, status, predict, classify and regress.

The messages are TF Serving's generated protos, loaded through :mod:`workbench.runtime.tensorflow_protos` so that
``tensorflow/__init__`` (seconds, and hundreds of megabytes) is never imported by a process that only sends requests.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from workbench.client.grpc_channels import GrpcChannels
from workbench.client.transport import Answer, Transport
from workbench.core.errors import Code, ServingError
from workbench.core.signatures import Signature
from workbench.core.sticky import sticky_metadata
from workbench.protocol.signature_defs import signature_from_proto


def fill_model_spec(spec: Any, model: str, version: int | None, label: str | None, signature_name: str = "") -> None:
    """A request's ``ModelSpec``: the model, a version or a label, and the signature."""
    if version is not None and label is not None:
        raise ValueError("give a version or a label, not both")
    spec.name = model
    if version is not None:
        spec.version.value = int(version)
    elif label is not None:
        spec.version_label = label
    if signature_name:
        spec.signature_name = signature_name


class TfsGrpcTransport(Transport):
    name = "grpc"

    def __init__(self, channels: GrpcChannels) -> None:
        self._channels = channels

    def signatures(self, model: str, version: int | None, label: str | None) -> dict[str, Signature]:
        defs = self.metadata(model, version, label).signature_def
        found = {}
        for name, proto in defs.items():
            try:
                found[name] = signature_from_proto(name, proto)
            except ServingError:  # sparse tensors: listed in the metadata, not callable from here
                continue
        return found

    def metadata(self, model: str, version: int | None, label: str | None) -> Any:
        import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (no tensorflow/__init__)
        from tensorflow_serving.apis import get_model_metadata_pb2

        request = get_model_metadata_pb2.GetModelMetadataRequest()
        fill_model_spec(request.model_spec, model, version, label)
        request.metadata_field.append("signature_def")
        response = self._channels.call("predict", "GetModelMetadata", request)
        signatures = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(signatures)
        return signatures

    def status(self, model: str, version: int | None, label: str | None) -> list[dict[str, Any]]:
        import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (no tensorflow/__init__)
        from tensorflow_serving.apis import get_model_status_pb2

        request = get_model_status_pb2.GetModelStatusRequest()
        fill_model_spec(request.model_spec, model, version, label)
        response = self._channels.call("model", "GetModelStatus", request)
        return [
            {
                "version": s.version,
                "state": get_model_status_pb2.ModelVersionStatus.State.Name(s.state),
                "error_code": Code(s.status.error_code).name,
                "error_message": s.status.error_message,
            }
            for s in response.model_version_status
        ]

    def predict(
        self,
        model: str,
        signature: Signature,
        feeds: Mapping[str, np.ndarray],
        *,
        signature_name: str,
        output_filter: Sequence[str],
        version: int | None,
        label: str | None,
        parameters: Mapping[str, bool | int | str] | None,
        key: str | None = None,
    ) -> Answer:
        started = time.perf_counter()
        import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (no tensorflow/__init__)
        from tensorflow_serving.apis import predict_pb2

        from workbench.protocol.tensor_proto import from_numpy, to_numpy

        request = predict_pb2.PredictRequest()
        fill_model_spec(request.model_spec, model, version, label, signature_name)
        for alias, value in feeds.items():
            from_numpy(value, request.inputs[alias])
        request.output_filter.extend(output_filter)
        response = self._channels.call("predict", "Predict", request, sticky_metadata(key))
        latency = (time.perf_counter() - started) * 1000
        outputs = {alias: to_numpy(proto, alias) for alias, proto in response.outputs.items()}
        served_version = response.model_spec.version.value if response.model_spec.HasField("version") else None
        return Answer(outputs, served_version, latency)

    def examples(
        self,
        kind: str,
        model: str,
        examples: Sequence[Mapping[str, Any]],
        version: int | None,
        label: str | None,
        signature_name: str,
    ) -> tuple[Any, float]:
        started = time.perf_counter()
        import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (no tensorflow/__init__)
        from tensorflow_serving.apis import classification_pb2, regression_pb2

        request = (
            classification_pb2.ClassificationRequest if kind == "classify" else regression_pb2.RegressionRequest
        )()
        fill_model_spec(request.model_spec, model, version, label, signature_name)
        for example in examples:
            _example_proto(example, request.input.example_list.examples.add())
        response = self._channels.call("predict", "Classify" if kind == "classify" else "Regress", request)
        latency = (time.perf_counter() - started) * 1000
        if kind == "classify":
            results = [[[c.label, c.score] for c in row.classes] for row in response.result.classifications]
        else:
            results = [r.value for r in response.result.regressions]
        return results, latency


def _example_proto(example: Mapping[str, Any], proto: Any) -> None:
    for name, value in example.items():
        values = [value] if isinstance(value, (str, bytes)) else np.asarray(value).reshape(-1).tolist()
        feature = proto.features.feature[name]
        for v in values:
            if isinstance(v, (str, bytes)):
                feature.bytes_list.value.append(v.encode() if isinstance(v, str) else v)
            elif isinstance(v, float):
                feature.float_list.value.append(v)
            else:
                feature.int64_list.value.append(int(v))
