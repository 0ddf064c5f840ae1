"""The ONNX platform: ``model.onnx`` run by ONNX Runtime, and the export of ONNX models (and scikit-learn ones).

A version folder holds ``model.onnx`` (and, for a model over protobuf's 2 GB limit, its external data file beside
it). The one signature, ``serving_default``, is the graph itself: its inputs and outputs by their ONNX names, with
the numpy types of their element types and -1 for every symbolic or unknown dimension. It is batchable when
dimension 0 of every input and output is dynamic; a model exported with a fixed batch (often 1, as
``torch.onnx.export`` does by default) runs request by request, also with batching on.

Outputs that are not tensors (skl2onnx's ZipMap gives a classifier's probabilities as a sequence of maps) have no
place in TF Serving's APIs: they are left out of the signature, with a warning that says how to export without
them; :func:`convert_sklearn` never makes them. An input that is not a tensor fails the load.

ONNX Runtime is imported inside the functions: a server of TensorFlow models never imports it.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.core.errors import Code, ServingError
from workbench.core.servable import Servable
from workbench.core.signatures import DEFAULT_SIGNATURE, PREDICT_METHOD, Signature, TensorSpec, input_error
from workbench.platforms.base import LoadPolicy
from workbench.platforms.export_request import ExportRefused, ExportRequest, VersionWriter

if TYPE_CHECKING:  # annotations only: importing onnx or onnxruntime at runtime is what load/write do
    import onnx
    import onnxruntime

log = logging.getLogger(__name__)

MODEL_FILE = "model.onnx"
EXTERNAL_DATA_FILE = "model.onnx.data"
CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"
# protobuf refuses to serialize a message of 2 GB or more; such a model keeps its weights in a file of their own.
_PROTOBUF_LIMIT = 2**31 - 1
_ZIPMAP_HINT = (
    'convert scikit-learn models with options={"zipmap": False} (workbench.export(..., format="onnx") does) '
    "to get the probabilities as a float tensor"
)

# ONNX Runtime's names for the element types that numpy can hold. bfloat16, the float8 and 4-bit types and
# complex numbers have no numpy type a request can be decoded into, so tensors of them are not served.
_NUMPY_TYPES: dict[str, np.dtype[Any]] = {
    f"tensor({onnx_name})": np.dtype(numpy_name)
    for onnx_name, numpy_name in [
        ("float", "float32"),
        ("double", "float64"),
        ("float16", "float16"),
        ("int8", "int8"),
        ("int16", "int16"),
        ("int32", "int32"),
        ("int64", "int64"),
        ("uint8", "uint8"),
        ("uint16", "uint16"),
        ("uint32", "uint32"),
        ("uint64", "uint64"),
        ("bool", "bool"),
        ("string", "object"),
    ]
}

# ONNX Runtime's exception classes (onnxruntime.capi.onnxruntime_pybind11_state) by name, as codes. FAIL while
# running is a node refusing the data it was given (a broadcast of mismatched sizes, an index out of range):
# the request's fault, as TensorFlow's op errors are INVALID_ARGUMENT. The rest is the model's or the runtime's.
_RUN_ERROR_CODES = {
    "InvalidArgument": Code.INVALID_ARGUMENT,
    "Fail": Code.INVALID_ARGUMENT,
    "ValueError": Code.INVALID_ARGUMENT,
    "NotImplemented": Code.UNIMPLEMENTED,
}
_LOAD_ERROR_CODES = {
    "NoSuchFile": Code.NOT_FOUND,
    "InvalidProtobuf": Code.DATA_LOSS,
    "NotImplemented": Code.UNIMPLEMENTED,  # an operator or opset this ONNX Runtime does not have
}


# ================================================================================================ serving side
def choose_providers(available: Sequence[str]) -> list[str]:
    """CUDA first when this ONNX Runtime build has it (onnxruntime-gpu), then the CPU, which runs the rest."""
    return [CUDA_PROVIDER, CPU_PROVIDER] if CUDA_PROVIDER in available else [CPU_PROVIDER]


def session_options() -> onnxruntime.SessionOptions:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    # One thread per call. The server already runs up to --num_inference_threads calls at once (twice the cores
    # by default) and the batcher turns concurrent requests into one call; ONNX Runtime's default, a pool of
    # one spinning thread per core for every session, would put cores x calls threads on the CPU under load and
    # keep cores busy spinning between requests for every version loaded. Models that need intra-op parallelism
    # for one request are the GPU's work.
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    # Every error ONNX Runtime logs is also raised to us and reaches the client or the version's status; its
    # own log lines would only repeat them (in colour) on the server's stderr and in notebook cells.
    options.log_severity_level = 4
    return options


def _unknown_rank(path: Path, names: set[str]) -> set[str]:
    """Which of ``names`` (graph inputs/outputs ONNX Runtime gives shape [] for) have no shape, not rank 0."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return {
        v.name
        for v in [*graph.input, *graph.output]
        if v.name in names and v.type.HasField("tensor_type") and not v.type.tensor_type.HasField("shape")
    }


