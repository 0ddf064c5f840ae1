"""MLServer's built-in runtimes (scikit-learn, XGBoost, LightGBM, CatBoost) on workbench's native tabular path.

A model MLServer serves with ``mlserver_sklearn.SKLearnModel``, ``mlserver_xgboost.XGBoostModel`` or
``mlserver_lightgbm.LightGBMModel`` is loaded here as the native platforms load theirs, and answers as the runtime
answers (checked against MLServer's source, ``runtimes/*``):

- the model file is ``parameters.uri`` (a file, or a folder holding one of the runtime's well-known names:
  ``model.joblib``/``model.pickle``/``model.pkl``, ``model.bst``/``model.json``/``model.ubj``, ``model.bst``,
  ``model.cbm``/``model.bin``);
- one input, under any name (MLServer's ``np`` request codec takes the first and only one), its numbers cast to
  the type the library computes in (FP32 sent to a float64 model, as scikit-learn converts it); ``pd``: each input
  a column, by the model's feature names where it keeps them;
- outputs by method name: scikit-learn ``predict`` (the default, or ``parameters.extra.predict_fn``),
  ``predict_proba``, ``transform``; XGBoost ``predict`` and ``predict_proba``; LightGBM always ``predict``
  (the booster's values: probabilities for a classifier); CatBoost always ``predict`` (a classifier's class labels,
  as ``CatBoostClassifier.predict``). Each output is shaped ``[N, 1]`` for one value per row
  and carries ``"content_type": "np"``, as MLServer's numpy codec encodes it; scikit-learn's and XGBoost's outputs
  take the content type the request asks for them, else the one the settings declare (``str``: MLServer's
  StringCodec, BYTES of the values' text), as their runtimes' ``MLModel.encode`` does;
- XGBoost loads as MLServer loads it: as an ``XGBRegressor`` unless the file is a scikit-learn classifier's, so a
  booster trained with ``xgb.train`` answers ``predict`` with its *probabilities* (binary:logistic, multi:softprob)
  where workbench's own xgboost platform answers classes. ``predict_proba`` answers the classes' probabilities
  (one column per class) for probabilistic objectives, where MLServer refuses it for such a booster.

Every signature is batchable along dimension 0, so ``max_batch_size``/``max_batch_time`` batch it natively.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from workbench.config.mlserver_settings import ModelSettings
from workbench.core.errors import Code, ServingError, from_exception, invalid_argument
from workbench.core.servable import Servable
from workbench.core.signatures import DEFAULT_SIGNATURE, PREDICT_METHOD, Signature, TensorSpec
from workbench.platforms.base import LoadPolicy
from workbench.platforms.tabular import MATRIX, Matrix, as_output
from workbench.protocol import mlserver_codecs
from workbench.protocol.v2_json import InferRequest

SKLEARN = "mlserver_sklearn.SKLearnModel"
XGBOOST = "mlserver_xgboost.XGBoostModel"
LIGHTGBM = "mlserver_lightgbm.LightGBMModel"
CATBOOST = "mlserver_catboost.CatboostModel"
PREDICT, PREDICT_PROBA, TRANSFORM = "predict", "predict_proba", "transform"
PREDICT_FN = "predict_fn"  # parameters.extra's key naming scikit-learn's default output


@dataclasses.dataclass(frozen=True)
class Runtime:
    """What one of MLServer's runtimes serves: its well-known file names, its outputs, and its loader."""

    short_name: str  # as its messages name it: "SKLearnModel"
    files: tuple[str, ...]
    outputs: tuple[str, ...]  # those a request may ask for (empty: the runtime answers "predict" whatever is asked)
    read: Callable[[Path, LoadPolicy], Model]

    @property
    def outputs_by_name(self) -> bool:
        """Whether it answers the outputs asked by name, each encoded by its content type (``MLModel.encode``), as
        scikit-learn's and XGBoost's runtimes do; LightGBM's and CatBoost's always encode with the numpy codec."""
        return bool(self.outputs)


@dataclasses.dataclass(frozen=True)
class Output:
    fn: Callable[[np.ndarray], Any]
    dtype: np.dtype[Any]
    columns: int | None  # values per row (None: unknown until it runs)


