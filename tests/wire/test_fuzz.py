"""Malformed requests over gRPC, generated from a seeded random.Random, against one ``workbench serve`` process.

10,000 TF Serving requests (Predict, Classify, Regress, MultiInference, GetModelMetadata, GetModelStatus, and raw
bytes that are no message at all) and 2,000 v2 ModelInfer requests, each built to be wrong in one known way, go
through the real ``tensorflow-serving-api`` and ``tritonclient`` stubs, a few in flight at once. Every answer must
be the precise status TF Serving (or Triton) would give for that mistake, never INTERNAL, UNKNOWN or a hang; then
the process still lives, within a memory bound, and answers a normal Predict correctly.

The generators know what each request gets wrong, so each case carries the one code it must be answered with;
the seed makes a failure reproducible (the assertion names the case).
"""

from __future__ import annotations

import collections
import dataclasses
import random
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests

import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (TF Serving's protos without TensorFlow)
from replica import Replica, process_memory
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)
from tritonclient.grpc import service_pb2, service_pb2_grpc
from waiting import version_states, wait_until

from workbench.protocol.tensor_proto import MAX_EXPANDED_BYTES

Code = grpc.StatusCode
PREDICT_CASES = 10_000
INFER_CASES = 2_000
IN_FLIGHT = 8  # requests pipelined at once: enough to overlap the client's and the server's work
MIB = 1024 * 1024
# The server's resident memory may grow by this much over the whole fuzz (allocator caches, TensorFlow's lazily
# built kernels for the shapes it saw, the few multi-MiB strings in flight): far below what a single tensor
# expanded from a tiny request (gigabytes) or a leak per request (10,000 of them) would take.
MEMORY_GROWTH_BOUND = 512 * MIB

DT_FLOAT, DT_DOUBLE, DT_INT32, DT_STRING, DT_INT64, DT_HALF = 1, 2, 3, 7, 9, 19
# DataTypes no request can carry values of, or that TensorFlow does not have: invalid, quantized and bfloat16 (value
# types of another type than the signature's), resource, variant, every reference type, and numbers out of range.
ODD_DTYPES = [0, 8, 11, 12, 13, 14, 15, 16, 18, 20, 21, 24, 25, 29, 30, 99, 100, *range(101, 124), 200, 1 << 20, -1]
# Names that must never reach a file system: relative and absolute paths, encodings of them, NUL, the very long.
PATH_LIKE_NAMES = [
    "..", ".", "../x", "../../etc/passwd", "a/b", "/etc", "/", "\\", "..\\..\\x", "%2e%2e", "%2e%2e%2f", "x%00",
    "hp\x00", "\x00", "hp/../hp", "./hp", "hp/", "~", "~root", "*", "hp*", "\u202ehp", "h\u00e9", "x" * 10_000,
]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Case:
    """One malformed request: which category of mistake, the RPC, the request (a message or raw bytes), and the
    status it must be answered with."""

    category: str
    method: str
    request: Any
    expected: Code
    note: str = ""


# ------------------------------------------------------------------------------------------------------ the server
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[Replica]:
    """``workbench serve`` on a repository of half_plus_two (TF2), half_plus_two (TF1: classify and regress
    signatures) and multi_io (float, int64 and string inputs)."""
    root = tmp_path_factory.mktemp("fuzz")
    repository = root / "models"
    shutil.copytree(model_store / "hp2_tf2", repository / "hp" / "1")
    shutil.copytree(model_store / "hp2_tf1", repository / "tf1" / "1")
    shutil.copytree(model_store / "multi_io", repository / "multi" / "1")
    replica = Replica(root / "server", f"--model_repository={repository}")
    try:
        replica.wait_ready()
        for name in ("hp", "tf1", "multi"):
            wait_until(lambda name=name: version_states(replica.rest_url, name) == {"1": "AVAILABLE"}, what=name)
        yield replica
    finally:
        replica.stop()


# ------------------------------------------------------------------------------------------------ building blocks
def tensor(proto: Any, dtype: int, shape: Iterable[int], **values: Any) -> Any:
    """Fill TensorProto ``proto``: ``dtype``, ``shape``, and value fields by name (``float_val=[…]``)."""
    proto.dtype = dtype
    for size in shape:
        proto.tensor_shape.dim.add().size = size
    for field, value in values.items():
        if isinstance(value, bytes):
            setattr(proto, field, value)
        else:
            getattr(proto, field).extend(value)
    return proto


def predict(model: str, **spec: Any) -> Any:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    for field, value in spec.items():
        if field == "version":
            request.model_spec.version.value = value
        else:
            setattr(request.model_spec, field, value)
    return request


def valid_hp(rng: random.Random, request: Any | None = None) -> Any:
    """A well-formed Predict for hp (x: float [-1, 1])."""
    request = request if request is not None else predict("hp")
    rows = rng.randint(1, 4)
    tensor(request.inputs["x"], DT_FLOAT, [rows, 1], float_val=[rng.uniform(-9, 9) for _ in range(rows)])
    return request