def _spec(arg: Any, rank_unknown: bool) -> TensorSpec | None:
    """One graph input or output (an ONNX Runtime ``NodeArg``) as a TensorSpec; None when it is not a tensor."""
    dtype = _NUMPY_TYPES.get(arg.type)
    if dtype is None:
        return None
    shape = None if rank_unknown else tuple(d if isinstance(d, int) and d >= 0 else -1 for d in arg.shape)
    return TensorSpec(alias=arg.name, name=arg.name, dtype=dtype, shape=shape)


def _batchable(specs: Sequence[TensorSpec]) -> bool:
    """Requests concatenate along dimension 0 only when every tensor's dimension 0 may take any size."""
    return all(spec.shape is not None and len(spec.shape) > 0 and spec.shape[0] == -1 for spec in specs)


def signature_of(session: onnxruntime.InferenceSession, path: Path) -> tuple[Signature, dict[str, str]]:
    """The graph's ``serving_default`` signature, and the outputs left out of it (name → ONNX type)."""
    args = [*session.get_inputs(), *session.get_outputs()]
    shapeless = {a.name for a in args if a.type in _NUMPY_TYPES and not a.shape}
    rank_unknown = _unknown_rank(path, shapeless) if shapeless else set()
    inputs: dict[str, TensorSpec] = {}
    for arg in session.get_inputs():
        spec = _spec(arg, arg.name in rank_unknown)
        if spec is None:
            raise ServingError(
                Code.FAILED_PRECONDITION,
                f"{path}: input {arg.name!r} is {arg.type}; workbench serves models whose inputs are tensors of "
                f"numeric, bool or string types ({', '.join(_NUMPY_TYPES)})",
            )
        inputs[arg.name] = spec
    outputs: dict[str, TensorSpec] = {}
    left_out: dict[str, str] = {}
    for arg in session.get_outputs():
        spec = _spec(arg, arg.name in rank_unknown)
        if spec is None:
            left_out[arg.name] = arg.type
        else:
            outputs[arg.name] = spec
    if not outputs:
        listed = ", ".join(f"{n} ({t})" for n, t in left_out.items())
        raise ServingError(
            Code.FAILED_PRECONDITION, f"{path} has no tensor output to serve: {listed}. {_ZIPMAP_HINT.capitalize()}"
        )
    signature = Signature(
        name=DEFAULT_SIGNATURE,
        method_name=PREDICT_METHOD,
        inputs=inputs,
        outputs=outputs,
        batchable=_batchable([*inputs.values(), *outputs.values()]),
    )
    return signature, left_out


def _load_error(path: Path, exc: Exception) -> ServingError:
    code = _LOAD_ERROR_CODES.get(type(exc).__name__, Code.FAILED_PRECONDITION)
    return ServingError(code, f"ONNX Runtime cannot load {path}: {exc}")


def _run_error(exc: Exception) -> ServingError:
    return ServingError(_RUN_ERROR_CODES.get(type(exc).__name__, Code.INTERNAL), f"ONNX Runtime: {exc}")


