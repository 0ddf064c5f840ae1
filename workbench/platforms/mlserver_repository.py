"""A folder laid out for MLServer, as a model repository: every ``model-settings.json`` a version of its model.

``mlserver start DIR`` serves each ``model-settings.json`` found at any depth under ``DIR``; several files naming
one model are its versions (``parameters.version``: strings such as ``"v0.1.0"``). workbench's versions are
integers, so each model's files are numbered 1, 2, 3… in the order of their version strings (as
``packaging.version`` orders them, else as text; a file without a version first), and each version string becomes a
version label of its number: ``/v2/models/m/versions/v0.1.0/infer`` is a request for that label, as it is in MLServer.

Each version is a folder under the repository's hidden ``.workbench/mlserver/<model>/<N>/`` holding only
``workbench.json``: the platform (``mlserver``), the settings file it stands for (with its size and mtime, so an edit
changes the version's folder) and its version string. The models'
own files stay where they are; ``workbench.platforms.mlserver`` reads the settings when the version loads. A
model's adaptive batching (``max_batch_size``/``max_batch_time``) is written beside its versions as
``batching_parameters.txt``, where the server reads every model's own batching.

This module reads and writes small files only; what an ``implementation`` runs is ``workbench.platforms.mlserver``'s.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from workbench.config.batching_parameters import BATCHING_FILE_NAME, BatchingParameters
from workbench.config.mlserver_settings import (
    ModelSettings,
    environment_model_serves,
    environment_model_settings,
    find_model_settings,
    read_model_settings,
)
from workbench.config.options import PackagedModel
from workbench.core.errors import ServingError
from workbench.platforms.base import remove_folders_except

log = logging.getLogger(__name__)

PLATFORM = "mlserver"
VERSION_FILE = "workbench.json"  # workbench.platforms' VERSION_CONFIG: the version folder's platform, said
STORE_FOLDER = os.path.join(".workbench", "mlserver")

_lock = threading.Lock()  # discovery runs on the poller and on control-plane threads
_logged: set[str] = set()  # problems already logged, so a poll every second does not repeat them


def repository_models(root: str | os.PathLike[str], is_model_name: Callable[[str], bool]) -> dict[str, PackagedModel]:
    """The models of the ``model-settings.json`` files under ``root``: name → its versions' folder and labels.

    A file that cannot be read, or names a model whose name is not safe in a URL, is logged and skipped, as MLServer
    skips it; the other models serve. Where no file could be read, the environment's model
    (``MLSERVER_MODEL_IMPLEMENTATION``, ``MLSERVER_MODEL_URI``...) is the one model, as in MLServer, unless ``root`` is
    laid out for TF Serving (:func:`~workbench.config.mlserver_settings.environment_model_serves`).
    """
    base = Path(root)
    with _lock:
        by_model: dict[str, list[ModelSettings]] = {}
        for path in find_model_settings(base):
            try:
                settings = read_model_settings(path)
            except ServingError as exc:
                _log_once(f"Model settings {path} are not served: {exc.message}")
                continue
            if not is_model_name(settings.name):
                _log_once(f"{path}: model name {settings.name!r} is not a valid model name; it is not served")
                continue
            by_model.setdefault(settings.name, []).append(settings)
        if not by_model and environment_model_serves(base):
            from_environment = _environment_model(base)
            if from_environment is not None and is_model_name(from_environment.name):
                by_model[from_environment.name] = [from_environment]
        store = base / STORE_FOLDER
        models = {}
        for name, versions in by_model.items():
            folder = store / name
            try:
                labels = _write_model(folder, _numbered(versions))
            except OSError as exc:
                _log_once(f"The versions of model {name} cannot be written under {folder}: {exc}")
                continue
            # An edited model-settings.json reloads the version that serves, as MLServer's load does.
            models[name] = PackagedModel(str(folder), labels, reload_changed=True)
        remove_folders_except(store, set(models))
        return models


def _environment_model(base: Path) -> ModelSettings | None:
    try:
        return environment_model_settings(base)
    except ServingError as exc:
        _log_once(f"The model of MLServer's environment variables is not served: {exc.message}")
        return None


def version_key(text: str) -> tuple[int, Any, str]:
    """Orders version strings: none first, then ``packaging.version`` order ("v0.1.0" < "v0.10.0"), then text."""
    if not text:
        return (0, "", text)
    try:
        return (1, Version(text), text)
    except InvalidVersion:
        return (2, text, text)


def _numbered(versions: list[ModelSettings]) -> dict[int, ModelSettings]:
    chosen: dict[str, ModelSettings] = {}
    for settings in sorted(versions, key=lambda s: str(s.source)):
        if settings.version in chosen:
            _log_once(
                f"{chosen[settings.version].source} and {settings.source} are both version "
                f"{settings.version or '(none)'} of model {settings.name}; {chosen[settings.version].source} is served"
            )
            continue
        chosen[settings.version] = settings
    ordered = [chosen[v] for v in sorted(chosen, key=version_key)]
    return dict(enumerate(ordered, start=1))


def _write_model(folder: Path, numbered: dict[int, ModelSettings]) -> dict[str, int]:
    """Each version's folder (rewritten only when what it says changed), and the model's batching; its labels."""
    folder.mkdir(parents=True, exist_ok=True)
    labels = {}
    for number, settings in numbered.items():
        if settings.version:
            labels[settings.version] = number
        # The environment's model has no file: its version names the folder, and the environment is read at load.
        key, where = ("environment", settings.folder) if settings.from_environment else ("settings", settings.source)
        wanted: dict[str, Any] = {"platform": PLATFORM, key: str(where), "version": settings.version}
        if not settings.from_environment:
            # The settings file's size and mtime: an edit changes this folder, so a version that failed to load is
            # retried once its settings are fixed (a version's fingerprint covers its folder's files).
            with contextlib.suppress(OSError):
                stat = settings.source.stat()
                wanted["settings_stamp"] = [stat.st_size, stat.st_mtime_ns]
        _write_if_changed(folder / str(number) / VERSION_FILE, json.dumps(wanted, indent=2) + "\n")
    for entry in folder.iterdir():  # versions whose settings went (or were renumbered away)
        if entry.is_dir() and entry.name.isdigit() and int(entry.name) not in numbered:
            shutil.rmtree(entry, ignore_errors=True)
    # The newest version's adaptive batching is the model's (the server batches a model, not a version).
    batching = _batching(numbered[max(numbered)])
    file = folder / BATCHING_FILE_NAME
    if batching is None:
        file.unlink(missing_ok=True)
    else:
        _write_if_changed(file, _batching_text(batching))
    return labels


def _batching(settings: ModelSettings) -> BatchingParameters | None:
    try:
        return settings.batching()
    except ServingError as exc:
        _log_once(f"Model {settings.name}'s batching is off: {exc.message}")
        return None


def _batching_text(params: BatchingParameters) -> str:
    """TF Serving's text format, as ``--batching_parameters_file`` and a model's own file hold it."""
    return (
        f"max_batch_size {{ value: {params.max_batch_size} }}\n"
        f"batch_timeout_micros {{ value: {params.batch_timeout_micros} }}\n"
        f"max_enqueued_batches {{ value: {params.max_enqueued_batches} }}\n"
    )


def _write_if_changed(path: Path, text: str) -> None:
    try:
        if path.read_text() == text:
            return
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)  # a version folder never holds half a file


def _log_once(message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        log.error("%s", message)