def valid_multi(rng: random.Random, rows: int | None = None) -> Any:
    """A well-formed Predict for multi (a: float [-1, 2], b: int64 [-1], text: string [-1])."""
    rows = rows if rows is not None else rng.randint(1, 3)
    request = predict("multi")
    tensor(request.inputs["a"], DT_FLOAT, [rows, 2], float_val=[rng.uniform(-9, 9) for _ in range(2 * rows)])
    tensor(request.inputs["b"], DT_INT64, [rows], int64_val=[rng.randint(-99, 99) for _ in range(rows)])
    tensor(
        request.inputs["text"], DT_STRING, [rows], string_val=[rng.randbytes(rng.randint(0, 8)) for _ in range(rows)]
    )
    return request


def huge_count(rng: random.Random, itemsize: int) -> list[int]:
    """A shape of an int64 element count whose bytes are more than a tensor may expand to from fewer values."""
    floor = MAX_EXPANDED_BYTES // itemsize + 1
    total = rng.randint(floor, (1 << 62) // itemsize)
    if rng.random() < 0.5:
        return [total]
    first = rng.randint(2, 1 << 20)
    return [first, total // first + 1]


def overflowing_shape(rng: random.Random) -> list[int]:
    """Non-negative dims whose product is more than an int64 holds."""
    dims = [rng.randint(1 << 20, 1 << 62) for _ in range(rng.randint(2, 5))]
    while np.prod([float(d) for d in dims]) < 2.0**64:
        dims.append(rng.randint(1 << 30, 1 << 62))
    return dims


def odd_name(rng: random.Random) -> str:
    return rng.choice(PATH_LIKE_NAMES) if rng.random() < 0.8 else rng.randbytes(rng.randint(1, 40)).hex()


# -------------------------------------------------------------------------------------------- TF Serving's requests
def dtype_content_mismatch(rng: random.Random) -> Case:
    """Values in another type's field, or a dtype the signature does not take."""
    request = valid_multi(rng)
    which = rng.randrange(4)
    if which == 0:  # int64 values sent in float_val: TensorFlow would read zeros
        b = request.inputs["b"]
        b.ClearField("int64_val")
        b.float_val.extend([1.5] * len(b.tensor_shape.dim))
        note = "float_val on int64"
    elif which == 1:  # float values in string_val
        a = request.inputs["a"]
        a.ClearField("float_val")
        a.string_val.extend([b"1.0", b"2.0"])
        note = "string_val on float"
    elif which == 2:  # strings in int64_val
        text = request.inputs["text"]
        text.ClearField("string_val")
        text.int64_val.extend([7])
        note = "int64_val on string"
    else:  # a type the signature does not take, with its values where they belong
        alias = rng.choice(["a", "b", "text"])
        proto = request.inputs[alias]
        proto.Clear()
        dtype, field, values = rng.choice(
            [(DT_INT32, "int_val", [1]), (DT_DOUBLE, "double_val", [0.5]), (DT_STRING, "string_val", [b"1"])]
        )
        if (alias, dtype) == ("text", DT_STRING):
            dtype, field, values = DT_HALF, "half_val", [15360]
        tensor(proto, dtype, [1, 2] if alias == "a" else [1], **{field: values})
        note = f"{alias} as dtype {dtype}"
    return Case("dtype/content mismatch", "Predict", request, Code.INVALID_ARGUMENT, note)


def negative_dims(rng: random.Random) -> Case:
    request = predict("hp")
    shape = [rng.choice([-1, -2, -(1 << 62), rng.randint(-1000, -1)]), 1]
    rng.shuffle(shape)
    if rng.random() < 0.5:  # bytes that numpy could shape with -1 as "whatever fits"
        tensor(request.inputs["x"], DT_FLOAT, shape, tensor_content=b"\0" * 4 * rng.randint(1, 8))
    else:
        tensor(request.inputs["x"], DT_FLOAT, shape, float_val=[1.0] * rng.randint(0, 3))
    return Case("negative dims", "Predict", request, Code.INVALID_ARGUMENT, str(shape))


def huge_dims(rng: random.Random) -> Case:
    """A shape of billions of elements with one value (or none) to repeat: refused before anything is allocated."""
    request = predict("multi") if rng.random() < 0.3 else predict("hp")
    if request.model_spec.name == "multi":
        alias, dtype, field, value, itemsize = rng.choice(
            [
                ("a", DT_FLOAT, "float_val", 1.0, 4),
                ("b", DT_INT64, "int64_val", 1, 8),
                ("text", DT_STRING, "string_val", b"s", 8),  # an array of references, 8 bytes each
            ]
        )
    else:
        alias, dtype, field, value, itemsize = "x", DT_FLOAT, "float_val", 1.0, 4
    shape = huge_count(rng, itemsize)
    values = {field: [value]} if rng.random() < 0.7 else {}
    tensor(request.inputs[alias], dtype, shape, **values)
    return Case("huge dims", "Predict", request, Code.RESOURCE_EXHAUSTED, f"{alias} {shape}")


def overflowing_dims(rng: random.Random) -> Case:
    request = predict("hp")
    shape = overflowing_shape(rng)
    content = {"tensor_content": b"\0" * 8} if rng.random() < 0.5 else {"float_val": [1.0]}
    tensor(request.inputs["x"], DT_FLOAT, shape, **content)
    return Case("int64 overflow", "Predict", request, Code.INVALID_ARGUMENT, str(shape))


def wrong_content_length(rng: random.Random) -> Case:
    request = valid_multi(rng, rows=2) if rng.random() < 0.4 else predict("hp")
    alias, itemsize, shape = ("x", 4, [3, 1]) if request.model_spec.name == "hp" else rng.choice(
        [("a", 4, [2, 2]), ("b", 8, [2])]
    )  # fmt: skip
    right = itemsize * int(np.prod(shape))
    length = rng.choice(
        [0, 1, right - 1, right + 1, right - itemsize, right + itemsize, right * 2, rng.randint(1, 4 * right)]
    )
    if length in (0, right):
        length = right + 3
    proto = request.inputs[alias]
    proto.Clear()
    tensor(proto, DT_FLOAT if alias != "b" else DT_INT64, shape, tensor_content=rng.randbytes(length))
    return Case("tensor_content length", "Predict", request, Code.INVALID_ARGUMENT, f"{alias} {length}/{right} bytes")


def invalid_dtype(rng: random.Random) -> Case:
    request = predict("hp")
    dtype = rng.choice(ODD_DTYPES)
    if rng.random() < 0.3:
        dtype = rng.randint(-(1 << 31), (1 << 31) - 1)
    values = rng.choice([{"float_val": [1.0]}, {"tensor_content": b"\0" * 8}, {"int_val": [1]}, {}])
    tensor(request.inputs["x"], dtype, [1, 1], **values)
    return Case("invalid dtype", "Predict", request, Code.INVALID_ARGUMENT, f"dtype {dtype}")


def strings(rng: random.Random) -> Case:
    """Empty and enormous strings (up to 16 MiB), where a string belongs (answered) and where it does not."""
    size = rng.choice([0, 0, 1, 1000, 64 * 1024]) if rng.random() < 0.95 else rng.randint(1 * MIB, 16 * MIB)
    value = b"\xff" * size
    if rng.random() < 0.5:
        request = predict("hp")
        tensor(request.inputs["x"], DT_STRING, [1, 1], string_val=[value])
        return Case("strings", "Predict", request, Code.INVALID_ARGUMENT, f"{size} bytes for float")
    request = valid_multi(rng, rows=1)
    text = request.inputs["text"]
    text.ClearField("string_val")
    text.string_val.append(value)
    request.output_filter.append("echo_bytes")
    return Case("strings", "Predict", request, Code.OK, f"{size} bytes for text")


def missing_inputs(rng: random.Random) -> Case:
    request = valid_multi(rng)
    for alias in rng.sample(["a", "b", "text"], rng.randint(1, 3)):
        del request.inputs[alias]
    return Case("missing inputs", "Predict", request, Code.INVALID_ARGUMENT, ",".join(request.inputs))


def unknown_alias(rng: random.Random) -> Case:
    request = valid_hp(rng) if rng.random() < 0.5 else valid_multi(rng)
    alias = odd_name(rng) if rng.random() < 0.5 else rng.choice(["y", "X", "x ", "inputs", ""])
    if alias in request.inputs:
        alias += "_"
    tensor(request.inputs[alias], DT_FLOAT, [1], float_val=[1.0])
    return Case("unknown input alias", "Predict", request, Code.INVALID_ARGUMENT, repr(alias[:40]))


def bad_output_filter(rng: random.Random) -> Case:
    request = valid_hp(rng)
    if rng.random() < 0.5:
        request.output_filter.extend(["y", "y"])
        note = "duplicate"
    else:
        request.output_filter.extend(rng.sample(["y", odd_name(rng), "Y", "y:0", ""], 2))  # one unknown at least
        note = repr(list(request.output_filter))[:60]
    return Case("output_filter", "Predict", request, Code.INVALID_ARGUMENT, note)


def bad_names(rng: random.Random) -> Case:
    """Path-like and odd model names, versions, labels and signature names, on every RPC that takes them."""
    name = odd_name(rng)
    which = rng.randrange(7)
    if which == 0:
        request = valid_hp(rng, predict(name))
        return Case("names", "Predict", request, Code.NOT_FOUND, f"model {name[:40]!r}")
    if which == 1:
        version = rng.choice([-1, 0, 2, 1 << 40, -(1 << 63), (1 << 63) - 1])
        return Case("names", "Predict", valid_hp(rng, predict("hp", version=version)), Code.NOT_FOUND, f"v{version}")
    if which == 2:  # an unknown label, on a known model or not: TF Serving's INVALID_ARGUMENT
        model = rng.choice(["hp", name])
        request = valid_hp(rng, predict(model, version_label=name))
        return Case("names", "Predict", request, Code.INVALID_ARGUMENT, f"label {name[:40]!r}")
    if which == 3:
        request = valid_hp(rng, predict("hp", signature_name=name))
        return Case("names", "Predict", request, Code.FAILED_PRECONDITION, f"signature {name[:40]!r}")
    if which == 4:
        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        request.model_spec.name = name
        return Case("names", "GetModelMetadata", request, Code.NOT_FOUND, f"metadata {name[:40]!r}")
    if which == 5:
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = name
        if rng.random() < 0.5:
            request.model_spec.version.value = rng.choice([-1, 7, 1 << 62])
        return Case("names", "GetModelStatus", request, Code.NOT_FOUND, f"status {name[:40]!r}")
    request = examples_request(rng, "Regress", model=name, signature="regress_x_to_y")
    return Case("names", "Regress", request, Code.NOT_FOUND, f"regress model {name[:40]!r}")


# ------------------------------------------------------------------------------------------- Classify and Regress
def feature_values(feature: Any, rng: random.Random, kind: str, count: int) -> None:
    if kind == "float":
        feature.float_list.value.extend(rng.uniform(-9, 9) for _ in range(count))
    elif kind == "int64":
        feature.int64_list.value.extend(rng.randint(-(1 << 63), (1 << 63) - 1) for _ in range(count))
    else:
        feature.bytes_list.value.extend(rng.randbytes(rng.randint(0, 16)) for _ in range(count))


def examples_request(
    rng: random.Random, method: str, model: str = "tf1", signature: str = "", examples: int | None = None
) -> Any:
    """A well-formed Classify or Regress request: examples with one float ``x`` each."""
    message = classification_pb2.ClassificationRequest() if method == "Classify" else regression_pb2.RegressionRequest()
    message.model_spec.name = model
    message.model_spec.signature_name = signature or (
        rng.choice(["classify_x_to_y", "classify_with_classes"]) if method == "Classify" else "regress_x_to_y"
    )
    for _ in range(examples if examples is not None else rng.randint(1, 4)):
        example = message.input.example_list.examples.add()
        feature_values(example.features.feature["x"], rng, "float", 1)
    return message


def malformed_examples(rng: random.Random) -> Case:
    """tf.Examples a signature cannot parse: wrong feature kinds, long lists, empty examples, bad contexts."""
    method = rng.choice(["Classify", "Regress"])
    request = examples_request(rng, method)
    examples = request.input.example_list.examples
    victim = examples[rng.randrange(len(examples))]
    which = rng.randrange(7)
    if which == 0:
        kind = rng.choice(["int64", "bytes"])
        victim.features.feature["x"].Clear()
        feature_values(victim.features.feature["x"], rng, kind, rng.randint(1, 3))
        note = f"x of kind {kind}"
    elif which == 1:
        count = rng.choice([0, 2, 100, 100_000])
        victim.features.feature["x"].Clear()
        feature_values(victim.features.feature["x"], rng, "float", count)
        note = f"x of {count} floats"
    elif which == 2:
        victim.Clear()
        note = "an empty Example"
    elif which == 3:  # thousands of features, none of them x
        victim.Clear()
        for index in range(rng.randint(100, 3000)):
            feature_values(victim.features.feature[f"f{index}"], rng, rng.choice(["float", "int64", "bytes"]), 4)
        note = "thousands of features, no x"
    elif which == 4:  # a context whose x is malformed, examples without one of their own
        context = request.input.example_list_with_context.context
        feature_values(context.features.feature["x"], rng, rng.choice(["int64", "bytes", "float"]), rng.choice([2, 5]))
        for _ in range(rng.randint(1, 3)):
            request.input.example_list_with_context.examples.add()
        note = "malformed context"
    elif which == 5:
        request.input.Clear()
        if rng.random() < 0.5:
            request.input.example_list.SetInParent()  # a list of no examples
        note = "no examples"
    else:  # a signature that does not read tf.Examples, none, or another method's
        request.model_spec.signature_name = rng.choice(
            ["regress_x2_to_y3", odd_name(rng), "serving_default" if method == "Regress" else "regress_x_to_y"]
        )
        if method == "Classify" and rng.random() < 0.5:
            request.model_spec.name = "multi"
            request.model_spec.signature_name = ""
        note = f"signature {request.model_spec.signature_name[:40]!r} of {request.model_spec.name}"
    return Case("tf.Examples", method, request, Code.INVALID_ARGUMENT, note)


def malformed_multi_inference(rng: random.Random) -> Case:
    request = inference_pb2.MultiInferenceRequest()
    which = rng.randrange(5)
    for signature, method in [
        ("classify_x_to_y", "tensorflow/serving/classify"),
        ("regress_x_to_y", "tensorflow/serving/regress"),
    ][: rng.randint(1, 2)]:
        task = request.tasks.add(method_name=method)
        task.model_spec.name = "tf1"
        task.model_spec.signature_name = signature
    example = request.input.example_list.examples.add()
    feature_values(example.features.feature["x"], rng, "float", 1)
    expected = Code.INVALID_ARGUMENT
    if which == 0:
        request.ClearField("tasks")
        note = "no tasks"
    elif which == 1:
        task = request.tasks.add(method_name="tensorflow/serving/regress")
        task.model_spec.name = rng.choice(["hp", "multi"])
        task.model_spec.signature_name = "regress_x_to_y2"
        note = "tasks on two models"
    elif which == 2:
        request.tasks.add().CopyFrom(request.tasks[0])
        note = "a signature twice"
    elif which == 3:
        task = request.tasks.add(method_name=rng.choice(["tensorflow/serving/predict", "", odd_name(rng)]))
        task.model_spec.name = "tf1"
        task.model_spec.signature_name = "regress_x_to_y2"
        expected, note = Code.UNIMPLEMENTED, f"method {task.method_name[:40]!r}"
    else:
        example.features.feature["x"].Clear()
        feature_values(example.features.feature["x"], rng, rng.choice(["int64", "bytes"]), 1)
        note = "x of another kind"
    return Case("MultiInference", "MultiInference", request, expected, note)


# ----------------------------------------------------------------------------------------------------- raw bytes
METHODS = {
    "Predict": ("/tensorflow.serving.PredictionService/Predict", predict_pb2.PredictRequest),
    "Classify": ("/tensorflow.serving.PredictionService/Classify", classification_pb2.ClassificationRequest),
    "Regress": ("/tensorflow.serving.PredictionService/Regress", regression_pb2.RegressionRequest),
    "MultiInference": ("/tensorflow.serving.PredictionService/MultiInference", inference_pb2.MultiInferenceRequest),
    "GetModelMetadata": (
        "/tensorflow.serving.PredictionService/GetModelMetadata",
        get_model_metadata_pb2.GetModelMetadataRequest,
    ),
    "GetModelStatus": ("/tensorflow.serving.ModelService/GetModelStatus", get_model_status_pb2.GetModelStatusRequest),
    "ModelInfer": ("/inference.GRPCInferenceService/ModelInfer", service_pb2.ModelInferRequest),
}


def parses(message_type: Any, payload: bytes) -> bool:
    try:
        message_type.FromString(payload)
    except Exception:  # noqa: BLE001 - protobuf's DecodeError
        return False
    return True


def with_name_bytes(message: Any, placeholder: str, replacement: bytes) -> bytes:
    """``message`` serialized with the bytes of ``placeholder`` (a string field's value) swapped for ``replacement``
    of the same length: how a client puts bytes that are not UTF-8 into a string field."""
    wire = message.SerializeToString()
    encoded = placeholder.encode()
    assert len(encoded) == len(replacement) and wire.count(encoded) == 1
    return wire.replace(encoded, replacement)


def nested_groups(depth: int) -> bytes:
    """An unknown field of ``depth`` nested groups: deeper than protobuf's recursion limit of 100."""
    return bytes([(15 << 3) | 3]) * depth + bytes([(15 << 3) | 4]) * depth


def raw_garbage(rng: random.Random, methods: tuple[str, ...] = tuple(m for m in METHODS if m != "ModelInfer")) -> Case:
    """Bytes that are no message of the method: random, truncated, not UTF-8 in a name, nested too deep."""
    method = rng.choice(methods)
    message_type = METHODS[method][1]
    which = rng.randrange(4)
    if which == 0:
        payload = rng.randbytes(rng.randint(1, 512))
        note = "random bytes"
    elif which == 1:  # a real request, cut short
        wire = (valid_hp(rng) if method == "Predict" else valid_multi(rng)).SerializeToString()
        payload = wire[: rng.randint(1, len(wire) - 1)]
        note = "truncated"
    elif which == 2:
        placeholder = "N" * 6
        message = message_type()
        if method == "ModelInfer":
            message.model_name = placeholder
        elif method == "MultiInference":
            message.tasks.add().model_spec.name = placeholder
        elif method == "Predict" and rng.random() < 0.5:
            message.model_spec.name = "hp"
            message.model_spec.signature_name = placeholder
        else:
            message.model_spec.name = placeholder
        not_utf8 = rng.choice([b"\xff\xfe..\x2f\x00", b"\xc0\xaf..\xc0\xaf", b"hp\xed\xa0\x80x"])
        payload = with_name_bytes(message, placeholder, not_utf8)
        note = "a name that is not UTF-8"
    else:
        payload = nested_groups(rng.randint(101, 5000))
        note = "nested too deep"
    expected = Code.INVALID_ARGUMENT
    if parses(message_type, payload):  # random bytes may happen to be a valid (if odd) message
        expected = None
    return Case("raw bytes", method, payload, expected, note)  # type: ignore[arg-type]


PREDICT_CATEGORIES: list[tuple[Callable[[random.Random], Case], int]] = [
    (dtype_content_mismatch, 10),
    (negative_dims, 7),
    (huge_dims, 7),
    (overflowing_dims, 5),
    (wrong_content_length, 8),
    (invalid_dtype, 8),
    (strings, 6),
    (missing_inputs, 5),
    (unknown_alias, 5),
    (bad_output_filter, 5),
    (bad_names, 12),
    (malformed_examples, 10),
    (malformed_multi_inference, 5),
    (raw_garbage, 7),
]


def generate(seed: int, count: int, categories: list[tuple[Callable[[random.Random], Case], int]]) -> list[Case]:
    rng = random.Random(seed)
    makers, weights = zip(*categories, strict=True)
    return [rng.choices(makers, weights)[0](rng) for _ in range(count)]


# ------------------------------------------------------------------------------------------------------- running
# Codes a request that parses but carries random content may get: each is precise about some mistake.
# Bytes that happen to parse (a truncated Predict can be a valid GetModelStatusRequest) may also be answered.
PRECISE = frozenset({Code.INVALID_ARGUMENT, Code.NOT_FOUND, Code.FAILED_PRECONDITION, Code.UNIMPLEMENTED})


@dataclasses.dataclass
class Outcome:
    case: Case
    code: Code
    details: str

    @property
    def as_expected(self) -> bool:
        if self.case.expected is None:
            return self.code in PRECISE or self.code == Code.OK
        return self.code == self.case.expected


def run_pipelined(channel: grpc.Channel, cases: list[Case]) -> list[Outcome]:
    """Send every case, ``IN_FLIGHT`` at a time; the outcome of each (a 30 s deadline catches a hang)."""
    calls = {
        method: (
            channel.unary_unary(path, request_serializer=None, response_deserializer=None),
            channel.unary_unary(path, request_serializer=message.SerializeToString, response_deserializer=None),
        )
        for method, (path, message) in METHODS.items()
    }
    outcomes: list[Outcome] = []
    pending: collections.deque[tuple[Case, grpc.Future]] = collections.deque()

    def settle(case: Case, future: grpc.Future) -> None:
        error = future.exception()
        if error is None:
            outcomes.append(Outcome(case, Code.OK, ""))
        else:
            outcomes.append(Outcome(case, error.code(), error.details() or ""))

    for case in cases:
        raw_call, message_call = calls[case.method]
        call = raw_call if isinstance(case.request, bytes) else message_call
        pending.append((case, call.future(case.request, timeout=30)))
        if len(pending) >= IN_FLIGHT:
            settle(*pending.popleft())
    while pending:
        settle(*pending.popleft())
    return outcomes


def check(outcomes: list[Outcome]) -> collections.Counter[tuple[str, str]]:
    """Codes per category (printed for the README's figures); fails listing the first cases answered otherwise."""
    counts = collections.Counter((o.case.category, o.code.name) for o in outcomes)
    for (category, code), number in sorted(counts.items()):
        print(f"{category:24} {code:20} {number:6}")
    wrong = [o for o in outcomes if not o.as_expected]
    listed = "\n".join(
        f"  {o.case.category} / {o.case.method} / {o.case.note!r}: {o.code.name} (expected "
        f"{o.case.expected.name if o.case.expected else 'a precise code'}): {o.details[:300]}"
        for o in wrong[:25]
    )
    assert not wrong, f"{len(wrong)} of {len(outcomes)} answers were not the expected status:\n{listed}"
    return counts


def predict_still_right(channel: grpc.Channel) -> None:
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = predict("hp")
    tensor(request.inputs["x"], DT_FLOAT, [3, 1], float_val=[1.0, 2.0, 5.0])
    answer = stub.Predict(request, timeout=30)
    assert list(answer.outputs["y"].float_val) == [2.5, 3.0, 4.5]
    status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
        get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "multi"}), timeout=30
    )
    assert [s.state for s in status.model_version_status] == [get_model_status_pb2.ModelVersionStatus.AVAILABLE]