@dataclasses.dataclass(frozen=True)
class Model:
    """A loaded model: its matrix, the outputs it has, and what a refused output's message names it by."""

    matrix: Matrix
    outputs: Mapping[str, Output]
    kind: str  # "<class 'sklearn.svm._classes.SVR'>", "XGBRegressor": MLServer's words for the model


# ------------------------------------------------------------------------------------------ the servable
class MLServerServable(Servable):
    """A built-in runtime's model: one signature (``serving_default``) whose outputs are the runtime's."""

    def __init__(self, name: str, version: int, settings: ModelSettings, runtime: Runtime, model: Model) -> None:
        self.name, self.version, self.path = name, version, str(settings.folder)
        self.settings, self.runtime, self.model = settings, runtime, model
        outputs = {
            alias: TensorSpec(alias, alias, out.dtype, (-1, out.columns if out.columns is not None else -1))
            for alias, out in model.outputs.items()
        }
        self.signatures = {
            DEFAULT_SIGNATURE: Signature(
                DEFAULT_SIGNATURE, PREDICT_METHOD, {MATRIX: model.matrix.spec}, outputs, features=model.matrix.features
            )
        }
        self.v2_dialect = MLServerDialect(self)

    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        rows = self.model.matrix.check(inputs[MATRIX])
        answers = {}
        for alias in outputs:
            output = self.model.outputs[alias]
            try:
                value = as_output(output.fn(rows), output.dtype)
            except ServingError:
                raise
            except (ValueError, TypeError) as exc:  # the library refused the rows: the client's input (400)
                raise invalid_argument(f"{type(exc).__name__}: {exc}") from None
            except Exception as exc:  # noqa: BLE001 - anything else is the model's fault
                raise from_exception(exc) from None
            answers[alias] = mlserver_codecs.batch_shaped(value)
        return answers


class MLServerDialect:
    """How a built-in runtime reads v2 requests (see the module's description)."""

    def __init__(self, servable: MLServerServable) -> None:
        self.servable = servable
        self.version_name = servable.settings.version

    def feed(self, request: InferRequest) -> tuple[dict[str, np.ndarray], list[str]]:
        settings = self.servable.settings
        declared = {tensor.name: tensor.content_type for tensor in settings.inputs if tensor.content_type}
        inputs = {
            name: mlserver_codecs.decode_input(name, value, request.content_types.get(name) or declared.get(name, ""))
            for name, value in request.inputs.items()
        }
        content_type = request.parameters.get("content_type") or settings.content_type
        if content_type == mlserver_codecs.PANDAS:
            matrix = self._from_columns(mlserver_codecs.columns(inputs))
        else:
            name, value = mlserver_codecs.single_input(
                inputs, content_type if content_type in mlserver_codecs.REQUEST_CODECS else mlserver_codecs.NUMPY
            )
            matrix = self._cast(name, value)
        return {MATRIX: matrix}, self._outputs([output.name for output in request.outputs])

    def answer(
        self, request: InferRequest, outputs: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], dict[str, dict[str, Any]]]:
        """Each output encoded as MLServer's ``MLModel.encode`` does for the runtimes that answer outputs by name
        (scikit-learn, XGBoost): by the content type the request asks for it, else the one the settings declare for
        it (``outputs[].parameters.content_type``), else numpy; LightGBM and CatBoost always encode with numpy."""
        asked = {output.name: output.content_type for output in request.outputs if output.content_type}
        declared = {t.name: t.content_type for t in self.servable.settings.outputs if t.content_type}
        by_name = self.servable.runtime.outputs_by_name
        answered, parameters = {}, {}
        for name, value in outputs.items():
            content_type = (asked.get(name) or declared.get(name, "")) if by_name else ""
            answered[name], parameters[name] = mlserver_codecs.encode_output(value, content_type)
        return answered, parameters

    # ------------------------------------------------------------------------------------------- inputs
    def _cast(self, name: str, value: np.ndarray) -> np.ndarray:
        """The input as the model's matrix type: numbers converted (as the library converts what it is given),
        anything else refused naming the input."""
        dtype = self.servable.model.matrix.dtype
        if value.dtype == dtype:
            return value
        if value.dtype.kind in "biuf":
            return value.astype(dtype)
        if value.dtype.kind in "OSU":
            try:
                return np.asarray(value.tolist(), dtype=dtype)  # "1.5" → 1.5, as numpy converts text for sklearn
            except (ValueError, TypeError):
                pass
        raise invalid_argument(
            f"Input '{name}' holds {value.dtype.name} values that are not numbers; model {self.servable.name} takes a "
            f"matrix of {dtype.name} (one row of {self.servable.model.matrix.width or 'its'} features per example)"
        )

    def _from_columns(self, columns: dict[str, np.ndarray]) -> np.ndarray:
        """A ``pd`` request's columns as the matrix: in the order of the model's feature names where it keeps them
        (a DataFrame reaches it with those columns), else in the order sent."""
        features = self.servable.model.matrix.features
        if features:
            missing = [f for f in features if f not in columns]
            unknown = [c for c in columns if c not in features]
            if missing or unknown:
                raise mlserver_codecs.codec_error(
                    f"the model's features are {', '.join(features)}; missing: {', '.join(missing) or 'none'}, "
                    f"unknown: {', '.join(unknown) or 'none'}"
                )
            order: Sequence[str] = features
        else:
            order = list(columns)
        return np.stack([self._cast(name, columns[name]) for name in order], axis=1)

    # ------------------------------------------------------------------------------------------ outputs
    def _outputs(self, asked: list[str]) -> list[str]:
        runtime, model = self.servable.runtime, self.servable.model
        if not runtime.outputs:  # LightGBM answers its one output whatever was asked
            return [PREDICT]
        if not asked:
            default = self.servable.settings.extra.get(PREDICT_FN) if runtime.short_name == "SKLearnModel" else None
            asked = [default if isinstance(default, str) and default else PREDICT]
        for name in asked:
            if name not in runtime.outputs:
                listed = [f"'{o}'" for o in runtime.outputs]
                names = " and ".join(listed) if len(listed) == 2 else f"{', '.join(listed[:-1])} and {listed[-1]}"
                raise invalid_argument(f"{runtime.short_name} only supports {names} as outputs ({name} was received)")
            if name not in model.outputs:
                raise invalid_argument(f"{model.kind} models do not support '{name}")  # sic: MLServer's quote
        return list(dict.fromkeys(asked))


