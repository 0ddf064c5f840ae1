"""Numbered versions in an object store (``s3://``, ``gs://``, any fsspec URL): which numbers are taken, and
uploading a checked export with its model file last (object stores have no rename)."""

from __future__ import annotations

from pathlib import Path

from workbench.platforms import model_files
from workbench.publishing.export_errors import ExportError
from workbench.runtime.storage import RemoteFolder, StorageError, join, redact

__all__ = ["refuse_existing_in_store", "store_of", "upload"]


def store_of(model_repository: str, name: str) -> RemoteFolder:
    try:
        return RemoteFolder(join(model_repository, name))
    except StorageError as exc:
        raise ExportError(f"Cannot export to {redact(model_repository)}: {exc}") from None


def _store_versions(store: RemoteFolder) -> set[int]:
    """Numbered folders in the store, complete or still uploading (either number is taken)."""
    from workbench.models.source import parse_version

    try:
        names = store.list_folders()
    except StorageError as exc:
        raise ExportError(f"Cannot list {store.location}: {exc}") from None
    return {n for n in map(parse_version, names) if n is not None}


def refuse_existing_in_store(name: str, store: RemoteFolder, version: int) -> None:
    if version in _store_versions(store):
        raise ExportError(f"Version {version} of model {name!r} already exists in {store.location}")


def upload(name: str, store: RemoteFolder, staging: Path, version: int | None) -> int:
    """Upload the checked export to ``<store>/<number>/``, ``saved_model.pb`` last.

    Object stores have no rename: servers treat a version as present only once its ``saved_model.pb`` exists, so
    writing that file last publishes the version in one step. Two exports racing for the same next number to one
    store are not told apart: name the version (``version=``) when several writers export at once.
    """
    number = version if version is not None else max(_store_versions(store), default=0) + 1
    refuse_existing_in_store(name, store, number)
    try:
        # The model file goes last: a server polling the store counts the version only once it is there.
        model_file = next((f for f in model_files() if (staging / f).is_file()), "")
        store.upload(staging, str(number), last=model_file)
    except StorageError as exc:
        raise ExportError(f"Could not upload version {number} of model {name!r}: {exc}") from None
    return number
