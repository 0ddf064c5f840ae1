"""The TF Lite platform: ``model.tflite`` run by LiteRT (``ai-edge-litert``, TF Lite's interpreter on PyPI).

TF Serving serves a version folder's ``model.tflite`` instead of its SavedModel when started with
``--prefer_tflite_model``; so does workbench (a folder holding only ``model.tflite`` is served by it either way).
The signatures are TF Serving's:

- the SignatureDefs TF Serving's converter stores in the model's ``signature_defs_metadata`` (a flexbuffer map of
  signature name → serialized ``tensorflow.SignatureDef``; a tensor ``x:0`` is the TF Lite tensor ``x``);
- else the model's own TF Lite signatures (a model converted from a SavedModel);
- else ``serving_default`` over the model's input and output tensors by name, as TF Serving's TF Lite session
  makes it for a model without signatures.

A request's tensors may have other shapes than the model was converted with: the interpreter's inputs are resized
to them before it runs (TF Serving's session does the same), so a signature declares the shapes it was converted
with only where a dimension is dynamic, and any rank otherwise. A signature whose every tensor has a dynamic first
dimension is batchable. One interpreter runs one call at a time (TF Lite's interpreters are not thread-safe);
``--tflite_interpreters`` of them run at once (``LoadPolicy.tflite_interpreters``).

LiteRT is imported inside :func:`load`: a server of SavedModels never imports it.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError
from workbench.core.servable import Servable
from workbench.core.signatures import DEFAULT_SIGNATURE, PREDICT_METHOD, Signature, TensorSpec
from workbench.platforms.base import LoadPolicy

MODEL_FILE = "model.tflite"
SIGNATURE_METADATA = "signature_defs_metadata"  # TF Lite's signature_def_util: TF Serving's SignatureDefs


def load(name: str, version: int, path: str, policy: LoadPolicy) -> Servable:
    return TfLiteServable(name, version, path, max(1, policy.tflite_interpreters))


class TfLiteServable(Servable):
    def __init__(self, name: str, version: int, path: str, interpreters: int = 1) -> None:
        try:
            from ai_edge_litert.interpreter import Interpreter
        except ImportError as exc:
            raise ServingError(
                Code.FAILED_PRECONDITION,
                f"The tflite platform needs ai-edge-litert (LiteRT), which is missing ({exc}); install it with: "
                "pip install 'workbench-serving[tflite]'",
            ) from None
        self.name, self.version, self.path = name, version, path
        model = Path(path) / MODEL_FILE
        try:
            data = model.read_bytes()
            pool = [Interpreter(model_content=data) for _ in range(interpreters)]
        except (OSError, ValueError, RuntimeError) as exc:
            raise ServingError(
                Code.INVALID_ARGUMENT, f"{model} is not a TF Lite model LiteRT can load: {exc}"
            ) from None
        self._free: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for interpreter in pool:
            interpreter.allocate_tensors()
            self._free.put(interpreter)
        first = pool[0]
        self._indices = {d["name"]: d["index"] for d in [*first.get_input_details(), *first.get_output_details()]}
        self._details = {d["name"]: d for d in [*first.get_input_details(), *first.get_output_details()]}
        self.signatures = _signatures(first, data, self._details)
        # The shape each input has now, per interpreter: resized (and reallocated) only when a request differs.
        self._shapes: dict[int, dict[int, tuple[int, ...]]] = {
            id(interpreter): {d["index"]: tuple(d["shape"]) for d in interpreter.get_input_details()}
            for interpreter in pool
        }

    @contextmanager
    def _interpreter(self) -> Iterator[Any]:
        interpreter = self._free.get()
        try:
            yield interpreter
        finally:
            self._free.put(interpreter)

    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        with self._interpreter() as interpreter:
            shapes = self._shapes[id(interpreter)]
            resized = False
            for alias, value in inputs.items():
                index = self._indices[signature.inputs[alias].name]
                if shapes.get(index) != value.shape:
                    interpreter.resize_tensor_input(index, list(value.shape), strict=False)
                    shapes[index] = value.shape
                    resized = True
            try:
                if resized:
                    interpreter.allocate_tensors()
                for alias, value in inputs.items():
                    interpreter.set_tensor(self._indices[signature.inputs[alias].name], value)
                interpreter.invoke()
            except (ValueError, RuntimeError) as exc:
                raise ServingError(Code.INVALID_ARGUMENT, f"TF Lite could not run {signature.name}: {exc}") from None
            return {alias: interpreter.get_tensor(self._indices[signature.outputs[alias].name]) for alias in outputs}


def _signatures(interpreter: Any, data: bytes, details: Mapping[str, Mapping[str, Any]]) -> dict[str, Signature]:
    stored = _stored_signature_defs(data)
    if stored:
        return {key: _from_signature_def(key, proto, details) for key, proto in stored.items()}
    native = interpreter.get_signature_list()
    if native:
        signatures = {}
        for key in native:
            runner = interpreter.get_signature_runner(key)
            inputs = {alias: detail["name"] for alias, detail in runner.get_input_details().items()}
            outputs = {alias: detail["name"] for alias, detail in runner.get_output_details().items()}
            signatures[key] = _signature(key, PREDICT_METHOD, inputs, outputs, details)
        return signatures
    inputs = {d["name"]: d["name"] for d in interpreter.get_input_details()}
    outputs = {d["name"]: d["name"] for d in interpreter.get_output_details()}
    return {DEFAULT_SIGNATURE: _signature(DEFAULT_SIGNATURE, PREDICT_METHOD, inputs, outputs, details)}


def _stored_signature_defs(data: bytes) -> dict[str, Any]:
    """The SignatureDefs TF Serving's converter keeps in the model's metadata, by name (none: empty)."""
    from ai_edge_litert import schema_py_generated as schema
    from flatbuffers import flexbuffers

    model = schema.Model.GetRootAsModel(data, 0)
    for index in range(model.MetadataLength()):
        entry = model.Metadata(index)
        if entry.Name() != SIGNATURE_METADATA.encode():
            continue
        buffer = model.Buffers(entry.Buffer()).DataAsNumpy()
        if not isinstance(buffer, np.ndarray):
            return {}
        from workbench.runtime import tensorflow_protos

        tensorflow_protos.load()
        from tensorflow.core.protobuf import meta_graph_pb2

        stored = flexbuffers.GetRoot(bytearray(buffer.tobytes())).AsMap
        signatures = {}
        for key, value in zip(stored.Keys, stored.Values, strict=True):
            proto = meta_graph_pb2.SignatureDef()
            proto.ParseFromString(_raw_bytes(value))
            signatures[key.AsKey] = proto
        return signatures
    return {}


def _raw_bytes(value: Any) -> bytes:
    """A flexbuffer string's or blob's bytes. TF Lite's writer stores each SignatureDef as a flexbuffer *string*,
    whose public accessor decodes UTF-8, which a serialized proto need not be: its bytes are read as they are."""
    from flatbuffers import flexbuffers

    if value.IsBlob:
        return bytes(value.AsBlob)
    return bytes(flexbuffers.String(value._Indirect(), value._byte_width).Bytes)  # noqa: SLF001


def _from_signature_def(key: str, proto: Any, details: Mapping[str, Mapping[str, Any]]) -> Signature:
    def tensor(info: Any) -> str:
        return str(info.name).rsplit(":", 1)[0]  # "x:0" names TF Lite's tensor "x"

    inputs = {alias: tensor(info) for alias, info in proto.inputs.items()}
    outputs = {alias: tensor(info) for alias, info in proto.outputs.items()}
    return _signature(key, proto.method_name or PREDICT_METHOD, inputs, outputs, details)


def _signature(
    key: str,
    method: str,
    inputs: Mapping[str, str],
    outputs: Mapping[str, str],
    details: Mapping[str, Mapping[str, Any]],
) -> Signature:
    for alias, tensor in [*inputs.items(), *outputs.items()]:
        if tensor not in details:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f'Signature {key}: "{alias}" names tensor "{tensor}", which the TF Lite model does not have',
            )
    specs = {alias: _spec(alias, details[tensor]) for alias, tensor in [*inputs.items(), *outputs.items()]}
    batchable = all(spec.shape is not None and spec.shape[:1] == (-1,) for spec in specs.values())
    return Signature(
        name=key,
        method_name=method,
        inputs={alias: specs[alias] for alias in inputs},
        outputs={alias: specs[alias] for alias in outputs},
        batchable=batchable,
    )


def _spec(alias: str, detail: Mapping[str, Any]) -> TensorSpec:
    """A tensor as clients may send it: the converted shape where a dimension is dynamic (-1), else any shape (the
    interpreter is resized to what a request sends)."""
    dtype = np.dtype(detail["dtype"])
    dims = tuple(int(d) for d in detail.get("shape_signature", detail["shape"]))
    shape = dims if -1 in dims else None
    return TensorSpec(
        alias=alias, name=str(detail["name"]), dtype=np.dtype(object) if dtype.kind == "O" else dtype, shape=shape
    )