def fuzz(server: Replica, cases: list[Case]) -> collections.Counter[tuple[str, str]]:
    options = [("grpc.max_send_message_length", 64 * MIB), ("grpc.max_receive_message_length", 64 * MIB)]
    with grpc.insecure_channel(server.grpc_target, options=options) as channel:
        predict_still_right(channel)  # warm: TensorFlow's kernels for the normal request are built before measuring
        before = process_memory(server.proc.pid)
        counts = check(run_pipelined(channel, cases))
        assert server.proc.poll() is None, f"the server exited:\n{server.log()[-3000:]}"
        predict_still_right(channel)
        after = process_memory(server.proc.pid)
    print(f"resident memory {before['VmRSS'] / MIB:.0f} MiB before, {after['VmRSS'] / MIB:.0f} MiB after, "
          f"peak {after['VmHWM'] / MIB:.0f} MiB")  # fmt: skip
    assert after["VmHWM"] - before["VmRSS"] < MEMORY_GROWTH_BOUND, (before, after)
    assert "Traceback" not in server.log(), server.log()[-5000:]
    return counts


def test_ten_thousand_malformed_tf_serving_requests_get_precise_statuses(server: Replica) -> None:
    cases = generate(seed=19, count=PREDICT_CASES, categories=PREDICT_CATEGORIES)
    counts = fuzz(server, cases)
    seen = {category for category, _ in counts}
    assert len(seen) == len(PREDICT_CATEGORIES), seen  # every category was drawn
    assert sum(counts.values()) == PREDICT_CASES


