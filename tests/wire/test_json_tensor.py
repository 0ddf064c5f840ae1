"""TF Serving's JSON ↔ tensor rules (json_tensor.cc), unit-tested on workbench.protocol.json_tensor without a server."""

from __future__ import annotations

import base64
import json
import math

import numpy as np
import pytest

from workbench.core.errors import Code, ServingError
from workbench.core.signatures import TensorSpec
from workbench.protocol import json_tensor
from workbench.protocol.json_tensor import Format, decode_tensor, dumps, encode_predict_response, to_json_value


def spec(dtype: object, alias: str = "x", shape: tuple[int, ...] | None = None) -> TensorSpec:
    return TensorSpec(alias=alias, name=f"{alias}:0", dtype=np.dtype(dtype), shape=shape)


FLOAT = spec(np.float32)
DOUBLE = spec(np.float64)
INT32 = spec(np.int32)
INT64 = spec(np.int64)
UINT8 = spec(np.uint8)
BOOL = spec(np.bool_)
STRING = spec(object)


def full_decode_error(value: object, tensor_spec: TensorSpec) -> str:
    with pytest.raises(ServingError) as info:
        decode_tensor(value, tensor_spec)
    assert info.value.code == Code.INVALID_ARGUMENT
    assert info.value.http_status == 400
    return info.value.message


def decode_error(value: object, tensor_spec: TensorSpec) -> str:
    """TF Serving's own words for a value that does not decode, after the lead naming the input (checked here)."""
    message = full_decode_error(value, tensor_spec)
    lead = f'Input "{tensor_spec.alias}" expects {tensor_spec.describe()} but received '
    assert message.startswith(lead), message
    return message.split(": ", 1)[1]


# ------------------------------------------------------------------------------------------- decode: numbers
def test_float32_from_json_floats_and_ints():
    out = decode_tensor([[1.5, 2], [-3, 0.25]], FLOAT)
    assert out.dtype == np.float32
    assert out.shape == (2, 2)
    assert out.tolist() == [[1.5, 2.0], [-3.0, 0.25]]


def test_float64_keeps_double_precision():
    out = decode_tensor([0.1, 1e308, 2**53 - 1], DOUBLE)
    assert out.dtype == np.float64
    assert out.tolist() == [0.1, 1e308, float(2**53 - 1)]


def test_float32_accepts_nan_and_infinities():
    out = decode_tensor([float("nan"), float("inf"), float("-inf")], FLOAT)
    assert math.isnan(out[0]) and out[1] == np.inf and out[2] == -np.inf


@pytest.mark.parametrize(
    ("value", "tensor_spec", "message"),
    [
        # float32 holds integers exactly up to 2**24 - 1 (TF Serving's IsLosslessDecimal<float>).
        ([16777216], FLOAT, "Cannot convert JSON value: 16777216 to float without loss of precision."),
        ([1e39], FLOAT, "to float without loss of precision."),
        ([-1e39], FLOAT, "to float without loss of precision."),
        ([2**53], DOUBLE, f"Cannot convert JSON value: {2**53} to double without loss of precision."),
    ],
)
def test_lossy_floats_are_refused(value, tensor_spec, message):
    assert message in decode_error(value, tensor_spec)


def test_float32_largest_exact_integer_is_accepted():
    assert decode_tensor([16777215], FLOAT).tolist() == [16777215.0]


def test_lossy_integer_among_floats_is_refused():
    # Each JSON token is checked on its own in TF Serving; [0.5, 16777217] must not silently become 16777216.
    assert "Cannot convert JSON value: 16777217 to float without loss of precision." in decode_error(
        [0.5, 16777217], FLOAT
    )


def test_int32_range_is_enforced():
    assert decode_tensor([2**31 - 1, -(2**31)], INT32).tolist() == [2**31 - 1, -(2**31)]
    assert decode_tensor([1], INT32).dtype == np.int32
    assert decode_error([2**31], INT32) == f"JSON Value: {2**31} Type: Number is not of expected type: int32"
    assert decode_error([-(2**31) - 1], INT32) == (
        f"JSON Value: {-(2**31) - 1} Type: Number is not of expected type: int32"
    )


