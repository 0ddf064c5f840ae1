"""The MLServer platform: a version that stands for a ``model-settings.json``, served by the runtime its
``implementation`` names.

The version folders are written by :mod:`workbench.platforms.mlserver_repository` (their ``workbench.json`` names
the settings file). At load the settings are read again and the ``implementation`` chooses:

- MLServer's built-in runtimes (``mlserver_sklearn.SKLearnModel``, ``mlserver_xgboost.XGBoostModel``,
  ``mlserver_lightgbm.LightGBMModel``): workbench's own native platforms with MLServer's semantics
  (:mod:`workbench.platforms.mlserver_builtins`): the numpy path and dynamic batching, no Python runtime per call;
- ``mlserver_mlflow.MLflowRuntime``: the ``mlflow`` platform's loader, on the folder at ``parameters.uri``;
- ``mlserver_huggingface.HuggingFaceRuntime``: a transformers pipeline answering as MLServer's runtime does
  (:mod:`workbench.platforms.mlserver_huggingface`);
- any other class: a custom runtime written against MLServer's ``MLModel``, run by
  ``workbench.platforms.mlserver_runtime`` (``load(name, version, settings_file, policy)``).

A built-in runtime's servable answers v2 clients with the settings' version string (``"v0.1.0"``) as its
``model_version``; the custom runtimes' and MLflow's modules decide their own answers.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from workbench.config.mlserver_settings import (
    IMPLEMENTATION_VARIABLE,
    ModelSettings,
    environment_model_settings,
    read_model_settings,
)
from workbench.core.errors import Code, ServingError
from workbench.core.servable import Servable
from workbench.core.signatures import DEFAULT_SIGNATURE
from workbench.platforms.base import LoadPolicy
from workbench.platforms.mlserver_builtins import RUNTIMES, load_builtin
from workbench.platforms.tabular import version_config
from workbench.protocol import mlserver_codecs
from workbench.protocol.v2_json import InferRequest

MLFLOW_RUNTIME = "mlserver_mlflow.MLflowRuntime"
MLFLOW_PLATFORM = "workbench.platforms.mlflow"
CUSTOM_RUNTIMES = "workbench.platforms.mlserver_runtime"
HUGGINGFACE_RUNTIME = "mlserver_huggingface.HuggingFaceRuntime"
HUGGINGFACE_PLATFORM = "workbench.platforms.mlserver_huggingface"


def load(name: str, version: int, path: str, policy: LoadPolicy) -> Servable:
    settings = settings_of(Path(path))
    implementation = settings.implementation
    if implementation in RUNTIMES:
        return load_builtin(name, version, settings, policy)
    if implementation == MLFLOW_RUNTIME:
        servable = _module(MLFLOW_PLATFORM, implementation, "MLflow models").load(
            name, version, settings.model_uri, policy
        )
        servable.v2_dialect = MLflowDialect(servable, settings.version)  # type: ignore[attr-defined]
    elif implementation == HUGGINGFACE_RUNTIME:
        servable = _module(HUGGINGFACE_PLATFORM, implementation, "Hugging Face models").load(
            name, version, settings, policy
        )
    else:
        servable = _module(CUSTOM_RUNTIMES, implementation, "custom MLServer runtimes").load(
            name, version, settings.source, policy
        )
    return servable


class MLflowDialect:
    """How MLServer's MLflow runtime reads v2 requests: each input a column of the model's signature, numbers cast to
    the column's type (MLServer's DataFrame of FP32 columns meets MLflow's schema, which widens FP32 to FP64), every
    output answered with MLServer's ``np`` content type."""

    def __init__(self, servable: Servable, version_name: str) -> None:
        self.servable = servable
        self.version_name = version_name

    def feed(self, request: InferRequest) -> tuple[dict[str, np.ndarray], list[str]]:
        signature = self.servable.signatures.get(DEFAULT_SIGNATURE)
        specs = signature.inputs if signature is not None else {}
        inputs = {}
        for name, value in request.inputs.items():
            spec = specs.get(name)
            wanted = spec.dtype if spec is not None else value.dtype
            numbers = value.dtype.kind in "biuf" and wanted.kind in "biuf"
            inputs[name] = value.astype(wanted) if numbers and value.dtype != wanted else value
        return inputs, [output.name for output in request.outputs]

    def answer(
        self, request: InferRequest, outputs: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], dict[str, dict[str, Any]]]:
        """MLServer encodes the model's array with its numpy codec whatever content type is asked (its MLflow
        runtime's ``encode_response`` reads none): one output, ``output-1``, [N] as [N, 1]; a dict of columns keeps
        its names."""
        if len(outputs) == 1:
            (value,) = outputs.values()
            outputs = {"output-1": mlserver_codecs.batch_shaped(value)}
        return dict(outputs), {name: mlserver_codecs.output_parameters(value) for name, value in outputs.items()}


def settings_of(folder: Path) -> ModelSettings:
    """The ``model-settings.json`` the version folder stands for (or the environment's model, read again)."""
    config = version_config(folder)
    environment = config.get("environment")
    if isinstance(environment, str) and environment:
        from_environment = environment_model_settings(environment)
        if from_environment is None:
            raise ServingError(
                Code.FAILED_PRECONDITION,
                f"{folder} stands for the model of MLServer's environment variables, and {IMPLEMENTATION_VARIABLE} "
                "is no longer set",
            )
        return from_environment
    source = config.get("settings")
    if not isinstance(source, str) or not source:
        raise ServingError(
            Code.FAILED_PRECONDITION, f'{folder} names no model-settings.json (its workbench.json has no "settings")'
        )
    settings = read_model_settings(source)
    if not settings.implementation:
        raise ServingError(
            Code.INVALID_ARGUMENT,
            f'{settings.source} names no implementation (for example "implementation": '
            f'"mlserver_sklearn.SKLearnModel")',
        )
    return settings


def _module(module: str, implementation: str, what: str) -> ModuleType:
    """The platform module serving ``implementation``; UNIMPLEMENTED naming it where this workbench has none."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if exc.name != module:  # the module is there, and something it needs is not: say that
            raise
        raise ServingError(
            Code.UNIMPLEMENTED,
            f'implementation "{implementation}" is not supported: this workbench does not serve {what} '
            f"({module} is missing). Built-in runtimes served: {', '.join(RUNTIMES)}",
        ) from None