# ---------------------------------------------------------------------------------------------- v2 ModelInfer
def infer(model: str = "hp", version: str = "") -> Any:
    return service_pb2.ModelInferRequest(model_name=model, model_version=version)


def infer_input(request: Any, name: str, datatype: str, shape: list[int], raw: bytes | None = None) -> Any:
    tensor = request.inputs.add(name=name, datatype=datatype, shape=shape)
    if raw is not None:
        request.raw_input_contents.append(raw)
    return tensor


def valid_infer(rng: random.Random) -> Any:
    request = infer()
    rows = rng.randint(1, 4)
    infer_input(request, "x", "FP32", [rows, 1], np.ones((rows, 1), "<f4").tobytes())
    return request


def infer_raw_length(rng: random.Random) -> Case:
    request = valid_infer(rng)
    rows = request.inputs[0].shape[0]
    length = rng.choice([0, 1, 3, 4 * rows - 1, 4 * rows + 1, 4 * rows + 4, 8 * rows, rng.randint(1, 1000)])
    if length == 4 * rows:
        length += 2
    request.raw_input_contents[0] = rng.randbytes(length)
    return Case("raw length", "ModelInfer", request, Code.INVALID_ARGUMENT, f"{length} bytes for {rows} FP32")


def infer_datatype(rng: random.Random) -> Case:
    request = infer()
    datatype = rng.choice(["FP8", "", "fp32", "FLOAT", "DT_FLOAT", "FP32 ", "\x00", "BYTES\x00", "X" * 1000])
    if rng.random() < 0.5:  # a real datatype, of another type than the model's, with bytes of the right length
        datatype = rng.choice(["FP64", "INT32", "INT64", "UINT8", "BOOL", "FP16", "INT8"])
    size = {"FP64": 8, "INT64": 8, "INT32": 4, "FP16": 2}.get(datatype, 1)
    infer_input(request, "x", datatype, [2, 1], b"\0" * 2 * size)
    return Case("datatypes", "ModelInfer", request, Code.INVALID_ARGUMENT, repr(datatype[:20]))


