"""Model repositories in object stores (``s3://``, ``gs://``, any fsspec URL), and the local cache they load from.

A base path with a scheme (``s3://bucket/models/m``) is read through fsspec; s3fs and gcsfs are the optional extras
``workbench-serving[s3]`` and ``workbench-serving[gcs]``. Credentials and endpoints come from each library's own
places (environment, config files, instance roles; ``AWS_ENDPOINT_URL`` for S3-compatible stores), never from
workbench, and URLs are redacted before they are logged or shown.

- Polling lists every object under a model's folder by prefix, in one paginated listing (:meth:`RemoteFolder.tree`),
  not a request per version: a version is there once its model file is (object stores have no rename, so an
  uploader should write ``saved_model.pb`` last, as ``export`` does), and its :func:`fingerprint` covers each of its
  files (name, size, ETag or generation), so a version still being copied, or fixed after a failed load, is seen to
  change.
- A version the manager loads is downloaded once into a :class:`VersionCache` folder: into a hidden temporary
  folder first, renamed when complete, so a half-downloaded version is never loaded. Unloading removes it.
- Plain paths keep the local code paths (served in place, renamed into place): nothing here is used for them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

from workbench.runtime import mlflow_uris
from workbench.runtime.mlflow_uris import is_mlflow_uri

log = logging.getLogger(__name__)

SAVED_MODEL = "saved_model.pb"
_CREDENTIALS_IN_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@")


class StorageError(OSError):
    """A store could not be read or written (missing bucket, denied, network); names the (redacted) URL and why."""

    def __init__(self, location: str, reason: str) -> None:
        super().__init__(f"{location}: {reason}")
        self.location = location
        self.reason = reason

    def __str__(self) -> str:  # OSError's own would show the args tuple
        return f"{self.location}: {self.reason}"


def is_remote(path: str | os.PathLike[str]) -> bool:
    """True for any fsspec URL (``file://`` too: read like a store) and MLflow's URIs (``models:/``, ``runs:/``:
    downloaded like a store's versions); a plain path is served in place."""
    return "://" in str(path) or is_mlflow_uri(path)


def redact(url: str) -> str:
    """``s3://KEY:SECRET@bucket/m`` → ``s3://***@bucket/m``: safe to log and to show in status."""
    return _CREDENTIALS_IN_URL.sub(r"\1***@", url)


def join(url: str, *parts: str) -> str:
    return "/".join([url.rstrip("/"), *parts])


def _filesystem(url: str) -> tuple[Any, str]:
    """fsspec's file system for ``url`` and the path within it; a missing extra says which one to install."""
    from fsspec.core import url_to_fs  # imported here: serving local paths never pays for it

    try:
        fs, path = url_to_fs(url)
    except ImportError as exc:
        scheme = url.split("://", 1)[0]
        extra = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}.get(scheme)
        hint = f": pip install 'workbench-serving[{extra}]'" if extra else f" ({exc})"
        raise StorageError(redact(url), f"no file system for {scheme}://{hint}") from None
    return fs, path


def storage_error(url: str, exc: BaseException) -> StorageError:
    if isinstance(exc, FileNotFoundError):
        reason = str(exc) if str(exc) and "://" not in str(exc) else "not found"
    elif isinstance(exc, PermissionError):
        reason = f"access denied ({exc})"
    else:
        reason = f"{type(exc).__name__}: {exc}"
    return StorageError(redact(url), redact(reason))


@contextlib.contextmanager
def translated(url: str) -> Iterator[None]:
    """Any failure of the store (botocore's own exceptions included) becomes a StorageError naming ``url``."""
    try:
        yield
    except StorageError:
        raise
    except Exception as exc:  # noqa: BLE001 - each library raises its own types; callers need one
        raise storage_error(url, exc) from None


