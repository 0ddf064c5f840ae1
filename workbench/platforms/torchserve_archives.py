"""TorchServe model archives (``.mar``) in a model repository: read, numbered and unpacked into version folders.

A TorchServe model store is a folder of ``.mar`` files: zip archives holding ``MAR-INF/MANIFEST.json`` (the model's
name and version, its serialized file, model file and handler) and the files the archive was made from. workbench
serves such a folder as a model repository: every archive becomes a version of the model its manifest names
(``model.modelName``; the file's stem when the manifest names none), unpacked under the store's hidden folder
``.workbench/torchserve/<model>/<N>/``, where the manager finds it as it finds any version folder.

TorchServe's versions are strings ("1.0", "2.1"); workbench's are integers. A model's archives are numbered 1, 2, 3…
in the order of their version strings (as ``packaging.version`` orders them, else as text), so "1.0", "2.0" are
versions 1 and 2; the string stays in the unpacked manifest, shown by TorchServe's describe API and accepted by its
``/predictions/{model}/{version}``. Two archives of one model with the same version string: the first by file name
is served, the other is logged and skipped.

An archive that cannot be read (not a zip, no manifest, a path that leaves the folder) becomes a version folder
holding only :data:`SOURCE_FILE` with the reason, so its model shows the error in its status and fails its load with
it, while the store's other models serve. An archive is unpacked again only when its size or modification time
changes; folders of archives that went away are removed, and the manager unloads what they held.

This module reads files only (zip, JSON); running an archive's handler is :mod:`workbench.platforms.torchserve`'s.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import threading
import uuid
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from workbench.platforms.base import remove_folders_except

log = logging.getLogger(__name__)

ARCHIVE_SUFFIX = ".mar"
MANIFEST = "MAR-INF/MANIFEST.json"
# Beside every unpacked archive: which file it came from (its name, size, mtime) and, for an unreadable one, why.
SOURCE_FILE = "MAR-INF/workbench-source.json"
PLATFORM_FILE = "workbench.json"
STORE_FOLDER = os.path.join(".workbench", "torchserve")
DEFAULT_VERSION = "1.0"  # torch-model-archiver's default --version

_lock = threading.Lock()  # discovery runs on the poller and on control-plane threads


class ArchiveError(ValueError):
    """A ``.mar`` that cannot be served as it is; the message names the file and what is wrong."""


@dataclasses.dataclass(frozen=True)
class Manifest:
    """``MAR-INF/MANIFEST.json``: the fields TorchServe reads (``model`` holds the ones of torch-model-archiver)."""

    document: Mapping[str, Any]

    @property
    def model(self) -> Mapping[str, Any]:
        model = self.document.get("model")
        return model if isinstance(model, Mapping) else {}

    @property
    def model_name(self) -> str:
        return str(self.model.get("modelName") or "")

    @property
    def model_version(self) -> str:
        return str(self.model.get("modelVersion") or DEFAULT_VERSION)

    @property
    def handler(self) -> str:
        return str(self.model.get("handler") or "")

    @property
    def serialized_file(self) -> str:
        return str(self.model.get("serializedFile") or "")

    @property
    def model_file(self) -> str:
        return str(self.model.get("modelFile") or "")

    @property
    def config_file(self) -> str:
        return str(self.model.get("configFile") or "")

    @property
    def runtime(self) -> str:
        return str(self.document.get("runtime") or "python")


def parse_manifest(text: str | bytes, where: str) -> Manifest:
    """A manifest's JSON, checked for what serving needs: a ``model`` object naming a handler."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ArchiveError(f"{where}: {MANIFEST} is not valid JSON: {exc}") from None
    if not isinstance(document, dict) or not isinstance(document.get("model"), dict):
        raise ArchiveError(f'{where}: {MANIFEST} has no "model" object (torch-model-archiver writes one)')
    manifest = Manifest(document)
    if not manifest.handler:
        raise ArchiveError(f'{where}: {MANIFEST} names no handler ("model": {{"handler": ...}})')
    return manifest


def read_manifest(folder: str | os.PathLike[str]) -> Manifest:
    """The manifest of an unpacked archive."""
    path = Path(folder) / MANIFEST
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise ArchiveError(f"{folder} holds no {MANIFEST}: {exc.strerror or exc}") from None
    return parse_manifest(text, str(folder))


