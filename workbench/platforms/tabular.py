"""What the tabular platforms (scikit-learn, XGBoost, LightGBM) have in common: a model of one feature matrix.

A tabular model takes one 2-D matrix, a row per example and a column per feature, and each of its methods
(predict, predict_proba, ...) gives one array back. The platform modules only say which methods a model has
and how to call them (:class:`TabularModel`); this module turns that into signatures and runs them:

- one predict signature per method, whose one input is the matrix under the alias ``x`` (``serving_default`` is
  ``predict``); the matrix's dtype is the one the library computes in, so a served answer equals the in-process
  answer bit for bit (the server converts a request's numbers once, exactly as the library would);
- ``classify`` for classifiers (every class name as a string, with its probability as float32) and ``regress`` for
  regressors (float32), fed TF Serving's serialized ``tf.Example``s (see :func:`examples_to_matrix` for how a row
  is read from an example);
- feature names (scikit-learn's ``feature_names_in_``) kept as :attr:`Signature.features`, so a columnar request
  can send each feature as a column of its own.

Every signature is batchable along dimension 0, except classify and regress: their examples are parsed inside the
model call, and one malformed example would fail every request batched with it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError, from_exception, invalid_argument
from workbench.core.servable import Servable
from workbench.core.signatures import (
    CLASSIFY_METHOD,
    PREDICT_METHOD,
    REGRESS_METHOD,
    Signature,
    TensorSpec,
    describe_array,
    input_error,
)
from workbench.platforms.base import VERSION_CONFIG

MATRIX = "x"  # the alias of the feature matrix, and the tf.Example feature holding a whole row
EXAMPLES = "inputs"  # classify/regress: the serialized tf.Examples (TF Serving's alias)
CLASSES, SCORES, REGRESS_OUTPUTS = "classes", "scores", "outputs"
CLASSIFY_SIGNATURE, REGRESS_SIGNATURE = "classify", "regress"

Function = Callable[[np.ndarray], Any]


@dataclasses.dataclass(frozen=True)
class Matrix:
    """The one input of a tabular model: ``width`` features (None: the model does not say) of ``dtype``."""

    dtype: np.dtype[Any]
    width: int | None
    features: tuple[str, ...] = ()  # the features' names, where the model keeps them

    @property
    def spec(self) -> TensorSpec:
        return TensorSpec(MATRIX, MATRIX, self.dtype, (-1, self.width if self.width is not None else -1))

    def check(self, value: np.ndarray) -> np.ndarray:
        """``value`` as the model takes it, or INVALID_ARGUMENT naming what was expected."""
        if value.ndim != 2 or (self.width is not None and value.shape[1] != self.width):
            raise input_error(self.spec, describe_array(value), "send one row of features per example")
        return value


@dataclasses.dataclass(frozen=True)
class Method:
    """A method of the model served as a predict signature with one output."""

    signature: str
    output: str
    dtype: np.dtype[Any]  # strings: object holding bytes
    shape: tuple[int, ...] | None
    fn: Function


@dataclasses.dataclass(frozen=True)
class Classes:
    """What ``classify`` needs of a classifier: its class labels, and its probabilities when it has them."""

    labels: Sequence[Any]
    probabilities: Function | None  # rows → [n, len(labels)] in the order of ``labels``
    predict: Function  # rows → one label per row (classify without probabilities answers that one class)


@dataclasses.dataclass(frozen=True)
class TabularModel:
    """A loaded model, as the platform module describes it."""

    matrix: Matrix
    methods: Sequence[Method]
    classes: Classes | None = None  # classifiers
    regress: Function | None = None  # regressors: rows → one number per row
    # The fitted model object itself (an estimator, an XGBoost wrapper, a LightGBM Booster): what explainers read
    # the trees or coefficients of (workbench.explain); None where the platform keeps none.
    source: Any = None


# --------------------------------------------------------------------------------------------- signatures
def label_dtype(labels: Sequence[Any] | np.ndarray) -> np.dtype[Any]:
    """The dtype predict answers class labels in: the labels' own numbers, strings as bytes (TF Serving's)."""
    dtype = np.asarray(labels).dtype
    return np.dtype(object) if dtype.kind in "OSU" else dtype


def signatures(model: TabularModel) -> dict[str, Signature]:
    matrix = model.matrix
    found: dict[str, Signature] = {}
    for method in model.methods:
        output = TensorSpec(method.output, method.output, method.dtype, method.shape)
        found[method.signature] = Signature(
            method.signature,
            PREDICT_METHOD,
            {MATRIX: matrix.spec},
            {method.output: output},
            features=matrix.features,
        )
    examples = {EXAMPLES: TensorSpec(EXAMPLES, EXAMPLES, np.dtype(object), (-1,))}
    if model.classes is not None:
        k = len(model.classes.labels) if model.classes.probabilities is not None else 1
        outputs = {CLASSES: TensorSpec(CLASSES, CLASSES, np.dtype(object), (-1, k))}
        if model.classes.probabilities is not None:
            outputs[SCORES] = TensorSpec(SCORES, SCORES, np.dtype(np.float32), (-1, k))
        found[CLASSIFY_SIGNATURE] = Signature(CLASSIFY_SIGNATURE, CLASSIFY_METHOD, examples, outputs, batchable=False)
    if model.regress is not None:
        outputs = {REGRESS_OUTPUTS: TensorSpec(REGRESS_OUTPUTS, REGRESS_OUTPUTS, np.dtype(np.float32), (-1,))}
        found[REGRESS_SIGNATURE] = Signature(REGRESS_SIGNATURE, REGRESS_METHOD, examples, outputs, batchable=False)
    return found


# --------------------------------------------------------------------------------------------- tf.Examples
def examples_to_matrix(serialized: np.ndarray, matrix: Matrix) -> np.ndarray:
    """Serialized ``tf.Example``s as the model's feature matrix, one row per example.

    A model that knows its features' names (``feature_names_in_``, a DataFrame's columns) reads one number per
    feature by that name: ``{"age": 0.03, "bmi": -0.02, ...}``. A model without names reads the whole row from
    one feature, ``x``, holding every feature's value in order: ``{"x": [0.0, 3.0, ...]}`` (the name the predict
    signatures give the matrix, and what ``Client.classify(model, [{"x": row}])`` sends). Values may be a
    ``float_list`` or an ``int64_list``; they are converted to the matrix's dtype. float_list holds 32-bit
    floats, so a model computing in float64 sees its features rounded to float32 through classify and regress.
    """
    from tensorflow.core.example import example_pb2  # protobuf only; imported on the first classify/regress

    rows: list[Sequence[float | int]] = []
    for index, data in enumerate(serialized):
        example = example_pb2.Example()
        try:
            example.ParseFromString(data)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError and its C implementation's variants
            raise invalid_argument(f"Example {index} could not be parsed as a tf.Example") from None
        features = example.features.feature
        if matrix.features:
            rows.append([_one_value(index, features, name) for name in matrix.features])
        else:
            row = _values(index, features, MATRIX)
            if matrix.width is not None and len(row) != matrix.width:
                raise invalid_argument(
                    f'Example {index}: feature "{MATRIX}" has {len(row)} values; this model takes a row of '
                    f"{matrix.width} features"
                )
            rows.append(row)
    try:
        return np.array(rows, dtype=matrix.dtype)
    except ValueError:  # rows of different lengths when the model does not say its width
        raise invalid_argument(f'Every example\'s feature "{MATRIX}" must hold the same number of values') from None


def _values(index: int, features: Any, name: str) -> Sequence[float | int]:
    if name not in features:
        raise invalid_argument(f'Example {index} has no feature "{name}"; {_expected_hint(name)}')
    feature = features[name]
    kind = feature.WhichOneof("kind")
    if kind == "float_list":
        return feature.float_list.value  # type: ignore[no-any-return]
    if kind == "int64_list":
        return feature.int64_list.value  # type: ignore[no-any-return]
    if kind is None:
        return []
    raise invalid_argument(f'Example {index}: feature "{name}" holds bytes; this model takes numbers')


def _one_value(index: int, features: Any, name: str) -> float | int:
    values = _values(index, features, name)
    if len(values) != 1:
        raise invalid_argument(f'Example {index}: feature "{name}" must hold one value, not {len(values)}')
    return values[0]


def _expected_hint(name: str) -> str:
    if name == MATRIX:
        return f'this model has no feature names and reads each row from "{MATRIX}" (a list of every feature value)'
    return "this model reads each feature by name"


# --------------------------------------------------------------------------------------------- running
def as_output(value: Any, dtype: np.dtype[Any]) -> np.ndarray:
    """A method's result as the signature declares it: a dense array of ``dtype``, strings as bytes."""
    if hasattr(value, "toarray"):  # a scipy sparse matrix (a transform's one-hot columns)
        value = value.toarray()
    array = np.asarray(value)
    if dtype.kind == "O":
        return encode_strings(array)
    return array if array.dtype == dtype else array.astype(dtype)


