"""The MLflow platform: a version folder holding an MLflow model (its ``MLmodel`` file).

A flavor workbench runs natively is loaded by workbench's own platform for it, from the flavor's files, with no
pyfunc layer per call: ``sklearn`` (``model.skops``, or the pickle ``model.pkl`` where the server allows pickles, as
the scikit-learn platform requires), ``xgboost`` (``model.ubj``, ``model.json``), ``onnx`` (``model.onnx``) and a
LightGBM ``Booster`` of the ``lightgbm`` flavor (``model.lgb``); a logged booster (XGBoost's or LightGBM's) answers
its own ``predict``, as MLflow's pyfunc does (:mod:`workbench.platforms.mlflow_boosters`). Any
other model loads through its ``python_function`` flavor (``mlflow.pyfunc.load_model``), which runs the model's
Python and so loads only where the server runs Python models (a custom ``PythonModel``, PyTorch's and Keras' flavors).

The MLflow signature is ``serving_default``'s (:mod:`workbench.platforms.mlflow_model`): one input per column of a
column-based signature, one per tensor of a tensor-based one, and one per param, which a pyfunc model's
``predict(model_input, params=...)`` is given. A natively loaded model keeps its platform's other signatures
(``predict_proba``, ``classify``...). The model's input example (``serving_input_example.json``) runs once before the
version is AVAILABLE, as a warmup request; packages that differ from those the model was logged with are logged as a
warning and kept on the servable (:attr:`MlflowServable.environment_mismatches`, and its ``load_warnings``, which the
version's status shows), never installed.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from workbench.core import inference
from workbench.core.errors import Code, ServingError, from_exception
from workbench.core.servable import Servable
from workbench.core.signatures import DEFAULT_SIGNATURE, Signature, TensorSpec
from workbench.platforms._user_code import require_python
from workbench.platforms.base import LoadPolicy
from workbench.platforms.mlflow_model import (
    UNNAMED_OUTPUT,
    MlflowModel,
    MlflowSignature,
    aliases,
    environment_mismatches,
    read_mlmodel,
    serving_signature,
)
from workbench.platforms.tabular import MATRIX, encode_strings
from workbench.protocol.mlflow_scoring import MlflowError
from workbench.runtime.tensorflow_runtime import import_all_of_tensorflow

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class NativeFlavor:
    """A flavor loaded natively: ``loader`` ("module:function") loads the version's folder where the flavor's
    ``setting`` names one of ``files``, and, with ``model_class``, only a model of that class (``MLmodel``'s
    ``model_class``): a booster answers its own predict where MLflow's scikit-learn wrappers answer classes."""

    flavor: str
    setting: str
    files: tuple[str, ...]
    loader: str
    model_class: str | None = None


# The first entry that fits a model loads it; a model none fits loads as a pyfunc. LightGBM's scikit-learn wrappers
# (model.skops, or a pickle) stay pyfunc: workbench's scikit-learn platform does not trust LightGBM's types.
NATIVE_FLAVORS: tuple[NativeFlavor, ...] = (
    NativeFlavor("sklearn", "pickled_model", ("model.skops", "model.pkl"), "workbench.platforms.sklearn:load"),
    NativeFlavor(
        "xgboost",
        "data",
        ("model.ubj", "model.json"),
        "workbench.platforms.mlflow_boosters:load_xgboost",
        "xgboost.core.Booster",
    ),
    NativeFlavor("xgboost", "data", ("model.ubj", "model.json"), "workbench.platforms.xgboost:load"),
    NativeFlavor(
        "lightgbm",
        "data",
        ("model.lgb",),
        "workbench.platforms.mlflow_boosters:load_lightgbm",
        "lightgbm.basic.Booster",
    ),
    NativeFlavor("onnx", "data", ("model.onnx",), "workbench.platforms.onnx:load"),
)
PYFUNC = "python_function"

# The function serving_default runs: its inputs by alias → its outputs by alias.
Serve = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


