"""The lifecycle of model versions: aspired versions in, loaded servables out, availability preserved.

A source (the repository poller) tells the manager which versions each model *should* serve; the manager
loads new ones on its load threads (warming them up), and only then unloads the versions they replace, so a
model that was serving never stops serving. A version that fails to load ends in END with its error, and the
versions already serving keep serving. All state sits behind one lock; loads and unloads run off it.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor

from workbench.engine.options import ModelConfig
from workbench.engine.servable import Loader, Servable
from workbench.engine.status import Code, ServingError, from_exception

log = logging.getLogger(__name__)


class VersionState(enum.IntEnum):
    """ModelVersionStatus.State, with the proto's numbers."""

    START = 10
    LOADING = 20
    AVAILABLE = 30
    UNLOADING = 40
    END = 50


@dataclasses.dataclass(frozen=True)
class DiskVersion:
    """A version folder as the source saw it; the fingerprint changes when its files do."""

    path: str
    fingerprint: tuple[int, ...] = ()


@dataclasses.dataclass
class VersionRecord:
    version: int
    path: str
    fingerprint: tuple[int, ...]
    state: VersionState = VersionState.START
    error: ServingError | None = None
    servable: Servable | None = None
    since: float = dataclasses.field(default_factory=time.time)


@dataclasses.dataclass(frozen=True)
class VersionStatus:
    """A snapshot of one version for status APIs (never holds the servable)."""

    version: int
    state: VersionState
    error: ServingError | None
    since: float


@dataclasses.dataclass
class _Model:
    config: ModelConfig
    aspired: dict[int, DiskVersion] = dataclasses.field(default_factory=dict)
    versions: dict[int, VersionRecord] = dataclasses.field(default_factory=dict)
    labels: dict[str, int] = dataclasses.field(default_factory=dict)
    removed: bool = False


class ServableHandle:
    """``with handle as servable:`` releases the servable when the request is done (a class: it is hot)."""

    __slots__ = ("_servable",)

    def __init__(self, servable: Servable) -> None:
        self._servable = servable

    def __enter__(self) -> Servable:
        return self._servable

    def __exit__(self, *exc: object) -> None:
        self._servable.release()


Warmup = Callable[[Servable], None]
StateListener = Callable[[str, int, "VersionState"], None]


