"""MLflow's URIs as model base paths, its client, and downloads of its artifacts.

A model's base path may name MLflow instead of a folder:

- ``models:/<name>``: every version of a registered model (the model's version policy picks which serve);
- ``models:/<name>/<version>``: that version alone; ``models:/<name>@<alias>``: the version the alias points at,
  followed when the alias moves;
- ``models:/m-<model_id>``: MLflow 3's logged model of that id (MLflow names logged models ``m-`` and 32 hex
  digits, and resolves such a URI to the model's artifact location), served as version 1;
- ``runs:/<run_id>/<path>``, ``mlflow-artifacts:/<path>``: one logged model, served as version 1.

The tracking server is ``--mlflow_tracking_uri``, else MLflow's own choice (``MLFLOW_TRACKING_URI``, else its default:
MLflow 3's is ``sqlite:///mlflow.db`` in the working folder, a notebook's own store). MLflow is imported only here,
and only once a base path names it: a server that serves no MLflow model never pays for its import.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from pathlib import Path
from typing import Any

REGISTERED = "models:/"
RUNS = "runs:/"
ARTIFACTS = "mlflow-artifacts:"
SCHEMES = (REGISTERED, RUNS, ARTIFACTS)
# An MLflow 3 logged model's id, as its stores make it: "m-" and a uuid4's 32 hex digits.
LOGGED_MODEL_ID = re.compile(r"m-[0-9a-f]{32}")


def is_mlflow_uri(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names MLflow (``models:/``, ``runs:/``, ``mlflow-artifacts:``) rather than a folder or store."""
    return str(path).startswith(SCHEMES)


@dataclasses.dataclass(frozen=True)
class MlflowSource:
    """What a base path names in MLflow: a registered model (all its versions, one, or an alias's) or one artifact."""

    uri: str
    name: str = ""  # the registered model's ("" for runs:/ and artifact URIs)
    version: int | None = None  # models:/<name>/<version>
    alias: str = ""  # models:/<name>@<alias>
    model_id: str = ""  # models:/m-<id>: an MLflow 3 logged model

    @property
    def registered(self) -> bool:
        """A registered model's versions are the workbench versions (same numbers), its aliases the routing."""
        return bool(self.name) and self.version is None and not self.alias

    def version_uri(self, version: int) -> str:
        """Where one registry version's artifacts are (MLflow resolves it to the version's source when downloading)."""
        return f"{REGISTERED}{self.name}/{version}"


def parse(uri: str) -> MlflowSource:
    """The source ``uri`` names; a malformed one raises ValueError saying what a model URI looks like."""
    if uri.startswith(REGISTERED):
        rest = uri[len(REGISTERED) :].strip("/")
        if "/" in rest:
            name, _, version = rest.partition("/")
            if not version.isascii() or not version.isdigit():
                raise ValueError(
                    f"{uri}: models:/<name>/<version> takes a version number, not {version!r} (MLflow's stages are "
                    "deprecated: use an alias, models:/<name>@<alias>)"
                )
            source = MlflowSource(uri, name=name, version=int(version))
        elif "@" in rest:
            name, _, alias = rest.partition("@")
            source = MlflowSource(uri, name=name, alias=alias)
            if not alias:
                raise ValueError(f"{uri}: models:/<name>@<alias> names no alias")
        elif LOGGED_MODEL_ID.fullmatch(rest):
            return MlflowSource(uri, model_id=rest)
        else:
            source = MlflowSource(uri, name=rest)
        if not source.name:
            raise ValueError(
                f"{uri}: a registered model URI is models:/<name>, models:/<name>/<version> or models:/<name>@<alias>"
            )
        return source
    if uri.startswith(RUNS):
        run_id, _, path = uri[len(RUNS) :].strip("/").partition("/")
        if not run_id:
            raise ValueError(f"{uri}: a run's model is runs:/<run_id>/<path>")
        return MlflowSource(uri)
    if uri.startswith(ARTIFACTS):
        return MlflowSource(uri)
    raise ValueError(f"{uri} is no MLflow URI (models:/, runs:/ or mlflow-artifacts:)")


def client(tracking_uri: str = "") -> Any:
    """An ``MlflowClient`` of ``tracking_uri`` ("": MLflow's own choice); its registry is the tracking server's unless
    ``MLFLOW_REGISTRY_URI`` says otherwise, as in MLflow."""
    from mlflow import MlflowClient  # imported here: only servers of MLflow models pay for it

    return MlflowClient(tracking_uri=tracking_uri or None, registry_uri=registry_uri(tracking_uri))


def registry_uri(tracking_uri: str) -> str | None:
    """The registry of ``tracking_uri``: ``MLFLOW_REGISTRY_URI``, else the tracking server itself (None: MLflow's own
    choice). Given explicitly: MLflow's downloads otherwise ask the process-wide registry, not the tracking URI."""
    return os.environ.get("MLFLOW_REGISTRY_URI") or tracking_uri or None


def artifact_location(uri: str, mlflow_client: Any) -> str:
    """Where the artifacts of ``uri`` are, asked of ``mlflow_client``'s servers.

    MLflow's own download of a ``models:/`` or ``runs:/`` URI asks the process-wide tracking and registry URIs, not
    the ones it is given, so a server with ``--mlflow_tracking_uri`` (maybe in a notebook's process, whose own MLflow
    must not be redirected) resolves them with its client first: a logged model's id to its artifact location, a
    registry version to its download URI, a run's
    ``<path>`` to the logged model of that name (MLflow 3 keeps a model's artifacts apart from its run's), else to
    the run's artifacts.
    """
    if uri.startswith(REGISTERED):
        source = parse(uri)
        if source.model_id:  # MLflow 3's logged model: its own artifact location, as MLflow resolves it
            return str(mlflow_client.get_logged_model(source.model_id).artifact_location)
        if source.version is not None:
            return str(mlflow_client.get_model_version_download_uri(source.name, str(source.version)))
        return uri
    if uri.startswith(RUNS):
        run_id, _, path = uri[len(RUNS) :].strip("/").partition("/")
        run = mlflow_client.get_run(run_id)
        search = getattr(mlflow_client, "search_logged_models", None)  # MLflow 3's logged models
        if search is not None and path and "/" not in path:
            models = search(experiment_ids=[run.info.experiment_id], filter_string=f"source_run_id = '{run_id}'")
            for model in models:
                if model.name == path:
                    return str(model.artifact_location)
        return f"{run.info.artifact_uri.rstrip('/')}/{path}" if path else str(run.info.artifact_uri)
    return uri


def download(uri: str, destination: Path, tracking_uri: str = "") -> None:
    """Download the artifacts ``uri`` names into the new folder ``destination`` (its files directly in it).

    MLflow puts the files of the folder a URI names in a sub-folder of that name of the folder it is given (a
    registry version's files directly in it); either way they end up directly in ``destination``, which the caller
    renames into place when complete.
    """
    from mlflow.artifacts import download_artifacts

    location = artifact_location(uri, client(tracking_uri))
    staging = destination.with_name(destination.name + ".mlflow")
    staging.mkdir(parents=True)
    try:
        local = Path(
            download_artifacts(
                artifact_uri=location,
                dst_path=str(staging),
                tracking_uri=tracking_uri or None,
                registry_uri=registry_uri(tracking_uri),
            )
        )
        if not local.is_dir():  # an artifact URI naming one file: the version folder holds it
            destination.mkdir()
            os.replace(local, destination / local.name)
        else:
            os.replace(local, destination)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
