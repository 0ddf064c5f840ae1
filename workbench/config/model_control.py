"""Which of the repository's models the server serves, and whether clients may change that: Triton's model control.

``--model_control_mode`` takes Triton's three modes, and workbench's own when it is not given:

- (not given) every model of the config or repository serves; the repository is polled
  (``--file_system_poll_wait_seconds``) for new models and versions; the v2 repository API loads and unloads
  *versions* (a whole model leaves with the config). What workbench has always done.
- ``none``: every model loads at start-up; the repository is read once; load and unload requests are refused.
- ``poll``: every model loads at start-up; the repository is polled for new models and versions; load and unload
  requests are refused.
- ``explicit``: only the ``--load_model`` models load at start-up (``*``: all); the repository is read only when a
  load asks; clients load and unload whole models (``unload_dependents`` takes the pipelines built on one along).

Refusals use Triton's words, which its clients and users match on. The server asks :meth:`ModelControl.select`
which of a repository's models to serve, so the source, the start-up and a load all agree.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import enum
import itertools
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from workbench.config.options import ModelConfig
from workbench.core.errors import Code, ServingError

ALL_MODELS = "*"
FILE_PREFIX = "file:"  # Triton's file override parameters: "file:<version>/<path>" → the file's bytes
_NAME_MAX = 255  # the longest file name (bytes) of Linux's file systems


class ControlMode(enum.Enum):
    VERSIONS = ""  # workbench's own: the repository decides the models, clients the versions
    NONE = "none"
    POLL = "poll"
    EXPLICIT = "explicit"

    @classmethod
    def parse(cls, text: str) -> ControlMode:
        try:
            return cls(text.strip().lower())
        except ValueError:
            raise ServingError(
                Code.INVALID_ARGUMENT, f"--model_control_mode takes none, poll or explicit, not {text!r}"
            ) from None


@dataclasses.dataclass(frozen=True)
class Overrides:
    """Triton's load overrides: a model config (JSON) and files that replace the model's folder."""

    config: str | None = None
    files: Mapping[str, bytes] = dataclasses.field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.config is not None or bool(self.files)


def load_overrides(parameters: Mapping[str, Any]) -> Overrides:
    """A load request's ``config`` and ``file:…`` parameters (REST sends file contents base64, gRPC as bytes)."""
    config = parameters.get("config")
    if config is not None and not isinstance(config, str):
        raise ServingError(Code.INVALID_ARGUMENT, "The config parameter must be a string holding a JSON model config")
    files: dict[str, bytes] = {}
    for key, value in parameters.items():
        if not key.startswith(FILE_PREFIX):
            continue
        if isinstance(value, str):
            try:
                value = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise ServingError(Code.INVALID_ARGUMENT, f"Parameter {key!r} must be base64") from None
        if not isinstance(value, bytes):
            raise ServingError(Code.INVALID_ARGUMENT, f"Parameter {key!r} must hold the file's bytes")
        files[_override_path(key[len(FILE_PREFIX) :])] = value
    if files and config is None:  # as Triton: files replace the folder, so the config must come with them
        raise ServingError(Code.INVALID_ARGUMENT, "File overrides need the config parameter too")
    return Overrides(config, files)


def _override_path(path: str) -> str:
    """``<version>/<path inside it>``, refused unless it stays inside a version folder."""
    posix = PurePosixPath(path)
    parts = posix.parts
    if any(len(part.encode()) > _NAME_MAX for part in parts):
        # Triton fails such a load while writing the file, as a failed poll with INTERNAL, and its own model-control
        # example checks exactly that; the file system's limit is the server's, so the code is kept.
        raise ServingError(
            Code.INTERNAL,
            f"failed to poll from model repository: file override {path[:40]!r}… has a name longer than {_NAME_MAX} "
            "bytes, which no file system here can hold",
        )
    inside = len(parts) >= 2 and parts[0].isascii() and parts[0].isdigit() and not posix.is_absolute()
    if not inside or any(p in ("..", ".") or "\\" in p or "\0" in p for p in parts):
        raise ServingError(
            Code.INVALID_ARGUMENT, f"File override {path!r} must be <version>/<file> inside the model's folder"
        )
    return str(posix)