def test_int64_range_is_enforced():
    assert decode_tensor([2**63 - 1, -(2**63)], INT64).tolist() == [2**63 - 1, -(2**63)]
    assert decode_error([2**63], INT64) == f"JSON Value: {2**63} Type: Number is not of expected type: int64"
    assert "is not of expected type: int64" in decode_error([-(2**63) - 1], INT64)
    assert "is not of expected type: int64" in decode_error([2**64], INT64)


def test_uint8_range_is_enforced():
    assert decode_tensor([0, 255], UINT8).tolist() == [0, 255]
    assert "is not of expected type: uint8" in decode_error([256], UINT8)
    assert "is not of expected type: uint8" in decode_error([-1], UINT8)


@pytest.mark.parametrize("tensor_spec", [INT32, INT64])
def test_integers_refuse_json_floats(tensor_spec):
    assert (
        decode_error([1.5], tensor_spec)
        == f"JSON Value: 1.5 Type: Number is not of expected type: {tensor_spec.dtype_name}"
    )
    # 2.0 is a JSON double, not an integer, for rapidjson too.
    assert "is not of expected type" in decode_error([2.0], tensor_spec)


@pytest.mark.parametrize(
    ("value", "tensor_spec", "shown", "json_type"),
    [
        ([True], INT64, "true", "True"),
        ([False], FLOAT, "false", "False"),
        (["1"], FLOAT, '"1"', "String"),
        ([None], INT32, "null", "Null"),
        ([1.0, None], FLOAT, "null", "Null"),
    ],
)
def test_wrong_json_types_name_value_and_type(value, tensor_spec, shown, json_type):
    assert decode_error(value, tensor_spec) == (
        f"JSON Value: {shown} Type: {json_type} is not of expected type: {tensor_spec.dtype_name}"
    )


@pytest.mark.parametrize(
    ("value", "tensor_spec", "message"),
    [
        ([1, True], INT64, "JSON Value: true Type: True is not of expected type: int64"),
        ([1.5, True], FLOAT, "JSON Value: true Type: True is not of expected type: float"),
        ([[1, 2], [3, False]], INT32, "JSON Value: false Type: False is not of expected type: int32"),
    ],
    ids=["int64", "float", "int32"],
)
def test_booleans_mixed_into_numbers_are_refused(value, tensor_spec, message):
    # rapidjson's IsInt()/IsInt64()/IsNumber() are false for true/false, whatever their neighbours are.
    assert decode_error(value, tensor_spec) == message


# ------------------------------------------------------------------------------------ decode: bool / string
def test_bool():
    out = decode_tensor([[True, False]], BOOL)
    assert out.dtype == np.bool_ and out.tolist() == [[True, False]]
    assert decode_error([1], BOOL) == "JSON Value: 1 Type: Number is not of expected type: bool"
    assert decode_error([True, 0], BOOL) == "JSON Value: 0 Type: Number is not of expected type: bool"


def test_strings_and_b64():
    out = decode_tensor(["héllo", {"b64": base64.b64encode(b"\x00\xff").decode()}, ""], STRING)
    assert out.dtype == object
    assert out.tolist() == ["héllo".encode(), b"\x00\xff", b""]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([{"b64": "!!"}], "Unable to base64 decode"),
        ([{"x": "AA=="}], 'JSON Value: {"x":"AA=="} not formatted correctly for base64 data'),
        ([{"b64": "AA==", "extra": 1}], "not formatted correctly for base64 data"),
        ([{"b64": 3}], "not formatted correctly for base64 data"),
        ([1], "JSON Value: 1 Type: Number is not of expected type: string"),
        ([True], "JSON Value: true Type: True is not of expected type: string"),
    ],
)
def test_string_errors(value, message):
    assert message in decode_error(value, STRING)


def test_scalars_have_rank_zero():
    for value, tensor_spec, expected in [(2.5, FLOAT, 2.5), (7, INT64, 7), (True, BOOL, True), ("s", STRING, b"s")]:
        out = decode_tensor(value, tensor_spec)
        assert out.shape == ()
        assert out.dtype == tensor_spec.dtype
        assert out.item() == expected
    assert decode_tensor({"b64": "YQ=="}, STRING).item() == b"a"


