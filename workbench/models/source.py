"""The model repository source: scans ``<base_path>/<version>/`` folders and aspires versions per policy.

Like TF Serving's FileSystemStoragePathSource: a folder whose name parses as an integer is a version
(``00000123`` is 123), anything else is ignored (the model's ``routing.json`` among them); the model's version
policy picks which of them to serve; the scan repeats every ``file_system_poll_wait_seconds`` (0 scans once, a
negative value never). Each scan also has the manager re-read the model's routing state, so a change made by any
replica, a notebook or a hand edit reaches this server within one poll.

A base path in an object store (``s3://…``, ``gs://…``) is listed by prefix (:mod:`workbench.runtime.storage`): a
version is there once its ``saved_model.pb`` is, since uploads write it last. A store that cannot be listed
(missing bucket, denied, network) changes nothing: the model keeps the versions it serves, the error shows in its
status, and the next poll tries again.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from workbench import platforms
from workbench.config.options import ModelConfig
from workbench.models.manager import DiskVersion, Manager
from workbench.runtime.storage import RemoteFolder, StorageError, fingerprint, is_remote, join, redact

log = logging.getLogger(__name__)


def parse_version(folder_name: str) -> int | None:
    if not folder_name.isdigit():  # also rejects "-1", "+1", " 1" and non-ASCII digits' surprises
        return None
    if not folder_name.isascii():
        return None
    return int(folder_name)


def _fingerprint(path: str) -> tuple[int, ...]:
    """Changes when a version folder's top-level files change, so a fixed, failed version is retried."""
    stamps: list[int] = []
    # The folder (files added, removed or renamed), then every file that says what the version is and runs: a
    # model.py, handler.py or pipeline.yaml fixed in place is retried like a replaced saved_model.pb.
    watched = (*platforms.model_files(), platforms.VERSION_CONFIG, platforms.HANDLER_FILE, "variables")
    # A Triton model's config.pbtxt, beside the versions, says how each of them serves: a fixed one retries them.
    watched = (*watched, os.path.join(os.pardir, platforms.TRITON_CONFIG))
    for candidate in (path, *(os.path.join(path, name) for name in watched)):
        try:
            st = os.stat(candidate)
            stamps.extend((st.st_mtime_ns, st.st_size))
        except OSError:
            stamps.extend((0, 0))
    return tuple(stamps)


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
        found[version] = DiskVersion(path=entry.path, fingerprint=_fingerprint(entry.path))
    return found


def scan_remote_versions(base_url: str) -> dict[int, DiskVersion]:
    """The complete versions under an object-store URL; raises StorageError when the store cannot be listed."""
    folder = RemoteFolder(base_url)
    found: dict[int, DiskVersion] = {}
    for name in folder.list_folders():
        version = parse_version(name)
        if version is None or version in found:
            continue
        # A version is complete once its model file is there: uploads (workbench.export's, and TF Serving's
        # convention for saved_model.pb) put it last. One listing per version folder, not a request per file.
        files = folder.files(name)
        model_file = next((f for f in platforms.model_files() if f in files), None)
        if model_file is None:  # still uploading, or no model
            continue
        found[version] = DiskVersion(path=join(base_url, name), fingerprint=fingerprint(files[model_file]))
    return found


class RepositorySource:
    """Feeds the manager the aspired versions of every configured model, once or on a poll loop."""

    def __init__(
        self,
        manager: Manager,
        poll_wait_seconds: float,
        models: Callable[[], list[ModelConfig]] | None = None,
        discover: Callable[[], list[ModelConfig]] | None = None,
        on_scan: Callable[[list[ModelConfig]], None] | None = None,
    ) -> None:
        self._manager = manager
        self._poll_wait = poll_wait_seconds
        self._models = models or manager.configs
        # A model repository root: models appear and disappear with their folders.
        self._discover = discover
        # Told the models after every scan: files beside a model (logging_config.txt) are polled with it.
        self._on_scan = on_scan
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned: set[str] = set()
        self._scan_lock = threading.Lock()

    def poll_once(self) -> None:
        """Scan every model's base path now (a negative poll wait means never, as in TF Serving)."""
        if self._poll_wait < 0:
            return
        with self._scan_lock:
            if self._discover is not None:
                try:
                    found = self._discover()
                except StorageError as exc:  # keep the models we have; the next poll tries again
                    log.error("The model repository cannot be listed: %s", exc)
                    found = self._models()
                if {c.name for c in found} != {c.name for c in self._models()}:
                    self._manager.set_models(found)
            for config in self._models():
                if is_remote(config.base_path):
                    try:
                        on_disk = scan_remote_versions(config.base_path)
                    except StorageError as exc:
                        self._unreachable(config.name, str(exc))
                        continue
                    self._manager.set_source_error(config.name, None)
                else:
                    on_disk = scan_versions(config.base_path)
                if not on_disk and config.name not in self._warned:
                    log.warning(
                        "No versions of servable %s found under base path %s", config.name, redact(config.base_path)
                    )
                    self._warned.add(config.name)
                elif on_disk:
                    self._warned.discard(config.name)
                self._manager.refresh_routing(config.name)  # routing.json beside the versions: every poll
                aspired = config.policy.select(on_disk)
                self._manager.set_aspired_versions(config.name, {v: on_disk[v] for v in aspired}, on_disk)
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
                self.poll_once()
            except Exception:  # noqa: BLE001 - a bad scan must not end polling
                log.exception("Repository scan failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
