"""Servables: what the manager loads, and the TensorFlow SavedModel implementation.

The manager, the batcher and the frontends know only :class:`Servable` and :class:`Loader`, so other
frameworks can slot in later without touching them (TF Serving's Source → Loader → Manager split).

SavedModels run the way ``tensorflow_model_server`` runs them: the ``serve`` MetaGraph is imported into its
own graph and session, and a signature is executed by feeding and fetching the tensor names its SignatureDef
lists. That gives TF Serving's exact semantics for every SavedModel, TF1-era or TF2-native (inputs are not
shape-checked against the signature beyond what the graph's ops need), and it is fast: a prepared session
callable costs about 20 µs, against about 300 µs for calling a TF2 ``ConcreteFunction`` from Python.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from workbench.engine.status import Code, ServingError, from_exception

log = logging.getLogger(__name__)

SERVING_TAG = "serve"
DEFAULT_SIGNATURE = "serving_default"
PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One input or output of a signature, as clients address it (by alias).

    ``dtype`` is the type the named graph tensor really has, which is what a feed must have: TF1-era
    signatures can declare another one (TF Serving's saved_model_half_plus_three declares DT_FLOAT for the
    string placeholder its ParseExample reads), and TF Serving goes by the graph, never the declaration.
    """

    alias: str
    tensor_name: str
    dtype: np.dtype[Any]
    dtype_enum: int  # tensorflow DataType enum value (DT_FLOAT = 1, ...)
    shape: tuple[int, ...] | None  # -1 for unknown dimensions, None for unknown rank

    @property
    def dtype_name(self) -> str:
        """TensorFlow's type name ("float", "int64", "string"), as TF Serving's messages write it."""
        from tensorflow.core.framework import types_pb2

        return types_pb2.DataType.Name(self.dtype_enum).removeprefix("DT_").lower()

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


def shape_text(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def type_name(dtype: np.dtype[Any]) -> str:
    """TensorFlow's name for the type of a numpy array ("float", "double", "string"), as in its messages."""
    if dtype.kind in "OSU":
        return "string"
    from tensorflow.core.framework import types_pb2
    from tensorflow.python.framework import dtypes

    try:
        return types_pb2.DataType.Name(dtypes.as_dtype(dtype).as_datatype_enum).removeprefix("DT_").lower()
    except TypeError:
        return str(dtype)


def describe_array(value: np.ndarray) -> str:
    """``float [1,63]``: what a client sent, in the words :meth:`TensorSpec.describe` uses."""
    return f"{type_name(value.dtype)} {shape_text(value.shape)}"


def describe_inputs(inputs: Mapping[str, TensorSpec]) -> str:
    """``a float [-1,2], b int64 [-1]``: a signature's inputs, for messages about missing or extra ones."""
    return ", ".join(f"{alias} {spec.describe()}" for alias, spec in sorted(inputs.items()))


def input_error(spec: TensorSpec, received: str, detail: str = "") -> ServingError:
    """INVALID_ARGUMENT for an input that does not fit its signature: the one format every API and wire uses.

    It leads with what a person needs (which input, by the alias clients send it under; what the signature
    expects; what came) and keeps TF Serving's or TensorFlow's own words in ``detail``, which clients may match.
    """
    message = f'Input "{spec.alias}" expects {spec.describe()} but received {received}'
    return ServingError(Code.INVALID_ARGUMENT, f"{message}: {detail}" if detail else message)


@dataclasses.dataclass(frozen=True)
class Signature:
    name: str
    method_name: str
    inputs: Mapping[str, TensorSpec]
    outputs: Mapping[str, TensorSpec]
    defaults: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)


class Servable(abc.ABC):
    """A loaded model version that can run its signatures on numpy batches.

    Requests hold a servable from resolution to answer (:meth:`acquire` / :meth:`release`, done by the
    manager's handles); :meth:`unload` refuses new holders and waits for the current ones, so a version swap
    never breaks a request that resolved to the old version just before it went away.
    """

    name: str
    version: int
    path: str
    signatures: Mapping[str, Signature]

    def __init__(self) -> None:
        self._holders = 0
        self._unloading = False
        self._released = False
        self._idle = threading.Condition()

    def acquire(self) -> bool:
        """Hold the servable for one request; False once it is unloading."""
        with self._idle:
            if self._unloading:
                return False
            self._holders += 1
            return True

    def release(self) -> None:
        with self._idle:
            self._holders -= 1
            if self._holders == 0:
                self._idle.notify_all()

    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """Run ``signature`` on ``inputs`` (keyed by alias) and return the ``outputs`` asked for."""
        if self._released:
            raise ServingError(Code.UNAVAILABLE, f"Servable {self.name} version {self.version} was unloaded")
        return self._run(signature, inputs, outputs)

    def unload(self, drain_timeout: float = 60.0) -> None:
        """Refuse new holders, wait for the current ones (bounded), then free the model's resources."""
        with self._idle:
            if self._unloading:
                return
            self._unloading = True
            self._idle.wait_for(lambda: self._holders == 0, timeout=drain_timeout)
            self._released = True
        self._release()

    @abc.abstractmethod
    def _run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]: ...

    @abc.abstractmethod
    def _release(self) -> None: ...

    @abc.abstractmethod
    def signature_def_map(self) -> Any:
        """The model's ``tensorflow.serving.SignatureDefMap`` proto, reported by the metadata APIs."""