def _config_text(name: str, config: str) -> str:
    """A JSON model config (Triton's load parameter) as the config.pbtxt it stands for."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    try:
        proto = json_format.Parse(config, model_config_pb2.ModelConfig())
    except json_format.ParseError as exc:
        raise ServingError(
            Code.INVALID_ARGUMENT, f"failed to load '{name}': the config parameter is not a model config: {exc}"
        ) from None
    if proto.name and proto.name != name:
        raise ServingError(
            Code.INVALID_ARGUMENT, f"failed to load '{name}': the config parameter names model {proto.name!r}"
        )
    proto.name = name
    return str(text_format.MessageToString(proto))


def check_load_models(mode: ControlMode, names: Sequence[str]) -> None:
    """``--load_model`` only means something in explicit mode, and ``*`` stands alone (as in Triton)."""
    if names and mode is not ControlMode.EXPLICIT:
        raise ServingError(Code.INVALID_ARGUMENT, "--load_model needs --model_control_mode=explicit")
    if ALL_MODELS in names and len(names) > 1:
        raise ServingError(Code.INVALID_ARGUMENT, "--load_model=* loads every model: give it alone")


class ModelControl:
    """The models a server serves out of its repository, and the load and unload requests that change them.

    ``discover()`` lists the repository's models (None: the models come from a config file); ``apply(configs)``
    realises exactly ``configs`` (loading what is new, unloading what went) and returns once their versions settled.
    Thread-safe: loads and unloads take turns.
    """

    def __init__(
        self,
        mode: ControlMode,
        discover: Callable[[], list[ModelConfig]] | None,
        apply: Callable[[list[ModelConfig]], None],
        load_models: Sequence[str] = (),
    ) -> None:
        check_load_models(mode, load_models)
        if mode is ControlMode.EXPLICIT and discover is None:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                "--model_control_mode=explicit loads models out of a repository: give --model_repository",
            )
        self.mode = mode
        self._discover = discover
        self._apply = apply
        self._everything = ALL_MODELS in load_models
        self._loaded: set[str] = set() if self._everything else set(load_models)
        self._unloaded: set[str] = set()  # unloaded by request: listed by the index as such
        self._overridden: dict[str, str] = {}  # model → the folder its load's overrides made (its base path)
        self._scratch: Path | None = None  # where override folders are made (a temporary folder, made when needed)
        self._serial = itertools.count(1)
        self._lock = threading.Lock()
        self._changing = threading.Lock()  # one load or unload at a time, as Triton serialises them

    @property
    def explicit(self) -> bool:
        return self.mode is ControlMode.EXPLICIT

    # ------------------------------------------------------------------------------------------ selection
    def select(self, found: Iterable[ModelConfig]) -> list[ModelConfig]:
        """Of the repository's models, those to serve: all of them, unless loading is explicit."""
        found = list(found)
        if not self.explicit:
            return found
        with self._lock:
            if self._everything:  # --load_model=*: every model found at start-up, then as loads and unloads say
                self._loaded = {c.name for c in found}
                self._everything = False
            return [
                dataclasses.replace(c, base_path=self._overridden[c.name]) if c.name in self._overridden else c
                for c in found
                if c.name in self._loaded
            ]

    def discover(self) -> list[ModelConfig]:
        """The models to serve now, from a fresh listing of the repository."""
        assert self._discover is not None
        return self.select(self._discover())

    def unloaded(self) -> list[str]:
        """Models unloaded by request and not loaded since (the repository index lists them as UNAVAILABLE)."""
        with self._lock:
            return sorted(self._unloaded)

    def not_loaded(self, served: Iterable[str]) -> list[str]:
        """The repository's models that do not serve (explicit mode lists them in the index, without a state)."""
        if not self.explicit or self._discover is None:
            return []
        serving = set(served)
        return sorted(c.name for c in self._discover() if c.name not in serving)

    # --------------------------------------------------------------------------------------------- changes
    def refuse_unless_explicit(self) -> None:
        if self.mode in (ControlMode.NONE, ControlMode.POLL):
            raise ServingError(Code.UNAVAILABLE, "explicit model load / unload is not allowed if polling is enabled")

    def load(self, name: str, overrides: Overrides | None = None) -> None:
        """Serve ``name`` from the repository (re-reading it when it already serves); raises Triton's
        "failed to load" when the repository has no such model.

        With ``overrides`` the model loads from a folder of its own: the config given as its config.pbtxt, beside
        the files given (or, without files, the repository folder's versions). A model already serving is unloaded
        first, since its versions keep their numbers. A load without overrides returns to the repository's folder.
        """
        with self._changing:
            found = self._discover() if self._discover is not None else []
            original = next((c for c in found if c.name == name), None)
            if original is None:
                raise ServingError(
                    Code.NOT_FOUND,
                    f"failed to load '{name}', failed to poll from model repository: it has no folder {name!r}",
                )
            folder = self._override_folder(original, overrides) if overrides else None
            with self._lock:
                replacing = (folder is not None or name in self._overridden) and name in self._loaded
                if replacing:
                    self._loaded.discard(name)
            if replacing:
                self._apply(self.select(found))
            with self._lock:
                self._loaded.add(name)
                self._unloaded.discard(name)
                previous = self._overridden.pop(name, None)
                if folder is not None:
                    self._overridden[name] = folder
            self._apply(self.select(found))
            if previous is not None:
                shutil.rmtree(Path(previous).parent, ignore_errors=True)

    def _override_folder(self, original: ModelConfig, overrides: Overrides) -> str:
        """A new folder for ``original`` with the overrides applied (never the repository's own folder)."""
        text = _config_text(original.name, overrides.config) if overrides.config is not None else None
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix="workbench-overrides-"))
        # Named as the model (Triton requires a config's name to be its folder's), in a parent of its own per load.
        folder = self._scratch / str(next(self._serial)) / original.name
        folder.mkdir(parents=True)
        if overrides.files:
            for relative, data in overrides.files.items():
                target = folder / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
        else:  # the repository's versions, under the new config
            for entry in Path(original.base_path).iterdir():
                if entry.name != "config.pbtxt":
                    (folder / entry.name).symlink_to(entry.resolve(), target_is_directory=entry.is_dir())
        if text is not None:
            (folder / "config.pbtxt").write_text(text)
        return str(folder)

    def close(self) -> None:
        """The server stops: the override folders go."""
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)

    def unload(self, names: Iterable[str]) -> None:
        """Stop serving ``names`` (a model and, when asked, its dependents); returns once they unloaded."""
        names = set(names)
        with self._changing:
            with self._lock:
                self._loaded -= names
                self._unloaded |= names
                gone = [self._overridden.pop(n) for n in names if n in self._overridden]
            self._apply(self.discover())
            for folder in gone:
                shutil.rmtree(Path(folder).parent, ignore_errors=True)
