"""``mlserver.codecs``: content types ↔ Python values (see :mod:`.codec_base` for how a codec is chosen)."""

from workbench.mlserver_api.codecs.codec_base import (
    InputCodec,
    InputCodecLike,
    RequestCodec,
    RequestCodecLike,
    find_input_codec,
    find_request_codec,
    register_input_codec,
    register_request_codec,
)
from workbench.mlserver_api.codecs.codec_errors import CodecError, CodecNotFound
from workbench.mlserver_api.codecs.content_types import (
    DecodedParameterName,
    SingleInputRequestCodec,
    decode_inference_request,
    decode_request_input,
    encode_inference_response,
    encode_response_output,
    get_decoded,
    get_decoded_or_raw,
    has_decoded,
)
from workbench.mlserver_api.codecs.pandas_codec import PandasCodec
from workbench.mlserver_api.codecs.signature_codec import decode_args
from workbench.mlserver_api.codecs.tensor_codecs import (
    Base64Codec,
    DatetimeCodec,
    NumpyCodec,
    NumpyRequestCodec,
    StringCodec,
    StringRequestCodec,
)

__all__ = [
    "Base64Codec",
    "CodecError",
    "CodecNotFound",
    "DatetimeCodec",
    "DecodedParameterName",
    "InputCodec",
    "InputCodecLike",
    "NumpyCodec",
    "NumpyRequestCodec",
    "PandasCodec",
    "RequestCodec",
    "RequestCodecLike",
    "SingleInputRequestCodec",
    "StringCodec",
    "StringRequestCodec",
    "decode_args",
    "decode_inference_request",
    "decode_request_input",
    "encode_inference_response",
    "encode_response_output",
    "find_input_codec",
    "find_request_codec",
    "get_decoded",
    "get_decoded_or_raw",
    "has_decoded",
    "register_input_codec",
    "register_request_codec",
]