def read_source(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """What :data:`SOURCE_FILE` says of an unpacked archive ({} when there is none: unpacked by hand)."""
    try:
        document = json.loads((Path(folder) / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return document if isinstance(document, dict) else {}


def archive_manifest(path: Path) -> Manifest:
    """The manifest inside the archive ``path`` (not unpacked)."""
    try:
        with zipfile.ZipFile(path) as archive:
            try:
                text = archive.read(MANIFEST)
            except KeyError:
                raise ArchiveError(f"{path.name} holds no {MANIFEST}: it is not a TorchServe model archive") from None
    except (zipfile.BadZipFile, OSError) as exc:
        raise ArchiveError(f"{path.name} cannot be read as a model archive (a zip file): {exc}") from None
    return parse_manifest(text, path.name)


def version_key(text: str) -> tuple[int, Any, str]:
    """Orders version strings: ``packaging.version`` order ("1.0" < "1.10" < "2.0"), then others as text."""
    try:
        return (0, Version(text), text)
    except InvalidVersion:
        return (1, text, text)


@dataclasses.dataclass(frozen=True)
class _Found:
    file: Path
    stamp: tuple[int, int]  # size, mtime_ns
    manifest: Manifest | None
    error: str = ""


_manifests: dict[tuple[str, int, int], _Found] = {}  # read each archive's manifest once per (path, size, mtime)


def _read(path: Path) -> _Found | None:
    try:
        st = path.stat()
    except OSError:
        return None
    key = (str(path), st.st_size, st.st_mtime_ns)
    found = _manifests.get(key)
    if found is None:
        try:
            found = _Found(path, (st.st_size, st.st_mtime_ns), archive_manifest(path))
        except ArchiveError as exc:
            found = _Found(path, (st.st_size, st.st_mtime_ns), None, str(exc))
        _manifests[key] = found
    return found


def store_models(root: str | os.PathLike[str], is_model_name: Any) -> dict[str, str]:
    """The models of the ``.mar`` files directly in ``root``: model name → its folder of unpacked versions.

    ``is_model_name`` says which names are safe as folder names and in URLs; an archive whose model name is not is
    skipped with an error in the log. Unpacks what changed, removes what went.
    """
    base = Path(root)
    with _lock:
        archives = sorted(p for p in base.glob(f"*{ARCHIVE_SUFFIX}") if p.is_file() and not p.name.startswith("."))
        by_model: dict[str, list[_Found]] = {}
        for path in archives:
            found = _read(path)
            if found is None:
                continue
            name = (found.manifest.model_name if found.manifest else "") or path.name[: -len(ARCHIVE_SUFFIX)]
            if not is_model_name(name):
                log.error("%s: model name %r is not a valid model name; the archive is not served", path.name, name)
                continue
            by_model.setdefault(name, []).append(found)
        store = base / STORE_FOLDER
        models = {}
        for name, archives_of_model in by_model.items():
            folder = store / name
            try:
                _unpack_model(folder, archives_of_model)
            except OSError as exc:
                log.error("The archives of model %s cannot be unpacked into %s: %s", name, folder, exc)
                continue
            models[name] = str(folder)
        remove_folders_except(store, set(models))
        return models


# The store's archives as last scanned: file name → (model, version number, version string), for TorchServe's
# register API (``POST /models?url=x.mar``), which names an archive, not a version.
_index: dict[str, tuple[str, int, str]] = {}


def find_archive(file_name: str) -> tuple[str, int, str] | None:
    """The model, version number and version string of the store's archive ``file_name`` (None: not there)."""
    with _lock:
        return _index.get(file_name)


def find_version(model: str, version: str) -> str | None:
    """The file name of the store's archive served as ``version`` (a version string) of ``model``, if any."""
    with _lock:
        return next((file for file, (m, _, v) in _index.items() if m == model and v == version), None)


def _numbered(found: list[_Found]) -> dict[int, _Found]:
    """The archives of one model by version number: readable ones in version order, unreadable ones after them."""
    readable = [f for f in found if f.manifest is not None]
    unreadable = [f for f in found if f.manifest is None]
    chosen: dict[str, _Found] = {}
    for item in readable:  # sorted by file name already
        assert item.manifest is not None
        version = item.manifest.model_version
        if version in chosen:
            log.error(
                "%s and %s both hold version %s of model %s; %s is served",
                chosen[version].file.name,
                item.file.name,
                version,
                item.manifest.model_name,
                chosen[version].file.name,
            )
            continue
        chosen[version] = item
    ordered = [chosen[v] for v in sorted(chosen, key=version_key)] + unreadable
    return {number: item for number, item in enumerate(ordered, start=1)}


def _unpack_model(folder: Path, found: list[_Found]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    numbered = _numbered(found)
    for number, item in numbered.items():
        version = item.manifest.model_version if item.manifest is not None else ""
        _index[item.file.name] = (folder.name, number, version)
        target = folder / str(number)
        wanted = {"modelUrl": item.file.name, "size": item.stamp[0], "mtime_ns": item.stamp[1], "error": item.error}
        if read_source(target) == wanted:
            continue
        _unpack(item, target, wanted)
    for entry in folder.iterdir():  # versions whose archive went (or was renumbered away)
        if entry.is_dir() and entry.name.isdigit() and int(entry.name) not in numbered:
            shutil.rmtree(entry, ignore_errors=True)


def _unpack(item: _Found, target: Path, source: dict[str, Any]) -> None:
    """Unpack into a hidden folder, then rename it into place: a version folder is never half-written."""
    temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}")
    temporary.mkdir()
    try:
        if item.manifest is not None:
            try:
                _extract(item.file, temporary)
            except ArchiveError as exc:
                shutil.rmtree(temporary)
                temporary.mkdir()
                source = {**source, "error": str(exc)}
        (temporary / SOURCE_FILE).parent.mkdir(parents=True, exist_ok=True)
        (temporary / SOURCE_FILE).write_text(json.dumps(source))
        # The folder's platform, said (workbench.platforms' VERSION_CONFIG): an archive's model.pt or model.py must
        # not make it look like a PyTorch or Python model folder as well.
        (temporary / PLATFORM_FILE).write_text(json.dumps({"platform": "torchserve"}))
        if target.exists():
            old = target.with_name(f".{target.name}.old.{uuid.uuid4().hex[:8]}")
            os.replace(target, old)
            os.replace(temporary, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(temporary, target)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise


def _extract(file: Path, into: Path) -> None:
    """Every member of the archive under ``into``; one that would land outside it refuses the archive."""
    root = into.resolve()
    try:
        with zipfile.ZipFile(file) as archive:
            for member in archive.infolist():
                destination = (root / member.filename).resolve()
                if destination != root and root not in destination.parents:
                    raise ArchiveError(f"{file.name}: member {member.filename!r} would be written outside its folder")
            archive.extractall(root)
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise ArchiveError(f"{file.name} cannot be unpacked: {exc}") from None