@pytest.mark.parametrize("tensor_spec", [FLOAT, DOUBLE, INT32, INT64, BOOL, STRING])
def test_empty_lists_keep_the_signature_dtype(tensor_spec):
    out = decode_tensor([], tensor_spec)
    assert out.shape == (0,) and out.dtype == tensor_spec.dtype
    nested = decode_tensor([[]], tensor_spec)
    assert nested.shape == (1, 0) and nested.dtype == tensor_spec.dtype


# ------------------------------------------------------------------------------------------- decode: ragged
@pytest.mark.parametrize("tensor_spec", [FLOAT, STRING])
def test_ragged_list_size(tensor_spec):
    value = [[1.0], [2.0, 3.0]] if tensor_spec is FLOAT else [["a"], ["b", "c"]]
    assert decode_error(value, tensor_spec) == "Encountered list at unexpected size: 2 at level: 1 expected size: 1"


def test_ragged_deeper_list_size():
    message = decode_error([[[1.0, 2.0]], [[3.0]]], FLOAT)
    assert message == "Encountered list at unexpected size: 1 at level: 2 expected size: 2"


def test_value_where_a_list_was_expected():
    # TF Serving's message (level + 1 against the rank, as json_tensor.cc prints it).
    assert decode_error([[1.0], 2.0], FLOAT) == (
        "JSON Value: 2.0 found at incorrect level: 2 in the JSON DOM. Expected at level: 2"
    )


def test_list_where_a_value_was_expected():
    assert decode_error([1.0, [2.0]], FLOAT) == "Encountered list at unexpected level: 1 expected < 1"


# ------------------------------------------------------------------------------------------------- responses
def test_float32_prints_shortest_round_trip_decimal():
    values = to_json_value(np.array([0.1, 3.0, 2.05, 1e-7, 0.2], dtype=np.float32))
    assert dumps(values) == b"[0.1,3.0,2.05,1e-07,0.2]"
    assert dumps(to_json_value(np.array(0.1, dtype=np.float32))) == b"0.1"


def test_float64_keeps_its_digits():
    assert dumps(to_json_value(np.array([0.1, 1 / 3], dtype=np.float64))) == b"[0.1,0.3333333333333333]"


def test_non_finite_tokens():
    out = dumps(to_json_value(np.array([[np.nan, np.inf, -np.inf]], dtype=np.float32)))
    assert out == b"[[NaN,Infinity,-Infinity]]"


def test_ints_and_bools():
    assert dumps(to_json_value(np.array([1, -2], dtype=np.int64))) == b"[1,-2]"
    assert dumps(to_json_value(np.array([2**64 - 1], dtype=np.uint64))) == b"[18446744073709551615]"
    assert dumps(to_json_value(np.array([True, False]))) == b"[true,false]"


def test_strings_text_bytes_and_non_utf8():
    text = np.array([b"hi", "é".encode()], dtype=object)
    assert to_json_value(text) == ["hi", "é"]
    assert dumps(to_json_value(text)) == '["hi","é"]'.encode()
    assert to_json_value(text, as_b64=True) == [{"b64": "aGk="}, {"b64": "w6k="}]
    # Not UTF-8: sent losslessly as b64 rather than as invalid JSON.
    assert to_json_value(np.array([[b"\xff\x00"]], dtype=object)) == [[{"b64": "/wA="}]]


def test_row_format_one_output():
    body = encode_predict_response({"y": np.array([[3.0], [3.5]], dtype=np.float32)}, Format.ROW)
    assert body == b'{"predictions":[[3.0],[3.5]]}'


def test_columnar_format_one_output():
    body = encode_predict_response({"y": np.array([[3.0], [3.5]], dtype=np.float32)}, Format.COLUMNAR)
    assert body == b'{"outputs":[[3.0],[3.5]]}'


def test_row_format_several_outputs_are_objects_sorted_by_name():
    outputs = {
        "z": np.array([1, 2], dtype=np.int64),
        "a_bytes": np.array([b"hi", b"x"], dtype=object),
        "s": np.array([b"hi", b"x"], dtype=object),
    }
    body = encode_predict_response(outputs, Format.ROW)
    assert body == (
        b'{"predictions":[{"a_bytes":{"b64":"aGk="},"s":"hi","z":1},{"a_bytes":{"b64":"eA=="},"s":"x","z":2}]}'
    )


