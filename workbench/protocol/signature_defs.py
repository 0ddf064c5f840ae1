"""Signatures ↔ TF Serving's SignatureDef, the form metadata takes over REST and gRPC for every platform.

A TensorFlow SavedModel reports its SignatureDefs exactly as written (a servable that has them exposes
``signature_defs``); every other platform's signatures are described here from their numpy specs, so TF Serving
clients, the dashboard's query panel and the sidebar read a scikit-learn or ONNX model's metadata unchanged.
Nothing here imports TensorFlow: the protos come from ``tensorflow-serving-api``'s generated modules only where a
proto is built, and JSON metadata is read straight into :class:`~workbench.core.signatures.Signature`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError
from workbench.core.signatures import Signature, TensorSpec
from workbench.protocol import tf_types


def _spec_from_proto(alias: str, info: Any) -> TensorSpec:
    if info.WhichOneof("encoding") != "name":
        raise ServingError(
            Code.UNIMPLEMENTED, f"Signature tensor {alias} is not a dense tensor (sparse/composite are unsupported)"
        )
    shape = None if info.tensor_shape.unknown_rank else tuple(int(d.size) for d in info.tensor_shape.dim)
    return TensorSpec(alias=alias, name=info.name, dtype=tf_types.to_numpy_dtype(info.dtype), shape=shape)


def signature_from_proto(name: str, sig: Any) -> Signature:
    """A ``tensorflow.SignatureDef`` proto as a :class:`Signature`."""
    from workbench.protocol.tensor_proto import to_numpy

    return Signature(
        name=name,
        method_name=sig.method_name,
        inputs={alias: _spec_from_proto(alias, info) for alias, info in sorted(sig.inputs.items())},
        outputs={alias: _spec_from_proto(alias, info) for alias, info in sorted(sig.outputs.items())},
        defaults={alias: to_numpy(proto, alias) for alias, proto in sig.defaults.items()},
    )


def _spec_from_json(alias: str, info: Mapping[str, Any]) -> TensorSpec:
    shape_doc = info.get("tensor_shape", {})
    shape = None
    if not shape_doc.get("unknown_rank", False):
        shape = tuple(int(d.get("size", 0)) for d in shape_doc.get("dim", []))
    dtype = tf_types.to_numpy_dtype(tf_types.enum_from_name(info.get("dtype", "DT_INVALID")))
    return TensorSpec(alias=alias, name=str(info.get("name", "")), dtype=dtype, shape=shape)


def signatures_from_json(doc: Mapping[str, Any]) -> dict[str, Signature]:
    """The ``signature_def`` object of a REST metadata answer as :class:`Signature`s (defaults are not read)."""
    signatures = {}
    for name, sig in doc.get("signature_def", {}).items():
        try:
            signatures[name] = Signature(
                name=name,
                method_name=str(sig.get("method_name", "")),
                inputs={alias: _spec_from_json(alias, i) for alias, i in sorted(sig.get("inputs", {}).items())},
                outputs={alias: _spec_from_json(alias, o) for alias, o in sorted(sig.get("outputs", {}).items())},
            )
        except ServingError:  # a sparse tensor or an unknown type: listed in the metadata, not callable
            continue
    return signatures


def _fill(info: Any, spec: TensorSpec) -> None:
    info.name = spec.name
    info.dtype = tf_types.to_enum(spec.dtype)
    if spec.shape is None:
        info.tensor_shape.unknown_rank = True
    else:
        for d in spec.shape:
            info.tensor_shape.dim.add().size = d


def signature_def(signature: Signature) -> Any:
    """A :class:`Signature` as the ``tensorflow.SignatureDef`` metadata reports."""
    from tensorflow.core.protobuf import meta_graph_pb2

    from workbench.protocol.tensor_proto import from_numpy

    proto = meta_graph_pb2.SignatureDef(method_name=signature.method_name)
    for alias, spec in signature.inputs.items():
        _fill(proto.inputs[alias], spec)
    for alias, spec in signature.outputs.items():
        _fill(proto.outputs[alias], spec)
    for alias, value in signature.defaults.items():
        from_numpy(np.asarray(value), proto.defaults[alias])
    return proto


def signature_def_map(servable: Any) -> Any:
    """A servable's ``tensorflow.serving.SignatureDefMap``: its own SignatureDefs if it has them, else derived."""
    from tensorflow_serving.apis import get_model_metadata_pb2

    result = get_model_metadata_pb2.SignatureDefMap()
    own: Mapping[str, Any] | None = getattr(servable, "signature_defs", None)
    if own is not None:
        for key, sig in own.items():
            result.signature_def[key].CopyFrom(sig)
        return result
    for key, signature in servable.signatures.items():
        result.signature_def[key].CopyFrom(signature_def(signature))
    return result