def infer_shape(rng: random.Random) -> Case:
    request = infer()
    which = rng.randrange(5)
    if which == 0:
        shape = [rng.randint(-(1 << 62), -1), 1]
        infer_input(request, "x", "FP32", shape, b"\0" * 4)
    elif which == 1:
        shape = [rng.randint(1 << 20, 1 << 40), 1]
        infer_input(request, "x", "FP32", shape, b"\0" * 4)
    elif which == 2:
        shape = overflowing_shape(rng)
        infer_input(request, "x", "FP32", shape, b"\0" * 4)
    elif which == 3:  # typed contents of another count than the shape
        shape = [rng.randint(1, 5), 1]
        tensor = infer_input(request, "x", "FP32", shape)
        tensor.contents.fp32_contents.extend([1.0] * (shape[0] + rng.choice([-1, 1, 3])))
    else:  # no elements, but a dimension no array can have
        shape = [0, rng.randint(1 << 62, (1 << 63) - 1)]
        infer_input(request, "x", rng.choice(["FP32", "BYTES"]), shape, b"")
    return Case("shape/elements", "ModelInfer", request, Code.INVALID_ARGUMENT, str(shape))


def infer_buffers(rng: random.Random) -> Case:
    request = valid_infer(rng)
    which = rng.randrange(4)
    if which == 0:
        request.raw_input_contents.append(b"\0" * 4)
        note = "two raw buffers for one input"
    elif which == 1:
        request.inputs[0].contents.fp32_contents.extend([1.0] * request.inputs[0].shape[0])
        note = "raw and contents"
    elif which == 2:
        del request.raw_input_contents[:]
        request.inputs[0].contents.int64_contents.extend([1] * request.inputs[0].shape[0])
        note = "contents in another type's field"
    else:
        request.ClearField("raw_input_contents")
        note = "no contents"
        # an input with no values at all: count mismatch unless the shape is empty
        if not request.inputs[0].shape[0]:
            request.inputs[0].shape[0] = 1
    return Case("contents", "ModelInfer", request, Code.INVALID_ARGUMENT, note)