def _as_text(spec: TensorSpec, value: np.ndarray) -> np.ndarray:
    """A string input as ONNX Runtime takes it: ``str`` objects (its strings are UTF-8; ours are bytes)."""
    try:
        decoded = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in value.ravel().tolist()]
    except UnicodeDecodeError as exc:
        raise input_error(spec, "bytes that are not UTF-8", f"ONNX string tensors hold UTF-8 text ({exc})") from None
    return np.array(decoded, dtype=object).reshape(value.shape)


def _as_bytes(value: np.ndarray) -> np.ndarray:
    encoded = [v.encode("utf-8") if isinstance(v, str) else v for v in value.ravel().tolist()]
    return np.array(encoded, dtype=object).reshape(value.shape)


class OnnxServable(Servable):
    """An ONNX model in one ONNX Runtime session (``InferenceSession.run`` may be called from several threads).

    ``left_out`` names the graph outputs that are not tensors and are not served, with their ONNX types.
    """

    def __init__(self, name: str, version: int, path: str, file: str = MODEL_FILE) -> None:
        import onnxruntime

        self.name, self.version, self.path = name, version, path
        model = Path(path) / file  # another name than model.onnx: a Triton config's default_model_filename
        if not model.is_file():
            raise ServingError(Code.NOT_FOUND, f"No {file} in {path}")
        self.providers = choose_providers(onnxruntime.get_available_providers())
        try:
            # From the path, not bytes: external data is found beside it and the file need not be copied.
            session = onnxruntime.InferenceSession(str(model), sess_options=session_options(), providers=self.providers)
        except Exception as exc:  # noqa: BLE001 - onnxruntime's errors are untyped: each becomes a load error
            raise _load_error(model, exc) from None
        self._session: onnxruntime.InferenceSession | None = session
        signature, self.left_out = signature_of(session, model)
        self.signatures = {signature.name: signature}
        for output, onnx_type in self.left_out.items():
            log.warning(
                "%s version %d: output %s is %s, not a tensor, and is not served; %s",
                *(name, version, output, onnx_type, _ZIPMAP_HINT),
            )

    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        session = self._session
        if session is None:
            raise ServingError(Code.UNAVAILABLE, f"{self.name} version {self.version} is unloaded")
        feed = {}
        for alias, value in inputs.items():
            spec = signature.inputs[alias]
            feed[spec.name] = _as_text(spec, value) if spec.dtype.kind == "O" else value
        fetches = [signature.outputs[alias].name for alias in outputs]
        try:
            results = session.run(fetches, feed)
        except Exception as exc:  # noqa: BLE001 - onnxruntime's errors are untyped: each becomes a status
            raise _run_error(exc) from None
        answer = {}
        for alias, value in zip(outputs, results, strict=True):
            array = np.asarray(value)
            answer[alias] = _as_bytes(array) if array.dtype.kind in "OU" else array
        return answer

    def close(self) -> None:
        # ONNX Runtime frees a session (and its GPU memory) when the last reference goes.
        self._session = None


def load(name: str, version: int, path: str, policy: LoadPolicy) -> Servable:
    """The platform's loader: ONNX files are data (no pickle, no Python), so the policy allows them always."""
    return OnnxServable(name, version, path)


# ================================================================================================= export side
def _is_model_proto(obj: Any) -> bool:
    return type(obj).__name__ == "ModelProto" and type(obj).__module__.startswith("onnx")


def _is_onnx_path(obj: Any) -> bool:
    return isinstance(obj, (str, os.PathLike)) and os.fspath(obj).endswith(".onnx") and os.path.isfile(obj)


def exports(obj: Any) -> bool:
    """Whether ``obj`` is an ONNX model this platform writes: an ``onnx.ModelProto``, its bytes, or a .onnx file.

    Decided without importing onnx. Bytes are claimed when they start as a serialized ModelProto does
    (field 1, ``ir_version``, a varint: 0x08); :func:`write` parses them in full.
    """
    if _is_model_proto(obj):
        return True
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return bytes(obj[:1]) == b"\x08"
    return _is_onnx_path(obj)