class RemoteFolder:
    """One folder of an object store, as the repository source and the routing store use it."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.fs, self.path = _filesystem(self.url)

    @property
    def location(self) -> str:
        return redact(self.url)

    def list_folders(self) -> list[str]:
        """Names of the sub-folders (one listing by prefix; a missing folder in an existing bucket has none)."""
        with translated(self.url):
            self.fs.invalidate_cache(self.path)  # listings are cached by fsspec: every poll must see the store
            try:
                entries = self.fs.ls(self.path, detail=True)
            except FileNotFoundError:
                self._check_root()
                return []
        return sorted(
            entry["name"].rstrip("/").rsplit("/", 1)[-1] for entry in entries if entry.get("type") == "directory"
        )

    def _check_root(self) -> None:
        """Tell a missing bucket (an error) from a prefix with nothing under it yet (no versions)."""
        root = self.path.split("/", 1)[0]
        if root and root != self.path and not self.fs.exists(root):
            raise FileNotFoundError(f"bucket {root} does not exist")

    def info(self, *parts: str) -> dict[str, Any] | None:
        """The object's metadata (size, ETag or generation), or None when there is no such object."""
        path = "/".join([self.path, *parts])
        with translated(join(self.url, *parts)):
            try:
                info: dict[str, Any] = self.fs.info(path)
            except FileNotFoundError:
                return None
        return info if info.get("type") != "directory" else None

    def tree(self) -> dict[str, dict[str, Any]]:
        """Every object under the folder, at any depth, by its path relative to it, with its metadata (size, ETag or
        generation): one listing by prefix (paginated, a request per thousand objects), not a request per folder."""
        with translated(self.url):
            self.fs.invalidate_cache(self.path)  # listings are cached by fsspec: every poll must see the store
            try:
                found: dict[str, dict[str, Any]] = self.fs.find(self.path, detail=True)
            except FileNotFoundError:
                found = {}
            if not found:
                self._check_root()
        prefix = self.path.rstrip("/") + "/"
        return {
            name[len(prefix) :]: info
            for name, info in found.items()
            if name.startswith(prefix) and not name.endswith("/") and info.get("type") != "directory"
        }

    def download(self, folder: str, destination: Path) -> None:
        """Copy everything under ``<url>/<folder>/`` into ``destination`` (which must not exist)."""
        source = f"{self.path}/{folder}"
        with translated(join(self.url, folder)):
            self.fs.invalidate_cache(source)
            files = [name for name in self.fs.find(source) if not name.endswith("/")]
            if not files:
                raise FileNotFoundError(f"{folder}: no files")
            destination.mkdir(parents=True)
            for name in files:
                relative = name[len(source) :].lstrip("/")
                target = destination / relative
                if ".." in Path(relative).parts:
                    raise ValueError(f"object name {name!r} leaves the version folder")
                target.parent.mkdir(parents=True, exist_ok=True)
                self.fs.get_file(name, str(target))

    def upload(self, local: Path, folder: str, last: str = SAVED_MODEL) -> None:
        """Copy the files of ``local`` to ``<url>/<folder>/``, the file named ``last`` after all others."""
        files = [p for p in local.rglob("*") if p.is_file()]
        files.sort(key=lambda p: p.relative_to(local).as_posix() == last)  # stable: only ``last`` moves
        with translated(join(self.url, folder)):
            for path in files:
                self.fs.put_file(str(path), f"{self.path}/{folder}/{path.relative_to(local).as_posix()}")


# What changes when an object is written again, best first: S3's ETag (the content's MD5, so the same bytes written
# again are no change), GCS's generation, else a modification time (a local file's, or a store's without either).
_STAMPS = ("ETag", "generation", "etag", "md5Hash", "LastModified", "mtime", "updated", "created")


def fingerprint(files: Mapping[str, Mapping[str, Any]]) -> tuple[int, ...]:
    """Numbers that change when any of ``files`` (name → metadata: size and a stamp) is added, removed, renamed or
    written again: how many there are, their total size, and a digest of each one's name, size and stamp."""
    digest = hashlib.sha256()
    total = 0
    for name in sorted(files):
        info = files[name]
        size = int(info.get("size") or 0)
        stamp = next((info[key] for key in _STAMPS if info.get(key)), "")
        digest.update(f"{name}\0{size}\0{stamp}\n".encode())
        total += size
    return (len(files), total, int.from_bytes(digest.digest()[:7], "big"))


# ------------------------------------------------------------------------------------------------ the cache
def state_dir() -> Path:
    """``$XDG_STATE_HOME/workbench`` (``~/.local/state/workbench``): what a server keeps across restarts that is not
    a model (its asynchronous requests); the system's temp dir when there is no home."""
    xdg = os.environ.get("XDG_STATE_HOME")
    if xdg:
        return Path(xdg) / "workbench"
    try:
        return Path.home() / ".local" / "state" / "workbench"
    except RuntimeError:  # no home directory (some containers' users)
        return Path(tempfile.gettempdir()) / "workbench-state"


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/workbench/models`` (``~/.cache/...``), or the system's temp dir when there is no home."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "workbench" / "models"
    try:
        return Path.home() / ".cache" / "workbench" / "models"
    except RuntimeError:  # no home directory (some containers' users)
        return Path(tempfile.gettempdir()) / "workbench-models"