class Loader(Protocol):
    def __call__(self, name: str, version: int, path: str) -> Servable: ...


def _numpy_dtype(dtype_enum: int) -> np.dtype[Any]:
    from tensorflow.python.framework import dtypes

    if dtype_enum == 0:  # DT_INVALID: e.g. the NoOp output of TF2's __saved_model_init_op
        return np.dtype(object)
    dtype = dtypes.as_dtype(dtype_enum)
    return np.dtype(object) if dtype == dtypes.string else np.dtype(dtype.as_numpy_dtype)


def _spec(alias: str, info: Any) -> TensorSpec:
    if info.WhichOneof("encoding") != "name":
        raise ServingError(
            Code.UNIMPLEMENTED, f"Signature tensor {alias} is not a dense tensor (sparse/composite are unsupported)"
        )
    shape: tuple[int, ...] | None
    shape = None if info.tensor_shape.unknown_rank else tuple(int(d.size) for d in info.tensor_shape.dim)
    dtype = _numpy_dtype(info.dtype)
    return TensorSpec(alias=alias, tensor_name=info.name, dtype=dtype, dtype_enum=info.dtype, shape=shape)


def signature_from_proto(name: str, sig: Any) -> Signature:
    import tensorflow as tf

    defaults = {alias: tf.make_ndarray(proto) for alias, proto in sig.defaults.items()}
    return Signature(
        name=name,
        method_name=sig.method_name,
        inputs={alias: _spec(alias, info) for alias, info in sorted(sig.inputs.items())},
        outputs={alias: _spec(alias, info) for alias, info in sorted(sig.outputs.items())},
        defaults=defaults,
    )


def signature_def_map(signature_defs: Mapping[str, Any]) -> Any:
    """A MetaGraph's signatures as the ``tensorflow.serving.SignatureDefMap`` the metadata APIs report."""
    from tensorflow_serving.apis import get_model_metadata_pb2

    result = get_model_metadata_pb2.SignatureDefMap()
    for key, sig in signature_defs.items():
        result.signature_def[key].CopyFrom(sig)
    return result


def read_serving_meta_graph(path: str) -> Any:
    """Parse ``saved_model.pb`` (or ``.pbtxt``) and return the MetaGraphDef tagged ``serve``."""
    from google.protobuf import text_format
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel()
    pb, pbtxt = Path(path, "saved_model.pb"), Path(path, "saved_model.pbtxt")
    try:
        if pb.is_file():
            saved_model.ParseFromString(pb.read_bytes())
        elif pbtxt.is_file():
            text_format.Parse(pbtxt.read_text(), saved_model)
        else:
            hint = ""
            if Path(path, "export.meta").exists():
                hint = (
                    " (this is a legacy pre-SavedModel export with export.meta; re-export it with "
                    "tf.saved_model.save or workbench.export)"
                )
            raise ServingError(
                Code.NOT_FOUND,
                f"Could not find SavedModel .pb or .pbtxt at supplied export directory path: {path}{hint}",
            )
    except ServingError:
        raise
    except Exception as exc:  # a truncated or garbage protobuf
        raise ServingError(Code.DATA_LOSS, f"Could not parse SavedModel at {path}: {exc}") from None
    for meta_graph in saved_model.meta_graphs:
        if SERVING_TAG in meta_graph.meta_info_def.tags:
            return meta_graph
    found = [sorted(m.meta_info_def.tags) for m in saved_model.meta_graphs]
    raise ServingError(
        Code.NOT_FOUND,
        f"Could not find meta graph def matching supplied tags: {{ {SERVING_TAG} }}. "
        f"The SavedModel at {path} has tag-sets {found}",
    )


