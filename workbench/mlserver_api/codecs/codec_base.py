"""``mlserver.codecs.base``: the two codec interfaces and the registry of content types.

An :class:`InputCodec` turns one tensor into a Python value and back (``np``: a numpy array, ``str``: a list of
strings); a :class:`RequestCodec` a whole request (``pd``: a DataFrame, one column per input). Codecs are found by
``content_type`` (a request's or an input's ``parameters``, else the model settings'), by the value to encode
(``can_encode``) or by a type hint (``decode_args``), among those registered, in the order they were.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, ClassVar, TypeVar, get_args, get_origin

from workbench.mlserver_api.dataplane_types import InferenceRequest, InferenceResponse, RequestInput, ResponseOutput

log = logging.getLogger("mlserver")


class InputCodec:
    ContentType: ClassVar[str] = ""
    TypeHint: ClassVar[Any] = type(None)

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return False

    @classmethod
    def encode_output(cls, name: str, payload: Any, **kwargs: Any) -> ResponseOutput:
        raise NotImplementedError()

    @classmethod
    def decode_output(cls, response_output: ResponseOutput) -> Any:
        raise NotImplementedError()

    @classmethod
    def encode_input(cls, name: str, payload: Any, **kwargs: Any) -> RequestInput:
        raise NotImplementedError()

    @classmethod
    def decode_input(cls, request_input: RequestInput) -> Any:
        raise NotImplementedError()

    # The names of MLServer's first releases, still called by older runtimes.
    @classmethod
    def encode(cls, name: str, payload: Any) -> ResponseOutput:
        return cls.encode_output(name, payload)

    @classmethod
    def decode(cls, request_input: RequestInput) -> Any:
        return cls.decode_input(request_input)


class RequestCodec:
    ContentType: ClassVar[str] = ""
    TypeHint: ClassVar[Any] = type(None)

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return False

    @classmethod
    def encode_response(
        cls, model_name: str, payload: Any, model_version: str | None = None, **kwargs: Any
    ) -> InferenceResponse:
        raise NotImplementedError()

    @classmethod
    def decode_response(cls, response: InferenceResponse) -> Any:
        raise NotImplementedError()

    @classmethod
    def encode_request(cls, payload: Any, **kwargs: Any) -> InferenceRequest:
        raise NotImplementedError()

    @classmethod
    def decode_request(cls, request: InferenceRequest) -> Any:
        raise NotImplementedError()

    @classmethod
    def encode(cls, model_name: str, payload: Any, model_version: str | None = None) -> InferenceResponse:
        return cls.encode_response(model_name, payload, model_version)

    @classmethod
    def decode(cls, request: InferenceRequest) -> Any:
        return cls.decode_request(request)


InputCodecLike = type[InputCodec] | InputCodec
RequestCodecLike = type[RequestCodec] | RequestCodec
C = TypeVar("C")

# Content type → codec, in registration order (a lookup by value or hint takes the first that fits).
_input_codecs: dict[str, Any] = {}
_request_codecs: dict[str, Any] = {}


def _first(codecs: Iterable[Any], fits: Any, what: Any) -> Any:
    matching = [codec for codec in codecs if fits(codec)]
    if len(matching) > 1:
        log.debug("Several codecs fit %s; %s is used", what, matching[0].ContentType)
    return matching[0] if matching else None


def _find(registry: dict[str, Any], content_type: str | None, payload: Any, type_hint: Any) -> Any:
    """The codec of ``registry`` for a content type, else the first that can encode ``payload``, else the first
    whose type hint is ``type_hint``: MLServer's order of lookups, for input and request codecs alike."""
    if content_type:
        return registry.get(content_type)
    if payload is not None:
        return _by_payload(registry, payload)
    if type_hint is not None:
        return _by_type_hint(registry, type_hint)
    return None


def _by_payload(registry: dict[str, Any], payload: Any) -> Any:
    return _first(registry.values(), lambda codec: codec.can_encode(payload), type(payload))


def _by_type_hint(registry: dict[str, Any], type_hint: Any) -> Any:
    return _first(registry.values(), lambda codec: same_hint(codec.TypeHint, type_hint), type_hint)


def same_hint(one: Any, other: Any) -> bool:
    """Whether two type hints name the same type: ``List[str]`` is ``list[str]``."""
    return bool(one == other) or ((get_origin(one) or one), get_args(one)) == (
        (get_origin(other) or other),
        get_args(other),
    )


def find_input_codec(content_type: str | None = None, payload: Any = None, type_hint: Any = None) -> Any:
    return _find(_input_codecs, content_type, payload, type_hint)


def find_input_codec_by_payload(payload: Any) -> Any:
    return _by_payload(_input_codecs, payload)


def find_input_codec_by_type_hint(type_hint: Any) -> Any:
    return _by_type_hint(_input_codecs, type_hint)


def find_request_codec(content_type: str | None = None, payload: Any = None, type_hint: Any = None) -> Any:
    return _find(_request_codecs, content_type, payload, type_hint)


def find_request_codec_by_payload(payload: Any) -> Any:
    return _by_payload(_request_codecs, payload)


def find_request_codec_by_type_hint(type_hint: Any) -> Any:
    return _by_type_hint(_request_codecs, type_hint)


def register_input_codec(codec: C) -> C:
    """Register an input codec under its ``ContentType`` (a class decorator)."""
    _input_codecs[getattr(codec, "ContentType", "")] = codec
    return codec


def register_request_codec(codec: C) -> C:
    """Register a request codec under its ``ContentType`` (a class decorator)."""
    _request_codecs[getattr(codec, "ContentType", "")] = codec
    return codec