def infer_bytes_framing(rng: random.Random) -> Case:
    request = infer("multi")
    infer_input(request, "a", "FP32", [1, 2], np.ones((1, 2), "<f4").tobytes())
    infer_input(request, "b", "INT64", [1], np.ones(1, "<i8").tobytes())
    framing = rng.choice(
        [b"\x01", b"\x05\x00\x00\x00ab", b"\xff\xff\xff\xff", b"\x01\x00\x00\x00a\x01\x00\x00\x00b", b""]
    )
    infer_input(request, "text", "BYTES", [1], framing)
    return Case("BYTES framing", "ModelInfer", request, Code.INVALID_ARGUMENT, repr(framing))


def infer_inputs(rng: random.Random) -> Case:
    request = valid_infer(rng)
    which = rng.randrange(3)
    if which == 0:
        request.inputs[0].name = odd_name(rng)
        note = f"unknown input {request.inputs[0].name[:40]!r}"
    elif which == 1:
        infer_input(request, "x", "FP32", [1, 1], b"\0" * 4)
        note = "x twice"
    else:
        request = infer("multi")
        infer_input(request, "a", "FP32", [1, 2], np.ones((1, 2), "<f4").tobytes())
        note = "b and text missing"
    return Case("inputs", "ModelInfer", request, Code.INVALID_ARGUMENT, note)