class Manager:
    def __init__(
        self,
        loaders: Mapping[str, Loader],
        *,
        warmup: Warmup | None = None,
        load_threads: int = 2,
        allow_labels_for_unavailable: bool = False,
    ) -> None:
        self._loaders = dict(loaders)
        self._warmup = warmup
        self._allow_unavailable_labels = allow_labels_for_unavailable
        self._lock = threading.RLock()
        self._settled = threading.Condition(self._lock)
        self._models: dict[str, _Model] = {}
        self._executor = ThreadPoolExecutor(max_workers=max(1, load_threads), thread_name_prefix="workbench-load")
        self._closed = False
        self._listeners: list[StateListener] = []

    # ----------------------------------------------------------------------------------------- config
    def set_models(self, configs: Iterable[ModelConfig]) -> None:
        """Serve exactly these models (labels are applied separately, once versions have loaded)."""
        configs = list(configs)
        names = {c.name for c in configs}
        with self._lock:
            for config in configs:
                model = self._models.get(config.name)
                if model is None or model.removed:
                    self._models[config.name] = _Model(config=config)
                else:
                    model.config = config
            for name, model in self._models.items():
                if name not in names and not model.removed:
                    model.removed = True
                    model.aspired = {}
                    model.labels = {}
                    self._reconcile(model)

    def configs(self) -> list[ModelConfig]:
        with self._lock:
            return [m.config for m in self._models.values() if not m.removed]

    def set_labels(self, labels_by_model: Mapping[str, Mapping[str, int]]) -> None:
        """Replace the version labels of the given models, all or nothing.

        A label may only point at an AVAILABLE version unless the server allows labels for unavailable
        models (then it can be set before the version has loaded, as TF Serving's flag allows).
        """
        with self._lock:
            for name, labels in labels_by_model.items():
                model = self._live_model(name)
                for label, version in labels.items():
                    record = model.versions.get(version)
                    available = record is not None and record.state == VersionState.AVAILABLE
                    if not available and not self._allow_unavailable_labels:
                        raise ServingError(
                            Code.FAILED_PRECONDITION,
                            f"Request to assign label to version {version} of model {name}, which is not "
                            "currently available for inference",
                        )
                    if not label:
                        raise ServingError(Code.INVALID_ARGUMENT, f"Empty version label for model {name}")
            for name, labels in labels_by_model.items():
                self._models[name].labels = dict(labels)

    def _live_model(self, name: str) -> _Model:
        model = self._models.get(name)
        if model is None or model.removed:
            raise ServingError(Code.NOT_FOUND, f"Model {name} is not in the server's config")
        return model

    # ---------------------------------------------------------------------------------------- source
    def set_aspired_versions(self, name: str, versions: Mapping[int, DiskVersion]) -> None:
        """Called by the source: these versions of ``name`` should be served."""
        with self._lock:
            model = self._models.get(name)
            if model is None or model.removed:
                return
            model.aspired = dict(versions)
            self._reconcile(model)

    def _reconcile(self, model: _Model) -> None:
        """Start the loads and unloads that move ``model`` towards its aspired versions (lock held)."""
        if self._closed:
            return
        for version, disk in model.aspired.items():
            record = model.versions.get(version)
            retry = (
                record is not None
                and record.state == VersionState.END
                and (record.error is None or record.fingerprint != disk.fingerprint)
            )
            if record is None or retry:
                record = VersionRecord(version=version, path=disk.path, fingerprint=disk.fingerprint)
                model.versions[version] = record
                self._set_state(model, record, VersionState.LOADING)
                self._executor.submit(self._load, model, record)

        aspired = [model.versions[v] for v in model.aspired if v in model.versions]
        aspired_available = any(r.state == VersionState.AVAILABLE for r in aspired)
        pending = any(r.state in (VersionState.START, VersionState.LOADING) for r in aspired)
        failed = any(r.state == VersionState.END and r.error is not None for r in aspired)
        # Availability first: an old version goes only once a new one serves, or when nothing is on its
        # way to replace it (a removed model, or versions removed from disk with none left to load).
        may_unload = aspired_available or not (pending or failed)
        for record in list(model.versions.values()):
            if record.version in model.aspired or record.state != VersionState.AVAILABLE:
                continue
            if may_unload:
                self._set_state(model, record, VersionState.UNLOADING)
                self._executor.submit(self._unload, model, record)
        self._settled.notify_all()

    def _load(self, model: _Model, record: VersionRecord) -> None:
        name = model.config.name
        started = time.perf_counter()
        try:
            servable = self._loaders[model.config.platform](name, record.version, record.path)
        except BaseException as exc:  # noqa: BLE001 - a load failure must never kill the load thread
            self._finish_load(model, record, None, from_exception(exc))
            return
        if self._warmup is not None:
            try:
                self._warmup(servable)
            except BaseException as exc:  # noqa: BLE001
                servable.unload(drain_timeout=0)
                self._finish_load(model, record, None, from_exception(exc))
                return
        log.info("Loaded %s version %d in %.2fs", name, record.version, time.perf_counter() - started)
        self._finish_load(model, record, servable, None)

    def _finish_load(
        self, model: _Model, record: VersionRecord, servable: Servable | None, error: ServingError | None
    ) -> None:
        discard = None
        with self._lock:
            if error is not None:
                log.error("Failed to load %s version %d: %s", model.config.name, record.version, error.message)
                record.error = error
                self._set_state(model, record, VersionState.END)
            elif self._closed or model.versions.get(record.version) is not record:
                discard = servable
                self._set_state(model, record, VersionState.END)
            else:
                record.servable = servable
                self._set_state(model, record, VersionState.AVAILABLE)
            self._reconcile(model)
        if discard is not None:
            discard.unload()

    def _unload(self, model: _Model, record: VersionRecord) -> None:
        servable = record.servable
        try:
            if servable is not None:
                servable.unload()
        except BaseException as exc:  # noqa: BLE001
            log.error("Unloading %s version %d failed: %s", model.config.name, record.version, exc)
        with self._lock:
            record.servable = None
            self._set_state(model, record, VersionState.END)
            log.info("Unloaded %s version %d", model.config.name, record.version)
            finished = all(r.state == VersionState.END for r in model.versions.values())
            if model.removed and finished and self._models.get(model.config.name) is model:
                del self._models[model.config.name]
            self._settled.notify_all()

    def _set_state(self, model: _Model, record: VersionRecord, state: VersionState) -> None:
        record.state = state
        record.since = time.time()
        for listener in list(self._listeners):
            try:
                listener(model.config.name, record.version, state)
            except Exception:  # noqa: BLE001 - listeners must not break the manager
                log.exception("state listener failed")

    def add_listener(self, listener: StateListener) -> None:
        """Call ``listener(model, version, state)`` (under the manager's lock) whenever a version changes state."""
        self._listeners.append(listener)

    # -------------------------------------------------------------------------------------- queries
    def handle(self, name: str, version: int | None = None, label: str | None = None) -> ServableHandle:
        """Hold the servable a request runs on until the request is answered (it cannot unload meanwhile)."""
        return ServableHandle(self.resolve(name, version, label))

    def resolve(self, name: str, version: int | None = None, label: str | None = None) -> Servable:
        """The servable a request for (name, version or label) runs on, already acquired for the caller.

        Resolution and acquisition happen under the manager's lock, where versions also leave AVAILABLE, so
        a version chosen here cannot start unloading before the caller holds it. Callers release it.
        """
        with self._lock:
            model = self._models.get(name)
            if label is not None:
                target = model.labels.get(label) if model is not None and not model.removed else None
                if target is None:
                    raise ServingError(Code.INVALID_ARGUMENT, f"Unrecognized servable version label: {label}")
                version = target
            if model is not None:
                if version is None:
                    available = [r for r in model.versions.values() if r.state == VersionState.AVAILABLE and r.servable]
                    if available:
                        servable = max(available, key=lambda r: r.version).servable
                        if servable is not None and servable.acquire():
                            return servable
                else:
                    record = model.versions.get(version)
                    available_record = record is not None and record.state == VersionState.AVAILABLE
                    if available_record and record.servable is not None and record.servable.acquire():
                        return record.servable
        if version is None:
            raise ServingError(Code.NOT_FOUND, f"Servable not found for request: Latest({name})")
        raise ServingError(Code.NOT_FOUND, f"Servable not found for request: Specific({name}, {version})")

    def version_status(self, name: str, version: int | None = None) -> list[VersionStatus]:
        """Versions of ``name``, newest first, as GetModelStatus reports them."""
        with self._lock:
            model = self._models.get(name)
            records = list(model.versions.values()) if model is not None else []
        if version is not None:
            records = [r for r in records if r.version == version]
            if not records:
                raise ServingError(Code.NOT_FOUND, f"Could not find version {version} of model {name}")
        elif not records:
            raise ServingError(Code.NOT_FOUND, f"Could not find any versions of model {name}")
        return [
            VersionStatus(r.version, r.state, r.error, r.since)
            for r in sorted(records, key=lambda r: r.version, reverse=True)
        ]

    def label_version(self, name: str, label: str) -> int:
        with self._lock:
            model = self._models.get(name)
            version = model.labels.get(label) if model is not None and not model.removed else None
        if version is None:
            raise ServingError(Code.INVALID_ARGUMENT, f"Unrecognized servable version label: {label}")
        return version

    def labels(self, name: str) -> dict[str, int]:
        with self._lock:
            model = self._models.get(name)
            return dict(model.labels) if model is not None else {}

    def model_names(self) -> list[str]:
        with self._lock:
            return sorted(n for n, m in self._models.items() if not m.removed)

    def is_settled(self) -> bool:
        with self._lock:
            return self._settled_locked()

    def _settled_locked(self) -> bool:
        for model in self._models.values():
            for record in model.versions.values():
                if record.state in (VersionState.START, VersionState.LOADING, VersionState.UNLOADING):
                    return False
        return True

    def wait_until_settled(self, timeout: float | None = None) -> bool:
        """Block until no version is loading or unloading (True), or ``timeout`` passes (False)."""
        with self._lock:
            return self._settled.wait_for(self._settled_locked, timeout=timeout)

    def stop(self) -> None:
        with self._lock:
            self._closed = True
            servables = [
                r.servable for m in self._models.values() for r in m.versions.values() if r.servable is not None
            ]
        self._executor.shutdown(wait=True, cancel_futures=True)
        for servable in servables:
            servable.unload(drain_timeout=5.0)