class MlflowServable(Servable):
    """An MLflow model: ``serving_default`` runs ``serve``; the other signatures are the native servable's."""

    def __init__(
        self,
        name: str,
        version: int,
        path: str,
        flavor: str,
        serving: Signature,
        serve: Serve,
        native: Servable | None = None,
        environment: Sequence[str] = (),
    ) -> None:
        self.name, self.version, self.path = name, version, path
        self.flavor = flavor  # the flavor that serves: "sklearn", ..., or "python_function"
        self.environment_mismatches = tuple(environment)
        self.load_warnings = tuple(f"environment mismatch (not installed): {m}" for m in environment)
        self.signatures = {**(native.signatures if native is not None else {}), DEFAULT_SIGNATURE: serving}
        self._serving = serving
        self._serve = serve
        self._native = native

    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        if signature is not self._serving and self._native is not None:
            return self._native.run(signature, inputs, outputs)
        result = self._serve(inputs)
        return {alias: result[alias] for alias in outputs}

    def close(self) -> None:
        if self._native is not None:
            self._native.close()


def load(name: str, version: int, path: str, policy: LoadPolicy) -> Servable:
    model = read_mlmodel(path)
    mismatches = environment_mismatches(path)
    if mismatches:
        log.warning(
            "Model %s version %d was logged with packages that differ from this server's (not installed; its "
            "answers may differ from MLflow's where they matter): %s",
            name,
            version,
            "; ".join(mismatches),
        )
    servable = _native(name, version, path, policy, model, mismatches)
    if servable is None:
        servable = _pyfunc(name, version, path, policy, model, mismatches)
    try:
        _warm_up(servable, model)
    except BaseException:
        servable.close()
        raise
    return servable


# --------------------------------------------------------------------------------------------- native flavors
def _native(
    name: str, version: int, path: str, policy: LoadPolicy, model: MlflowModel, mismatches: Sequence[str]
) -> MlflowServable | None:
    """The model through workbench's own platform for its flavor, where its files are ones that platform reads and
    its signature can be fed to the platform's; None where not (it then loads as a pyfunc)."""
    for entry in NATIVE_FLAVORS:
        settings = model.flavors.get(entry.flavor)
        if settings is None or str(settings.get(entry.setting, "")) not in entry.files:
            continue
        if entry.model_class is not None and settings.get("model_class") != entry.model_class:
            continue
        module_name, _, function = entry.loader.partition(":")
        native: Servable = getattr(importlib.import_module(module_name), function)(name, version, path, policy)
        try:
            adapted = _adapt(native, model.signature)
        except BaseException:
            native.close()
            raise
        if adapted is None:
            native.close()
            return None
        serving, serve = adapted
        return MlflowServable(name, version, path, entry.flavor, serving, serve, native, mismatches)
    return None