class SavedModelServable(Servable):
    """A SavedModel imported into its own TensorFlow graph and session."""

    def __init__(self, name: str, version: int, path: str) -> None:
        import tensorflow as tf
        from tensorflow.python.util import deprecation

        super().__init__()
        self.name, self.version, self.path = name, version, path
        meta_graph = read_serving_meta_graph(path)
        self._meta_graph_signatures = meta_graph.signature_def
        self._graph = tf.Graph()
        config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
        # Serving and training in the notebook kernel share a GPU: take memory as needed, not all of it.
        config.gpu_options.allow_growth = True
        self._session = tf.compat.v1.Session(graph=self._graph, config=config)
        try:
            with self._graph.as_default():
                # The TF1 loader is deprecated in favour of tf.saved_model.load, which cannot give TF Serving's
                # semantics; keep its deprecation notice out of logs and notebook cells.
                with deprecation.silence():
                    tf.compat.v1.saved_model.loader.load(self._session, [SERVING_TAG], path)
        except Exception as exc:
            self._session.close()
            raise from_exception(exc) from None
        self.signatures = {}
        for key, sig in sorted(self._meta_graph_signatures.items()):
            try:
                self.signatures[key] = self._fed_as_the_graph_types(signature_from_proto(key, sig))
            except ServingError as exc:  # still listed in metadata; only running it is refused
                log.warning("Signature %s of %s version %d cannot be served: %s", key, name, version, exc.message)
        self._callables: dict[tuple[str, tuple[str, ...], tuple[str, ...]], Any] = {}
        self._callables_lock = threading.Lock()

    def signature_def_map(self) -> Any:
        return signature_def_map(self._meta_graph_signatures)

    def _fed_as_the_graph_types(self, signature: Signature) -> Signature:
        """``signature`` with each input's dtype taken from the graph tensor it names.

        TF Serving feeds a signature's tensors by name and never compares them with the declared types, so
        a TF1-era signature whose declaration is wrong still serves; validating and decoding against the
        graph's types gives the same answers. Metadata keeps reporting the SignatureDef as written.
        """
        inputs = dict(signature.inputs)
        for alias, spec in signature.inputs.items():
            try:
                actual = self._graph.get_tensor_by_name(spec.tensor_name).dtype.as_datatype_enum
            except (KeyError, ValueError):  # not a tensor of this graph: running it reports that
                continue
            if actual != spec.dtype_enum:
                fixed = dataclasses.replace(spec, dtype=_numpy_dtype(actual), dtype_enum=actual)
                log.info(
                    "Signature %s of %s version %d declares input %s as %s; its tensor %s is %s, which is fed",
                    *(signature.name, self.name, self.version, alias, spec.dtype_name, spec.tensor_name),
                    fixed.dtype_name,
                )
                inputs[alias] = fixed
        return dataclasses.replace(signature, inputs=inputs)

    def _callable(self, signature: Signature, feeds: tuple[str, ...], fetches: tuple[str, ...]) -> Any:
        key = (signature.name, feeds, fetches)
        fn = self._callables.get(key)
        if fn is None:
            from tensorflow.core.protobuf import config_pb2

            with self._callables_lock:
                fn = self._callables.get(key)
                if fn is None:
                    options = config_pb2.CallableOptions(
                        feed=[signature.inputs[a].tensor_name for a in feeds],
                        fetch=[signature.outputs[a].tensor_name for a in fetches],
                    )
                    # The public make_callable() re-checks feed shapes in Python (TF Serving does not) and
                    # falls back to Session.run; the options form runs straight through the C API.
                    fn = self._session._make_callable_from_options(options)
                    self._callables[key] = fn
        return fn

    def _run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        feeds = tuple(inputs)
        fetches = tuple(outputs)
        fn = self._callable(signature, feeds, fetches)
        try:
            results = fn(*(inputs[a] for a in feeds))
        except Exception as exc:
            raise from_exception(exc) from None
        return {alias: np.asarray(value) for alias, value in zip(fetches, results, strict=True)}

    def _release(self) -> None:
        with self._callables_lock:
            self._callables.clear()
        self._session.close()


def load_saved_model(name: str, version: int, path: str) -> Servable:
    if not os.path.isdir(path):
        raise ServingError(Code.NOT_FOUND, f"Model version folder does not exist: {path}")
    return SavedModelServable(name, version, path)


class NullServable(Servable):
    """A SavedModel's signatures answered with zeros, without TensorFlow: the frontends' own ceiling.

    Served with ``model_platform: "workbench_null"``; every request walks the real path (decoding, resolution,
    validation, batching, encoding) except the model call itself.
    """

    def __init__(self, name: str, version: int, path: str) -> None:
        super().__init__()
        self.name, self.version, self.path = name, version, path
        meta_graph = read_serving_meta_graph(path)
        self._signature_defs = meta_graph.signature_def
        self.signatures = {}
        for key, sig in sorted(meta_graph.signature_def.items()):
            try:
                self.signatures[key] = signature_from_proto(key, sig)
            except ServingError:
                continue

    def signature_def_map(self) -> Any:
        return signature_def_map(self._signature_defs)

    def _run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        rows = next((v.shape[0] for v in inputs.values() if v.ndim), 1)
        result = {}
        for alias in outputs:
            spec = signature.outputs[alias]
            shape = (rows,) + tuple(max(d, 1) for d in (spec.shape or (-1,))[1:])
            result[alias] = np.zeros(shape, dtype=spec.dtype) if spec.dtype.kind != "O" else np.full(shape, b"", object)
        return result

    def _release(self) -> None:
        pass


LOADERS: dict[str, Loader] = {
    "tensorflow": load_saved_model,
    "workbench_null": lambda name, version, path: NullServable(name, version, path),
}
