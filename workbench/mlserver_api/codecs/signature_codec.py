"""``mlserver.codecs.decorator``: ``@decode_args``, a ``predict`` written on Python values instead of a request.

Each parameter of the decorated method names an input; its type hint chooses the input codec (``np.ndarray``:
``np``, ``List[str]``: ``str``, ...); ``Optional[X]`` is ``X`` for a parameter the request may leave out. A parameter
whose hint is a request codec's (``pd.DataFrame``) takes the inputs no other parameter names, decoded together. The
return value (or each value of a returned tuple) is encoded by the return hint's codec, as outputs ``output-0``,
``output-1``... (a request codec's value as its own outputs).
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Awaitable, Callable
from typing import Any

from workbench.mlserver_api.codecs.codec_base import (
    InputCodec,
    RequestCodec,
    find_input_codec_by_type_hint,
    find_request_codec_by_type_hint,
)
from workbench.mlserver_api.codecs.codec_errors import CodecNotFound, InputsNotFound, OutputNotFound
from workbench.mlserver_api.codecs.content_types import DefaultOutputPrefix
from workbench.mlserver_api.dataplane_types import InferenceRequest, InferenceResponse, ResponseOutput


def _is_a(codec: Any, kind: type) -> bool:
    return (isinstance(codec, type) and issubclass(codec, kind)) or isinstance(codec, kind)


def _without_optional(hint: Any) -> Any:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        others = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(others) == 1:
            return others[0]
    return hint


def _as_list(hint: Any) -> list[Any]:
    if hint is None:
        return []
    if isinstance(hint, tuple):
        return list(hint)
    if typing.get_origin(hint) is tuple:
        return list(typing.get_args(hint))
    return [hint]


def _codec_for(name: str | None, hint: Any, is_input: bool) -> Any:
    codec = find_input_codec_by_type_hint(hint) or find_request_codec_by_type_hint(hint)
    if codec is None:
        raise CodecNotFound(name=name, payload_type=str(hint), is_input=is_input)
    return codec


class SignatureCodec(RequestCodec):
    """The codecs of one decorated method's parameters and return values."""

    def __init__(self, predict: Callable[..., Any]) -> None:
        hints = {name: _without_optional(hint) for name, hint in typing.get_type_hints(predict).items()}
        self._output_hints = _as_list(hints.pop("return", None))
        self._input_codecs = {name: _codec_for(name, hint, True) for name, hint in hints.items()}
        self._output_codecs = [_codec_for(None, hint, False) for hint in self._output_hints]

    def decode_request(self, request: InferenceRequest) -> dict[str, Any]:  # type: ignore[override]
        decoded: dict[str, Any] = {}
        rest = []
        for request_input in request.inputs:
            codec = self._input_codecs.get(request_input.name)
            if codec is None:
                rest.append(request_input)
            elif not _is_a(codec, InputCodec):
                raise CodecNotFound(name=request_input.name, is_input=True)
            else:
                decoded[request_input.name] = codec.decode_input(request_input)
        if rest:
            whole = next(((n, c) for n, c in self._input_codecs.items() if _is_a(c, RequestCodec)), None)
            if whole is None:
                raise InputsNotFound(rest, self._input_codecs)
            name, codec = whole
            decoded[name] = codec.decode_request(InferenceRequest(inputs=rest))
        return decoded

    def encode_response(  # type: ignore[override]
        self, model_name: str, payload: Any, model_version: str | None = None, **_: Any
    ) -> InferenceResponse:
        values = list(payload) if isinstance(payload, tuple) else [payload]
        outputs: list[ResponseOutput] = []
        for index, value in enumerate(values):
            if index >= len(self._output_codecs) or not self._output_codecs[index].can_encode(value):
                raise OutputNotFound(index, type(value), self._output_hints)
            codec = self._output_codecs[index]
            if _is_a(codec, InputCodec):
                outputs.append(codec.encode_output(name=f"{DefaultOutputPrefix}{index}", payload=value))
            else:
                outputs += codec.encode_response(model_name="", payload=value).outputs
        return InferenceResponse(model_name=model_name, model_version=model_version, outputs=outputs)


def decode_args(
    predict: Callable[..., Awaitable[Any]],
) -> Callable[[Any, InferenceRequest], Awaitable[InferenceResponse]]:
    codec = SignatureCodec(predict)

    @functools.wraps(predict)
    async def decoded_predict(self: Any, request: InferenceRequest) -> InferenceResponse:
        outputs = await predict(self, **codec.decode_request(request))
        return codec.encode_response(model_name=self.name, payload=outputs, model_version=self.version)

    return decoded_predict
