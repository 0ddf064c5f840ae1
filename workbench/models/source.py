"""The model repository source: scans ``<base_path>/<version>/`` folders and aspires versions per policy.

Like TF Serving's FileSystemStoragePathSource: a folder whose name parses as an integer is a version
(``00000123`` is 123), anything else is ignored (the model's ``routing.json`` among them); the model's version
policy picks which of them to serve; the scan repeats every ``file_system_poll_wait_seconds`` (0 scans once, a
negative value never). Each scan also has the manager re-read the model's routing state, so a change made by any
replica, a notebook or a hand edit reaches this server within one poll.

A base path in an object store (``s3://…``, ``gs://…``) is listed by prefix (:mod:`workbench.runtime.storage`), every
file under the model's folder in one paginated listing: a version is there once its model file is (uploads that
publish a version, ``workbench.export``'s, write it last). A store that cannot be listed (missing bucket, denied,
network) changes nothing: the model keeps the versions it serves, the error shows in its status, and the next poll
tries again.

Versions being copied. A version's fingerprint covers every file of its folder, recursively (names, sizes, and
mtimes here or ETags and generations in a store), so a failed version is retried once any of its files changes
(the manager compares fingerprints). ``aws s3 cp --recursive``, ``gsutil cp -r`` and ``cp -r`` write a version one
file at a time, the model file possibly first, so a poll may see a copy in progress. A *poll* (what the poll loop
makes, :meth:`RepositorySource.poll`) therefore reports a version only as two polls in a row saw it: a version
whose files changed since the last poll waits for the next one (a new one is not there yet; one that was there
stays as it was, so it keeps serving, and a failed one is retried only once its files have stopped changing), and so
does one that a listing no longer shows (it goes once the next poll does not show it either).
A *scan someone asked for* (:meth:`RepositorySource.poll_once`: the start-up, a config reload, a load request)
takes what is there, as TF Serving does at start-up: a start-up waits for no poll, and in the modes that never poll
(``--file_system_poll_wait_seconds=0``, Triton's explicit control) there is no later poll to wait for. A second
listing taken at start-up would not help: an object appears only once its upload is complete, so two listings taken
milliseconds apart nearly always agree while a copy is still going on; what a start-up loads half copied fails, and is
retried once its files change and settle.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from workbench.config.options import ModelConfig
from workbench.models.manager import DiskVersion, Manager
from workbench.platforms import TRITON_CONFIG
from workbench.platforms import model_files as platform_model_files
from workbench.platforms import registry as platform_registry
from workbench.runtime.storage import RemoteFolder, StorageError, fingerprint, is_remote, join, redact

log = logging.getLogger(__name__)

Files = Mapping[str, Mapping[str, Any]]  # a version's files by their path relative to its folder → size and stamp
_NAMES_SHOWN = 8  # of a version's files, in the status of a load that failed
# Python's byte-code cache: written into the folder by the import of a version's own code (model.py, handler.py, an
# archive's modules), by this server too, so it is no part of what was copied there and must not look like a change.
_NOT_CONTENT = "__pycache__"


def parse_version(folder_name: str) -> int | None:
    if not folder_name.isdigit():  # also rejects "-1", "+1", " 1" and non-ASCII digits' surprises
        return None
    if not folder_name.isascii():
        return None
    return int(folder_name)


def describe(files: Files) -> str:
    """``2 files (saved_model.pb, variables/variables.index; 24,191 bytes)``: what a version held when it was
    listed, for the status of a load that fails (a half-copied version shows which files it lacked)."""
    if not files:
        return ""  # an empty folder: nothing to say
    names = sorted(files)
    more = len(names) - _NAMES_SHOWN
    shown = ", ".join(names[:_NAMES_SHOWN]) + (f", and {more} more" if more > 0 else "")
    size = sum(int(info.get("size") or 0) for info in files.values())
    return f"{len(names)} file{'s' if len(names) != 1 else ''} ({shown}; {size:,} bytes)"


def _local_files(path: str) -> dict[str, dict[str, int]]:
    """Every file under a version folder by its path relative to it, with its size and mtime: one stat a file.
    Linked folders are followed, each once (a link back up the tree is not walked again)."""
    files: dict[str, dict[str, int]] = {}
    walked: set[tuple[int, int]] = set()
    pending = [("", path)]
    while pending:
        relative, folder = pending.pop()
        try:
            st = os.stat(folder)
            if (st.st_dev, st.st_ino) in walked:
                continue
            walked.add((st.st_dev, st.st_ino))
            entries = list(os.scandir(folder))
        except OSError:  # gone while listed: the next poll sees the change
            continue
        for entry in entries:
            name = relative + entry.name
            if entry.name == _NOT_CONTENT:
                continue
            try:
                if entry.is_dir():
                    pending.append((name + "/", entry.path))
                else:
                    st = entry.stat()
                    files[name] = {"size": st.st_size, "mtime": st.st_mtime_ns}
            except OSError:  # removed, or a dangling link: the next poll sees what it became
                continue
    return files


def _local_version(path: str) -> DiskVersion:
    files = _local_files(path)
    watched = dict(files)
    # A Triton model's config.pbtxt, beside the versions, says how each of them serves: a fixed one retries them.
    with contextlib.suppress(OSError):
        st = os.stat(os.path.join(path, os.pardir, TRITON_CONFIG))
        watched[f"../{TRITON_CONFIG}"] = {"size": st.st_size, "mtime": st.st_mtime_ns}
    return DiskVersion(path=path, fingerprint=fingerprint(watched), contents=describe(files))


def folder_model_files() -> tuple[str, ...]:
    """The files that make a whole folder one model (MLflow's ``MLmodel``): a base path holding one directly, and no
    numbered version folders, is that model as version 1 (a run's artifacts, a model ``mlflow.save_model`` wrote)."""
    return tuple(f for platform in platform_registry().values() if platform.describes_folder for f in platform.files)


def scan_versions(base_path: str) -> dict[int, DiskVersion]:
    """All version folders under ``base_path`` (empty if it does not exist)."""
    found: dict[int, DiskVersion] = {}
    try:
        entries = list(os.scandir(base_path))
    except OSError:
        return found
    for entry in entries:
        if entry.name.startswith("."):
            continue
        version = parse_version(entry.name)
        if version is None or not entry.is_dir():
            continue
        if version in found:  # "1" and "001": TF Serving takes one of them; be predictable
            continue
        found[version] = _local_version(entry.path)
    if not found and any(os.path.isfile(os.path.join(base_path, f)) for f in folder_model_files()):
        found[1] = _local_version(base_path)  # one MLflow model, its MLmodel in the base path: version 1
    return found


def scan_remote_versions(base_url: str) -> dict[int, DiskVersion]:
    """The versions under an object-store URL, from one listing of every file under it (paginated: one request per
    thousand files, not one per version); raises StorageError when the store cannot be listed."""
    folders: dict[str, dict[str, Mapping[str, Any]]] = {}
    beside: dict[str, Mapping[str, Any]] = {}
    for name, info in RemoteFolder(base_url).tree().items():
        folder, _, inside = name.partition("/")
        if _NOT_CONTENT in name.split("/"):
            continue
        if inside:
            folders.setdefault(folder, {})[inside] = info
        else:
            beside[name] = info
    # A Triton model's config.pbtxt, beside the versions, says how each of them serves: a fixed one retries them.
    triton_config = beside.get(TRITON_CONFIG)
    triton = {f"../{TRITON_CONFIG}": triton_config} if triton_config is not None else {}
    model_files = platform_model_files()
    found: dict[int, DiskVersion] = {}
    for folder in sorted(folders):
        version = parse_version(folder)
        if version is None or version in found:
            continue
        files = folders[folder]
        if not any(name in files for name in model_files):  # a version is there once its model file is
            continue
        path, stamps = join(base_url, folder), fingerprint({**files, **triton})
        found[version] = DiskVersion(path=path, fingerprint=stamps, contents=describe(files))
    if not found and any(f in beside for f in folder_model_files()):  # one MLflow model's artifacts: version 1
        found[1] = DiskVersion(path=base_url, fingerprint=fingerprint(beside), contents=describe(beside))
    return found


class Settling:
    """The versions a poll reports: each one as two scans in a row last saw it alike (see the module's docstring).

    Kept per model and base path, under the source's scan lock.
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], dict[int, DiskVersion]] = {}  # what the last scan found
        self._settled: dict[tuple[str, str], dict[int, DiskVersion]] = {}  # what it reported
        self._waiting: dict[tuple[str, str], set[int]] = {}  # versions it held back

    def settle(self, config: ModelConfig, found: dict[int, DiskVersion], steady: bool) -> dict[int, DiskVersion]:
        """What to report of ``found``; ``steady``: a poll's, else a scan's that takes what is there."""
        key = (config.name, config.base_path)
        seen, settled = self._seen.get(key, {}), self._settled.get(key, {})
        report: dict[int, DiskVersion] = {}
        waiting: set[int] = set()
        for version, disk in found.items():
            if not steady or seen.get(version) == disk:
                report[version] = disk
                continue
            waiting.add(version)
            if version in settled:  # as it was: serving on, or failed and not retried while it still changes
                report[version] = settled[version]
        if steady:
            # A version gone from this listing goes once the next poll agrees: a listing taken in the middle of a
            # change (the objects deleted before their bucket, `aws s3 sync --delete` on its way) does not unload
            # what serves.
            for version in seen.keys() & settled.keys() - found.keys():
                waiting.add(version)
                report[version] = settled[version]
        for version in sorted(waiting - self._waiting.get(key, set())):
            log.info(
                "%s version %d is new or changed since the last poll: waiting for a poll that finds it unchanged",
                config.name,
                version,
            )
        self._seen[key], self._settled[key], self._waiting[key] = found, report, waiting
        return report

    def waiting(self, config: ModelConfig) -> bool:
        """Whether the last scan of ``config`` held back a version."""
        return bool(self._waiting.get((config.name, config.base_path)))

    def keep_only(self, configs: list[ModelConfig]) -> None:
        """Forget the models no longer configured (or configured with another base path)."""
        keys = {(c.name, c.base_path) for c in configs}
        for table in (self._seen, self._settled, self._waiting):
            for key in [k for k in table if k not in keys]:
                del table[key]


class VersionRegistry(Protocol):
    """A model registry whose API lists a model's versions (MLflow's: :mod:`workbench.models.mlflow_registry`)."""

    def handles(self, base_path: str) -> bool:
        """Whether ``base_path`` names this registry rather than a folder or store."""
        ...

    def versions(self, base_path: str) -> dict[int, DiskVersion]:
        """The versions there now, each whole (a registry lists only what is complete); raises StorageError."""
        ...

    def scan(self) -> contextlib.AbstractContextManager[None]:
        """One poll: within it the registry is asked about each model once, and the answers are shared."""
        ...


class RepositorySource:
    """Feeds the manager the aspired versions of every configured model, once or on a poll loop."""

    def __init__(
        self,
        manager: Manager,
        poll_wait_seconds: float,
        models: Callable[[], list[ModelConfig]] | None = None,
        discover: Callable[[], list[ModelConfig]] | None = None,
        on_scan: Callable[[list[ModelConfig]], None] | None = None,
        registry: VersionRegistry | None = None,
    ) -> None:
        self._manager = manager
        self._poll_wait = poll_wait_seconds
        self._models = models or manager.served.configs
        # A model repository root: models appear and disappear with their folders.
        self._discover = discover
        # Told the models after every scan: files beside a model (logging_config.txt) are polled with it.
        self._on_scan = on_scan
        # Base paths naming a registry are listed through its API, polled by this loop like folders.
        self._registry = registry
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned: set[str] = set()
        self._settling = Settling()
        self._scan_lock = threading.Lock()

    def poll_once(self) -> None:
        """Scan every model's base path now and take the versions there as they are: the start-up's scan, a config
        reload's, a load request's (a negative poll wait means never, as in TF Serving)."""
        self._scan(steady=False)

    def poll(self) -> None:
        """One poll, as the poll loop makes it: a version whose files changed since the last scan waits for the
        next poll, so a copy in progress is not loaded half done."""
        self._scan(steady=True)

    def _scan(self, steady: bool) -> None:
        if self._poll_wait < 0:
            return
        polling = self._registry.scan() if self._registry is not None else contextlib.nullcontext()
        with self._scan_lock, polling:
            if self._discover is not None:
                try:
                    found = self._discover()
                except StorageError as exc:  # keep the models we have; the next poll tries again
                    log.error("The model repository cannot be listed: %s", exc)
                    found = self._models()
                known = {c.name: c.labels for c in self._models()}
                if {c.name: c.labels for c in found} != known:  # models came or went, or their versions' labels
                    self._manager.set_models(found)
            configs = self._models()
            for config in configs:
                registry = self._registry if self._registry and self._registry.handles(config.base_path) else None
                if registry is not None or is_remote(config.base_path):
                    try:
                        listed = (registry.versions if registry else scan_remote_versions)(config.base_path)
                    except StorageError as exc:
                        self._unreachable(config.name, str(exc))
                        continue
                    self._manager.set_source_error(config.name, None)
                else:
                    listed = scan_versions(config.base_path)
                # A registry lists a version once it is complete: nothing of it is being copied, so nothing settles.
                on_disk = listed if registry is not None else self._settling.settle(config, listed, steady)
                if not on_disk and not self._settling.waiting(config) and config.name not in self._warned:
                    log.warning(
                        "No versions of servable %s found under base path %s", config.name, redact(config.base_path)
                    )
                    self._warned.add(config.name)
                elif on_disk:
                    self._warned.discard(config.name)
                self._manager.refresh_routing(config.name)  # routing.json beside the versions: every poll
                aspired = config.policy.select(on_disk)
                self._manager.set_aspired_versions(config.name, {v: on_disk[v] for v in aspired}, on_disk)
            self._settling.keep_only(configs)
            self._manager.apply_pending_labels()  # a model found after start-up: its labels, once it has loaded
            if self._on_scan is not None:
                self._on_scan(self._models())

    def _unreachable(self, name: str, problem: str) -> None:
        """The model's store could not be listed: keep what serves, show why, log each new problem once."""
        if self._manager.set_source_error(name, problem):
            log.error("Model %s keeps its versions: its repository cannot be listed: %s", name, problem)

    def start_polling(self) -> None:
        """Keep scanning in a background thread, if a positive poll wait asks for it."""
        if self._poll_wait <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="workbench-source", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._poll_wait):
            try:
                self.poll()
            except Exception:  # a bad scan must not end polling
                log.exception("Repository scan failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
