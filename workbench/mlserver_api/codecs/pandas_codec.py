"""``mlserver.codecs.pandas``: a request as a DataFrame (content type ``pd``), one column per input, and back.

A column is its input decoded by the input's own content type where it has one, else its elements (BYTES as
``bytes``); an input of shape ``[N, 1]`` (or ``[N]``) is a column of N values, one of ``[N, K]`` a column of N
rows of K values. Answering, each column is an output of shape ``[N, 1]``; text columns are BYTES sent as ``str``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from workbench.mlserver_api.codecs.codec_base import RequestCodec, find_input_codec, register_request_codec
from workbench.mlserver_api.codecs.content_types import get_decoded_or_raw, has_decoded, save_decoded
from workbench.mlserver_api.codecs.tensor_codecs import flat_list, to_datatype
from workbench.mlserver_api.dataplane_types import (
    Datatype,
    InferenceRequest,
    InferenceResponse,
    Parameters,
    RequestInput,
    ResponseOutput,
    TensorData,
)


def _column(tensor: Any) -> Any:
    if not has_decoded(tensor) and tensor.parameters is not None and tensor.parameters.content_type:
        codec = find_input_codec(tensor.parameters.content_type)
        if codec is not None:
            save_decoded(tensor, codec.decode_input(tensor))
    if has_decoded(tensor):
        decoded = get_decoded_or_raw(tensor)
        if isinstance(decoded, np.ndarray) and decoded.ndim > 1:  # a column of rows
            return list(decoded.reshape(decoded.shape[0], -1)) if decoded.shape[1:] != (1,) else decoded.reshape(-1)
        return decoded
    elements = flat_list(tensor.data)
    shape = list(tensor.shape)
    if len(shape) > 1 and int(np.prod(shape[1:])) > 1 and len(elements) == int(np.prod(shape)):
        return list(np.array(elements, dtype=object).reshape(shape[0], -1).tolist())
    return elements


def _output(name: str, series: pd.Series, use_bytes: bool) -> ResponseOutput:
    values = series.tolist()
    if series.dtype.kind in "OSU":
        texts = all(isinstance(value, str) for value in values)
        data = [value.encode() if use_bytes and isinstance(value, str) else value for value in values]
        parameters = Parameters(content_type="str") if texts else None
        return ResponseOutput(
            name=name, shape=[len(values), 1], datatype=Datatype.BYTES, data=TensorData(data), parameters=parameters
        )
    return ResponseOutput(
        name=name, shape=[len(values), 1], datatype=to_datatype(series.dtype), data=TensorData(values)
    )


@register_request_codec
class PandasCodec(RequestCodec):
    ContentType = "pd"
    TypeHint = pd.DataFrame

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return isinstance(payload, pd.DataFrame)

    @classmethod
    def decode_request(cls, request: InferenceRequest) -> pd.DataFrame:
        return pd.DataFrame({tensor.name: _column(tensor) for tensor in request.inputs})

    @classmethod
    def decode_response(cls, response: InferenceResponse) -> pd.DataFrame:
        return pd.DataFrame({tensor.name: _column(tensor) for tensor in response.outputs})

    @classmethod
    def encode_response(
        cls, model_name: str, payload: pd.DataFrame, model_version: str | None = None, use_bytes: bool = True, **_: Any
    ) -> InferenceResponse:
        return InferenceResponse(
            model_name=model_name,
            model_version=model_version,
            parameters=Parameters(content_type=cls.ContentType),
            outputs=[_output(str(name), payload[name], use_bytes) for name in payload.columns],
        )

    @classmethod
    def encode_request(cls, payload: pd.DataFrame, use_bytes: bool = True, **_: Any) -> InferenceRequest:
        inputs = []
        for name in payload.columns:
            output = _output(str(name), payload[name], use_bytes)
            inputs.append(
                RequestInput(
                    name=output.name,
                    shape=output.shape,
                    datatype=output.datatype,
                    data=output.data,
                    parameters=output.parameters,
                )
            )
        return InferenceRequest(inputs=inputs, parameters=Parameters(content_type=cls.ContentType))