# ------------------------------------------------------------------------------------------ loading
def load_builtin(name: str, version: int, settings: ModelSettings, policy: LoadPolicy) -> MLServerServable:
    runtime = RUNTIMES[settings.implementation]
    file = model_file(settings, runtime.files)
    return MLServerServable(name, version, settings, runtime, runtime.read(file, policy))


def model_file(settings: ModelSettings, wellknown: Sequence[str]) -> Path:
    """MLServer's ``get_model_uri``: the uri's file, or the first well-known file in the uri's folder."""
    uri = settings.model_uri
    if "://" in uri:
        raise ServingError(Code.UNIMPLEMENTED, f"Model {settings.name}: uri {uri} is not a local path")
    if os.path.isfile(uri):
        return Path(uri)
    if os.path.isdir(uri):
        for name in wellknown:
            if os.path.isfile(os.path.join(uri, name)):
                return Path(uri, name)
        raise ServingError(
            Code.NOT_FOUND,
            f"Invalid URI specified for model {settings.name} ({uri}): no {', '.join(wellknown)} in that folder",
        )
    raise ServingError(Code.NOT_FOUND, f"Invalid URI specified for model {settings.name} ({uri})")


def _read_sklearn(file: Path, policy: LoadPolicy) -> Model:
    from workbench.platforms import sklearn

    estimator = sklearn.read_estimator(file, policy)
    described = sklearn.describe(estimator)  # a DataFrame-fit estimator is handed its columns by name there
    outputs = {
        method: Output(m.fn, m.dtype, _columns(m.shape))
        for m in described.methods
        for method, alias in sklearn.OUTPUTS.items()
        if alias == m.output and method in (PREDICT, PREDICT_PROBA, TRANSFORM)
    }
    final = estimator.steps[-1][-1] if hasattr(estimator, "steps") else estimator  # a Pipeline's last step
    return Model(described.matrix, outputs, str(type(final)))