def encode_strings(array: np.ndarray) -> np.ndarray:
    """Any array as an object array of bytes (TF Serving's strings): labels 3 and "cat" become b"3" and b"cat"."""
    out = np.empty(array.shape, dtype=object)
    flat = out.reshape(-1)
    for i, item in enumerate(array.reshape(-1).tolist()):
        flat[i] = item if isinstance(item, bytes) else str(item).encode("utf-8")
    return out


class TabularServable(Servable):
    """A tabular model's signatures, run on its methods.

    The libraries' predict calls are safe from several threads at once (they only read the fitted model).
    """

    def __init__(self, name: str, version: int, path: str, model: TabularModel) -> None:
        self.name, self.version, self.path = name, version, path
        self.model = model
        self.signatures = signatures(model)
        self._methods = {m.signature: m for m in model.methods}
        self._labels = encode_strings(np.asarray(model.classes.labels)) if model.classes is not None else None

    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        try:
            if signature.method_name == CLASSIFY_METHOD:
                result = self._classify(examples_to_matrix(inputs[EXAMPLES], self.model.matrix))
            elif signature.method_name == REGRESS_METHOD:
                result = self._regress(examples_to_matrix(inputs[EXAMPLES], self.model.matrix))
            else:
                method = self._methods[signature.name]
                rows = self.model.matrix.check(inputs[MATRIX])
                result = {method.output: as_output(method.fn(rows), method.dtype)}
        except ServingError:
            raise
        except (ValueError, TypeError) as exc:  # the library refused the rows it was given: the client's input
            raise ServingError(Code.INVALID_ARGUMENT, f"{type(exc).__name__}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - anything else is the model's fault, reported as such
            raise from_exception(exc) from None
        return {alias: result[alias] for alias in outputs}

    def _classify(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        classes = self.model.classes
        assert classes is not None and self._labels is not None
        if classes.probabilities is None:
            predicted = encode_strings(np.asarray(classes.predict(rows)))
            return {CLASSES: predicted.reshape(-1, 1)}
        scores = np.asarray(classes.probabilities(rows), dtype=np.float32)
        return {CLASSES: np.tile(self._labels, (len(rows), 1)), SCORES: scores}

    def _regress(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        assert self.model.regress is not None
        values = np.asarray(self.model.regress(rows))
        if values.ndim == 2 and values.shape[1] == 1:
            values = values[:, 0]
        if values.ndim != 1:
            raise ServingError(
                Code.FAILED_PRECONDITION,
                f"This model predicts {values.shape[1:]} values per example; regress answers one. Use predict",
            )
        return {REGRESS_OUTPUTS: values.astype(np.float32)}


# --------------------------------------------------------------------------------------------- files
def version_config(folder: Path) -> dict[str, Any]:
    """The version folder's ``workbench.json`` (platform-specific keys beside "platform"); {} when absent."""
    try:
        document = json.loads((folder / VERSION_CONFIG).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ServingError(Code.INVALID_ARGUMENT, f"{folder / VERSION_CONFIG} is not valid JSON: {exc}") from None
    return document if isinstance(document, dict) else {}


def write_version_config(folder: Path, platform: str, **keys: Any) -> None:
    (folder / VERSION_CONFIG).write_text(json.dumps({"platform": platform, **keys}, indent=2) + "\n")


def model_file(folder: str | Path, platform: str, names: Sequence[str]) -> Path:
    """The one model file of ``names`` in ``folder``; two of them are refused (which one was meant?)."""
    present = [Path(folder, n) for n in names if Path(folder, n).is_file()]
    if not present:
        raise ServingError(Code.NOT_FOUND, f"No {platform} model in {folder}: expected one of {', '.join(names)}")
    if len(present) > 1:
        raise ServingError(
            Code.FAILED_PRECONDITION,
            f"{folder} holds several {platform} models: {', '.join(p.name for p in present)}. Keep one",
        )
    return present[0]


def refuse_options(platform: str, options: Mapping[str, Any]) -> None:
    if options:
        raise TypeError(f"The {platform} export takes no options; got {', '.join(sorted(options))}")


def module_of(obj: Any) -> str:
    """The top-level package ``obj``'s class comes from, without importing anything."""
    return type(obj).__module__.partition(".")[0]
