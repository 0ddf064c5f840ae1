"""Export to MLflow's model registry: ``export(model, "wine", registry="mlflow")`` logs the model and registers it.

The model is logged with MLflow's flavor for its framework (:data:`FLAVORS`), in the active run or a run of its own,
with the input example the user gives (``examples``) and the signature MLflow infers from it. It is then checked as
the export to a folder is: downloaded, loaded as a server of ``models:/<name>`` will load it, and its examples run.
Only then is it registered as the next version of the registered model ``name``, so a server polling the registry
never sees a version that fails its check (what failed stays a logged model of the run, registered nowhere).

The tracking server is MLflow's own choice, as for every fluent MLflow call: ``mlflow.set_tracking_uri``, else
``MLFLOW_TRACKING_URI``, else MLflow's default (MLflow 3: ``sqlite:///mlflow.db`` in the working folder). MLflow is
imported only here, when an export names it.
"""

from __future__ import annotations

import contextlib
import importlib
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from workbench.publishing.check import write_warmup_and_verify
from workbench.publishing.export_errors import ExportError, one_line

__all__ = ["FLAVORS", "REGISTRIES", "flavor_of", "log_and_register"]

REGISTRIES = ("mlflow",)

# The top-level package of a class the model is (its own class first, then its bases) → MLflow's flavor module and
# the distributions its requirements pin. An XGBoost or LightGBM estimator is a scikit-learn estimator too: its own
# class comes first, so it gets its own flavor. Pins are given for the flavors whose package alone serves the model
# (MLflow otherwise loads the model in a child process to find its imports: seconds, on a busy machine tens);
# the others' requirements MLflow infers.
FLAVORS: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "xgboost": ("mlflow.xgboost", ("xgboost",)),
    "lightgbm": ("mlflow.lightgbm", ("lightgbm",)),
    "sklearn": ("mlflow.sklearn", ("scikit-learn",)),
    "onnx": ("mlflow.onnx", ("onnx", "onnxruntime")),
    "torch": ("mlflow.pytorch", None),
    "keras": ("mlflow.keras", None),
    "mlflow": ("mlflow.pyfunc", None),  # an mlflow.pyfunc.PythonModel
}
_ARTIFACT_NAME = "model"


def flavor_of(model: Any) -> tuple[str, tuple[str, ...] | None]:
    """The MLflow flavor module that logs ``model`` (``mlflow.sklearn``...) and the distributions to pin;
    ExportError for a model none takes."""
    for cls in type(model).__mro__:
        package = cls.__module__.partition(".")[0]
        if package in FLAVORS:
            return FLAVORS[package]
    raise ExportError(
        f"MLflow's registry takes scikit-learn, XGBoost, LightGBM, ONNX, PyTorch and Keras models and "
        f"mlflow.pyfunc.PythonModel instances; {type(model).__module__}.{type(model).__qualname__} is none of these"
    )


def log_and_register(
    model: Any, name: str, examples: Any, options: Mapping[str, Any]
) -> tuple[int, str, dict[str, str]]:
    """Log ``model``, check it, register it as the next version of ``name``; returns the version's number, its
    model URI (``models:/<name>/<version>``) and its signatures as the check described them.

    ``options`` are ``workbench.export``'s keywords that a registry export cannot honour (a version number is the
    registry's to give; signatures, formats, backgrounds and references are a model folder's): any given is refused.
    """
    given = sorted(option for option, value in options.items() if value is not None)
    if given:
        raise ExportError(f"An export to MLflow's registry takes no {', '.join(given)} (MLflow numbers the versions)")
    import mlflow

    module, pins = flavor_of(model)
    flavor = importlib.import_module(module)
    keywords: dict[str, Any] = {"name": _ARTIFACT_NAME, "input_example": input_example(examples)}
    if pins is not None:
        keywords["pip_requirements"] = [_pin(distribution) for distribution in pins]
    if module == "mlflow.sklearn":
        keywords["skops_trusted_types"] = skops_types(model)
    try:
        with _run(mlflow):
            if module == "mlflow.pyfunc":
                info = flavor.log_model(python_model=model, **keywords)
            else:
                info = flavor.log_model(model, **keywords)
    except ExportError:
        raise
    except Exception as exc:
        raise ExportError(f"MLflow could not log {name!r}: {one_line(exc)}") from exc
    described = _check(name, info.model_uri, examples)
    try:
        version = mlflow.register_model(info.model_uri, name)
    except Exception as exc:
        raise ExportError(f"MLflow could not register {name!r}: {one_line(exc)}") from exc
    number = int(version.version)
    return number, f"models:/{name}/{number}", described


def input_example(examples: Any) -> Any:
    """What MLflow logs as the input example (and infers the signature from): the first request of ``examples``."""
    if examples is None:
        raise ExportError(
            "An export to MLflow's registry needs examples=: MLflow infers the model's signature from them, "
            "and a server needs the signature"
        )
    if isinstance(examples, list | tuple) and examples and isinstance(examples[0], Mapping):
        examples = examples[0]  # one request of several: the first is the example
    if isinstance(examples, Mapping):
        return {str(alias): np.asarray(batch) for alias, batch in examples.items()}
    if hasattr(examples, "iloc") or hasattr(examples, "to_numpy"):  # a DataFrame keeps its columns' names
        return examples
    return np.asarray(examples)


def skops_types(model: Any) -> list[str]:
    """The types of ``model`` that skops does not trust itself but a server does (:mod:`workbench.platforms.
    sklearn_trust`: a fitted tree's ``Tree``...), which MLflow's skops format must be told to trust when it saves.
    A type neither trusts stays out: MLflow then refuses the model, as a server without ``--allow_pickle`` would."""
    from workbench.platforms.sklearn import import_skops
    from workbench.platforms.sklearn_trust import is_trusted

    skops_io = import_skops()
    return [name for name in skops_io.get_untrusted_types(data=skops_io.dumps(model)) if is_trusted(name)]


def _pin(distribution: str) -> str:
    try:
        return f"{distribution}=={metadata.version(distribution)}"
    except metadata.PackageNotFoundError:
        return distribution


@contextlib.contextmanager
def _run(mlflow: Any) -> Iterator[None]:
    """The user's active run, else a run of this export's own, ended with it."""
    if mlflow.active_run() is not None:
        yield
        return
    with mlflow.start_run():
        yield


def _check(name: str, model_uri: str, examples: Any) -> dict[str, str]:
    """Download the logged model and check it as a folder export is checked: loaded as the server will, examples run."""
    from mlflow.artifacts import download_artifacts

    staging = Path(tempfile.mkdtemp(prefix="workbench-mlflow-export-"))
    try:
        folder = Path(download_artifacts(artifact_uri=model_uri, dst_path=str(staging)))
        described, _records = write_warmup_and_verify(name, folder, examples)
        return described
    finally:
        shutil.rmtree(staging, ignore_errors=True)