def _read_xgboost(file: Path, policy: LoadPolicy) -> Model:
    import xgboost

    from workbench.platforms.xgboost import PROBABILISTIC, objective

    # MLServer's _load_sklearn_interface: a regressor, unless the file says it is a scikit-learn classifier's.
    try:
        model: Any = xgboost.XGBRegressor(n_jobs=1)
        model.load_model(file)
    except TypeError:
        model = xgboost.XGBClassifier(n_jobs=1)
        model.load_model(file)
    except xgboost.core.XGBoostError as exc:
        raise ServingError(Code.DATA_LOSS, f"Could not read {file}: {str(exc).splitlines()[0]}") from None
    booster = model.get_booster()
    matrix = Matrix(np.dtype(np.float32), booster.num_features(), tuple(booster.feature_names or ()))
    name = objective(booster)
    classifier = isinstance(model, xgboost.XGBClassifier)
    classes = _xgboost_classes(booster) if name in PROBABILISTIC else 0
    predict_columns = 1 if classifier or classes <= 2 else classes
    outputs = {PREDICT: Output(model.predict, np.dtype(np.int64 if classifier else np.float32), predict_columns)}
    if classifier:
        outputs[PREDICT_PROBA] = Output(model.predict_proba, np.dtype(np.float32), classes or None)
    elif name in PROBABILISTIC:
        outputs[PREDICT_PROBA] = Output(_probabilities(model.predict), np.dtype(np.float32), classes)
    return Model(matrix, outputs, type(model).__name__)


def _xgboost_classes(booster: Any) -> int:
    learner = json.loads(booster.save_config())["learner"]
    return max(2, int(learner["learner_model_param"].get("num_class", "0") or 0))


def _probabilities(predict: Callable[[np.ndarray], Any]) -> Callable[[np.ndarray], np.ndarray]:
    """A booster's values as one probability column per class (binary:logistic's one value is the second class)."""

    def probabilities(rows: np.ndarray) -> np.ndarray:
        values = np.asarray(predict(rows))
        return np.vstack((1.0 - values, values)).T if values.ndim == 1 else values

    return probabilities


def _read_lightgbm(file: Path, policy: LoadPolicy) -> Model:
    from workbench.platforms.lightgbm import read_booster

    booster = read_booster(file)
    names = tuple(booster.feature_name())
    if names == tuple(f"Column_{i}" for i in range(len(names))):
        names = ()
    matrix = Matrix(np.dtype(np.float64), booster.num_feature(), names)
    predict = functools.partial(booster.predict, num_threads=1)  # one thread a call: the server runs calls side by side
    columns = booster.num_model_per_iteration()
    return Model(matrix, {PREDICT: Output(predict, np.dtype(np.float64), columns)}, "Booster")


def _read_catboost(file: Path, policy: LoadPolicy) -> Model:
    """MLServer loads any ``.cbm`` as a ``CatBoostClassifier`` and answers its ``predict``: the class labels. A
    regressor's file fails MLServer's predict (the classifier has no classes); here it answers its values."""
    from workbench.platforms.catboost import describe, read_model

    described = describe(read_model(file))
    (predict,) = (m for m in described.methods if m.output == "predictions")
    return Model(described.matrix, {PREDICT: Output(predict.fn, predict.dtype, 1)}, type(described.source).__name__)


def _columns(shape: tuple[int, ...] | None) -> int | None:
    if shape is None:
        return None
    return 1 if len(shape) == 1 else (shape[1] if len(shape) == 2 and shape[1] >= 0 else None)


RUNTIMES: dict[str, Runtime] = {
    SKLEARN: Runtime(
        "SKLearnModel",
        ("model.joblib", "model.pickle", "model.pkl"),
        (PREDICT, PREDICT_PROBA, TRANSFORM),
        _read_sklearn,
    ),
    XGBOOST: Runtime("XGBoostModel", ("model.bst", "model.json", "model.ubj"), (PREDICT, PREDICT_PROBA), _read_xgboost),
    LIGHTGBM: Runtime("LightGBMModel", ("model.bst",), (), _read_lightgbm),
    CATBOOST: Runtime("CatboostModel", ("model.cbm", "model.bin"), (), _read_catboost),
}
