"""``mlserver.MLModel``: the base class of a custom runtime, as MLServer documents it.

A runtime overrides ``async load()`` (its return value is its readiness), ``async predict(payload)`` and, to stream,
``predict_stream(payloads)`` (an async generator over an async iterator of requests), and optionally ``unload()``.
The helpers decode an input or a request by its content type (the request's, else the model settings'), else by a
default codec, and encode a Python value as an output or a whole response.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from workbench.mlserver_api.codecs.codec_base import InputCodecLike, RequestCodecLike
from workbench.mlserver_api.codecs.codec_errors import CodecNotFound
from workbench.mlserver_api.codecs.content_types import (
    decode_inference_request,
    decode_request_input,
    encode_inference_response,
    encode_response_output,
    get_decoded,
    has_decoded,
)
from workbench.mlserver_api.dataplane_types import (
    InferenceRequest,
    InferenceResponse,
    MetadataModelResponse,
    MetadataTensor,
    Parameters,
    RequestInput,
    RequestOutput,
    ResponseOutput,
)
from workbench.mlserver_api.settings_models import ModelSettings


def _index(tensors: list[MetadataTensor] | None) -> dict[str, MetadataTensor]:
    return {tensor.name: tensor for tensor in tensors or ()}


class MLModel:
    def __init__(self, settings: ModelSettings) -> None:
        self._settings = settings
        self._inputs_index = _index(settings.inputs)
        self._outputs_index = _index(settings.outputs)
        self.ready = False

    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        raise NotImplementedError("predict() method not implemented")

    async def predict_stream(self, payloads: AsyncIterator[InferenceRequest]) -> AsyncIterator[InferenceResponse]:
        """By default: the one answer of ``predict`` to the stream's first request."""
        yield await self.predict(await payloads.__anext__())

    async def unload(self) -> bool:
        return True

    @property
    def name(self) -> str:
        return self._settings.name

    @property
    def version(self) -> str | None:
        return self._settings.version

    @property
    def settings(self) -> ModelSettings:
        return self._settings

    @property
    def inputs(self) -> list[MetadataTensor] | None:
        return self._settings.inputs

    @inputs.setter
    def inputs(self, value: list[MetadataTensor]) -> None:
        self._settings.inputs = value
        self._inputs_index = _index(value)

    @property
    def outputs(self) -> list[MetadataTensor] | None:
        return self._settings.outputs

    @outputs.setter
    def outputs(self, value: list[MetadataTensor]) -> None:
        self._settings.outputs = value
        self._outputs_index = _index(value)

    def decode(self, request_input: RequestInput, default_codec: InputCodecLike | None = None) -> Any:
        decode_request_input(request_input, self._inputs_index)
        if has_decoded(request_input):
            return get_decoded(request_input)
        if default_codec is not None:
            return default_codec.decode_input(request_input)
        return request_input.data

    def decode_request(self, inference_request: InferenceRequest, default_codec: RequestCodecLike | None = None) -> Any:
        decode_inference_request(inference_request, self._settings, self._inputs_index)
        if has_decoded(inference_request):
            return get_decoded(inference_request)
        if default_codec is not None:
            return default_codec.decode_request(inference_request)
        return inference_request

    def encode_response(self, payload: Any, default_codec: RequestCodecLike | None = None) -> InferenceResponse:
        response = encode_inference_response(payload, self._settings)
        if response is not None:
            return response
        if default_codec is not None:
            encoded: InferenceResponse = default_codec.encode_response(self.name, payload, self.version)
            return encoded
        raise CodecNotFound(payload_type=str(type(payload)), is_input=False, is_request=True)

    def encode(
        self, payload: Any, request_output: RequestOutput, default_codec: InputCodecLike | None = None
    ) -> ResponseOutput:
        output = encode_response_output(payload, request_output, self._outputs_index)
        if output is not None:
            return output
        if default_codec is not None:
            return default_codec.encode_output(request_output.name, payload)
        raise CodecNotFound(name=request_output.name, is_input=False, is_request=False)

    async def metadata(self) -> MetadataModelResponse:
        parameters = self._settings.parameters
        return MetadataModelResponse(
            name=self.name,
            platform=self._settings.platform,
            versions=self._settings.versions,
            inputs=self._settings.inputs,
            outputs=self._settings.outputs,
            parameters=Parameters(content_type=parameters.content_type) if parameters is not None else None,
        )