def infer_names(rng: random.Random) -> Case:
    request = valid_infer(rng)
    name = odd_name(rng)
    which = rng.randrange(4)
    if which == 0:
        request.model_name = name
        return Case("names", "ModelInfer", request, Code.NOT_FOUND, f"model {name[:40]!r}")
    if which == 1:
        request.model_version = name
        # Not a version number, nor a label: Triton's "failed to get model version from specified version string"
        code = Code.NOT_FOUND if name.isascii() and name.isdigit() else Code.INVALID_ARGUMENT
        return Case("names", "ModelInfer", request, code, f"label {name[:40]!r}")
    if which == 2:
        request.model_version = rng.choice(["2", "0", "99999999999999999999999999", "1" * 300])
        return Case("names", "ModelInfer", request, Code.NOT_FOUND, f"version {request.model_version[:40]}")
    request.model_name = ""
    return Case("names", "ModelInfer", request, Code.INVALID_ARGUMENT, "no model name")


def infer_outputs_and_parameters(rng: random.Random) -> Case:
    request = valid_infer(rng)
    if rng.random() < 0.5:
        request.outputs.add(name=rng.choice(["z", "Y", odd_name(rng)]))
        return Case("outputs/parameters", "ModelInfer", request, Code.INVALID_ARGUMENT, "unknown output")
    key = rng.choice(["shared_memory_region", "classification"])
    on_input = key == "shared_memory_region" and rng.random() < 0.5
    target = request.inputs[0] if on_input else request.outputs.add(name="y")
    target.parameters[key].string_param = "region"
    # A region without its shared_memory_byte_size is malformed; a class count must be a number.
    return Case("outputs/parameters", "ModelInfer", request, Code.INVALID_ARGUMENT, key)


