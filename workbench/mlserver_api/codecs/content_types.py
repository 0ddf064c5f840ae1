"""``mlserver.codecs.utils``: choosing a codec by content type, and remembering what a request decoded to.

An input's content type is its own ``parameters.content_type``, else the one the model settings declare for that
input; a request's is its own, else the settings' ``parameters.content_type``. What a codec decoded is kept on the
object's parameters under :data:`DecodedParameterName` (never sent back: the platform drops it when it answers).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from workbench.mlserver_api.codecs.codec_base import (
    RequestCodec,
    find_input_codec,
    find_input_codec_by_payload,
    find_request_codec,
    find_request_codec_by_payload,
)
from workbench.mlserver_api.codecs.codec_errors import CodecError
from workbench.mlserver_api.dataplane_types import (
    InferenceRequest,
    InferenceResponse,
    MetadataTensor,
    Parameters,
    RequestInput,
    RequestOutput,
    ResponseOutput,
)
from workbench.mlserver_api.settings_models import ModelSettings

DefaultOutputPrefix = "output-"
DefaultInputPrefix = "input-"
DecodedParameterName = "_decoded_payload"

InputOrOutput = RequestInput | ResponseOutput
Parametrised = InferenceRequest | RequestInput | RequestOutput | ResponseOutput | InferenceResponse
Tagged = MetadataTensor | ModelSettings


def inject_batch_dimension(shape: list[int]) -> list[int]:
    """A 1-D shape ``[N]`` read as ``[N, 1]``: N rows of one element."""
    return shape if len(shape) > 1 else [*shape, 1]


def content_type_of(obj: Any, metadata: Tagged | None = None) -> str | None:
    if obj.parameters is not None and obj.parameters.content_type:
        return str(obj.parameters.content_type)
    if metadata is not None and metadata.parameters is not None and metadata.parameters.content_type:
        return str(metadata.parameters.content_type)
    return None


def save_decoded(obj: Any, decoded: Any) -> None:
    if obj.parameters is None:
        obj.parameters = Parameters()
    setattr(obj.parameters, DecodedParameterName, decoded)


def has_decoded(obj: Any) -> bool:
    return obj.parameters is not None and DecodedParameterName in vars(obj.parameters)


def get_decoded(obj: Any) -> Any:
    return vars(obj.parameters).get(DecodedParameterName) if has_decoded(obj) else None


def get_decoded_or_raw(obj: Any) -> Any:
    if has_decoded(obj):
        return get_decoded(obj)
    if isinstance(obj, (RequestInput, ResponseOutput)):
        return obj.data
    return obj


def decode_request_input(
    request_input: RequestInput, metadata_inputs: Mapping[str, MetadataTensor] | None = None
) -> Any:
    content_type = content_type_of(request_input, (metadata_inputs or {}).get(request_input.name))
    codec = find_input_codec(content_type) if content_type else None
    if codec is None:
        return None
    decoded = codec.decode_input(request_input)
    save_decoded(request_input, decoded)
    return decoded


def decode_inference_request(
    inference_request: InferenceRequest,
    model_settings: ModelSettings | None = None,
    metadata_inputs: Mapping[str, MetadataTensor] | None = None,
) -> Any:
    for request_input in inference_request.inputs:
        decode_request_input(request_input, metadata_inputs)
    settings_parameters = model_settings.parameters if model_settings is not None else None
    content_type = content_type_of(inference_request)
    if content_type is None and settings_parameters is not None:
        content_type = settings_parameters.content_type
    codec = find_request_codec(content_type) if content_type else None
    if codec is None:
        return inference_request
    decoded = codec.decode_request(inference_request)
    save_decoded(inference_request, decoded)
    return decoded


def encode_response_output(
    payload: Any, request_output: RequestOutput, metadata_outputs: Mapping[str, MetadataTensor] | None = None
) -> ResponseOutput | None:
    content_type = content_type_of(request_output, (metadata_outputs or {}).get(request_output.name))
    codec = find_input_codec(content_type) if content_type else find_input_codec_by_payload(payload)
    return codec.encode_output(name=request_output.name, payload=payload) if codec is not None else None


def encode_inference_response(payload: Any, model_settings: ModelSettings) -> InferenceResponse | None:
    codec = find_request_codec_by_payload(payload)
    if codec is None:
        return None
    response: InferenceResponse = codec.encode_response(model_settings.name, payload, model_settings.version)
    return response


class SingleInputRequestCodec(RequestCodec):
    """A request codec for requests of one input (responses of one output), decoded by ``InputCodec``."""

    InputCodec: ClassVar[Any] = None

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return cls.InputCodec is not None and bool(cls.InputCodec.can_encode(payload))

    @classmethod
    def encode_response(
        cls, model_name: str, payload: Any, model_version: str | None = None, **kwargs: Any
    ) -> InferenceResponse:
        output = cls._codec().encode_output(f"{DefaultOutputPrefix}1", payload, **kwargs)
        return InferenceResponse(
            model_name=model_name,
            model_version=model_version,
            parameters=Parameters(content_type=cls.ContentType),
            outputs=[output],
        )

    @classmethod
    def decode_response(cls, response: InferenceResponse) -> Any:
        return cls._only(response.outputs, "output", cls._codec().decode_output)

    @classmethod
    def encode_request(cls, payload: Any, **kwargs: Any) -> InferenceRequest:
        request_input = cls._codec().encode_input(f"{DefaultInputPrefix}1", payload, **kwargs)
        return InferenceRequest(inputs=[request_input], parameters=Parameters(content_type=cls.ContentType))

    @classmethod
    def decode_request(cls, request: InferenceRequest) -> Any:
        return cls._only(request.inputs, "input", cls._codec().decode_input)

    @classmethod
    def _codec(cls) -> Any:
        if cls.InputCodec is None:
            raise NotImplementedError(f"{cls.__name__} names no InputCodec")
        return cls.InputCodec

    @classmethod
    def _only(cls, tensors: list[Any], what: str, decode: Any) -> Any:
        if len(tensors) != 1:
            raise CodecError(f"the '{cls.ContentType}' codec takes exactly one {what} tensor ({len(tensors)} given)")
        (tensor,) = tensors
        if not has_decoded(tensor):
            save_decoded(tensor, decode(tensor))
        return get_decoded_or_raw(tensor)