def _adapt(native: Servable, signature: MlflowSignature | None) -> tuple[Signature, Serve] | None:
    """``serving_default`` from the MLflow signature, run by the native one; None where one cannot feed the other."""
    own = native.signatures[DEFAULT_SIGNATURE]
    if signature is None or not signature.inputs:
        return own, lambda inputs: native.run(own, inputs, list(own.outputs))
    if signature.params:
        return None  # params are a pyfunc's
    outer = serving_signature(MlflowSignature(signature.inputs, (), (), signature.columns, False), dict(own.outputs))
    outputs = list(own.outputs)
    if len(own.inputs) == 1:
        ((alias, spec),) = own.inputs.items()
        if len(outer.inputs) == 1:  # one tensor (or one column) is the model's one input
            ((outer_alias, _),) = outer.inputs.items()
            return outer, lambda inputs: native.run(own, {alias: _as(inputs[outer_alias], spec)}, outputs)
        if alias == MATRIX and all(s.dtype.kind in "biuf" for s in outer.inputs.values()):
            # Columns of numbers are the tabular model's matrix: in the order of its own feature names where it
            # keeps them (a model fit on a DataFrame), else in the signature's.
            order = list(own.features) if set(own.features) == set(outer.inputs) else list(outer.inputs)

            def stacked(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
                matrix = np.stack([np.asarray(inputs[c]).reshape(-1) for c in order], axis=1).astype(spec.dtype)
                return native.run(own, {alias: matrix}, outputs)

            return outer, stacked
        return None
    if set(outer.inputs) == set(own.inputs):  # named tensors that are the model's own inputs (ONNX's)
        return outer, lambda inputs: native.run(own, {a: _as(inputs[a], own.inputs[a]) for a in own.inputs}, outputs)
    return None


def _as(value: np.ndarray, spec: TensorSpec) -> np.ndarray:
    return value if value.dtype == spec.dtype or spec.dtype.kind == "O" else value.astype(spec.dtype)


# --------------------------------------------------------------------------------------------- python_function
def _pyfunc(
    name: str, version: int, path: str, policy: LoadPolicy, model: MlflowModel, mismatches: Sequence[str]
) -> MlflowServable:
    if PYFUNC not in model.flavors:
        native = ", ".join(dict.fromkeys(entry.flavor for entry in NATIVE_FLAVORS))
        raise ServingError(
            Code.FAILED_PRECONDITION,
            f"{Path(path) / 'MLmodel'} has neither a python_function flavor nor one workbench serves natively "
            f"({native} in their files); its flavors: {', '.join(model.flavors)}",
        )
    require_python(policy, Path(path) / "MLmodel")
    signature = model.signature
    if signature is None or not signature.inputs:
        raise ServingError(
            Code.FAILED_PRECONDITION,
            f"{Path(path) / 'MLmodel'} has no signature, so workbench cannot tell what its requests hold: log the "
            "model with a signature (signature=infer_signature(...)) or an input_example",
        )
    try:
        import mlflow.pyfunc
    except ImportError:
        raise ServingError(
            Code.FAILED_PRECONDITION,
            "The MLflow platform needs mlflow to load a python_function model; install it with: "
            "pip install 'workbench-serving[mlflow]'",
        ) from None
    import_all_of_tensorflow()  # the model's code may `import keras` first (its Keras flavor does)
    try:
        pyfunc = mlflow.pyfunc.load_model(path)
    except Exception as exc:  # noqa: BLE001 - the model's own code failed to load
        raise ServingError(
            Code.FAILED_PRECONDITION, f"mlflow.pyfunc.load_model({path}) failed: {type(exc).__name__}: {exc}"
        ) from None
    declared = {UNNAMED_OUTPUT: TensorSpec(UNNAMED_OUTPUT, UNNAMED_OUTPUT, np.dtype(object), None)}
    serving = serving_signature(signature, declared)
    return MlflowServable(
        name, version, path, PYFUNC, serving, _pyfunc_serve(pyfunc, signature, serving), None, mismatches
    )


def _pyfunc_serve(pyfunc: Any, signature: MlflowSignature, serving: Signature) -> Serve:
    data_aliases = aliases(signature.inputs, "inputs")
    names = [c.name or alias for c, alias in zip(signature.inputs, data_aliases, strict=True)]
    output_aliases = list(serving.outputs)
    param_names = [p.name for p in signature.params]

    def serve(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        model_input = _model_input(signature, data_aliases, names, inputs)
        try:
            if param_names:
                params = {p: _param(inputs[p]) for p in param_names if p in inputs}
                raw = pyfunc.predict(model_input, params=params)
            else:
                raw = pyfunc.predict(model_input)
        except Exception as exc:  # noqa: BLE001 - MLflow's schema checks and the model's own refusals
            raise _model_error(exc) from None
        return _outputs(raw, output_aliases)

    return serve


def _model_input(
    signature: MlflowSignature, data_aliases: Sequence[str], names: Sequence[str], inputs: Mapping[str, np.ndarray]
) -> Any:
    """What MLflow hands the model: a DataFrame for a column-based signature, else the tensor or named tensors."""
    if signature.columns:
        import pandas as pd

        return pd.DataFrame({name: _texts(inputs[alias]) for name, alias in zip(names, data_aliases, strict=True)})
    if len(data_aliases) == 1 and not signature.inputs[0].name:
        return _texts(inputs[data_aliases[0]])
    return {name: _texts(inputs[alias]) for name, alias in zip(names, data_aliases, strict=True)}


def _texts(value: np.ndarray) -> np.ndarray:
    """workbench's strings (bytes) as MLflow's (str)."""
    if value.dtype.kind != "O":
        return value
    return np.vectorize(lambda v: v.decode("utf-8") if isinstance(v, bytes) else v, otypes=[object])(value)


def _param(value: np.ndarray) -> Any:
    value = _texts(value)
    return value.item() if value.ndim == 0 else value.tolist()


def _outputs(raw: Any, output_aliases: Sequence[str]) -> dict[str, np.ndarray]:
    """The model's answer by output alias: a DataFrame's columns, a dict's entries, else the one output."""
    import pandas as pd

    if isinstance(raw, pd.DataFrame):
        if len(output_aliases) == 1 and len(raw.columns) == 1 and str(raw.columns[0]) not in output_aliases:
            found = {output_aliases[0]: raw.iloc[:, 0].to_numpy()}
        elif len(output_aliases) == 1 and output_aliases[0] not in {str(c) for c in raw.columns}:
            found = {output_aliases[0]: raw.to_numpy()}
        else:
            found = {str(c): raw[c].to_numpy() for c in raw.columns}
    elif isinstance(raw, pd.Series):
        found = {output_aliases[0]: raw.to_numpy()}
    elif isinstance(raw, dict):
        found = {str(k): np.asarray(v) for k, v in raw.items()}
    else:
        found = {output_aliases[0]: np.asarray(raw)}
    missing = [a for a in output_aliases if a not in found]
    if missing:
        raise ServingError(
            Code.INTERNAL,
            f"The model answered {', '.join(found)}, but its signature declares the outputs "
            f"{', '.join(output_aliases)}",
        )
    return {alias: _output(found[alias]) for alias in output_aliases}


def _output(value: np.ndarray) -> np.ndarray:
    return encode_strings(value) if value.dtype.kind in "OSU" else value


def _model_error(exc: Exception) -> ServingError:
    """MLflow refuses what does not fit the signature (an MlflowException, BAD_REQUEST); a model raising on its
    input is the request's fault too in MLflow's server (400), and so here."""
    message = getattr(exc, "message", None) or str(exc)
    error_code = getattr(exc, "error_code", None)  # an MlflowException's: MLflow's answer names it
    if isinstance(error_code, str) and error_code:
        return MlflowError(Code.INVALID_ARGUMENT, message, error_code)
    if isinstance(exc, (ValueError, TypeError, KeyError)):
        return ServingError(Code.INVALID_ARGUMENT, f"{type(exc).__name__}: {message}")
    return from_exception(exc)


# --------------------------------------------------------------------------------------------- warmup
def _warm_up(servable: MlflowServable, model: MlflowModel) -> None:
    """The model's input example, run once as a request would run (TF Serving's warmup): a model that cannot
    answer its own example fails its load, and the versions already serving stay."""
    file = model.input_example_file
    if file is None:
        return
    from workbench.protocol.mlflow_scoring import read_json, request_inputs

    try:
        signature = servable.signatures[DEFAULT_SIGNATURE]
        inputs = request_inputs(read_json(file.read_bytes()), signature)
        inference.predict(servable, signature, inputs, [])
    except ServingError as exc:
        message = f"Warmup request ({file.name}, the model's input example) failed: {exc.message}"
        raise ServingError(exc.code, message) from None
