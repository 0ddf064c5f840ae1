"""What a model takes and gives, independent of any framework or wire protocol.

A :class:`Signature` (TF Serving's SignatureDef, in numpy terms) is the contract between the clients, the
dataplane and every platform: inputs and outputs addressed by alias, each with a numpy dtype and a shape in
which -1 stands for any size. Platforms derive their signatures from the model (a SavedModel's SignatureDefs, an
ONNX graph's inputs, an estimator's methods); protocols translate them to their own type tables at the edge.

Types are named the way TensorFlow and TF Serving name them ("float", "int64", "string") in every message,
whatever the framework, so an error reads the same over REST, gRPC and in a notebook.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError

DEFAULT_SIGNATURE = "serving_default"
# What a request that leaves out an optional input (Triton's ``optional: true``) is fed for it, as a Signature
# default: recognised by identity, so the platform gives the model no tensor for it and the batcher batches around it.
OMITTED = np.zeros((0,), dtype=np.float32)
PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"

# numpy's names for the types TensorFlow names differently; every other numeric type keeps numpy's name.
_TYPE_NAMES = {
    "float32": "float",
    "float64": "double",
    "float16": "half",
    "bool": "bool",
}


def type_name(dtype: np.dtype[Any]) -> str:
    """TensorFlow's name for a numpy type ("float", "double", "int64", "string"), as messages write it."""
    if dtype.kind in "OSU":
        return "string"
    return _TYPE_NAMES.get(dtype.name, dtype.name)


def shape_text(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One input or output of a signature, as clients address it (by alias).

    ``name`` is what the platform feeds or fetches (a graph tensor such as ``x:0``, an ONNX input name, a feature
    column); ``dtype`` is the type that must be fed, strings as numpy ``object`` holding ``bytes``.
    """

    alias: str
    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...] | None  # -1 for unknown dimensions, None for unknown rank

    @property
    def dtype_name(self) -> str:
        return type_name(self.dtype)

    def describe(self) -> str:
        """``float [-1,64]``: the type and shape a client must send, -1 for any size."""
        if self.shape is None:
            return f"{self.dtype_name} of any shape"
        return f"{self.dtype_name} {shape_text(self.shape)}"

    def admits_shape(self, shape: tuple[int, ...]) -> bool:
        """Whether ``shape`` is one the signature declares (any size where it says -1)."""
        if self.shape is None:
            return True
        return len(shape) == len(self.shape) and all(d in (-1, n) for d, n in zip(self.shape, shape, strict=True))


@dataclasses.dataclass(frozen=True)
class Signature:
    """A named function of a model: TF Serving's SignatureDef with numpy types.

    ``batchable`` says whether requests may be concatenated along dimension 0 and run as one call (the batcher
    runs the others one by one); ``features`` names the columns of a single matrix input, where the model keeps
    them (scikit-learn's ``feature_names_in_``), so a columnar request or a tf.Example can address them by name.
    """

    name: str
    method_name: str
    inputs: Mapping[str, TensorSpec]
    outputs: Mapping[str, TensorSpec]
    defaults: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    batchable: bool = True
    features: tuple[str, ...] = ()

    def request_inputs(self, sent: Collection[str] | None = None) -> Mapping[str, TensorSpec]:
        """What a request may send: the inputs, or each named feature as a column of the one matrix input.

        Given the names a request ``sent``, the one way it chose: its features when it names any of them (and not
        the matrix itself), else the inputs. Without them, both ways.
        """
        if not self.features or len(self.inputs) != 1:
            return self.inputs
        ((alias, matrix),) = self.inputs.items()
        columns = {f: TensorSpec(alias=f, name=f, dtype=matrix.dtype, shape=(-1,)) for f in self.features}
        if sent is None:
            return {**columns, **self.inputs}
        by_feature = alias not in sent and any(name in columns for name in sent)
        return columns if by_feature else self.inputs


def describe_array(value: np.ndarray) -> str:
    """``float [1,63]``: what a client sent, in the words :meth:`TensorSpec.describe` uses."""
    return f"{type_name(value.dtype)} {shape_text(value.shape)}"


def describe_inputs(inputs: Mapping[str, TensorSpec]) -> str:
    """``a float [-1,2], b int64 [-1]``: a signature's inputs, for messages about missing or extra ones."""
    return ", ".join(f"{alias} {spec.describe()}" for alias, spec in sorted(inputs.items()))


def input_error(spec: TensorSpec, received: str, detail: str = "") -> ServingError:
    """INVALID_ARGUMENT for an input that does not fit its signature: the one format every API and wire uses.

    It leads with what a person needs (which input, by the alias clients send it under; what the signature
    expects; what came) and keeps the framework's own words in ``detail``, which clients may match.
    """
    message = f'Input "{spec.alias}" expects {spec.describe()} but received {received}'
    return ServingError(Code.INVALID_ARGUMENT, f"{message}: {detail}" if detail else message)
