"""MLServer's files: ``model-settings.json`` (one per model) and ``settings.json`` (the server's), read as it reads
them.

A folder laid out for ``mlserver start DIR`` holds a ``settings.json`` and, at any depth below it, one
``model-settings.json`` per model version (hidden folders are skipped, as ``glob("**")`` skips them in MLServer).
This module reads the file format only, checked with messages that name the file and the field; which runtime an
``implementation`` names, and how it serves, is the platforms' (``workbench.platforms.mlserver``).

What MLServer does and this reader keeps:

- a model without ``name`` takes its folder's name;
- ``parameters.uri`` is relative to the folder of its ``model-settings.json`` (or absolute); without one the
  folder itself, where a runtime looks for its well-known file names (``model.joblib``, ``model.json``...);
- ``parameters.version`` is a string (``"v0.1.0"``), which workbench serves as a version label of a numbered
  version (see ``workbench.platforms.mlserver_repository``);
- ``max_batch_size`` and ``max_batch_time`` (seconds) are adaptive batching, on when the size is over 1 and the
  time over 0, which is TF Serving-style batching with ``batch_timeout_micros`` the time;
- MLServer's settings are pydantic settings, so the environment fills every field a file leaves out
  (``MLSERVER_HTTP_PORT`` for ``settings.json``'s ``http_port``; ``MLSERVER_MODEL_NAME``, ``MLSERVER_MODEL_URI``,
  ``MLSERVER_MODEL_EXTRA``... for a ``model-settings.json``'s ``name``, ``parameters.uri``, ``parameters.extra``):
  what a file says wins, then the environment, then the defaults. Names are case-insensitive, lists and objects are
  JSON, as pydantic reads them. Where no ``model-settings.json`` can be read, the environment alone is the one
  model when it names an implementation (``MLSERVER_MODEL_IMPLEMENTATION``): what KServe's ``kserve-mlserver``
  runtime relies on (see :func:`environment_model_settings`); not in a folder laid out for TF Serving
  (:func:`environment_model_serves`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from workbench.config.batching_parameters import BatchingParameters
from workbench.core.errors import Code, ServingError

MODEL_SETTINGS = "model-settings.json"
SETTINGS = "settings.json"
# MLServer's env_prefix for Settings and for ModelSettings/ModelParameters (mlserver/settings.py).
SERVER_PREFIX = "MLSERVER_"
MODEL_PREFIX = "MLSERVER_MODEL_"
IMPLEMENTATION_VARIABLE = MODEL_PREFIX + "IMPLEMENTATION"
# How many batches of max_batch_size may wait: MLServer's queue is unbounded; TF Serving's default bound is kept.
_QUEUED_BATCHES = 10


@dataclasses.dataclass(frozen=True)
class TensorDeclaration:
    """An input or output a ``model-settings.json`` declares (MLServer's ``MetadataTensor``)."""

    name: str
    datatype: str = ""
    shape: tuple[int, ...] = ()
    content_type: str = ""  # parameters.content_type: how MLServer decodes (or encodes) it


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """One ``model-settings.json``, with MLServer's defaults filled in."""

    source: Path  # the file itself
    name: str
    implementation: str
    uri: str  # as written ("" when the file names none)
    version: str  # parameters.version ("" when none)
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    content_type: str = ""  # parameters.content_type: the request codec
    inputs: tuple[TensorDeclaration, ...] = ()
    outputs: tuple[TensorDeclaration, ...] = ()
    platform: str = ""
    versions: tuple[str, ...] = ()  # the metadata's "versions", as declared
    max_batch_size: int = 0
    max_batch_time: float = 0.0  # seconds
    from_environment: bool = False  # no file: the environment's model (source is where a file would be)

    @property
    def folder(self) -> Path:
        return self.source.parent

    @property
    def model_uri(self) -> str:
        """Where the model's files are: ``uri`` against the file's folder (a URL with a scheme as it is); the folder
        itself when the file names none."""
        if not self.uri:
            return str(self.folder)
        if "://" in self.uri and not self.uri.startswith("file://"):
            return self.uri
        path = self.uri.removeprefix("file://")
        return os.path.normpath(path if os.path.isabs(path) else os.path.join(self.folder, path))

    def batching(self) -> BatchingParameters | None:
        """MLServer's adaptive batching as batching parameters; None when it is off (size ≤ 1 or time ≤ 0)."""
        if self.max_batch_size <= 1 or self.max_batch_time <= 0:
            return None
        return BatchingParameters(
            max_batch_size=self.max_batch_size,
            batch_timeout_micros=int(round(self.max_batch_time * 1e6)),
            max_enqueued_batches=_QUEUED_BATCHES,
        ).validate(str(self.source))


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    """What of ``settings.json`` matters to serving: where to listen, and which folder holds the models."""

    host: str = ""  # "": not set (MLServer binds 0.0.0.0; workbench keeps its own default, 127.0.0.1)
    http_port: int = 8080
    grpc_port: int = 8081
    model_repository_root: str = "."
    load_models_at_startup: bool = True
    debug: bool = False


# ------------------------------------------------------------------------------------------- reading
def read_model_settings(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> ModelSettings:
    """One ``model-settings.json``, the environment filling what it leaves out; INVALID_ARGUMENT naming the file (or
    the variable) and field where it cannot be served."""
    source = Path(path).resolve()
    return _model_settings(_document(source), source, _Environment(environ, MODEL_PREFIX, str(source)))


def environment_model_settings(
    folder: str | os.PathLike[str], environ: Mapping[str, str] | None = None
) -> ModelSettings | None:
    """The model MLServer makes of the environment alone, where its repository holds no readable
    ``model-settings.json``: None unless ``MLSERVER_MODEL_IMPLEMENTATION`` names one (MLServer's ``ModelSettings()``
    fails validation without it, and serves nothing).

    As MLServer reads it: a relative ``MLSERVER_MODEL_URI`` is against the working directory (there is no file to be
    relative to). Where MLServer would fail the load for want of a uri, the folder given is the model's (KServe's
    ``/mnt/models``); a model without ``MLSERVER_MODEL_NAME`` takes the folder's name where MLServer's would be "".
    """
    env = _Environment(environ, MODEL_PREFIX, "the environment")
    if not env.get("implementation"):
        return None
    settings = _model_settings({}, Path(folder).resolve() / MODEL_SETTINGS, env)
    uri = settings.uri
    if uri and "://" not in uri:
        uri = os.path.abspath(uri)
    elif uri.startswith("file://"):
        uri = os.path.abspath(uri.removeprefix("file://"))
    return dataclasses.replace(settings, uri=uri, from_environment=True)


def environment_names_a_model(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``MLSERVER_MODEL_IMPLEMENTATION`` is set (see :func:`environment_model_serves` for where it counts)."""
    return bool(_Environment(environ, MODEL_PREFIX, "the environment").get("implementation"))


def environment_model_serves(folder: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``folder`` serves the environment's model: ``MLSERVER_MODEL_IMPLEMENTATION`` is set and the folder
    holds no ``model-settings.json`` (MLServer reads the environment only then) and no TF Serving-style model (a
    sub-folder of numbered version folders). A pod's variable thus never turns a TF Serving or Triton repository
    into MLServer's one model: the variable is KServe's way to name the model of a folder of its files."""
    if not environment_names_a_model(environ) or holds_model_settings(folder):
        return False
    return not holds_version_folders(folder)


def holds_version_folders(folder: str | os.PathLike[str]) -> bool:
    """Whether a (non-hidden) sub-folder of ``folder`` holds a numbered version folder, as a TF Serving model does."""
    try:
        models = [entry for entry in os.scandir(folder) if entry.is_dir() and not entry.name.startswith(".")]
        for model in models:
            if any(entry.is_dir() and entry.name.isdigit() for entry in os.scandir(model.path)):
                return True
    except OSError:
        return False
    return False


def _model_settings(document: dict[str, Any], source: Path, env: _Environment) -> ModelSettings:
    where = env.where
    # An absent "parameters" is MLSERVER_MODEL_PARAMETERS (JSON), and each parameter it leaves out its own variable.
    parameters = _object(env.fill(document, "parameters", decode=True), where, "parameters")
    name = _text(env.fill(document, "name"), where, "name") or source.parent.name
    return ModelSettings(
        source=source,
        name=name,
        implementation=_text(env.fill(document, "implementation"), where, "implementation"),
        uri=_text(env.fill(parameters, "uri"), where, "parameters.uri"),
        version=_text(env.fill(parameters, "version"), where, "parameters.version"),
        extra=_object(env.fill(parameters, "extra", decode=True), where, "parameters.extra"),
        content_type=_text(env.fill(parameters, "content_type"), where, "parameters.content_type"),
        inputs=_tensors(env.fill(document, "inputs", decode=True), where, "inputs"),
        outputs=_tensors(env.fill(document, "outputs", decode=True), where, "outputs"),
        platform=_text(env.fill(document, "platform"), where, "platform"),
        versions=tuple(
            _text(v, where, "versions") for v in _list(env.fill(document, "versions", decode=True), where, "versions")
        ),
        max_batch_size=_number(env.fill(document, "max_batch_size", decode=True), where, "max_batch_size", int),
        max_batch_time=_number(env.fill(document, "max_batch_time", decode=True), where, "max_batch_time", float),
    )


def read_server_settings(folder: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> ServerSettings:
    """The ``settings.json`` in ``folder``, the environment (``MLSERVER_HTTP_PORT``...) filling what it leaves out,
    then MLServer's defaults; a relative ``model_repository_root`` is taken against ``folder``."""
    source = Path(folder) / SETTINGS
    document = _document(source) if source.is_file() else {}
    env = _Environment(environ, SERVER_PREFIX, str(source) if source.is_file() else "the environment")
    where = env.where
    root = _text(env.fill(document, "model_repository_root"), where, "model_repository_root") or "."
    return ServerSettings(
        host=_text(env.fill(document, "host"), where, "host"),
        http_port=_number(env.fill(document, "http_port", decode=True), where, "http_port", int)
        or ServerSettings.http_port,
        grpc_port=_number(env.fill(document, "grpc_port", decode=True), where, "grpc_port", int)
        or ServerSettings.grpc_port,
        model_repository_root=os.path.normpath(root if os.path.isabs(root) else os.path.join(folder, root)),
        load_models_at_startup=_flag(
            env.fill(document, "load_models_at_startup", default=True), where, "load_models_at_startup"
        ),
        debug=_flag(env.fill(document, "debug", default=False), where, "debug"),
    )


class _Environment:
    """MLServer's variables under one prefix, as pydantic-settings reads them: case-insensitive names, JSON for
    numbers, lists and objects (a plain string stays a string)."""

    def __init__(self, environ: Mapping[str, str] | None, prefix: str, where: str) -> None:
        variables = os.environ if environ is None else environ
        self.prefix = prefix
        self.values = {k.upper(): v for k, v in variables.items() if k.upper().startswith(prefix)}
        # Messages name the file and field; where variables are set too, they say so (a field may be theirs).
        self.where = f"{where} (with {prefix}* variables)" if self.values and where != "the environment" else where

    def get(self, field: str) -> str | None:
        return self.values.get(self.prefix + field.upper())

    def fill(self, document: Mapping[str, Any], field: str, *, decode: bool = False, default: Any = None) -> Any:
        """``document[field]`` where the file sets it, else the variable's value, else ``default``."""
        value = document.get(field)
        if value is not None:
            return value
        text = self.get(field)
        if text is None:
            return default
        if not decode:
            return text
        try:
            return json.loads(text)
        except ValueError:
            if text.strip().startswith(("{", "[")):  # meant as JSON: say which variable is not
                variable = self.prefix + field.upper()
                raise ServingError(Code.INVALID_ARGUMENT, f"{variable} is not valid JSON: {text!r}") from None
            return text  # "true", or a number's typo: the field's check names it


def find_model_settings(root: str | os.PathLike[str]) -> Iterator[Path]:
    """Every ``model-settings.json`` at any depth under ``root``, in a stable order; hidden folders are skipped
    (workbench's own ``.workbench``, a checkout's ``.git``), as MLServer's recursive glob skips them."""
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(s for s in subfolders if not s.startswith("."))
        if MODEL_SETTINGS in files:
            yield Path(folder) / MODEL_SETTINGS


def holds_model_settings(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` holds a ``model-settings.json`` at any depth: it is laid out for MLServer."""
    return next(find_model_settings(folder), None) is not None


# ------------------------------------------------------------------------------------------- fields
def _document(source: Path) -> dict[str, Any]:
    try:
        document = json.loads(source.read_text())
    except OSError as exc:
        raise ServingError(Code.NOT_FOUND, f"Could not read {source}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ServingError(Code.INVALID_ARGUMENT, f"{source} is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ServingError(Code.INVALID_ARGUMENT, f"{source} must hold a JSON object")
    return document


def _fail(where: str, field: str, want: str, value: Any) -> ServingError:
    return ServingError(Code.INVALID_ARGUMENT, f"{where}: {field} must be {want}, got {json.dumps(value)}")


def _text(value: Any, where: str, field: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _fail(where, field, "a string", value)
    return value


def _object(value: Any, where: str, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(where, field, "an object", value)
    return value


def _list(value: Any, where: str, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _fail(where, field, "a list", value)
    return value


def _number(value: Any, where: str, field: str, kind: type[int] | type[float]) -> Any:
    if value is None:
        return kind(0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise _fail(where, field, "an integer" if kind is int else "a number", value)
    return kind(value)


def _flag(value: Any, where: str, field: str) -> bool:
    # MLServer's settings are pydantic's: "true"/"false" strings count (its examples write "debug": "true").
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no", "on", "off"):
        return value.lower() in ("true", "1", "yes", "on")
    raise _fail(where, field, "true or false", value)


def _tensors(value: Any, where: str, field: str) -> tuple[TensorDeclaration, ...]:
    tensors = []
    for index, entry in enumerate(_list(value, where, field)):
        at = f"{field}[{index}]"
        entry = _object(entry, where, at)
        name = _text(entry.get("name"), where, f"{at}.name")
        if not name:
            raise ServingError(Code.INVALID_ARGUMENT, f"{where}: {at} has no name")
        shape = _list(entry.get("shape"), where, f"{at}.shape")
        if not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
            raise _fail(where, f"{at}.shape", "a list of integers", shape)
        parameters = _object(entry.get("parameters"), where, f"{at}.parameters")
        tensors.append(
            TensorDeclaration(
                name=name,
                datatype=_text(entry.get("datatype"), where, f"{at}.datatype"),
                shape=tuple(shape),
                content_type=_text(parameters.get("content_type"), where, f"{at}.parameters.content_type"),
            )
        )
    return tuple(tensors)