INFER_CATEGORIES: list[tuple[Callable[[random.Random], Case], int]] = [
    (infer_raw_length, 10),
    (infer_datatype, 10),
    (infer_shape, 10),
    (infer_buffers, 8),
    (infer_bytes_framing, 6),
    (infer_inputs, 8),
    (infer_names, 8),
    (infer_outputs_and_parameters, 5),
    (lambda rng: raw_garbage(rng, ("ModelInfer",)), 5),
]


def test_two_thousand_malformed_v2_infer_requests_get_precise_statuses(server: Replica) -> None:
    cases = generate(seed=1919, count=INFER_CASES, categories=INFER_CATEGORIES)
    counts = fuzz(server, cases)
    assert len({category for category, _ in counts}) == len(INFER_CATEGORIES)
    with grpc.insecure_channel(server.grpc_target) as channel:
        answer = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
            valid_infer(random.Random(0)), timeout=30
        )
        assert answer.model_name == "hp" and answer.outputs[0].name == "y"


# ------------------------------------------------------------------------------ regressions, one mistake each
def unknown_rank(proto: Any) -> Any:
    tensor(proto, DT_FLOAT, [], float_val=[1.0])
    proto.tensor_shape.unknown_rank = True
    return proto


@pytest.mark.parametrize(
    ("fill", "expected"),
    [
        # Was answered: a negative dimension with tensor_content was numpy's "whatever fits".
        (lambda x: tensor(x, DT_FLOAT, [-1, 1], tensor_content=b"\0" * 8), Code.INVALID_ARGUMENT),
        # Was a 4 GB allocation run until the deadline: one value repeated for a shape of 10^9 elements.
        (lambda x: tensor(x, DT_FLOAT, [10**9, 1], float_val=[1.0]), Code.RESOURCE_EXHAUSTED),
        # Was answered with zeros: values in another type's field (TensorFlow reads only the dtype's own).
        (lambda x: tensor(x, DT_FLOAT, [2, 1], string_val=[b"1"]), Code.INVALID_ARGUMENT),
        # Was read as a scalar: a shape of unknown rank.
        (unknown_rank, Code.INVALID_ARGUMENT),
        # Was an import of all of TensorFlow, then its TypeError: DT_INVALID, resources, variants, references.
        (lambda x: tensor(x, 101, [1, 1], float_val=[1.0]), Code.INVALID_ARGUMENT),
    ],
    ids=["negative-dim-content", "expansion", "stray-values", "unknown-rank", "reference-dtype"],
)
def test_each_fixed_mistake_alone(server: Replica, fill: Callable[[Any], Any], expected: Code) -> None:
    request = predict("hp")
    fill(request.inputs["x"])
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(request, timeout=30)
    assert info.value.code() == expected, info.value.details()
    assert 'Input "x"' in info.value.details() or "Input tensor x" in info.value.details()


def test_an_error_naming_a_huge_name_still_arrives_as_its_status(server: Replica) -> None:
    """Was RESOURCE_EXHAUSTED at the client ("metadata size exceeds soft limit"): the NOT_FOUND message repeated the
    10,000-character name, beyond the 8 KiB a client takes in trailers. Now the message is cut, and says so."""
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(valid_hp(random.Random(0), predict("\u00e9" * 10_000)), timeout=30)
    assert info.value.code() == Code.NOT_FOUND
    assert info.value.details().startswith("Servable not found for request: Latest(\u00e9\u00e9")
    assert info.value.details().endswith("more characters)")


def test_bytes_that_are_no_message_are_invalid_argument(server: Replica) -> None:
    """Was UNKNOWN ("Unexpected DecodeError"), with a traceback in the server's log for each request."""
    with grpc.insecure_channel(server.grpc_target) as channel:
        for path, _ in METHODS.values():
            call = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
            with pytest.raises(grpc.RpcError) as info:
                call(b"\x12\xff\xff", timeout=30)
            assert info.value.code() == Code.INVALID_ARGUMENT, path
            assert "not a valid message" in info.value.details()


def test_v2_refuses_a_shape_no_array_can_have(server: Replica) -> None:
    """Was INTERNAL (gRPC) and 500 (REST): zero elements, but a dimension numpy cannot make an array of."""
    request = infer()
    infer_input(request, "x", "FP32", [0, 1 << 62], b"")
    with grpc.insecure_channel(server.grpc_target) as channel:
        with pytest.raises(grpc.RpcError) as info:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert info.value.code() == Code.INVALID_ARGUMENT, info.value.details()
    body = {"inputs": [{"name": "x", "shape": [0, 1 << 62], "datatype": "FP32", "data": []}]}
    answer = requests.post(f"{server.rest_url}/v2/models/hp/infer", json=body, timeout=30)
    assert answer.status_code == 400, answer.text
    assert "larger than any tensor can be" in answer.json()["error"]