def _model_proto(obj: Any) -> onnx.ModelProto:
    import onnx
    from google.protobuf.message import DecodeError

    if _is_model_proto(obj):
        return obj
    if isinstance(obj, (bytes, bytearray, memoryview)):
        try:
            return onnx.load_model_from_string(bytes(obj))
        except DecodeError as exc:
            raise ValueError(f"These bytes are not a serialized ONNX model: {exc}") from None
    if _is_onnx_path(obj):
        try:
            return onnx.load(os.fspath(obj))  # with its external data, which write() puts beside the copy
        except (DecodeError, OSError) as exc:
            raise ValueError(f"{os.fspath(obj)} is not a readable ONNX model: {exc}") from None
    raise TypeError(
        f"Cannot write a {type(obj).__module__}.{type(obj).__qualname__} as ONNX: "
        "give an onnx.ModelProto, its serialized bytes, or the path of a .onnx file"
    )


def write(obj: Any, folder: Path, **options: Any) -> None:
    """Write ``obj`` (see :func:`exports`) into the empty version folder ``folder`` as ``model.onnx``.

    A model of 2 GB or more keeps its weights in ``model.onnx.data`` beside it (protobuf cannot hold them).
    """
    import onnx

    if options:
        raise TypeError(f"ONNX models take no export options; got {', '.join(sorted(options))}")
    model = _model_proto(obj)
    if not model.graph.output:
        raise ValueError("This ONNX model has no graph outputs: there is nothing to serve")
    large = model.ByteSize() > _PROTOBUF_LIMIT
    onnx.save_model(
        model,
        str(Path(folder) / MODEL_FILE),
        save_as_external_data=large,
        all_tensors_to_one_file=True,
        location=EXTERNAL_DATA_FILE,
    )


def convert_sklearn(estimator: Any, sample: Any) -> onnx.ModelProto:
    """A fitted scikit-learn estimator or pipeline as ONNX, with skl2onnx; ``sample`` is a few rows of its input.

    The input's type and width come from ``sample`` (a numpy array gives one input ``X``; a DataFrame one input per
    column). Classifiers give ``label`` and ``probabilities`` as tensors (no ZipMap). Estimators skl2onnx has no
    converter for fail with a TypeError that says so.
    """
    try:
        from skl2onnx import to_onnx
        from skl2onnx.common.exceptions import MissingConverter, MissingShapeCalculator
        from sklearn.base import is_classifier
    except ImportError as exc:
        raise ImportError(
            f"Converting to ONNX needs {exc.name}: pip install 'workbench-serving[onnx]'", name=exc.name
        ) from None

    if not hasattr(sample, "dtypes"):  # a DataFrame keeps its columns (one input each); the rest is one matrix
        sample = np.asarray(sample)
    options = {"zipmap": False} if is_classifier(estimator) else None
    try:
        model: onnx.ModelProto = to_onnx(estimator, sample, options=options)
    except (MissingConverter, MissingShapeCalculator) as exc:
        first_line = str(exc).strip().splitlines()[0]
        raise TypeError(
            f"skl2onnx cannot convert {type(estimator).__name__} to ONNX ({first_line}); "
            "export it without format='onnx' to serve it with scikit-learn"
        ) from exc
    return model


def writer(model: Any, request: ExportRequest) -> VersionWriter | None:
    """How ``workbench.export`` writes ``model`` with ``format="onnx"``: as it is where it is ONNX already, else
    converted from scikit-learn (:func:`convert_sklearn`) with the export's examples as the sample rows. Without
    that format, None: an ONNX model is written by :func:`write` as any platform's model is."""
    if request.format != "onnx":
        return None
    if not exports(model):
        model = convert_sklearn(model, _sample_rows(request.examples))
    return functools.partial(write, model)


def _sample_rows(examples: Any) -> Any:
    """Rows that show skl2onnx the input's width and type (the one input's batch, from ``examples``)."""
    if examples is None:
        raise ExportRefused("format='onnx' needs examples= (a batch of inputs) to know the model's input shape")
    if isinstance(examples, Mapping):
        if len(examples) != 1:
            raise ExportRefused("format='onnx' takes examples= as one batch (or a dict with one input)")
        return np.asarray(next(iter(examples.values())))
    return np.asarray(examples)
