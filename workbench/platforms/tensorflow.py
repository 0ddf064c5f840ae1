"""The TensorFlow platform: SavedModels, run the way ``tensorflow_model_server`` runs them.

The ``serve`` MetaGraph is imported into its own graph and session, and a signature is executed by feeding and
fetching the tensor names its SignatureDef lists. That gives TF Serving's exact semantics for every SavedModel,
TF1-era or TF2-native (inputs are not shape-checked against the signature beyond what the graph's ops need), and it
is fast: a prepared session callable costs about 20 µs, against about 300 µs for calling a TF2 ``ConcreteFunction``
from Python.

A cheap call runs its graph on the calling thread (:class:`GraphCall`): handing the graph to TensorFlow's inter-op
pool and waiting for it costs two thread wake-ups, most of a small model's time (20 µs against 4 µs for
half_plus_two, more on an idle machine, where the pool's threads sleep), and the pool's threads spin for work
after each call, taking cores from the server under load. Large ops still spread over every core through the
intra-op pool either way.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from workbench.core.differentiable import Gradients
from workbench.core.errors import Code, ServingError, from_exception
from workbench.core.servable import Servable
from workbench.core.signatures import Signature, TensorSpec
from workbench.platforms.base import LoadPolicy
from workbench.platforms.export_request import ExportRequest, VersionWriter
from workbench.protocol import tf_types
from workbench.protocol.signature_defs import signature_from_proto
from workbench.runtime.tensorflow_runtime import saved_model_runtime

log = logging.getLogger(__name__)

SERVING_TAG = "serve"
SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")


# The common types, as TensorFlow's table gives them: the null platform reads signatures without TensorFlow.
_COMMON_DTYPES: dict[int, np.dtype[Any]] = {enum: dtype for dtype, (enum, _) in tf_types.FIELDS.items()}


def _numpy_dtype(dtype_enum: int) -> np.dtype[Any]:
    """The numpy type a graph tensor of ``dtype_enum`` is fed with (TensorFlow's own table for the rare ones)."""
    if dtype_enum in (tf_types.DT_INVALID, tf_types.DT_STRING):  # DT_INVALID: TF2's __saved_model_init_op NoOp
        return np.dtype(object)
    common = _COMMON_DTYPES.get(dtype_enum)
    if common is not None:
        return common
    return np.dtype(saved_model_runtime().as_dtype(dtype_enum).as_numpy_dtype)


def _signature(name: str, proto: Any) -> Signature:
    """A SignatureDef as a Signature, with TensorFlow's numpy types for the types TF Serving's table lacks."""
    signature = signature_from_proto(name, proto)

    def typed(specs: Mapping[str, TensorSpec], infos: Any) -> dict[str, TensorSpec]:
        return {a: dataclasses.replace(s, dtype=_numpy_dtype(infos[a].dtype)) for a, s in specs.items()}

    return dataclasses.replace(
        signature, inputs=typed(signature.inputs, proto.inputs), outputs=typed(signature.outputs, proto.outputs)
    )


def legacy_export_hint(folder: Path) -> str:
    """What to say of a folder that holds a TensorFlow export from before SavedModels (TF Serving's own seeds)."""
    if (folder / "export.meta").exists():
        return (
            " (this is a legacy pre-SavedModel export with export.meta; re-export it with "
            "tf.saved_model.save or workbench.export)"
        )
    return ""


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
            hint = legacy_export_hint(Path(path))
            raise ServingError(
                Code.NOT_FOUND,
                f"Could not find SavedModel .pb or .pbtxt at supplied export directory path: {path}{hint}",
            )
    except ServingError:
        raise
    except Exception as exc:  # noqa: BLE001 - a truncated or garbage protobuf
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
    """A SavedModel imported into its own TensorFlow graph and session.

    ``signature_defs`` are the SignatureDefs as written, which the metadata APIs report unchanged.
    """

    def __init__(self, name: str, version: int, path: str) -> None:
        # Graphs, sessions and the TF1 loader, without tensorflow/__init__ where TensorFlow is not imported yet.
        tf = self._tf = saved_model_runtime()
        self.name, self.version, self.path = name, version, path
        meta_graph = read_serving_meta_graph(path)
        self.signature_defs: Mapping[str, Any] = meta_graph.signature_def
        self._graph = tf.Graph()
        config = tf.ConfigProto(allow_soft_placement=True)
        # Serving and training in the notebook kernel share a GPU: take memory as needed, not all of it.
        config.gpu_options.allow_growth = True
        self._session = tf.Session(graph=self._graph, config=config)
        try:
            with self._graph.as_default():
                # The TF1 loader is deprecated in favour of tf.saved_model.load, which cannot give TF Serving's
                # semantics; keep its deprecation notice out of logs and notebook cells.
                with tf.silence_deprecation():
                    tf.load(self._session, [SERVING_TAG], path)
        except Exception as exc:  # noqa: BLE001 - from_exception maps TensorFlow's errors to statuses
            self._session.close()
            raise from_exception(exc) from None
        self.signatures = {}
        for key, sig in sorted(self.signature_defs.items()):
            try:
                self.signatures[key] = self._fed_as_the_graph_types(_signature(key, sig))
            except ServingError as exc:  # still listed in metadata; only running it is refused
                log.warning("Signature %s of %s version %d cannot be served: %s", key, name, version, exc.message)
        self._callables: dict[tuple[str, tuple[str, ...], tuple[str, ...]], GraphCall] = {}
        self._callables_lock = threading.Lock()

    def _fed_as_the_graph_types(self, signature: Signature) -> Signature:
        """``signature`` with each input's dtype taken from the graph tensor it names.

        TF Serving feeds a signature's tensors by name and never compares them with the declared types, so
        a TF1-era signature whose declaration is wrong still serves; validating and decoding against the
        graph's types gives the same answers. Metadata keeps reporting the SignatureDef as written.
        """
        inputs = dict(signature.inputs)
        for alias, spec in signature.inputs.items():
            try:
                actual = self._graph.get_tensor_by_name(spec.name).dtype.as_datatype_enum
            except (KeyError, ValueError):  # not a tensor of this graph: running it reports that
                continue
            if _numpy_dtype(actual) != spec.dtype:
                fixed = dataclasses.replace(spec, dtype=_numpy_dtype(actual))
                log.info(
                    "Signature %s of %s version %d declares input %s as %s; its tensor %s is %s, which is fed",
                    *(signature.name, self.name, self.version, alias, spec.dtype_name, spec.name),
                    fixed.dtype_name,
                )
                inputs[alias] = fixed
        return dataclasses.replace(signature, inputs=inputs)

    def _callable(self, signature: Signature, feeds: tuple[str, ...], fetches: tuple[str, ...]) -> GraphCall:
        key = (signature.name, feeds, fetches)
        fn = self._callables.get(key)
        if fn is None:
            with self._callables_lock:
                fn = self._callables.get(key)
                if fn is None:
                    fn = self._callables[key] = GraphCall(
                        self._session,
                        self._tf.CallableOptions,
                        [signature.inputs[a].name for a in feeds],
                        [signature.outputs[a].name for a in fetches],
                    )
        return fn

    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        feeds = tuple(inputs)
        fetches = tuple(outputs)
        fn = self._callable(signature, feeds, fetches)
        try:
            results = fn(*(inputs[a] for a in feeds))
        except Exception as exc:  # noqa: BLE001 - from_exception maps TensorFlow's errors to statuses
            raise from_exception(exc) from None
        return {alias: np.asarray(value) for alias, value in zip(fetches, results, strict=True)}

    def gradients(self, signature: Signature, input_alias: str, output_alias: str) -> Gradients:
        """Integrated gradients' view of ``signature`` (:class:`~workbench.core.differentiable.Differentiable`):
        the SavedModel read again eagerly, since the graph session cannot be differentiated."""
        from workbench.platforms.tensorflow_gradients import SavedModelGradients, saved_model_signature

        return SavedModelGradients(saved_model_signature(self, signature.name), input_alias, output_alias)

    def close(self) -> None:
        with self._callables_lock:
            self._callables.clear()
        self._session.close()


class GraphCall:
    """One prepared session call (feeds → fetches), run on the calling thread while it is cheap.

    TensorFlow runs a graph's ops on its inter-op pool unless ``RunOptions.inter_op_thread_pool`` is -1, which runs
    them on the caller's thread; TensorFlow recommends that only where the context switch is comparable with the
    call. So each call is timed: one slower than :data:`POOL_ABOVE_SECONDS` on the calling thread moves the calls
    to the pool (a graph with parallel branches may use it), and one faster than :data:`CALLER_BELOW_SECONDS` on
    the pool moves them back.
    """

    CALLER_BELOW_SECONDS = 1e-3
    POOL_ABOVE_SECONDS = 2e-3

    __slots__ = ("_session", "_options", "_on_caller", "_on_pool", "_lock", "on_caller_thread")

    def __init__(self, session: Any, callable_options: Any, feeds: list[str], fetches: list[str]) -> None:
        self._session = session
        self._options = callable_options(feed=feeds, fetch=fetches)
        on_caller = callable_options()
        on_caller.CopyFrom(self._options)
        on_caller.run_options.inter_op_thread_pool = -1
        # The public make_callable() re-checks feed shapes in Python (TF Serving does not) and falls back to
        # Session.run; the options form runs straight through the C API.
        self._on_caller = session._make_callable_from_options(on_caller)  # noqa: SLF001 - TF Serving's RunOptions need the Session's own callables
        self._on_pool: Any = None  # prepared when a call first proves slow (a second executor costs memory)
        self._lock = threading.Lock()
        self.on_caller_thread = True

    def __call__(self, *values: np.ndarray) -> Any:
        # Two threads' verdicts may race; that is harmless, as each call runs correctly either way.
        on_caller = self.on_caller_thread
        started = time.perf_counter()
        results = (self._on_caller if on_caller else self._on_pool)(*values)
        seconds = time.perf_counter() - started
        if on_caller:
            if seconds > self.POOL_ABOVE_SECONDS:
                self._to_pool()
        elif seconds < self.CALLER_BELOW_SECONDS:
            self.on_caller_thread = True
        return results

    def _to_pool(self) -> None:
        with self._lock:
            if self._on_pool is None:
                self._on_pool = self._session._make_callable_from_options(self._options)  # noqa: SLF001
        self.on_caller_thread = False


def load_saved_model(name: str, version: int, path: str) -> Servable:
    if not os.path.isdir(path):
        raise ServingError(Code.NOT_FOUND, f"Model version folder does not exist: {path}")
    return SavedModelServable(name, version, path)


def load(name: str, version: int, path: str, policy: LoadPolicy) -> Servable:
    return load_saved_model(name, version, path)


def load_null(name: str, version: int, path: str, policy: LoadPolicy) -> Servable:
    return NullServable(name, version, path)


class NullServable(Servable):
    """A SavedModel's signatures answered with zeros, without TensorFlow: the frontends' own ceiling.

    Served with ``model_platform: "workbench_null"``; every request walks the real path (decoding, resolution,
    validation, batching, encoding) except the model call itself.
    """

    def __init__(self, name: str, version: int, path: str) -> None:
        self.name, self.version, self.path = name, version, path
        meta_graph = read_serving_meta_graph(path)
        self.signature_defs: Mapping[str, Any] = meta_graph.signature_def
        self.signatures = {}
        for key, sig in sorted(meta_graph.signature_def.items()):
            try:
                self.signatures[key] = _signature(key, sig)
            except ServingError:
                continue

    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        rows = next((v.shape[0] for v in inputs.values() if v.ndim), 1)
        result = {}
        for alias in outputs:
            spec = signature.outputs[alias]
            shape = (rows,) + tuple(max(d, 1) for d in (spec.shape or (-1,))[1:])
            result[alias] = np.zeros(shape, dtype=spec.dtype) if spec.dtype.kind != "O" else np.full(shape, b"", object)
        return result


def writer(model: Any, request: ExportRequest) -> VersionWriter:
    """How ``workbench.export`` writes a TensorFlow model (Keras, a ``tf.Module``, a function): traced and saved as a
    SavedModel (:mod:`workbench.platforms.tensorflow_export`); the route of every model no other platform takes."""
    from workbench.platforms.tensorflow_export import writer as saved_model_writer

    return saved_model_writer(model, request)