def test_columnar_several_outputs_and_scalar():
    outputs = {"n": np.array(4.0, dtype=np.float32), "img_bytes": np.array([b"\x01"], dtype=object)}
    body = json.loads(encode_predict_response(outputs, Format.COLUMNAR))
    assert body == {"outputs": {"img_bytes": [{"b64": "AQ=="}], "n": 4.0}}


def test_row_format_inconsistent_batch_sizes():
    outputs = {"a": np.zeros([2], np.float32), "b": np.zeros([3, 1], np.float32)}
    with pytest.raises(ServingError) as info:
        encode_predict_response(outputs, Format.ROW)
    assert info.value.code == Code.INVALID_ARGUMENT
    assert info.value.message == "Tensor name: b has inconsistent batch size: 3 expecting: 2"


def test_row_format_scalar_output_has_no_shape():
    with pytest.raises(ServingError) as info:
        encode_predict_response({"s": np.array(1.0, np.float32)}, Format.ROW)
    assert "Tensor name: s has no shape information" in info.value.message


def test_empty_output_map():
    with pytest.raises(ServingError, match="Cannot convert empty tensor map to JSON"):
        encode_predict_response({}, Format.ROW)


def test_classify_and_regress_responses():
    assert json_tensor.encode_classify_response([[("", 3.0)], [("low", 0.1), ("high", 0.9)]]) == (
        b'{"results":[[["",3.0]],[["low",0.1],["high",0.9]]]}'
    )
    # Scores are float32 in TF: printed as the float32's shortest decimal.
    assert json_tensor.encode_regress_response([3.0, float(np.float32(0.1)), float("nan")]) == (
        b'{"results":[3.0,0.1,NaN]}'
    )


# ---------------------------------------------------------------------------------------- whole requests
def test_decode_predict_request_row_and_columnar():
    specs = {"x": FLOAT}
    name, tensors, fmt = json_tensor.decode_predict_request(b'{"instances": [[1.0], [2.0]]}', lambda _, __: specs)
    assert (name, fmt) == ("", Format.ROW)
    assert tensors["x"].tolist() == [[1.0], [2.0]] and tensors["x"].dtype == np.float32
    name, tensors, fmt = json_tensor.decode_predict_request(
        b'{"signature_name": "s", "inputs": {"x": [NaN]}}', lambda _, __: specs
    )
    assert (name, fmt) == ("s", Format.COLUMNAR)
    assert math.isnan(tensors["x"][0])


def test_decode_predict_request_row_instances_of_different_sizes():
    with pytest.raises(ServingError) as info:
        json_tensor.decode_predict_request(b'{"instances": [[1.0], [1.0, 2.0]]}', lambda _, __: {"x": FLOAT})
    assert info.value.message == (
        'Input "x" expects float of any shape but received instances of different shapes ([1] in instance 0, [2] in '
        "instance 1): Failed to process element: 1 of 'instances' list. Error: INVALID_ARGUMENT: Expecting tensor "
        "size: 1 but got: 2"
    )


# ------------------------------------------------------------------------ errors name the input (issue 13)
PIXELS = spec(np.float32, alias="pixels", shape=(-1, 64))
IMAGE = spec(object, alias="image_bytes", shape=(-1,))
COUNT = spec(np.int32, alias="count", shape=(-1,))


