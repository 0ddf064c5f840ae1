"""The Open Inference Protocol (v2) over gRPC, with the stubs tritonclient generates
(``tritonclient.grpc.service_pb2_grpc``) on the client's channels, which also carry TF Serving's services:
tritonclient's own ``InferenceServerClient`` objects would open channels of their own and turn status codes into
strings, where this client keeps the server's code in every :class:`~workbench.core.errors.ServingError`.
``ModelStreamInfer`` streams one request's responses (a decoupled model's 0..n).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from workbench.client.grpc_channels import GrpcChannels, serving_error
from workbench.client.prediction import Prediction
from workbench.client.trace_context import with_trace_metadata
from workbench.client.transport import Answer
from workbench.client.v2_transport import V2Transport
from workbench.core.errors import Code, ServingError
from workbench.core.signatures import Signature
from workbench.core.sticky import sticky_metadata
from workbench.protocol import v2_client as v2


class V2GrpcTransport(V2Transport):
    name = "v2-grpc"

    def __init__(self, channels: GrpcChannels) -> None:
        self._channels = channels

    def metadata(self, model: str, version: int | None, label: str | None) -> Any:
        from google.protobuf import json_format
        from tritonclient.grpc import service_pb2

        request = service_pb2.ModelMetadataRequest(name=model, version=v2.version_string(version, label))
        response = self._channels.call("v2", "ModelMetadata", request)
        doc = json_format.MessageToDict(response, preserving_proto_field_name=True)
        for tensor in (*doc.get("inputs", []), *doc.get("outputs", [])):
            tensor["shape"] = [int(d) for d in tensor.get("shape", [])]  # proto3 JSON writes int64 as strings
        return doc

    def index_rows(self) -> list[dict[str, Any]]:
        from google.protobuf import json_format
        from tritonclient.grpc import service_pb2

        response = self._channels.call("v2", "RepositoryIndex", service_pb2.RepositoryIndexRequest())
        return json_format.MessageToDict(response, preserving_proto_field_name=True).get("models", [])

    def label_version(self, model: str, label: str) -> int:
        from google.protobuf import json_format
        from tritonclient.grpc import service_pb2

        request = service_pb2.ModelStatisticsRequest(name=model, version=v2.version_string(None, label))
        response = self._channels.call("v2", "ModelStatistics", request)
        doc = json_format.MessageToDict(response, preserving_proto_field_name=True)
        (row,) = doc["model_stats"]
        return int(row["version"])

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
        message = v2.grpc_infer_request(
            model, feeds, output_filter, version=v2.version_string(version, label), parameters=parameters
        )
        answer = v2.grpc_infer_answer(self._channels.call("v2", "ModelInfer", message, sticky_metadata(key)))
        return Answer(answer.outputs, answer.model_version, (time.perf_counter() - started) * 1000)

    def stream(
        self,
        model: str,
        feeds: Mapping[str, np.ndarray],
        output_filter: Sequence[str],
        version: int | None,
        label: str | None,
        parameters: Mapping[str, bool | int | str] | None,
    ) -> Iterator[Prediction]:
        """One request's responses as they arrive, over ``ModelStreamInfer``; Triton's empty final response (asked
        for here) ends the iteration. Leaving early cancels the stream."""
        import grpc

        message = v2.grpc_infer_request(
            model,
            feeds,
            output_filter,
            version=v2.version_string(version, label),
            parameters={**(parameters or {}), "triton_enable_empty_final_response": True},
        )
        responses = self._channels.stub("v2").ModelStreamInfer(
            iter([message]), timeout=self._channels.timeout, metadata=with_trace_metadata(())
        )
        started = time.perf_counter()
        try:
            for response in responses:
                if response.error_message:
                    raise ServingError(Code.UNKNOWN, response.error_message)
                answer = response.infer_response
                if answer.outputs:
                    read = v2.grpc_infer_answer(answer)
                    latency = (time.perf_counter() - started) * 1000  # since the request, as predict's
                    yield Prediction(
                        read.outputs, model=model, version=read.model_version, protocol="v2-grpc", latency_ms=latency
                    )
                final = answer.parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    return
        except grpc.RpcError as exc:
            raise serving_error(exc) from None
        finally:
            responses.cancel()  # a no-op once the stream ended; stops the server's work when the caller left early