class VersionCache:
    """Local copies of the remote versions this server has loaded, one folder per (model, version).

    Servers on one machine may share a cache directory: each claims a slot folder of its own (``slot-N``, held
    with ``flock`` while it runs, so a crashed server's slot is reused and emptied by the next one), and so never
    removes a folder another server is loading from.
    """

    def __init__(self, root: str | os.PathLike[str] = "", mlflow_tracking_uri: str = "") -> None:
        """``mlflow_tracking_uri``: where MLflow's URIs are downloaded from ("": MLflow's own choice)."""
        self.root = Path(root) if root else default_cache_dir()
        self.mlflow_tracking_uri = mlflow_tracking_uri
        self._lock_fd: int | None = None
        self._folder: Path | None = None
        self._guard = threading.Lock()

    @property
    def folder(self) -> Path:
        """This server's slot (claimed on first use)."""
        with self._guard:
            if self._folder is None:
                self._folder = self._claim_slot()
            return self._folder

    def _claim_slot(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        for n in range(10_000):
            slot = self.root / f"slot-{n}"
            fd = os.open(f"{slot}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self._lock_fd = fd
            shutil.rmtree(slot, ignore_errors=True)  # a previous owner's leftovers: nobody loads from them now
            slot.mkdir()
            log.info("Caching remote model versions in %s", slot)
            return slot
        raise StorageError(str(self.root), "no free cache slot")

    def path_of(self, model: str, version: int) -> Path:
        return self.folder / model / str(version)

    def fetch(self, model: str, version: int, url: str) -> Path:
        """Download ``url``'s version for a load: one download per load, as unloading removes the copy."""
        target = self.path_of(model, version)
        staging = self.folder / f".download-{model}-{version}-{uuid.uuid4().hex[:8]}"
        started = time.perf_counter()
        try:
            if is_mlflow_uri(url):  # a registry version or a run's model, through MLflow's own client
                with translated(url):
                    mlflow_uris.download(url, staging, self.mlflow_tracking_uri)
            else:
                RemoteFolder(url.rsplit("/", 1)[0]).download(url.rsplit("/", 1)[1], staging)
            self._discard(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.rename(staging, target)  # complete, or not there at all
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        elapsed = time.perf_counter() - started
        log.info("Downloaded %s version %d from %s in %.2fs", model, version, redact(url), elapsed)
        return target

    def release(self, model: str, version: int) -> None:
        """Forget a version that was unloaded: renamed out of the way at once, its files deleted in the background."""
        if self._folder is None:  # nothing was ever downloaded (a local repository): claim no slot for it
            return
        self._discard(self.path_of(model, version))

    def _discard(self, folder: Path) -> None:
        if not folder.exists():
            return
        trash = self.folder / f".trash-{uuid.uuid4().hex}"
        try:
            os.rename(folder, trash)
        except OSError as exc:
            log.warning("Could not remove cached version %s: %s", folder, exc)
            return
        threading.Thread(target=shutil.rmtree, args=(trash, True), name="workbench-cache-clean", daemon=True).start()

    def close(self) -> None:
        """Empty and give up this server's slot."""
        with self._guard:
            if self._folder is not None:
                shutil.rmtree(self._folder, ignore_errors=True)
                self._folder = None
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None


def bytes_under(folder: str | os.PathLike[str], follow_symlinks: bool = False) -> int:
    """The size of the files under ``folder`` (0 if it is gone); ``follow_symlinks``: a link counts as its target."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for file in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, file), follow_symlinks=follow_symlinks).st_size
    return total


L = TypeVar("L", bound=Callable[..., Any])


def caching_loader(loader: L, cache: VersionCache) -> L:
    """``loader`` for local paths; for a remote version, download it into ``cache`` first and load the copy. The
    loader's ``prepare(name, version, path, platform)``, where it has one (a framework imported ahead of a measured
    load), is kept, and sees the copy too; its ``places_on_gpu(path, platform)`` is kept as it is."""

    def local(name: str, version: int, path: str) -> str:
        return str(cache.fetch(name, version, path)) if is_remote(path) else path

    def load(name: str, version: int, path: str, *args: Any) -> Any:
        return loader(name, version, local(name, version, path), *args)

    prepare = getattr(loader, "prepare", None)
    if prepare is not None:

        def prepare_copy(name: str, version: int, path: str, *args: Any) -> None:
            prepare(name, version, local(name, version, path), *args)

        load.prepare = prepare_copy  # type: ignore[attr-defined]
    # Asked under the manager's lock, so it never downloads: a remote version's platform is its config's, or none.
    places_on_gpu = getattr(loader, "places_on_gpu", None)
    if places_on_gpu is not None:
        load.places_on_gpu = places_on_gpu  # type: ignore[attr-defined]
    return cast(L, load)