@pytest.mark.parametrize(
    ("value", "tensor_spec", "received", "tf_serving_says"),
    [
        (
            [[0.0] * 64, [0.0] * 63],
            PIXELS,
            "a ragged list (lists of 64 and of 63 at depth 1)",
            "Encountered list at unexpected size: 63 at level: 1 expected size: 64",
        ),
        (
            [[0.0] * 64, 0.0],
            PIXELS,
            "a ragged list (a value at depth 1 where the first values are at depth 2)",
            "JSON Value: 0.0 found at incorrect level: 2 in the JSON DOM. Expected at level: 2",
        ),
        (
            [["a"] * 64],
            PIXELS,
            "a JSON String",
            'JSON Value: "a" Type: String is not of expected type: float',
        ),
        (
            [[{"b64": "AAA="}] * 64],
            PIXELS,
            "a JSON Object",
            'JSON Value: {"b64":"AAA="} Type: Object is not of expected type: float',
        ),
        (
            [[16777217] + [0] * 63],
            PIXELS,
            "16777217, which float cannot hold exactly",
            "Cannot convert JSON value: 16777217 to float without loss of precision.",
        ),
        ([{"b64": "!!"}], IMAGE, "invalid base64", "Unable to base64 decode"),
        (
            [{"base64": "AA=="}],
            IMAGE,
            'an object other than {"b64": "..."}',
            'JSON Value: {"base64":"AA=="} not formatted correctly for base64 data',
        ),
        ([1.5], COUNT, "the JSON float 1.5", "JSON Value: 1.5 Type: Number is not of expected type: int32"),
        (
            [2**31],
            COUNT,
            "2147483648, out of int32's range",
            "JSON Value: 2147483648 Type: Number is not of expected type: int32",
        ),
    ],
    ids=[
        "ragged-63-wide",
        "value-for-a-row",
        "string",
        "b64-for-float",
        "lossy",
        "bad-b64",
        "not-b64",
        "float",
        "range",
    ],
)
def test_errors_name_the_input_what_it_expects_and_what_came(value, tensor_spec, received, tf_serving_says):
    message = full_decode_error(value, tensor_spec)
    lead = f'Input "{tensor_spec.alias}" expects {tensor_spec.describe()} but received {received}'
    assert message == f"{lead}: {tf_serving_says}"


def test_the_expected_shape_keeps_its_unknown_dimensions():
    assert PIXELS.describe() == "float [-1,64]"
    assert IMAGE.describe() == "string [-1]"
    assert FLOAT.describe() == "float of any shape"
    assert spec(np.float32, shape=()).describe() == "float []"


def test_row_format_names_the_instance_at_fault_and_the_input():
    specs = {"pixels": PIXELS}
    body = json.dumps({"instances": [[0.0] * 64, [0.0] * 32 + ["x"] * 32]}).encode()
    with pytest.raises(ServingError) as info:
        json_tensor.decode_predict_request(body, lambda _, __: specs)
    assert info.value.message == (
        'Input "pixels" expects float [-1,64] but received a JSON String in instance 1: Failed to process element: 1 '
        """of 'instances' list. Error: INVALID_ARGUMENT: JSON Value: "x" Type: String is not of expected type: float"""
    )


MULTI = {
    "a": spec(np.float32, alias="a", shape=(-1, 2)),
    "b": spec(np.int64, alias="b", shape=(-1,)),
}
MULTI_INPUTS = "Signature inputs: a float [-1,2], b int64 [-1]."


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"inputs": {"a": [[1.0, 2.0]]}}, f"Missing named input: b in 'inputs' object. {MULTI_INPUTS}"),
        (
            {"instances": [{"a": [1.0, 2.0]}]},
            """Failed to process element: 0 of 'instances' list. JSON object: {"a":[1.0,2.0]} keys must be equal to: """
            f"a,b. Missing: b. {MULTI_INPUTS}",
        ),
        (
            {"instances": [{"a": [1.0, 2.0], "b": 1, "c": 2}]},
            "Failed to process element: 0 key: c of 'instances' list. Error: INVALID_ARGUMENT: JSON object: does not "
            f"have named input: c. {MULTI_INPUTS}",
        ),
        (
            {"inputs": [[1.0, 2.0]]},
            "inputs is a plain value/list, but expecting an object as multiple input tensors required as per "
            f"tensorinfo_map. {MULTI_INPUTS}",
        ),
    ],
    ids=["columnar-missing", "row-missing", "row-extra", "columnar-plain"],
)
def test_missing_and_extra_inputs_list_the_signature_inputs(body, message):
    with pytest.raises(ServingError) as info:
        json_tensor.decode_predict_request(json.dumps(body).encode(), lambda _, __: MULTI)
    assert info.value.code == Code.INVALID_ARGUMENT
    assert info.value.message == message
